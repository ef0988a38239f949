//! Chains the stages. Each stage has a cache key (the sha256 of every input
//! that can change its output) and a stamp in `<work>/<stage>/stamp.json`. A
//! stage whose key is unchanged is skipped and says so; one whose key changed
//! names the inputs that changed.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context as _, Result};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::boot::{self, BootOptions, BootOutput};
use crate::cache::{Cache, write_file_atomic};
use crate::commit::{self, CommitFacts, CommitOutput};
use crate::fetch::{self, FetchOptions, Fetched};
use crate::hashing::{sha256_file, sha256_hex, sha256_tree};
use crate::kernel::build::{KernelOutput, build, kernel_key};
use crate::kernel::config::{KconfigOutput, configure, read_fragments};
use crate::kernel::{self, MakeEnv, SourceTree};
use crate::live::{self, IsoOutput, LiveInputs};
use crate::ostree;
use crate::recipe::{ConfigBase, Flavor, Recipe, RootfsBase};
use crate::rootfs::{self, BuildInfo, ComposeInputs, KernelFiles, RootfsOutput};
use crate::tag::{self, TagOutput, TagRequest};
use crate::ui::Ui;
use crate::verify;
use rtcheck::Evidence;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Stage {
    Fetch,
    Kconfig,
    Kernel,
    Verify,
    Rootfs,
    Commit,
    Iso,
    Boot,
    Tag,
}

impl Stage {
    pub const ALL: [Stage; 9] = [
        Stage::Fetch,
        Stage::Kconfig,
        Stage::Kernel,
        Stage::Verify,
        Stage::Rootfs,
        Stage::Commit,
        Stage::Iso,
        Stage::Boot,
        Stage::Tag,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Stage::Fetch => "fetch",
            Stage::Kconfig => "kconfig",
            Stage::Kernel => "kernel",
            Stage::Verify => "verify",
            Stage::Rootfs => "rootfs",
            Stage::Commit => "commit",
            Stage::Iso => "iso",
            Stage::Boot => "boot",
            Stage::Tag => "tag",
        }
    }
}

impl fmt::Display for Stage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The named inputs of a stage; its digest is the cache key.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Key {
    pub inputs: BTreeMap<String, String>,
}

impl Key {
    pub fn new() -> Self {
        Key::default()
    }

    /// Adds an input; long values are recorded by their hash.
    pub fn with(mut self, name: &str, value: impl AsRef<str>) -> Self {
        let value = value.as_ref();
        let recorded = if value.len() > 200 {
            format!("sha256:{}", sha256_hex(value))
        } else {
            value.to_string()
        };
        self.inputs.insert(name.to_string(), recorded);
        self
    }

    pub fn digest(&self) -> String {
        let mut text = String::new();
        for (name, value) in &self.inputs {
            text.push_str(name);
            text.push('=');
            text.push_str(value);
            text.push('\n');
        }
        sha256_hex(text)
    }

    /// Names of the inputs that differ from `old` (added, removed or changed).
    pub fn changed_since(&self, old: &Key) -> Vec<String> {
        let mut names: Vec<String> = self
            .inputs
            .iter()
            .filter(|(k, v)| old.inputs.get(*k) != Some(v))
            .map(|(k, _)| k.clone())
            .collect();
        names.extend(
            old.inputs
                .keys()
                .filter(|k| !self.inputs.contains_key(*k))
                .cloned(),
        );
        names
    }
}

#[derive(Serialize, Deserialize)]
pub struct Stamp<T> {
    pub digest: String,
    pub key: Key,
    pub output: T,
}

pub enum Freshness<T> {
    /// The stamp matches the key: reuse its output.
    UpToDate(T),
    /// A previous run used other inputs; these changed.
    Changed(Vec<String>),
    /// No previous run (or an unreadable stamp).
    Missing,
}

fn stamp_path(stage_dir: &Path) -> PathBuf {
    stage_dir.join("stamp.json")
}

pub fn check_stamp<T: DeserializeOwned>(stage_dir: &Path, key: &Key) -> Freshness<T> {
    let Ok(text) = std::fs::read_to_string(stamp_path(stage_dir)) else {
        return Freshness::Missing;
    };
    match serde_json::from_str::<Stamp<T>>(&text) {
        Ok(stamp) if stamp.digest == key.digest() => Freshness::UpToDate(stamp.output),
        Ok(stamp) => Freshness::Changed(key.changed_since(&stamp.key)),
        Err(_) => Freshness::Missing,
    }
}

