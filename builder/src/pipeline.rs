//! Chains the stages through the stage protocol (`crate::stage`): the list of
//! stages and what each one is given, nothing else.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context as _, Result, bail};
use serde::{Deserialize, Serialize};

use crate::cache::{Cache, remote};
use crate::io::atomic::write_file_atomic;
use crate::io::hashing::{sha256_file, sha256_hex, sha256_tree};
use crate::ostree;
use crate::recipe::{ConfigBase, Flavor, Recipe, RootfsBase};
use crate::sbom::{self, image::WrittenSbom};
use crate::secure_boot::SigningKey;
use crate::stage::{Key, Outcome, Stage, StageReport, StageRun, record};
use crate::stages::boot::{self, BootOptions, BootOutput};
use crate::stages::commit::{self, CommitFacts, CommitOutput};
use crate::stages::disk::{self, DiskOutput, DiskRequest, InputNames};
use crate::stages::fetch::{self, FetchOptions, Fetched};
use crate::stages::iso::{self, IsoOutput, LiveInputs};
use crate::stages::kernel::build::{KernelOutput, build, kernel_key};
use crate::stages::kernel::compiler::CompilerOptions;
use crate::stages::kernel::config::{KconfigOutput, configure, read_fragments};
use crate::stages::kernel::{self, KernelDate, MakeEnv, SourceTree};
use crate::stages::rootfs::base::{BaseFor, DebianBase};
use crate::stages::rootfs::{self, BuildInfo, ComposeInputs, KernelFiles, RootfsOutput};
use crate::stages::tag::{self, TagOutput, TagRequest};
use crate::stages::verify;
use crate::ui::Ui;
use rtcheck::Evidence;

/// Everything a stage may use.
pub struct Context {
    pub recipe: Recipe,
    pub work_dir: PathBuf,
    pub cache: Cache,
    pub ui: Ui,
    pub fetch_options: FetchOptions,
    pub boot: BootOptions,
    /// distcc, ccache and -j for the kernel build (not in any key).
    pub compiler: CompilerOptions,
    /// The Secure Boot key the verify stage signs the proven kernel with.
    pub signing: Option<SigningKey>,
}

impl Context {
    pub fn stage_dir(&self, stage: Stage) -> Result<PathBuf> {
        let dir = self.work_dir.join(stage.name());
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(dir)
    }

    /// A stage's run, reporting into `report`.
    fn run<'a>(&'a self, report: &'a mut PipelineReport, stage: Stage) -> Result<StageRun<'a>> {
        Ok(StageRun {
            stage,
            dir: self.stage_dir(stage)?,
            ui: &self.ui,
            reports: &mut report.stages,
        })
    }
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
    /// What the release reused and what devices download, once the run
    /// has ended well.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub economics: Option<crate::economics::Economics>,
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
        .with_value("allow-dropped", &recipe.kernel.allow_dropped)
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
    /// The kernel signed for Secure Boot after the checks passed, when the
    /// build has a key: what the rootfs and the live ISO carry.
    #[serde(default)]
    pub signed: Option<SignedImage>,
}

/// A kernel image signed by the gate.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SignedImage {
    pub path: PathBuf,
    pub sha256: String,
}

/// Refuses a run this imgbuild cannot finish for the recipe's machine,
/// before anything runs: Secure Boot signs x86_64 images only, and a
/// foreign machine's root filesystem needs a host that runs its programs
/// ([`rootfs::binfmt`]).
pub fn check_reach(recipe: &Recipe, until: Stage, signing: Option<&SigningKey>) -> Result<()> {
    if recipe.arch != rtcheck::Arch::X86_64 && signing.is_some() {
        bail!(
            "{}: arch: {}: Secure Boot signing covers x86_64 images (shim and GRUB for x86_64 UEFI): build {} without a Secure Boot key",
            recipe.file.display(),
            recipe.arch,
            recipe.arch
        );
    }
    if until >= Stage::Rootfs && recipe.arch != rtcheck::Arch::host() {
        crate::tool::require("arch-test")?;
        rootfs::binfmt::check_runs(recipe.arch, Path::new(rootfs::binfmt::BINFMT_DIR))
            .with_context(|| format!("{}: arch: {}", recipe.file.display(), recipe.arch))?;
    }
    Ok(())
}

