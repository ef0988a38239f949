//! The RT configuration checks run before measuring (and alone by
//! `jitter --check`). Each failed check is a named reason: at
//! [`Status::Invalid`] level the measurement cannot be trusted and the
//! verdict is INVALID; at [`Status::Warn`] level the setting only costs
//! latency, so the measured worst case is still true (if pessimistic) and the
//! verdict is unchanged.
//!
//! The levels:
//! - `rt-throttling` INVALID: with `sched_rt_runtime_us` other than -1 the
//!   scheduler stops every RT task on a CPU once RT work has used 95% of a
//!   second there, and IRQ threads are RT tasks on PREEMPT_RT: under the load
//!   cyclictest can sit out the rest of the period, a spike that is a
//!   scheduler policy, not the hardware, and that a tuned system never shows.
//! - `irq-affinity`, `governor` INVALID: the existing reasons
//!   `irqs-on-rt-cpus` and `governor-not-performance`, with their levels.
//! - `smt-siblings` WARN: a busy sibling shares the core's pipeline and
//!   caches, so it adds latency; the load runs on it during the measurement,
//!   so the figure includes that cost (pessimistic, never optimistic).
//! - `rcu-nocbs-nohz-full`, `kthread-affinity`, `timer-migration`,
//!   `idle-states`, `periodic-watchdogs` WARN: each lets housekeeping work or
//!   a slow wake-up onto the RT CPUs, which the measurement sees as latency.
//!
//! Every file is read below a root (normally `/`), so tests use a fake tree;
//! the parsing functions are pure.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use rtreport::report::ReasonCode;

use crate::cpus::{CpuSet, cmdline_cpus};
use crate::system::{self, Irq, read, read_list};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    Pass,
    Warn,
    Invalid,
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(match self {
            Status::Pass => "PASS",
            Status::Warn => "WARN",
            Status::Invalid => "INVALID",
        })
    }
}

/// One check's result.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Conformance {
    /// Kebab-case name of the check, e.g. `rt-throttling`.
    pub id: &'static str,
    /// The reason it gives when it fails.
    pub code: ReasonCode,
    pub status: Status,
    /// What was found, naming the files and CPUs.
    pub detail: String,
}

/// Every check: its id, its reason code and the level at which it fails.
pub const CHECKS: [(&str, ReasonCode, Status); 9] = [
    ("rt-throttling", ReasonCode::RtThrottling, Status::Invalid),
    ("irq-affinity", ReasonCode::IrqsOnRtCpus, Status::Invalid),
    ("rcu-nocbs-nohz-full", ReasonCode::RcuNocbsNohzFull, Status::Warn),
    ("kthread-affinity", ReasonCode::KthreadAffinity, Status::Warn),
    ("timer-migration", ReasonCode::TimerMigration, Status::Warn),
    ("governor", ReasonCode::GovernorNotPerformance, Status::Invalid),
    ("idle-states", ReasonCode::IdleStates, Status::Warn),
    ("smt-siblings", ReasonCode::SmtSiblings, Status::Warn),
    ("periodic-watchdogs", ReasonCode::PeriodicWatchdogs, Status::Warn),
];

/// `Ok(what was found)` when a check passes, `Err(what is wrong)` when not.
type Outcome = Result<String, String>;

/// Runs every check of [`CHECKS`], in that order, for `rt_cpus`.
pub fn check(root: &Path, rt_cpus: &CpuSet) -> Vec<Conformance> {
    let outcomes: [Outcome; 9] = [
        rt_throttling(read(root, RT_RUNTIME).as_deref()),
        irq_affinity(root, rt_cpus),
        rcu_nocbs_nohz_full(
            read(root, "/proc/cmdline").as_deref().unwrap_or(""),
            &read_list(root, "/sys/devices/system/cpu/nohz_full"),
            rt_cpus,
        ),
        kthread_affinity(root, rt_cpus),
        timer_migration(read(root, TIMER_MIGRATION).as_deref()),
        governor(root, rt_cpus),
        idle_states(root, rt_cpus),
        smt_siblings(root, rt_cpus),
        periodic_watchdogs(
            read(root, HUNG_TASK).as_deref(),
            read(root, NMI_WATCHDOG).as_deref(),
        ),
    ];
    CHECKS
        .iter()
        .zip(outcomes)
        .map(|(&(id, code, level), outcome)| {
            let (status, detail) = match outcome {
                Ok(found) => (Status::Pass, found),
                Err(problem) => (level, problem),
            };
            Conformance {
                id,
                code,
                status,
                detail,
            }
        })
        .collect()
}

