//! The report: a human table, versioned JSON (the shared types of
//! [`rtcheck::jitter`]), and an OSADL-style SVG plot.

use std::fmt::Write as _;

pub use rtcheck::jitter::{CoreStats, KernelInfo, Report, RunInfo, SCHEMA, Tuning};

use crate::cyclictest::ThreadResult;

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

fn opt(v: Option<u64>) -> String {
    v.map_or("ovfl".to_string(), |v| v.to_string())
}

/// The human table printed on stdout.
pub fn table(report: &Report) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "jitter {}: cyclictest {} s, interval {} us, budget {} us",
        report.jitter_version, report.run.duration_s, report.run.interval_us, report.run.budget_us
    );
    let _ = writeln!(
        out,
        "kernel   {} {} (PREEMPT_RT: {})",
        report.kernel.release,
        report.kernel.uts_version,
        if report.kernel.preempt_rt { "yes" } else { "NO" }
    );
    let _ = writeln!(
        out,
        "cpus     RT {} | housekeeping {}",
        report.tuning.rt_cpus, report.tuning.housekeeping
    );
    let load = &report.run.load;
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
    for core in &report.cores {
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
    let worst_cpu = report.assessment.worst_cpu.map_or("?".into(), |c| c.to_string());
    let _ = writeln!(
        out,
        "worst case: {} us on cpu {} (budget {} us)",
        report.assessment.worst_us, worst_cpu, report.run.budget_us
    );
    if let Some(tail) = &report.tail {
        let _ = writeln!(out, "tail: {}", tail.sentence(report.run.interval_us));
        for q in &tail.quantiles {
            let bound = q
                .upper_us
                .map_or("beyond the histogram".into(), |us| format!("at most {us} us"));
            let _ = writeln!(
                out,
                "      {} observed {} us; at 95 % confidence {bound}",
                q.quantile, q.observed_us
            );
        }
    }
    if report.run.functional_only {
        let _ = writeln!(
            out,
            "note: virtualized or emulated CPU: latency figures are functional only"
        );
    }
    let _ = writeln!(out, "VERDICT: {}", report.assessment.verdict);
    for reason in &report.assessment.reasons {
        let _ = writeln!(out, "  - {}: {}", reason.code, reason.detail);
    }
    for warning in &report.assessment.warnings {
        let _ = writeln!(out, "WARN   {}: {}", warning.code, warning.detail);
    }
    out
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names_the_verdict_and_each_reason_by_its_code() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/jitter-report-1.json");
        let report: Report = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let table = table(&report);
        assert!(table.contains("cpus     RT 1 | housekeeping 0"), "{table}");
        assert!(
            table.contains("worst case: 1431 us on cpu 1 (budget 100 us)"),
            "{table}"
        );
        assert!(table.contains("VERDICT: INVALID"), "{table}");
        assert!(
            table.contains("  - irqs-on-rt-cpus: 1 IRQs may fire on RT CPUs"),
            "{table}"
        );
        assert!(
            table.contains("  - hypervisor: running under a hypervisor"),
            "{table}"
        );
    }
}