/// Writes the stamp last, after the stage's outputs are complete.
pub fn write_stamp<T: Serialize>(stage_dir: &Path, key: &Key, output: &T) -> Result<()> {
    let stamp = Stamp {
        digest: key.digest(),
        key: key.clone(),
        output,
    };
    write_file_atomic(
        &stamp_path(stage_dir),
        serde_json::to_string_pretty(&stamp)?.as_bytes(),
    )
}

/// Removes a stage's stamp so a failed rerun never leaves the old one looking current.
pub fn invalidate(stage_dir: &Path) -> Result<()> {
    match std::fs::remove_file(stamp_path(stage_dir)) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(e).with_context(|| format!("removing {}", stamp_path(stage_dir).display()))
        }
        _ => Ok(()),
    }
}

/// Everything a stage may use.
pub struct Context {
    pub recipe: Recipe,
    pub work_dir: PathBuf,
    pub cache: Cache,
    pub ui: Ui,
    pub fetch_options: FetchOptions,
    pub boot: BootOptions,
}

impl Context {
    pub fn stage_dir(&self, stage: Stage) -> Result<PathBuf> {
        let dir = self.work_dir.join(stage.name());
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(dir)
    }
}

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Outcome {
    Ran,
    Cached,
}

#[derive(Clone, Debug, Serialize)]
pub struct StageReport {
    pub stage: Stage,
    pub outcome: Outcome,
    pub key: String,
    pub seconds: f64,
    pub output: serde_json::Value,
}

#[derive(Clone, Debug, Default, Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct PipelineReport {
    pub recipe: String,
    pub name: String,
    pub version: String,
    pub flavor: String,
    pub work_dir: PathBuf,
    pub stages: Vec<StageReport>,
}

/// Runs a stage body unless its stamp is current and `present` confirms its
/// outputs still exist; records the report.
fn run_stage<T: Serialize + DeserializeOwned>(
    ctx: &Context,
    report: &mut PipelineReport,
    stage: Stage,
    key: &Key,
    present: impl Fn(&T) -> bool,
    body: impl FnOnce(&Path) -> Result<T>,
) -> Result<T> {
    let dir = ctx.stage_dir(stage)?;
    let started = Instant::now();
    let freshness = match check_stamp::<T>(&dir, key) {
        Freshness::UpToDate(output) if !present(&output) => {
            Freshness::Changed(vec!["outputs missing".into()])
        }
        other => other,
    };
    let (output, outcome) = match freshness {
        Freshness::UpToDate(output) => {
            ctx.ui
                .step(stage.name(), "up to date (cache key unchanged), skipped");
            (output, Outcome::Cached)
        }
        freshness => {
            match freshness {
                Freshness::Changed(names) => ctx
                    .ui
                    .step(stage.name(), format!("inputs changed: {}", names.join(", "))),
                _ => ctx.ui.step(stage.name(), "no previous result, running"),
            }
            invalidate(&dir)?;
            let output = body(&dir).with_context(|| format!("stage `{stage}` failed"))?;
            write_stamp(&dir, key, &output)?;
            (output, Outcome::Ran)
        }
    };
    report.stages.push(StageReport {
        stage,
        outcome,
        key: key.digest(),
        seconds: started.elapsed().as_secs_f64(),
        output: serde_json::to_value(&output)?,
    });
    Ok(output)
}

/// The kconfig stage's cache key: everything that can change the final `.config`.
fn kconfig_key(ctx: &Context, source: &SourceTree, toolchain: &str, make_env: &MakeEnv) -> Result<Key> {
    let recipe = &ctx.recipe;
    let base = match &recipe.kernel.base {
        ConfigBase::Target(target) => format!("make {target}"),
        ConfigBase::File(path) => format!("file sha256:{}", sha256_file(path, None)?),
    };
    let mut key = Key::new()
        .with("source", &source.sha256)
        .with("base", base)
        .with("flavor", recipe.flavor.to_string())
        .with("allow-dropped", recipe.kernel.allow_dropped.join(","))
        .with("toolchain", toolchain)
        .with("make", make_env.key_text());
    for (name, text) in read_fragments(recipe)? {
        key = key.with(&format!("fragment {name}"), sha256_hex(&text));
    }
    Ok(key)
}

