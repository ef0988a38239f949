//! `emberrtos-health.service` (`emberrtos-device health`): judges every
//! boot, and ends the trial of a new deployment.
//!
//! - A trial boot ([`trial::Boot::Trial`]) runs the checks and, for an rt
//!   deployment, the latency check. Healthy: the deployment is blessed and
//!   the trial ends. Unhealthy: the machine reboots; GRUB spends the next
//!   try, and after the last boots the previous deployment.
//! - After GRUB gave up ([`trial::Boot::GaveUp`]) the failed deployment is
//!   removed (never the default again; `upgrade` refuses its commit), the
//!   record says why, and the login banners say what was rolled back.
//! - Any other boot runs the checks and records them; it never reboots.
//!
//! Every boot prints one `EMBERRTOS-HEALTH:` line on the serial console.

pub mod checks;
pub mod latency;
pub mod record;
pub mod trial;

use std::path::Path;

use anyhow::{Context, Result};
use ostree::gio;

use self::record::{CheckResult, Entry, HealthRecord, Outcome, State};
use self::trial::Boot;
use super::record::{announce, set_banner, shown};
use super::system::{Access, System};
use crate::machine;
use emberrtos_contract::error::exit;
use emberrtos_contract::flavor::Flavor;
use emberrtos_contract::ostree as ost;
use emberrtos_contract::policy::HealthPolicy;

/// The console line prefix.
pub const CONSOLE_PREFIX: &str = "EMBERRTOS-HEALTH:";
/// Login banners after an automatic rollback.
pub const MOTD: &str = "etc/motd.d/50-emberrtos-health";
pub const ISSUE: &str = "etc/issue.d/50-emberrtos-health.issue";

/// What this boot found.
struct Judgement {
    results: Vec<CheckResult>,
    healthy: bool,
}

pub fn run(sysroot: &Path, no_reboot: bool) -> Result<u8> {
    let mut on_trial = false;
    let judged = judge_this_boot(sysroot, no_reboot, &mut on_trial);
    if let Err(e) = &judged
        && on_trial
    {
        reboot_after_error(sysroot, no_reboot, e);
    }
    judged
}

/// A trial boot that cannot be judged is not healthy: when the service
/// fails on one, the machine reboots so GRUB spends the next try (a trial
/// must never stay undecided on a running machine). Only a boot of the trial
/// deployment itself reboots, so a failure elsewhere never loops.
fn reboot_after_error(sysroot: &Path, no_reboot: bool, error: &anyhow::Error) {
    let live = std::fs::canonicalize(sysroot).is_ok_and(|p| p == Path::new("/"));
    if live && !no_reboot {
        eprintln!("{CONSOLE_PREFIX} error on a trial boot ({error:#}): rebooting for the next try");
        let _ = machine::reboot();
    }
}

fn judge_this_boot(sysroot: &Path, no_reboot: bool, on_trial_out: &mut bool) -> Result<u8> {
    let system = System::open(sysroot, Access::Read)?;
    let esp = trial::esp(&system)?;
    let (env, env_note) = trial::read_env(&esp);
    let booted = trial::deployment_id(&system.current);
    let default = system
        .sysroot
        .deployments()
        .first()
        .map(trial::deployment_id)
        .unwrap_or_default();
    let (health, record_note) = HealthRecord::load(&system.var)?;
    let pending = health
        .deployments
        .get(&env.trial_id)
        .is_some_and(|e| e.begun_on_boot.is_some() && e.begun_on_boot == trial::boot_id());
    let boot = trial::classify(&env, &booted, &default, pending);
    *on_trial_out = matches!(boot, Boot::Trial { .. });
    let mut notes: Vec<String> = env_note.into_iter().chain(record_note).collect();
    let mut rolled_back = None;
    match &boot {
        Boot::GaveUp { id, why } => {
            drop(system);
            rolled_back = Some(roll_back(sysroot, id, why)?);
        }
        Boot::Stale => {
            trial::cancel(&system)?;
            notes.push("stale trial variables cleared".into());
        }
        Boot::Normal | Boot::Trial { .. } => {}
    }
    let system = System::open(sysroot, Access::Read)?;
    let info = ost::read_commit(&system.repo(), &system.current.csum())?;
    let policy = emberrtos_contract::commit::policy_of(&info);
    let flavor = checks::deployment_flavor(&system, &info);
    let tries_left: u8 = env.tries_left.parse().unwrap_or(0);
    let try_number = policy.boot_tries.saturating_sub(tries_left).max(1);
    let on_trial = matches!(boot, Boot::Trial { .. });
    let judgement = judge(&system, &booted, flavor, &policy, on_trial.then_some(try_number));
    let (mut health, note) = HealthRecord::load(&system.var)?;
    notes.extend(note);
    if on_trial && judgement.healthy {
        // The trial ends before the record says blessed: a power cut in
        // between leaves a boot GRUB no longer counts, never a blessed
        // deployment GRUB could still give up on.
        trial::cancel(&system)?;
    }
    let tries = update_entry(
        &mut health,
        &system.current,
        &booted,
        &judgement,
        on_trial,
        try_number,
    )
    .tries;
    health.store(&system.var)?;
    let mut line = console_line(&booted, tries, &judgement, on_trial.then_some(try_number));
    if let Some((id, reason)) = &rolled_back {
        line.push_str(&format!(" [ROLLED BACK {id}: {}]", shown(reason)));
    }
    let mut lines = vec![line];
    lines.extend(notes.iter().map(|n| format!("emberrtos-health: {n}")));
    announce(&system, &lines);
    if on_trial && !judgement.healthy && system.live && !no_reboot {
        announce(
            &system,
            &["emberrtos-health: the trial boot failed: rebooting for the next try".into()],
        );
        machine::reboot()?;
    }
    Ok(if judgement.healthy {
        exit::OK
    } else {
        exit::REFUSED
    })
}

