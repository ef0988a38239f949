//! The `kernel` stage: `make bzImage modules` (arm64: `Image modules`, cross
//! built) out of tree, `modules_install` into a staging dir, and the artifact
//! cache keyed by source hash + final `.config` + toolchain + make variables
//! (which name the machine and the cross compiler).

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use rtcheck::kconfig::Config;
use serde::{Deserialize, Serialize};

use super::compiler::{describe_events, distcc_event};
use super::config::KconfigOutput;
use super::{MakeEnv, SourceTree};
use crate::cache::{Cache, remote};
use crate::io::atomic::{Placed, place_dir, write_file_atomic};
use crate::io::extract::{ExtractOptions, extract_reader};
use crate::io::hashing::{sha256_file, sha256_hex};
use crate::stage::Key;
use crate::tool;
use crate::ui::Ui;

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct KernelOutput {
    /// Digest of the cache key; names the artifact dir.
    pub key: String,
    pub artifact_dir: PathBuf,
    /// The boot image's file name in the artifact dir: `bzImage`, or arm64's
    /// `Image` ([`super::image_target`]).
    #[serde(default = "bzimage_file")]
    pub image_file: String,
    /// The boot image (whatever its machine's format).
    pub bzimage: PathBuf,
    pub bzimage_sha256: String,
    pub config: PathBuf,
    pub config_sha256: String,
    /// `lib/modules/<release>` inside the artifact dir, when modules were built.
    pub modules: Option<PathBuf>,
    pub release: String,
    /// True when the artifact came from the cache.
    pub cached: bool,
    /// Seconds the build took when it ran.
    pub build_seconds: Option<f64>,
}

fn bzimage_file() -> String {
    super::image_target(rtcheck::Arch::X86_64).into()
}

/// The cache key of a kernel build.
pub fn kernel_key(source: &SourceTree, kconfig: &KconfigOutput, toolchain: &str, make_env: &MakeEnv) -> Key {
    Key::new()
        .with("source", &source.sha256)
        .with("config", &kconfig.config_sha256)
        .with("toolchain", toolchain)
        .with(
            "make",
            format!(
                "{} targets={},modules INSTALL_MOD_STRIP=1",
                make_env.key_text(),
                super::image_target(make_env.arch)
            ),
        )
}

/// A short activity label from a Kbuild output line (`  CC      kernel/fork.o`).
pub fn activity(line: &str) -> Option<String> {
    let mut words = line.split_whitespace();
    let verb = words.next()?;
    let target = words.next()?;
    let is_verb = verb.len() <= 10
        && verb
            .bytes()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_' || b == b'-');
    (is_verb && line.starts_with("  ")).then(|| format!("{verb} {target}"))
}

fn read_release(build_dir: &Path) -> Result<String> {
    let path = build_dir.join("include/config/kernel.release");
    Ok(std::fs::read_to_string(&path)
        .with_context(|| format!("reading {}", path.display()))?
        .trim()
        .to_string())
}

