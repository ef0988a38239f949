//! jitter on real cyclictest output, and one real run on this machine.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use assert_cmd::Command;
use jitter::cpus::CpuSet;
use jitter::cyclictest::{combine, parse_histogram, parse_json, parse_summary};
use rtreport::report::Progress;

fn fixture(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn histogram_text_of_rt_tests_2_4() {
    let threads = parse_histogram(&fixture("rt-tests-2.4-histogram.txt")).unwrap();
    assert_eq!(threads.len(), 2);
    // From the file: Min 10/8, Avg 15/17, Max 347/1431, Overflows 5/21, Total 9994/9945.
    assert_eq!((threads[0].min_us, threads[1].min_us), (10, 8));
    assert_eq!((threads[0].max_us, threads[1].max_us), (347, 1431));
    assert_eq!((threads[0].overflows, threads[1].overflows), (5, 21));
    assert_eq!(threads[0].samples, 9994 + 5);
    assert_eq!(threads[1].samples, 9945 + 21);
    assert_eq!(threads[0].histogram.len(), 60, "buckets 0..=59 for -h 60");
    assert!(threads[0].percentile(0.99).is_some());
}

#[test]
fn histogram_text_without_total_line_parses_the_same() {
    let with_total = parse_histogram(&fixture("rt-tests-2.4-histogram.txt")).unwrap();
    let without = parse_histogram(&fixture("rt-tests-2.7-histogram.txt")).unwrap();
    assert_eq!(with_total, without);
}

#[test]
fn json_agrees_with_the_text() {
    let text = parse_histogram(&fixture("rt-tests-2.4-histogram.txt")).unwrap();
    let json = parse_json(&fixture("rt-tests-2.4-histogram.json")).unwrap();
    assert_eq!(json.len(), 2);
    for (t, j) in text.iter().zip(&json) {
        assert_eq!(t.samples, j.samples, "cycles");
        assert_eq!(t.max_us, j.max_us);
        assert_eq!(t.overflows, j.overflows);
        assert_eq!(
            t.histogram[..j.histogram.len().min(t.histogram.len())],
            j.histogram[..j.histogram.len().min(t.histogram.len())]
        );
    }
    let combined = combine(text, Some(json), &CpuSet::parse("0-1").unwrap());
    assert_eq!(
        combined.iter().map(|t| t.cpu).collect::<Vec<_>>(),
        vec![Some(0), Some(1)]
    );
}

#[test]
fn quiet_summary() {
    let summary = parse_summary(&fixture("rt-tests-2.4-quiet.txt")).unwrap();
    assert_eq!(summary.len(), 2);
    assert_eq!((summary[0].cycles, summary[0].max_us), (4913, 89));
    assert_eq!(
        (
            summary[1].cycles,
            summary[1].min_us,
            summary[1].avg_us,
            summary[1].max_us
        ),
        (4989, 11, 17, 1421)
    );
}

/// Prints that a test skipped, past the harness's capture, so a skip is
/// never mistaken for a pass.
fn skip(test: &str, why: &str) {
    let _ = writeln!(std::io::stderr(), "SKIPPED {test}: {why}");
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc_geteuid() == 0 }
}

/// Whether a real measurement can run here (root, rt-tests, two CPUs);
/// prints why not.
fn can_measure(test: &str) -> bool {
    let missing: Vec<&str> = ["cyclictest", "hackbench"]
        .into_iter()
        .filter(|tool| !on_path(tool))
        .collect();
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let why = if !is_root() {
        "cyclictest needs root for SCHED_FIFO and mlockall".to_string()
    } else if !missing.is_empty() {
        format!("{} not installed (Debian package rt-tests)", missing.join(", "))
    } else if cpus < 2 {
        "needs two CPUs (one measured, one housekeeping)".to_string()
    } else {
        return true;
    };
    skip(test, &why);
    false
}

fn on_path(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join(program).is_file()))
}

/// Real measurements share the CPUs: one at a time.
static MEASURING: Mutex<()> = Mutex::new(());

fn measuring() -> MutexGuard<'static, ()> {
    MEASURING.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A process as `/proc/PID/stat` shows it.
