//! Running `rtla timerlat hist` (Debian package rtla, 6.3 or later) and
//! parsing what it prints: the per-CPU IRQ and thread latency histograms
//! with their summary, and the auto-analysis of a latency over the trace
//! threshold.
//!
//! Supported output: rtla 6.12 (`tools/tracing/rtla` of Linux 6.12), whose
//! histogram is `Index IRQ-001 Thr-001 ...`, then `over:`, `count:`, `min:`,
//! `avg:`, `max:` rows, then an `ALL:` block, and whose analysis starts with
//! `## CPU N hit stop tracing, analyzing it ##`.

use std::process::Command;

use anyhow::{Context, Result, bail};
use rtreport::report::{Cause, Source, Spike};

use crate::cyclictest::{ParseError, RunParams, ThreadResult};
use crate::process::{MissingTool, on_path};

/// What rtla prints after the histogram when a latency crossed the threshold.
pub const HIT_STOP: &str = "rtla timerlat hit stop tracing";

/// The command line: the timerlat threads on the RT CPUs at cyclictest's
/// interval and priority, in user space (`-u`, as cyclictest's threads are;
/// under QEMU TCG, stopping the trace while kernel threads (`-k`) run has
/// oopsed the guest kernel on a stale int3), rtla's own threads on the housekeeping CPUs, 1 µs
/// buckets up to the histogram's end, `/dev/cpu_dma_latency` held at 0 as
/// cyclictest does; auto-analysis only with a threshold (it costs CPU).
/// `threshold`: stop at the first IRQ or thread latency of this many µs and
/// analyse it.
pub fn arguments(params: &RunParams, threshold: Option<u32>) -> Vec<String> {
    let mut args: Vec<String> = [
        "timerlat",
        "hist",
        "-u",
        "-c",
        &params.rt_cpus.to_string(),
        "-H",
        &params.housekeeping.to_string(),
        "-d",
        &params.duration_s.to_string(),
        "-p",
        &params.interval_us.to_string(),
        "-P",
        &format!("f:{}", params.priority),
        "-b",
        "1",
        "-E",
        &params.histogram_max_us.to_string(),
        "--dma-latency",
        "0",
    ]
    .map(str::to_string)
    .to_vec();
    match threshold {
        // `-a T` without the trace file it writes: stop on an IRQ (-i) or
        // thread (-T) latency of T, keep the IRQ's stack (-s); the
        // auto-analysis runs on the stop unless --no-aa.
        Some(threshold) => {
            for flag in ["-i", "-T", "-s"] {
                args.extend([flag.to_string(), threshold.to_string()]);
            }
        }
        None => args.push("--no-aa".to_string()),
    }
    args
}

/// Where the kernel lists its tracers.
const AVAILABLE_TRACERS: &str = "/sys/kernel/tracing/available_tracers";

pub(crate) fn missing_rtla() -> MissingTool {
    MissingTool {
        program: "rtla".into(),
        package: "rtla".into(),
        note: "; jitter needs rtla 6.3 or later, which Debian 12 has in bookworm-backports".into(),
    }
}

/// Refuses before measuring when rtla is missing, too old to analyse
/// (`--no-aa` came with the auto-analysis, in rtla 6.3), or the kernel
/// has no timerlat tracer.
pub fn check_installed() -> Result<()> {
    if !on_path("rtla") {
        return Err(missing_rtla().into());
    }
    let help = Command::new("rtla")
        .args(["timerlat", "hist", "--help"])
        .output()
        .context("running `rtla timerlat hist --help`")?;
    let text = String::from_utf8_lossy(&help.stdout) + String::from_utf8_lossy(&help.stderr);
    if !text.contains("--no-aa") {
        bail!(
            "the installed rtla has no timerlat auto-analysis (it came in rtla 6.3; Debian 12 ships 6.1): \
             apt-get install -t bookworm-backports rtla"
        );
    }
    if let Ok(tracers) = std::fs::read_to_string(AVAILABLE_TRACERS)
        && !tracers.split_whitespace().any(|t| t == "timerlat")
    {
        bail!(
            "this kernel has no timerlat tracer ({AVAILABLE_TRACERS}: {}): build it with CONFIG_TIMERLAT_TRACER=y",
            tracers.trim()
        );
    }
    Ok(())
}

