//! The kernel stages: `kconfig` (fail-closed configuration) and `kernel`
//! (out-of-tree build with an artifact cache).
//!
//! The source is extracted once per tarball hash into the cache and never
//! written to: every make runs with `O=<build dir>`. The build dir is kept per
//! source and base so Kbuild's per-symbol dependency tracking makes a small
//! config change a small rebuild.

pub mod build;
pub mod compiler;
pub mod config;
pub mod deps;

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use rtcheck::Arch;

use crate::cache::{BlobCheck, BlobLookup, Cache};
use crate::io::extract::{ExtractOptions, extract_tarball};
use crate::recipe::ConfigBase;
use crate::stages::fetch::Fetched;
use crate::tool;
use crate::ui::Ui;

/// An extracted, pristine kernel source tree.
#[derive(Clone, Debug)]
pub struct SourceTree {
    pub root: PathBuf,
    pub sha256: String,
}

/// Extracts the fetched tarball into `sources/<sha256>/` unless already there.
pub fn prepare_source(fetched: &Fetched, cache: &Cache, ui: &Ui) -> Result<SourceTree> {
    let sources = cache.area("sources")?;
    let dir = sources.join(&fetched.sha256);
    // One extraction at a time per source; the others wait and reuse it.
    let lock_path = sources.join(format!("{}.lock", fetched.sha256));
    let lock =
        std::fs::File::create(&lock_path).with_context(|| format!("creating {}", lock_path.display()))?;
    lock.lock()
        .with_context(|| format!("locking {}", lock_path.display()))?;
    if dir.is_dir() {
        ui.note(format!("source tree cached: {}", dir.display()));
    } else {
        extract_source(fetched, cache, &dir, ui)?;
    }
    let root = tree_root(&dir)?;
    if root.join(".config").exists() {
        bail!(
            "{} contains a .config: the cached source tree is no longer pristine; delete {} and rerun",
            root.display(),
            dir.display()
        );
    }
    Ok(SourceTree {
        root,
        sha256: fetched.sha256.clone(),
    })
}

/// Extracts the tarball to `dir`. The tree is kept under the tarball's hash
/// for good, so the tarball is hashed in full first, and a truncated archive
/// is refused by the extraction.
fn extract_source(fetched: &Fetched, cache: &Cache, dir: &Path, ui: &Ui) -> Result<()> {
    let origin = &fetched.origin;
    let sha256 = &fetched.sha256;
    let tarball = match cache.lookup_blob_with(sha256, BlobCheck::Always)? {
        BlobLookup::Hit(path) => path,
        BlobLookup::Missing => {
            bail!(
                "the tarball of {origin} (sha256 {sha256}) is no longer in the cache; run again to fetch it"
            )
        }
        BlobLookup::Removed(damage) => bail!(
            "the cached tarball of {origin} (sha256 {sha256}) was damaged ({damage}) and has been removed; run again to fetch it"
        ),
    };
    ui.note(format!("extracting {origin} (once per source hash)"));
    let stats = extract_tarball(&tarball, dir, ExtractOptions::default(), ui)?;
    ui.note(format!(
        "extracted {} entries, {} MiB",
        stats.entries,
        stats.bytes >> 20
    ));
    Ok(())
}

/// Tarballs hold one top directory (`linux-6.12.1/`); that is the source root.
fn tree_root(dir: &Path) -> Result<PathBuf> {
    if dir.join("Makefile").is_file() {
        return Ok(dir.to_path_buf());
    }
    let entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    match entries.as_slice() {
        [only] if only.join("Makefile").is_file() => Ok(only.clone()),
        _ => bail!(
            "{} does not look like a kernel source tree (no top-level Makefile)",
            dir.display()
        ),
    }
}

/// `<work>/kernel-build/<source>-<base>` (`<source>-<arch>-<base>` for a
/// cross build): kept between runs.
pub fn build_dir(work_dir: &Path, source: &SourceTree, arch: Arch, base: &ConfigBase) -> PathBuf {
    let base_name = match base {
        ConfigBase::Target(target) => target.clone(),
        ConfigBase::File(path) => format!(
            "file-{}",
            &crate::io::hashing::sha256_hex(path.to_string_lossy().as_bytes())[..12]
        ),
    };
    let machine = match cross_compile(arch) {
        Some(_) => format!("{arch}-"),
        None => String::new(),
    };
    work_dir
        .join("kernel-build")
        .join(format!("{}-{machine}{base_name}", &source.sha256[..12]))
}