#[derive(Clone, Debug, PartialEq)]
struct Process {
    pid: u32,
    parent: u32,
    comm: String,
    state: char,
    /// Start time in clock ticks: tells a reused PID apart.
    start: u64,
}

fn process(pid: u32) -> Option<Process> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (head, tail) = stat.rsplit_once(')')?;
    let comm = head.split_once('(')?.1.to_string();
    let fields: Vec<&str> = tail.split_whitespace().collect();
    Some(Process {
        pid,
        parent: fields.get(1)?.parse().ok()?,
        comm,
        state: fields.first()?.chars().next()?,
        start: fields.get(19)?.parse().ok()?,
    })
}

fn processes() -> Vec<Process> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .filter_map(process)
        .collect()
}

/// Every process below `root`, at this moment.
fn descendants(root: u32) -> Vec<Process> {
    let all = processes();
    let mut found: Vec<Process> = Vec::new();
    let mut parents = vec![root];
    while let Some(parent) = parents.pop() {
        for child in all.iter().filter(|p| p.parent == parent) {
            parents.push(child.pid);
            found.push(child.clone());
        }
    }
    found
}

/// Whether `p` still runs (a zombie has stopped running).
fn still_runs(p: &Process) -> bool {
    process(p.pid).is_some_and(|now| now.start == p.start && now.state != 'Z')
}

