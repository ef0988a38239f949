//! The JSON report of the on-target `jitter` tool (schema `jitter-report/2`):
//! the data types only, shared by `jitter`, which writes it, and imgbuild's
//! boot stage, which reads it back from the serial console. How a report is
//! measured, judged and drawn stays in `jitter`.
//!
//! The field names and their order are the serialized form: the report is
//! also read by scripts, so a change here is a schema change.
//!
//! [`Progress`] is the line `jitter --progress` prints while it measures.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::{Deserialize, Deserializer, Serialize};

use rtcheck::Evidence;

pub use crate::progress::Progress;

/// What this build writes. `jitter-report/2` is `/1` with fields added
/// (the tail's confidence, conformance warnings, soak segments, and for
/// `jitter --tool timerlat` the tool, its arguments, each core's IRQ latency
/// and the analysed spikes): every `/1` field is still
/// there with the same meaning, so a reader of `/1` that ignores unknown
/// fields keeps working; one that checks the schema string must accept `/2`.
pub const SCHEMA: &str = "jitter-report/2";

/// Every schema this build reads: its own, and the `/1` it extends.
pub const READABLE_SCHEMAS: [&str; 2] = ["jitter-report/1", SCHEMA];

/// A report whose `schema` is not one of [`READABLE_SCHEMAS`]: written by a
/// jitter this build cannot read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown jitter report schema {found:?}: this build reads jitter-report/1 and {SCHEMA}")]
pub struct UnknownSchema {
    pub found: String,
}

/// Accepts only [`READABLE_SCHEMAS`]. `jitter` writes `schema` first, so a
/// report of another schema is refused for that before any other field is
/// looked at.
fn known_schema<'de, D: Deserializer<'de>>(deserializer: D) -> Result<String, D::Error> {
    let found = String::deserialize(deserializer)?;
    if !READABLE_SCHEMAS.contains(&found.as_str()) {
        return Err(serde::de::Error::custom(UnknownSchema { found }));
    }
    Ok(found)
}

/// A map keyed by CPU number. JSON writes the keys as strings; they are read
/// back whether the deserializer hands them over as text or as numbers, so a
/// report also reads inside a buffered (internally tagged) enum, where serde
/// does not turn `"0"` into a number by itself.
fn per_cpu<'de, D, V>(deserializer: D) -> Result<BTreeMap<u32, V>, D::Error>
where
    D: Deserializer<'de>,
    V: Deserialize<'de>,
{
    let keyed: BTreeMap<CpuNumber, V> = BTreeMap::deserialize(deserializer)?;
    Ok(keyed.into_iter().map(|(cpu, value)| (cpu.0, value)).collect())
}

#[derive(PartialEq, Eq, PartialOrd, Ord)]
struct CpuNumber(u32);

