//! The YAML schema, exactly as written: round-trips through serde.

use std::fmt;

use serde::{Deserialize, Serialize};

use emberrtos_contract::policy::OnInvalid;

pub use emberrtos_contract::flavor::Flavor;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct RawRecipe {
    pub name: String,
    pub version: String,
    pub flavor: Flavor,
    /// The machine the image is for: `x86_64` (when left out) or `arm64`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arch: Option<rtcheck::Arch>,
    /// Timestamp for reproducible builds; `$SOURCE_DATE_EPOCH` overrides it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_date_epoch: Option<u64>,
    pub kernel: RawKernel,
    pub rootfs: RawRootfs,
    pub ostree: RawOstree,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<RawDevice>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rt: Option<RawRt>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub live: Option<RawLive>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk: Option<RawDisk>,
    /// The Secure Boot key and certificate the gate signs with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secure_boot: Option<RawSecureBoot>,
}

/// Where an input tarball comes from: exactly one of `url`, `path`, `debian`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct RawSource {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub debian: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct RawKernel {
    pub source: RawSource,
    /// A make target (`x86_64_defconfig`, `tinyconfig`) or a path to a full `.config`.
    pub base: String,
    #[serde(default)]
    pub fragments: Vec<String>,
    /// Symbols a fragment may request but Kconfig may drop without failing the build.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_dropped: Vec<String>,
    #[serde(default)]
    pub cmdline: Vec<String>,
    /// How the kernel is compiled (distcc, ccache, -j); not its output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub build: Option<RawKernelBuild>,
    /// The kernel's own build date; without it, its source's newest file's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_date_epoch: Option<u64>,
}

/// `kernel.build`: `{distcc: {hosts}, ccache: true | DIR, jobs: N}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct RawKernelBuild {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub distcc: Option<RawDistcc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ccache: Option<RawCcache>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jobs: Option<u64>,
}

/// `{hosts: "..."}`; without hosts, `$DISTCC_HOSTS`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct RawDistcc {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hosts: Option<String>,
}

/// `true`/`false`, or the ccache directory.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum RawCcache {
    Enabled(bool),
    Dir(String),
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct RawRootfs {
    pub base: RawRootfsBase,
    #[serde(default)]
    pub overlays: Vec<String>,
}

/// `{ debian: <suite>, variant, packages, mirror }` for mmdebstrap, or a
/// rootfs tarball as `{ path | url, sha256 }`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct RawRootfsBase {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub debian: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub packages: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mirror: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct RawOstree {
    /// Archive repo; defaults to `<work-dir>/repo`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repo: Option<String>,
    #[serde(rename = "ref")]
    pub ref_name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpg_key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpg_homedir: Option<String>,
}

/// How a deployment of this image is trial-booted on the device. Integers
/// are read wide so that an out-of-range value gets the range in its error.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct RawDevice {
    /// Tries a new deployment gets before GRUB boots the previous one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_tries: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<RawHealth>,
}

/// The health check of a trial boot.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct RawHealth {
    /// Seconds jitter measures on a trial boot of an `rt` deployment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_seconds: Option<i64>,
    /// What an INVALID latency verdict does to the trial.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_invalid: Option<OnInvalid>,
}

/// Real-time requirements; only in `flavor: rt` recipes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct RawRt {
    /// The worst-case latency a trial boot must meet, in microseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget_us: Option<i64>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct RawLive {
    /// Output ISO; defaults to `<work-dir>/<name>-<flavor>-live.iso`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iso: Option<String>,
    #[serde(default)]
    pub ssh_authorized_keys: Vec<String>,
    /// Extra Debian packages for the live rootfs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub packages: Vec<String>,
    /// The live image's files: `init`, motd, banner, and a `packages` list
    /// (usually `../live-image/rootfs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rootfs: Option<String>,
}

/// A disk image format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum DiskFormat {
    /// A raw (sparse) disk image, to `dd` onto a device.
    Raw,
    /// QEMU's copy-on-write format.
    Qcow2,
}

impl DiskFormat {
    /// The file name extension of an image in this format.
    pub fn extension(self) -> &'static str {
        match self {
            DiskFormat::Raw => "img",
            DiskFormat::Qcow2 => "qcow2",
        }
    }
}

impl fmt::Display for DiskFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DiskFormat::Raw => "raw",
            DiskFormat::Qcow2 => "qcow2",
        })
    }
}

/// The `disk` stage: a bootable disk image of the tagged ref.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct RawDisk {
    /// The whole disk (`8G`, `1536M`); defaults from the tree.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<String>,
    /// Defaults to `[raw]`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub formats: Vec<DiskFormat>,
    /// Refs stored in the device's repo for offline provisioning.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub embed: Vec<String>,
    /// Refs stored as well when the repo has them (another recipe built
    /// them into the same work dir); the stage names those it leaves out.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub embed_if_present: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote: Option<RawRemote>,
}

/// `secure-boot:`: PEM files, relative to the recipe.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct RawSecureBoot {
    /// The private key (readable by its owner only).
    pub key: String,
    /// Its X.509 certificate: what the firmware enrolls.
    pub cert: String,
}

/// The device's ostree remote.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct RawRemote {
    pub url: String,
    /// The publisher's OpenPGP public key file.
    pub gpg_key: String,
}
