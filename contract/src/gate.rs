//! The RT gate's own look at a commit. The kernel is read out of the ostree
//! commit itself (`/usr/lib/modules/<release>/{vmlinuz,config,*.ko*}`) and
//! checked afresh: stage stamps and the commit's own metadata are claims, the
//! committed files are the facts. `tag`, `publish` and `disk` decide through here.

use std::io::Read;

use anyhow::{Context, Result};
use ostree::gio;
use ostree::gio::prelude::*;
use rtcheck::evidence::{Check, check_image, modules_check};
use rtcheck::vermagic::{Vermagic, read_vermagic};
use rtcheck::{Arch, CheckId, Evidence, RequiredFor, required_checks};

use crate::commit::{self, BOOT_EVIDENCE};
use crate::error::Refused;
use crate::flavor::{Flavor, flavor_of_ref};
use crate::ostree as ost;
use crate::secure_boot::{self, Certificate};
use crate::tree::{children, contents, entry_type};

const MODULES_DIR: &str = "usr/lib/modules";

/// What the committed tree says about its kernel, checked afresh.
#[derive(Clone, Debug)]
pub struct CommittedKernel {
    /// The commit checksum the kernel was read from.
    pub checksum: String,
    /// The directory name under `/usr/lib/modules`, equal to the image's release.
    pub release: String,
    /// The build string (UTS_VERSION) of the committed `vmlinuz`.
    pub uts_version: String,
    /// The sha256 of the committed `vmlinuz`.
    pub image_sha256: String,
    pub has_modules: bool,
    /// The artifact checks on the committed files (header, UTS_VERSION,
    /// IKCONFIG, build config, modules).
    pub evidence: Evidence,
}

impl CommittedKernel {
    /// The checks a PREEMPT_RT gate requires of this kernel's fresh evidence.
    pub fn required(&self, boot: bool) -> Vec<CheckId> {
        required_checks(RequiredFor {
            kconfig: false,
            ..RequiredFor::build(self.has_modules, boot)
        })
    }
}

fn refused(summary: impl Into<String>, reasons: Vec<String>) -> anyhow::Error {
    Refused {
        stage: "commit-kernel".into(),
        summary: summary.into(),
        reasons,
    }
    .into()
}

/// The bytes of a regular file in the commit; `None` when absent. A symlink
/// or anything else in its place is a refusal: the gate reads no link.
fn regular_file(dir: &gio::File, name: &str) -> Result<Option<Vec<u8>>> {
    let file = dir.child(name);
    match entry_type(&file)? {
        None => return Ok(None),
        Some(gio::FileType::Regular) => {}
        Some(other) => {
            return Err(refused(
                format!("the committed kernel's {name} is not a regular file"),
                vec![format!("{} is {other:?}", file.uri())],
            ));
        }
    }
    contents(&file).map(Some)
}

/// Where ostree also looks for a kernel (`vmlinuz-*`, `initramfs-*`). When
/// the modules directory has no initramfs and one of these has, ostree boots
/// the one here: a commit may hold no kernel in them, or the gate would check
/// one kernel while devices boot another.
const LEGACY_KERNEL_DIRS: &[&str] = &["usr/lib/ostree-boot", "boot"];

/// Refuses a commit with a kernel or initramfs where ostree's legacy lookup finds one.
fn refuse_legacy_kernels(root: &gio::File) -> Result<()> {
    let mut found = Vec::new();
    for dir in LEGACY_KERNEL_DIRS {
        let dir_file = root.resolve_relative_path(dir);
        if entry_type(&dir_file)? != Some(gio::FileType::Directory) {
            continue;
        }
        for (name, _) in children(&dir_file)? {
            if name.starts_with("vmlinuz") || name.starts_with("initramfs") {
                found.push(format!("/{dir}/{name}"));
            }
        }
    }
    if found.is_empty() {
        Ok(())
    } else {
        Err(refused(
            "the commit holds a kernel where ostree's legacy lookup would boot it instead of /usr/lib/modules/<release>/vmlinuz",
            found,
        ))
    }
}

