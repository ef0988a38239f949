//! Running cyclictest (rt-tests) and parsing what it prints.
//!
//! Supported output: the `-h` histogram text of rt-tests 2.4 (Debian 12) and
//! later (2.7 dropped the `# Total:` line, so totals are computed here), the
//! `-q` summary lines, the status lines it prints on stderr on SIGUSR1, and
//! the `--json` file where the installed version has it.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use tempfile::NamedTempFile;

use crate::child::die_with_jitter;
use crate::cpus::CpuSet;
use crate::process::{MissingTool, StderrReader, hint_privileges, run_tool};
use crate::progress::{LiveWorst, SoakSoFar};

/// How cyclictest is run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunParams {
    pub duration_s: u64,
    pub interval_us: u32,
    pub priority: u32,
    pub rt_cpus: CpuSet,
    pub housekeeping: CpuSet,
    pub histogram_max_us: u32,
}

/// The command line: one measuring thread per RT CPU (`-a` and `-t` explicit,
/// so isolated CPUs are measured), all at the same interval (`-d 0`), the main
/// thread on the housekeeping CPUs.
pub fn arguments(params: &RunParams, json_file: Option<&Path>) -> Vec<String> {
    let mut args = vec![
        "-m".to_string(),
        "-q".to_string(),
        format!("-p{}", params.priority),
        format!("-i{}", params.interval_us),
        "-d0".to_string(),
        format!("-D{}", params.duration_s),
        format!("-a{}", params.rt_cpus),
        format!("-t{}", params.rt_cpus.len()),
        format!("--mainaffinity={}", params.housekeeping),
        format!("-h{}", params.histogram_max_us),
    ];
    if let Some(file) = json_file {
        args.push(format!("--json={}", file.display()));
    }
    args
}

/// What cyclictest printed, and its `--json` file's text if it wrote one.
pub(crate) struct CyclictestOutput {
    pub stdout: String,
    pub json: Option<String>,
}

/// Runs cyclictest to its end (see [`run_tool`]).
pub(crate) fn run_cyclictest(
    args: &[String],
    json_file: Option<&Path>,
    housekeeping: &CpuSet,
    progress: Option<(u64, Option<SoakSoFar>)>,
) -> Result<CyclictestOutput> {
    run_cyclictest_as(
        Command::new("cyclictest").args(args),
        MissingTool::rt_tests("cyclictest"),
        (json_file, housekeeping),
        progress,
    )
}

/// Runs `command`, which runs cyclictest (in a container), to its end from
/// the housekeeping CPUs, without progress; what cyclictest printed.
pub(crate) fn run_tool_to_end(
    command: &mut Command,
    missing: MissingTool,
    housekeeping: &CpuSet,
) -> Result<String> {
    Ok(run_cyclictest_as(command, missing, (None, housekeeping), None)?.stdout)
}

fn run_cyclictest_as(
    command: &mut Command,
    missing: MissingTool,
    (json_file, housekeeping): (Option<&Path>, &CpuSet),
    progress: Option<(u64, Option<SoakSoFar>)>,
) -> Result<CyclictestOutput> {
    let worst = LiveWorst::default();
    let recorder = worst.clone();
    let stderr_reader: StderrReader =
        Box::new(move |pipe| read_stderr(BufReader::new(pipe), |max| recorder.record(max)));
    let output = run_tool(command, missing, housekeeping, progress, (worst, stderr_reader));
    let output = match output {
        Ok(output) => output,
        Err(error) => return Err(hint_privileges(error)),
    };
    let lower = output.stderr.to_lowercase();
    if lower.contains("mlockall")
        || lower.contains("unable to change scheduling policy")
        || lower.contains("permission denied")
    {
        return Err(hint_privileges(anyhow::anyhow!(
            "cyclictest could not lock memory or get RT priority: {}",
            output.stderr.trim()
        )));
    }
    let json = json_file.and_then(|f| std::fs::read_to_string(f).ok());
    Ok(CyclictestOutput {
        stdout: output.stdout,
        json,
    })
}

fn supports_json() -> bool {
    die_with_jitter(&mut Command::new("cyclictest"))
        .arg("--help")
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout).contains("--json")
                || String::from_utf8_lossy(&o.stderr).contains("--json")
        })
        .unwrap_or(false)
}

