//! Soak mode: a long measurement as consecutive cyclictest runs, whose
//! merged results are saved in `DIR/checkpoint.json` after each so that
//! `jitter --resume DIR` can continue it after jitter was killed or the
//! machine rebooted.

use std::io::Write;
use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use rtreport::report::{LoadReport, MinuteMax, Segment, Soak};
use serde::{Deserialize, Serialize};

use crate::cpus::CpuSet;
use crate::cyclictest::ThreadResult;

/// The `version` of the checkpoint this build writes and reads.
pub const VERSION: &str = "jitter-checkpoint/1";
/// The file's name inside the checkpoint directory.
pub const FILE: &str = "checkpoint.json";

/// The ranges of the measurement options, one definition each: the command
/// line parses its options with them, and [`Checkpoint::read`] refuses a
/// checkpoint whose options leave them.
pub mod range {
    use std::ops::RangeInclusive;

    /// `DURATION` and `--checkpoint-every`, in seconds.
    pub const DURATION_S: RangeInclusive<u64> = 1..=u64::MAX;
    /// `--interval`, in microseconds.
    pub const INTERVAL_US: RangeInclusive<u64> = 10..=u32::MAX as u64;
    /// `--priority`, SCHED_FIFO.
    pub const PRIORITY: RangeInclusive<u64> = 1..=99;
    /// `--histogram-max`, in microseconds.
    pub const HISTOGRAM_MAX_US: RangeInclusive<u64> = 1..=1_000_000;

    /// `range` in words: `1 to 99`, or `at least 1` when it has no end.
    pub fn describe(range: &RangeInclusive<u64>) -> String {
        match *range.end() {
            u64::MAX => format!("at least {}", range.start()),
            end => format!("{} to {end}", range.start()),
        }
    }
}

/// The options a checkpoint must hold within the command line's ranges:
/// field, the option that sets it, range.
const RANGED_OPTIONS: [(&str, &str, RangeInclusive<u64>); 5] = [
    ("duration_s", "DURATION", range::DURATION_S),
    ("interval_us", "--interval", range::INTERVAL_US),
    ("priority", "--priority", range::PRIORITY),
    ("histogram_max_us", "--histogram-max", range::HISTOGRAM_MAX_US),
    ("checkpoint_every_s", "--checkpoint-every", range::DURATION_S),
];

/// Refuses a checkpoint (the JSON `value` read from `path`) whose options
/// leave the command line's ranges, naming the first such field.
fn check_option_ranges(path: &Path, value: &serde_json::Value) -> Result<()> {
    for (field, option, range) in RANGED_OPTIONS {
        let found = value.get("options").and_then(|options| options.get(field));
        if found
            .and_then(serde_json::Value::as_u64)
            .is_some_and(|n| range.contains(&n))
        {
            continue;
        }
        bail!(
            "cannot resume: {} holds options.{field} = {}; {option} takes {}",
            path.display(),
            found.map_or_else(|| "nothing".to_string(), ToString::to_string),
            range::describe(&range)
        );
    }
    Ok(())
}

/// The options a soak measures with, fixed at its start.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SoakOptions {
    pub duration_s: u64,
    pub budget_us: u64,
    pub rt_cpus: CpuSet,
    pub housekeeping: CpuSet,
    pub interval_us: u32,
    pub priority: u32,
    pub no_load: bool,
    pub histogram_max_us: u32,
    pub checkpoint_every_s: u64,
}

/// One core's results over every cyclictest run so far.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MergedCore {
    pub thread: usize,
    pub cpu: Option<u32>,
    pub samples: u64,
    pub min_us: u64,
    pub max_us: u64,
    /// Sum of the latencies (cyclictest's average times its samples), for
    /// the average over the whole soak.
    pub sum_us: f64,
    pub overflows: u64,
    /// `histogram[n]` = samples with latency `n` µs.
    pub histogram: Vec<u64>,
}

