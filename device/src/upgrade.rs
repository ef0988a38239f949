//! `emberrtos-update upgrade`: pulls the ref the booted deployment tracks
//! from its remote (GPG verified; a static delta when the remote has one),
//! refuses (exit 3) while a trial is in progress, a commit older than the
//! booted one, one this device rolled back, on an `rt` ref one that fails
//! the RT gate on this device, or, with the firmware's Secure Boot on, one
//! whose kernel no certificate in the firmware's `db` signed; then deploys it
//! as the default with recomputed kernel arguments and reboots unless told
//! not to.

use std::path::Path;

use anyhow::{Context, Result};

use super::deploy::{self, refspec_for};
use super::health::{self, record::HealthRecord};
use super::secure_boot;
use super::system::{Access, System};
use crate::machine;
use emberrtos_contract::error::{Refused, exit};
use emberrtos_contract::gate::{gate_commit_as, gate_machine};
use emberrtos_contract::ostree as ost;

pub fn run(sysroot: &Path, no_reboot: bool) -> Result<u8> {
    let system = System::open(sysroot, Access::Write)?;
    refuse_during_trial(&system)?;
    let refspec = crate::system::origin_refspec(&system.current)?;
    let (remote, ref_name) = crate::system::split_refspec(&refspec)?;
    let remote = remote.with_context(|| {
        format!("the deployment tracks the local ref {ref_name}: there is no remote to upgrade from")
    })?;
    let repo = system.repo();
    let pulled = ost::pull_ref(&repo, &remote, &ref_name)?;
    println!(
        "pulled {refspec}: commit {}, {} bytes transferred ({}; static delta parts {}/{}, objects {})",
        pulled.checksum,
        pulled.bytes_transferred,
        pulled.status,
        pulled.delta_parts_fetched,
        pulled.delta_parts_total,
        pulled.objects_fetched
    );
    let current = system.current.csum().to_string();
    if pulled.checksum == current {
        println!("already up to date: the deployment runs {current}");
        return Ok(exit::OK);
    }
    if let Some(default) = system.sysroot.deployments().first()
        && default.csum().as_str() == pulled.checksum
        && !default.equal(&system.current)
    {
        println!("{} is already deployed and boots next", pulled.checksum);
        return Ok(exit::OK);
    }
    ostree::SysrootUpgrader::check_timestamps(&repo, &current, &pulled.checksum).map_err(|e| Refused {
        stage: "update".into(),
        summary: format!(
            "{} is not newer than the deployed {current}; not deployed",
            pulled.checksum
        ),
        reasons: vec![e.to_string()],
    })?;
    refuse_rolled_back(&system, &pulled.checksum)?;
    gate_machine(&repo, &pulled.checksum, "update", "not deployed")?;
    gate_commit_as(&repo, &ref_name, &pulled.checksum, "update", "not deployed")?;
    secure_boot::require_trusted_kernel(&system, &repo, &pulled.checksum, "update", "not deployed")?;
    deploy::deploy_commit(&system, &pulled.checksum, &refspec_for(Some(&remote), &ref_name))?;
    println!(
        "deployed {} as the default; {current} is kept for `emberrtos-update rollback`",
        pulled.checksum
    );
    if system.live && !no_reboot {
        println!("rebooting into the new deployment");
        machine::reboot()?;
    }
    Ok(exit::OK)
}

/// A trial in progress is judged first: an update now would replace the
/// deployment on trial before anyone knows whether it works.
fn refuse_during_trial(system: &System) -> Result<()> {
    let (env, _) = health::trial::read_env(&health::trial::esp(system)?);
    if env.trial.is_empty() {
        return Ok(());
    }
    Err(Refused {
        stage: "update".into(),
        summary: format!(
            "deployment {} is on trial ({}): it is judged by emberrtos-health first; not deployed",
            env.trial_id, env.trial
        ),
        reasons: vec!["run `emberrtos-update rollback` to end the trial by hand".into()],
    }
    .into())
}

/// A commit this device already rolled back is never deployed again.
fn refuse_rolled_back(system: &System, checksum: &str) -> Result<()> {
    let (record, _) = HealthRecord::load(&system.var)?;
    match record.rolled_back(checksum) {
        None => Ok(()),
        Some(entry) => Err(Refused {
            stage: "update".into(),
            summary: format!("{checksum} was rolled back on this device; not deployed"),
            reasons: vec![entry.reason.clone()],
        }
        .into()),
    }
}