/// One CPU's timerlat figures.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TimerlatCore {
    pub cpu: u32,
    /// The timer IRQ's latency.
    pub irq: ThreadResult,
    /// The timerlat thread's wake-up latency, in the kernel.
    pub thread: ThreadResult,
    /// With user-space threads (`-u`): the latency on the thread's return
    /// to user space, as an RT application (and cyclictest) sees it.
    pub user: Option<ThreadResult>,
}

/// Which latency a histogram column holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Irq,
    Thread,
    User,
}

fn malformed(line: usize, message: impl Into<String>) -> ParseError {
    ParseError::Malformed {
        line,
        message: message.into(),
    }
}

/// `IRQ-001` / `Thr-001` / `Usr-001` → the kind and the CPU.
fn column(header: &str, line: usize) -> Result<(Kind, u32), ParseError> {
    let (kind, cpu) = header
        .split_once('-')
        .ok_or_else(|| malformed(line, format!("unexpected column {header:?}")))?;
    let kind = match kind {
        "IRQ" => Kind::Irq,
        "Thr" => Kind::Thread,
        "Usr" => Kind::User,
        _ => return Err(malformed(line, format!("unexpected column {header:?}"))),
    };
    let cpu = cpu
        .parse()
        .map_err(|_| malformed(line, format!("no CPU number in {header:?}")))?;
    Ok((kind, cpu))
}

fn counts(fields: &[&str], expected: usize, line: usize) -> Result<Vec<u64>, ParseError> {
    if fields.len() != expected {
        return Err(malformed(
            line,
            format!("{} values for {expected} columns", fields.len()),
        ));
    }
    fields
        .iter()
        .map(|f| {
            f.parse()
                .map_err(|_| malformed(line, format!("{f:?} is not a number")))
        })
        .collect()
}

/// The largest bucket accepted (1 s), as for cyclictest.
const MAX_BUCKET: u64 = 1_000_000;

/// The histogram being read: its columns and their results.
struct Columns {
    kinds: Vec<(Kind, u32)>,
    results: Vec<ThreadResult>,
}

impl Columns {
    fn bucket(&mut self, latency: u64, values: &[u64]) {
        let index = latency as usize;
        for (result, count) in self.results.iter_mut().zip(values) {
            if result.histogram.len() <= index {
                result.histogram.resize(index + 1, 0);
            }
            result.histogram[index] += count;
        }
    }

    /// A summary row (`count:`, `min:`, `avg:`, `max:`, `over:`); `-` (no
    /// sample) counts as 0.
    fn summary(&mut self, label: &str, fields: &[&str], line: usize) -> Result<(), ParseError> {
        let fields: Vec<&str> = fields.iter().map(|f| if *f == "-" { "0" } else { f }).collect();
        let values = counts(&fields, self.results.len(), line)?;
        for (result, value) in self.results.iter_mut().zip(values) {
            match label {
                "over:" => result.overflows = value,
                "count:" => result.samples = value,
                "min:" => result.min_us = value,
                "avg:" => result.avg_us = value as f64,
                _ => result.max_us = value,
            }
        }
        Ok(())
    }

