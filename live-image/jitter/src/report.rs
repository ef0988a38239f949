//! The report: a human table, versioned JSON (the shared types of
//! [`rtreport::report`]), and an OSADL-style SVG plot.

use std::fmt::Write as _;

pub use rtreport::report::{
    Assessment, ContainerSection, CoreStats, KernelInfo, Latency, Report, RunInfo, SCHEMA, Tool, Tuning,
};

use crate::cyclictest::ThreadResult;

/// `[latency_us, count]` for every non-empty bucket.
fn sparse(histogram: &[u64]) -> Vec<(u64, u64)> {
    histogram
        .iter()
        .enumerate()
        .filter(|(_, c)| **c > 0)
        .map(|(l, c)| (l as u64, *c))
        .collect()
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
            histogram: sparse(&t.histogram),
            irq: None,
            kernel_thread: None,
        }
    }
}

impl From<&ThreadResult> for Latency {
    fn from(t: &ThreadResult) -> Self {
        Latency {
            samples: t.samples,
            min_us: t.min_us,
            avg_us: t.avg_us,
            max_us: t.max_us,
            overflows: t.overflows,
            histogram: sparse(&t.histogram),
        }
    }
}

fn opt(v: Option<u64>) -> String {
    v.map_or("ovfl".to_string(), |v| v.to_string())
}

/// `min/avg/max` of a latency, or nothing.
fn min_avg_max(latency: Option<&Latency>) -> String {
    latency.map_or(String::new(), |l| {
        format!("{}/{:.1}/{}", l.min_us, l.avg_us, l.max_us)
    })
}

/// One row per core: the latency figures, and with timerlat (whose row
/// figures are the RT thread's latency in user space) the timer IRQ's and
/// the thread's latency in the kernel.
fn cores_table(out: &mut String, cores: &[CoreStats], timerlat: bool) {
    let _ = write!(
        out,
        "{:>5} {:>10} {:>6} {:>8} {:>6} {:>7} {:>7} {:>9}",
        "cpu", "samples", "min", "avg", "p99", "p99.9", "max", "overflow"
    );
    let extra = if timerlat {
        "  irq min/avg/max  kthread min/avg/max"
    } else {
        ""
    };
    let _ = writeln!(out, "{extra}");
    for core in cores {
        let _ = write!(
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
        let split = format!(
            "  {:<15}  {}",
            min_avg_max(core.irq.as_ref()),
            min_avg_max(core.kernel_thread.as_ref())
        );
        let _ = writeln!(out, "{}", if timerlat { split.trim_end() } else { "" });
    }
}

/// The human table printed on stdout.
pub fn table(report: &Report) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "jitter {}: {} {} s, interval {} us, budget {} us",
        report.jitter_version,
        report.run.tool,
        report.run.duration_s,
        report.run.interval_us,
        report.run.budget_us
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
    cores_table(&mut out, &report.cores, report.run.tool == Tool::Timerlat);
    let _ = writeln!(out);
    for spike in &report.spikes {
        let _ = writeln!(out, "{}", crate::timerlat::spike_line(spike));
    }
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
    if let Some(container) = &report.container {
        container_table(&mut out, container);
    }
    out
}

/// The `--container` measurement, its verdict and the difference's.
fn container_table(out: &mut String, container: &ContainerSection) {
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "container {} (one per RT CPU: pinned, SYS_NICE and IPC_LOCK only, rtprio 99, no network)",
        container.image
    );
    cores_table(out, &container.cores, false);
    let difference = &container.difference;
    let worst_cpu = container
        .assessment
        .worst_cpu
        .map_or("?".into(), |c| c.to_string());
    let _ = writeln!(
        out,
        "container worst case: {} us on cpu {worst_cpu}; host {} us; the container adds {:+} us (container budget {} us)",
        difference.container_worst_us, difference.host_worst_us, difference.extra_us, difference.budget_us
    );
    let _ = writeln!(
        out,
        "CONTAINER VERDICT: {}; DIFFERENCE: {}",
        container.assessment.verdict, difference.verdict
    );
    for reason in &container.assessment.reasons {
        let _ = writeln!(out, "  - {}: {}", reason.code, reason.detail);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timerlat_table_splits_each_core_and_lists_the_spikes() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/jitter-report-2.json");
        let mut report: Report = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        report.run.tool = Tool::Timerlat;
        let latency = |min_us, max_us| Latency {
            samples: 10,
            min_us,
            avg_us: 5.0,
            max_us,
            ..Latency::default()
        };
        report.cores[1].irq = Some(latency(2, 30));
        report.cores[1].kernel_thread = Some(latency(4, 41));
        report.spikes = crate::timerlat::parse_analysis(
            "## CPU 1 hit stop tracing, analyzing it ##\n  Blocking thread:  9.00 us (90.00 %)\n                 kworker/1:0:77     9.00 us\n------\n  Thread latency:  10.00 us (100%)\n",
        );
        let table = table(&report);
        assert!(table.starts_with("jitter 0.1.0: timerlat 2 s"), "{table}");
        assert!(table.contains("irq min/avg/max  kthread min/avg/max"), "{table}");
        assert!(table.contains("2/5.0/30         4/5.0/41"), "{table}");
        assert!(
            table.contains(
                "spike  cpu 1 thread latency 10.00 us: blocking thread 9.00 us (90.0 %) kworker/1:0:77"
            ),
            "{table}"
        );
    }

    #[test]
    fn a_container_section_is_tabled_and_takes_part_in_the_verdict() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/jitter-report-2.json");
        let mut report: Report = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let fixture = report.assessment.clone();
        let pass = |worst_us| Assessment {
            verdict: rtreport::report::Verdict::Pass,
            reasons: Vec::new(),
            worst_us,
            ..fixture.clone()
        };
        report.assessment = pass(20);
        let options = crate::container::ContainerOptions {
            image: "localhost/rt-test".into(),
            budget_us: 10,
        };
        report.container = Some(crate::container::section(
            &options,
            vec![vec!["podman".into(), "run".into()]],
            &[],
            pass(35),
            &report.assessment,
        ));
        let table = table(&report);
        assert!(
            table.contains("container localhost/rt-test (one per RT CPU"),
            "{table}"
        );
        assert!(
            table.contains("container worst case: 35 us on cpu 1; host 20 us; the container adds +15 us (container budget 10 us)"),
            "{table}"
        );
        assert!(
            table.contains("CONTAINER VERDICT: PASS; DIFFERENCE: FAIL"),
            "{table}"
        );
        assert_eq!(
            report.verdict(),
            rtreport::report::Verdict::Fail,
            "the difference fails the run"
        );
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["container"]["difference"]["extra_us"], 15);
        assert_eq!(json["container"]["difference"]["verdict"], "FAIL");
        let back: Report = serde_json::from_value(json).unwrap();
        assert_eq!(back, report);
    }

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