impl MergedCore {
    fn add(&mut self, run: &ThreadResult) {
        self.min_us = if self.samples == 0 {
            run.min_us
        } else if run.samples == 0 {
            self.min_us
        } else {
            self.min_us.min(run.min_us)
        };
        self.max_us = self.max_us.max(run.max_us);
        self.samples += run.samples;
        self.sum_us += run.avg_us * run.samples as f64;
        self.overflows += run.overflows;
        if self.histogram.len() < run.histogram.len() {
            self.histogram.resize(run.histogram.len(), 0);
        }
        for (total, count) in self.histogram.iter_mut().zip(&run.histogram) {
            *total += count;
        }
        self.cpu = self.cpu.or(run.cpu);
    }

    pub fn to_thread(&self) -> ThreadResult {
        ThreadResult {
            thread: self.thread,
            cpu: self.cpu,
            samples: self.samples,
            min_us: self.min_us,
            avg_us: if self.samples == 0 {
                0.0
            } else {
                self.sum_us / self.samples as f64
            },
            max_us: self.max_us,
            overflows: self.overflows,
            histogram: self.histogram.clone(),
        }
    }
}

/// Adds one cyclictest run's per-thread results to `cores`, matched by CPU
/// (else by thread number).
pub fn merge(cores: &mut Vec<MergedCore>, run: &[ThreadResult]) {
    for thread in run {
        let index = cores
            .iter()
            .position(|c| match (c.cpu, thread.cpu) {
                (Some(a), Some(b)) => a == b,
                _ => c.thread == thread.thread,
            })
            .unwrap_or_else(|| {
                cores.push(MergedCore {
                    thread: thread.thread,
                    ..MergedCore::default()
                });
                cores.len() - 1
            });
        cores[index].add(thread);
    }
}

/// What `DIR/checkpoint.json` holds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Checkpoint {
    pub version: String,
    pub options: SoakOptions,
    /// Seconds measured so far, over every segment.
    pub elapsed_s: u64,
    pub cores: Vec<MergedCore>,
    /// The load over every segment.
    pub load: LoadReport,
    /// cyclictest's arguments in the latest run.
    pub cyclictest_args: Vec<String>,
    /// Every jitter run so far; the last one is the current run.
    pub segments: Vec<Segment>,
    pub gaps_s: Vec<u64>,
    /// The worst case of each minute measured so far.
    #[serde(default)]
    pub per_minute_max: Vec<MinuteMax>,
}

impl Checkpoint {
    pub fn new(options: SoakOptions) -> Checkpoint {
        Checkpoint {
            version: VERSION.into(),
            options,
            elapsed_s: 0,
            cores: Vec::new(),
            load: LoadReport::default(),
            cyclictest_args: Vec::new(),
            segments: Vec::new(),
            gaps_s: Vec::new(),
            per_minute_max: Vec::new(),
        }
    }

    pub fn remaining_s(&self) -> u64 {
        self.options.duration_s.saturating_sub(self.elapsed_s)
    }

    pub fn samples(&self) -> u64 {
        self.cores.iter().map(|c| c.samples).sum()
    }

    /// Opens a new segment starting at `now_unix`, with the gap since the
    /// previous one.
    pub fn start_segment(&mut self, now_unix: u64) {
        if let Some(last) = self.segments.last() {
            self.gaps_s.push(now_unix.saturating_sub(last.end_unix));
        }
        self.segments.push(Segment {
            start: utc(now_unix),
            end: utc(now_unix),
            start_unix: now_unix,
            end_unix: now_unix,
            seconds: 0,
            samples: 0,
        });
    }

    /// Adds one cyclictest run of `seconds` (at most a minute, within one
    /// minute of measured time) to the current segment.
    pub fn add_run(&mut self, seconds: u64, run: &[ThreadResult], now_unix: u64) {
        merge(&mut self.cores, run);
        self.elapsed_s += seconds;
        self.note_minute(run.iter().map(|t| t.max_us).max().unwrap_or(0));
        let segment = self.segments.last_mut().expect("start_segment first");
        segment.seconds += seconds;
        segment.samples += run.iter().map(|t| t.samples).sum::<u64>();
        segment.end_unix = now_unix;
        segment.end = utc(now_unix);
    }

