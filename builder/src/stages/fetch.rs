//! The `fetch` stage: a url pinned by sha256, a local tarball, or a Debian
//! `linux-source-*` package, each landing in the content-addressed cache.
//!
//! Bytes are hashed while they stream to a temp file in the cache; the file is
//! renamed to its content address only when the hash is the expected one.

use std::path::Path;

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

use crate::cache::Cache;
use crate::cache::download::cached_blob;
pub use crate::cache::download::{
    ChecksumMismatch, DebianSource, FetchOptions, Fetched, fetch_url, import_file,
};
use crate::recipe::Source;
use crate::tool;
use crate::ui::Ui;

/// Brings `source` into the cache.
pub fn fetch(source: &Source, cache: &Cache, options: &FetchOptions, ui: &Ui) -> Result<Fetched> {
    match source {
        Source::Url { url, sha256 } => fetch_url(url, sha256, cache, options, ui),
        Source::Path { path, sha256 } => import_file(path, sha256.as_deref(), cache, ui),
        Source::Debian { package } => fetch_debian(package, cache, ui),
    }
}

/// Remembers which tarball a Debian package provided, so a rerun without the
/// package installed needs no network.
#[derive(Serialize, Deserialize)]
struct DebianMemo {
    sha256: String,
    version: String,
    #[serde(default)]
    source: Option<DebianSource>,
}

/// `${source:Package}\t${source:Version}`, as dpkg-query and dpkg-deb
/// print it, read into a source package (pure).
fn parse_source_line(line: &str) -> Option<DebianSource> {
    let (name, version) = line.trim_end().split_once('\t')?;
    let valid =
        crate::sbom::dpkg::valid_name("Source", name) && crate::sbom::dpkg::parse_version(version).is_ok();
    valid.then(|| DebianSource {
        name: name.to_string(),
        version: version.to_string(),
    })
}

const SOURCE_FORMAT: &str = "${source:Package}\t${source:Version}";

/// The source package of the installed `package`, as dpkg knows it.
fn installed_source(package: &str) -> Option<DebianSource> {
    let mut query = tool::command("dpkg-query").ok()?;
    query.args(["-W", "-f", SOURCE_FORMAT, package]);
    let output = tool::run(&mut query).ok()?;
    parse_source_line(&String::from_utf8_lossy(&output.stdout))
}

/// `/usr/src/<package>.tar.xz` when installed, else `apt-get download` +
/// `dpkg-deb -x` of the package into a temp dir in the cache.
pub fn fetch_debian(package: &str, cache: &Cache, ui: &Ui) -> Result<Fetched> {
    fetch_debian_from(package, Path::new("/usr/src"), cache, ui)
}