/// The `--check` table: `CHECK  STATUS  DETAIL`.
pub fn table(results: &[Conformance]) -> String {
    let mut out = format!("{:<20} {:<8} {}\n", "CHECK", "STATUS", "DETAIL");
    for result in results {
        out += &format!("{:<20} {:<8} {}\n", result.id, result.status, result.detail);
    }
    out
}

/// `jitter --check`'s exit status: 4 when a check failed at INVALID level
/// (a measurement would be INVALID), else 0, warnings or not.
pub fn exit_code(results: &[Conformance]) -> u8 {
    if results.iter().any(|r| r.status == Status::Invalid) {
        4
    } else {
        0
    }
}

const RT_RUNTIME: &str = "/proc/sys/kernel/sched_rt_runtime_us";
const TIMER_MIGRATION: &str = "/proc/sys/kernel/timer_migration";
const HUNG_TASK: &str = "/proc/sys/kernel/hung_task_timeout_secs";
const NMI_WATCHDOG: &str = "/proc/sys/kernel/nmi_watchdog";
const CPU_DIR: &str = "/sys/devices/system/cpu";

/// `sched_rt_runtime_us` must be -1 (no RT throttling).
pub fn rt_throttling(runtime: Option<&str>) -> Outcome {
    match runtime.map(str::trim) {
        Some("-1") => Ok(format!("{RT_RUNTIME} is -1")),
        Some(value) => Err(format!(
            "{RT_RUNTIME} is {value}: RT tasks are throttled once they use that much of each period (write -1)"
        )),
        None => Err(format!("cannot read {RT_RUNTIME}")),
    }
}

/// What is wrong with the IRQs of `irqs` that may fire on `rt_cpus`, if any.
pub fn irqs_on_rt_cpus(irqs: &[Irq], rt_cpus: &CpuSet) -> Option<String> {
    let on_rt: Vec<String> = irqs
        .iter()
        .filter(|irq| !irq.effective.intersection(rt_cpus).is_empty())
        .map(|irq| format!("{} (cpu {})", irq.irq, irq.effective))
        .collect();
    if on_rt.is_empty() {
        return None;
    }
    Some(format!(
        "{} IRQs may fire on RT CPUs: {}",
        on_rt.len(),
        first_of(&on_rt, 8)
    ))
}

/// The first `max` of `items`, comma-separated, `...` when there are more.
pub fn first_of(items: &[String], max: usize) -> String {
    let shown: Vec<&str> = items.iter().take(max).map(String::as_str).collect();
    let more = if items.len() > max { ", ..." } else { "" };
    format!("{}{more}", shown.join(", "))
}

/// No IRQ that can move may be delivered to an RT CPU; those the kernel
/// refuses to move (per-CPU, managed) are exempt.
fn irq_affinity(root: &Path, rt_cpus: &CpuSet) -> Outcome {
    let irqs = system::read_irqs(root);
    let movable = system::movable_irqs(root, &irqs, rt_cpus);
    let exempt = irqs.len() - movable.len();
    let exempt_note = if exempt > 0 {
        format!(" ({exempt} on RT CPUs cannot be moved and are exempt)")
    } else {
        String::new()
    };
    match irqs_on_rt_cpus(&movable, rt_cpus) {
        Some(problem) => Err(format!("{problem}{exempt_note}")),
        None => Ok(format!(
            "{} IRQs in /proc/irq, none movable on CPUs {rt_cpus}{exempt_note}",
            irqs.len()
        )),
    }
}

/// The CPUs of `parameter` on the command line; `all` is every RT CPU.
fn parameter_cpus(cmdline: &str, parameter: &str, rt_cpus: &CpuSet) -> CpuSet {
    let last = cmdline
        .split_whitespace()
        .filter_map(|arg| arg.strip_prefix(parameter)?.strip_prefix('='))
        .next_back();
    if last == Some("all") {
        return rt_cpus.clone();
    }
    cmdline_cpus(cmdline, parameter).unwrap_or_default()
}