    /// Folds a run's worst case into the minute of measured time it ended in.
    fn note_minute(&mut self, max_us: u64) {
        let minute = |end_s: u64| end_s.div_ceil(60);
        match self.per_minute_max.last_mut() {
            Some(last) if minute(last.end_s) == minute(self.elapsed_s) => {
                last.end_s = self.elapsed_s;
                last.max_us = last.max_us.max(max_us);
            }
            _ => self.per_minute_max.push(MinuteMax {
                end_s: self.elapsed_s,
                max_us,
            }),
        }
    }

    pub fn soak(&self) -> Soak {
        Soak {
            segments: self.segments.clone(),
            gaps_s: self.gaps_s.clone(),
            per_minute_max: self.per_minute_max.clone(),
        }
    }

    /// The merged per-core results, as one run's.
    pub fn threads(&self) -> Vec<ThreadResult> {
        self.cores.iter().map(MergedCore::to_thread).collect()
    }

    /// Writes `dir/checkpoint.json` whole or not at all: a temporary file in
    /// `dir`, synced, renamed over it, and the directory synced.
    pub fn write(&self, dir: &Path) -> Result<()> {
        let json = serde_json::to_string_pretty(self)? + "\n";
        let mut file = tempfile::Builder::new()
            .prefix(".checkpoint-")
            .tempfile_in(dir)
            .with_context(|| format!("creating a checkpoint in {}", dir.display()))?;
        file.write_all(json.as_bytes())?;
        file.as_file().sync_all()?;
        let path = path(dir);
        file.persist(&path)
            .with_context(|| format!("writing {}", path.display()))?;
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .with_context(|| format!("syncing {}", dir.display()))?;
        Ok(())
    }

    /// Reads `dir/checkpoint.json`, refusing a missing, corrupt or
    /// other-version file, and options the command line would refuse.
    pub fn read(dir: &Path) -> Result<Checkpoint> {
        let path = path(dir);
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("cannot resume: no checkpoint readable at {}", path.display()))?;
        let value: serde_json::Value = serde_json::from_str(&text)
            .with_context(|| format!("cannot resume: {} is corrupt (not JSON)", path.display()))?;
        let version = value.get("version").and_then(|v| v.as_str()).unwrap_or("none");
        if version != VERSION {
            bail!(
                "cannot resume: {} is checkpoint version {version:?}; this jitter reads {VERSION:?}",
                path.display()
            );
        }
        check_option_ranges(&path, &value)?;
        let checkpoint: Checkpoint = serde_json::from_value(value)
            .with_context(|| format!("cannot resume: {} is corrupt", path.display()))?;
        if checkpoint.segments.is_empty() || checkpoint.gaps_s.len() + 1 != checkpoint.segments.len() {
            bail!(
                "cannot resume: {} is corrupt (segments and gaps disagree)",
                path.display()
            );
        }
        Ok(checkpoint)
    }
}

pub fn path(dir: &Path) -> PathBuf {
    dir.join(FILE)
}

/// Seconds since the Unix epoch, now.
pub fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