impl<'de> Deserialize<'de> for CpuNumber {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = CpuNumber;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a CPU number")
            }
            fn visit_u64<E: serde::de::Error>(self, cpu: u64) -> Result<CpuNumber, E> {
                u32::try_from(cpu).map(CpuNumber).map_err(E::custom)
            }
            fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<CpuNumber, E> {
                text.parse()
                    .map(CpuNumber)
                    .map_err(|_| E::custom(format!("{text:?} is not a CPU number")))
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

/// A set of CPUs; serialized in the kernel's list form, `0-3,5`.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub struct CpuSet(pub BTreeSet<u32>);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{text:?} is not a CPU list like 0-3,5")]
pub struct CpuListError {
    pub text: String,
}

/// The highest CPU number a list may name (the kernel's NR_CPUS limit).
const MAX_CPU: u32 = 8191;

impl CpuSet {
    /// Parses `0-3,5`; an empty string (or the kernel's `(null)`) is the empty set.
    pub fn parse(text: &str) -> Result<CpuSet, CpuListError> {
        let text = text.trim();
        let mut set = BTreeSet::new();
        if text.is_empty() || text == "(null)" {
            return Ok(CpuSet(set));
        }
        for part in text.split(',') {
            let (low, high) = parse_range(part.trim()).ok_or_else(|| CpuListError {
                text: text.to_string(),
            })?;
            set.extend(low..=high);
        }
        Ok(CpuSet(set))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn contains(&self, cpu: u32) -> bool {
        self.0.contains(&cpu)
    }

    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.0.iter().copied()
    }

    pub fn union(&self, other: &CpuSet) -> CpuSet {
        CpuSet(self.0.union(&other.0).copied().collect())
    }

    pub fn difference(&self, other: &CpuSet) -> CpuSet {
        CpuSet(self.0.difference(&other.0).copied().collect())
    }

    pub fn intersection(&self, other: &CpuSet) -> CpuSet {
        CpuSet(self.0.intersection(&other.0).copied().collect())
    }

    pub fn is_subset(&self, other: &CpuSet) -> bool {
        self.0.is_subset(&other.0)
    }
}

/// `3` or `1-4`, as an inclusive range within [`MAX_CPU`].
fn parse_range(part: &str) -> Option<(u32, u32)> {
    let (low, high) = match part.split_once('-') {
        Some((low, high)) => (low.parse().ok()?, high.parse().ok()?),
        None => {
            let cpu = part.parse().ok()?;
            (cpu, cpu)
        }
    };
    (low <= high && high <= MAX_CPU).then_some((low, high))
}

impl fmt::Display for CpuSet {
    /// The compact kernel form, `0-3,5`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut ranges: Vec<(u32, u32)> = Vec::new();
        for cpu in self.iter() {
            match ranges.last_mut() {
                Some((_, end)) if *end + 1 == cpu => *end = cpu,
                _ => ranges.push((cpu, cpu)),
            }
        }
        let parts: Vec<String> = ranges
            .into_iter()
            .map(|(start, end)| {
                if start == end {
                    start.to_string()
                } else {
                    format!("{start}-{end}")
                }
            })
            .collect();
        f.write_str(&parts.join(","))
    }
}

impl From<CpuSet> for String {
    fn from(set: CpuSet) -> String {
        set.to_string()
    }
}

impl TryFrom<String> for CpuSet {
    type Error = CpuListError;
    fn try_from(text: String) -> Result<Self, Self::Error> {
        CpuSet::parse(&text)
    }
}

/// An interrupt and the CPUs it is delivered to.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Irq {
    pub irq: String,
    pub effective: CpuSet,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Verdict {
    Pass,
    Fail,
    Invalid,
}

impl Verdict {
    /// The worse of two: INVALID over FAIL over PASS.
    pub fn worse(self, other: Verdict) -> Verdict {
        let rank = |v: Verdict| match v {
            Verdict::Pass => 0,
            Verdict::Fail => 1,
            Verdict::Invalid => 2,
        };
        if rank(other) > rank(self) { other } else { self }
    }

    /// jitter's exit status for it: 0 PASS, 3 FAIL, 4 INVALID (1 and 2 are
    /// errors and usage).
    pub fn exit_code(self) -> u8 {
        match self {
            Verdict::Pass => 0,
            Verdict::Fail => 3,
            Verdict::Invalid => 4,
        }
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Verdict::Pass => "PASS",
            Verdict::Fail => "FAIL",
            Verdict::Invalid => "INVALID",
        })
    }
}

/// Why a measurement cannot be trusted. The codes are part of the JSON schema.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ReasonCode {
    NotPreemptRt,
    NotIsolated,
    IrqsOnRtCpus,
    GovernorNotPerformance,
    Hypervisor,
    TooFewSamples,
    LoadDidNotRun,
    HistogramOverflow,
    RtThrottling,
    RcuNocbsNohzFull,
    KthreadAffinity,
    TimerMigration,
    IdleStates,
    SmtSiblings,
    PeriodicWatchdogs,
}

impl ReasonCode {
    pub const ALL: [ReasonCode; 15] = [
        ReasonCode::NotPreemptRt,
        ReasonCode::NotIsolated,
        ReasonCode::IrqsOnRtCpus,
        ReasonCode::GovernorNotPerformance,
        ReasonCode::Hypervisor,
        ReasonCode::TooFewSamples,
        ReasonCode::LoadDidNotRun,
        ReasonCode::HistogramOverflow,
        ReasonCode::RtThrottling,
        ReasonCode::RcuNocbsNohzFull,
        ReasonCode::KthreadAffinity,
        ReasonCode::TimerMigration,
        ReasonCode::IdleStates,
        ReasonCode::SmtSiblings,
        ReasonCode::PeriodicWatchdogs,
    ];