/// `nohz_full` (command line or sysfs) and `rcu_nocbs` must cover the RT
/// CPUs. The kernel offloads the callbacks of nohz_full CPUs by itself, so
/// those count as rcu_nocbs too.
pub fn rcu_nocbs_nohz_full(cmdline: &str, sysfs_nohz_full: &CpuSet, rt_cpus: &CpuSet) -> Outcome {
    let nohz = parameter_cpus(cmdline, "nohz_full", rt_cpus).union(sysfs_nohz_full);
    let nocbs = parameter_cpus(cmdline, "rcu_nocbs", rt_cpus).union(&nohz);
    let mut problems = Vec::new();
    let no_tick = rt_cpus.difference(&nohz);
    if !no_tick.is_empty() {
        problems.push(format!(
            "CPUs {no_tick} are not nohz_full (/proc/cmdline, {CPU_DIR}/nohz_full)"
        ));
    }
    let callbacks = rt_cpus.difference(&nocbs);
    if !callbacks.is_empty() {
        problems.push(format!(
            "CPUs {callbacks} are not in rcu_nocbs (/proc/cmdline): RCU callbacks run on them"
        ));
    }
    if problems.is_empty() {
        Ok(format!(
            "nohz_full {nohz} and rcu_nocbs {nocbs} cover CPUs {rt_cpus}"
        ))
    } else {
        Err(problems.join("; "))
    }
}

/// `PF_KTHREAD` in `/proc/PID/stat`'s flags.
const PF_KTHREAD: u64 = 0x0020_0000;
/// `PF_NO_SETAFFINITY`: the kernel refuses to move the thread (per-CPU
/// kthreads bound with `kthread_bind`).
const PF_NO_SETAFFINITY: u64 = 0x0400_0000;

/// One `/proc/PID/stat`: the command name, the parent pid and the flags.
#[derive(Debug, PartialEq, Eq)]
pub struct Stat {
    pub comm: String,
    pub parent: u32,
    pub flags: u64,
}

/// Parses `/proc/PID/stat` (the name may hold spaces and parentheses).
pub fn parse_stat(text: &str) -> Option<Stat> {
    let (head, tail) = text.rsplit_once(')')?;
    let comm = head.split_once('(')?.1.to_string();
    let fields: Vec<&str> = tail.split_whitespace().collect();
    Some(Stat {
        comm,
        parent: fields.get(1)?.parse().ok()?,
        flags: fields.get(6)?.parse().ok()?,
    })
}

/// `Cpus_allowed_list` of `/proc/PID/status`.
pub fn parse_cpus_allowed(status: &str) -> Option<CpuSet> {
    let list = status
        .lines()
        .find_map(|line| line.strip_prefix("Cpus_allowed_list:"))?;
    CpuSet::parse(list).ok()
}

/// A kernel thread that belongs to one CPU and cannot leave it: the kernel
/// says so (`PF_NO_SETAFFINITY`), or its name is one of the per-CPU kinds.
/// IRQ threads follow their IRQ, which `irq-affinity` judges.
pub fn is_per_cpu_kthread(comm: &str, flags: u64) -> bool {
    const PER_CPU: [&str; 8] = [
        "ksoftirqd/",
        "cpuhp/",
        "migration/",
        "rcuc/",
        "idle_inject/",
        "watchdog/",
        "posixcputmr/",
        "irq/",
    ];
    let kworker_of_cpu = comm
        .strip_prefix("kworker/")
        .and_then(|rest| rest.split_once(':'))
        .is_some_and(|(cpu, _)| !cpu.is_empty() && cpu.bytes().all(|b| b.is_ascii_digit()));
    flags & PF_NO_SETAFFINITY != 0 || kworker_of_cpu || PER_CPU.iter().any(|p| comm.starts_with(p))
}