/// The kernel's build date: its own, never the release's, so a release that
/// changes no kernel input reuses the kernel built for an earlier one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelDate {
    pub epoch: u64,
    /// Where it came from, for the build's output.
    pub origin: String,
}

impl KernelDate {
    /// `kernel.source-date-epoch` when the recipe sets it, else the
    /// source's date ([`newest_mtime`]), which is then not read at all.
    pub fn of(recipe_epoch: Option<u64>, source: &SourceTree) -> Result<KernelDate> {
        Ok(match recipe_epoch {
            Some(epoch) => KernelDate {
                epoch,
                origin: "kernel.source-date-epoch".into(),
            },
            None => KernelDate {
                epoch: newest_mtime(&source.root)?,
                origin: "the newest file of its source".into(),
            },
        })
    }
}

/// The newest modification time of the regular files under `root` (links
/// not followed): a source tarball's own date (`git archive` stamps every
/// file with the release commit's time; Debian's with its changelog's).
/// Directories and links are left out: their times are the extraction's.
pub fn newest_mtime(root: &Path) -> Result<u64> {
    let mut newest = 0u64;
    for entry in walkdir::WalkDir::new(root).follow_links(false) {
        let entry = entry.with_context(|| format!("reading {}", root.display()))?;
        if !entry.file_type().is_file() {
            continue;
        }
        let meta = entry
            .metadata()
            .with_context(|| format!("reading {}", entry.path().display()))?;
        let mtime = u64::try_from(std::os::unix::fs::MetadataExt::mtime(&meta)).unwrap_or(0);
        newest = newest.max(mtime);
    }
    // The extraction turns a date of 0 into 1: neither is a date.
    if newest <= 1 || newest > u64::from(u32::MAX) {
        bail!(
            "the newest file under {} is dated {newest}, not a usable build date: set kernel.source-date-epoch in the recipe",
            root.display()
        );
    }
    Ok(newest)
}

/// The kernel's build version (`#<id>` in `uname -v`): a short digest of
/// what the kernel is built from, so two kernels of one source and date but
/// different configurations tell themselves apart.
pub fn build_version(source_sha256: &str, config_sha256: &str, toolchain: &str) -> String {
    let digest = crate::io::hashing::sha256_hex(format!(
        "source={source_sha256}\nconfig={config_sha256}\ntoolchain={toolchain}\n"
    ));
    digest[..BUILD_VERSION_HEX].to_string()
}

/// Hex digits of [`build_version`]: `uname -v` is cut at 64 characters.
const BUILD_VERSION_HEX: usize = 8;

/// How make is invoked: the machine, reproducibility variables and
/// parallelism.
#[derive(Clone, Debug)]
pub struct MakeEnv {
    /// The machine the kernel is for: anything but the host's (x86_64) is
    /// cross-built ([`cross_compile`]).
    pub arch: Arch,
    pub source_date_epoch: u64,
    /// `KBUILD_BUILD_VERSION`: `1` until the configuration is known
    /// ([`build_version`]).
    pub build_version: String,
    /// How the kernel's C is compiled (distcc, ccache, -j): not in
    /// [`MakeEnv::key_text`], since the output is the same.
    pub compiler: compiler::CompilerOptions,
}

impl MakeEnv {
    pub fn new(arch: Arch, source_date_epoch: u64) -> Self {
        MakeEnv {
            arch,
            source_date_epoch,
            build_version: "1".into(),
            compiler: compiler::CompilerOptions::default(),
        }
    }

    /// The same environment with `KBUILD_BUILD_VERSION` set to `version`.
    pub fn with_build_version(&self, version: String) -> Self {
        MakeEnv {
            build_version: version,
            ..self.clone()
        }
    }

    /// Kbuild's `ARCH=` and `CROSS_COMPILE=` for a cross build; none for
    /// the host's own machine.
    pub fn cross_variables(&self) -> Vec<(&'static str, String)> {
        match cross_compile(self.arch) {
            Some(prefix) => vec![
                ("ARCH", self.arch.kbuild().to_string()),
                ("CROSS_COMPILE", prefix.to_string()),
            ],
            None => Vec::new(),
        }
    }

    /// The variables that make the same inputs give the same kernel image.
    pub fn variables(&self) -> Vec<(&'static str, String)> {
        let mut variables = self.cross_variables();
        variables.extend([
            ("KBUILD_BUILD_TIMESTAMP", format_utc(self.source_date_epoch)),
            ("KBUILD_BUILD_USER", "imgbuild".into()),
            ("KBUILD_BUILD_HOST", "imgbuild".into()),
            ("KBUILD_BUILD_VERSION", self.build_version.clone()),
            ("SOURCE_DATE_EPOCH", self.source_date_epoch.to_string()),
            // Keeps scripts/setlocalversion from appending `+`.
            ("LOCALVERSION", String::new()),
        ]);
        variables
    }

