//! The report: a human table, versioned JSON, and an OSADL-style SVG plot.

use std::fmt::Write as _;

use rtcheck::Evidence;
use serde::{Deserialize, Serialize};

use crate::cpus::CpuSet;
use crate::cyclictest::ThreadResult;
use crate::system::Irq;
use crate::verdict::{Assessment, LoadReport, Verdict};

/// Bumped on any incompatible change to the JSON report.
pub const SCHEMA: &str = "jitter-report/1";

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct KernelInfo {
    pub release: String,
    pub uts_version: String,
    pub preempt_rt: bool,
    pub evidence: Evidence,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Tuning {
    pub rt_cpus: CpuSet,
    pub housekeeping: CpuSet,
    pub cmdline_isolated: CpuSet,
    pub sysfs_isolated: CpuSet,
    pub nohz_full: CpuSet,
    pub irqs_on_rt_cpus: Vec<Irq>,
    pub governors: std::collections::BTreeMap<u32, Option<String>>,
    pub hypervisor: Option<String>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RunInfo {
    pub duration_s: u64,
    pub interval_us: u32,
    pub priority: u32,
    pub budget_us: u64,
    pub histogram_max_us: u32,
    pub cyclictest_args: Vec<String>,
    pub load: LoadReport,
    /// True under emulation or virtualization, where latencies are functional only.
    pub functional_only: bool,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
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
}

impl From<&ThreadResult> for CoreStats {
    fn from(t: &ThreadResult) -> Self {
        CoreStats {
            cpu: t.cpu,
            samples: t.samples,
            min_us: t.min_us,
            avg_us: t.avg_us,
            p99_us: t.percentile(0.99),
            p99_9_us: t.percentile(0.999),
            max_us: t.max_us,
            overflows: t.overflows,
            histogram: t
                .histogram
                .iter()
                .enumerate()
                .filter(|(_, c)| **c > 0)
                .map(|(l, c)| (l as u64, *c))
                .collect(),
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Report {
    pub schema: String,
    pub jitter_version: String,
    pub kernel: KernelInfo,
    pub cmdline: String,
    pub tuning: Tuning,
    pub run: RunInfo,
    pub cores: Vec<CoreStats>,
    pub assessment: Assessment,
}

fn opt(v: Option<u64>) -> String {
    v.map_or("ovfl".to_string(), |v| v.to_string())
}

impl Report {
    pub fn verdict(&self) -> Verdict {
        self.assessment.verdict
    }

    /// The human table printed on stdout.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "jitter {}: cyclictest {} s, interval {} us, budget {} us",
            self.jitter_version, self.run.duration_s, self.run.interval_us, self.run.budget_us
        );
        let _ = writeln!(
            out,
            "kernel   {} {} (PREEMPT_RT: {})",
            self.kernel.release,
            self.kernel.uts_version,
            if self.kernel.preempt_rt { "yes" } else { "NO" }
        );
        let _ = writeln!(
            out,
            "cpus     RT {} | housekeeping {}",
            self.tuning.rt_cpus, self.tuning.housekeeping
        );
        let load = &self.run.load;
        if load.enabled {
            let _ = writeln!(
                out,
                "load     on cpu {}: hackbench x{}, {} burner(s), {} MiB written to tmpfs",
                load.cpus,
                load.hackbench_runs,
                load.burner_threads,
                load.io_bytes >> 20
            );
        } else {
            let _ = writeln!(out, "load     none (--no-load)");
        }
        let _ = writeln!(out);
        let _ = writeln!(
            out,
            "{:>5} {:>10} {:>6} {:>8} {:>6} {:>7} {:>7} {:>9}",
            "cpu", "samples", "min", "avg", "p99", "p99.9", "max", "overflow"
        );
        for core in &self.cores {
            let _ = writeln!(
                out,
                "{:>5} {:>10} {:>6} {:>8.1} {:>6} {:>7} {:>7} {:>9}",
                core.cpu.map_or("?".into(), |c| c.to_string()),
                core.samples,
                core.min_us,
                core.avg_us,
                opt(core.p99_us),
                opt(core.p99_9_us),
                core.max_us,
                core.overflows
            );
        }
        let _ = writeln!(out);
        let worst_cpu = self.assessment.worst_cpu.map_or("?".into(), |c| c.to_string());
        let _ = writeln!(
            out,
            "worst case: {} us on cpu {} (budget {} us)",
            self.assessment.worst_us, worst_cpu, self.run.budget_us
        );
        if self.run.functional_only {
            let _ = writeln!(
                out,
                "note: virtualized or emulated CPU: latency figures are functional only"
            );
        }
        let _ = writeln!(out, "VERDICT: {}", self.assessment.verdict);
        for reason in &self.assessment.reasons {
            let _ = writeln!(
                out,
                "  - {}: {}",
                serde_json::to_value(reason.code)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_default(),
                reason.detail
            );
        }
        out
    }
}

/// Draws the latency histograms: latency on x, log-scale count on y, one
/// series per core, the budget as a vertical line.
pub fn svg(report: &Report) -> anyhow::Result<String> {
    use plotters::prelude::*;
    let mut out = String::new();
    let max_latency = report
        .cores
        .iter()
        .flat_map(|c| c.histogram.last().map(|b| b.0))
        .max()
        .unwrap_or(0)
        .max(report.run.budget_us)
        + 5;
    let max_count = report
        .cores
        .iter()
        .flat_map(|c| c.histogram.iter().map(|b| b.1))
        .max()
        .unwrap_or(1)
        .max(10);
    {
        let root = SVGBackend::with_string(&mut out, (1000, 600)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| anyhow::anyhow!("{e}"))?;
        let title = format!(
            "Latency histogram: {} ({} s, {})",
            report.kernel.release, report.run.duration_s, report.assessment.verdict
        );
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(0u64..max_latency, (1u64..max_count * 2).log_scale())
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        chart
            .configure_mesh()
            .x_desc("latency (us)")
            .y_desc("samples (log)")
            .draw()
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        for (index, core) in report.cores.iter().enumerate() {
            let color = Palette99::pick(index).to_rgba();
            let label = format!("cpu {}", core.cpu.map_or("?".into(), |c| c.to_string()));
            // Each bucket as a step so single spikes stay visible.
            let points: Vec<(u64, u64)> = core.histogram.iter().map(|(l, c)| (*l, (*c).max(1))).collect();
            chart
                .draw_series(LineSeries::new(points, color.stroke_width(2)))
                .map_err(|e| anyhow::anyhow!("{e}"))?
                .label(label)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
        }
        let budget = report.run.budget_us;
        chart
            .draw_series(std::iter::once(PathElement::new(
                vec![(budget, 1), (budget, max_count * 2)],
                RED.stroke_width(1),
            )))
            .map_err(|e| anyhow::anyhow!("{e}"))?
            .label(format!("budget {budget} us"))
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], RED));
        chart
            .configure_series_labels()
            .border_style(BLACK)
            .background_style(WHITE.mix(0.8))
            .draw()
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        root.present().map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    Ok(out)
}