/// Builds the kernel, or takes it from the artifact cache.
pub fn build(
    source: &SourceTree,
    kconfig: &KconfigOutput,
    key: &Key,
    make_env: &MakeEnv,
    cache: &Cache,
    stage_dir: &Path,
    ui: &Ui,
) -> Result<KernelOutput> {
    let digest = key.digest();
    let artifact_dir = cache.area("kernels")?.join(&digest);
    if let Some(output) = cached_kernel(&artifact_dir, &digest, ui) {
        return Ok(output);
    }
    if let Some(output) = remote_kernel(cache, &artifact_dir, &digest, ui) {
        return Ok(output);
    }
    ui.note(format!("cache miss: building kernel (key {})", &digest[..16]));

    let build_dir = &kconfig.build_dir;
    let config_text = std::fs::read_to_string(&kconfig.config)
        .with_context(|| format!("reading {}", kconfig.config.display()))?;
    // Another recipe may have reconfigured the shared build dir since the
    // kconfig stage ran; Kbuild re-syncs from a newer .config on its own.
    let dot_config = build_dir.join(".config");
    if std::fs::read_to_string(&dot_config).ok().as_deref() != Some(config_text.as_str()) {
        write_file_atomic(&dot_config, config_text.as_bytes())?;
    }
    let config = Config::parse(&config_text)?;
    let with_modules = config.is_enabled("CONFIG_MODULES");
    if with_modules {
        tool::require("depmod")?;
    }

    let log = stage_dir.join("build.log");
    let _ = std::fs::remove_file(&log);
    let started = Instant::now();
    let spinner = ui.spinner("make");
    let mut lines = 0u64;
    let compiler = &make_env.compiler;
    compiler.require_tools()?;
    if let Some(dir) = &compiler.ccache {
        std::fs::create_dir_all(dir).with_context(|| format!("creating the ccache dir {}", dir.display()))?;
    }
    let mut make = make_env.make(source, build_dir)?;
    let target = super::image_target(make_env.arch);
    make.arg(format!("-j{}", compiler.jobs())).arg(target);
    if with_modules {
        make.arg("modules");
    }
    compiler.apply(&mut make, &make_env.gcc());
    ui.note(format!("compiling with {}", compiler.describe()));
    ui.note(format!("{} (log: {})", tool::describe(&make), log.display()));
    let mut distcc_events = std::collections::BTreeMap::new();
    let result = tool::run_logged(&mut make, &log, |line| {
        if let Some(event) = distcc_event(line) {
            *distcc_events.entry(event).or_default() += 1;
        }
        lines += 1;
        if let Some(what) = activity(line) {
            spinner.set_message(format!("[{lines} lines] {what}"));
        }
    });
    spinner.finish_and_clear();
    for line in describe_events(&distcc_events) {
        ui.warn(line);
    }
    result.context("building the kernel")?;
    let build_seconds = started.elapsed().as_secs_f64();
    ui.note(format!("built in {build_seconds:.0}s"));

    let staging = cache.temp_dir("kernel-")?;
    let stage = staging.path();
    let image_src = super::image_path(build_dir, make_env.arch);
    if !image_src.is_file() {
        bail!("make finished but {} does not exist", image_src.display());
    }
    std::fs::copy(&image_src, stage.join(target))?;
    std::fs::write(stage.join("config"), &config_text)?;
    std::fs::copy(build_dir.join("System.map"), stage.join("System.map")).context("copying System.map")?;
    let release = read_release(build_dir)?;
    let modules = if with_modules {
        let mut install = make_env.make(source, build_dir)?;
        install
            .arg(format!("INSTALL_MOD_PATH={}", stage.join("modules").display()))
            .arg("INSTALL_MOD_STRIP=1")
            .arg("modules_install");
        tool::run_logged(&mut install, &log, |_| {}).context("installing the modules")?;
        let dir = stage.join("modules/lib/modules").join(&release);
        // These point into the build dir, which is not part of the artifact.
        for link in ["build", "source"] {
            let _ = std::fs::remove_file(dir.join(link));
        }
        Some(PathBuf::from("modules/lib/modules").join(&release))
    } else {
        None
    };
    let final_dir = |p: &Path| artifact_dir.join(p);
    let output = KernelOutput {
        key: digest.clone(),
        artifact_dir: artifact_dir.clone(),
        image_file: target.into(),
        bzimage: final_dir(Path::new(target)),
        bzimage_sha256: sha256_file(&stage.join(target), None)?,
        config: final_dir(Path::new("config")),
        config_sha256: sha256_hex(&config_text),
        modules: modules.as_deref().map(final_dir),
        release,
        cached: false,
        build_seconds: Some(build_seconds),
    };
    let placed = cache_artifact(staging, &output, key, ui)?;
    if placed.bzimage_sha256 == output.bzimage_sha256 {
        // Built here: whatever an unverified remote once placed is gone.
        remote::forget_insecure(cache, remote::KERNELS, &digest);
    }
    Ok(placed)
}

/// The cached kernel in `artifact_dir` when it is there and sound. A damaged
/// one is reported, and replaced when the rebuilt kernel is cached.
fn cached_kernel(artifact_dir: &Path, digest: &str, ui: &Ui) -> Option<KernelOutput> {
    if std::fs::symlink_metadata(artifact_dir).is_err() {
        return None;
    }
    match read_artifact(artifact_dir, digest) {
        Ok(mut output) => {
            ui.note(format!(
                "cache hit: kernel {} ({})",
                output.release,
                artifact_dir.display()
            ));
            output.cached = true;
            Some(output)
        }
        Err(e) => {
            ui.warn(format!(
                "the cached kernel at {} is damaged: {e:#}; rebuilding it",
                artifact_dir.display()
            ));
            None
        }
    }
}

