//! The health checks: executables in `/usr/lib/emberrtos/health.d/required`
//! (the image's), `/etc/emberrtos/health.d/required` and `.../wanted` (the
//! site's), run in name order, each bounded by `timeout`. A required check
//! that exits non-zero fails the boot; a wanted one only warns. The
//! image's own required checks call back into this binary
//! (`emberrtos-device health check NAME`): [`builtin`].

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use super::record::{CheckResult, Outcome};
use crate::system::System;
use emberrtos_contract::commit::{self, key};
use emberrtos_contract::flavor::Flavor;
use emberrtos_contract::ostree as ost;
use rtreport::report::CpuSet;

/// The check directories and whether their checks are required.
pub const DIRS: &[(&str, bool)] = &[
    ("usr/lib/emberrtos/health.d/required", true),
    ("etc/emberrtos/health.d/required", true),
    ("etc/emberrtos/health.d/wanted", false),
];
/// The longest detail kept per check.
const MAX_DETAIL: usize = 300;
/// Seconds a check may take (then SIGTERM, and SIGKILL 10 s later).
const TIMEOUT_SECONDS: &str = "300";

/// Runs every check of every directory under `root` (`/` on the device).
pub fn run_all(root: &Path) -> Vec<CheckResult> {
    let mut results = Vec::new();
    for (dir, required) in DIRS {
        for path in entries(&root.join(dir)) {
            results.push(run_one(&path, *required));
        }
    }
    results
}

/// A directory's entries in name order, without hidden files and editor
/// or package-manager leftovers; a missing directory has none.
fn entries(dir: &Path) -> Vec<PathBuf> {
    let Ok(read) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut paths: Vec<PathBuf> = read
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            let name = p.file_name().unwrap_or_default().to_string_lossy();
            !(name.starts_with('.') || name.ends_with('~') || name.contains(".dpkg-"))
        })
        .collect();
    paths.sort();
    paths
}

fn run_one(path: &Path, required: bool) -> CheckResult {
    use std::os::unix::fs::PermissionsExt;
    let name = path
        .file_name()
        .unwrap_or_default()
        .to_string_lossy()
        .into_owned();
    let result = |outcome, detail: String| CheckResult {
        name: name.clone(),
        outcome,
        required,
        detail: shorten(&detail),
    };
    let failed = if required { Outcome::Fail } else { Outcome::Warn };
    let runnable = std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0);
    if !runnable {
        return result(failed, format!("{} is not an executable file", path.display()));
    }
    let output = Command::new("timeout")
        .args(["-k", "10", TIMEOUT_SECONDS])
        .arg(path)
        .output();
    match output {
        Ok(out) => {
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            let last = text.lines().rfind(|l| !l.trim().is_empty()).unwrap_or("").trim();
            match out.status.code() {
                Some(0) => result(Outcome::Pass, last.to_string()),
                Some(124) => result(failed, format!("timed out after {TIMEOUT_SECONDS} s")),
                _ => result(failed, format!("{} ({})", last, out.status)),
            }
        }
        Err(e) => result(failed, format!("could not run it: {e}")),
    }
}

fn shorten(text: &str) -> String {
    match text.char_indices().nth(MAX_DETAIL) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_string(),
    }
}

/// The built-in checks the image's required scripts call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Builtin {
    /// Every file under /usr is sealed with fs-verity and measures as the
    /// commit's manifest says; none is missing or added.
    Tree,
    /// The running kernel is the deployment's (release) and, for `rt`,
    /// proven PREEMPT_RT (rtcheck over `uname -v` and /proc/config.gz).
    Kernel,
    /// /proc/cmdline holds every `imgbuild.kargs` of the commit.
    Kargs,
    /// emberrtos-rt-tune ran and no movable IRQ is on an RT CPU.
    RtTune,
    /// No systemd unit has failed.
    FailedUnits,
}