/// Runs the pipeline up to and including `until`, then says what the
/// release cost ([`crate::economics`]).
pub fn run(ctx: &Context, until: Stage, report: &mut PipelineReport) -> Result<()> {
    check_reach(&ctx.recipe, until, ctx.signing.as_ref())?;
    // Held until the run ends: a second run on this work dir fails at once.
    let _work_dir_lock = crate::cache::lock_work_dir(&ctx.work_dir)?;
    run_stages(ctx, until, report)?;
    let economics = crate::economics::of_run(&report.stages);
    if !economics.parts.is_empty() {
        ctx.ui
            .step("release", "what this build reused, and what devices download");
        for line in crate::economics::render(&economics).lines() {
            ctx.ui.note(line);
        }
    }
    report.economics = Some(economics);
    Ok(())
}

fn run_stages(ctx: &Context, until: Stage, report: &mut PipelineReport) -> Result<()> {
    report.recipe = ctx.recipe.file.display().to_string();
    report.name = ctx.recipe.name.clone();
    report.version = ctx.recipe.version.clone();
    report.flavor = ctx.recipe.flavor.to_string();
    report.work_dir = ctx.work_dir.clone();

    let fetched = stage_fetch(ctx, report)?;
    if until == Stage::Fetch {
        return Ok(());
    }

    let recipe = &ctx.recipe;
    let source = kernel::prepare_source(&fetched, &ctx.cache, &ctx.ui)?;
    let kernel_date = KernelDate::of(recipe.kernel.source_date_epoch, &source)?;
    ctx.ui.note(format!(
        "kernel date: {} ({}), not the release's",
        kernel::format_utc(kernel_date.epoch),
        kernel_date.origin
    ));
    let make_env = MakeEnv {
        compiler: ctx.compiler.clone(),
        ..MakeEnv::new(recipe.arch, kernel_date.epoch)
    };
    let toolchain = kernel::toolchain_id(recipe.arch)?;
    let build_dir = kernel::build_dir(&ctx.work_dir, &source, recipe.arch, &recipe.kernel.base);
    let key = kconfig_key(ctx, &source, &toolchain, &make_env)?;
    let kconfig: KconfigOutput = ctx.run(report, Stage::Kconfig)?.cached(
        &key,
        |out: &KconfigOutput| out.config.is_file() && out.build_dir.join(".config").is_file(),
        |dir| configure(recipe, &source, &build_dir, &make_env, dir, &ctx.ui),
    )?;
    if until == Stage::Kconfig {
        return Ok(());
    }

    let build_env = make_env.with_build_version(kernel::build_version(
        &source.sha256,
        &kconfig.config_sha256,
        &toolchain,
    ));
    let key = kernel_key(&source, &kconfig, &toolchain, &build_env);
    let kernel: KernelOutput = ctx.run(report, Stage::Kernel)?.cached(
        &key,
        |out: &KernelOutput| out.bzimage.is_file(),
        |dir| build(&source, &kconfig, &key, &build_env, &ctx.cache, dir, &ctx.ui),
    )?;
    if until == Stage::Kernel {
        return Ok(());
    }

    let verified = stage_verify(ctx, report, &kconfig, &kernel, kernel_date.epoch)?;
    if until == Stage::Verify {
        return Ok(());
    }

    let signed = verified.signed.as_ref();
    let rootfs = stage_rootfs(ctx, report, &kernel, signed, kernel_date.epoch)?;
    if until == Stage::Rootfs {
        return Ok(());
    }
    let committed = stage_commit(ctx, report, &fetched, &kernel, &rootfs, &verified)?;
    if until == Stage::Commit {
        return Ok(());
    }
    let (iso, live_insecure) = stage_iso(ctx, report, &fetched, &kernel, signed)?;
    if until == Stage::Iso {
        return Ok(());
    }
    let booted = stage_boot(ctx, report, &iso)?;
    if until == Stage::Boot {
        return Ok(());
    }
    let with_modules = kernel.modules.is_some();
    // The ISO as it is now, not as a stamp remembers it.
    let live_iso_sha256 = crate::io::hashing::sha256_file(&iso.iso, None)?;
    let tagged = stage_tag(
        ctx,
        report,
        &committed,
        &tag::required_checks(with_modules, true),
        Some((&booted.evidence, live_iso_sha256.as_str())),
        &live_insecure,
    )?;
    if until == Stage::Tag {
        return Ok(());
    }
    stage_disk(ctx, report, &tagged)?;
    Ok(())
}

