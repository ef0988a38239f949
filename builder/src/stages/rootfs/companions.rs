//! The workspace's programs that images carry (`emberrtos-device`,
//! `jitter`), found for the image's machine: the host's build, or the
//! cross-built ones for another machine, each checked to be an ELF program
//! for that machine before it goes in.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use rtcheck::Arch;

/// A binary of this workspace that imgbuild puts into images for `arch`
/// (`jitter`, `emberrtos-device`): `$<env_var>` when set (for another
/// machine than the host's, `$<env_var>_AARCH64`), else the first of
/// [`candidates`] that exists. It must be a program for `arch`.
pub fn find(name: &str, env_var: &str, arch: Arch) -> Result<PathBuf> {
    let env_var = match arch {
        host if host == Arch::host() => env_var.to_string(),
        other => format!("{env_var}_{}", other.machine().to_uppercase()),
    };
    let path = match std::env::var_os(&env_var) {
        Some(path) => existing(&env_var, PathBuf::from(path))?,
        None => beside_imgbuild(name, &env_var, arch)?,
    };
    check_machine(&path, arch).with_context(|| format!("{name}: {}", how_to_build(arch)))?;
    Ok(path)
}

/// jitter's man pages for an image, from the host's `jitter-docs`
/// (`$IMGBUILD_JITTER_DOCS`, else beside imgbuild), built from the same
/// sources as jitter: `(file name, gzip bytes)` in name order, each
/// compressed without a date, so one build gives the same bytes.
pub fn jitter_man_pages() -> Result<Vec<(String, Vec<u8>)>> {
    let docs = find("jitter-docs", "IMGBUILD_JITTER_DOCS", Arch::host())?;
    let out = tempfile::tempdir()?;
    crate::tool::run(std::process::Command::new(&docs).arg(out.path()))
        .with_context(|| format!("generating jitter's man page with {}", docs.display()))?;
    let man = out.path().join("man");
    let mut names: Vec<String> = std::fs::read_dir(&man)
        .with_context(|| format!("{} wrote no man/ directory", docs.display()))?
        .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
        .filter(|name| name.ends_with(".1"))
        .collect();
    names.sort();
    if names.is_empty() {
        bail!("{} wrote no man page", docs.display());
    }
    names
        .into_iter()
        .map(|name| {
            let page = std::fs::read(man.join(&name))?;
            Ok((format!("{name}.gz"), gzip_without_date(&page)?))
        })
        .collect()
}

fn gzip_without_date(data: &[u8]) -> Result<Vec<u8>> {
    use std::io::Write as _;
    let mut encoder = flate2::GzBuilder::new()
        .mtime(0)
        .write(Vec::new(), flate2::Compression::best());
    encoder.write_all(data)?;
    Ok(encoder.finish()?)
}

fn existing(env_var: &str, path: PathBuf) -> Result<PathBuf> {
    if !path.is_file() {
        bail!("${env_var} points to {}, which does not exist", path.display());
    }
    Ok(path)
}

fn beside_imgbuild(name: &str, env_var: &str, arch: Arch) -> Result<PathBuf> {
    let exe = std::env::current_exe().context("locating the imgbuild executable")?;
    first_candidate(&exe, name, arch).with_context(|| {
        format!(
            "no {name} binary for {} beside {}: {}, or set ${env_var}",
            arch.machine(),
            exe.display(),
            how_to_build(arch)
        )
    })
}

fn how_to_build(arch: Arch) -> &'static str {
    if arch == Arch::host() {
        "build it with `cargo build --release --workspace`, or install the imgbuild package (and emberrtos-jitter) whole"
    } else {
        "cross-compile it with ci/cross-arm64 (into target/cross/<triple>/release), or install the imgbuild package whole"
    }
}

/// Fails unless `path` is an ELF program for `arch`.
pub fn check_machine(path: &Path, arch: Arch) -> Result<()> {
    match crate::io::elf_header(path)?.and_then(|header| header.arch()) {
        Some(found) if found == arch => Ok(()),
        Some(found) => bail!(
            "{} is a program for {}, not for {}",
            path.display(),
            found.machine(),
            arch.machine()
        ),
        None => bail!("{} is not a program for {}", path.display(), arch.machine()),
    }
}

/// The first of [`candidates`] that is a file.
pub fn first_candidate(exe: &Path, name: &str, arch: Arch) -> Option<PathBuf> {
    candidates(exe, name, arch).into_iter().find(|p| p.is_file())
}