    fn into_cores(self) -> Vec<TimerlatCore> {
        let mut cores: Vec<TimerlatCore> = Vec::new();
        for ((kind, cpu), mut result) in self.kinds.into_iter().zip(self.results) {
            result.cpu = Some(cpu);
            let index = match cores.iter().position(|c| c.cpu == cpu) {
                Some(index) => index,
                None => {
                    cores.push(TimerlatCore {
                        cpu,
                        ..TimerlatCore::default()
                    });
                    cores.len() - 1
                }
            };
            result.thread = index;
            match kind {
                Kind::Irq => cores[index].irq = result,
                Kind::Thread => cores[index].thread = result,
                Kind::User => cores[index].user = Some(result),
            }
        }
        cores
    }
}

/// Parses `rtla timerlat hist`'s histogram and per-CPU summary (bucket
/// size 1 µs). A CPU without samples has no columns, so it is absent.
pub fn parse_hist(text: &str) -> Result<Vec<TimerlatCore>, ParseError> {
    let mut columns: Option<Columns> = None;
    for (index, raw) in text.lines().enumerate() {
        let line = index + 1;
        if raw.trim() == HIT_STOP {
            break;
        }
        let fields: Vec<&str> = raw.split_whitespace().collect();
        let Some((first, rest)) = fields.split_first() else {
            continue;
        };
        if *first == "Index" && columns.is_none() {
            let kinds = rest
                .iter()
                .map(|h| column(h, line))
                .collect::<Result<Vec<_>, _>>()?;
            let results = vec![ThreadResult::default(); kinds.len()];
            columns = Some(Columns { kinds, results });
            continue;
        }
        let Some(table) = columns.as_mut() else {
            continue;
        };
        match *first {
            "ALL:" => break,
            "over:" | "count:" | "min:" | "avg:" | "max:" => table.summary(first, rest, line)?,
            bucket => {
                let latency: u64 = bucket
                    .parse()
                    .ok()
                    .filter(|l| *l <= MAX_BUCKET)
                    .ok_or_else(|| malformed(line, format!("{bucket:?} is not a histogram bucket")))?;
                let values = counts(rest, table.results.len(), line)?;
                table.bucket(latency, &values);
            }
        }
    }
    Ok(columns.ok_or(ParseError::NoHistogram)?.into_cores())
}

/// Whether rtla stopped because a latency crossed the threshold.
pub fn hit_stop(text: &str) -> bool {
    text.lines().any(|l| l.trim() == HIT_STOP)
}

/// Text from the traced system (a thread's `comm`) made safe to print: no
/// control or bidi characters.
fn printable(text: &str) -> String {
    text.chars()
        .map(|c| {
            let bidi =
                matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}');
            if c.is_control() || bidi { '?' } else { c }
        })
        .collect()
}

/// `27.49 us (65.52 %)` at the end of a line → (27.49, Some(65.52)); the text
/// before it is returned too.
fn figure(line: &str) -> Option<(&str, f64, Option<f64>)> {
    let (before, share) = match line.trim_end().strip_suffix("%)") {
        Some(rest) => {
            let (before, pct) = rest.rsplit_once('(')?;
            let pct = pct.trim().trim_end_matches('%').trim();
            (before.trim_end(), Some(pct.parse().ok()?))
        }
        None => (line.trim_end(), None),
    };
    let number = before.strip_suffix("us")?.trim_end();
    let (text, value) = number.rsplit_once(char::is_whitespace).unwrap_or(("", number));
    Some((text.trim_end(), value.parse().ok()?, share))
}

/// One line of an analysis, classified.
enum Line {
    /// `Label: [note] X us [(P %)]`, or a heading with no figure.
    Cause(Cause),
    /// `-> function` of the blocking thread's stack.
    Frame(String),
    /// `name[:id]  [X us]` under a cause.
    Source(Source),
    /// The `-----` rule before the total.
    Rule,
    /// Anything else (`Blocking thread stack trace`, blank).
    Other,
}

const CAUSE_LABELS: [&str; 9] = [
    "Previous IRQ interference",
    "IRQ handler delay",
    "IRQ latency",
    "Timerlat IRQ duration",
    "Blocking thread",
    "NMI interference",
    "IRQ interference",
    "Softirq interference",
    "Thread interference",
];