/// The fetch stage: the content-addressed cache is its cache. A stamp could
/// outlive a cleared cache, so fetch always asks the cache itself.
fn stage_fetch(ctx: &Context, report: &mut PipelineReport) -> Result<Fetched> {
    let started = Instant::now();
    ctx.ui
        .step("fetch", format!("kernel source: {}", ctx.recipe.kernel.source));
    let fetched = fetch::fetch(&ctx.recipe.kernel.source, &ctx.cache, &ctx.fetch_options, &ctx.ui)
        .context("stage `fetch` failed")?;
    let outcome = if fetched.cached {
        Outcome::Cached
    } else {
        Outcome::Ran
    };
    record(
        &mut report.stages,
        Stage::Fetch,
        outcome,
        fetched.sha256.clone(),
        started,
        &fetched,
    )?;
    Ok(fetched)
}

/// The verify stage: every PREEMPT_RT check on the built artifact.
fn stage_verify(
    ctx: &Context,
    report: &mut PipelineReport,
    kconfig: &KconfigOutput,
    kernel: &KernelOutput,
    kernel_epoch: u64,
) -> Result<VerifyOutput> {
    let recipe = &ctx.recipe;
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
        .with("flavor", recipe.flavor.to_string())
        .with(
            "secure-boot cert",
            ctx.signing
                .as_ref()
                .map_or("none".into(), |s| s.cert.fingerprint()),
        );
    ctx.run(report, Stage::Verify)?.cached(
        &key,
        |out: &VerifyOutput| out.signed.as_ref().is_none_or(|s| s.path.is_file()),
        |dir| {
            let mut evidence =
                verify::check_artifacts(&kernel.bzimage, Some(&kernel.config), kernel.modules.as_deref())?;
            evidence.expect_arch(recipe.arch);
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
            let required =
                rtcheck::required_checks(rtcheck::RequiredFor::build(kernel.modules.is_some(), false));
            let passed = evidence.all_passed(&required);
            if recipe.flavor == Flavor::Rt {
                verify::gate("verify", &evidence, &required)?;
            }
            let signed = sign_kernel(ctx, &kernel.bzimage, dir, kernel_epoch)?;
            Ok(VerifyOutput {
                evidence,
                passed,
                signed,
            })
        },
    )
}

/// Signs the kernel the checks just passed, when the build has a key; says
/// so when it has none. The signature is dated by the kernel's date, so an
/// unchanged kernel keeps its signed bytes from release to release.
fn sign_kernel(ctx: &Context, bzimage: &Path, dir: &Path, kernel_epoch: u64) -> Result<Option<SignedImage>> {
    let Some(signing) = &ctx.signing else {
        ctx.ui.note(
            "no Secure Boot key (secure-boot: or --secure-boot-key): this build's images will not boot with Secure Boot on",
        );
        return Ok(None);
    };
    let path = dir.join("vmlinuz.signed");
    signing.sign(bzimage, &path, dir, kernel_epoch)?;
    let sha256 = sha256_file(&path, None)?;
    ctx.ui.note(format!(
        "signed the proven kernel for Secure Boot: sha256 {sha256}, certificate sha256 {}",
        signing.cert.fingerprint()
    ));
    Ok(Some(SignedImage { path, sha256 }))
}

/// The sha256 of the kernel image the images carry: the signed one when
/// there is one.
fn shipped_image_sha256<'a>(kernel: &'a KernelOutput, signed: Option<&'a SignedImage>) -> &'a str {
    signed.map_or(&kernel.bzimage_sha256, |s| &s.sha256)
}