/// Where `name` is looked for next to the imgbuild at `exe`. For the host's
/// machine: beside it (`cargo build --release --workspace`), one level up
/// (a test binary in `deps/`), then the installed package's
/// `/usr/libexec/imgbuild/<name>` for `/usr/bin/imgbuild`. For another,
/// `target/cross/<triple>/release/<name>` (ci/cross-arm64) seen from
/// `target/release` or `target/release/deps`, then the installed package's
/// `/usr/libexec/imgbuild/<triple>/<name>`.
fn candidates(exe: &Path, name: &str, arch: Arch) -> Vec<PathBuf> {
    let Some(dir) = exe.parent() else {
        return Vec::new();
    };
    let libexec = dir.join("../libexec/imgbuild");
    if arch == Arch::host() {
        return vec![dir.join(name), dir.join("..").join(name), libexec.join(name)];
    }
    let cross = Path::new("cross")
        .join(arch.rust_target())
        .join("release")
        .join(name);
    vec![
        dir.join("..").join(&cross),
        dir.join("../..").join(&cross),
        libexec.join(arch.rust_target()).join(name),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first candidate, canonical (the candidates hold `..`).
    fn found(exe: &Path, name: &str, arch: Arch) -> Option<PathBuf> {
        first_candidate(exe, name, arch).map(|p| p.canonicalize().unwrap())
    }

    #[test]
    fn companions_are_found_where_the_build_and_the_packages_put_them() {
        let root = tempfile::tempdir().unwrap();
        let usr = root.path().join("usr");
        std::fs::create_dir_all(usr.join("libexec/imgbuild")).unwrap();
        std::fs::create_dir_all(usr.join("bin")).unwrap();
        std::fs::write(usr.join("bin/jitter"), "").unwrap();
        std::fs::write(usr.join("libexec/imgbuild/emberrtos-device"), "").unwrap();
        let first = |exe: &Path, name: &str| found(exe, name, Arch::host());
        let installed = usr.join("bin/imgbuild");
        let usr = usr.canonicalize().unwrap();
        assert_eq!(first(&installed, "jitter"), Some(usr.join("bin/jitter")));
        assert_eq!(
            first(&installed, "emberrtos-device"),
            Some(usr.join("libexec/imgbuild/emberrtos-device"))
        );
        assert_eq!(first(&installed, "imgbuild-docs"), None);
        // A test binary in target/release/deps finds target/release/jitter.
        std::fs::create_dir(usr.join("bin/deps")).unwrap();
        let deps_exe = usr.join("bin/deps/imgbuild-test");
        assert_eq!(first(&deps_exe, "jitter"), Some(usr.join("bin/jitter")));
    }

    #[test]
    fn another_machines_companions_are_the_cross_built_ones() {
        let root = tempfile::tempdir().unwrap();
        let target = root.path().join("target");
        let cross = target.join("cross/aarch64-unknown-linux-gnu/release");
        std::fs::create_dir_all(&cross).unwrap();
        std::fs::create_dir_all(target.join("release/deps")).unwrap();
        std::fs::write(target.join("release/jitter"), "").unwrap();
        std::fs::write(cross.join("jitter"), "").unwrap();
        let cross = cross.canonicalize().unwrap();
        for exe in ["release/imgbuild", "release/deps/imgbuild-test"] {
            let found = found(&target.join(exe), "jitter", Arch::Arm64);
            assert_eq!(found, Some(cross.join("jitter")), "{exe}");
        }
    }

    #[test]
    fn the_installed_package_carries_another_machines_companions_by_triple() {
        let root = tempfile::tempdir().unwrap();
        let usr = root.path().join("usr");
        let libexec = usr.join("libexec/imgbuild");
        std::fs::create_dir_all(libexec.join("aarch64-unknown-linux-gnu")).unwrap();
        std::fs::create_dir_all(usr.join("bin")).unwrap();
        // The host's jitter and emberrtos-device must not stand in.
        std::fs::write(usr.join("bin/jitter"), "").unwrap();
        std::fs::write(libexec.join("emberrtos-device"), "").unwrap();
        let found = |name: &str| found(&usr.join("bin/imgbuild"), name, Arch::Arm64);
        assert_eq!(found("jitter"), None);
        assert_eq!(found("emberrtos-device"), None);
        let cross = libexec.join("aarch64-unknown-linux-gnu");
        std::fs::write(cross.join("jitter"), "").unwrap();
        std::fs::write(cross.join("emberrtos-device"), "").unwrap();
        let cross = cross.canonicalize().unwrap();
        assert_eq!(found("jitter"), Some(cross.join("jitter")));
        assert_eq!(found("emberrtos-device"), Some(cross.join("emberrtos-device")));
    }

    #[test]
    fn a_companion_for_another_machine_is_refused() {
        let this = std::env::current_exe().unwrap();
        check_machine(&this, Arch::host()).unwrap();
        let other = Arch::ALL.into_iter().find(|a| *a != Arch::host()).unwrap();
        let err = check_machine(&this, other).unwrap_err().to_string();
        assert!(
            err.contains(&format!("a program for {}", Arch::host().machine())),
            "{err}"
        );
        let text = tempfile::NamedTempFile::new().unwrap();
        assert!(check_machine(text.path(), Arch::host()).is_err());
    }
}