/// A file with an unpredictable name for cyclictest's `--json`, when the
/// installed cyclictest has it; removed when dropped.
pub(crate) fn cyclictest_json_file() -> Result<Option<NamedTempFile>> {
    if !supports_json() {
        return Ok(None);
    }
    let file = tempfile::Builder::new()
        .prefix("jitter-cyclictest-")
        .suffix(".json")
        .tempfile()
        .context("creating a temporary file for cyclictest's JSON")?;
    Ok(Some(file))
}

/// The results of one measuring thread.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ThreadResult {
    pub thread: usize,
    /// The CPU it ran on, when cyclictest says so (JSON); else from `-a` order.
    pub cpu: Option<u32>,
    pub samples: u64,
    pub min_us: u64,
    pub avg_us: f64,
    pub max_us: u64,
    /// Samples beyond the histogram's last bucket.
    pub overflows: u64,
    /// `histogram[n]` = samples with latency `n` µs.
    pub histogram: Vec<u64>,
}

impl ThreadResult {
    /// The latency below which `fraction` of the samples fall; `None` when it
    /// lies in the overflow (beyond the histogram).
    pub fn percentile(&self, fraction: f64) -> Option<u64> {
        let total = self.histogram.iter().sum::<u64>() + self.overflows;
        if total == 0 {
            return None;
        }
        let wanted = ((total as f64) * fraction).ceil() as u64;
        let mut seen = 0;
        for (latency, count) in self.histogram.iter().enumerate() {
            seen += count;
            if seen >= wanted {
                return Some(latency as u64);
            }
        }
        None
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error("no cyclictest histogram in the output")]
    NoHistogram,
    #[error("line {line}: {message}")]
    Malformed { line: usize, message: String },
    #[error("cyclictest JSON: {0}")]
    Json(String),
}

fn numbers(text: &str, line: usize) -> Result<Vec<u64>, ParseError> {
    text.split_whitespace()
        .map(|n| {
            n.parse::<u64>().map_err(|_| ParseError::Malformed {
                line,
                message: format!("{n:?} is not a number"),
            })
        })
        .collect()
}

/// The largest histogram bucket accepted (1 s); cyclictest's `-h` is in µs.
const MAX_BUCKET: u64 = 1_000_000;

/// Parses the `-h` histogram output (with or without `# Total:`).
pub fn parse_histogram(text: &str) -> Result<Vec<ThreadResult>, ParseError> {
    let mut rows: Vec<Vec<u64>> = Vec::new();
    let mut stats: BTreeMap<&str, (usize, Vec<u64>)> = BTreeMap::new();
    let mut in_histogram = false;
    for (index, raw) in text.lines().enumerate() {
        let line = index + 1;
        let trimmed = raw.trim();
        if trimmed == "# Histogram" {
            in_histogram = true;
            continue;
        }
        if let Some(comment) = trimmed.strip_prefix('#') {
            for label in [
                "Min Latencies:",
                "Avg Latencies:",
                "Max Latencies:",
                "Histogram Overflows:",
            ] {
                if let Some(rest) = comment.trim().strip_prefix(label) {
                    stats.insert(label, (line, numbers(rest, line)?));
                }
            }
            continue;
        }
        if in_histogram && trimmed.bytes().next().is_some_and(|b| b.is_ascii_digit()) {
            let row = numbers(trimmed, line)?;
            if row.len() < 2 {
                return Err(ParseError::Malformed {
                    line,
                    message: "a histogram row needs a latency and counts".into(),
                });
            }
            if row[0] > MAX_BUCKET {
                return Err(ParseError::Malformed {
                    line,
                    message: format!("latency bucket {} is out of range", row[0]),
                });
            }
            if rows.first().is_some_and(|first| first.len() != row.len()) {
                return Err(ParseError::Malformed {
                    line,
                    message: "histogram rows have different column counts".into(),
                });
            }
            rows.push(row);
        }
    }
    let threads = rows.first().map(|r| r.len() - 1).ok_or(ParseError::NoHistogram)?;
    let mut results: Vec<ThreadResult> = (0..threads)
        .map(|thread| ThreadResult {
            thread,
            ..Default::default()
        })
        .collect();
    let max_latency = rows.iter().map(|r| r[0]).max().unwrap_or(0) as usize;
    for result in &mut results {
        result.histogram = vec![0; max_latency + 1];
    }
    for row in &rows {
        for (thread, count) in row[1..].iter().enumerate() {
            results[thread].histogram[row[0] as usize] += count;
        }
    }
    let mut column = |label: &str| -> Result<Option<Vec<u64>>, ParseError> {
        match stats.remove(label) {
            None => Ok(None),
            Some((line, values)) if values.len() != threads => Err(ParseError::Malformed {
                line,
                message: format!("{label} has {} values for {threads} threads", values.len()),
            }),
            Some((_, values)) => Ok(Some(values)),
        }
    };
    let overflows = column("Histogram Overflows:")?;
    let mins = column("Min Latencies:")?;
    let avgs = column("Avg Latencies:")?;
    let maxes = column("Max Latencies:")?;
    for (t, result) in results.iter_mut().enumerate() {
        result.overflows = overflows.as_ref().map_or(0, |v| v[t]);
        result.samples = result.histogram.iter().sum::<u64>() + result.overflows;
        let first = result.histogram.iter().position(|&c| c > 0).unwrap_or(0) as u64;
        let last = result.histogram.iter().rposition(|&c| c > 0).unwrap_or(0) as u64;
        result.min_us = mins.as_ref().map_or(first, |v| v[t]);
        result.max_us = maxes.as_ref().map_or(last, |v| v[t]);
        result.avg_us = match &avgs {
            Some(v) => v[t] as f64,
            None => {
                let in_hist: u64 = result.histogram.iter().sum();
                let weighted: u64 = result
                    .histogram
                    .iter()
                    .enumerate()
                    .map(|(l, c)| l as u64 * c)
                    .sum();
                if in_hist == 0 {
                    0.0
                } else {
                    weighted as f64 / in_hist as f64
                }
            }
        };
    }
    Ok(results)
}