/// The one kernel directory `/usr/lib/modules/<release>` holding a
/// `vmlinuz` and the `initramfs.img` that makes ostree boot it.
fn kernel_dir(root: &gio::File) -> Result<(String, gio::File)> {
    refuse_legacy_kernels(root)?;
    let modules = root.resolve_relative_path(MODULES_DIR);
    if entry_type(&modules)? != Some(gio::FileType::Directory) {
        return Err(refused(
            format!("the commit has no /{MODULES_DIR} directory, so no kernel to check"),
            vec![],
        ));
    }
    let mut kernels = Vec::new();
    for (name, kind) in children(&modules)? {
        let dir = modules.child(&name);
        if kind == gio::FileType::Directory && entry_type(&dir.child("vmlinuz"))?.is_some() {
            kernels.push((name, dir));
        }
    }
    match kernels.len() {
        1 if entry_type(&kernels[0].1.child("initramfs.img"))? != Some(gio::FileType::Regular) => {
            Err(refused(
                format!(
                    "/{MODULES_DIR}/{}/initramfs.img is missing: ostree would look for the kernel elsewhere",
                    kernels[0].0
                ),
                vec![],
            ))
        }
        1 => Ok(kernels.remove(0)),
        0 => Err(refused(
            format!("the commit has no /{MODULES_DIR}/<release>/vmlinuz"),
            vec![],
        )),
        n => Err(refused(
            format!("the commit carries {n} kernels; which one boots is not decided here"),
            kernels.iter().map(|(name, _)| name.clone()).collect(),
        )),
    }
}

/// The vermagic of every module under `dir` in the commit, by relative path.
fn module_vermagics(
    dir: &gio::File,
    prefix: &str,
    out: &mut Vec<(String, Result<Vermagic, String>)>,
) -> Result<()> {
    for (name, kind) in children(dir)? {
        let path = format!("{prefix}{name}");
        match kind {
            gio::FileType::Directory => module_vermagics(&dir.child(&name), &format!("{path}/"), out)?,
            gio::FileType::Regular if is_module_name(&name) => {
                let raw = contents(&dir.child(&name))
                    .with_context(|| format!("reading module {path} from the commit"))?;
                let vermagic = decode_module(&name, raw)
                    .map_err(|e| format!("{e:#}"))
                    .and_then(|bytes| read_vermagic(&bytes).map_err(|e| e.to_string()));
                out.push((path, vermagic));
            }
            _ => {}
        }
    }
    Ok(())
}

/// Reads the kernel out of commit `rev` (a checksum or ref) and runs every
/// artifact check on it. Refuses (exit 3) a commit whose kernel cannot be
/// found unambiguously or whose version string does not parse.
pub fn verify_committed_kernel(repo: &ostree::Repo, rev: &str) -> Result<CommittedKernel> {
    let (root, checksum) = repo
        .read_commit(rev, gio::Cancellable::NONE)
        .with_context(|| format!("reading commit {rev}"))?;
    let checksum = checksum.to_string();
    let (release, dir) = kernel_dir(&root).with_context(|| format!("commit {checksum}"))?;
    let image = regular_file(&dir, "vmlinuz")?.context("vmlinuz vanished while reading the commit")?;
    let config = regular_file(&dir, "config")?
        .map(|bytes| String::from_utf8(bytes).context("the committed kernel config is not UTF-8"))
        .transpose()?;
    let mut evidence = check_image(&image, config.as_deref());
    match commit::arch_of(&ost::read_commit(repo, &checksum)?) {
        Ok(arch) => evidence.expect_arch(arch),
        Err(e) => evidence.record(Check::fail(CheckId::Header.as_str(), format!("{e:#}"))),
    }
    let mut modules = Vec::new();
    module_vermagics(&dir, "", &mut modules)?;
    let has_modules = !modules.is_empty();
    if has_modules {
        evidence.record(modules_check(evidence.release.as_deref(), &modules));
    }
    if let Some(image_release) = evidence.release.clone()
        && image_release != release
    {
        evidence.record(Check::fail(
            CheckId::Header.as_str(),
            format!("vmlinuz is release {image_release} but lies in /{MODULES_DIR}/{release}"),
        ));
    }
    let uts_version = evidence.uts_version.clone().unwrap_or_default();
    Ok(CommittedKernel {
        checksum,
        release,
        uts_version,
        image_sha256: crate::io::sha256_hex(&image),
        has_modules,
        evidence,
    })
}