/// Movable kernel threads must not be allowed on the RT CPUs.
fn kthread_affinity(root: &Path, rt_cpus: &CpuSet) -> Outcome {
    let Ok(entries) = std::fs::read_dir(root.join("proc")) else {
        return Err("cannot list /proc".into());
    };
    let mut pids: Vec<u32> = entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    pids.sort_unstable();
    let (mut kthreads, mut on_rt) = (0, Vec::new());
    for pid in pids {
        let Some(stat) = read(root, &format!("/proc/{pid}/stat")).and_then(|t| parse_stat(&t)) else {
            continue;
        };
        if stat.flags & PF_KTHREAD == 0 && stat.parent != 2 && pid != 2 {
            continue;
        }
        kthreads += 1;
        if is_per_cpu_kthread(&stat.comm, stat.flags) {
            continue;
        }
        let Some(allowed) = read(root, &format!("/proc/{pid}/status")).and_then(|t| parse_cpus_allowed(&t))
        else {
            continue;
        };
        if !allowed.intersection(rt_cpus).is_empty() {
            on_rt.push(format!("{}[{pid}] (cpus {allowed})", stat.comm));
        }
    }
    if on_rt.is_empty() {
        return Ok(format!(
            "{kthreads} kernel threads, none movable allowed on CPUs {rt_cpus}"
        ));
    }
    Err(format!(
        "{} movable kernel threads may run on RT CPUs {rt_cpus} (/proc/PID/status Cpus_allowed_list): {}",
        on_rt.len(),
        first_of(&on_rt, 5)
    ))
}

/// `timer_migration` must be 0; a kernel without it does not migrate timers.
pub fn timer_migration(value: Option<&str>) -> Outcome {
    match value.map(str::trim) {
        None => Ok(format!("{TIMER_MIGRATION} absent")),
        Some("0") => Ok(format!("{TIMER_MIGRATION} is 0")),
        Some(other) => Err(format!(
            "{TIMER_MIGRATION} is {other}: timers of idle CPUs move onto busy (RT) ones (write 0)"
        )),
    }
}

/// The RT CPUs whose cpufreq governor is not `performance`, if any.
pub fn governors_not_performance(
    governors: &BTreeMap<u32, Option<String>>,
    rt_cpus: &CpuSet,
) -> Option<String> {
    let slow: Vec<String> = rt_cpus
        .iter()
        .filter_map(|cpu| match governors.get(&cpu) {
            Some(Some(governor)) if governor != "performance" => Some(format!("cpu{cpu}={governor}")),
            _ => None,
        })
        .collect();
    (!slow.is_empty()).then(|| format!("cpufreq governor is not performance: {}", slow.join(", ")))
}

/// The RT CPUs run the `performance` governor (or have no cpufreq).
fn governor(root: &Path, rt_cpus: &CpuSet) -> Outcome {
    let governors = system::read_governors(root, rt_cpus);
    if let Some(problem) = governors_not_performance(&governors, rt_cpus) {
        return Err(problem);
    }
    let found: Vec<String> = governors
        .iter()
        .map(|(cpu, g)| format!("cpu{cpu}={}", g.as_deref().unwrap_or("no cpufreq")))
        .collect();
    Ok(found.join(", "))
}

/// Idle states deeper than C1 (`stateK`, K >= 2) must be disabled on the RT
/// CPUs; a CPU with no `cpuidle` directory has no idle driver and passes.
fn idle_states(root: &Path, rt_cpus: &CpuSet) -> Outcome {
    let mut enabled = Vec::new();
    let mut without_driver = Vec::new();
    for cpu in rt_cpus.iter() {
        let dir = format!("{CPU_DIR}/cpu{cpu}/cpuidle");
        let Ok(entries) = std::fs::read_dir(root.join(dir.trim_start_matches('/'))) else {
            without_driver.push(cpu.to_string());
            continue;
        };
        let mut states: Vec<u32> = entries
            .filter_map(|e| e.ok()?.file_name().to_str()?.strip_prefix("state")?.parse().ok())
            .filter(|&k| k >= 2)
            .collect();
        states.sort_unstable();
        for k in states {
            let file =
                |name: &str| read(root, &format!("{dir}/state{k}/{name}")).map(|t| t.trim().to_string());
            if file("disable").as_deref() != Some("1") {
                let name = file("name").unwrap_or_else(|| "?".into());
                enabled.push(format!("cpu{cpu} state{k} ({name})"));
            }
        }
    }
    if !enabled.is_empty() {
        return Err(format!(
            "idle states deeper than C1 enabled ({CPU_DIR}/cpuN/cpuidle/stateK/disable != 1): {}",
            enabled.join(", ")
        ));
    }
    if without_driver.is_empty() {
        Ok(format!("states >= 2 disabled on CPUs {rt_cpus}"))
    } else {
        Ok(format!(
            "states >= 2 disabled; no cpuidle on cpu {}",
            without_driver.join(",")
        ))
    }
}