/// Runs the checks, and on an rt trial boot the latency check.
fn judge(
    system: &System,
    booted: &str,
    flavor: Flavor,
    policy: &HealthPolicy,
    try_number: Option<u8>,
) -> Judgement {
    let mut results = checks::run_all(system.root.path());
    let latency = match (try_number, flavor) {
        (Some(try_number), Flavor::Rt) => {
            announce(
                system,
                &[format!(
                    "emberrtos-health: measuring latency for {} s on the RT cores (budget {} us)…",
                    policy.latency_seconds, policy.budget_us
                )],
            );
            let name = format!("latency-{booted}-try{try_number}.json");
            // /var of the running system (`/var` on the device), created
            // through the confined root; jitter writes the report there.
            let report = system.var.path().join(latency::REPORT_DIR).join(name);
            match system.var.create_dir_all(Path::new(latency::REPORT_DIR), 0o755) {
                Ok(()) => latency::measure(system.root.path(), policy, &report),
                Err(e) => CheckResult {
                    name: latency::NAME.into(),
                    outcome: Outcome::Fail,
                    required: true,
                    detail: format!("{e:#}"),
                },
            }
        }
        (None, Flavor::Rt) => skipped("not a trial boot"),
        (_, Flavor::Standard) => skipped("not an rt deployment"),
    };
    results.push(latency);
    let healthy = !results.iter().any(|r| r.outcome == Outcome::Fail);
    Judgement { results, healthy }
}

fn skipped(why: &str) -> CheckResult {
    CheckResult {
        name: latency::NAME.into(),
        outcome: Outcome::Skip,
        required: true,
        detail: why.into(),
    }
}

/// Records this boot's judgement in the booted deployment's entry.
fn update_entry<'a>(
    health: &'a mut HealthRecord,
    deployment: &ostree::Deployment,
    booted: &str,
    judgement: &Judgement,
    on_trial: bool,
    try_number: u8,
) -> &'a Entry {
    let entry = health
        .deployments
        .entry(booted.to_string())
        .or_insert_with(|| Entry::new(&deployment.csum(), State::Blessed, String::new()));
    entry.checks = judgement.results.clone();
    entry.latency_report = judgement
        .results
        .iter()
        .find(|r| r.name == latency::NAME && r.outcome != Outcome::Skip)
        .map(|_| {
            format!(
                "/var/{}/latency-{booted}-try{try_number}.json",
                latency::REPORT_DIR
            )
        });
    let failures = record::failures(&judgement.results);
    match (on_trial, judgement.healthy) {
        (true, true) => {
            entry.tries_checked += 1;
            entry.state = State::Blessed;
            entry.reason = format!("healthy on trial boot {try_number} of {}", entry.tries);
        }
        (true, false) => {
            entry.tries_checked += 1;
            entry.state = State::Trial;
            entry.reason = format!("trial boot {try_number} of {} failed: {failures}", entry.tries);
        }
        (false, true) if entry.state == State::Blessed && !entry.reason.is_empty() => {}
        (false, true) => {
            entry.state = State::Blessed;
            entry.reason = "healthy".into();
        }
        (false, false) => {
            entry.reason = format!("unhealthy (not on trial, nothing to roll back): {failures}")
        }
    }
    entry
}