/// Runs a built-in check on the booted system; the message says what was
/// found. An error means the check failed.
pub fn builtin(system: &System, check: Builtin) -> Result<String> {
    let info = ost::read_commit(&system.repo(), &system.current.csum())?;
    let flavor = deployment_flavor(system, &info);
    match check {
        Builtin::Tree => crate::verity::check_tree(system),
        Builtin::Kernel => {
            let release = info
                .metadata
                .get(key::KERNEL_RELEASE)
                .and_then(|v| v.as_str())
                .context("the commit records no kernel release")?
                .to_string();
            check_kernel(&release, flavor)
        }
        Builtin::Kargs => {
            let cmdline = std::fs::read_to_string("/proc/cmdline").context("reading /proc/cmdline")?;
            check_kargs(&cmdline, &commit::kargs_of(&info)?).map_err(anyhow::Error::msg)
        }
        Builtin::RtTune if flavor != Flavor::Rt => Ok("not an rt deployment".into()),
        Builtin::RtTune => check_rt_tune(),
        Builtin::FailedUnits => check_failed_units(),
    }
}

/// The flavor a deployment must live up to: `rt` when its commit claims it
/// or the ref it tracks is an rt ref.
pub fn deployment_flavor(system: &System, info: &ost::CommitInfo) -> Flavor {
    let claimed = info.metadata.get(key::FLAVOR).and_then(|v| v.as_str());
    let by_ref = crate::system::origin_refspec(&system.current)
        .ok()
        .and_then(|spec| crate::system::split_refspec(&spec).ok())
        .map(|(_, ref_name)| emberrtos_contract::flavor::flavor_of_ref(&ref_name));
    match claimed == Some("rt") || by_ref == Some(Flavor::Rt) {
        true => Flavor::Rt,
        false => Flavor::Standard,
    }
}

fn check_kernel(release: &str, flavor: Flavor) -> Result<String> {
    let running = std::fs::read_to_string("/proc/sys/kernel/osrelease")?;
    if running.trim() != release {
        bail!(
            "running kernel {} is not the deployment's {release}",
            running.trim()
        );
    }
    if flavor != Flavor::Rt {
        return Ok(format!("kernel {release}"));
    }
    let uname_v = std::fs::read_to_string("/proc/sys/kernel/version")?;
    let config = std::fs::read("/proc/config.gz")
        .ok()
        .and_then(|gz| rtcheck::ikconfig::gunzip_text(&gz).ok());
    let evidence = rtcheck::evidence::check_running_kernel(&uname_v, config.as_deref());
    if let Some(failed) = evidence.failures().next() {
        bail!("kernel {release} is not PREEMPT_RT: {failed}");
    }
    Ok(format!("kernel {release}, PREEMPT_RT"))
}

/// Pure: every commit karg is a word of the command line.
pub fn check_kargs(cmdline: &str, kargs: &[String]) -> Result<String, String> {
    let words: Vec<&str> = cmdline.split_whitespace().collect();
    let missing: Vec<&str> = kargs
        .iter()
        .map(String::as_str)
        .filter(|k| !words.contains(k))
        .collect();
    match missing.is_empty() {
        true => Ok(format!("{} commit kargs present", kargs.len())),
        false => Err(format!("/proc/cmdline lacks {}", missing.join(" "))),
    }
}

fn check_rt_tune() -> Result<String> {
    let text = systemctl(&[
        "show",
        "-p",
        "Result",
        "-p",
        "ActiveState",
        "emberrtos-rt-tune.service",
    ])?;
    if !(text.contains("Result=success") && text.contains("ActiveState=active")) {
        bail!(
            "emberrtos-rt-tune.service did not succeed: {}",
            text.split_whitespace().collect::<Vec<_>>().join(" ")
        );
    }
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let rt_cpus =
        CpuSet::parse(read("/sys/devices/system/cpu/isolated").trim()).map_err(anyhow::Error::msg)?;
    let mut irqs = Vec::new();
    for entry in std::fs::read_dir("/proc/irq")?.flatten() {
        let dir = entry.path();
        let list = |name: &str| CpuSet::parse(read(&dir.join(name).to_string_lossy()).trim()).ok();
        if let (Some(allowed), Some(effective)) = (list("smp_affinity_list"), list("effective_affinity_list"))
        {
            irqs.push((
                entry.file_name().to_string_lossy().into_owned(),
                allowed,
                effective,
            ));
        }
    }
    let offending = irqs_on_rt_cpus(&rt_cpus, &irqs);
    match offending.is_empty() {
        true => Ok(format!("rt-tune succeeded; no movable IRQ on RT CPUs {rt_cpus}")),
        false => bail!("IRQs on RT CPUs {rt_cpus}: {}", offending.join(", ")),
    }
}

