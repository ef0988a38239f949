//! The `tag` stage, the RT gate: the recipe's ref moves to the new commit
//! only for the standard flavor, or when every PREEMPT_RT check recorded so
//! far passed. Otherwise exit 3, and the ref stays where it was.

use std::path::{Path, PathBuf};

use anyhow::Result;
use rtcheck::Evidence;
use rtcheck::evidence::id;
use serde::{Deserialize, Serialize};

use crate::error::Refused;
use crate::ostree::{self, MetaValue, Metadata};
use crate::recipe::Flavor;
use crate::stages::commit::{BOOT_EVIDENCE, evidence_of, key};
use crate::stages::verify;

/// The checks the gate requires for an `rt` commit.
pub fn required_checks(with_modules: bool, with_boot: bool) -> Vec<&'static str> {
    let mut required = verify::ARTIFACT_CHECKS.to_vec();
    if with_modules {
        required.push(id::MODULES);
    }
    if with_boot {
        required.extend([id::BOOT_UNAME, id::BOOT_CONFIG]);
    }
    required
}

/// The gate's decision (pure).
pub fn decide(flavor: Flavor, evidence: &Evidence, required: &[&str]) -> Result<(), Refused> {
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
    pub flavor: Flavor,
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

/// Runs the gate on the evidence stored in the commit (plus the boot
/// evidence), then signs, moves the ref and updates the summary.
pub fn tag(request: &TagRequest) -> Result<TagOutput> {
    let repo = ostree::open(request.repo)?;
    let info = ostree::read_commit(&repo, request.commit)?;
    let mut evidence = evidence_of(&info)?;
    if let Some(boot) = request.boot_evidence {
        evidence.extend(boot.clone());
    }
    decide(request.flavor, &evidence, request.required)?;

    if let Some(boot) = request.boot_evidence {
        let mut detached = Metadata::new();
        detached.insert(BOOT_EVIDENCE.into(), MetaValue::Str(serde_json::to_string(boot)?));
        for check in &boot.checks {
            detached.insert(
                format!("{}{}", key::RT_PREFIX, check.id),
                MetaValue::Str(check.status.to_string().to_lowercase()),
            );
        }
        ostree::add_detached_metadata(&repo, request.commit, &detached)?;
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