/// Reasons why `boot` was not taken on `kernel` (empty when it was): the
/// booted release and build string must be the committed kernel's, and the
/// evidence must name the live ISO it booted from — `expected_iso` when given.
pub fn boot_binding_problems(
    kernel: &CommittedKernel,
    boot: &Evidence,
    expected_iso: Option<&str>,
) -> Vec<String> {
    let mut problems = Vec::new();
    if boot.release.as_deref() != Some(kernel.release.as_str()) {
        problems.push(format!(
            "boot evidence is from release {:?}, the commit carries {}",
            boot.release.as_deref().unwrap_or("?"),
            kernel.release
        ));
    }
    if boot.uts_version.as_deref() != Some(kernel.uts_version.as_str()) {
        problems.push(format!(
            "boot evidence is from build {:?}, the committed vmlinuz is {:?}",
            boot.uts_version.as_deref().unwrap_or("?"),
            kernel.uts_version
        ));
    }
    match (boot.medium_sha256.as_deref(), expected_iso) {
        (None, _) => problems.push("boot evidence does not name the live ISO it booted from".into()),
        (Some(booted), Some(expected)) if booted != expected => problems.push(format!(
            "boot evidence is from ISO sha256 {booted}, the live ISO of this build is {expected}"
        )),
        _ => {}
    }
    problems
}

/// The gate's evidence for a commit: of what the commit recorded only the
/// kconfig stage's check (which the files cannot re-derive), the fresh
/// artifact checks, and the boot evidence. Returns the evidence and the
/// problems binding the boot evidence to the committed kernel.
pub fn combined_evidence(
    recorded: Evidence,
    kernel: &CommittedKernel,
    boot: Option<&Evidence>,
    expected_iso: Option<&str>,
) -> (Evidence, Vec<String>) {
    let mut evidence = Evidence {
        arch: kernel.evidence.arch,
        release: Some(kernel.release.clone()),
        uts_version: Some(kernel.uts_version.clone()),
        checks: recorded
            .checks
            .into_iter()
            .filter(|c| c.id == CheckId::Config.as_str())
            .collect(),
        ..Evidence::default()
    };
    for check in kernel.evidence.checks.iter().cloned() {
        evidence.record(check);
    }
    let mut problems = Vec::new();
    if let Some(boot) = boot {
        problems = boot_binding_problems(kernel, boot, expected_iso);
        evidence.medium_sha256 = boot.medium_sha256.clone();
        for check in boot.checks.iter().filter(|c| c.id.starts_with("boot.")).cloned() {
            evidence.record(check);
        }
    }
    (evidence, problems)
}

/// Whether `checksum` may be served on `ref_name` (used by `publish`): on an
/// rt ref (or for a commit that claims rt on any ref) the commit must not claim another flavor, its committed kernel must
/// pass every artifact check afresh, and the boot evidence recorded at tag
/// time must pass and belong to that kernel.
pub fn gate_commit_for_ref(repo: &ostree::Repo, ref_name: &str, checksum: &str) -> Result<()> {
    gate_commit_as(repo, ref_name, checksum, "publish", "not published")
}