/// One `-q` summary line: `T: 0 ( 1234) P:99 I:200 C: 4913 Min: 11 Act: 15 Avg: 16 Max: 89`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub thread: usize,
    pub cycles: u64,
    pub min_us: u64,
    pub avg_us: u64,
    pub max_us: u64,
}

pub fn parse_summary(text: &str) -> Result<Vec<Summary>, ParseError> {
    let mut out = Vec::new();
    for (index, raw) in text.lines().enumerate() {
        let line = index + 1;
        let Some(rest) = raw.trim().strip_prefix("T:") else {
            continue;
        };
        let field = |name: &str| -> Result<u64, ParseError> {
            let after = rest.split(name).nth(1).ok_or_else(|| ParseError::Malformed {
                line,
                message: format!("summary line has no {name}"),
            })?;
            let value = after.split_whitespace().next().unwrap_or_default();
            value.parse().map_err(|_| ParseError::Malformed {
                line,
                message: format!("{name} {value:?} is not a number"),
            })
        };
        let thread = rest
            .split_whitespace()
            .next()
            .and_then(|t| t.parse().ok())
            .ok_or_else(|| ParseError::Malformed {
                line,
                message: "summary line has no thread number".into(),
            })?;
        out.push(Summary {
            thread,
            cycles: field(" C:")?,
            min_us: field("Min:")?,
            avg_us: field("Avg:")?,
            max_us: field("Max:")?,
        });
    }
    Ok(out)
}

/// The lines around the per-thread status lines cyclictest prints on stderr
/// when it receives SIGUSR1.
const STATUS_FRAME: [&str; 2] = ["#---------------------------", "# cyclictest current status:"];

/// The worst latency so far in one of the status lines cyclictest prints on
/// SIGUSR1 (the `-q` summary line form); `None` for any other line, and for
/// a thread that has not measured a cycle yet (its `Max:` is then 0).
pub fn status_max(line: &str) -> Option<u64> {
    let [summary] = <[Summary; 1]>::try_from(parse_summary(line).ok()?).ok()?;
    (summary.cycles > 0).then_some(summary.max_us)
}

fn is_status(line: &str) -> bool {
    let line = line.trim();
    line.starts_with("T:") || STATUS_FRAME.contains(&line)
}