fn classify(raw: &str) -> Line {
    let line = raw.trim();
    if line.starts_with("----") {
        return Line::Rule;
    }
    if let Some(function) = line.strip_prefix("->") {
        return Line::Frame(printable(function.trim()));
    }
    if line.is_empty() || line == "Blocking thread stack trace" {
        return Line::Other;
    }
    let label = CAUSE_LABELS
        .iter()
        .chain(&["Thread latency"])
        .find(|label| line.starts_with(**label) && !line[label.len()..].starts_with(char::is_alphanumeric));
    if let Some(label) = label {
        let rest = line[label.len()..].trim_start_matches(':').trim();
        let (note_text, us, share_pct) = match figure(rest) {
            Some((note, us, share)) => (note, Some(us), share),
            None => (rest, None, None),
        };
        let note = note_text.trim_matches(|c| c == '(' || c == ')' || c == ' ');
        return Line::Cause(Cause {
            what: label.to_string(),
            us,
            share_pct,
            note: (!note.is_empty()).then(|| note.to_string()),
            sources: Vec::new(),
        });
    }
    let (name, us) = match figure(line) {
        Some((name, us, _)) => (name, Some(us)),
        None => (line, None),
    };
    Line::Source(Source {
        name: printable(&name.split_whitespace().collect::<Vec<_>>().join(" ")),
        us,
    })
}

/// The spike a `## CPU N hit stop tracing` block describes.
fn spike_of(cpu: u32, block: &[&str]) -> Spike {
    let mut spike = Spike {
        cpu,
        ..Spike::default()
    };
    let mut after_rule = false;
    for raw in block {
        match classify(raw) {
            Line::Rule => after_rule = true,
            Line::Frame(function) => spike.stack.push(function),
            Line::Cause(cause) if after_rule => {
                // The total: `Thread latency:` or `IRQ latency:`, 100 %.
                spike.kind = if cause.what == "IRQ latency" {
                    "irq"
                } else {
                    "thread"
                }
                .into();
                spike.latency_us = cause.us.unwrap_or(0.0);
            }
            Line::Cause(cause) => spike.causes.push(cause),
            Line::Source(source) => {
                if let Some(cause) = spike.causes.last_mut() {
                    cause.sources.push(source);
                }
            }
            Line::Other => {}
        }
    }
    spike
}

/// The spikes rtla's auto-analysis explains after [`HIT_STOP`]: one per
/// `## CPU N hit stop tracing, analyzing it ##` block. Lines it does not
/// know are skipped, so a newer rtla's additions cost nothing.
pub fn parse_analysis(text: &str) -> Vec<Spike> {
    let lines: Vec<&str> = text.lines().collect();
    let starts: Vec<(usize, u32)> = lines
        .iter()
        .enumerate()
        .filter_map(|(i, l)| {
            let cpu = l
                .trim()
                .strip_prefix("## CPU ")?
                .strip_suffix(" hit stop tracing, analyzing it ##")?;
            Some((i, cpu.trim().parse().ok()?))
        })
        .collect();
    starts
        .iter()
        .enumerate()
        .map(|(n, (start, cpu))| {
            let end = starts.get(n + 1).map_or(lines.len(), |next| next.0);
            let block: Vec<&str> = lines[start + 1..end]
                .iter()
                .take_while(|l| {
                    let l = l.trim();
                    !l.starts_with("Max timerlat IRQ latency from idle")
                        && !l.starts_with("Saving trace")
                        && !l.starts_with("Printing CPU tasks")
                })
                .copied()
                .collect();
            spike_of(*cpu, &block)
        })
        .collect()
}