/// Pure: the IRQs serviced on an RT CPU although their affinity could keep
/// them off (it allows a CPU that is not RT). An IRQ whose affinity is only
/// RT CPUs, or whose hardware ignores the affinity it was given (it
/// excludes every RT CPU yet is serviced there), cannot be moved.
pub fn irqs_on_rt_cpus(rt: &CpuSet, irqs: &[(String, CpuSet, CpuSet)]) -> Vec<String> {
    irqs.iter()
        .filter(|(_, allowed, effective)| {
            let on_rt = !effective.intersection(rt).is_empty();
            let movable = !allowed.difference(rt).is_empty() && !allowed.intersection(rt).is_empty();
            on_rt && movable
        })
        .map(|(irq, _, effective)| format!("irq {irq} on {effective}"))
        .collect()
}

fn check_failed_units() -> Result<String> {
    let text = systemctl(&[
        "list-units",
        "--state=failed",
        "--plain",
        "--no-legend",
        "--no-pager",
    ])?;
    let failed: Vec<String> = text
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect();
    match failed.is_empty() {
        true => Ok("no failed units".into()),
        false => bail!("failed units: {}", failed.join(" ")),
    }
}

/// `systemctl ARGS`' standard output.
fn systemctl(args: &[&str]) -> Result<String> {
    let out = Command::new("systemctl")
        .args(args)
        .output()
        .with_context(|| format!("running systemctl {}", args.join(" ")))?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(text: &str) -> CpuSet {
        CpuSet::parse(text).unwrap()
    }

    #[test]
    fn kargs_must_all_be_on_the_command_line() {
        let kargs = vec!["isolcpus=1".to_string(), "quiet".to_string()];
        assert!(check_kargs("root=x isolcpus=1 quiet", &kargs).is_ok());
        let err = check_kargs("root=x quiet isolcpus=1,2", &kargs).unwrap_err();
        assert!(err.contains("isolcpus=1"), "{err}");
    }

    #[test]
    fn only_movable_irqs_on_rt_cpus_fail() {
        let rt = set("1");
        let irq = |n: &str, a: &str, e: &str| (n.to_string(), set(a), set(e));
        let irqs = [
            irq("4", "0", "0"),    // moved
            irq("9", "0-1", "1"),  // could be moved, was not
            irq("11", "1", "1"),   // pinned to the RT CPU
            irq("24", "0", "1"),   // the hardware ignores its affinity
            irq("30", "0-1", "0"), // allowed there but serviced on 0
        ];
        assert_eq!(irqs_on_rt_cpus(&rt, &irqs), vec!["irq 9 on 1".to_string()]);
        assert!(irqs_on_rt_cpus(&CpuSet::default(), &irqs).is_empty());
    }

    #[test]
    fn a_check_that_is_not_executable_or_exits_non_zero_fails_and_wanted_ones_warn() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, body: &str, mode: u32| {
            let path = dir.path().join(name);
            std::fs::write(&path, body).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
            path
        };
        let ok = run_one(&write("ok", "#!/bin/sh\necho fine\n", 0o755), true);
        assert_eq!((ok.outcome, ok.detail.as_str()), (Outcome::Pass, "fine"));
        let bad = run_one(&write("bad", "#!/bin/sh\necho broken >&2\nexit 2\n", 0o755), true);
        assert_eq!(bad.outcome, Outcome::Fail);
        assert!(bad.detail.contains("broken"), "{}", bad.detail);
        let plain = run_one(&write("plain", "#!/bin/sh\n", 0o644), true);
        assert_eq!(plain.outcome, Outcome::Fail);
        let wanted = run_one(&write("w", "#!/bin/sh\nexit 1\n", 0o755), false);
        assert_eq!(wanted.outcome, Outcome::Warn);
        write(".hidden", "", 0o755);
        write("x.dpkg-old", "", 0o755);
        let names: Vec<_> = entries(dir.path())
            .iter()
            .map(|p| p.file_name().unwrap().to_owned())
            .collect();
        assert_eq!(names, ["bad", "ok", "plain", "w"]);
    }
}