/// The verify stage's result: the evidence, kept for the commit metadata.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct VerifyOutput {
    pub evidence: Evidence,
    pub passed: bool,
}

/// Runs the pipeline up to and including `until`.
pub fn run(ctx: &Context, until: Stage, report: &mut PipelineReport) -> Result<()> {
    report.recipe = ctx.recipe.file.display().to_string();
    report.name = ctx.recipe.name.clone();
    report.version = ctx.recipe.version.clone();
    report.flavor = ctx.recipe.flavor.to_string();
    report.work_dir = ctx.work_dir.clone();

    // The content-addressed cache is the fetch stage's cache: a stamp could
    // outlive a cleared cache, so fetch always asks the cache itself.
    let started = Instant::now();
    ctx.ui
        .step("fetch", format!("kernel source: {}", ctx.recipe.kernel.source));
    let fetched: Fetched = fetch::fetch(&ctx.recipe.kernel.source, &ctx.cache, &ctx.fetch_options, &ctx.ui)
        .context("stage `fetch` failed")?;
    report.stages.push(StageReport {
        stage: Stage::Fetch,
        outcome: if fetched.cached {
            Outcome::Cached
        } else {
            Outcome::Ran
        },
        key: fetched.sha256.clone(),
        seconds: started.elapsed().as_secs_f64(),
        output: serde_json::to_value(&fetched)?,
    });
    if until == Stage::Fetch {
        return Ok(());
    }

    let recipe = &ctx.recipe;
    let source = kernel::prepare_source(&fetched, &ctx.cache, &ctx.ui)?;
    let make_env = MakeEnv::new(recipe.source_date_epoch());
    let toolchain = kernel::toolchain_id()?;
    let build_dir = kernel::build_dir(&ctx.work_dir, &source, &recipe.kernel.base);
    let key = kconfig_key(ctx, &source, &toolchain, &make_env)?;
    let kconfig: KconfigOutput = run_stage(
        ctx,
        report,
        Stage::Kconfig,
        &key,
        |out: &KconfigOutput| out.config.is_file() && out.build_dir.join(".config").is_file(),
        |dir| configure(recipe, &source, &build_dir, &make_env, dir, &ctx.ui),
    )?;
    if until == Stage::Kconfig {
        return Ok(());
    }

    let key = kernel_key(&source, &kconfig, &toolchain, &make_env);
    let kernel: KernelOutput = run_stage(
        ctx,
        report,
        Stage::Kernel,
        &key,
        |out: &KernelOutput| out.bzimage.is_file(),
        |dir| build(&source, &kconfig, &key, &make_env, &ctx.cache, dir, &ctx.ui),
    )?;
    if until == Stage::Kernel {
        return Ok(());
    }

    let key = Key::new()
        .with("bzimage", &kernel.bzimage_sha256)
        .with("config", &kernel.config_sha256)
        .with("modules", kernel.key.as_str())
        .with(
            "kconfig",
            format!(
                "{} requested, preempt_rt={}",
                kconfig.requested, kconfig.preempt_rt
            ),
        )
        .with("flavor", recipe.flavor.to_string());
    let verified: VerifyOutput = run_stage(
        ctx,
        report,
        Stage::Verify,
        &key,
        |_| true,
        |dir| {
            let mut evidence =
                verify::check_artifacts(&kernel.bzimage, Some(&kernel.config), kernel.modules.as_deref())?;
            evidence
                .checks
                .insert(0, verify::config_check(kconfig.requested, kconfig.preempt_rt));
            write_file_atomic(
                &dir.join("evidence.json"),
                serde_json::to_string_pretty(&evidence)?.as_bytes(),
            )?;
            for line in verify::render(&evidence).lines() {
                ctx.ui.note(line);
            }
            let mut required = verify::ARTIFACT_CHECKS.to_vec();
            if kernel.modules.is_some() {
                required.push(rtcheck::evidence::id::MODULES);
            }
            let passed = evidence.all_passed(&required);
            if recipe.flavor == Flavor::Rt {
                verify::gate("verify", &evidence, &required)?;
            }
            Ok(VerifyOutput { evidence, passed })
        },
    )?;
    if until == Stage::Verify {
        return Ok(());
    }

    let rootfs = stage_rootfs(ctx, report, &kernel)?;
    if until == Stage::Rootfs {
        return Ok(());
    }
    let committed = stage_commit(ctx, report, &kernel, &rootfs, &verified.evidence)?;
    if until == Stage::Commit {
        return Ok(());
    }
    let iso = stage_iso(ctx, report, &kernel)?;
    if until == Stage::Iso {
        return Ok(());
    }
    let booted = stage_boot(ctx, report, &iso)?;
    if until == Stage::Boot {
        return Ok(());
    }
    let with_modules = kernel.modules.is_some();
    stage_tag(
        ctx,
        report,
        &committed,
        &tag::required_checks(with_modules, true),
        Some(&booted.evidence),
    )?;
    Ok(())
}