    /// The code as the JSON report spells it.
    pub const fn as_str(self) -> &'static str {
        match self {
            ReasonCode::NotPreemptRt => "not-preempt-rt",
            ReasonCode::NotIsolated => "not-isolated",
            ReasonCode::IrqsOnRtCpus => "irqs-on-rt-cpus",
            ReasonCode::GovernorNotPerformance => "governor-not-performance",
            ReasonCode::Hypervisor => "hypervisor",
            ReasonCode::TooFewSamples => "too-few-samples",
            ReasonCode::LoadDidNotRun => "load-did-not-run",
            ReasonCode::HistogramOverflow => "histogram-overflow",
            ReasonCode::RtThrottling => "rt-throttling",
            ReasonCode::RcuNocbsNohzFull => "rcu-nocbs-nohz-full",
            ReasonCode::KthreadAffinity => "kthread-affinity",
            ReasonCode::TimerMigration => "timer-migration",
            ReasonCode::IdleStates => "idle-states",
            ReasonCode::SmtSiblings => "smt-siblings",
            ReasonCode::PeriodicWatchdogs => "periodic-watchdogs",
        }
    }
}

impl fmt::Display for ReasonCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reason {
    pub code: ReasonCode,
    pub detail: String,
}

/// What the load generator did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoadReport {
    pub enabled: bool,
    pub hackbench_runs: u64,
    pub hackbench_failures: u64,
    pub burner_threads: u32,
    pub io_bytes: u64,
    pub cpus: CpuSet,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Assessment {
    pub verdict: Verdict,
    pub reasons: Vec<Reason>,
    pub worst_cpu: Option<u32>,
    pub worst_us: u64,
    /// Samples each core needed (95% of duration / interval).
    pub samples_needed: u64,
    /// Conformance checks that failed at warning level: they cost latency
    /// but leave the measurement trustworthy, so they never change the verdict.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<Reason>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KernelInfo {
    pub release: String,
    pub uts_version: String,
    pub preempt_rt: bool,
    pub evidence: Evidence,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Tuning {
    pub rt_cpus: CpuSet,
    pub housekeeping: CpuSet,
    pub cmdline_isolated: CpuSet,
    pub sysfs_isolated: CpuSet,
    pub nohz_full: CpuSet,
    pub irqs_on_rt_cpus: Vec<Irq>,
    /// Governor per CPU; `None` when the CPU has no cpufreq.
    #[serde(deserialize_with = "per_cpu")]
    pub governors: BTreeMap<u32, Option<String>>,
    pub hypervisor: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunInfo {
    pub duration_s: u64,
    pub interval_us: u32,
    pub priority: u32,
    pub budget_us: u64,
    pub histogram_max_us: u32,
    /// cyclictest's arguments; empty when another tool measured.
    pub cyclictest_args: Vec<String>,
    pub load: LoadReport,
    /// True under emulation or virtualization, where latencies are functional only.
    pub functional_only: bool,
    /// The measuring tool (`/2`); absent means cyclictest, as a `/1` report
    /// was always.
    #[serde(default, skip_serializing_if = "Tool::is_cyclictest")]
    pub tool: Tool,
    /// The measuring tool's arguments when it is not cyclictest.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_args: Vec<String>,
}

/// What measured the latency.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Tool {
    /// cyclictest (rt-tests): a user-space thread per RT CPU.
    #[default]
    Cyclictest,
    /// `rtla timerlat hist`: the kernel's timerlat tracer, whose per-CPU
    /// thread latency is the core's figures and whose IRQ latency is
    /// [`CoreStats::irq`] (the thread's latency in the kernel
    /// [`CoreStats::kernel_thread`]).
    Timerlat,
}

impl Tool {
    pub fn is_cyclictest(&self) -> bool {
        *self == Tool::Cyclictest
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Tool::Cyclictest => "cyclictest",
            Tool::Timerlat => "timerlat",
        }
    }
}