/// Reads cyclictest's stderr to its end, whatever its bytes: stopping early
/// would kill cyclictest with SIGPIPE at its next status print. Passes the
/// worst latency of each status line to `on_max`; returns everything else
/// (its warnings and errors).
pub fn read_stderr(mut stderr: impl BufRead, mut on_max: impl FnMut(u64)) -> String {
    let mut kept = String::new();
    let mut bytes = Vec::new();
    // read_until retries when interrupted; another error ends the pipe.
    while stderr.read_until(b'\n', &mut bytes).is_ok_and(|read| read > 0) {
        let line = String::from_utf8_lossy(&bytes);
        if let Some(max) = status_max(&line) {
            on_max(max);
        }
        if !is_status(&line) {
            kept.push_str(&line);
        }
        bytes.clear();
    }
    kept
}

/// Parses the `--json` file. Its histogram has no overflow bucket: overflows
/// are the cycles the histogram does not account for.
pub fn parse_json(text: &str) -> Result<Vec<ThreadResult>, ParseError> {
    let doc: serde_json::Value = serde_json::from_str(text).map_err(|e| ParseError::Json(e.to_string()))?;
    let threads = doc
        .get("thread")
        .and_then(|t| t.as_object())
        .ok_or_else(|| ParseError::Json("no `thread` object".into()))?;
    let mut results = Vec::new();
    for (key, value) in threads {
        let thread: usize = key
            .parse()
            .map_err(|_| ParseError::Json(format!("thread key {key:?}")))?;
        let number = |name: &str| value.get(name).and_then(|v| v.as_f64());
        let mut histogram = Vec::new();
        if let Some(buckets) = value.get("histogram").and_then(|h| h.as_object()) {
            for (latency, count) in buckets {
                let latency: usize = latency
                    .parse()
                    .map_err(|_| ParseError::Json(format!("bucket {latency:?}")))?;
                let count = count
                    .as_u64()
                    .ok_or_else(|| ParseError::Json(format!("bucket {latency} count")))?;
                if latency as u64 > MAX_BUCKET {
                    return Err(ParseError::Json(format!("bucket {latency} is out of range")));
                }
                if histogram.len() <= latency {
                    histogram.resize(latency + 1, 0);
                }
                histogram[latency] += count;
            }
        }
        let cycles = number("cycles")
            .ok_or_else(|| ParseError::Json(format!("thread {thread} has no cycles")))?
            as u64;
        let in_hist: u64 = histogram.iter().sum();
        results.push(ThreadResult {
            thread,
            cpu: number("cpu").map(|c| c as u32),
            samples: cycles,
            min_us: number("min").unwrap_or(0.0) as u64,
            avg_us: number("avg").unwrap_or(0.0),
            max_us: number("max").unwrap_or(0.0) as u64,
            overflows: cycles.saturating_sub(in_hist),
            histogram,
        });
    }
    results.sort_by_key(|r| r.thread);
    Ok(results)
}