fn kernel_files(kernel: &KernelOutput) -> KernelFiles {
    KernelFiles {
        bzimage: kernel.bzimage.clone(),
        config: kernel.config.clone(),
        modules: kernel.modules.clone(),
        release: kernel.release.clone(),
    }
}

/// Where the live ISO goes: the recipe's path, else `<work>/<name>-<flavor>-live.iso`.
pub fn iso_path(ctx: &Context) -> PathBuf {
    let recipe = &ctx.recipe;
    recipe.live.iso.clone().unwrap_or_else(|| {
        ctx.work_dir
            .join(format!("{}-{}-live.iso", recipe.name, recipe.flavor))
    })
}

fn stage_iso(ctx: &Context, report: &mut PipelineReport, kernel: &KernelOutput) -> Result<IsoOutput> {
    let recipe = &ctx.recipe;
    let live_rootfs = recipe
        .live
        .rootfs
        .clone()
        .context("the recipe has no `live.rootfs` (the live image's files, e.g. ../live-image/rootfs)")?;
    let suite = match &recipe.rootfs.base {
        RootfsBase::Debian { suite, .. } => suite.clone(),
        RootfsBase::Tarball(_) => "bookworm".to_string(),
    };
    let list = std::fs::read_to_string(live_rootfs.join(live::PACKAGES_FILE))
        .with_context(|| format!("reading {}", live_rootfs.join(live::PACKAGES_FILE).display()))?;
    let mut packages = live::parse_packages(&list);
    packages.extend(recipe.live.packages.iter().cloned());
    let jitter = live::find_jitter()?;
    let iso = iso_path(ctx);
    let key = Key::new()
        .with("kernel", &kernel.key)
        .with(
            "base",
            rootfs::base::debian_key(&suite, "essential", &packages, None),
        )
        .with("jitter", sha256_file(&jitter, None)?)
        .with("live-rootfs", sha256_tree(&live_rootfs)?)
        .with("ssh-keys", recipe.live.ssh_authorized_keys.join("\n"))
        .with("kargs", recipe.kernel.cmdline.join(" "))
        .with(
            "name",
            format!("{} {} {}", recipe.name, recipe.version, recipe.flavor),
        )
        .with("epoch", recipe.source_date_epoch().to_string())
        .with("iso", iso.display().to_string())
        .with("format", ROOTFS_FORMAT);
    let present = |out: &IsoOutput| out.iso.is_file();
    run_stage(ctx, report, Stage::Iso, &key, present, |dir| {
        let title = format!("{} {} live", recipe.name, recipe.version);
        let version_line = format!(
            "{} {}, {} flavor, kernel {}",
            recipe.name, recipe.version, recipe.flavor, kernel.release
        );
        let inputs = LiveInputs {
            title: &title,
            version_line: &version_line,
            suite: &suite,
            packages,
            live_rootfs: &live_rootfs,
            kernel: &kernel_files(kernel),
            kargs: &recipe.kernel.cmdline,
            ssh_authorized_keys: &recipe.live.ssh_authorized_keys,
            jitter: &jitter,
            iso: &iso,
            epoch: recipe.source_date_epoch(),
        };
        live::build_iso(&inputs, &ctx.cache, &ctx.fetch_options, dir, &ctx.ui)
    })
}