fn fetch_debian_from(package: &str, usr_src: &Path, cache: &Cache, ui: &Ui) -> Result<Fetched> {
    let installed = usr_src.join(format!("{package}.tar.xz"));
    if installed.is_file() {
        let mut fetched = import_file(&installed, None, cache, ui)?;
        fetched.origin = format!("{package} ({})", installed.display());
        fetched.debian_source = installed_source(package);
        return Ok(fetched);
    }
    // A memo from before sources were recorded is a miss: the kernel would
    // go unmatched by vulnerability data.
    let memo = cache
        .read_index::<DebianMemo>("debian", package)
        .filter(|memo| memo.source.is_some());
    if let Some(memo) = memo {
        let origin = format!("Debian {package} {}", memo.version);
        if let Some(mut cached) = cached_blob(cache, &memo.sha256, &origin, ui)? {
            cached.debian_source = memo.source;
            return Ok(cached);
        }
    }
    tool::require_all(&["apt-get", "dpkg-deb"])?;
    let work = cache.temp_dir("debian-")?;
    ui.note(format!("apt-get download {package}"));
    let mut download = tool::command("apt-get")?;
    download.arg("download").arg(package).current_dir(work.path());
    tool::run(&mut download).with_context(|| {
        format!(
            "downloading the Debian package {package} (is the archive reachable and `apt-get update` done?)"
        )
    })?;
    let deb = std::fs::read_dir(work.path())?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "deb"))
        .with_context(|| format!("apt-get download {package} produced no .deb"))?;
    let version = deb
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.split('_').nth(1))
        .unwrap_or("unknown")
        .replace("%3a", ":");
    let mut show = tool::command("dpkg-deb")?;
    show.args(["-W", "--showformat", SOURCE_FORMAT]).arg(&deb);
    let source = parse_source_line(&String::from_utf8_lossy(&tool::run(&mut show)?.stdout));
    let unpacked = work.path().join("root");
    let mut extract = tool::command("dpkg-deb")?;
    extract.arg("-x").arg(&deb).arg(&unpacked);
    tool::run(&mut extract).with_context(|| format!("unpacking {}", deb.display()))?;
    let tarball = unpacked.join("usr/src").join(format!("{package}.tar.xz"));
    if !tarball.is_file() {
        bail!("the Debian package {package} has no usr/src/{package}.tar.xz");
    }
    let mut fetched = import_file(&tarball, None, cache, ui)?;
    cache.write_index(
        "debian",
        package,
        &DebianMemo {
            sha256: fetched.sha256.clone(),
            version: version.clone(),
            source: source.clone(),
        },
    )?;
    fetched.origin = format!("Debian {package} {version}");
    fetched.debian_source = source;
    Ok(fetched)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_source_line_names_a_debian_source_and_version() {
        let source = parse_source_line("linux-6.12\t6.12.118-1~deb12u1\n").unwrap();
        assert_eq!(
            (source.name.as_str(), source.version.as_str()),
            ("linux-6.12", "6.12.118-1~deb12u1")
        );
        for bad in ["linux-6.12", "Linux\t6.12", "linux\tv6", "\t"] {
            assert_eq!(parse_source_line(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn path_import_uses_memo_and_checks_pins() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Cache::open(&dir.path().join("cache")).unwrap();
        let file = dir.path().join("src.tar");
        std::fs::write(&file, b"tarball bytes").unwrap();
        let ui = Ui::plain();
        let first = import_file(&file, None, &cache, &ui).unwrap();
        assert!(!first.cached);
        assert_eq!(std::fs::read(&first.path).unwrap(), b"tarball bytes");
        let second = import_file(&file, Some(&first.sha256), &cache, &ui).unwrap();
        assert!(second.cached);
        let wrong = "0".repeat(64);
        let err = import_file(&file, Some(&wrong), &cache, &ui).unwrap_err();
        let mismatch = err.downcast_ref::<ChecksumMismatch>().unwrap();
        assert_eq!(mismatch.actual, first.sha256);
        // A changed file is rehashed, not served from the memo.
        std::fs::write(&file, b"other bytes!!").unwrap();
        let third = import_file(&file, None, &cache, &ui).unwrap();
        assert_ne!(third.sha256, first.sha256);
        assert!(!third.cached);
    }

    #[test]
    fn damaged_import_is_copied_again() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Cache::open(&dir.path().join("cache")).unwrap();
        let file = dir.path().join("src.tar");
        std::fs::write(&file, b"tarball bytes").unwrap();
        let ui = Ui::plain();
        let first = import_file(&file, None, &cache, &ui).unwrap();
        std::fs::write(&first.path, b"tarball").unwrap();
        let second = import_file(&file, None, &cache, &ui).unwrap();
        assert!(!second.cached, "the truncated blob was used");
        assert_eq!(std::fs::read(&second.path).unwrap(), b"tarball bytes");
    }

    #[test]
    fn debian_prefers_the_installed_tarball() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Cache::open(&dir.path().join("cache")).unwrap();
        let usr_src = dir.path().join("usr-src");
        std::fs::create_dir(&usr_src).unwrap();
        std::fs::write(usr_src.join("linux-source-9.9.tar.xz"), b"xz").unwrap();
        let fetched = fetch_debian_from("linux-source-9.9", &usr_src, &cache, &Ui::plain()).unwrap();
        assert!(fetched.origin.contains("linux-source-9.9.tar.xz"));
        assert_eq!(std::fs::read(fetched.path).unwrap(), b"xz");
    }
}