/// Whether `online` (the text of `cpuM/online`, `None` when absent: cpu0 and
/// kernels without CPU hotplug) says the CPU runs.
pub fn is_online(online: Option<&str>) -> bool {
    online.is_none_or(|text| text.trim() == "1")
}

/// Every SMT sibling of an RT CPU is offline, an RT CPU itself, or isolated.
fn smt_siblings(root: &Path, rt_cpus: &CpuSet) -> Outcome {
    let isolated = read_list(root, &format!("{CPU_DIR}/isolated"));
    let mut busy = Vec::new();
    let mut with_siblings = 0;
    for cpu in rt_cpus.iter() {
        let siblings = read_list(root, &format!("{CPU_DIR}/cpu{cpu}/topology/thread_siblings_list"));
        let others = siblings.difference(&CpuSet([cpu].into_iter().collect()));
        if !others.is_empty() {
            with_siblings += 1;
        }
        for sibling in others.iter() {
            if rt_cpus.contains(sibling) || isolated.contains(sibling) {
                continue;
            }
            if is_online(read(root, &format!("{CPU_DIR}/cpu{sibling}/online")).as_deref()) {
                busy.push(format!("cpu{cpu}'s sibling cpu{sibling}"));
            }
        }
    }
    if busy.is_empty() {
        Ok(if with_siblings == 0 {
            format!("no SMT siblings of CPUs {rt_cpus}")
        } else {
            format!("SMT siblings of CPUs {rt_cpus} are offline, RT or isolated")
        })
    } else {
        Err(format!(
            "online, not isolated SMT siblings share the RT cores ({CPU_DIR}/cpuN/topology/thread_siblings_list): {}",
            busy.join(", ")
        ))
    }
}

