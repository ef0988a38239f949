//! The `tag` stage, the RT gate: the recipe's ref moves to the new commit
//! only for the standard flavor, or when every PREEMPT_RT check passed on
//! the kernel read back out of the commit itself, with boot evidence taken
//! on that same kernel. Otherwise exit 3, and the ref stays where it was.

use std::path::{Path, PathBuf};

use anyhow::Result;
use rtcheck::{CheckId, Evidence, RequiredFor};
use serde::{Deserialize, Serialize};

use crate::ostree::{self, MetaValue, Metadata};
use crate::recipe::Flavor;
use crate::stages::commit::{BOOT_EVIDENCE, evidence_of, insecure_cache_of, key};
use crate::stages::verify;
use emberrtos_contract::error::Refused;
use emberrtos_contract::gate;

/// Detached metadata key naming the live ISO the boot evidence was taken from.
pub const BOOT_ISO_SHA256: &str = "imgbuild.rt.boot.iso-sha256";

/// The checks the gate requires for an `rt` commit, as text
/// (`rtcheck::required_checks(RequiredFor::build(with_modules, with_boot))`).
pub fn required_checks(with_modules: bool, with_boot: bool) -> Vec<&'static str> {
    rtcheck::required_checks(RequiredFor::build(with_modules, with_boot))
        .into_iter()
        .map(CheckId::as_str)
        .collect()
}

/// The flavor the gate applies: rt when the recipe says so or the ref's
/// name does (policy, [`emberrtos_contract::flavor::flavor_of_ref`]); never weaker than either.
pub fn gate_flavor(recipe_flavor: Flavor, ref_name: &str) -> Flavor {
    match (recipe_flavor, emberrtos_contract::flavor::flavor_of_ref(ref_name)) {
        (Flavor::Standard, Flavor::Standard) => Flavor::Standard,
        _ => Flavor::Rt,
    }
}

/// The gate's decision (pure).
pub fn decide<I: AsRef<str>>(flavor: Flavor, evidence: &Evidence, required: &[I]) -> Result<(), Refused> {
    match flavor {
        Flavor::Standard => Ok(()),
        Flavor::Rt => verify::gate("tag", evidence, required).map_err(|mut refused| {
            refused.summary = "not every PREEMPT_RT check passed; the ref was not moved".into();
            refused
        }),
    }
}

pub struct TagRequest<'a> {
    pub repo: &'a Path,
    pub ref_name: &'a str,
    pub commit: &'a str,
    /// The recipe's flavor; the ref's own policy flavor applies too.
    pub flavor: Flavor,
    /// Checks the caller requires on top of what the committed kernel needs.
    pub required: &'a [&'a str],
    /// Evidence gathered after the commit was written (the boot check).
    pub boot_evidence: Option<&'a Evidence>,
    pub gpg_key: Option<&'a str>,
    pub gpg_homedir: Option<&'a Path>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct TagOutput {
    pub repo: PathBuf,
    pub ref_name: String,
    pub commit: String,
    pub previous: Option<String>,
    pub signed: bool,
}

/// The refusal of an rt ref built from `artifacts` (`<area>/<key>`), cache
/// remote entries nothing authenticated (`--cache-remote-insecure`) (pure).
pub fn insecure_refusal(artifacts: &[String]) -> Refused {
    let mut reasons: Vec<String> = artifacts
        .iter()
        .map(|a| format!("{a} came from an unverified cache remote entry"))
        .collect();
    reasons.push(
        "remove them from the cache and build again with --cache-remote-key (or without a cache remote)"
            .into(),
    );
    Refused {
        stage: "tag".into(),
        summary:
            "built from unauthenticated cache remote entries (--cache-remote-insecure); the ref was not moved"
                .into(),
        reasons,
    }
}

/// The refusal of an rt ref for a commit that records unverified cache
/// remote entries, if it does.
pub fn insecure_cache_refusal(info: &ostree::CommitInfo) -> Option<Refused> {
    insecure_cache_of(info).map(|artifacts| insecure_refusal(&artifacts))
}

/// Re-verifies the commit's kernel and decides, for an rt ref or recipe.
fn gate_commit(repo: &::ostree::Repo, request: &TagRequest, live_iso_sha256: Option<&str>) -> Result<()> {
    let flavor = gate_flavor(request.flavor, request.ref_name);
    if flavor == Flavor::Standard {
        return Ok(());
    }
    let info = ostree::read_commit(repo, request.commit)?;
    if let Some(refused) = insecure_cache_refusal(&info) {
        return Err(refused.into());
    }
    let recorded = evidence_of(&info).unwrap_or_default();
    let kernel = gate::verify_committed_kernel(repo, &info.checksum)?;
    let (evidence, problems) =
        gate::combined_evidence(recorded, &kernel, request.boot_evidence, live_iso_sha256);
    let mut required: Vec<&str> = request.required.to_vec();
    let needed = rtcheck::required_checks(RequiredFor {
        kconfig: true,
        ..RequiredFor::build(kernel.has_modules, request.boot_evidence.is_some())
    });
    required.extend(needed.iter().map(|id| id.as_str()));
    required.sort_unstable();
    required.dedup();
    let mut refused = match decide(flavor, &evidence, &required) {
        Ok(()) if problems.is_empty() => return Ok(()),
        Ok(()) => Refused {
            stage: "tag".into(),
            summary: "the boot evidence is not from the committed kernel; the ref was not moved".into(),
            reasons: Vec::new(),
        },
        Err(refused) => refused,
    };
    refused.reasons.extend(problems);
    Err(refused.into())
}

