//! The base rootfs: a Debian tree from mmdebstrap, or a tarball given by
//! path/url + sha256. Either way the result is a tarball in the cache.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

use rtcheck::Arch;

use crate::cache::{Cache, remote};
use crate::io::hashing::sha256_hex;
use crate::recipe::{RootfsBase, Source, syntax};
use crate::stages::fetch::{self, FetchOptions};
use crate::tool;
use crate::ui::Ui;

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct BaseTarball {
    pub path: PathBuf,
    /// Identifies the content: the tarball's sha256, or the hash of the
    /// mmdebstrap inputs (the archive moves on, so this is not a content hash).
    pub key: String,
    pub origin: String,
    pub cached: bool,
}

/// The Debian mirrors for a suite: main, updates and security, and the
/// releases packages name with `name/release` (`bookworm-backports`), which
/// apt takes a package from only when it is named so.
pub fn debian_sources(suite: &str, mirror: Option<&str>, packages: &[String]) -> Vec<String> {
    let mirror = mirror
        .unwrap_or("http://deb.debian.org/debian")
        .trim_end_matches('/');
    let mut sources = vec![
        format!("deb {mirror} {suite} main"),
        format!("deb {mirror} {suite}-updates main"),
    ];
    if mirror == "http://deb.debian.org/debian" {
        sources.push(format!(
            "deb http://deb.debian.org/debian-security {suite}-security main"
        ));
    }
    let mut releases: Vec<&str> = packages.iter().filter_map(|p| syntax::release_of(p)).collect();
    releases.sort_unstable();
    releases.dedup();
    sources.extend(
        releases
            .into_iter()
            .filter(|release| *release != suite)
            .map(|release| format!("deb {mirror} {release} main")),
    );
    sources
}

/// The date a Debian base is built at (`SOURCE_DATE_EPOCH` of mmdebstrap),
/// 2025-11-30, whatever the release: the dates packages write into files
/// (`/etc/shadow`'s last-change day) stay the same from one release to the
/// next, and the base's packages alone say what it holds. Each release's
/// own date is its commit's timestamp.
pub const BASE_EPOCH: u64 = 1_764_460_800;

/// What mmdebstrap is asked for: a recipe's Debian base, for one machine.
#[derive(Clone, Copy, Debug)]
pub struct DebianBase<'a> {
    pub suite: &'a str,
    pub variant: &'a str,
    pub packages: &'a [String],
    pub mirror: Option<&'a str>,
    pub arch: Arch,
}

/// A recipe's base for one machine: what mmdebstrap makes, or a tarball.
#[derive(Clone, Copy, Debug)]
pub enum BaseFor<'a> {
    Debian(DebianBase<'a>),
    Tarball(&'a Source),
}

impl<'a> BaseFor<'a> {
    pub fn of(base: &'a RootfsBase, arch: Arch) -> Self {
        match base {
            RootfsBase::Debian {
                suite,
                variant,
                packages,
                mirror,
            } => BaseFor::Debian(DebianBase {
                suite,
                variant,
                packages,
                mirror: mirror.as_deref(),
                arch,
            }),
            RootfsBase::Tarball(source) => BaseFor::Tarball(source),
        }
    }
}

impl DebianBase<'_> {
    /// The inputs as a stable key. x86_64's leaves the machine out, as
    /// every key did before there was another.
    pub fn key(&self) -> String {
        let mut packages = self.packages.to_vec();
        packages.sort();
        packages.dedup();
        let machine = match self.arch {
            Arch::X86_64 => String::new(),
            arch => format!("arch={}\n", arch.debian()),
        };
        sha256_hex(format!(
            "suite={}\nvariant={}\npackages={}\nsources={}\nepoch={BASE_EPOCH}\n{machine}",
            self.suite,
            self.variant,
            packages.join(","),
            debian_sources(self.suite, self.mirror, &packages).join("|")
        ))
    }

    fn origin(&self) -> String {
        format!(
            "mmdebstrap {} {} ({}, {} packages)",
            self.suite,
            self.arch.debian(),
            self.variant,
            self.packages.len()
        )
    }
}

/// The base tarball of `base` for `arch`: from the cache, the cache remote,
/// or made now.
pub fn obtain(
    base: &RootfsBase,
    arch: Arch,
    cache: &Cache,
    fetch_options: &FetchOptions,
    ui: &Ui,
) -> Result<BaseTarball> {
    let debian = match BaseFor::of(base, arch) {
        BaseFor::Debian(debian) => debian,
        BaseFor::Tarball(source) => return fetched_tarball(source, cache, fetch_options, ui),
    };
    let key = debian.key();
    let path = cache.area("rootfs-base")?.join(format!("{key}.tar"));
    let origin = debian.origin();
    if path.is_file() {
        ui.note(format!("cached: {origin} ({})", path.display()));
        return Ok(BaseTarball {
            path,
            key,
            origin,
            cached: true,
        });
    }
    let from_remote = remote::take(cache, remote::ROOTFS_BASE, &key, ui, |archive| {
        place_downloaded(cache, archive, &path)
    });
    if from_remote.is_some() {
        ui.note(format!("{origin}: from the cache remote (sha256 verified)"));
        return Ok(BaseTarball {
            path,
            key,
            origin: format!("{origin}, from the cache remote"),
            cached: true,
        });
    }
    mmdebstrap(&debian, &path, cache, ui)?;
    remote::forget_insecure(cache, remote::ROOTFS_BASE, &key);
    Ok(BaseTarball {
        path,
        key,
        origin,
        cached: false,
    })
}

