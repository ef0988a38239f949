//! The PREEMPT_RT checks, each able to fail, and the evidence they produce.
//! The builder's gate and the on-target `jitter` tool both decide through here.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::arch::Arch;
use crate::kconfig::Config;
use crate::uts::{PreemptModel, UtsError, parse_uts_version};
use crate::vermagic::Vermagic;

/// The PREEMPT_RT checks. Their text form names the `imgbuild.rt.*` commit
/// metadata keys, so it never changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum CheckId {
    /// The kconfig stage: every requested symbol holds and `CONFIG_PREEMPT_RT=y`.
    #[serde(rename = "config")]
    Config,
    #[serde(rename = "artifact.header")]
    Header,
    #[serde(rename = "artifact.uts-version")]
    UtsVersion,
    #[serde(rename = "artifact.ikconfig")]
    Ikconfig,
    #[serde(rename = "artifact.build-config")]
    BuildConfig,
    #[serde(rename = "artifact.modules")]
    Modules,
    #[serde(rename = "boot.uname")]
    BootUname,
    #[serde(rename = "boot.config")]
    BootConfig,
}

impl CheckId {
    pub const ALL: [CheckId; 8] = [
        CheckId::Config,
        CheckId::Header,
        CheckId::UtsVersion,
        CheckId::Ikconfig,
        CheckId::BuildConfig,
        CheckId::Modules,
        CheckId::BootUname,
        CheckId::BootConfig,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            CheckId::Config => "config",
            CheckId::Header => "artifact.header",
            CheckId::UtsVersion => "artifact.uts-version",
            CheckId::Ikconfig => "artifact.ikconfig",
            CheckId::BuildConfig => "artifact.build-config",
            CheckId::Modules => "artifact.modules",
            CheckId::BootUname => "boot.uname",
            CheckId::BootConfig => "boot.config",
        }
    }

    /// Checks taken on a running kernel rather than on the artifact.
    pub const fn is_boot(self) -> bool {
        matches!(self, CheckId::BootUname | CheckId::BootConfig)
    }
}

impl AsRef<str> for CheckId {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

impl fmt::Display for CheckId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a gate has to go on, which decides the checks it requires.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RequiredFor {
    /// A kernel image is at hand (its setup header and UTS_VERSION).
    pub image: bool,
    /// The kconfig stage ran (a pipeline build; not a kernel checked on its own).
    pub kconfig: bool,
    /// The `.config` the image was built from is at hand.
    pub build_config: bool,
    /// The kernel comes with modules.
    pub modules: bool,
    /// The kernel was booted.
    pub boot: bool,
}

impl RequiredFor {
    /// A pipeline build: kconfig stage and build config, modules and boot as given.
    pub const fn build(modules: bool, boot: bool) -> Self {
        RequiredFor {
            image: true,
            kconfig: true,
            build_config: true,
            modules,
            boot,
        }
    }

    /// A kernel image checked on its own (`verify-kernel`), with or without its `.config`.
    pub const fn image(build_config: bool) -> Self {
        RequiredFor {
            image: true,
            kconfig: false,
            build_config,
            modules: false,
            boot: false,
        }
    }

    /// A booted kernel only (`imgbuild boot`).
    pub const fn boot() -> Self {
        RequiredFor {
            image: false,
            kconfig: false,
            build_config: false,
            modules: false,
            boot: true,
        }
    }
}

/// The one list of checks a PREEMPT_RT gate requires to have passed.
/// (`artifact.ikconfig` is never required, since a kernel may be built without
/// it, but it must not fail.)
pub fn required_checks(for_: RequiredFor) -> Vec<CheckId> {
    let wanted = |id: CheckId| match id {
        CheckId::Config => for_.kconfig,
        CheckId::Header | CheckId::UtsVersion => for_.image,
        CheckId::Ikconfig => false,
        CheckId::BuildConfig => for_.build_config,
        CheckId::Modules => for_.modules,
        CheckId::BootUname | CheckId::BootConfig => for_.boot,
    };
    CheckId::ALL.into_iter().filter(|id| wanted(*id)).collect()
}

/// Stable identifiers of the checks as text (the [`CheckId`] names).
pub mod id {
    use super::CheckId;
    pub const CONFIG: &str = CheckId::Config.as_str();
    pub const HEADER: &str = CheckId::Header.as_str();
    pub const UTS_VERSION: &str = CheckId::UtsVersion.as_str();
    pub const IKCONFIG: &str = CheckId::Ikconfig.as_str();
    pub const BUILD_CONFIG: &str = CheckId::BuildConfig.as_str();
    pub const MODULES: &str = CheckId::Modules.as_str();
    pub const BOOT_UNAME: &str = CheckId::BootUname.as_str();
    pub const BOOT_CONFIG: &str = CheckId::BootConfig.as_str();
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Status {
    Pass,
    Fail,
    /// Not applicable to this kernel (e.g. no IKCONFIG, no modules).
    Skip,
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Status::Pass => "pass",
            Status::Fail => "FAIL",
            Status::Skip => "skip",
        })
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Check {
    pub id: String,
    pub status: Status,
    pub detail: String,
}

impl Check {
    pub fn pass(id: &str, detail: impl Into<String>) -> Self {
        Self::new(id, Status::Pass, detail)
    }
    pub fn fail(id: &str, detail: impl Into<String>) -> Self {
        Self::new(id, Status::Fail, detail)
    }
    pub fn skip(id: &str, detail: impl Into<String>) -> Self {
        Self::new(id, Status::Skip, detail)
    }
    fn new(id: &str, status: Status, detail: impl Into<String>) -> Self {
        Check {
            id: id.to_string(),
            status,
            detail: detail.into(),
        }
    }
}

impl fmt::Display for Check {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{:>4}] {}: {}", self.status, self.id, self.detail)
    }
}