/// The one-line summary of a spike for the table: its total, then each
/// cause with a share, largest first, with the first source it names.
pub fn spike_line(spike: &Spike) -> String {
    let mut causes: Vec<&Cause> = spike.causes.iter().filter(|c| c.share_pct.is_some()).collect();
    causes.sort_by(|a, b| {
        b.share_pct
            .partial_cmp(&a.share_pct)
            .unwrap_or(std::cmp::Ordering::Equal)
    });
    let parts: Vec<String> = causes
        .iter()
        .map(|c| {
            let source = c
                .sources
                .first()
                .map_or(String::new(), |s| format!(" {}", s.name));
            format!(
                "{} {:.2} us ({:.1} %){source}",
                c.what.to_lowercase(),
                c.us.unwrap_or(0.0),
                c.share_pct.unwrap_or(0.0)
            )
        })
        .collect();
    let blocking = spike
        .causes
        .iter()
        .find(|c| c.what == "Blocking thread" && c.share_pct.is_none())
        .and_then(|c| c.sources.first())
        .map_or(String::new(), |s| format!("; running: {}", s.name));
    format!(
        "spike  cpu {} {} latency {:.2} us: {}{blocking}",
        spike.cpu,
        spike.kind,
        spike.latency_us,
        if parts.is_empty() {
            "no breakdown".into()
        } else {
            parts.join(", ")
        }
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpus::CpuSet;

    fn fixture(name: &str) -> String {
        std::fs::read_to_string(format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"))).unwrap()
    }

    #[test]
    fn arguments_measure_the_rt_cpus_like_cyclictest() {
        let params = RunParams {
            duration_s: 10,
            interval_us: 200,
            priority: 99,
            rt_cpus: CpuSet::parse("1,3").unwrap(),
            housekeeping: CpuSet::parse("0,2").unwrap(),
            histogram_max_us: 1000,
        };
        let args = arguments(&params, None).join(" ");
        assert_eq!(
            args,
            "timerlat hist -u -c 1,3 -H 0,2 -d 10 -p 200 -P f:99 -b 1 -E 1000 --dma-latency 0 --no-aa"
        );
        let args = arguments(&params, Some(50)).join(" ");
        assert!(args.ends_with("--dma-latency 0 -i 50 -T 50 -s 50"), "{args}");
        assert!(!args.contains("--no-aa"));
    }

    const HIST: &str = "\
# RTLA timerlat histogram
# Time unit is microseconds (us)
# Duration:   0 00:00:10
Index   IRQ-001   Thr-001   IRQ-003   Thr-003
0         40         0        10         0
1         10        30        40         5
7          0        20         0        45
over:      0         0         0         1
count:    50        50        50        51
min:       0         1         0         1
avg:       0         3         1         6
max:       1         7         1      1203
ALL:        IRQ       Thr
count:    100       101
min:        0         1
avg:        0         4
max:        1      1203
";

    #[test]
    fn histogram_and_summary_per_cpu_and_kind() {
        let cores = parse_hist(HIST).unwrap();
        assert_eq!(cores.len(), 2);
        let (one, three) = (&cores[0], &cores[1]);
        assert_eq!((one.cpu, three.cpu), (1, 3));
        assert_eq!(one.irq.histogram, vec![40, 10, 0, 0, 0, 0, 0, 0]);
        assert_eq!(one.thread.histogram, vec![0, 30, 0, 0, 0, 0, 0, 20]);
        assert_eq!(
            (one.thread.samples, one.thread.min_us, one.thread.max_us),
            (50, 1, 7)
        );
        assert_eq!(one.thread.avg_us, 3.0);
        assert_eq!(one.irq.cpu, Some(1));
        assert_eq!((three.thread.overflows, three.thread.max_us), (1, 1203));
        assert_eq!(three.irq.samples, 50);
        assert_eq!(one.user, None);
    }

    #[test]
    fn user_threads_add_their_column() {
        let text = "Index   IRQ-001   Thr-001   Usr-001\n142  1  0  0\n150  0  1  1\nover: 0 0 0\ncount: 1 1 1\nmin: 142 150 150\navg: 142 150 150\nmax: 142 150 150\n";
        let cores = parse_hist(text).unwrap();
        let user = cores[0].user.as_ref().unwrap();
        assert_eq!((user.samples, user.max_us, user.cpu), (1, 150, Some(1)));
        assert_eq!(cores[0].irq.max_us, 142);
    }

    #[test]
    fn bad_histograms_are_errors() {
        assert_eq!(parse_hist("nothing here\n"), Err(ParseError::NoHistogram));
        assert!(parse_hist("Index IRQ-001 Thr-001\n0 1\n").is_err(), "short row");
        assert!(parse_hist("Index IRQ-001 Thr-001\n0 1 x\n").is_err());
        assert!(parse_hist("Index IRQ-001 Osn-001\n").is_err());
        assert!(parse_hist("Index IRQ-x\n").is_err());
        assert!(
            parse_hist("Index IRQ-001\n99999999 1\n").is_err(),
            "bucket beyond 1 s"
        );
        assert!(parse_hist("Index IRQ-001\nmax: 1 2\n").is_err());
    }

    const ANALYSIS: &str = "\
rtla timerlat hit stop tracing
## CPU 3 hit stop tracing, analyzing it ##
  Previous IRQ interference:                  up to       2.22 us
  IRQ handler delay:                 (exit from idle)        1.34 us (2.89 %)
  IRQ latency:                                               2.53 us
  Timerlat IRQ duration:                                    10.97 us (23.67 %)
  Blocking thread:                                          27.52 us (59.39 %)
                        objtool:49256                       27.52 us
    Blocking thread stack trace
                -> timerlat_irq
                -> __hrtimer_run_queues
  IRQ interference                                           1.68 us (3.63 %)
                  local_timer:236                            1.68 us
------------------------------------------------------------------------
  Thread latency:                                           46.34 us (100%)

Max timerlat IRQ latency from idle: 17.40 us in cpu 4
  Saving trace to timerlat_trace.txt
";

    #[test]
    fn a_thread_spike_with_its_causes_sources_and_stack() {
        assert!(hit_stop(ANALYSIS));
        assert!(!hit_stop(HIST));
        let spikes = parse_analysis(ANALYSIS);
        assert_eq!(spikes.len(), 1);
        let spike = &spikes[0];
        assert_eq!(
            (spike.cpu, spike.kind.as_str(), spike.latency_us),
            (3, "thread", 46.34)
        );
        let whats: Vec<&str> = spike.causes.iter().map(|c| c.what.as_str()).collect();
        assert_eq!(
            whats,
            [
                "Previous IRQ interference",
                "IRQ handler delay",
                "IRQ latency",
                "Timerlat IRQ duration",
                "Blocking thread",
                "IRQ interference"
            ]
        );
        let delay = &spike.causes[1];
        assert_eq!((delay.us, delay.share_pct), (Some(1.34), Some(2.89)));
        assert_eq!(delay.note.as_deref(), Some("exit from idle"));
        assert_eq!(spike.causes[0].note.as_deref(), Some("up to"));
        assert_eq!(spike.causes[2].share_pct, None);
        let blocking = &spike.causes[4];
        assert_eq!(blocking.sources[0].name, "objtool:49256");
        assert_eq!(blocking.sources[0].us, Some(27.52));
        assert_eq!(spike.causes[5].sources[0].name, "local_timer:236");
        assert_eq!(spike.stack, ["timerlat_irq", "__hrtimer_run_queues"]);
        let line = spike_line(spike);
        assert!(
            line.starts_with(
                "spike  cpu 3 thread latency 46.34 us: blocking thread 27.52 us (59.4 %) objtool:49256, timerlat irq duration"
            ),
            "{line}"
        );
    }

    #[test]
    fn an_irq_spike_names_the_thread_that_ran() {
        let text = "\
## CPU 1 hit stop tracing, analyzing it ##
  IRQ handler delay:                                         0.98 us (8.00 %)
  IRQ latency:                                              12.25 us
  Blocking thread:
                            sshd:812
------------------------------------------------------------------------
     IRQ latency:                                           12.25 us (100%)
";
        let spike = &parse_analysis(text)[0];
        assert_eq!(
            (spike.cpu, spike.kind.as_str(), spike.latency_us),
            (1, "irq", 12.25)
        );
        assert_eq!(spike.causes[2].sources[0].name, "sshd:812");
        assert_eq!(spike.causes[2].us, None);
        assert!(
            spike_line(spike).ends_with("; running: sshd:812"),
            "{}",
            spike_line(spike)
        );
    }

    #[test]
    fn hostile_names_are_made_printable() {
        let text = "## CPU 0 hit stop tracing, analyzing it ##\n  Blocking thread:   1.00 us (1.00 %)\n   evil\u{1b}[2J\u{202e}:1   1.00 us\n";
        let spike = &parse_analysis(text)[0];
        assert_eq!(spike.causes[0].sources[0].name, "evil?[2J?:1");
    }

    /// rtla 6.12 (bookworm-backports) in the live image under QEMU TCG:
    /// `jitter 10 --tool timerlat --save-output`, user-space threads.
    #[test]
    fn real_rtla_histogram_from_the_live_image() {
        let text = fixture("rtla-6.12-timerlat-hist.txt");
        let cores = parse_hist(&text).unwrap();
        assert_eq!(cores.len(), 1);
        let core = &cores[0];
        assert_eq!(core.cpu, 1);
        let user = core.user.as_ref().expect("a Usr column");
        for figures in [&core.irq, &core.thread, user] {
            assert!(figures.samples > 40_000, "{figures:?}");
            let counted: u64 = figures.histogram.iter().sum::<u64>() + figures.overflows;
            assert_eq!(counted, figures.samples);
            assert!(figures.min_us <= figures.avg_us as u64 && figures.avg_us as u64 <= figures.max_us);
        }
        assert!(!hit_stop(&text));
        assert!(parse_analysis(&text).is_empty());
    }

    /// The same with `--trace-threshold 1`: rtla stops at the first sample,
    /// an IRQ latency, and analyses it.
    #[test]
    fn real_rtla_stop_and_analysis_from_the_live_image() {
        let text = fixture("rtla-6.12-timerlat-stop.txt");
        let core = &parse_hist(&text).unwrap()[0];
        assert_eq!((core.irq.samples, core.thread.samples), (1, 0));
        assert_eq!(core.irq.histogram[103], 1);
        assert!(hit_stop(&text));
        let spikes = parse_analysis(&text);
        assert_eq!(spikes.len(), 1);
        let spike = &spikes[0];
        assert_eq!(
            (spike.cpu, spike.kind.as_str(), spike.latency_us),
            (1, "irq", 103.36)
        );
        let whats: Vec<&str> = spike.causes.iter().map(|c| c.what.as_str()).collect();
        assert_eq!(whats, ["IRQ handler delay", "IRQ latency", "Blocking thread"]);
        assert_eq!(spike.causes[0].share_pct, Some(0.0));
        assert_eq!(spike.causes[2].sources[0].name, ":0");
    }

    proptest::proptest! {
        #[test]
        fn parsers_never_panic(text in "\\PC*") {
            let _ = parse_hist(&text);
            let _ = parse_analysis(&text);
        }

        #[test]
        fn analysis_like_text_never_panics(rows in proptest::collection::vec("[ #A-Za-z:>()%-]{0,20}[0-9. ]{0,12}(us)?( \\([0-9.]{1,5} %\\))?", 0..12)) {
            let text = format!("## CPU 0 hit stop tracing, analyzing it ##\n{}", rows.join("\n"));
            let _ = parse_analysis(&text);
        }
    }
}