impl fmt::Display for Tool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One latency distribution: the timer IRQ's latency on a core (timerlat).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Latency {
    pub samples: u64,
    pub min_us: u64,
    pub avg_us: f64,
    pub max_us: u64,
    pub overflows: u64,
    /// `[latency_us, count]` for every non-empty bucket.
    pub histogram: Vec<(u64, u64)>,
}

/// A latency over the trace threshold, with the causes rtla's
/// auto-analysis found for it, as rtla gives them.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Spike {
    pub cpu: u32,
    /// `irq` or `thread`: which latency crossed the threshold.
    pub kind: String,
    pub latency_us: f64,
    /// The parts of the latency, in rtla's order (`IRQ handler delay`,
    /// `Blocking thread`, `IRQ interference`, ...).
    pub causes: Vec<Cause>,
    /// The blocking thread's kernel stack, innermost first, when rtla has it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stack: Vec<String>,
}

/// One part of a spike's latency.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Cause {
    pub what: String,
    /// Microseconds; `None` where rtla names a source without a time (the
    /// thread running when an IRQ latency stopped the trace).
    pub us: Option<f64>,
    /// Share of the spike's latency, in percent, where rtla gives one.
    pub share_pct: Option<f64>,
    /// rtla's remark, e.g. `exit from idle`, or `up to` for a bound.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// The sources rtla lists under it: `comm:pid` threads, `name:vector`
    /// IRQs, softirqs, each with its time when given.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sources: Vec<Source>,
}

/// A thread, IRQ or softirq rtla names under a cause.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Source {
    pub name: String,
    pub us: Option<f64>,
}

/// One measured core.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CoreStats {
    pub cpu: Option<u32>,
    pub samples: u64,
    pub min_us: u64,
    pub avg_us: f64,
    /// `None` when the percentile falls in the histogram overflow.
    pub p99_us: Option<u64>,
    pub p99_9_us: Option<u64>,
    pub max_us: u64,
    pub overflows: u64,
    /// `[latency_us, count]` for every non-empty bucket.
    pub histogram: Vec<(u64, u64)>,
    /// The timer IRQ's latency on this core, measured by timerlat; the
    /// fields above are then the timerlat thread's latency as an RT task
    /// sees it (on its return to user space, as cyclictest measures).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub irq: Option<Latency>,
    /// timerlat with user-space threads: the thread's wake-up latency in the
    /// kernel, before it returns to user space.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_thread: Option<Latency>,
}

/// The whole report. Deserializing refuses any `schema` but [`SCHEMA`]
/// (the error's text carries [`UnknownSchema`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Report {
    #[serde(deserialize_with = "known_schema")]
    pub schema: String,
    pub jitter_version: String,
    pub kernel: KernelInfo,
    pub cmdline: String,
    pub tuning: Tuning,
    pub run: RunInfo,
    pub cores: Vec<CoreStats>,
    pub assessment: Assessment,
    /// How sure the worst case is (`/2`; absent in `/1` reports).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tail: Option<crate::tail::Tail>,
    /// The runs a soak (`jitter --checkpoint-dir`, `--resume`) was measured
    /// in; absent for a measurement in one run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub soak: Option<Soak>,
    /// Latencies over `--trace-threshold`, analysed by rtla (timerlat).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub spikes: Vec<Spike>,
    /// `jitter --container`: the same measurement in RT containers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<ContainerSection>,
}

/// The same measurement in one RT container per RT CPU (started as
/// `emberrtos-rt-run` starts one: `crate::container::profile_args`), right
/// after the host's and under the same load.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ContainerSection {
    pub image: String,
    /// Each container's podman command line, in CPU order.
    pub commands: Vec<Vec<String>>,
    pub cores: Vec<CoreStats>,
    /// The container's figures against the run's budget, with the same
    /// INVALID reasons as the host's (and any of its own).
    pub assessment: Assessment,
    pub difference: Difference,
}

/// The latency a container adds: its worst case over the host's.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Difference {
    pub host_worst_us: u64,
    pub container_worst_us: u64,
    /// Container minus host (negative when the container did better).
    pub extra_us: i64,
    /// `--container-budget`: the most `extra_us` may be.
    pub budget_us: u64,
    /// INVALID when either measurement is; else FAIL over the budget.
    pub verdict: Verdict,
    /// Why it is INVALID: each section's reasons, named by section.
    pub reasons: Vec<Reason>,
}