/// Everything known about whether a kernel is PREEMPT_RT.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Evidence {
    /// The machine the checked image is for, read from its header.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub arch: Option<Arch>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub release: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub uts_version: Option<String>,
    /// For evidence taken on a booted kernel: the sha256 of the medium (the
    /// live ISO) it booted from, so a gate can tell which build it belongs to.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub medium_sha256: Option<String>,
    pub checks: Vec<Check>,
}

impl Evidence {
    pub fn failures(&self) -> impl Iterator<Item = &Check> {
        self.checks.iter().filter(|c| c.status == Status::Fail)
    }

    pub fn get(&self, id: &str) -> Option<&Check> {
        self.checks.iter().find(|c| c.id == id)
    }

    /// True when nothing failed and every check in `required` passed.
    pub fn all_passed<I: AsRef<str>>(&self, required: &[I]) -> bool {
        self.failures().next().is_none()
            && required
                .iter()
                .all(|id| self.get(id.as_ref()).is_some_and(|c| c.status == Status::Pass))
    }

    /// Adds or replaces checks by id, keeping the order of first appearance.
    pub fn record(&mut self, check: Check) {
        match self.checks.iter_mut().find(|c| c.id == check.id) {
            Some(existing) => *existing = check,
            None => self.checks.push(check),
        }
    }

    /// Fails the header check when the image is for another machine than
    /// `arch` (an image whose header did not read has failed it already).
    pub fn expect_arch(&mut self, arch: Arch) {
        if let Some(found) = self.arch.filter(|found| *found != arch) {
            self.record(Check::fail(
                id::HEADER,
                format!("the kernel is for {found}, but {arch} is wanted"),
            ));
        }
    }

    pub fn extend(&mut self, other: Evidence) {
        self.arch = self.arch.take().or(other.arch);
        self.release = self.release.take().or(other.release);
        self.uts_version = self.uts_version.take().or(other.uts_version);
        self.medium_sha256 = self.medium_sha256.take().or(other.medium_sha256);
        for check in other.checks {
            self.record(check);
        }
    }
}

/// The preemption model a UTS_VERSION declares, as a check with `id`.
pub fn uts_version_check(id: &str, uts_version: &str) -> Check {
    match parse_uts_version(uts_version) {
        Ok(v) if v.is_preempt_rt() => Check::pass(id, format!("PREEMPT_RT after SMP in {uts_version:?}")),
        Ok(v) => {
            let model = v
                .preempt
                .map_or("no preemption flag".to_string(), |m: PreemptModel| m.to_string());
            Check::fail(id, format!("not PREEMPT_RT ({model}) in {uts_version:?}"))
        }
        // Name the model the flag slot claims when it is not RT anyway.
        Err(
            e @ UtsError::Ambiguous {
                flagged: Some(model), ..
            },
        ) if model != PreemptModel::Rt => Check::fail(id, format!("not PREEMPT_RT ({model}); {e}")),
        Err(e) => Check::fail(id, format!("not proven PREEMPT_RT: {e}")),
    }
}

/// `CONFIG_PREEMPT_RT=y` in a config text, as a check with `id`.
pub fn config_text_check(id: &str, what: &str, text: &str) -> Check {
    match Config::parse(text) {
        Ok(config) if config.is_preempt_rt() => Check::pass(id, format!("{what} has CONFIG_PREEMPT_RT=y")),
        Ok(config) => Check::fail(
            id,
            format!(
                "{what} has {}",
                config
                    .get("CONFIG_PREEMPT_RT")
                    .map_or("no CONFIG_PREEMPT_RT".to_string(), |v| v
                        .config_line("CONFIG_PREEMPT_RT"))
            ),
        ),
        Err(e) => Check::fail(id, format!("{what} does not parse: {e}")),
    }
}