/// `EMBERRTOS-HEALTH: <state> deployment=<id> [try=k/N] checks: a=pass,…`.
fn console_line(booted: &str, tries: u8, judgement: &Judgement, try_number: Option<u8>) -> String {
    let state = match (try_number.is_some(), judgement.healthy) {
        (true, true) => "blessed",
        (true, false) => "failed-try",
        (false, true) => "healthy",
        (false, false) => "unhealthy",
    };
    let mut line = format!("{CONSOLE_PREFIX} {state} deployment={booted}");
    if let Some(k) = try_number {
        line.push_str(&format!(" try={k}/{tries}"));
    }
    let summary: Vec<String> = judgement
        .results
        .iter()
        .map(|r| format!("{}={}", r.name, r.outcome.as_str()))
        .collect();
    line.push_str(&format!(" checks: {}", summary.join(",")));
    if let Some(latency) = judgement
        .results
        .iter()
        .find(|r| r.name == latency::NAME && r.outcome != Outcome::Skip)
    {
        line.push_str(&format!(" [latency: {}]", shown(&latency.detail)));
    }
    if !judgement.healthy {
        line.push_str(&format!(
            " [reason: {}]",
            shown(&record::failures(&judgement.results))
        ));
    }
    line
}

/// GRUB gave up on deployment `failed_id`: removes it (the booted
/// deployment becomes the default), marks it rolled back with the reason,
/// ends the trial and writes the banners. Returns the id and the reason.
fn roll_back(sysroot: &Path, failed_id: &str, why: &str) -> Result<(String, String)> {
    let system = System::open(sysroot, Access::Write)?;
    let deployments = system.sysroot.deployments();
    let found = deployments.iter().any(|d| trial::deployment_id(d) == failed_id);
    let (mut health, _) = HealthRecord::load(&system.var)?;
    let entry = health.deployments.get(failed_id).cloned();
    let reason = rollback_reason(entry.as_ref(), why);
    if found {
        // The same objects, moved (libostree finds the booted deployment in
        // the list by identity; `Deployment::clone` would make a copy): the
        // booted one first, the failed one left out.
        let (booted, others): (Vec<_>, Vec<_>) = deployments
            .into_iter()
            .filter(|d| trial::deployment_id(d) != failed_id)
            .partition(|d| d.equal(&system.current));
        let kept: Vec<ostree::Deployment> = booted.into_iter().chain(others).collect();
        system
            .sysroot
            .write_deployments(&kept, gio::Cancellable::NONE)
            .context("removing the rolled-back deployment")?;
        machine::flush_boot(&system)?;
    }
    let entry = health
        .deployments
        .entry(failed_id.to_string())
        .or_insert_with(|| {
            let checksum = failed_id.split('.').next().unwrap_or_default();
            Entry::new(checksum, State::RolledBack, String::new())
        });
    entry.state = State::RolledBack;
    entry.reason = reason.clone();
    health.store(&system.var)?;
    trial::cancel(&system)?;
    let banner = format!(
        "EmberRTOS: the update to {failed_id} was ROLLED BACK automatically: {}\nThis node runs its previous deployment. Details: /var/{}\n",
        shown(&reason),
        record::RECORD
    );
    set_banner(&system, MOTD, ISSUE, Some(&banner))?;
    Ok((failed_id.to_string(), reason))
}

/// Pure: why a trial was rolled back, from its entry and GRUB's side.
pub fn rollback_reason(entry: Option<&Entry>, why: &str) -> String {
    let Some(entry) = entry else {
        return format!("{why}; the deployment had no health record");
    };
    let checked = entry.tries_checked;
    let failed = record::failures(&entry.checks);
    let what = match (checked, failed.is_empty()) {
        (0, _) => "no boot reached the health checks (kernel panic, hang or power loss)".to_string(),
        (_, true) => format!("{checked} of {} tries reached the health checks", entry.tries),
        (_, false) => format!(
            "failed checks: {failed} ({checked} of {} tries reached the health checks)",
            entry.tries
        ),
    };
    format!("{what}; {why}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(tries_checked: u8, failed: Option<&str>) -> Entry {
        Entry {
            checksum: "c".into(),
            state: State::Trial,
            tries: 2,
            tries_checked,
            checks: failed
                .map(|name| CheckResult {
                    name: name.into(),
                    outcome: Outcome::Fail,
                    required: true,
                    detail: "d".into(),
                })
                .into_iter()
                .collect(),
            latency_report: None,
            reason: String::new(),
            begun_on_boot: None,
        }
    }

    #[test]
    fn the_rollback_reason_names_the_failed_check_or_that_no_boot_got_there() {
        let why = "GRUB started the previous deployment after the last try";
        let failed = rollback_reason(Some(&entry(2, Some("latency"))), why);
        assert!(
            failed.starts_with("failed checks: latency (d) (2 of 2 tries"),
            "{failed}"
        );
        assert!(failed.ends_with(why));
        let panicked = rollback_reason(Some(&entry(0, None)), why);
        assert!(
            panicked.starts_with("no boot reached the health checks"),
            "{panicked}"
        );
        assert!(rollback_reason(None, why).contains("no health record"));
    }
}