    /// The C compiler for the kernel's machine (`gcc`, `aarch64-linux-gnu-gcc`).
    pub fn gcc(&self) -> String {
        format!("{}gcc", cross_compile(self.arch).unwrap_or_default())
    }

    /// `make -C <src> O=<build>` with the reproducibility environment.
    pub fn make(&self, source: &SourceTree, build: &Path) -> Result<Command> {
        let mut cmd = tool::command("make")?;
        cmd.arg("-C")
            .arg(&source.root)
            .arg(format!("O={}", build.display()))
            .env("LC_ALL", "C");
        for (name, value) in self.variables() {
            cmd.env(name, value);
        }
        Ok(cmd)
    }

    /// The inputs that can change what make produces (not `-j`: the same
    /// config built with any parallelism gives the same image).
    pub fn key_text(&self) -> String {
        self.variables()
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// The cross-compiler prefix for `arch`, built on an amd64 host with
/// Debian's cross toolchain; `None` for the host's own machine.
pub const fn cross_compile(arch: Arch) -> Option<&'static str> {
    match arch {
        Arch::X86_64 => None,
        Arch::Arm64 => Some("aarch64-linux-gnu-"),
    }
}

/// The compiler and linker that build a kernel for `arch` (Kbuild's
/// `$(CROSS_COMPILE)gcc` and `ld`).
const fn compiler_tools(arch: Arch) -> [&'static str; 2] {
    match arch {
        Arch::X86_64 => ["gcc", "ld"],
        Arch::Arm64 => ["aarch64-linux-gnu-gcc", "aarch64-linux-gnu-ld"],
    }
}

/// The make target of the boot image on `arch`, which is also its file name
/// under `arch/<kbuild>/boot/`: the bzImage, or arm64's `Image` (with its
/// EFI stub, what GRUB and the firmware load).
pub const fn image_target(arch: Arch) -> &'static str {
    match arch {
        Arch::X86_64 => "bzImage",
        Arch::Arm64 => "Image",
    }
}

/// Where Kbuild leaves the boot image of `arch` in the build dir.
pub fn image_path(build_dir: &Path, arch: Arch) -> PathBuf {
    build_dir
        .join("arch")
        .join(arch.kbuild())
        .join("boot")
        .join(image_target(arch))
}

/// The toolchain identity for cache keys: first lines of `gcc --version`,
/// `ld --version` (the cross tools' for a cross build) and `make --version`.
pub fn toolchain_id(arch: Arch) -> Result<String> {
    tool::require_all(&["make", "gcc", "flex", "bison", "bc", "perl"])?;
    let compiler = compiler_tools(arch);
    tool::require_all(&compiler)?;
    let mut parts = Vec::new();
    for program in compiler.into_iter().chain(["make"]) {
        let output = tool::run(tool::command(program)?.arg("--version"))?;
        let text = String::from_utf8_lossy(&output.stdout);
        parts.push(text.lines().next().unwrap_or_default().trim().to_string());
    }
    Ok(parts.join("; "))
}

pub use rtreport::utc::UtcTime;