/// Checks a kernel image and, optionally, the `.config` it was built from.
/// The image is an x86 bzImage or an arm64 kernel (`Image`, `Image.gz`, an
/// EFI zboot image), told apart by their headers; [`Evidence::arch`] says
/// which, for a gate that knows which machine it is for
/// ([`Evidence::expect_arch`]).
#[cfg(feature = "image")]
pub fn check_image(image: &[u8], build_config: Option<&str>) -> Evidence {
    let mut evidence = Evidence::default();
    let kernel = match read_kernel(image) {
        Ok(kernel) => kernel,
        Err(why) => {
            evidence.record(Check::fail(id::HEADER, why));
            if let Some(text) = build_config {
                evidence.record(config_text_check(id::BUILD_CONFIG, "build .config", text));
            }
            return evidence;
        }
    };
    evidence.arch = Some(kernel.arch);
    evidence.release = Some(kernel.version.release.clone());
    evidence.uts_version = Some(kernel.version.uts_version.clone());
    evidence.record(Check::pass(id::HEADER, kernel.header.clone()));
    evidence.record(match kernel.arch {
        Arch::X86_64 => image_uts_version_check(&kernel.version, &kernel.vmlinux),
        // The banner is the version string: nothing else to tie it to.
        Arch::Arm64 => {
            let check = uts_version_check(id::UTS_VERSION, &kernel.version.uts_version);
            Check {
                detail: format!("{}, from the kernel's banner", check.detail),
                ..check
            }
        }
    });

    let promised = build_config
        .and_then(|text| Config::parse(text).ok())
        .is_some_and(|c| c.is_enabled("CONFIG_IKCONFIG"));
    let embedded = embedded_config(&kernel.vmlinux);
    evidence.record(match &embedded {
        Embedded::Found(text) => config_text_check(id::IKCONFIG, "embedded IKCONFIG", text),
        Embedded::Absent if promised => Check::fail(
            id::IKCONFIG,
            "build .config sets CONFIG_IKCONFIG but the image embeds no config",
        ),
        Embedded::Absent => Check::skip(id::IKCONFIG, "kernel built without CONFIG_IKCONFIG"),
        Embedded::Unreadable(why) if promised => Check::fail(id::IKCONFIG, why.clone()),
        // A codec we cannot read proves nothing either way.
        Embedded::Unreadable(why) => Check::skip(id::IKCONFIG, format!("{why}; embedded config not checked")),
        Embedded::Broken(why) => Check::fail(id::IKCONFIG, why.clone()),
    });
    if let Some(text) = build_config {
        let mut check = config_text_check(id::BUILD_CONFIG, "build .config", text);
        if check.status == Status::Pass
            && let Embedded::Found(embedded) = &embedded
            && Config::parse(embedded).ok() != Config::parse(text).ok()
        {
            check = Check::fail(
                id::BUILD_CONFIG,
                "build .config differs from the config embedded in the image (wrong pairing?)",
            );
        }
        evidence.record(check);
    }
    evidence
}

/// The machine a kernel image is for, from its first bytes alone (nothing
/// is decompressed); `None` when it is neither kind.
#[cfg(feature = "image")]
pub fn image_arch(image: &[u8]) -> Option<Arch> {
    if crate::arm64::looks_like(image) {
        Some(Arch::Arm64)
    } else {
        crate::bzimage::read_setup_header(image)
            .ok()
            .map(|_| Arch::X86_64)
    }
}

/// A kernel image as the checks read it.
#[cfg(feature = "image")]
struct KernelImage<'a> {
    arch: Arch,
    /// The header check's detail.
    header: String,
    version: crate::bzimage::KernelVersion,
    /// The uncompressed kernel, decompressed once for every check that reads it.
    vmlinux: Result<std::borrow::Cow<'a, [u8]>, PayloadError>,
}

/// Reads `image` as whichever kernel its header says it is, or says why it
/// is neither.
#[cfg(feature = "image")]
fn read_kernel(image: &[u8]) -> Result<KernelImage<'_>, String> {
    if crate::arm64::looks_like(image) {
        return read_arm64(image);
    }
    let header = crate::bzimage::read_setup_header(image).map_err(|e| e.to_string())?;
    Ok(KernelImage {
        arch: Arch::X86_64,
        header: format!(
            "HdrS, boot protocol {}.{:02}, version string {:?}",
            header.protocol.0, header.protocol.1, header.version.raw
        ),
        vmlinux: decompressed_payload(image, header.payload).map(std::borrow::Cow::Owned),
        version: header.version,
    })
}

