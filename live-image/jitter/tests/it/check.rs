//! `jitter --check` on this machine: every check is reported, and the exit
//! status says whether one failed at INVALID level.

use assert_cmd::Command;

const IDS: [&str; 9] = [
    "rt-throttling",
    "irq-affinity",
    "rcu-nocbs-nohz-full",
    "kthread-affinity",
    "timer-migration",
    "governor",
    "idle-states",
    "smt-siblings",
    "periodic-watchdogs",
];

/// Whether this machine has an RT and a housekeeping CPU; says why not.
fn two_cpus(test: &str) -> bool {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    if cpus < 2 {
        eprintln!("SKIPPED {test}: needs two CPUs (RT and housekeeping)");
    }
    cpus >= 2
}

fn check(args: &[&str]) -> std::process::Output {
    Command::cargo_bin("jitter")
        .unwrap()
        .arg("--check")
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn check_here_reports_every_check() {
    if !two_cpus("check_here_reports_every_check") {
        return;
    }
    let output = check(&[]);
    let table = String::from_utf8_lossy(&output.stdout);
    let code = output.status.code();
    assert!(
        matches!(code, Some(0 | 4)),
        "exit {code:?}\n{table}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let header = table.lines().nth(1).unwrap_or_default();
    assert!(
        header.split_whitespace().collect::<Vec<_>>() == ["CHECK", "STATUS", "DETAIL"],
        "{table}"
    );
    let rows: Vec<Vec<&str>> = table
        .lines()
        .skip(2)
        .map(|l| l.split_whitespace().collect())
        .collect();
    let ids: Vec<&str> = rows.iter().map(|r| r[0]).collect();
    assert_eq!(ids, IDS, "{table}");
    let statuses: Vec<&str> = rows.iter().map(|r| r[1]).collect();
    for status in &statuses {
        assert!(["PASS", "WARN", "INVALID"].contains(status), "{table}");
    }
    // The exit status follows the table: 4 exactly when a row is INVALID.
    assert_eq!(
        code == Some(4),
        statuses.contains(&"INVALID"),
        "exit {code:?}\n{table}"
    );
    // Read from the system itself: this host's RT throttling.
    let runtime = std::fs::read_to_string("/proc/sys/kernel/sched_rt_runtime_us").unwrap_or_default();
    let expected = if runtime.trim() == "-1" { "PASS" } else { "INVALID" };
    assert_eq!(statuses[0], expected, "{table}");
}

#[test]
fn check_honors_rt_cpus() {
    if !two_cpus("check_honors_rt_cpus") {
        return;
    }
    let output = check(&["--rt-cpus", "1", "--housekeeping", "0"]);
    let table = String::from_utf8_lossy(&output.stdout);
    assert_eq!(table.lines().next(), Some("RT CPUs 1"), "{table}");
    let overlap = check(&["--rt-cpus", "0", "--housekeeping", "0"]);
    assert_eq!(overlap.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&overlap.stderr);
    assert!(stderr.contains("overlap"), "{stderr}");
}

#[test]
fn bad_durations_are_usage_errors() {
    Command::cargo_bin("jitter")
        .unwrap()
        .arg("5d")
        .assert()
        .code(2)
        .stderr(predicates::str::contains("unknown unit \"d\""));
}