fn stage_boot(ctx: &Context, report: &mut PipelineReport, iso: &IsoOutput) -> Result<BootOutput> {
    let options = &ctx.boot;
    let key = Key::new()
        .with("iso", &iso.iso_sha256)
        .with("accel", format!("{:?}", options.accel))
        .with("jitter", options.jitter.map_or("none".into(), |s| s.to_string()))
        .with("uefi", options.uefi.to_string());
    run_stage(
        ctx,
        report,
        Stage::Boot,
        &key,
        |_| true,
        |dir| {
            let out = boot::boot(
                &iso.iso,
                &iso.iso_sha256,
                options,
                &dir.join("console.log"),
                &ctx.ui,
            )?;
            for line in boot::render(&out).lines() {
                ctx.ui.note(line);
            }
            Ok(out)
        },
    )
}

/// The ostree repo: the recipe's, else `<work>/repo`.
pub fn repo_path(ctx: &Context) -> PathBuf {
    ctx.recipe
        .ostree
        .repo
        .clone()
        .unwrap_or_else(|| ctx.work_dir.join("repo"))
}

/// Bumped when the composed layout changes, so old rootfs stamps go stale.
const ROOTFS_FORMAT: &str = concat!("imgbuild ", env!("CARGO_PKG_VERSION"), " layout 1");

fn stage_rootfs(ctx: &Context, report: &mut PipelineReport, kernel: &KernelOutput) -> Result<RootfsOutput> {
    let recipe = &ctx.recipe;
    let base_key = match &recipe.rootfs.base {
        RootfsBase::Debian {
            suite,
            variant,
            packages,
            mirror,
        } => rootfs::base::debian_key(suite, variant, packages, mirror.as_deref()),
        RootfsBase::Tarball(source) => fetch::fetch(source, &ctx.cache, &ctx.fetch_options, &ctx.ui)?.sha256,
    };
    let busybox = rootfs::static_busybox()?;
    let mut key = Key::new()
        .with("base", &base_key)
        .with("kernel", &kernel.key)
        .with("kargs", recipe.kernel.cmdline.join(" "))
        .with("flavor", recipe.flavor.to_string())
        .with("name", format!("{} {}", recipe.name, recipe.version))
        .with("busybox", sha256_file(&busybox, None)?)
        .with("format", ROOTFS_FORMAT);
    for (i, overlay) in recipe.rootfs.overlays.iter().enumerate() {
        key = key.with(
            &format!("overlay {}", recipe.raw.rootfs.overlays[i]),
            sha256_tree(overlay)?,
        );
    }
    run_stage(
        ctx,
        report,
        Stage::Rootfs,
        &key,
        |out: &RootfsOutput| out.tree.is_dir(),
        |dir| {
            let epoch = recipe.source_date_epoch();
            let base = rootfs::base::obtain(
                &recipe.rootfs.base,
                &ctx.cache,
                &ctx.fetch_options,
                epoch,
                &ctx.ui,
            )?;
            let kernel_files = KernelFiles {
                bzimage: kernel.bzimage.clone(),
                config: kernel.config.clone(),
                modules: kernel.modules.clone(),
                release: kernel.release.clone(),
            };
            let info = BuildInfo {
                name: recipe.name.clone(),
                version: recipe.version.clone(),
                flavor: recipe.flavor.to_string(),
                kernel_release: kernel.release.clone(),
            };
            let inputs = ComposeInputs {
                base_tarball: &base.path,
                kernel: &kernel_files,
                overlays: &recipe.rootfs.overlays,
                kargs: &recipe.kernel.cmdline,
                info: &info,
                busybox: &busybox,
                epoch,
            };
            rootfs::compose(&inputs, dir, &ctx.ui)
        },
    )
}