/// An arm64 kernel: its `Image` header, then its one banner as the version
/// string (read as precisely as a bzImage's: one way only).
#[cfg(feature = "image")]
fn read_arm64(file: &[u8]) -> Result<KernelImage<'_>, String> {
    use crate::arm64::{read_header, unwrap};
    let (wrapping, image) = unwrap(file).map_err(|e| e.to_string())?;
    let header = read_header(&image).map_err(|e| format!("{e} (inside {wrapping})"))?;
    let version = crate::uts::banner_version(&image).map_err(|e| e.to_string())?;
    Ok(KernelImage {
        arch: Arch::Arm64,
        header: format!(
            "arm64: {wrapping}{}, {} pages, image_size {:#x}, version string {:?}",
            if header.efi_stub { " with an EFI stub" } else { "" },
            header
                .page_kib
                .map_or("unspecified".to_string(), |k| format!("{k} KiB")),
            header.image_size,
            version.raw
        ),
        version,
        vmlinux: Ok(image),
    })
}

#[cfg(feature = "image")]
enum Embedded {
    Found(String),
    Absent,
    /// The payload uses a codec this crate does not decode.
    Unreadable(String),
    Broken(String),
}

/// Why the kernel inside a bzImage could not be had.
#[cfg(feature = "image")]
enum PayloadError {
    Missing,
    /// The payload uses a codec this crate does not decode.
    Unreadable(String),
    Broken(String),
}

#[cfg(feature = "image")]
impl fmt::Display for PayloadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PayloadError::Missing => f.write_str(
                "no compressed payload in the image (payload_offset/length unset or out of bounds)",
            ),
            PayloadError::Unreadable(why) | PayloadError::Broken(why) => f.write_str(why),
        }
    }
}

/// The uncompressed kernel, decompressed once for every check that reads it.
#[cfg(feature = "image")]
fn decompressed_payload(image: &[u8], payload: Option<(usize, usize)>) -> Result<Vec<u8>, PayloadError> {
    use crate::ikconfig::{IkconfigError, decompress_payload};
    let (start, len) = payload.ok_or(PayloadError::Missing)?;
    decompress_payload(&image[start..start + len]).map_err(|e| match e {
        IkconfigError::UnsupportedCodec(_) => PayloadError::Unreadable(e.to_string()),
        e => PayloadError::Broken(e.to_string()),
    })
}

/// The setup header's UTS_VERSION must declare PREEMPT_RT, and the kernel's
/// own `linux_banner` must carry that same release and UTS_VERSION: the
/// header string alone is not tied to the code that boots.
#[cfg(feature = "image")]
fn image_uts_version_check(
    version: &crate::bzimage::KernelVersion,
    vmlinux: &Result<std::borrow::Cow<'_, [u8]>, PayloadError>,
) -> Check {
    use crate::uts::matching_banner;
    let check = uts_version_check(id::UTS_VERSION, &version.uts_version);
    if check.status != Status::Pass {
        return check;
    }
    let unproven = |why: String| {
        Check::fail(
            id::UTS_VERSION,
            format!(
                "setup header says {:?} but the kernel does not confirm it: {why}",
                version.raw
            ),
        )
    };
    match vmlinux {
        Err(e) => unproven(format!("cannot read the kernel's banner: {e}")),
        Ok(vmlinux) => match matching_banner(vmlinux, &version.release, &version.uts_version) {
            Ok(_) => Check::pass(
                id::UTS_VERSION,
                format!(
                    "{}; the kernel's banner has the same release and UTS_VERSION",
                    check.detail
                ),
            ),
            Err(e) => unproven(e.to_string()),
        },
    }
}

#[cfg(feature = "image")]
fn embedded_config(vmlinux: &Result<std::borrow::Cow<'_, [u8]>, PayloadError>) -> Embedded {
    use crate::ikconfig::extract_from_vmlinux;
    match vmlinux {
        Err(e @ PayloadError::Unreadable(_)) => Embedded::Unreadable(e.to_string()),
        Err(e) => Embedded::Broken(e.to_string()),
        Ok(vmlinux) => match extract_from_vmlinux(vmlinux) {
            Ok(Some(text)) => Embedded::Found(text),
            Ok(None) => Embedded::Absent,
            Err(e) => Embedded::Broken(e.to_string()),
        },
    }
}

/// Checks the vermagic of every module against the image's release.
pub fn modules_check(release: Option<&str>, modules: &[(String, Result<Vermagic, String>)]) -> Check {
    if modules.is_empty() {
        return Check::skip(id::MODULES, "no modules built");
    }
    let mut problems = Vec::new();
    for (name, vermagic) in modules {
        match vermagic {
            Err(e) => problems.push(format!("{name}: {e}")),
            Ok(v) if !v.is_preempt_rt() => {
                problems.push(format!("{name}: vermagic {:?} lacks preempt_rt", v.raw))
            }
            Ok(v) if release.is_some_and(|r| r != v.release) => problems.push(format!(
                "{name}: built for {} but the image is {}",
                v.release,
                release.unwrap_or_default()
            )),
            Ok(_) => {}
        }
    }
    if problems.is_empty() {
        Check::pass(
            id::MODULES,
            format!("{} modules with preempt_rt vermagic", modules.len()),
        )
    } else {
        let shown: Vec<_> = problems.iter().take(5).cloned().collect();
        Check::fail(
            id::MODULES,
            format!(
                "{} of {} modules: {}",
                problems.len(),
                modules.len(),
                shown.join("; ")
            ),
        )
    }
}