/// Combines the text histogram with the JSON (which knows each thread's
/// CPU); without JSON, threads map to the RT CPUs in `-a` order.
pub fn combine(
    mut text: Vec<ThreadResult>,
    json: Option<Vec<ThreadResult>>,
    rt_cpus: &CpuSet,
) -> Vec<ThreadResult> {
    let by_order: Vec<u32> = rt_cpus.iter().collect();
    for result in &mut text {
        let from_json = json
            .as_ref()
            .and_then(|j| j.iter().find(|r| r.thread == result.thread))
            .and_then(|r| r.cpu);
        result.cpu = from_json.or_else(|| by_order.get(result.thread).copied());
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_pin_every_rt_cpu() {
        let params = RunParams {
            duration_s: 300,
            interval_us: 200,
            priority: 99,
            rt_cpus: CpuSet::parse("1-3").unwrap(),
            housekeeping: CpuSet::parse("0").unwrap(),
            histogram_max_us: 1000,
        };
        let args = arguments(&params, Some(Path::new("/tmp/x.json")));
        assert_eq!(
            args,
            [
                "-m",
                "-q",
                "-p99",
                "-i200",
                "-d0",
                "-D300",
                "-a1-3",
                "-t3",
                "--mainaffinity=0",
                "-h1000",
                "--json=/tmp/x.json"
            ]
        );
    }

    #[test]
    fn percentiles() {
        let mut result = ThreadResult {
            histogram: vec![0, 90, 9, 1],
            ..Default::default()
        };
        assert_eq!(result.percentile(0.5), Some(1));
        assert_eq!(result.percentile(0.99), Some(2));
        assert_eq!(result.percentile(0.999), Some(3));
        result.overflows = 5;
        assert_eq!(result.percentile(0.999), None);
        assert_eq!(ThreadResult::default().percentile(0.99), None);
    }

    #[test]
    fn garbage_is_an_error() {
        assert_eq!(parse_histogram("hello\nworld\n"), Err(ParseError::NoHistogram));
        assert!(matches!(
            parse_histogram("# Histogram\n000001 12 x\n"),
            Err(ParseError::Malformed { line: 2, .. })
        ));
        assert!(matches!(
            parse_histogram("# Histogram\n000001 1 2\n000002 1\n"),
            Err(ParseError::Malformed { line: 3, .. })
        ));
        assert!(matches!(
            parse_histogram("# Histogram\n000001 1 2\n# Max Latencies: 00001\n"),
            Err(ParseError::Malformed { line: 3, .. })
        ));
        assert!(parse_json("{").is_err());
        assert!(parse_json("{\"thread\": {\"0\": {}}}").is_err());
        assert!(parse_summary("T: x").is_err());
    }

    #[test]
    fn status_lines_give_their_worst_case() {
        // As rt-tests 2.4 prints them on SIGUSR1.
        let line = "T: 0 ( 5951) P:99 I:200 C:   6318 Min:      9 Act:   15 Avg:   19 Max:     407\n";
        assert_eq!(status_max(line), Some(407));
        assert_eq!(
            status_max("T:12 ( 1234) P:99 I:200 C:   1000 Min:  3 Act:  5 Avg:  4 Max:  42\r"),
            Some(42)
        );
        assert_eq!(
            status_max("T: 0 ( 5951) P:99 I:200 C:      0 Min:1000000 Act:    0 Avg:    0 Max:       0"),
            None,
            "no cycle measured yet"
        );
        for other in [
            "",
            "#---------------------------",
            "# cyclictest current status:",
            "# Max Latencies: 00407",
            "WARN: distance is ignored and set to 0, if histogram enabled",
            "T: 0 ( 5951) P:99 I:200 C:   6318 Min:      9 Act:   15 Avg:   19 Max:",
            "T: 0 ( 5951) P:99 I:200 C:   6318 Min:      9 Act:   15 Avg:   19 Max: x",
            "T: 0 ( 1) C: 1 Min: 1 Avg: 1 Max: 1\nT: 1 ( 2) C: 1 Min: 1 Avg: 1 Max: 2",
        ] {
            assert_eq!(status_max(other), None, "{other:?}");
        }
    }

    #[test]
    fn stderr_is_read_to_its_end_status_apart() {
        let stderr: &[u8] = b"WARN: distance is ignored and set to 0, if histogram enabled\n\
            #---------------------------\n\
            # cyclictest current status:\n\
            T: 0 ( 5951) P:99 I:200 C:   6318 Min:      9 Act:   15 Avg:   19 Max:     407\n\
            T: 1 ( 5952) P:99 I:200 C:   6318 Min:      9 Act:   15 Avg:   19 Max:      87\n\
            #---------------------------\n\
            bad \xff bytes\n\
            T: 0 ( 5951) P:99 I:200 C:  11313 Min:      9 Act:   14 Avg:   18 Max:    1957";
        let mut maxes = Vec::new();
        let kept = read_stderr(stderr, |max| maxes.push(max));
        assert_eq!(maxes, [407, 87, 1957]);
        assert_eq!(
            kept,
            "WARN: distance is ignored and set to 0, if histogram enabled\nbad \u{fffd} bytes\n"
        );
    }

    proptest::proptest! {
        #[test]
        fn parsers_never_panic(text in "\\PC*") {
            let _ = parse_histogram(&text);
            let _ = parse_summary(&text);
            let _ = parse_json(&text);
            let _ = status_max(&text);
        }

        #[test]
        fn histogram_like_text_never_panics(rows in proptest::collection::vec("[0-9]{1,7}( [0-9]{1,5}){0,3}", 0..10)) {
            let _ = parse_histogram(&format!("# Histogram\n{}\n# Max Latencies: 1 2\n", rows.join("\n")));
        }
    }
}