impl Difference {
    /// The difference of `container` over `host`, against `budget_us`.
    pub fn of(host: &Assessment, container: &Assessment, budget_us: u64) -> Difference {
        let extra_us = container.worst_us as i64 - host.worst_us as i64;
        let reasons: Vec<Reason> = [("host", host), ("container", container)]
            .iter()
            .flat_map(|(section, assessment)| {
                assessment.reasons.iter().map(move |r| Reason {
                    code: r.code,
                    detail: format!("{section}: {}", r.detail),
                })
            })
            .collect();
        let verdict = if !reasons.is_empty() {
            Verdict::Invalid
        } else if extra_us > budget_us as i64 {
            Verdict::Fail
        } else {
            Verdict::Pass
        };
        Difference {
            host_worst_us: host.worst_us,
            container_worst_us: container.worst_us,
            extra_us,
            budget_us,
            verdict,
            reasons,
        }
    }
}

/// A soak measured over several runs of jitter, resumed from checkpoints.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Soak {
    /// Every uninterrupted run (one jitter process), in order.
    pub segments: Vec<Segment>,
    /// Wall-clock seconds between the end of a segment's last checkpoint and
    /// the start of the next segment: `gaps_s[i]` follows `segments[i]`.
    pub gaps_s: Vec<u64>,
    /// The worst latency of each minute measured, over every core, in order:
    /// a worst case that drifts shows here before it breaks the budget.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub per_minute_max: Vec<MinuteMax>,
}

/// The worst latency measured in one minute of a soak.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MinuteMax {
    /// Seconds measured since the soak began, at the minute's end.
    pub end_s: u64,
    pub max_us: u64,
}

/// One uninterrupted run of a soak, as far as its last checkpoint.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Segment {
    /// Wall time, UTC, `YYYY-MM-DDTHH:MM:SSZ`.
    pub start: String,
    pub end: String,
    /// Seconds since the Unix epoch of `start` and `end`.
    pub start_unix: u64,
    pub end_unix: u64,
    /// Seconds measured in this segment.
    pub seconds: u64,
    /// Samples taken in this segment, over every core.
    pub samples: u64,
}