/// Checks a running (or booted) kernel from `uname -v` and the text of
/// `/proc/config.gz`, when the kernel exposes it.
pub fn check_running_kernel(uname_v: &str, proc_config: Option<&str>) -> Evidence {
    let mut evidence = Evidence {
        uts_version: Some(uname_v.trim().to_string()),
        ..Evidence::default()
    };
    evidence.record(uts_version_check(id::BOOT_UNAME, uname_v));
    evidence.record(match proc_config {
        Some(text) => config_text_check(id::BOOT_CONFIG, "/proc/config.gz", text),
        None => Check::skip(
            id::BOOT_CONFIG,
            "/proc/config.gz not available (CONFIG_IKCONFIG_PROC off)",
        ),
    });
    evidence
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn running_kernel_rt_and_generic() {
        let rt = check_running_kernel("#1 SMP PREEMPT_RT Mon", Some("CONFIG_PREEMPT_RT=y\n"));
        assert!(rt.all_passed(&[id::BOOT_UNAME, id::BOOT_CONFIG]));
        let generic = check_running_kernel(
            "#1 SMP PREEMPT_DYNAMIC Mon",
            Some("# CONFIG_PREEMPT_RT is not set\n"),
        );
        assert_eq!(generic.failures().count(), 2);
        let spoofed = check_running_kernel("#1 SMP PREEMPT_DYNAMIC PREEMPT_RT", None);
        assert_eq!(spoofed.get(id::BOOT_UNAME).unwrap().status, Status::Fail);
        assert_eq!(spoofed.get(id::BOOT_CONFIG).unwrap().status, Status::Skip);
        assert!(!spoofed.all_passed(&[id::BOOT_UNAME]));
    }

    #[test]
    fn check_ids_keep_their_metadata_names() {
        for id in CheckId::ALL {
            let json = serde_json::to_string(&id).unwrap();
            assert_eq!(json, format!("\"{}\"", id.as_str()));
            assert_eq!(serde_json::from_str::<CheckId>(&json).unwrap(), id);
        }
        assert_eq!(id::UTS_VERSION, "artifact.uts-version");
        assert_eq!(id::BOOT_CONFIG, "boot.config");
    }

    #[test]
    fn one_list_of_required_checks() {
        use CheckId::*;
        assert_eq!(
            required_checks(RequiredFor::build(false, false)),
            [Config, Header, UtsVersion, BuildConfig]
        );
        assert_eq!(
            required_checks(RequiredFor::build(true, true)),
            [
                Config,
                Header,
                UtsVersion,
                BuildConfig,
                Modules,
                BootUname,
                BootConfig
            ]
        );
        // `verify-kernel` on an image alone, or with its .config.
        assert_eq!(required_checks(RequiredFor::image(false)), [Header, UtsVersion]);
        assert_eq!(
            required_checks(RequiredFor::image(true)),
            [Header, UtsVersion, BuildConfig]
        );
        // `imgbuild boot`.
        assert_eq!(required_checks(RequiredFor::boot()), [BootUname, BootConfig]);
        assert!(required_checks(RequiredFor::default()).is_empty());
    }

    #[test]
    fn spoofed_version_strings_fail_the_checks() {
        for spoof in [
            "#1 SMP PREEMPT_RT x SMP PREEMPT_DYNAMIC Thu Nov 27 2026",
            "#1 SMP PREEMPT_RT (x) #1 SMP PREEMPT_DYNAMIC Debian 6.1.192-3 (2026-11-26)",
        ] {
            let booted = check_running_kernel(spoof, None);
            assert_eq!(
                booted.get(id::BOOT_UNAME).unwrap().status,
                Status::Fail,
                "{spoof}"
            );
            assert_eq!(
                uts_version_check(id::UTS_VERSION, spoof).status,
                Status::Fail,
                "{spoof}"
            );
        }
        // A generic kernel's timestamp imitating the token still names its own model.
        let spoof = uts_version_check(
            id::UTS_VERSION,
            "#1 SMP PREEMPT_DYNAMIC Mon Nov 30 PREEMPT_RT 2026",
        );
        assert!(
            spoof.detail.starts_with("not PREEMPT_RT (PREEMPT_DYNAMIC)"),
            "{}",
            spoof.detail
        );
        let genuine = check_running_kernel(
            "#1 SMP PREEMPT_RT Debian 6.1.192-3 (2026-11-26)",
            Some("CONFIG_PREEMPT_RT=y\n"),
        );
        assert!(genuine.all_passed(&[CheckId::BootUname, CheckId::BootConfig]));
    }

    #[test]
    fn all_passed_needs_required_checks_present() {
        let mut e = Evidence::default();
        e.record(Check::pass(id::CONFIG, "ok"));
        assert!(e.all_passed(&[id::CONFIG]));
        assert!(!e.all_passed(&[id::CONFIG, id::BOOT_UNAME]));
        e.record(Check::skip(id::BOOT_UNAME, "n/a"));
        assert!(!e.all_passed(&[id::BOOT_UNAME]));
        e.record(Check::fail(id::CONFIG, "dropped"));
        assert_eq!(e.checks.len(), 2);
        assert!(!e.all_passed::<CheckId>(&[]));
    }

    #[test]
    fn modules_check_reports_each_problem() {
        let rt = |r: &str| {
            Ok(Vermagic {
                raw: format!("{r} SMP preempt_rt mod_unload"),
                release: r.into(),
            })
        };
        let generic = Ok(Vermagic {
            raw: "6.12 SMP mod_unload".into(),
            release: "6.12".into(),
        });
        let ok = modules_check(Some("6.12"), &[("a.ko".into(), rt("6.12"))]);
        assert_eq!(ok.status, Status::Pass);
        let bad = modules_check(
            Some("6.12"),
            &[
                ("a.ko".into(), rt("6.11")),
                ("b.ko".into(), generic),
                ("c.ko".into(), Err("not ELF".into())),
            ],
        );
        assert_eq!(bad.status, Status::Fail);
        assert!(bad.detail.starts_with("3 of 3"), "{}", bad.detail);
        assert_eq!(modules_check(None, &[]).status, Status::Skip);
    }

    #[cfg(feature = "image")]
    use crate::bzimage::synthetic::gzip;

    #[cfg(feature = "image")]
    fn image_with_ikconfig(version: &str, config: &str) -> Vec<u8> {
        crate::bzimage::synthetic::kernel(version, Some(config))
    }

    #[cfg(feature = "image")]
    #[test]
    fn image_checks_on_synthetic_images() {
        use crate::bzimage::synthetic::{
            self, image as synthetic_image, image_with_payload as synthetic_image_with_payload,
        };
        let rt_config = "CONFIG_PREEMPT_RT=y\nCONFIG_IKCONFIG=y\n";
        let rt = check_image(
            &image_with_ikconfig("6.12 (a@b) #1 SMP PREEMPT_RT x", rt_config),
            Some(rt_config),
        );
        assert!(
            rt.all_passed(&[id::HEADER, id::UTS_VERSION, id::IKCONFIG, id::BUILD_CONFIG]),
            "{rt:#?}"
        );
        assert_eq!(rt.release.as_deref(), Some("6.12"));

        // The embedded config is the truth: a different .config is a mix-up.
        let mismatch = check_image(
            &image_with_ikconfig("6.12 (a@b) #1 SMP PREEMPT_RT x", rt_config),
            Some("CONFIG_PREEMPT_RT=y\n"),
        );
        assert_eq!(mismatch.get(id::BUILD_CONFIG).unwrap().status, Status::Fail);

        // An RT-looking version string whose embedded config is not RT.
        let lying = check_image(
            &image_with_ikconfig(
                "6.12 (a@b) #1 SMP PREEMPT_RT x",
                "# CONFIG_PREEMPT_RT is not set\n",
            ),
            None,
        );
        assert_eq!(lying.get(id::IKCONFIG).unwrap().status, Status::Fail);

        let rt_version = "6.12 (a@b) #1 SMP PREEMPT_RT x";
        let no_ikconfig = check_image(
            &synthetic_image_with_payload(rt_version, &gzip(&synthetic::vmlinux(rt_version, None))),
            None,
        );
        assert_eq!(no_ikconfig.get(id::IKCONFIG).unwrap().status, Status::Skip);
        assert!(no_ikconfig.all_passed(&[id::HEADER, id::UTS_VERSION]));
        // ... unless the build config says it should be there.
        let missing = check_image(
            &synthetic_image_with_payload("6.12 (a@b) #1 SMP PREEMPT_RT x", &gzip(b"vmlinux")),
            Some(rt_config),
        );
        assert_eq!(missing.get(id::IKCONFIG).unwrap().status, Status::Fail);

        let no_payload = check_image(&synthetic_image("6.12 (a@b) #1 SMP PREEMPT_RT x", 30), None);
        assert_eq!(no_payload.get(id::IKCONFIG).unwrap().status, Status::Fail);

        let spoof = check_image(
            &synthetic_image("6.12 (a@b) #1 SMP Mon PREEMPT_RT 2026", 30),
            None,
        );
        assert_eq!(spoof.get(id::UTS_VERSION).unwrap().status, Status::Fail);
        for spoof in [
            "6.1.0-57-cloud-amd64 (k@h) #1 SMP PREEMPT_RT (x) #1 SMP PREEMPT_DYNAMIC Debian 6.1.192-3 (2026-11-26)",
            "6.1.0-57-cloud-amd64 (k@h) #1 SMP PREEMPT_RT x SMP PREEMPT_DYNAMIC Debian 6.1.192-3 (2026-11-26)",
        ] {
            let refused = check_image(&synthetic_image(spoof, 30), None);
            assert!(
                !refused.all_passed(&[CheckId::Header, CheckId::UtsVersion]),
                "{spoof}"
            );
        }

        let garbage = check_image(b"garbage", Some("# CONFIG_PREEMPT_RT is not set\n"));
        assert_eq!(garbage.get(id::HEADER).unwrap().status, Status::Fail);
        assert_eq!(garbage.get(id::BUILD_CONFIG).unwrap().status, Status::Fail);
    }

    #[cfg(feature = "image")]
    #[test]
    fn arm64_images_are_read_plain_gzipped_and_zboot() {
        use crate::arm64::synthetic::{image, zboot};
        let version = "6.12.58 (ci@builder) #1 SMP PREEMPT_RT Sat Nov 29 00:00:00 UTC 2025";
        let config = "CONFIG_PREEMPT_RT=y\nCONFIG_IKCONFIG=y\n";
        let plain = image(version, Some(config));
        for (what, file) in [
            ("plain", plain.clone()),
            ("gzip", gzip(&plain)),
            ("zboot", zboot(&plain)),
        ] {
            let evidence = check_image(&file, Some(config));
            assert!(
                evidence.all_passed(&[id::HEADER, id::UTS_VERSION, id::IKCONFIG, id::BUILD_CONFIG]),
                "{what}: {evidence:#?}"
            );
            assert_eq!(evidence.arch, Some(Arch::Arm64), "{what}");
            assert_eq!(evidence.release.as_deref(), Some("6.12.58"), "{what}");
            assert_eq!(
                evidence.uts_version.as_deref(),
                Some("#1 SMP PREEMPT_RT Sat Nov 29 00:00:00 UTC 2025")
            );
            assert!(
                evidence.get(id::HEADER).unwrap().detail.starts_with("arm64: "),
                "{what}"
            );
        }
        let mut wanted_x86 = check_image(&plain, None);
        wanted_x86.expect_arch(Arch::X86_64);
        let header = wanted_x86.get(id::HEADER).unwrap();
        assert_eq!(header.status, Status::Fail);
        assert!(
            header
                .detail
                .contains("the kernel is for arm64, but x86_64 is wanted"),
            "{header}"
        );
        let mut bz = check_image(
            &image_with_ikconfig("6.12 (a@b) #1 SMP PREEMPT_RT x", config),
            None,
        );
        assert_eq!(bz.arch, Some(Arch::X86_64));
        bz.expect_arch(Arch::X86_64);
        assert_eq!(bz.get(id::HEADER).unwrap().status, Status::Pass);
    }

    #[cfg(feature = "image")]
    #[test]
    fn an_arm64_version_string_is_read_one_way_only() {
        use crate::arm64::synthetic::image;
        use crate::bzimage::synthetic::banner;
        let generic = "6.1.0-57-arm64 (k@h) #1 SMP PREEMPT_DYNAMIC Debian 6.1.192-3 (2026-11-26)";
        let check = check_image(&image(generic, None), None);
        assert_eq!(
            check.get(id::UTS_VERSION).unwrap().status,
            Status::Fail,
            "{check:#?}"
        );
        assert!(
            check
                .get(id::UTS_VERSION)
                .unwrap()
                .detail
                .contains("PREEMPT_DYNAMIC")
        );
        // Two banners, or a builder that hides a second UTS_VERSION, are refused at the header.
        let mut two = image(generic, None);
        two.extend(banner(
            "6.1.0-57-arm64 (k@h) #1 SMP PREEMPT_RT Debian 6.1.192-3 (2026-11-26)",
        ));
        let header = check_image(&two, None).get(id::HEADER).unwrap().clone();
        assert_eq!(header.status, Status::Fail);
        assert!(header.detail.contains("2 different banners"), "{header}");
        for spoof in [
            "6.1.0 (k@h) #1 SMP PREEMPT_RT x) (cc) #1 SMP PREEMPT_DYNAMIC y",
            "6.1.0 (k@h SMP PREEMPT_RT) #1 SMP PREEMPT_DYNAMIC y",
        ] {
            let mut file = image("6.1.0 (k@h) #1 SMP x", None);
            let at = file.len() - banner("6.1.0 (k@h) #1 SMP x").len();
            file.truncate(at);
            file.extend(format!("Linux version {spoof}\n\0").into_bytes());
            let evidence = check_image(&file, None);
            assert!(
                !evidence.all_passed(&[CheckId::Header, CheckId::UtsVersion]),
                "{spoof}: {evidence:#?}"
            );
        }
        let none = check_image(&crate::arm64::synthetic::image("not a version", None), None);
        assert!(
            none.get(id::HEADER).unwrap().detail.contains("no `Linux version"),
            "{none:#?}"
        );
    }

    /// A Debian cloud kernel's header, patched to claim PREEMPT_RT.
    #[cfg(feature = "image")]
    const PATCHED_HEADER: &str = "6.12.43+deb13-cloud-amd64 (debian-kernel@lists.debian.org) #1 SMP PREEMPT_RT Debian 6.12.43-1 (2025-08-27)";

    #[cfg(feature = "image")]
    fn image_with_vmlinux(header: &str, vmlinux: &[u8]) -> Vec<u8> {
        crate::bzimage::synthetic::image_with_payload(header, &gzip(vmlinux))
    }

    #[cfg(feature = "image")]
    fn uts_check_of(image: &[u8]) -> Check {
        check_image(image, None).get(id::UTS_VERSION).unwrap().clone()
    }

    #[cfg(feature = "image")]
    #[test]
    fn a_patched_header_over_a_non_rt_kernel_is_refused() {
        use crate::bzimage::synthetic::vmlinux;
        let real = "6.12.43+deb13-cloud-amd64 (debian-kernel@lists.debian.org) #1 SMP PREEMPT_DYNAMIC Debian 6.12.43-1 (2025-08-27)";
        let check = uts_check_of(&image_with_vmlinux(PATCHED_HEADER, &vmlinux(real, None)));
        assert_eq!(check.status, Status::Fail, "{check}");
        assert!(check.detail.contains("PREEMPT_DYNAMIC"), "{check}");
        assert!(check.detail.contains("does not end with"), "{check}");
        // The release is checked too.
        let other = "6.12.44-rt-amd64 (debian-kernel@lists.debian.org) #1 SMP PREEMPT_RT Debian 6.12.43-1 (2025-08-27)";
        let check = uts_check_of(&image_with_vmlinux(PATCHED_HEADER, &vmlinux(other, None)));
        assert_eq!(check.status, Status::Fail, "{check}");
        assert!(check.detail.contains("6.12.44-rt-amd64"), "{check}");
    }

    #[cfg(feature = "image")]
    #[test]
    fn a_genuine_banner_confirms_the_header() {
        let image = crate::bzimage::synthetic::kernel(PATCHED_HEADER, None);
        let evidence = check_image(&image, None);
        assert!(
            evidence.all_passed(&required_checks(RequiredFor::image(false))),
            "{evidence:#?}"
        );
        assert!(
            evidence.get(id::UTS_VERSION).unwrap().detail.contains("banner"),
            "{evidence:#?}"
        );
    }

    #[cfg(feature = "image")]
    #[test]
    fn a_kernel_without_a_banner_is_refused() {
        let check = uts_check_of(&image_with_vmlinux(PATCHED_HEADER, b"\x7fELF no banner"));
        assert_eq!(check.status, Status::Fail, "{check}");
        assert!(check.detail.contains("no `Linux version"), "{check}");
        // Nor is a payload that cannot be decompressed, or none at all.
        let bzip2 = crate::bzimage::synthetic::image_with_payload(PATCHED_HEADER, b"BZh91AY&SY");
        assert_eq!(uts_check_of(&bzip2).status, Status::Fail);
        let none = crate::bzimage::synthetic::image(PATCHED_HEADER, 30);
        assert_eq!(uts_check_of(&none).status, Status::Fail);
    }

    #[cfg(feature = "image")]
    #[test]
    fn two_different_banners_are_refused() {
        use crate::bzimage::synthetic::{banner, vmlinux};
        let real = "6.12.43+deb13-cloud-amd64 (debian-kernel@lists.debian.org) #1 SMP PREEMPT_DYNAMIC Debian 6.12.43-1 (2025-08-27)";
        let mut both = vmlinux(real, None);
        both.extend(banner(PATCHED_HEADER));
        let check = uts_check_of(&image_with_vmlinux(PATCHED_HEADER, &both));
        assert_eq!(check.status, Status::Fail, "{check}");
        assert!(check.detail.contains("2 different banners"), "{check}");
        // The same banner twice is still one banner.
        let mut twice = vmlinux(PATCHED_HEADER, None);
        twice.extend(banner(PATCHED_HEADER));
        assert_eq!(
            uts_check_of(&image_with_vmlinux(PATCHED_HEADER, &twice)).status,
            Status::Pass
        );
    }
}
