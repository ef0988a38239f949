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

/// `<work>/kernel-build/<source>-<base>`: kept between runs.
pub fn build_dir(work_dir: &Path, source: &SourceTree, base: &ConfigBase) -> PathBuf {
    let base_name = match base {
        ConfigBase::Target(target) => target.clone(),
        ConfigBase::File(path) => format!(
            "file-{}",
            &crate::io::hashing::sha256_hex(path.to_string_lossy().as_bytes())[..12]
        ),
    };
    work_dir
        .join("kernel-build")
        .join(format!("{}-{base_name}", &source.sha256[..12]))
}

/// How make is invoked: reproducibility variables and parallelism.
#[derive(Clone, Debug)]
pub struct MakeEnv {
    pub source_date_epoch: u64,
    /// How the kernel's C is compiled (distcc, ccache, -j): not in
    /// [`MakeEnv::key_text`], since the output is the same.
    pub compiler: compiler::CompilerOptions,
}

impl MakeEnv {
    pub fn new(source_date_epoch: u64) -> Self {
        MakeEnv {
            source_date_epoch,
            compiler: compiler::CompilerOptions::default(),
        }
    }

    /// The variables that make the same inputs give the same bzImage.
    pub fn variables(&self) -> Vec<(&'static str, String)> {
        vec![
            ("KBUILD_BUILD_TIMESTAMP", format_utc(self.source_date_epoch)),
            ("KBUILD_BUILD_USER", "imgbuild".into()),
            ("KBUILD_BUILD_HOST", "imgbuild".into()),
            ("KBUILD_BUILD_VERSION", "1".into()),
            ("SOURCE_DATE_EPOCH", self.source_date_epoch.to_string()),
            // Keeps scripts/setlocalversion from appending `+`.
            ("LOCALVERSION", String::new()),
        ]
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

/// The toolchain identity for cache keys: first lines of `gcc --version`,
/// `ld --version` and `make --version`.
pub fn toolchain_id() -> Result<String> {
    tool::require_all(&["make", "gcc", "ld", "flex", "bison", "bc", "perl"])?;
    let mut parts = Vec::new();
    for program in ["gcc", "ld", "make"] {
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
        let a = MakeEnv::new(5);
        let mut b = MakeEnv::new(5);
        b.compiler = compiler::CompilerOptions {
            distcc: compiler::DistccHosts::parse("127.0.0.1:3632/8").ok(),
            ccache: Some("/var/cache/ccache".into()),
            jobs: Some(64),
        };
        assert_eq!(a.key_text(), b.key_text());
        assert_ne!(a.key_text(), MakeEnv::new(6).key_text());
    }
}