/// [`gate_commit_for_ref`] for another gate (`disk`): a refusal names
/// `stage` and says what did not happen (`consequence`).
pub fn gate_commit_as(
    repo: &ostree::Repo,
    ref_name: &str,
    checksum: &str,
    stage: &str,
    consequence: &str,
) -> Result<()> {
    let info = ost::read_commit(repo, checksum)?;
    let claimed = info.metadata.get(commit::key::FLAVOR).and_then(|v| v.as_str());
    // A standard ref needs no proof, unless its commit claims rt: a badge is
    // only ever served with the evidence behind it.
    if flavor_of_ref(ref_name) == Flavor::Standard && claimed != Some("rt") {
        return Ok(());
    }
    let refuse = |reasons: Vec<String>| -> anyhow::Error {
        Refused {
            stage: stage.into(),
            summary: format!(
                "{ref_name} is an rt ref and commit {checksum} is not a proven PREEMPT_RT build; {consequence}"
            ),
            reasons,
        }
        .into()
    };
    if claimed != Some("rt") {
        return Err(refuse(vec![format!(
            "the commit says {}={:?}, but the ref's policy flavor is rt",
            commit::key::FLAVOR,
            claimed.unwrap_or("<none>")
        )]));
    }
    let recorded = commit::evidence_of(&info).unwrap_or_default();
    let boot: Option<Evidence> = info
        .detached_metadata
        .get(BOOT_EVIDENCE)
        .and_then(|v| v.as_str())
        .map(serde_json::from_str)
        .transpose()
        .map_err(|e| refuse(vec![format!("{BOOT_EVIDENCE} does not parse: {e}")]))?;
    let kernel = verify_committed_kernel(repo, checksum)?;
    let (evidence, mut problems) = combined_evidence(recorded, &kernel, boot.as_ref(), None);
    if let Err(refused) = gate(stage, &evidence, &kernel.required(true)) {
        problems.extend(refused.reasons);
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(refuse(problems))
    }
}

/// Refuses (exit 3, naming `stage` and what did not happen) a commit that is
/// not for the machine this runs on: its `imgbuild.arch` and its kernel's
/// header must both name it. Every commit a device deploys passes here,
/// whatever its flavor.
pub fn gate_machine(repo: &ostree::Repo, checksum: &str, stage: &str, consequence: &str) -> Result<()> {
    let Some(here) = Arch::from_machine(std::env::consts::ARCH) else {
        return Ok(());
    };
    let declared = commit::arch_of(&ost::read_commit(repo, checksum)?);
    let image = rtcheck::evidence::image_arch(&committed_image(repo, checksum)?);
    let reasons = machine_problems(here, declared, image);
    if reasons.is_empty() {
        return Ok(());
    }
    Err(Refused {
        stage: stage.into(),
        summary: format!("commit {checksum} is not for this {here} machine; {consequence}"),
        reasons,
    }
    .into())
}

/// Why a commit that declares `declared` and whose kernel's header reads as
/// `image` is not for a `here` machine (pure).
fn machine_problems(here: Arch, declared: Result<Arch>, image: Option<Arch>) -> Vec<String> {
    let mut problems = Vec::new();
    match declared {
        Ok(arch) if arch != here => problems.push(format!("the commit says {}={arch}", commit::key::ARCH)),
        Ok(_) => {}
        Err(e) => problems.push(format!("{e:#}")),
    }
    match image {
        Some(arch) if arch != here => problems.push(format!("its kernel is for {arch}")),
        Some(_) => {}
        None => problems.push("its kernel is neither an x86 bzImage nor an arm64 Image".into()),
    }
    problems
}

/// The bytes of commit `rev`'s one `vmlinuz` (found as the gate finds it).
pub fn committed_image(repo: &ostree::Repo, rev: &str) -> Result<Vec<u8>> {
    let (root, checksum) = repo
        .read_commit(rev, gio::Cancellable::NONE)
        .with_context(|| format!("reading commit {rev}"))?;
    let (_, dir) = kernel_dir(&root).with_context(|| format!("commit {checksum}"))?;
    regular_file(&dir, "vmlinuz")?.context("vmlinuz vanished while reading the commit")
}

