//! jitter on real cyclictest output, and one real run on this machine.

use std::path::{Path, PathBuf};

use assert_cmd::Command;
use jitter::cpus::CpuSet;
use jitter::cyclictest::{combine, parse_histogram, parse_json, parse_summary};

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

fn hackbench_processes() -> Vec<String> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            std::fs::read_to_string(e.path().join("comm"))
                .ok()
                .map(|c| (e.file_name(), c))
        })
        .filter(|(_, comm)| comm.trim() == "hackbench")
        .map(|(pid, _)| pid.to_string_lossy().into_owned())
        .collect()
}

/// A real 3 s run on this (virtual, generic-kernel, non-isolated) machine.
#[test]
fn real_run_here_is_invalid_with_reasons() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc_geteuid() } != 0 {
        panic!("this test runs cyclictest at RT priority and must run as root");
    }
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("report.json");
    let svg = dir.path().join("plot.svg");
    let assert = Command::cargo_bin("jitter")
        .unwrap()
        .args(["3", "--rt-cpus", "1", "--housekeeping", "0", "--json"])
        .arg(&json)
        .arg("--svg")
        .arg(&svg)
        .assert()
        .code(4);
    let table = String::from_utf8_lossy(&assert.get_output().stdout).into_owned();
    assert!(table.contains("VERDICT: INVALID"), "{table}");
    let report: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(report["schema"], "jitter-report/1");
    assert_eq!(report["assessment"]["verdict"], "INVALID");
    let codes: Vec<&str> = report["assessment"]["reasons"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["code"].as_str().unwrap())
        .collect();
    for expected in ["not-preempt-rt", "not-isolated", "hypervisor"] {
        assert!(codes.contains(&expected), "{expected} missing from {codes:?}");
    }
    assert!(
        !codes.contains(&"load-did-not-run"),
        "the load must have run: {codes:?}"
    );
    let core = &report["cores"][0];
    assert_eq!(core["cpu"], 1);
    assert!(core["samples"].as_u64().unwrap() > 1000, "{core}");
    assert!(!core["histogram"].as_array().unwrap().is_empty());
    assert!(report["run"]["load"]["hackbench_runs"].as_u64().unwrap() >= 1);
    assert!(report["run"]["load"]["io_bytes"].as_u64().unwrap() > 0);
    assert!(
        hackbench_processes().is_empty(),
        "load processes left behind: {:?}",
        hackbench_processes()
    );

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

#[test]
fn missing_cyclictest_names_rt_tests() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc_geteuid() } != 0 {
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

unsafe extern "C" {
    #[link_name = "geteuid"]
    fn libc_geteuid() -> u32;
}