/// The kernel from the cache remote, unpacked, checked as a cached one is
/// and moved into the local cache; `None` (the reason logged) otherwise.
fn remote_kernel(cache: &Cache, artifact_dir: &Path, digest: &str, ui: &Ui) -> Option<KernelOutput> {
    remote::take(cache, remote::KERNELS, digest, ui, |archive| {
        let staging = cache.temp_dir("remote-kernel-")?;
        let unpacked = staging.path().join("kernel");
        // `cache push` writes a plain tar: no decompressor runs on what a
        // remote sends.
        let file = std::fs::File::open(archive).with_context(|| format!("opening {}", archive.display()))?;
        extract_reader(file, &unpacked, ExtractOptions::default())
            .with_context(|| format!("unpacking {}", archive.display()))?;
        read_artifact(&unpacked, digest).context("checking the downloaded kernel")?;
        if let Err(e) = std::fs::rename(&unpacked, artifact_dir) {
            // Another run may have placed the same kernel first.
            read_artifact(artifact_dir, digest)
                .map_err(|_| e)
                .with_context(|| format!("moving the kernel to {}", artifact_dir.display()))?;
        }
        let mut output = read_artifact(artifact_dir, digest)?;
        output.cached = true;
        ui.note(format!(
            "kernel {} from the cache remote (sha256 verified; make not run): {}",
            output.release,
            artifact_dir.display()
        ));
        Ok(output)
    })
}

/// Reads and checks the kernel artifact in `dir`: its `build.json` is for
/// `digest`, and the bzImage and config hash to what it records. Paths in the
/// result are under `dir`, wherever the cache is now.
pub fn read_artifact(dir: &Path, digest: &str) -> Result<KernelOutput> {
    let build_json = dir.join("build.json");
    let text =
        std::fs::read_to_string(&build_json).with_context(|| format!("reading {}", build_json.display()))?;
    let mut output: KernelOutput =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", build_json.display()))?;
    if output.key != digest {
        bail!("{} is for the key {}", build_json.display(), output.key);
    }
    let mut release = Path::new(&output.release).components();
    if !matches!(
        (release.next(), release.next()),
        (Some(std::path::Component::Normal(_)), None)
    ) {
        bail!(
            "{} names the kernel release {:?}",
            build_json.display(),
            output.release
        );
    }
    if !rtcheck::Arch::ALL
        .iter()
        .any(|arch| super::image_target(*arch) == output.image_file)
    {
        bail!(
            "{} names the kernel image {:?}, not bzImage or Image",
            build_json.display(),
            output.image_file
        );
    }
    output.artifact_dir = dir.to_path_buf();
    output.bzimage = dir.join(&output.image_file);
    output.config = dir.join("config");
    output.modules = output
        .modules
        .map(|_| dir.join("modules/lib/modules").join(&output.release));
    expect_sha256(&output.bzimage, &output.bzimage_sha256)?;
    expect_sha256(&output.config, &output.config_sha256)?;
    if let Some(modules) = &output.modules
        && !modules.is_dir()
    {
        bail!("{} is missing", modules.display());
    }
    Ok(output)
}

fn expect_sha256(path: &Path, expected: &str) -> Result<()> {
    let actual = sha256_file(path, None)?;
    if actual != expected {
        bail!("{} hashes to {actual}, not {expected}", path.display());
    }
    Ok(())
}

/// Caches a staged kernel artifact (bzImage, config, System.map, modules) at
/// `output.artifact_dir`: its metadata is written last, then the dir is
/// renamed into place. When another run cached the same key first, its
/// artifact is checked and used, and the staging dir removed.
pub fn cache_artifact(
    staging: tempfile::TempDir,
    output: &KernelOutput,
    key: &Key,
    ui: &Ui,
) -> Result<KernelOutput> {
    let stage = staging.path();
    std::fs::write(stage.join("key.json"), serde_json::to_string_pretty(key)?)?;
    std::fs::write(stage.join("build.json"), serde_json::to_string_pretty(output)?)?;
    let dest = &output.artifact_dir;
    let placed = place_dir(staging, dest, |dir| read_artifact(dir, &output.key).is_ok())
        .with_context(|| format!("moving the kernel artifacts to {}", dest.display()))?;
    match placed {
        Placed::Ours => {
            ui.note(format!("kernel {} cached at {}", output.release, dest.display()));
            Ok(output.clone())
        }
        Placed::Theirs => {
            ui.note(format!(
                "another run cached the same kernel first; using its copy at {}",
                dest.display()
            ));
            let theirs = read_artifact(dest, &output.key)?;
            Ok(KernelOutput {
                cached: false,
                build_seconds: output.build_seconds,
                ..theirs
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn activity_labels() {
        assert_eq!(
            activity("  CC      kernel/fork.o").as_deref(),
            Some("CC kernel/fork.o")
        );
        assert_eq!(
            activity("  LD [M]  drivers/net/dummy.ko").as_deref(),
            Some("LD [M]")
        );
        assert_eq!(activity("make[1]: Entering directory"), None);
        assert_eq!(activity("Kernel: arch/x86/boot/bzImage is ready  (#1)"), None);
    }
}