/// `Sun Nov 30 00:00:00 UTC 2025` for a Unix time, as `date -u` prints it.
pub fn format_utc(epoch: u64) -> String {
    const DAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let t = UtcTime::from_epoch(epoch);
    format!(
        "{} {} {:>2} {:02}:{:02}:{:02} UTC {}",
        DAYS[t.weekday_from_thursday as usize],
        MONTHS[(t.month - 1) as usize],
        t.day,
        t.hour,
        t.minute,
        t.second,
        t.year
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_formatting_matches_date() {
        assert_eq!(format_utc(0), "Thu Jan  1 00:00:00 UTC 1970");
        assert_eq!(format_utc(1_764_460_800), "Sun Nov 30 00:00:00 UTC 2025");
        assert_eq!(format_utc(951_782_400), "Tue Feb 29 00:00:00 UTC 2000");
        assert_eq!(format_utc(4_102_444_799), "Thu Dec 31 23:59:59 UTC 2099");
    }

    #[test]
    fn make_env_key_excludes_how_the_kernel_is_compiled() {
        let a = MakeEnv::new(Arch::X86_64, 5);
        let mut b = MakeEnv::new(Arch::X86_64, 5);
        b.compiler = compiler::CompilerOptions {
            distcc: compiler::DistccHosts::parse("127.0.0.1:3632/8").ok(),
            ccache: Some("/var/cache/ccache".into()),
            jobs: Some(64),
        };
        assert_eq!(a.key_text(), b.key_text());
        assert_ne!(a.key_text(), MakeEnv::new(Arch::X86_64, 6).key_text());
        assert_ne!(a.key_text(), MakeEnv::new(Arch::Arm64, 5).key_text());
        assert_ne!(a.key_text(), a.with_build_version("0a1b2c3d".into()).key_text());
    }

    #[test]
    fn arm64_is_cross_built_and_x86_64_is_not() {
        let x86 = MakeEnv::new(Arch::X86_64, 5);
        assert!(x86.cross_variables().is_empty());
        assert!(!x86.key_text().contains("ARCH="), "{}", x86.key_text());
        let arm64 = MakeEnv::new(Arch::Arm64, 5);
        assert_eq!(
            arm64.cross_variables(),
            [
                ("ARCH", "arm64".to_string()),
                ("CROSS_COMPILE", "aarch64-linux-gnu-".to_string())
            ]
        );
        assert!(
            arm64
                .key_text()
                .starts_with("ARCH=arm64 CROSS_COMPILE=aarch64-linux-gnu- ")
        );
        assert_eq!(
            compiler_tools(Arch::Arm64)[0],
            format!("{}gcc", cross_compile(Arch::Arm64).unwrap())
        );
        assert_eq!(arm64.gcc(), "aarch64-linux-gnu-gcc");
        assert_eq!(
            image_path(Path::new("/b"), Arch::Arm64),
            Path::new("/b/arch/arm64/boot/Image")
        );
        assert_eq!(
            image_path(Path::new("/b"), Arch::X86_64),
            Path::new("/b/arch/x86/boot/bzImage")
        );
    }

    #[test]
    fn the_build_version_names_source_configuration_and_toolchain() {
        let v = build_version("s", "c", "t");
        assert_eq!(v.len(), BUILD_VERSION_HEX);
        assert!(v.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_eq!(v, build_version("s", "c", "t"));
        for other in [
            build_version("s2", "c", "t"),
            build_version("s", "c2", "t"),
            build_version("s", "c", "t2"),
        ] {
            assert_ne!(v, other);
        }
        // The longest `uname -v` this gives fits the kernel's 64 characters.
        let uts = format!("#{v} SMP PREEMPT_DYNAMIC {}", format_utc(u64::from(u32::MAX)));
        assert!(uts.len() <= 64, "{uts}");
    }

    #[test]
    fn a_source_is_dated_by_its_newest_file_and_the_recipe_overrides_it() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("kernel")).unwrap();
        for (name, mtime) in [("Makefile", 1_763_000_000i64), ("kernel/fork.c", 1_764_300_000)] {
            let path = dir.path().join(name);
            std::fs::write(&path, "x").unwrap();
            let time = std::time::UNIX_EPOCH + std::time::Duration::from_secs(mtime as u64);
            std::fs::File::options()
                .write(true)
                .open(&path)
                .unwrap()
                .set_modified(time)
                .unwrap();
        }
        // Directories and links carry the extraction's time: now.
        std::os::unix::fs::symlink("Makefile", dir.path().join("link")).unwrap();
        let date = newest_mtime(dir.path()).unwrap();
        assert_eq!(date, 1_764_300_000);
        let source = SourceTree {
            root: dir.path().into(),
            sha256: "s".into(),
        };
        assert_eq!(KernelDate::of(None, &source).unwrap().epoch, 1_764_300_000);
        assert_eq!(KernelDate::of(Some(5), &source).unwrap().epoch, 5);
    }

    #[test]
    fn a_source_dated_1970_is_refused_naming_the_recipe_field() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("Makefile");
        std::fs::write(&path, "x").unwrap();
        std::fs::File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_modified(std::time::UNIX_EPOCH + std::time::Duration::from_secs(1))
            .unwrap();
        let error = newest_mtime(dir.path()).unwrap_err().to_string();
        assert!(error.contains("kernel.source-date-epoch"), "{error}");
        // The recipe's date stands in; the source's is then not read.
        let source = SourceTree {
            root: dir.path().into(),
            sha256: "s".into(),
        };
        assert_eq!(
            KernelDate::of(Some(1_764_460_800), &source).unwrap().epoch,
            1_764_460_800
        );
    }
}