/// Refuses (exit 3, naming `stage` and what did not happen) a commit whose
/// kernel would not boot under Secure Boot: one that records a signed
/// kernel must hold exactly that image with a signature that verifies
/// against the recorded certificate; with `expected` (the certificate the
/// firmware trusts) the kernel must verify against it. A commit with no
/// record passes when nothing is expected: it was built without a key.
pub fn gate_signed_kernel(
    repo: &ostree::Repo,
    checksum: &str,
    expected: Option<&Certificate>,
    stage: &str,
    consequence: &str,
) -> Result<()> {
    let info = ost::read_commit(repo, checksum)?;
    let refuse = |reasons: Vec<String>| -> anyhow::Error {
        Refused {
            stage: stage.into(),
            summary: format!("commit {checksum}'s kernel would not boot under Secure Boot; {consequence}"),
            reasons,
        }
        .into()
    };
    let record = secure_boot::record_of(&info).map_err(|e| refuse(vec![format!("{e:#}")]))?;
    if record.is_none() && expected.is_none() {
        return Ok(());
    }
    let image = committed_image(repo, checksum)?;
    let mut file = tempfile::NamedTempFile::new().context("a temporary file for the committed kernel")?;
    std::io::Write::write_all(&mut file, &image)?;
    let problems = secure_boot::kernel_problems(
        file.path(),
        &crate::io::sha256_hex(&image),
        record.as_ref(),
        expected,
    )?;
    if problems.is_empty() {
        Ok(())
    } else {
        Err(refuse(problems))
    }
}

/// Whether a file name is a kernel module (`.ko`, `.ko.xz`, `.ko.gz`).
pub fn is_module_name(name: &str) -> bool {
    name.ends_with(".ko") || name.ends_with(".ko.xz") || name.ends_with(".ko.gz")
}

/// A module's ELF bytes from its file bytes, decompressing `.ko.xz` and `.ko.gz`.
pub fn decode_module(name: &str, raw: Vec<u8>) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    if name.ends_with(".xz") {
        liblzma::read::XzDecoder::new(&raw[..])
            .read_to_end(&mut out)
            .with_context(|| format!("decompressing {name}"))?;
    } else if name.ends_with(".gz") {
        flate2::read::GzDecoder::new(&raw[..])
            .read_to_end(&mut out)
            .with_context(|| format!("decompressing {name}"))?;
    } else {
        out = raw;
    }
    Ok(out)
}

