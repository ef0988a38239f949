//! What an EmberRTOS commit carries: its metadata keys, and the readers of
//! the evidence and kernel arguments recorded there. The builder writes
//! these keys (the `commit` and `tag` stages); the gate and the device read
//! them back through the functions here.

use anyhow::{Context, Result};
use rtcheck::{Arch, Evidence};

use crate::ostree::CommitInfo;
use crate::policy::HealthPolicy;

/// Metadata keys written on every commit.
pub mod key {
    pub const VERSION: &str = "version";
    pub const BOOTABLE: &str = "ostree.bootable";
    pub const LINUX: &str = "ostree.linux";
    pub const NAME: &str = "imgbuild.name";
    pub const FLAVOR: &str = "imgbuild.flavor";
    /// The machine the commit is for ([`rtcheck::Arch`]'s name).
    pub const ARCH: &str = "imgbuild.arch";
    pub const KERNEL_RELEASE: &str = "imgbuild.kernel.release";
    pub const KERNEL_CONFIG_SHA256: &str = "imgbuild.kernel.config-sha256";
    pub const KARGS: &str = "imgbuild.kargs";
    pub const RECIPE_SHA256: &str = "imgbuild.recipe-sha256";
    /// The whole evidence as JSON; `imgbuild.rt.<check id>` hold each status.
    pub const RT_EVIDENCE: &str = "imgbuild.rt.evidence";
    pub const RT_PREFIX: &str = "imgbuild.rt.";
    /// The trial-boot policy as JSON ([`HealthPolicy`](crate::policy::HealthPolicy)).
    pub const HEALTH: &str = crate::policy::METADATA_KEY;
    /// The sha256 of the SBOM the builder writes into the tree.
    pub const SBOM_SHA256: &str = "imgbuild.sbom.sha256";
    /// `true` when an artifact of the build came from a cache remote entry
    /// nothing authenticated (`--cache-remote-insecure`); no rt ref is
    /// tagged from such a commit.
    pub const CACHE_INSECURE: &str = "imgbuild.cache.insecure";
    /// Those artifacts, as `<area>/<key>`.
    pub const CACHE_INSECURE_ARTIFACTS: &str = "imgbuild.cache.insecure-artifacts";
}

/// The machine commit `info` is for (`imgbuild.arch`): x86_64 for commits
/// from before the key, which were all built for it.
pub fn arch_of(info: &CommitInfo) -> Result<Arch> {
    let Some(value) = info.metadata.get(key::ARCH) else {
        return Ok(Arch::X86_64);
    };
    let checksum = &info.checksum;
    let name = value
        .as_str()
        .with_context(|| format!("commit {checksum}: {} is not a string", key::ARCH))?;
    name.parse()
        .with_context(|| format!("commit {checksum}: {}", key::ARCH))
}

/// Reads the evidence back from a commit's metadata (what devices see).
pub fn evidence_of(info: &CommitInfo) -> Result<Evidence> {
    let text = info
        .metadata
        .get(key::RT_EVIDENCE)
        .and_then(|v| v.as_str())
        .with_context(|| {
            format!(
                "commit {} carries no {} metadata",
                info.checksum,
                key::RT_EVIDENCE
            )
        })?;
    serde_json::from_str(text)
        .with_context(|| format!("parsing {} of commit {}", key::RT_EVIDENCE, info.checksum))
}

/// The commit's kernel arguments (`imgbuild.kargs`), each checked like a
/// recipe's (one word, safe in `grub.cfg`); none when the key is absent.
/// What a device deploys with is read from here, so a commit written by
/// anyone cannot smuggle a second boot entry or a shell word into the menu.
pub fn kargs_of(info: &CommitInfo) -> Result<Vec<String>> {
    let Some(value) = info.metadata.get(key::KARGS) else {
        return Ok(Vec::new());
    };
    let checksum = &info.checksum;
    let list = value
        .as_array()
        .with_context(|| format!("commit {checksum}: {} is not a list of strings", key::KARGS))?;
    list.iter()
        .enumerate()
        .map(|(i, item)| {
            let karg = item
                .as_str()
                .with_context(|| format!("commit {checksum}: {}[{i}] is not a string", key::KARGS))?;
            crate::syntax::kernel_argument(karg)
                .map_err(|e| anyhow::anyhow!("commit {checksum}: {}[{i}]: {e}", key::KARGS))?;
            Ok(karg.to_string())
        })
        .collect()
}

/// Detached metadata key of the boot evidence, added at tag time.
pub const BOOT_EVIDENCE: &str = "imgbuild.rt.boot.evidence";

/// The commit's evidence plus the boot evidence recorded when it was tagged.
pub fn full_evidence(info: &CommitInfo) -> Result<Evidence> {
    let mut evidence = evidence_of(info)?;
    if let Some(text) = info.detached_metadata.get(BOOT_EVIDENCE).and_then(|v| v.as_str()) {
        let boot: Evidence = serde_json::from_str(text)
            .with_context(|| format!("parsing {BOOT_EVIDENCE} of commit {}", info.checksum))?;
        evidence.extend(boot);
    }
    Ok(evidence)
}

/// The policy a commit carries (defaults when it carries none or a bad one).
pub fn policy_of(info: &CommitInfo) -> HealthPolicy {
    info.metadata
        .get(key::HEALTH)
        .and_then(|v| v.as_str())
        .and_then(|json| HealthPolicy::parse(json).ok())
        .unwrap_or_default()
}