/// The kernel files the images carry: the signed image when there is one.
fn kernel_files(kernel: &KernelOutput, signed: Option<&SignedImage>) -> KernelFiles {
    KernelFiles {
        bzimage: signed.map_or_else(|| kernel.bzimage.clone(), |s| s.path.clone()),
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

/// The iso stage; with the live base when it came from an unverified cache
/// remote entry (its boot is the tag's evidence).
fn stage_iso(
    ctx: &Context,
    report: &mut PipelineReport,
    fetched: &Fetched,
    kernel: &KernelOutput,
    signed: Option<&SignedImage>,
) -> Result<(IsoOutput, Vec<String>)> {
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
    let list = std::fs::read_to_string(live_rootfs.join(iso::PACKAGES_FILE))
        .with_context(|| format!("reading {}", live_rootfs.join(iso::PACKAGES_FILE).display()))?;
    let mut packages = iso::parse_packages(&list);
    packages.extend(recipe.live.packages.iter().cloned());
    let jitter = rootfs::find_jitter(recipe.arch)?;
    let iso = iso_path(ctx);
    let live_rootfs_sha256 = sha256_tree(&live_rootfs)?;
    // As the recipe names it: the SBOM holds no host path.
    let live_rootfs_name = recipe
        .raw
        .live
        .as_ref()
        .and_then(|l| l.rootfs.clone())
        .unwrap_or_default();
    let live_base = DebianBase {
        suite: &suite,
        variant: "essential",
        packages: &packages,
        mirror: None,
        arch: recipe.arch,
    }
    .key();
    let key = Key::new()
        .with("kernel", &kernel.key)
        .with("signed kernel", signed.map_or("none", |s| s.sha256.as_str()))
        .with("base", &live_base)
        .with("jitter", sha256_file(&jitter, None)?)
        .with("live-rootfs", &live_rootfs_sha256)
        .with_value("ssh-keys", &recipe.live.ssh_authorized_keys)
        .with_value("kargs", &recipe.kernel.cmdline)
        .with(
            "name",
            format!("{} {} {}", recipe.name, recipe.version, recipe.flavor),
        )
        .with("epoch", recipe.source_date_epoch().to_string())
        .with("iso", iso.display().to_string())
        .with("format", ROOTFS_FORMAT);
    let present = |out: &IsoOutput| out.iso.is_file() && out.sbom.as_ref().is_some_and(|p| p.is_file());
    let flavor = recipe.flavor.to_string();
    let iso = ctx.run(report, Stage::Iso)?.cached(&key, present, |dir| {
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
            arch: recipe.arch,
            live_rootfs: &live_rootfs,
            kernel: &kernel_files(kernel, signed),
            kargs: &recipe.kernel.cmdline,
            ssh_authorized_keys: &recipe.live.ssh_authorized_keys,
            jitter: &jitter,
            iso: &iso,
            epoch: recipe.source_date_epoch(),
            facts: &sbom::image::BuildFacts {
                name: &recipe.name,
                version: &recipe.version,
                flavor: &flavor,
                arch: recipe.arch,
                kernel_release: &kernel.release,
                kernel_source_sha256: &fetched.sha256,
                kernel_source_origin: &fetched.origin,
                kernel_debian_source: fetched.debian_source.as_ref(),
                bzimage_sha256: shipped_image_sha256(kernel, signed),
                config_sha256: &kernel.config_sha256,
                overlays: vec![(live_rootfs_name.clone(), live_rootfs_sha256.clone())],
                epoch: recipe.source_date_epoch(),
            },
            signing: ctx.signing.as_ref(),
        };
        iso::build_iso(&inputs, &ctx.cache, &ctx.fetch_options, dir, &ctx.ui)
    })?;
    Ok((iso, insecure_of(ctx, vec![(remote::ROOTFS_BASE, live_base)])))
}

fn stage_boot(ctx: &Context, report: &mut PipelineReport, iso: &IsoOutput) -> Result<BootOutput> {
    let options = &BootOptions {
        cpus: boot::cpus_for_kargs(&ctx.recipe.kernel.cmdline),
        ..ctx.boot.clone()
    };
    let key = Key::new()
        .with("iso", &iso.iso_sha256)
        .with("cpus", options.cpus.to_string())
        .with_value("accel", &options.accel)
        .with("jitter", options.jitter.map_or("none".into(), |s| s.to_string()))
        .with("uefi", options.uefi.to_string())
        .with("evidence", "names its ISO");
    ctx.run(report, Stage::Boot)?.cached(
        &key,
        |_| true,
        |dir| {
            let out = boot::boot(
                &iso.iso,
                &iso.iso_sha256,
                crate::io::qemu::board(ctx.recipe.arch),
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

fn stage_rootfs(
    ctx: &Context,
    report: &mut PipelineReport,
    kernel: &KernelOutput,
    signed: Option<&SignedImage>,
    kernel_epoch: u64,
) -> Result<RootfsOutput> {
    let recipe = &ctx.recipe;
    let base_key = match BaseFor::of(&recipe.rootfs.base, recipe.arch) {
        BaseFor::Debian(debian) => debian.key(),
        BaseFor::Tarball(source) => fetch::fetch(source, &ctx.cache, &ctx.fetch_options, &ctx.ui)?.sha256,
    };
    let busybox = rootfs::initramfs_busybox(recipe.arch)?;
    let device_tool = rootfs::find_device_tool(recipe.arch)?;
    let jitter = rootfs::find_jitter(recipe.arch)?;
    let jitter_man_pages = rootfs::companions::jitter_man_pages()?;
    let mut key = Key::new()
        .with("base", &base_key)
        .with("kernel", &kernel.key)
        .with("signed kernel", signed.map_or("none", |s| s.sha256.as_str()))
        .with_value("kargs", &recipe.kernel.cmdline)
        .with("flavor", recipe.flavor.to_string())
        .with("name", format!("{} {}", recipe.name, recipe.version))
        .with("busybox", busybox.key()?)
        .with("emberrtos-device", sha256_file(&device_tool, None)?)
        .with("jitter", sha256_file(&jitter, None)?)
        .with_value("jitter man pages", &man_page_hashes(&jitter_man_pages))
        .with("format", ROOTFS_FORMAT);
    for (name, tree_sha256) in overlay_hashes(ctx)? {
        key = key.with(&format!("overlay {name}"), tree_sha256);
    }
    ctx.run(report, Stage::Rootfs)?.cached(
        &key,
        |out: &RootfsOutput| out.tree.is_dir(),
        |dir| {
            let base = rootfs::base::obtain(
                &recipe.rootfs.base,
                recipe.arch,
                &ctx.cache,
                &ctx.fetch_options,
                &ctx.ui,
            )?;
            let kernel_files = kernel_files(kernel, signed);
            let info = BuildInfo {
                name: recipe.name.clone(),
                version: recipe.version.clone(),
                flavor: recipe.flavor.to_string(),
                kernel_release: kernel.release.clone(),
            };
            let build_repo = rootfs::base_commit::build_repo_path(&ctx.work_dir);
            let inputs = ComposeInputs {
                base_tarball: &base.path,
                build_repo: build_repo.as_deref(),
                kernel: &kernel_files,
                overlays: &recipe.rootfs.overlays,
                kargs: &recipe.kernel.cmdline,
                info: &info,
                arch: recipe.arch,
                busybox: &busybox,
                device_tool: &device_tool,
                jitter: &jitter,
                jitter_man_pages: &jitter_man_pages,
                kernel_epoch,
            };
            let composed = rootfs::compose(&inputs, dir, &ctx.ui)?;
            Ok(RootfsOutput {
                base_reused: base.cached,
                ..composed
            })
        },
    )
}

/// `(file name, sha256)` of each man page.
fn man_page_hashes(pages: &[(String, Vec<u8>)]) -> Vec<(&str, String)> {
    pages
        .iter()
        .map(|(name, page)| (name.as_str(), sha256_hex(page)))
        .collect()
}

/// `(the recipe's path, the tree's sha256)` of each overlay, in order.
fn overlay_hashes(ctx: &Context) -> Result<Vec<(String, String)>> {
    let recipe = &ctx.recipe;
    recipe
        .rootfs
        .overlays
        .iter()
        .zip(&recipe.raw.rootfs.overlays)
        .map(|(overlay, name)| Ok((name.clone(), sha256_tree(overlay)?)))
        .collect()
}

/// Writes the SBOM into the composed tree (every run: the commit's key
/// holds its checksum, and the tree is what it describes).
fn write_sbom(
    ctx: &Context,
    fetched: &Fetched,
    kernel: &KernelOutput,
    rootfs: &RootfsOutput,
    signed: Option<&SignedImage>,
) -> Result<WrittenSbom> {
    let recipe = &ctx.recipe;
    let flavor = recipe.flavor.to_string();
    let facts = sbom::image::BuildFacts {
        name: &recipe.name,
        version: &recipe.version,
        flavor: &flavor,
        arch: recipe.arch,
        kernel_release: &kernel.release,
        kernel_source_sha256: &fetched.sha256,
        kernel_source_origin: &fetched.origin,
        kernel_debian_source: fetched.debian_source.as_ref(),
        bzimage_sha256: shipped_image_sha256(kernel, signed),
        config_sha256: &kernel.config_sha256,
        overlays: overlay_hashes(ctx)?,
        epoch: recipe.source_date_epoch(),
    };
    let written = sbom::image::write_into_tree(&rootfs.tree, &facts).context("making the SBOM")?;
    ctx.ui.note(written.describe(sbom::PATH_IN_TREE));
    Ok(written)
}

fn stage_commit(
    ctx: &Context,
    report: &mut PipelineReport,
    fetched: &Fetched,
    kernel: &KernelOutput,
    rootfs: &RootfsOutput,
    verified: &VerifyOutput,
) -> Result<CommitOutput> {
    let recipe = &ctx.recipe;
    let rootfs_key = report.stages.last().map(|s| s.key.clone()).unwrap_or_default();
    let sbom = write_sbom(ctx, fetched, kernel, rootfs, verified.signed.as_ref())?;
    let facts = CommitFacts {
        name: &recipe.name,
        version: &recipe.version,
        flavor: recipe.flavor,
        arch: recipe.arch,
        kernel_release: &kernel.release,
        kernel_config_sha256: &kernel.config_sha256,
        kargs: &recipe.kernel.cmdline,
        recipe_sha256: &recipe.sha256,
        evidence: &verified.evidence,
        health: &recipe.health,
        sbom_sha256: Some(&sbom.sha256),
        secure_boot: verified
            .signed
            .as_ref()
            .zip(ctx.signing.as_ref())
            .map(|(image, key)| (image.sha256.as_str(), &key.cert)),
    };
    let mut metadata = commit::metadata(&facts)?;
    let insecure = insecure_artifacts(ctx, kernel);
    if !insecure.is_empty() {
        ctx.ui.warn(format!(
            "the commit records {} = true: {} came from unverified cache remote entries",
            commit::key::CACHE_INSECURE,
            insecure.join(", ")
        ));
    }
    commit::mark_insecure_cache(&mut metadata, &insecure);
    let programs = commit::check_programs_machine(&rootfs.tree, recipe.arch)?;
    ctx.ui.note(format!(
        "{programs} programs under /usr checked: none is for another machine than {}",
        recipe.arch.machine()
    ));
    let started = std::time::Instant::now();
    let sealed = commit::seal_tree(&rootfs.tree, &mut metadata)?;
    ctx.ui.note(format!(
        "fs-verity manifest: {sealed} files under /usr, at /{} ({:.1} s)",
        emberrtos_contract::verity::MANIFEST_PATH,
        started.elapsed().as_secs_f64()
    ));
    let repo = repo_path(ctx);
    // The parent (the ref's target) is not part of the key: tagging this
    // commit moves the ref to it, and the rerun must still be a cache hit.
    let key = Key::new()
        .with("rootfs", rootfs_key)
        .with_value("metadata", &metadata)
        .with("repo", repo.display().to_string())
        .with("timestamp", recipe.source_date_epoch().to_string());
    let present = |out: &CommitOutput| {
        ostree::open(&out.repo).is_ok_and(|r| ostree::resolve(&r, &out.checksum).is_ok_and(|c| c.is_some()))
    };
    ctx.run(report, Stage::Commit)?.cached(&key, present, |_| {
        let subject = format!("{} {} ({})", recipe.name, recipe.version, recipe.flavor);
        let build_repo = rootfs::base_commit::build_repo_path(&ctx.work_dir);
        let mut out = commit::commit_with(
            &repo,
            build_repo.as_deref().filter(|p| p.join("config").is_file()),
            &recipe.ostree.ref_name,
            &rootfs.tree,
            &metadata,
            &subject,
            recipe.source_date_epoch(),
        )?;
        out.sbom = Some(sbom.clone());
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

/// The commit's artifacts (`<area>/<key>`) that came from cache remote
/// entries nothing authenticated: the kernel, and a Debian rootfs base.
fn insecure_artifacts(ctx: &Context, kernel: &KernelOutput) -> Vec<String> {
    let mut artifacts = vec![(remote::KERNELS, kernel.key.clone())];
    if let BaseFor::Debian(debian) = BaseFor::of(&ctx.recipe.rootfs.base, ctx.recipe.arch) {
        artifacts.push((remote::ROOTFS_BASE, debian.key()));
    }
    insecure_of(ctx, artifacts)
}

/// Those of `artifacts` the local cache took from unverified entries.
fn insecure_of(ctx: &Context, artifacts: Vec<(&str, String)>) -> Vec<String> {
    artifacts
        .into_iter()
        .filter(|(area, key)| remote::insecure_origin(&ctx.cache, area, key).is_some())
        .map(|(area, key)| format!("{area}/{key}"))
        .collect()
}

fn stage_tag(
    ctx: &Context,
    report: &mut PipelineReport,
    committed: &CommitOutput,
    required: &[&str],
    boot: Option<(&Evidence, &str)>,
    live_insecure: &[String],
) -> Result<TagOutput> {
    let recipe = &ctx.recipe;
    let started = Instant::now();
    ctx.ui.step(
        "tag",
        format!("gate for {} ({} flavor)", recipe.ostree.ref_name, recipe.flavor),
    );
    let rt = tag::gate_flavor(recipe.flavor, &recipe.ostree.ref_name) == Flavor::Rt;
    if rt && !live_insecure.is_empty() {
        let refused = tag::insecure_refusal(live_insecure);
        return Err(anyhow::Error::from(refused).context("stage `tag` failed"));
    }
    let out = tag::tag_with_live_iso(
        &TagRequest {
            repo: &committed.repo,
            ref_name: &recipe.ostree.ref_name,
            commit: &committed.checksum,
            flavor: recipe.flavor,
            required,
            boot_evidence: boot.map(|(evidence, _)| evidence),
            gpg_key: recipe.ostree.gpg_key.as_deref(),
            gpg_homedir: recipe.ostree.gpg_homedir.as_deref(),
        },
        boot.map(|(_, iso)| iso),
    )
    .context("stage `tag` failed")?;
    ctx.ui.note(format!(
        "{} -> {}{}",
        out.ref_name,
        out.commit,
        if out.signed { " (GPG signed)" } else { "" }
    ));
    let outcome = if out.previous.as_deref() == Some(out.commit.as_str()) {
        Outcome::Cached
    } else {
        Outcome::Ran
    };
    record(
        &mut report.stages,
        Stage::Tag,
        outcome,
        out.commit.clone(),
        started,
        &out,
    )?;
    Ok(out)
}

/// Where the disk images go: `<work>/<name>-<flavor>.<img|qcow2>`.
pub fn disk_paths(
    ctx: &Context,
    formats: &[crate::recipe::DiskFormat],
) -> Vec<(crate::recipe::DiskFormat, PathBuf)> {
    let recipe = &ctx.recipe;
    formats
        .iter()
        .map(|format| {
            let name = format!("{}-{}.{}", recipe.name, recipe.flavor, format.extension());
            (*format, ctx.work_dir.join(name))
        })
        .collect()
}

/// The refs the disk embeds and their commits, each through the gate:
/// every `disk.embed` (missing is an error), and each `disk.embed-if-present`
/// the repo has (one it lacks is named and left out).
fn embedded_commits(
    ctx: &Context,
    repo: &::ostree::Repo,
    repo_dir: &Path,
    settings: &crate::recipe::Disk,
) -> Result<Vec<(String, String)>> {
    let mut embedded = Vec::new();
    let required = settings.embed.iter().map(|r| (r, true));
    let optional = settings.embed_if_present.iter().map(|r| (r, false));
    for (ref_name, required) in required.chain(optional) {
        let Some(commit) = ostree::resolve(repo, ref_name)? else {
            if required {
                bail!("disk.embed: {} has no ref {ref_name}", repo_dir.display());
            }
            ctx.ui.step(
                "disk",
                format!(
                    "{} has no ref {ref_name} (disk.embed-if-present), not embedded; \
                     a recipe that builds it into the same work dir puts it on the next disk",
                    repo_dir.display()
                ),
            );
            continue;
        };
        crate::stages::verify::gate_commit_as(repo, ref_name, &commit, "disk", "it does not go on a disk")?;
        embedded.push((ref_name.clone(), commit));
    }
    Ok(embedded)
}

/// The disk stage, when the recipe has a `disk` section. Its gate runs
/// every time, before the cache is asked: a stamp is not evidence.
fn stage_disk(ctx: &Context, report: &mut PipelineReport, tagged: &TagOutput) -> Result<Option<DiskOutput>> {
    let recipe = &ctx.recipe;
    let Some(settings) = &recipe.disk else {
        ctx.ui.step("disk", "the recipe has no `disk` section, skipped");
        return Ok(None);
    };
    let repo = ostree::open(&tagged.repo)?;
    let embedded = embedded_commits(ctx, &repo, &tagged.repo, settings)?;
    let embed: Vec<String> = embedded.iter().map(|(ref_name, _)| ref_name.clone()).collect();
    crate::stages::verify::gate_commit_as(
        &repo,
        &tagged.ref_name,
        &tagged.commit,
        "disk",
        "it does not go on a disk",
    )?;
    let outputs = disk_paths(ctx, &settings.formats);
    let remote_key = match &settings.remote {
        Some(remote) => format!(
            "{} key sha256:{}",
            remote.url,
            sha256_file(&remote.gpg_key, None)?
        ),
        None => "none".into(),
    };
    let key = Key::new()
        .with("ref", &tagged.ref_name)
        .with("commit", &tagged.commit)
        .with_value("embed", &embedded)
        .with(
            "size",
            settings.size.map_or("from the tree".into(), |s| s.to_string()),
        )
        .with_value("outputs", &outputs)
        .with("remote", remote_key)
        .with("epoch", recipe.source_date_epoch().to_string())
        .with("format", disk::DISK_FORMAT);
    let present = |out: &DiskOutput| {
        out.images
            .iter()
            .all(|i| std::fs::metadata(&i.path).is_ok_and(|m| m.len() == i.bytes))
    };
    let output = ctx.run(report, Stage::Disk)?.cached(&key, present, |_| {
        let request = DiskRequest {
            repo: &tagged.repo,
            ref_name: &tagged.ref_name,
            embed: &embed,
            outputs: &outputs,
            size: settings.size,
            remote: settings.remote.as_ref(),
            kargs: &[],
            epoch: Some(recipe.source_date_epoch()),
            names: &InputNames::RECIPE,
            signing: ctx.signing.as_ref(),
        };
        let out = disk::build(&request, &ctx.ui)?;
        if out.deployed.commit != tagged.commit {
            anyhow::bail!(
                "{} moved to {} while the disk was built from {}",
                tagged.ref_name,
                out.deployed.commit,
                tagged.commit
            );
        }
        for image in &out.images {
            ctx.ui.note(format!(
                "{} ({}): sha256 {}",
                image.path.display(),
                image.format,
                image.sha256
            ));
        }
        Ok(out)
    })?;
    Ok(Some(output))
}