fn fetched_tarball(
    source: &Source,
    cache: &Cache,
    fetch_options: &FetchOptions,
    ui: &Ui,
) -> Result<BaseTarball> {
    let fetched = fetch::fetch(source, cache, fetch_options, ui)?;
    Ok(BaseTarball {
        path: fetched.path,
        key: fetched.sha256,
        origin: fetched.origin,
        cached: fetched.cached,
    })
}

/// Links a verified download to `dest` (same filesystem: the cache) through
/// a temp name, so `dest` appears whole or not at all.
fn place_downloaded(cache: &Cache, archive: &Path, dest: &Path) -> Result<()> {
    let temp = cache.temp_dir("remote-rootfs-")?;
    let staged = temp.path().join("base.tar");
    std::fs::hard_link(archive, &staged)
        .or_else(|_| std::fs::copy(archive, &staged).map(|_| ()))
        .with_context(|| format!("staging {}", archive.display()))?;
    std::fs::rename(&staged, dest).with_context(|| format!("moving it to {}", dest.display()))
}

/// Refuses what would not be a suite, a package or a mirror on mmdebstrap's
/// command line: every package list reaches mmdebstrap through here (the
/// recipe's, already checked by the parser, and the live image's package
/// file), so a name like `-oDPkg::Pre-Invoke::=…` never becomes an apt option.
pub fn check_debian_inputs(suite: &str, packages: &[String], mirror: Option<&str>) -> Result<()> {
    let refuse = |why: String| -> Result<()> { bail!("refusing to run mmdebstrap: {why}") };
    if let Err(why) = syntax::debian_suite(suite) {
        return refuse(why);
    }
    for package in packages {
        if let Err(why) = syntax::debian_package(package) {
            return refuse(why);
        }
    }
    if let Some(Err(why)) = mirror.map(syntax::mirror_url) {
        return refuse(why);
    }
    Ok(())
}

/// mmdebstrap's arguments: options, then `--`, then the positional suite,
/// target and sources, so none of them can be read as an option.
fn mmdebstrap_args(debian: &DebianBase, target: &Path, apt_cache: &Path) -> Vec<OsString> {
    let mut args: Vec<OsString> = vec![
        format!("--variant={}", debian.variant).into(),
        format!("--architectures={}", debian.arch.debian()).into(),
        "--mode=root".into(),
        "--format=tar".into(),
        // Keep downloaded .debs in the imgbuild cache between runs.
        "--skip=essential/unlink".into(),
        "--setup-hook=mkdir -p \"$1\"/var/cache/apt/archives/".into(),
        format!(
            "--setup-hook=sync-in {} /var/cache/apt/archives/",
            apt_cache.display()
        )
        .into(),
        format!(
            "--customize-hook=sync-out /var/cache/apt/archives {}",
            apt_cache.display()
        )
        .into(),
    ];
    if !debian.packages.is_empty() {
        args.push(format!("--include={}", debian.packages.join(",")).into());
    }
    args.push("--".into());
    args.push(debian.suite.into());
    args.push(target.into());
    args.extend(
        debian_sources(debian.suite, debian.mirror, debian.packages)
            .into_iter()
            .map(OsString::from),
    );
    args
}

/// Where a suite's downloaded packages are kept: one area per machine, so a
/// build syncs in only packages it can install.
fn apt_cache_area(debian: &DebianBase) -> String {
    match debian.arch {
        Arch::X86_64 => format!("apt-archives/{}", debian.suite),
        arch => format!("apt-archives/{}-{}", debian.suite, arch.debian()),
    }
}