/// `hung_task_timeout_secs` and `nmi_watchdog` absent or 0.
pub fn periodic_watchdogs(hung_task: Option<&str>, nmi_watchdog: Option<&str>) -> Outcome {
    let running: Vec<String> = [(HUNG_TASK, hung_task), (NMI_WATCHDOG, nmi_watchdog)]
        .into_iter()
        .filter_map(|(path, value)| {
            let value = value?.trim();
            (value != "0").then(|| format!("{path} is {value}"))
        })
        .collect();
    if running.is_empty() {
        Ok(format!("{HUNG_TASK} and {NMI_WATCHDOG} absent or 0"))
    } else {
        Err(format!(
            "periodic watchdog work: {} (write 0)",
            running.join(", ")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake root with the files given.
    fn tree(files: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (path, text) in files {
            let path = dir.path().join(path.trim_start_matches('/'));
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
        dir
    }

    fn cpus(list: &str) -> CpuSet {
        CpuSet::parse(list).unwrap()
    }

    /// The result of check `id` on a tree of `files`, RT CPUs `rt`.
    fn result(id: &str, rt: &str, files: &[(&str, &str)]) -> Conformance {
        let root = tree(files);
        check(root.path(), &cpus(rt))
            .into_iter()
            .find(|c| c.id == id)
            .unwrap()
    }

    fn status(id: &str, rt: &str, files: &[(&str, &str)]) -> Status {
        result(id, rt, files).status
    }

    #[test]
    fn every_check_runs_in_order_with_its_code() {
        let root = tree(&[]);
        let results = check(root.path(), &cpus("1"));
        let ids: Vec<&str> = results.iter().map(|c| c.id).collect();
        assert_eq!(ids, CHECKS.map(|c| c.0).to_vec());
        for (result, (_, code, _)) in results.iter().zip(CHECKS) {
            assert_eq!(result.code, code);
            assert_eq!(
                result.id,
                code_id(code),
                "ids and codes agree but for IRQs and governors"
            );
        }
        let table = table(&results);
        assert!(
            table.starts_with("CHECK                STATUS   DETAIL\n"),
            "{table}"
        );
        assert!(
            table.contains("\nrt-throttling        INVALID  cannot read"),
            "{table}"
        );
        for id in ids {
            assert!(table.contains(id), "{table}");
        }
    }

    fn code_id(code: ReasonCode) -> &'static str {
        match code {
            ReasonCode::IrqsOnRtCpus => "irq-affinity",
            ReasonCode::GovernorNotPerformance => "governor",
            other => other.as_str(),
        }
    }

    #[test]
    fn rt_throttling() {
        let file = "/proc/sys/kernel/sched_rt_runtime_us";
        assert_eq!(status("rt-throttling", "1", &[(file, "-1\n")]), Status::Pass);
        let bad = result("rt-throttling", "1", &[(file, "950000\n")]);
        assert_eq!(bad.status, Status::Invalid);
        assert!(bad.detail.contains("950000"), "{}", bad.detail);
        assert_eq!(status("rt-throttling", "1", &[]), Status::Invalid);
    }

    #[test]
    fn irq_affinity() {
        let good = [
            ("/proc/irq/24/effective_affinity_list", "0\n"),
            ("/proc/irq/24/smp_affinity", "1\n"),
        ];
        assert_eq!(status("irq-affinity", "1", &good), Status::Pass);
        let bad = result(
            "irq-affinity",
            "1",
            &[
                ("/proc/irq/24/effective_affinity_list", "0\n"),
                ("/proc/irq/25/effective_affinity_list", "1\n"),
                ("/proc/irq/25/smp_affinity", "3\n"),
            ],
        );
        assert_eq!(bad.status, Status::Invalid);
        assert!(bad.detail.contains("25 (cpu 1)"), "{}", bad.detail);
        // Without an smp_affinity file the IRQ cannot be moved: exempt.
        let fixed = result(
            "irq-affinity",
            "1",
            &[("/proc/irq/0/effective_affinity_list", "0-1\n")],
        );
        assert_eq!(fixed.status, Status::Pass, "{}", fixed.detail);
        assert!(
            fixed.detail.contains("1 on RT CPUs cannot be moved"),
            "{}",
            fixed.detail
        );
        // smp_affinity_list when there is no effective_affinity_list.
        let requested = [
            ("/proc/irq/26/smp_affinity_list", "1-2\n"),
            ("/proc/irq/26/smp_affinity", "6\n"),
        ];
        assert_eq!(status("irq-affinity", "1", &requested), Status::Invalid);
    }

    #[test]
    fn rcu_nocbs_and_nohz_full() {
        let cmdline = "/proc/cmdline";
        let both = [(cmdline, "quiet nohz_full=2-3 rcu_nocbs=1-3\n")];
        assert_eq!(status("rcu-nocbs-nohz-full", "2-3", &both), Status::Pass);
        // nohz_full from sysfs, and it implies rcu_nocbs.
        let sysfs = [
            (cmdline, "quiet\n"),
            ("/sys/devices/system/cpu/nohz_full", "1-3\n"),
        ];
        assert_eq!(status("rcu-nocbs-nohz-full", "2-3", &sysfs), Status::Pass);
        assert_eq!(
            status(
                "rcu-nocbs-nohz-full",
                "1",
                &[(cmdline, "nohz_full=all rcu_nocbs=all")]
            ),
            Status::Pass
        );
        let bad = result(
            "rcu-nocbs-nohz-full",
            "2-3",
            &[(cmdline, "rcu_nocbs=2-3 nohz_full=2\n")],
        );
        assert_eq!(bad.status, Status::Warn);
        assert!(bad.detail.contains("CPUs 3 are not nohz_full"), "{}", bad.detail);
        assert!(!bad.detail.contains("rcu_nocbs"), "{}", bad.detail);
        let none = result("rcu-nocbs-nohz-full", "1", &[(cmdline, "quiet")]);
        assert!(none.detail.contains("not in rcu_nocbs"), "{}", none.detail);
    }

    fn stat(pid: u32, comm: &str, ppid: u32, flags: u64) -> String {
        format!("{pid} ({comm}) S {ppid} 0 0 0 -1 {flags} 0 0 0 0 0 0 0 0 20 0 1 0 5 0 0")
    }

    #[test]
    fn kthread_affinity() {
        let kthread = PF_KTHREAD;
        let files = |allowed: &str| {
            vec![
                ("/proc/2/stat".to_string(), stat(2, "kthreadd", 0, kthread)),
                (
                    "/proc/2/status".into(),
                    "Name:\tkthreadd\nCpus_allowed_list:\t0\n".into(),
                ),
                ("/proc/15/stat".into(), stat(15, "ksoftirqd/1", 2, kthread)),
                ("/proc/15/status".into(), "Cpus_allowed_list:\t1\n".into()),
                ("/proc/16/stat".into(), stat(16, "kworker/1:0H", 2, kthread)),
                ("/proc/16/status".into(), "Cpus_allowed_list:\t1\n".into()),
                (
                    "/proc/17/stat".into(),
                    stat(17, "bound", 2, kthread | PF_NO_SETAFFINITY),
                ),
                ("/proc/17/status".into(), "Cpus_allowed_list:\t1\n".into()),
                ("/proc/30/stat".into(), stat(30, "rcu_preempt", 2, kthread)),
                (
                    "/proc/30/status".into(),
                    format!("Cpus_allowed_list:\t{allowed}\n"),
                ),
                // A user process may run anywhere.
                ("/proc/400/stat".into(), stat(400, "sshd", 1, 0x400100)),
                ("/proc/400/status".into(), "Cpus_allowed_list:\t0-3\n".into()),
            ]
        };
        let run = |allowed: &str| {
            let owned = files(allowed);
            let borrowed: Vec<(&str, &str)> = owned.iter().map(|(p, t)| (p.as_str(), t.as_str())).collect();
            result("kthread-affinity", "1", &borrowed)
        };
        let good = run("0");
        assert_eq!(good.status, Status::Pass, "{}", good.detail);
        assert!(good.detail.starts_with("5 kernel threads"), "{}", good.detail);
        let bad = run("0-3");
        assert_eq!(bad.status, Status::Warn);
        assert!(
            bad.detail.contains("rcu_preempt[30] (cpus 0-3)"),
            "{}",
            bad.detail
        );
        assert!(!bad.detail.contains("sshd") && !bad.detail.contains("ksoftirqd"));
    }

    #[test]
    fn stat_and_status_parse() {
        assert_eq!(
            parse_stat("7 (a (b) c) S 2 0 0 0 -1 69238880 0"),
            Some(Stat {
                comm: "a (b) c".into(),
                parent: 2,
                flags: 69238880
            })
        );
        assert_eq!(parse_stat("7 (x) S"), None);
        assert_eq!(
            parse_cpus_allowed("Cpus_allowed:\t3\nCpus_allowed_list:\t0-1\n"),
            Some(cpus("0-1"))
        );
        assert!(is_per_cpu_kthread("kworker/3:1-events", 0));
        assert!(!is_per_cpu_kthread("kworker/u8:2-events_unbound", 0));
        assert!(!is_per_cpu_kthread("rcuop/1", 0));
        assert!(is_per_cpu_kthread("anything", PF_NO_SETAFFINITY));
    }

    #[test]
    fn timer_migration() {
        let file = "/proc/sys/kernel/timer_migration";
        assert_eq!(status("timer-migration", "1", &[(file, "0\n")]), Status::Pass);
        assert_eq!(status("timer-migration", "1", &[]), Status::Pass);
        assert_eq!(status("timer-migration", "1", &[(file, "1\n")]), Status::Warn);
    }

    #[test]
    fn governor() {
        let file = "/sys/devices/system/cpu/cpu1/cpufreq/scaling_governor";
        assert_eq!(status("governor", "1", &[(file, "performance\n")]), Status::Pass);
        assert_eq!(status("governor", "1", &[]), Status::Pass, "no cpufreq");
        let bad = result(
            "governor",
            "1-2",
            &[
                (file, "performance\n"),
                (
                    "/sys/devices/system/cpu/cpu2/cpufreq/scaling_governor",
                    "schedutil\n",
                ),
            ],
        );
        assert_eq!(bad.status, Status::Invalid);
        assert!(bad.detail.contains("cpu2=schedutil"), "{}", bad.detail);
    }

    #[test]
    fn idle_states() {
        let base = "/sys/devices/system/cpu/cpu1/cpuidle";
        let states = |deep: &str| {
            vec![
                (format!("{base}/state0/name"), "POLL".to_string()),
                (format!("{base}/state0/disable"), "0".into()),
                (format!("{base}/state1/name"), "C1".into()),
                (format!("{base}/state1/disable"), "0".into()),
                (format!("{base}/state2/name"), "C6".into()),
                (format!("{base}/state2/disable"), "1\n".into()),
                (format!("{base}/state3/name"), "C10\n".into()),
                (format!("{base}/state3/disable"), format!("{deep}\n")),
            ]
        };
        let run = |deep: &str| {
            let owned = states(deep);
            let borrowed: Vec<(&str, &str)> = owned.iter().map(|(p, t)| (p.as_str(), t.as_str())).collect();
            result("idle-states", "1", &borrowed)
        };
        assert_eq!(run("1").status, Status::Pass);
        let bad = run("0");
        assert_eq!(bad.status, Status::Warn);
        assert!(bad.detail.contains("cpu1 state3 (C10)"), "{}", bad.detail);
        let none = result("idle-states", "1", &[]);
        assert_eq!(none.status, Status::Pass);
        assert!(none.detail.contains("no cpuidle on cpu 1"), "{}", none.detail);
    }

    #[test]
    fn smt_siblings() {
        let siblings = |cpu: u32, list: &str| {
            (
                format!("/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list"),
                list.to_string(),
            )
        };
        let run = |rt: &str, extra: &[(&str, &str)]| {
            let mut owned = vec![siblings(1, "1,5\n"), siblings(2, "2,6\n"), siblings(3, "3\n")];
            owned.extend(extra.iter().map(|(p, t)| (p.to_string(), t.to_string())));
            let borrowed: Vec<(&str, &str)> = owned.iter().map(|(p, t)| (p.as_str(), t.as_str())).collect();
            result("smt-siblings", rt, &borrowed)
        };
        assert_eq!(run("3", &[]).status, Status::Pass);
        let busy = run("1", &[("/sys/devices/system/cpu/cpu5/online", "1\n")]);
        assert_eq!(busy.status, Status::Warn);
        assert!(busy.detail.contains("cpu1's sibling cpu5"), "{}", busy.detail);
        assert_eq!(
            run("1", &[("/sys/devices/system/cpu/cpu5/online", "0\n")]).status,
            Status::Pass
        );
        assert_eq!(
            run("1-2", &[("/sys/devices/system/cpu/isolated", "5-6\n")]).status,
            Status::Pass
        );
        let one_rt_sibling = run("1,5", &[("/sys/devices/system/cpu/cpu5/online", "1\n")]);
        assert_eq!(one_rt_sibling.status, Status::Pass, "{}", one_rt_sibling.detail);
        assert!(is_online(None), "cpu0 has no online file");
    }

    #[test]
    fn periodic_watchdogs() {
        let hung = "/proc/sys/kernel/hung_task_timeout_secs";
        let nmi = "/proc/sys/kernel/nmi_watchdog";
        assert_eq!(status("periodic-watchdogs", "1", &[]), Status::Pass);
        assert_eq!(
            status("periodic-watchdogs", "1", &[(hung, "0\n"), (nmi, "0\n")]),
            Status::Pass
        );
        let bad = result("periodic-watchdogs", "1", &[(hung, "120\n"), (nmi, "0\n")]);
        assert_eq!(bad.status, Status::Warn);
        assert!(
            bad.detail.contains("hung_task_timeout_secs is 120"),
            "{}",
            bad.detail
        );
        assert_eq!(status("periodic-watchdogs", "1", &[(nmi, "1\n")]), Status::Warn);
    }

    #[test]
    fn check_exit_code() {
        let make = |status| Conformance {
            id: "x",
            code: ReasonCode::TimerMigration,
            status,
            detail: String::new(),
        };
        assert_eq!(exit_code(&[make(Status::Pass), make(Status::Warn)]), 0);
        assert_eq!(exit_code(&[make(Status::Warn), make(Status::Invalid)]), 4);
    }
}