fn boot_metadata(boot: &Evidence) -> Result<Metadata> {
    let mut detached = Metadata::new();
    detached.insert(BOOT_EVIDENCE.into(), MetaValue::Str(serde_json::to_string(boot)?));
    if let Some(sha) = &boot.medium_sha256 {
        detached.insert(BOOT_ISO_SHA256.into(), MetaValue::Str(sha.clone()));
    }
    for check in &boot.checks {
        detached.insert(
            format!("{}{}", key::RT_PREFIX, check.id),
            MetaValue::Str(check.status.to_string().to_lowercase()),
        );
    }
    Ok(detached)
}

/// [`tag_with_live_iso`] without naming the ISO: the boot evidence must still
/// name the ISO it was taken from, but it is not compared.
pub fn tag(request: &TagRequest) -> Result<TagOutput> {
    tag_with_live_iso(request, None)
}

/// Runs the gate on the kernel inside the commit (plus the boot evidence,
/// which must come from that kernel booted from `live_iso_sha256`), then
/// signs, moves the ref and updates the summary.
pub fn tag_with_live_iso(request: &TagRequest, live_iso_sha256: Option<&str>) -> Result<TagOutput> {
    let repo = ostree::open(request.repo)?;
    gate_commit(&repo, request, live_iso_sha256)?;
    if let Some(boot) = request.boot_evidence {
        ostree::add_detached_metadata(&repo, request.commit, &boot_metadata(boot)?)?;
    }
    let signed = match request.gpg_key {
        Some(key_id) => {
            ostree::sign_commit(&repo, request.commit, key_id, request.gpg_homedir)?;
            true
        }
        None => false,
    };
    let previous = ostree::resolve(&repo, request.ref_name)?;
    ostree::set_ref(&repo, request.ref_name, request.commit)?;
    ostree::update_summary(&repo, request.gpg_key, request.gpg_homedir)?;
    Ok(TagOutput {
        repo: request.repo.to_path_buf(),
        ref_name: request.ref_name.to_string(),
        commit: request.commit.to_string(),
        previous,
        signed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rtcheck::Check;
    use rtcheck::evidence::id;

    fn evidence(checks: &[(&str, bool)]) -> Evidence {
        Evidence {
            checks: checks
                .iter()
                .map(|(id, ok)| {
                    if *ok {
                        Check::pass(id, "ok")
                    } else {
                        Check::fail(id, "broken")
                    }
                })
                .collect(),
            ..Evidence::default()
        }
    }

    #[test]
    fn rt_needs_every_required_check() {
        let required = required_checks(true, true);
        let all: Vec<(&str, bool)> = required.iter().map(|id| (*id, true)).collect();
        assert!(decide(Flavor::Rt, &evidence(&all), &required).is_ok());
        let mut one_failed = all.clone();
        one_failed[2].1 = false;
        let refused = decide(Flavor::Rt, &evidence(&one_failed), &required).unwrap_err();
        assert!(
            refused.reasons.iter().any(|r| r.contains(required[2])),
            "{refused}"
        );
        let missing_boot: Vec<_> = all
            .iter()
            .filter(|(id, _)| !id.starts_with("boot"))
            .cloned()
            .collect();
        let refused = decide(Flavor::Rt, &evidence(&missing_boot), &required).unwrap_err();
        assert!(
            refused
                .reasons
                .iter()
                .any(|r| r.contains("boot.uname: check did not run")),
            "{refused}"
        );
    }

    #[test]
    fn the_ref_name_makes_a_commit_rt() {
        assert_eq!(gate_flavor(Flavor::Standard, "emberrtos/x86_64/rt"), Flavor::Rt);
        assert_eq!(gate_flavor(Flavor::Rt, "emberrtos/x86_64/standard"), Flavor::Rt);
        assert_eq!(
            gate_flavor(Flavor::Standard, "emberrtos/x86_64/standard"),
            Flavor::Standard
        );
    }

    #[test]
    fn a_commit_from_insecure_cache_entries_is_refused_naming_them() {
        let commit = |metadata: serde_json::Value| ostree::CommitInfo {
            checksum: "ab".repeat(32),
            parent: None,
            subject: String::new(),
            timestamp: 0,
            metadata: serde_json::from_value(metadata).unwrap(),
            detached_metadata: Default::default(),
        };
        let kernel = format!("kernels/{}", "cd".repeat(32));
        let insecure = commit(serde_json::json!({
            crate::stages::commit::key::CACHE_INSECURE: true,
            crate::stages::commit::key::CACHE_INSECURE_ARTIFACTS: [kernel],
        }));
        let refused = insecure_cache_refusal(&insecure).expect("refused");
        assert_eq!(refused.stage, "tag");
        assert!(refused.summary.contains("--cache-remote-insecure"), "{refused}");
        assert!(refused.reasons[0].contains(&kernel), "{refused}");
        let exit = emberrtos_contract::error::exit_code(&anyhow::Error::from(refused));
        assert_eq!(exit, emberrtos_contract::error::exit::REFUSED);
        assert!(insecure_cache_refusal(&commit(serde_json::json!({}))).is_none());
    }

    #[test]
    fn standard_is_always_tagged() {
        assert!(
            decide(
                Flavor::Standard,
                &evidence(&[(id::UTS_VERSION, false)]),
                &required_checks(false, false)
            )
            .is_ok()
        );
    }
}