/// Calls `probe` every 50 ms until it returns `Some`, for at most `limit`.
fn poll<T>(limit: Duration, mut probe: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(value) = probe() {
            return Some(value);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The reasons a measurement on this machine must give, and those it must
/// not, from what the system says about itself (not from jitter's code).
fn expected_reasons() -> (Vec<&'static str>, Vec<&'static str>) {
    let read = |path: &str| std::fs::read_to_string(path).unwrap_or_default();
    let (mut present, mut absent) = (Vec::new(), Vec::new());
    let uname_rt = read("/proc/sys/kernel/version")
        .split_whitespace()
        .any(|word| word == "PREEMPT_RT");
    let config_rt = std::fs::read("/proc/config.gz").map_or(true, |gz| {
        rtcheck::ikconfig::gunzip_text(&gz)
            .is_ok_and(|config| config.lines().any(|l| l == "CONFIG_PREEMPT_RT=y"))
    });
    if uname_rt && config_rt {
        absent.push("not-preempt-rt");
    } else {
        present.push("not-preempt-rt");
    }
    let cpuid_bit = read("/proc/cpuinfo")
        .lines()
        .filter(|l| l.starts_with("flags"))
        .any(|l| l.split_whitespace().any(|flag| flag == "hypervisor"));
    let xen_style = !read("/sys/hypervisor/type").trim().is_empty();
    let detect_virt = std::process::Command::new("systemd-detect-virt")
        .output()
        .is_ok_and(|o| {
            o.status.success() && !matches!(String::from_utf8_lossy(&o.stdout).trim(), "" | "none")
        });
    if cpuid_bit || xen_style || detect_virt {
        present.push("hypervisor");
    } else {
        absent.push("hypervisor");
    }
    let isolated = CpuSet::parse(read("/sys/devices/system/cpu/isolated").trim()).unwrap_or_default();
    if !isolated.iter().any(|cpu| cpu == 1) {
        present.push("not-isolated");
    }
    absent.push("load-did-not-run");
    (present, absent)
}

/// A real 3 s run on CPU 1 of this machine: the reasons this system gives.
#[test]
fn real_run_here_reports_what_this_system_is() {
    if !can_measure("real_run_here_reports_what_this_system_is") {
        return;
    }
    let _one_at_a_time = measuring();
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("report.json");
    let svg = dir.path().join("plot.svg");
    let assert = Command::cargo_bin("jitter")
        .unwrap()
        .args(["3", "--rt-cpus", "1", "--housekeeping", "0", "--json"])
        .arg(&json)
        .arg("--svg")
        .arg(&svg)
        .assert();
    let output = assert.get_output();
    let table = String::from_utf8_lossy(&output.stdout).into_owned();
    let report: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(report["schema"], "jitter-report/2");
    // The tail's confidence covers every measured cycle.
    let samples: u64 = report["cores"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["samples"].as_u64().unwrap())
        .sum();
    assert_eq!(
        report["tail"]["cycles"].as_u64(),
        Some(samples),
        "{}",
        report["tail"]
    );
    assert!(
        table.contains("at 95 % confidence fewer than 1 miss in"),
        "{table}"
    );
    let codes: Vec<&str> = report["assessment"]["reasons"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["code"].as_str().unwrap())
        .collect();
    let (present, absent) = expected_reasons();
    for expected in &present {
        assert!(codes.contains(expected), "{expected} missing from {codes:?}");
    }
    for unexpected in &absent {
        assert!(!codes.contains(unexpected), "{unexpected} in {codes:?}");
    }
    let verdict = report["assessment"]["verdict"].as_str().unwrap();
    let code = output.status.code();
    match verdict {
        "PASS" => assert_eq!(code, Some(0)),
        "FAIL" => assert_eq!(code, Some(3)),
        "INVALID" => assert_eq!(code, Some(4)),
        other => panic!("verdict {other}"),
    }
    assert!(table.contains(&format!("VERDICT: {verdict}")), "{table}");
    if !present.is_empty() {
        assert_eq!(verdict, "INVALID", "{codes:?}");
    }
    let core = &report["cores"][0];
    assert_eq!(core["cpu"], 1);
    assert!(core["samples"].as_u64().unwrap() > 1000, "{core}");
    assert!(!core["histogram"].as_array().unwrap().is_empty());
    assert!(report["run"]["load"]["hackbench_runs"].as_u64().unwrap() >= 1);
    assert!(report["run"]["load"]["io_bytes"].as_u64().unwrap() > 0);
    let left: Vec<Process> = processes()
        .into_iter()
        .filter(|p| p.comm == "hackbench" && p.state != 'Z')
        .collect();
    assert!(left.is_empty(), "load processes left behind: {left:?}");

    // The SVG is well formed and has one series per core.
    let text = std::fs::read_to_string(&svg).unwrap();
    let doc = roxmltree::Document::parse(&text).expect("well-formed SVG");
    assert_eq!(doc.root_element().tag_name().name(), "svg");
    let labels: Vec<&str> = doc
        .descendants()
        .filter(|n| n.tag_name().name() == "text")
        .filter_map(|n| n.text())
        .map(str::trim)
        .filter(|t| t.starts_with("cpu "))
        .collect();
    assert_eq!(labels, vec!["cpu 1"]);
}

/// `--progress` on a real 7 s run: a line at 2, 4 and 6 s on stderr, with
/// cyclictest's worst case once it has reported one, and the report as
/// without it.
#[test]
fn progress_lines_while_measuring() {
    if !can_measure("progress_lines_while_measuring") {
        return;
    }
    let _one_at_a_time = measuring();
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("report.json");
    let assert = Command::cargo_bin("jitter")
        .unwrap()
        .args([
            "7",
            "--rt-cpus",
            "1",
            "--housekeeping",
            "0",
            "--progress",
            "--json",
        ])
        .arg(&json)
        .assert();
    let output = assert.get_output();
    let stderr = String::from_utf8_lossy(&output.stderr);
    let lines: Vec<Progress> = stderr.lines().filter_map(Progress::parse).collect();
    let elapsed: Vec<(u64, u64)> = lines.iter().map(|p| (p.elapsed_s, p.total_s)).collect();
    assert_eq!(elapsed, [(2, 7), (4, 7), (6, 7)], "{stderr}");
    assert!(lines[1].worst_us.is_some(), "no worst case by 4 s: {stderr}");
    let worst: Vec<u64> = lines.iter().filter_map(|p| p.worst_us).collect();
    assert!(worst.is_sorted(), "the worst case so far went down: {stderr}");
    assert!(!stderr.contains("cyclictest current status"), "{stderr}");
    let report: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let max_us = report["cores"][0]["max_us"].as_u64().unwrap();
    assert!(worst.last().unwrap() <= &max_us, "{max_us} {stderr}");
}

/// Files in the shared temporary directories whose names carry jitter's PID
/// (`jitter-io-PID`, `jitter-cyclictest-PID.json`): a local user can
/// create them first, as symlinks, and have root write through them.
fn predictably_named_files(pid: u32) -> Vec<PathBuf> {
    [Path::new("/dev/shm").to_path_buf(), std::env::temp_dir()]
        .iter()
        .filter_map(|dir| std::fs::read_dir(dir).ok())
        .flatten()
        .filter_map(|entry| entry.ok())
        .filter(|entry| {
            let name = entry.file_name().to_string_lossy().into_owned();
            name.starts_with("jitter") && name.contains(&pid.to_string())
        })
        .map(|entry| entry.path())
        .collect()
}

/// `kill -9` of jitter takes cyclictest (FIFO 99), hackbench and hackbench's
/// workers with it.
#[test]
fn a_killed_jitter_leaves_no_load_or_cyclictest() {
    if !can_measure("a_killed_jitter_leaves_no_load_or_cyclictest") {
        return;
    }
    let _one_at_a_time = measuring();
    let mut jitter = std::process::Command::new(env!("CARGO_BIN_EXE_jitter"))
        .args(["120", "--rt-cpus", "1", "--housekeeping", "0"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let everything_runs = |tree: &[Process]| {
        let runs = |name: &str| tree.iter().any(|p| p.comm == name);
        // hackbench with workers: more than one hackbench in the tree.
        runs("cyclictest") && tree.iter().filter(|p| p.comm == "hackbench").count() > 1
    };
    let tree = poll(Duration::from_secs(30), || {
        Some(descendants(jitter.id())).filter(|tree| everything_runs(tree))
    });
    let Some(tree) = tree else {
        let _ = jitter.kill();
        panic!("jitter did not start cyclictest and hackbench within 30 s");
    };
    let predictable = predictably_named_files(jitter.id());
    jitter.kill().unwrap();
    jitter.wait().unwrap();
    assert!(
        predictable.is_empty(),
        "files an attacker could have planted: {predictable:?}"
    );
    let gone = poll(Duration::from_secs(10), || {
        let left: Vec<&Process> = tree.iter().filter(|p| still_runs(p)).collect();
        left.is_empty().then_some(())
    });
    let left: Vec<&Process> = tree.iter().filter(|p| still_runs(p)).collect();
    assert!(
        gone.is_some(),
        "still running 10 s after jitter was killed: {left:?}"
    );
}

/// An output path that cannot be written fails before the measurement.
#[test]
fn unwritable_outputs_fail_before_measuring() {
    // Were the check missing, these would measure.
    let _one_at_a_time = measuring();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    std::fs::write(&file, "").unwrap();
    let good = dir.path().join("report.json");
    let bad = [
        dir.path().join("missing/report.json"),
        file.join("report.json"),
        dir.path().to_path_buf(),
    ];
    for option in ["--json", "--svg", "--save-cyclictest"] {
        for path in &bad {
            let started = Instant::now();
            let mut command = Command::cargo_bin("jitter").unwrap();
            if option != "--json" {
                command.arg("--json").arg(&good);
            }
            command
                .args(["60", "--rt-cpus", "1", "--housekeeping", "0", option])
                .arg(path)
                .timeout(Duration::from_secs(30))
                .assert()
                .code(1)
                .stderr(predicates::str::contains(path.display().to_string()));
            assert!(started.elapsed() < Duration::from_secs(30));
            assert!(
                !good.exists(),
                "{option} {}: left an empty report",
                path.display()
            );
        }
    }
}

#[test]
fn usage_errors_exit_2() {
    Command::cargo_bin("jitter")
        .unwrap()
        .arg("--rt-cpus")
        .arg("x-y")
        .assert()
        .code(2);
    Command::cargo_bin("jitter").unwrap().arg("0").assert().code(2);
    Command::cargo_bin("jitter")
        .unwrap()
        .args(["--priority", "120"])
        .assert()
        .code(2);
}

/// A hostile checkpoint (priority 1000, as no command line may give) is
/// refused with its file and field named, exit 1, before anything runs.
#[test]
fn a_checkpoint_outside_the_command_line_ranges_is_refused_naming_the_field() {
    use jitter::checkpoint::{Checkpoint, SoakOptions};
    let dir = tempfile::tempdir().unwrap();
    let mut checkpoint = Checkpoint::new(SoakOptions {
        duration_s: 40,
        budget_us: 100,
        rt_cpus: CpuSet::parse("1").unwrap(),
        housekeeping: CpuSet::parse("0").unwrap(),
        interval_us: 200,
        priority: 1000,
        no_load: false,
        histogram_max_us: 1000,
        checkpoint_every_s: 5,
    });
    checkpoint.start_segment(5);
    checkpoint.write(dir.path()).unwrap();
    let refused = Command::cargo_bin("jitter")
        .unwrap()
        .arg("--resume")
        .arg(dir.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(1), "{stderr}");
    let file = dir.path().join("checkpoint.json");
    assert!(
        stderr.contains(&format!(
            "cannot resume: {} holds options.priority = 1000; --priority takes 1 to 99",
            file.display()
        )),
        "{stderr}"
    );
}

#[test]
fn missing_cyclictest_names_rt_tests() {
    if !is_root() {
        skip(
            "missing_cyclictest_names_rt_tests",
            "jitter checks for root before it looks for cyclictest",
        );
        return;
    }
    let empty: PathBuf = tempfile::tempdir().unwrap().keep();
    Command::cargo_bin("jitter")
        .unwrap()
        .env("PATH", &empty)
        .args(["1", "--rt-cpus", "1", "--housekeeping", "0"])
        .assert()
        .code(1)
        .stderr(predicates::str::contains("install the Debian package rt-tests"));
}

#[test]
fn missing_rtla_names_its_package() {
    if !is_root() {
        skip(
            "missing_rtla_names_its_package",
            "jitter checks for root before it looks for rtla",
        );
        return;
    }
    let empty: PathBuf = tempfile::tempdir().unwrap().keep();
    Command::cargo_bin("jitter")
        .unwrap()
        .env("PATH", &empty)
        .args(["1", "--tool", "timerlat", "--rt-cpus", "1", "--housekeeping", "0"])
        .assert()
        .code(1)
        .stderr(predicates::str::contains(
            "`rtla` is not installed: install the Debian package rtla",
        ))
        .stderr(predicates::str::contains("bookworm-backports"));
}

/// On a machine without a usable timerlat (this host: no rtla, Debian 12's
/// rtla 6.1 without auto-analysis, or a kernel without the tracer), jitter
/// refuses before measuring, names which, and writes no report.
#[test]
fn timerlat_without_a_usable_rtla_is_refused_before_measuring() {
    if !is_root() {
        skip(
            "timerlat_without_a_usable_rtla_is_refused_before_measuring",
            "needs root",
        );
        return;
    }
    let tracers = std::fs::read_to_string("/sys/kernel/tracing/available_tracers").unwrap_or_default();
    if on_path("rtla") && tracers.split_whitespace().any(|t| t == "timerlat") {
        skip(
            "timerlat_without_a_usable_rtla_is_refused_before_measuring",
            "this machine has rtla and the timerlat tracer (the live image tier measures with them)",
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("report.json");
    let output = Command::cargo_bin("jitter")
        .unwrap()
        .args([
            "1",
            "--tool",
            "timerlat",
            "--rt-cpus",
            "1",
            "--housekeeping",
            "0",
            "--json",
        ])
        .arg(&json)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    let named = [
        "install the Debian package rtla",
        "no timerlat auto-analysis",
        "no timerlat tracer",
    ];
    assert!(named.iter().any(|n| stderr.contains(n)), "{stderr}");
    assert!(!json.exists(), "a report was written");
}

unsafe extern "C" {
    #[link_name = "geteuid"]
    fn libc_geteuid() -> u32;
}

/// The checkpoint's `elapsed_s`, once it reads.
fn checkpoint_elapsed(dir: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(dir.join("checkpoint.json")).ok()?;
    let value: serde_json::Value = serde_json::from_str(&text).ok()?;
    value["elapsed_s"].as_u64()
}

/// A real 40 s soak checkpointed every 5 s, killed with SIGKILL after three
/// checkpoints and resumed: the report covers both runs, and the killed
/// run leaves no load or cyclictest behind.
#[test]
fn a_killed_soak_resumes_to_the_full_duration() {
    if !can_measure("a_killed_soak_resumes_to_the_full_duration") {
        return;
    }
    let _one_at_a_time = measuring();
    let dir = tempfile::tempdir().unwrap();
    let soak = dir.path().join("soak");
    let json = dir.path().join("report.json");
    let mut jitter = std::process::Command::new(env!("CARGO_BIN_EXE_jitter"))
        .args([
            "40s",
            "--checkpoint-every",
            "5s",
            "--rt-cpus",
            "1",
            "--housekeeping",
            "0",
        ])
        .arg("--checkpoint-dir")
        .arg(&soak)
        .arg("--json")
        .arg(&json)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut tree = Vec::new();
    let checkpointed = poll(Duration::from_secs(60), || {
        // The load and cyclictest as they run, to check they die with jitter.
        for p in descendants(jitter.id()) {
            if !tree.contains(&p) {
                tree.push(p);
            }
        }
        checkpoint_elapsed(&soak).filter(|elapsed| *elapsed >= 15)
    });
    jitter.kill().unwrap();
    jitter.wait().unwrap();
    let killed_at = checkpointed.expect("no third checkpoint within 60 s");
    assert!(killed_at < 40, "{killed_at}");
    // The killed run created its report file (an output is opened before
    // measuring) but never wrote it.
    let written = std::fs::read(&json).unwrap_or_default();
    assert!(written.is_empty(), "the killed run wrote a report");
    assert!(tree.iter().any(|p| p.comm == "hackbench"), "{tree:?}");
    let gone = poll(Duration::from_secs(10), || {
        tree.iter().all(|p| !still_runs(p)).then_some(())
    });
    let left: Vec<&Process> = tree.iter().filter(|p| still_runs(p)).collect();
    assert!(
        gone.is_some(),
        "still running 10 s after the soak was killed: {left:?}"
    );

    let resumed = Command::cargo_bin("jitter")
        .unwrap()
        .arg("--resume")
        .arg(&soak)
        .arg("--progress")
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&resumed.stderr);
    assert!(
        [0, 3, 4].contains(&resumed.status.code().unwrap()),
        "{:?}: {stderr}",
        resumed.status
    );
    let progress: Vec<Progress> = stderr.lines().filter_map(Progress::parse).collect();
    assert!(
        progress
            .iter()
            .all(|p| p.total_s == 40 && p.elapsed_s >= killed_at && p.samples.is_some()),
        "{stderr}"
    );
    assert!(!progress.is_empty(), "{stderr}");
    let report: rtreport::report::Report =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let soak_info = report.soak.as_ref().expect("a soak report");
    assert_eq!(soak_info.segments.len(), 2, "{soak_info:?}");
    assert_eq!(soak_info.gaps_s.len(), 1, "{soak_info:?}");
    let samples: u64 = report.cores.iter().map(|c| c.samples).sum();
    let per_segment: u64 = soak_info.segments.iter().map(|s| s.samples).sum();
    assert_eq!(samples, per_segment, "{soak_info:?}");
    let seconds: u64 = soak_info.segments.iter().map(|s| s.seconds).sum();
    assert!(
        (35..=40).contains(&seconds),
        "{seconds} s measured: {soak_info:?}"
    );
    assert_eq!(report.run.duration_s, 40);
    assert!(soak_info.segments[0].seconds >= killed_at, "{soak_info:?}");
    assert!(report.tail.is_some());
    // 40 s is one minute of measured time: its worst case is the soak's.
    let minutes: Vec<(u64, u64)> = soak_info
        .per_minute_max
        .iter()
        .map(|m| (m.end_s, m.max_us))
        .collect();
    assert_eq!(minutes, [(seconds, report.assessment.worst_us)], "{soak_info:?}");
    // 40 s at 200 µs on one core: about 200000 samples.
    assert!(samples > 150_000, "{samples}");

    // A damaged checkpoint is refused, before measuring.
    std::fs::write(
        soak.join("checkpoint.json"),
        "{\"version\": \"jitter-checkpoint/1\", \"elaps",
    )
    .unwrap();
    let refused = Command::cargo_bin("jitter")
        .unwrap()
        .arg("--resume")
        .arg(&soak)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("cannot resume") && stderr.contains("corrupt"),
        "{stderr}"
    );
    let missing = Command::cargo_bin("jitter")
        .unwrap()
        .arg("--resume")
        .arg(dir.path().join("nothing"))
        .output()
        .unwrap();
    assert_eq!(missing.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("no checkpoint"));
}