/// Refuses unless every check in `required` passed and none failed.
pub fn gate<I: AsRef<str>>(stage: &str, evidence: &Evidence, required: &[I]) -> Result<(), Refused> {
    if evidence.all_passed(required) {
        return Ok(());
    }
    let mut reasons: Vec<String> = evidence
        .failures()
        .map(|c| format!("{}: {}", c.id, c.detail))
        .collect();
    for id in required.iter().map(AsRef::as_ref) {
        match evidence.get(id) {
            None => reasons.push(format!("{id}: check did not run")),
            Some(c) if c.status == rtcheck::Status::Skip => {
                reasons.push(format!("{id}: skipped ({})", c.detail))
            }
            _ => {}
        }
    }
    Err(Refused {
        stage: stage.to_string(),
        summary: "the kernel is not proven PREEMPT_RT".into(),
        reasons,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kernel() -> CommittedKernel {
        let mut evidence = Evidence::default();
        evidence.record(Check::pass(CheckId::Header.as_str(), "ok"));
        evidence.record(Check::pass(CheckId::UtsVersion.as_str(), "ok"));
        CommittedKernel {
            checksum: "c".repeat(64),
            release: "6.12.0-rt".into(),
            uts_version: "#1 SMP PREEMPT_RT Sun Nov 30 00:00:00 UTC 2025".into(),
            image_sha256: "d".repeat(64),
            has_modules: false,
            evidence,
        }
    }

    fn boot(release: &str, uts: &str, iso: Option<&str>) -> Evidence {
        let mut boot = rtcheck::evidence::check_running_kernel(uts, Some("CONFIG_PREEMPT_RT=y\n"));
        boot.release = Some(release.into());
        boot.medium_sha256 = iso.map(str::to_string);
        boot
    }

    #[test]
    fn boot_evidence_must_come_from_the_committed_kernel_and_iso() {
        let k = kernel();
        let iso = "a".repeat(64);
        let same = boot(&k.release, &k.uts_version, Some(&iso));
        assert!(boot_binding_problems(&k, &same, Some(&iso)).is_empty());
        assert!(boot_binding_problems(&k, &same, None).is_empty());

        let other_build = boot(
            &k.release,
            "#2 SMP PREEMPT_RT Mon Dec 1 00:00:00 UTC 2025",
            Some(&iso),
        );
        let problems = boot_binding_problems(&k, &other_build, Some(&iso));
        assert!(problems.iter().any(|p| p.contains("from build")), "{problems:?}");

        let other_release = boot("6.12.1-rt", &k.uts_version, Some(&iso));
        assert_eq!(boot_binding_problems(&k, &other_release, Some(&iso)).len(), 1);

        let other_iso = boot_binding_problems(&k, &same, Some(&"b".repeat(64)));
        assert!(other_iso[0].contains("live ISO of this build"), "{other_iso:?}");
        let unnamed = boot(&k.release, &k.uts_version, None);
        assert!(boot_binding_problems(&k, &unnamed, None)[0].contains("does not name"));
    }

    #[test]
    fn a_commit_for_another_machine_is_refused_naming_why() {
        let none = machine_problems(Arch::X86_64, Ok(Arch::X86_64), Some(Arch::X86_64));
        assert!(none.is_empty(), "{none:?}");
        let declared = machine_problems(Arch::X86_64, Ok(Arch::Arm64), Some(Arch::X86_64));
        assert_eq!(declared, ["the commit says imgbuild.arch=arm64"]);
        // The kernel is read, not the claim.
        let kernel = machine_problems(Arch::Arm64, Ok(Arch::Arm64), Some(Arch::X86_64));
        assert_eq!(kernel, ["its kernel is for x86_64"]);
        let unknown = machine_problems(Arch::X86_64, Err(anyhow::anyhow!("bad")), None);
        assert_eq!(unknown.len(), 2, "{unknown:?}");
    }

    #[test]
    fn recorded_artifact_claims_never_override_the_files() {
        let mut k = kernel();
        k.evidence.record(Check::fail(
            CheckId::UtsVersion.as_str(),
            "not PREEMPT_RT (PREEMPT_DYNAMIC)",
        ));
        let mut recorded = Evidence::default();
        recorded.record(Check::pass(CheckId::Config.as_str(), "kconfig ok"));
        recorded.record(Check::pass(CheckId::UtsVersion.as_str(), "forged"));
        recorded.record(Check::pass(CheckId::BootUname.as_str(), "forged"));
        let (evidence, problems) = combined_evidence(recorded, &k, None, None);
        assert!(problems.is_empty());
        assert_eq!(
            evidence.get(CheckId::UtsVersion.as_str()).unwrap().status,
            rtcheck::Status::Fail
        );
        assert!(
            evidence.get(CheckId::BootUname.as_str()).is_none(),
            "{evidence:#?}"
        );
        assert_eq!(
            evidence.get(CheckId::Config.as_str()).unwrap().detail,
            "kconfig ok"
        );
        assert_eq!(evidence.uts_version.as_deref(), Some(k.uts_version.as_str()));

        // Boot evidence contributes boot checks only.
        let mut forged_boot = boot(&k.release, &k.uts_version, Some("x"));
        forged_boot.record(Check::pass(CheckId::UtsVersion.as_str(), "forged"));
        let (evidence, _) = combined_evidence(Evidence::default(), &k, Some(&forged_boot), None);
        assert_eq!(
            evidence.get(CheckId::UtsVersion.as_str()).unwrap().status,
            rtcheck::Status::Fail
        );
        assert_eq!(
            evidence.get(CheckId::BootUname.as_str()).unwrap().status,
            rtcheck::Status::Pass
        );
    }
}
