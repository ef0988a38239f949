//! The trial state GRUB and the device share: `emberrtos_trial`,
//! `emberrtos_tries` and `emberrtos_trial_id` in the ESP's environment block
//! (`/boot/efi/EFI/BOOT/grubenv`). GRUB spends a try before it boots the
//! trial deployment and gives up (`fallback`) when none is left; the device
//! starts a trial when it deploys, ends it when the boot is healthy, and
//! acts on `fallback` (see [`classify`]).

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result};

use super::record::{Entry, HealthRecord, State};
use crate::grubenv;
use crate::system::System;
use emberrtos_contract::boot::{FALLBACK, TRIAL_VAR, TRIES_VAR};
use emberrtos_contract::io::root::ImageRoot;
use emberrtos_contract::policy::HealthPolicy;

/// The deployment on trial, `<checksum>.<serial>`.
pub const TRIAL_ID_VAR: &str = "emberrtos_trial_id";
/// The ESP, relative to the sysroot.
pub const ESP: &str = "boot/efi";
/// The environment block, relative to the ESP.
use emberrtos_contract::boot::GRUBENV_IN_ESP as GRUBENV;

/// A deployment's name in the record and the environment block.
pub fn deployment_id(deployment: &ostree::Deployment) -> String {
    format!("{}.{}", deployment.csum(), deployment.deployserial())
}

/// The trial variables as this boot finds them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TrialEnv {
    pub trial: String,
    pub tries_left: String,
    pub trial_id: String,
}

/// What this boot is, for the health service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Boot {
    /// No trial: check, record, never reboot.
    Normal,
    /// The trial deployment booted on one of its tries.
    Trial { id: String },
    /// GRUB booted the previous deployment: the trial used up its tries, or
    /// a try could not be counted. The trial deployment is to be removed.
    GaveUp { id: String, why: String },
    /// Trial variables that name no deployment GRUB boots as the default
    /// (a power cut between starting a trial and writing the deployments).
    Stale,
}

/// This boot's id (`/proc/sys/kernel/random/boot_id`).
pub fn boot_id() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .ok()
        .map(|id| id.trim().to_string())
}

/// Pure: the kind of boot from the environment, the booted deployment, the
/// default one, and whether the trial was begun on this very boot (an
/// update deployed with `--no-reboot`: pending, not yet tried).
pub fn classify(env: &TrialEnv, booted: &str, default: &str, begun_this_boot: bool) -> Boot {
    match env.trial.as_str() {
        "" => Boot::Normal,
        "1" if env.trial_id == booted => Boot::Trial { id: booted.into() },
        "1" if begun_this_boot => Boot::Normal,
        "1" if env.trial_id == default => Boot::GaveUp {
            id: env.trial_id.clone(),
            why: "GRUB could not count a try (its environment block was not writable)".into(),
        },
        FALLBACK if !env.trial_id.is_empty() && env.trial_id != booted => Boot::GaveUp {
            id: env.trial_id.clone(),
            why: "GRUB started the previous deployment after the last try".into(),
        },
        _ => Boot::Stale,
    }
}

/// The ESP of `system`.
pub fn esp(system: &System) -> Result<ImageRoot> {
    ImageRoot::open(&system.path.join(ESP)).context("the ESP (is /boot/efi mounted?)")
}

/// The trial variables; a block that is missing or not GRUB's reads as no
/// trial (GRUB then does not count either).
pub fn read_env(esp: &ImageRoot) -> (TrialEnv, Option<String>) {
    let vars = match esp.read(Path::new(GRUBENV)).map_err(|e| format!("{e:#}")) {
        Ok(block) => grubenv::parse(&block),
        Err(e) => Err(e),
    };
    match vars {
        Ok(vars) => {
            let get = |name: &str| vars.get(name).cloned().unwrap_or_default();
            let env = TrialEnv {
                trial: get(TRIAL_VAR),
                tries_left: get(TRIES_VAR),
                trial_id: get(TRIAL_ID_VAR),
            };
            (env, None)
        }
        Err(e) => (TrialEnv::default(), Some(format!("/{ESP}/{GRUBENV}: {e}"))),
    }
}

