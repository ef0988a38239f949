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
pub use crate::cache::download::{ChecksumMismatch, FetchOptions, Fetched, fetch_url, import_file};
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
        return Ok(fetched);
    }
    if let Some(memo) = cache.read_index::<DebianMemo>("debian", package) {
        let origin = format!("Debian {package} {}", memo.version);
        if let Some(cached) = cached_blob(cache, &memo.sha256, &origin, ui)? {
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
        },
    )?;
    fetched.origin = format!("Debian {package} {version}");
    Ok(fetched)
}

#[cfg(test)]
mod tests {
    use super::*;

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