pub use rtreport::utc::rfc3339 as utc;

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn thread(
        cpu: u32,
        samples: u64,
        min_us: u64,
        avg_us: f64,
        max_us: u64,
        histogram: Vec<u64>,
    ) -> ThreadResult {
        ThreadResult {
            thread: 0,
            cpu: Some(cpu),
            samples,
            min_us,
            avg_us,
            max_us,
            overflows: samples - histogram.iter().sum::<u64>(),
            histogram,
        }
    }

    /// A 40 s soak of CPU 1, checkpointed every 5 s.
    pub(crate) fn options() -> SoakOptions {
        SoakOptions {
            duration_s: 40,
            budget_us: 100,
            rt_cpus: CpuSet::parse("1").unwrap(),
            housekeeping: CpuSet::parse("0").unwrap(),
            interval_us: 200,
            priority: 99,
            no_load: false,
            histogram_max_us: 4,
            checkpoint_every_s: 5,
        }
    }

    #[test]
    fn merging_adds_counts_and_keeps_the_extremes() {
        let mut cores = Vec::new();
        merge(&mut cores, &[thread(1, 4, 2, 3.0, 3, vec![0, 0, 2, 2])]);
        merge(&mut cores, &[thread(1, 6, 1, 8.0, 40, vec![0, 1, 1, 1])]);
        assert_eq!(cores.len(), 1);
        let merged = cores[0].to_thread();
        assert_eq!(merged.samples, 10);
        assert_eq!((merged.min_us, merged.max_us), (1, 40));
        assert_eq!(merged.histogram, [0, 1, 3, 3]);
        assert_eq!(merged.overflows, 3);
        assert!((merged.avg_us - 6.0).abs() < 1e-9, "{}", merged.avg_us);
        // Another CPU is another core; an empty run leaves the minimum.
        merge(&mut cores, &[thread(2, 1, 9, 9.0, 9, vec![])]);
        merge(&mut cores, &[thread(1, 0, 0, 0.0, 0, vec![])]);
        assert_eq!(cores.len(), 2);
        assert_eq!(cores[0].min_us, 1);
        assert_eq!(cores[1].overflows, 1);
    }

    #[test]
    fn each_minute_keeps_the_worst_case_of_its_runs() {
        let mut checkpoint = Checkpoint::new(SoakOptions {
            duration_s: 600,
            ..options()
        });
        checkpoint.start_segment(0);
        let run = |max| [thread(1, 10, 1, 2.0, max, vec![])];
        for (seconds, max) in [(30, 7), (30, 9), (60, 4), (20, 50), (40, 3), (60, 6)] {
            checkpoint.add_run(seconds, &run(max), 0);
        }
        let minutes: Vec<(u64, u64)> = checkpoint
            .soak()
            .per_minute_max
            .iter()
            .map(|m| (m.end_s, m.max_us))
            .collect();
        assert_eq!(minutes, [(60, 9), (120, 4), (180, 50), (240, 6)]);
    }

    #[test]
    fn checkpoint_round_trips_and_tracks_segments() {
        let dir = tempfile::tempdir().unwrap();
        let mut checkpoint = Checkpoint::new(options());
        checkpoint.start_segment(1000);
        checkpoint.add_run(5, &[thread(1, 50, 2, 3.0, 3, vec![0, 0, 25, 25])], 1005);
        checkpoint.add_run(5, &[thread(1, 50, 2, 3.0, 3, vec![0, 0, 25, 25])], 1010);
        checkpoint.write(dir.path()).unwrap();
        let mut back = Checkpoint::read(dir.path()).unwrap();
        assert_eq!(back, checkpoint);
        assert_eq!(
            (back.elapsed_s, back.remaining_s(), back.samples()),
            (10, 30, 100)
        );
        back.start_segment(1030);
        back.add_run(30, &[thread(1, 300, 2, 3.0, 3, vec![0, 0, 150, 150])], 1060);
        let soak = back.soak();
        assert_eq!(soak.gaps_s, [20]);
        assert_eq!(
            soak.segments
                .iter()
                .map(|s| (s.seconds, s.samples))
                .collect::<Vec<_>>(),
            [(10, 100), (30, 300)]
        );
        assert_eq!(soak.segments[0].start, "1970-01-01T00:16:40Z");
        let leftovers: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(leftovers.len(), 1, "temporary files left: {leftovers:?}");
    }

    #[test]
    fn bad_checkpoints_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let error = |dir: &Path| format!("{:#}", Checkpoint::read(dir).unwrap_err());
        assert!(
            error(dir.path()).contains("no checkpoint readable"),
            "{}",
            error(dir.path())
        );
        std::fs::write(path(dir.path()), "{\"version\": \"jitter-checkpoint/1\", \"opt").unwrap();
        assert!(error(dir.path()).contains("corrupt"), "{}", error(dir.path()));
        let mut checkpoint = Checkpoint::new(options());
        checkpoint.start_segment(5);
        checkpoint.write(dir.path()).unwrap();
        let text = std::fs::read_to_string(path(dir.path())).unwrap();
        std::fs::write(path(dir.path()), text.replace(VERSION, "jitter-checkpoint/9")).unwrap();
        assert!(
            error(dir.path()).contains("version \"jitter-checkpoint/9\""),
            "{}",
            error(dir.path())
        );
        std::fs::write(
            path(dir.path()),
            text.replace("\"elapsed_s\": 0", "\"elapsed_s\": -1"),
        )
        .unwrap();
        assert!(error(dir.path()).contains("corrupt"), "{}", error(dir.path()));
    }

    /// Writes a checkpoint of [`options`] in `dir`, its options' `field`
    /// set to `value` (removed for `None`).
    fn write_with_option(dir: &Path, field: &str, value: Option<serde_json::Value>) {
        let mut checkpoint = Checkpoint::new(options());
        checkpoint.start_segment(5);
        checkpoint.write(dir).unwrap();
        let text = std::fs::read_to_string(path(dir)).unwrap();
        let mut json: serde_json::Value = serde_json::from_str(&text).unwrap();
        let options = json["options"].as_object_mut().unwrap();
        match value {
            Some(value) => options.insert(field.to_string(), value),
            None => options.remove(field),
        };
        std::fs::write(path(dir), json.to_string()).unwrap();
    }

    #[test]
    fn options_outside_the_command_line_ranges_are_refused_naming_the_field() {
        use serde_json::json;
        let dir = tempfile::tempdir().unwrap();
        for (field, value, rule) in [
            ("priority", Some(json!(1000)), "--priority takes 1 to 99"),
            ("priority", Some(json!(0)), "--priority takes 1 to 99"),
            ("priority", Some(json!(-1)), "--priority takes 1 to 99"),
            ("priority", Some(json!("99")), "--priority takes 1 to 99"),
            ("priority", None, "--priority takes 1 to 99"),
            ("interval_us", Some(json!(0)), "--interval takes 10 to 4294967295"),
            ("interval_us", Some(json!(9)), "--interval takes 10 to 4294967295"),
            (
                "histogram_max_us",
                Some(json!(4_000_000_000u64)),
                "--histogram-max takes 1 to 1000000",
            ),
            (
                "histogram_max_us",
                Some(json!(u64::MAX)),
                "--histogram-max takes 1 to 1000000",
            ),
            (
                "histogram_max_us",
                Some(json!(1e12)),
                "--histogram-max takes 1 to 1000000",
            ),
            ("duration_s", Some(json!(0)), "DURATION takes at least 1"),
            (
                "checkpoint_every_s",
                Some(json!(0)),
                "--checkpoint-every takes at least 1",
            ),
        ] {
            write_with_option(dir.path(), field, value.clone());
            let error = format!("{:#}", Checkpoint::read(dir.path()).unwrap_err());
            let shown = value.map_or_else(|| "nothing".to_string(), |v| v.to_string());
            let expected = format!(
                "cannot resume: {} holds options.{field} = {shown}; {rule}",
                path(dir.path()).display()
            );
            assert!(error.contains(&expected), "{error}\nexpected: {expected}");
        }
    }

    #[test]
    fn options_at_the_ends_of_the_ranges_resume() {
        let dir = tempfile::tempdir().unwrap();
        for (field, value) in [
            ("priority", 1),
            ("priority", 99),
            ("interval_us", 10),
            ("interval_us", u64::from(u32::MAX)),
            ("histogram_max_us", 1),
            ("histogram_max_us", 1_000_000),
            ("duration_s", 1),
            ("checkpoint_every_s", u64::MAX),
        ] {
            write_with_option(dir.path(), field, Some(value.into()));
            let read = Checkpoint::read(dir.path()).unwrap();
            let options = serde_json::to_value(&read.options).unwrap();
            assert_eq!(options[field], value, "{field}");
        }
    }

    #[test]
    fn utc_dates() {
        assert_eq!(utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(utc(1_764_547_199), "2025-11-30T23:59:59Z");
    }
}