fn mmdebstrap(debian: &DebianBase, dest: &Path, cache: &Cache, ui: &Ui) -> Result<()> {
    check_debian_inputs(debian.suite, debian.packages, debian.mirror)?;
    let mut cmd = tool::command("mmdebstrap")?;
    let apt_cache = cache.area(&apt_cache_area(debian))?;
    let temp = cache.temp_file()?;
    cmd.args(mmdebstrap_args(debian, temp.path(), &apt_cache))
        .env("SOURCE_DATE_EPOCH", BASE_EPOCH.to_string());
    let log = cache
        .root()
        .join("tmp")
        .join(format!("mmdebstrap-{}.log", std::process::id()));
    let spinner = ui.spinner("mmdebstrap");
    ui.note(format!("{} (log: {})", tool::describe(&cmd), log.display()));
    let result = tool::run_logged(&mut cmd, &log, |line| {
        if let Some(step) = line.strip_prefix("I: ") {
            spinner.set_message(format!("mmdebstrap: {step}"));
        }
    });
    spinner.finish_and_clear();
    result.context("building the base rootfs with mmdebstrap")?;
    let _ = std::fs::remove_file(&log);
    temp.persist(dest)
        .with_context(|| format!("moving the rootfs tarball to {}", dest.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn debian_key(suite: &str, variant: &str, packages: &[String], mirror: Option<&str>) -> String {
        debian(suite, variant, packages, mirror, Arch::X86_64).key()
    }

    fn debian<'a>(
        suite: &'a str,
        variant: &'a str,
        packages: &'a [String],
        mirror: Option<&'a str>,
        arch: Arch,
    ) -> DebianBase<'a> {
        DebianBase {
            suite,
            variant,
            packages,
            mirror,
            arch,
        }
    }

    #[test]
    fn key_ignores_package_order_and_duplicates() {
        let a = debian_key("bookworm", "minbase", &["b".into(), "a".into()], None);
        let b = debian_key("bookworm", "minbase", &["a".into(), "b".into(), "a".into()], None);
        assert_eq!(a, b);
        assert_ne!(a, debian_key("bookworm", "apt", &["a".into(), "b".into()], None));
        assert_eq!(debian_sources("bookworm", None, &[]).len(), 3);
        assert_eq!(
            debian_sources("bookworm", Some("http://mirror/debian/"), &[]).len(),
            2
        );
        let backports = [
            "rtla/bookworm-backports".to_string(),
            "a:amd64/bookworm-backports".into(),
        ];
        let sources = debian_sources("bookworm", Some("http://mirror/debian/"), &backports);
        assert_eq!(sources.len(), 3, "{sources:?}");
        assert_eq!(sources[2], "deb http://mirror/debian bookworm-backports main");
        assert_ne!(a, debian_key("bookworm", "minbase", &backports, None));
    }

    /// x86_64 keeps the keys it had before recipes named a machine, so
    /// caches and cache remotes stay valid; arm64's differ.
    #[test]
    fn the_machine_is_in_the_key_of_other_machines_only() {
        let packages = ["a".to_string()];
        let sources = debian_sources("bookworm", None, &packages).join("|");
        let before = sha256_hex(format!(
            "suite=bookworm\nvariant=minbase\npackages=a\nsources={sources}\nepoch={BASE_EPOCH}\n"
        ));
        assert_eq!(debian_key("bookworm", "minbase", &packages, None), before);
        let arm64 = debian("bookworm", "minbase", &packages, None, Arch::Arm64);
        assert_ne!(arm64.key(), before);
        assert_eq!(apt_cache_area(&arm64), "apt-archives/bookworm-arm64");
        let x86 = debian("bookworm", "minbase", &packages, None, Arch::X86_64);
        assert_eq!(apt_cache_area(&x86), "apt-archives/bookworm");
    }

    #[test]
    fn positional_arguments_follow_a_double_dash() {
        let packages = vec!["busybox".to_string(), "rt-tests".to_string()];
        let base = debian("bookworm", "essential", &packages, None, Arch::Arm64);
        let args = mmdebstrap_args(&base, Path::new("/t/base.tar"), Path::new("/c/apt"));
        let args: Vec<&str> = args.iter().map(|a| a.to_str().unwrap()).collect();
        let dash = args.iter().position(|a| *a == "--").expect("a `--`");
        assert_eq!(&args[dash + 1..dash + 3], ["bookworm", "/t/base.tar"]);
        assert!(args[dash + 3].starts_with("deb http://deb.debian.org/debian bookworm"));
        assert!(args[..dash].contains(&"--include=busybox,rt-tests"));
        assert!(args[..dash].contains(&"--architectures=arm64"));
        assert!(args[..dash].iter().all(|a| a.starts_with("--")));
    }

    #[test]
    fn option_like_inputs_never_reach_mmdebstrap() {
        let ok = vec!["busybox".to_string(), "libc6:amd64".to_string()];
        check_debian_inputs("bookworm", &ok, Some("https://deb.debian.org/debian")).unwrap();
        let hostile = [
            "-oDPkg::Pre-Invoke::=touch /x",
            "--allow-unauthenticated",
            "a,b",
            "x y",
        ];
        for package in hostile {
            let e = check_debian_inputs("bookworm", &[package.to_string()], None).unwrap_err();
            assert!(e.to_string().contains("not a Debian package"), "{e}");
        }
        assert!(check_debian_inputs("-obad", &ok, None).is_err());
        assert!(check_debian_inputs("bookworm", &ok, Some("[trusted=yes] http://x/")).is_err());
    }
}