/// Writes the trial variables (all three, or none when `env` is `None`);
/// GRUB's own variables in the block (`saved_entry`, `next_entry`) stay.
pub fn write_env(esp: &ImageRoot, env: Option<&TrialEnv>) -> Result<()> {
    let mut vars: BTreeMap<String, String> = esp
        .read(Path::new(GRUBENV))
        .ok()
        .and_then(|block| grubenv::parse(&block).ok())
        .unwrap_or_default();
    for name in [TRIAL_VAR, TRIES_VAR, TRIAL_ID_VAR] {
        vars.remove(name);
    }
    if let Some(env) = env {
        vars.insert(TRIAL_VAR.to_string(), env.trial.clone());
        vars.insert(TRIES_VAR.to_string(), env.tries_left.clone());
        vars.insert(TRIAL_ID_VAR.to_string(), env.trial_id.clone());
    }
    let block = grubenv::render(&vars).map_err(anyhow::Error::msg)?;
    esp.overwrite_in_place(Path::new(GRUBENV), &block)
        .with_context(|| format!("writing GRUB's environment block /{ESP}/{GRUBENV}"))
}

/// Puts `deployment` on trial with the tries of `policy`: the record first,
/// then the environment block GRUB acts on. Called after the deployment is
/// staged and before it becomes the default, so a power cut leaves either
/// no new default or a new default on trial.
pub fn begin(system: &System, deployment: &ostree::Deployment, policy: &HealthPolicy) -> Result<()> {
    let id = deployment_id(deployment);
    let (mut record, _) = HealthRecord::load(&system.var)?;
    record.deployments.insert(
        id.clone(),
        Entry {
            tries: policy.boot_tries,
            begun_on_boot: boot_id(),
            ..Entry::new(
                &deployment.csum(),
                State::Trial,
                format!("deployed; {} tries to reach healthy", policy.boot_tries),
            )
        },
    );
    record.store(&system.var)?;
    let env = TrialEnv {
        trial: "1".into(),
        tries_left: policy.boot_tries.to_string(),
        trial_id: id,
    };
    write_env(&esp(system)?, Some(&env))
}

/// Ends any trial: GRUB boots the default normally again.
pub fn cancel(system: &System) -> Result<()> {
    write_env(&esp(system)?, None)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(trial: &str, id: &str) -> TrialEnv {
        TrialEnv {
            trial: trial.into(),
            tries_left: "1".into(),
            trial_id: id.into(),
        }
    }

    #[test]
    fn each_boot_is_classified_by_what_grub_left() {
        assert_eq!(classify(&env("", ""), "new.0", "new.0", false), Boot::Normal);
        assert_eq!(
            classify(&env("1", "new.0"), "new.0", "new.0", false),
            Boot::Trial { id: "new.0".into() }
        );
        // GRUB gave up: the previous deployment booted.
        assert!(matches!(
            classify(&env("fallback", "new.0"), "old.0", "new.0", false),
            Boot::GaveUp { id, .. } if id == "new.0"
        ));
        // GRUB could not save the try and booted the previous one.
        assert!(matches!(
            classify(&env("1", "new.0"), "old.0", "new.0", false),
            Boot::GaveUp { why, .. } if why.contains("could not count")
        ));
        // The trial names a deployment that never became the default.
        assert_eq!(classify(&env("1", "new.0"), "old.0", "old.0", false), Boot::Stale);
        assert_eq!(
            classify(&env("fallback", ""), "old.0", "old.0", false),
            Boot::Stale
        );
        assert_eq!(classify(&env("7", "old.0"), "old.0", "old.0", false), Boot::Stale);
        // Deployed with --no-reboot and judged again before the reboot.
        assert_eq!(classify(&env("1", "new.0"), "old.0", "new.0", true), Boot::Normal);
    }
}