impl Report {
    /// The run's verdict: the host's, or with a container section the worst
    /// of the host's, the container's and the difference's (INVALID over FAIL
    /// over PASS).
    pub fn verdict(&self) -> Verdict {
        let Some(container) = &self.container else {
            return self.assessment.verdict;
        };
        [container.assessment.verdict, container.difference.verdict]
            .into_iter()
            .fold(self.assessment.verdict, Verdict::worse)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assessment(verdict: Verdict, worst_us: u64, codes: &[ReasonCode]) -> Assessment {
        Assessment {
            verdict,
            reasons: codes
                .iter()
                .map(|&code| Reason {
                    code,
                    detail: format!("{code} detail"),
                })
                .collect(),
            worst_cpu: Some(1),
            worst_us,
            samples_needed: 10,
            warnings: Vec::new(),
        }
    }

    #[test]
    fn the_difference_is_judged_against_the_container_budget() {
        let host = assessment(Verdict::Pass, 20, &[]);
        let within = Difference::of(&host, &assessment(Verdict::Pass, 30, &[]), 10);
        assert_eq!((within.extra_us, within.verdict), (10, Verdict::Pass));
        let over = Difference::of(&host, &assessment(Verdict::Pass, 31, &[]), 10);
        assert_eq!((over.extra_us, over.verdict), (11, Verdict::Fail));
        let better = Difference::of(&host, &assessment(Verdict::Pass, 15, &[]), 0);
        assert_eq!((better.extra_us, better.verdict), (-5, Verdict::Pass));
    }

    #[test]
    fn an_invalid_section_makes_the_difference_invalid_naming_both() {
        let hv = [ReasonCode::Hypervisor];
        let host = assessment(Verdict::Invalid, 20, &hv);
        let container = assessment(
            Verdict::Invalid,
            900,
            &[ReasonCode::Hypervisor, ReasonCode::TooFewSamples],
        );
        let difference = Difference::of(&host, &container, 10);
        assert_eq!(difference.verdict, Verdict::Invalid);
        let details: Vec<&str> = difference.reasons.iter().map(|r| r.detail.as_str()).collect();
        assert_eq!(
            details,
            [
                "host: hypervisor detail",
                "container: hypervisor detail",
                "container: too-few-samples detail"
            ]
        );
        let only_container = Difference::of(&assessment(Verdict::Pass, 20, &[]), &container, 1000);
        assert_eq!(only_container.verdict, Verdict::Invalid);
    }

    #[test]
    fn invalid_is_worse_than_fail_is_worse_than_pass() {
        use Verdict::*;
        for (a, b, worse) in [
            (Pass, Fail, Fail),
            (Fail, Pass, Fail),
            (Fail, Invalid, Invalid),
            (Invalid, Pass, Invalid),
            (Pass, Pass, Pass),
        ] {
            assert_eq!(a.worse(b), worse, "{a} {b}");
        }
    }

    #[test]
    fn parse_and_format() {
        let set = CpuSet::parse("0-3,5,7-8").unwrap();
        assert_eq!(set.iter().collect::<Vec<_>>(), vec![0, 1, 2, 3, 5, 7, 8]);
        assert_eq!(set.to_string(), "0-3,5,7-8");
        assert!(CpuSet::parse("(null)\n").unwrap().is_empty());
        assert!(CpuSet::parse("").unwrap().is_empty());
        assert_eq!(CpuSet::parse("8191").unwrap().to_string(), "8191");
        for bad in ["a", "3-1", "1-", "1,,2", "0-99999", "8192", "-1"] {
            assert_eq!(
                CpuSet::parse(bad),
                Err(CpuListError { text: bad.into() }),
                "{bad}"
            );
        }
    }

    #[test]
    fn cpu_set_serializes_as_a_kernel_list() {
        let set = CpuSet::parse("0-2,4").unwrap();
        assert_eq!(serde_json::to_string(&set).unwrap(), "\"0-2,4\"");
        assert_eq!(serde_json::from_str::<CpuSet>("\"0-2,4\"").unwrap(), set);
        let error = serde_json::from_str::<CpuSet>("\"0-x\"").unwrap_err();
        assert!(error.to_string().contains("is not a CPU list"), "{error}");
    }

    #[test]
    fn reason_codes_read_as_serialized() {
        for code in ReasonCode::ALL {
            let json = serde_json::to_string(&code).unwrap();
            assert_eq!(json, format!("\"{code}\""));
            assert_eq!(serde_json::from_str::<ReasonCode>(&json).unwrap(), code);
        }
        assert_eq!(serde_json::to_string(&Verdict::Invalid).unwrap(), "\"INVALID\"");
        assert_eq!(Verdict::Fail.to_string(), "FAIL");
    }

    /// What `jitter --json` writes (see that crate's golden test).
    const FIXTURE: &str = include_str!("../../live-image/jitter/tests/fixtures/jitter-report-2.json");
    /// What the jitter before `/2` wrote.
    const FIXTURE_1: &str = include_str!("../../live-image/jitter/tests/fixtures/jitter-report-1.json");

    /// Every key path of a JSON document (object keys only).
    fn key_paths(value: &serde_json::Value, prefix: &str, out: &mut BTreeSet<String>) {
        if let Some(object) = value.as_object() {
            for (key, child) in object {
                let path = format!("{prefix}/{key}");
                out.insert(path.clone());
                key_paths(child, &path, out);
            }
        } else if let Some(items) = value.as_array() {
            for child in items {
                key_paths(child, &format!("{prefix}[]"), out);
            }
        }
    }

    #[test]
    fn schema_2_is_a_superset_of_1_and_1_still_reads() {
        let one: serde_json::Value = serde_json::from_str(FIXTURE_1).unwrap();
        let two: serde_json::Value = serde_json::from_str(FIXTURE).unwrap();
        let (mut old, mut new) = (BTreeSet::new(), BTreeSet::new());
        key_paths(&one, "", &mut old);
        key_paths(&two, "", &mut new);
        let missing: Vec<&String> = old.difference(&new).collect();
        assert!(missing.is_empty(), "jitter-report/2 lost /1 fields: {missing:?}");
        assert!(new.contains("/tail/exceedances"), "{new:?}");
        let report: Report = serde_json::from_str(FIXTURE_1).unwrap();
        assert_eq!(report.schema, "jitter-report/1");
        assert_eq!(report.tail, None);
        assert_eq!(report.verdict(), Verdict::Invalid);
    }

    #[test]
    fn a_soak_round_trips_and_is_absent_otherwise() {
        let mut report: Report = serde_json::from_str(FIXTURE).unwrap();
        assert_eq!(report.soak, None);
        let segment = |start_unix: u64, seconds: u64| Segment {
            start: format!("t{start_unix}"),
            end: format!("t{}", start_unix + seconds),
            start_unix,
            end_unix: start_unix + seconds,
            seconds,
            samples: seconds * 5000,
        };
        report.soak = Some(Soak {
            segments: vec![segment(100, 20), segment(130, 20)],
            gaps_s: vec![10],
            per_minute_max: vec![MinuteMax {
                end_s: 40,
                max_us: 17,
            }],
        });
        let json = serde_json::to_string_pretty(&report).unwrap();
        assert!(json.contains("\"gaps_s\""), "{json}");
        let back: Report = serde_json::from_str(&json).unwrap();
        assert_eq!(back, report);
        report.soak = None;
        assert!(!serde_json::to_string(&report).unwrap().contains("soak"));
    }

    #[test]
    fn fixture_round_trips_byte_for_byte() {
        let report: Report = serde_json::from_str(FIXTURE).unwrap();
        assert_eq!(report.schema, SCHEMA);
        assert_eq!(report.verdict(), Verdict::Invalid);
        assert_eq!(report.tuning.rt_cpus, CpuSet::parse("1").unwrap());
        assert_eq!(report.cores.len(), 2);
        assert_eq!(serde_json::to_string_pretty(&report).unwrap() + "\n", FIXTURE);
    }

    /// imgbuild keeps the report inside an internally tagged enum, which
    /// serde buffers: the CPU-keyed maps must still read.
    #[test]
    fn fixture_reads_inside_a_tagged_enum() {
        #[derive(Debug, Deserialize)]
        #[serde(tag = "state")]
        enum Outcome {
            Complete { report: Report },
        }
        let json = format!(r#"{{"state": "Complete", "report": {FIXTURE}}}"#);
        let Outcome::Complete { report } = serde_json::from_str(&json).unwrap();
        assert_eq!(
            report.tuning.governors.get(&1),
            Some(&Some("powersave".to_string()))
        );
        assert_eq!(report.tuning.governors.get(&0), Some(&None));
        let bad = FIXTURE.replace(r#""1": "powersave""#, r#""one": "powersave""#);
        let error = serde_json::from_str::<Report>(&bad).unwrap_err();
        assert!(
            error.to_string().contains(r#""one" is not a CPU number"#),
            "{error}"
        );
    }

    #[test]
    fn other_schemas_are_refused_by_name() {
        let other = FIXTURE.replace(SCHEMA, "jitter-report/3");
        let error = serde_json::from_str::<Report>(&other).unwrap_err();
        assert!(
            error.to_string().contains(
                r#"unknown jitter report schema "jitter-report/3": this build reads jitter-report/1 and jitter-report/2"#
            ),
            "{error}"
        );
        // Refused for its schema, not for whatever else changed with it.
        let error =
            serde_json::from_str::<Report>(r#"{"schema": "jitter-report/3", "cores": {}}"#).unwrap_err();
        assert!(
            error.to_string().contains("unknown jitter report schema"),
            "{error}"
        );
        let error = serde_json::from_str::<Report>(r#"{"schema": 2}"#).unwrap_err();
        assert!(error.to_string().contains("invalid type"), "{error}");
    }

    proptest::proptest! {
        #[test]
        fn round_trip(cpus in proptest::collection::btree_set(0u32..64, 0..20)) {
            let set = CpuSet(cpus);
            proptest::prop_assert_eq!(CpuSet::parse(&set.to_string()).unwrap(), set);
        }

        #[test]
        fn never_panics(text in "\\PC*") {
            let _ = CpuSet::parse(&text);
        }
    }
}