fn stage_commit(
    ctx: &Context,
    report: &mut PipelineReport,
    kernel: &KernelOutput,
    rootfs: &RootfsOutput,
    evidence: &Evidence,
) -> Result<CommitOutput> {
    let recipe = &ctx.recipe;
    let facts = CommitFacts {
        name: &recipe.name,
        version: &recipe.version,
        flavor: recipe.flavor,
        kernel_release: &kernel.release,
        kernel_config_sha256: &kernel.config_sha256,
        kargs: &recipe.kernel.cmdline,
        recipe_sha256: &recipe.sha256,
        evidence,
    };
    let metadata = commit::metadata(&facts)?;
    let repo = repo_path(ctx);
    // The parent (the ref's target) is not part of the key: tagging this
    // commit moves the ref to it, and the rerun must still be a cache hit.
    let rootfs_key = report.stages.last().map(|s| s.key.clone()).unwrap_or_default();
    let key = Key::new()
        .with("rootfs", rootfs_key)
        .with("metadata", format!("{metadata:?}"))
        .with("repo", repo.display().to_string())
        .with("timestamp", recipe.source_date_epoch().to_string());
    let present = |out: &CommitOutput| {
        ostree::open(&out.repo).is_ok_and(|r| ostree::resolve(&r, &out.checksum).is_ok_and(|c| c.is_some()))
    };
    run_stage(ctx, report, Stage::Commit, &key, present, |_| {
        let subject = format!("{} {} ({})", recipe.name, recipe.version, recipe.flavor);
        let out = commit::commit(
            &repo,
            &recipe.ostree.ref_name,
            &rootfs.tree,
            &metadata,
            &subject,
            recipe.source_date_epoch(),
        )?;
        ctx.ui.note(format!(
            "commit {} ({} of {} content objects written, {} bytes)",
            out.checksum,
            out.stats.content_objects_written,
            out.stats.content_objects_total,
            out.stats.content_bytes_written
        ));
        Ok(out)
    })
}

fn stage_tag(
    ctx: &Context,
    report: &mut PipelineReport,
    committed: &CommitOutput,
    required: &[&str],
    boot_evidence: Option<&Evidence>,
) -> Result<TagOutput> {
    let recipe = &ctx.recipe;
    let started = Instant::now();
    ctx.ui.step(
        "tag",
        format!("gate for {} ({} flavor)", recipe.ostree.ref_name, recipe.flavor),
    );
    let out = tag::tag(&TagRequest {
        repo: &committed.repo,
        ref_name: &recipe.ostree.ref_name,
        commit: &committed.checksum,
        flavor: recipe.flavor,
        required,
        boot_evidence,
        gpg_key: recipe.ostree.gpg_key.as_deref(),
        gpg_homedir: recipe.ostree.gpg_homedir.as_deref(),
    })
    .context("stage `tag` failed")?;
    ctx.ui.note(format!(
        "{} -> {}{}",
        out.ref_name,
        out.commit,
        if out.signed { " (GPG signed)" } else { "" }
    ));
    report.stages.push(StageReport {
        stage: Stage::Tag,
        outcome: if out.previous.as_deref() == Some(out.commit.as_str()) {
            Outcome::Cached
        } else {
            Outcome::Ran
        },
        key: out.commit.clone(),
        seconds: started.elapsed().as_secs_f64(),
        output: serde_json::to_value(&out)?,
    });
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_digest_and_changes() {
        let a = Key::new().with("source", "x").with("config", "y");
        let b = Key::new()
            .with("source", "x")
            .with("config", "z")
            .with("gcc", "12");
        assert_ne!(a.digest(), b.digest());
        assert_eq!(
            a.digest(),
            Key::new().with("config", "y").with("source", "x").digest()
        );
        assert_eq!(b.changed_since(&a), vec!["config".to_string(), "gcc".to_string()]);
        let long = Key::new().with("config", "c".repeat(300));
        assert!(long.inputs["config"].starts_with("sha256:"));
    }

    #[test]
    fn stamps() {
        let dir = tempfile::tempdir().unwrap();
        let key = Key::new().with("a", "1");
        assert!(matches!(check_stamp::<u32>(dir.path(), &key), Freshness::Missing));
        write_stamp(dir.path(), &key, &7u32).unwrap();
        assert!(matches!(
            check_stamp::<u32>(dir.path(), &key),
            Freshness::UpToDate(7)
        ));
        let changed = Key::new().with("a", "2");
        match check_stamp::<u32>(dir.path(), &changed) {
            Freshness::Changed(names) => assert_eq!(names, vec!["a".to_string()]),
            _ => panic!("expected a change"),
        }
        invalidate(dir.path()).unwrap();
        assert!(matches!(check_stamp::<u32>(dir.path(), &key), Freshness::Missing));
    }
}
