//! The verdict: PASS, FAIL or INVALID, with every reason a measurement
//! cannot be trusted. Pure: everything it needs is passed in.

use std::collections::BTreeMap;

use rtcheck::Evidence;
pub use rtreport::report::{Assessment, LoadReport, Reason, ReasonCode, Verdict};

use crate::conformance::{self, Conformance, Status};
use crate::cpus::CpuSet;
use crate::cyclictest::ThreadResult;
use crate::system::Irq;

/// The process exit status for a verdict: 0 PASS, 3 FAIL, 4 INVALID (1 and 2
/// are errors and usage).
pub fn exit_code(verdict: Verdict) -> u8 {
    verdict.exit_code()
}

/// `None` when the load ran as intended, else why not.
pub fn load_problem(load: &LoadReport) -> Option<String> {
    if !load.enabled {
        return Some("load disabled (--no-load): an idle system says nothing about the worst case".into());
    }
    let mut problems = Vec::new();
    if load.hackbench_runs == 0 {
        problems.push("hackbench never ran".to_string());
    }
    if load.hackbench_failures > 0 {
        problems.push(format!("hackbench failed {} times", load.hackbench_failures));
    }
    if load.burner_threads == 0 {
        problems.push("no CPU burner ran".to_string());
    }
    if load.io_bytes == 0 {
        problems.push("the I/O writer wrote nothing".to_string());
    }
    (!problems.is_empty()).then(|| problems.join("; "))
}

pub struct Inputs<'a> {
    pub kernel: &'a Evidence,
    pub rt_cpus: &'a CpuSet,
    /// CPUs the command line isolates (isolcpus + nohz_full).
    pub cmdline_isolated: &'a CpuSet,
    /// `/sys/devices/system/cpu/isolated`.
    pub sysfs_isolated: &'a CpuSet,
    pub irqs: &'a [Irq],
    pub governors: &'a BTreeMap<u32, Option<String>>,
    pub hypervisor: Option<&'a str>,
    pub threads: &'a [ThreadResult],
    pub duration_s: u64,
    pub interval_us: u32,
    pub budget_us: u64,
    pub load: &'a LoadReport,
    /// The conformance checks run before measuring. Those judged from the
    /// fields above as well (IRQs, governors) are not counted twice.
    pub conformance: &'a [Conformance],
}

/// Samples a core must deliver: 95% of what the duration and interval allow.
pub fn samples_needed(duration_s: u64, interval_us: u32) -> u64 {
    (duration_s as f64 * 1e6 / interval_us.max(1) as f64 * 0.95).floor() as u64
}

pub fn assess(inputs: &Inputs) -> Assessment {
    let mut reasons = Vec::new();
    let mut add = |code, detail: String| reasons.push(Reason { code, detail });

    let kernel_failures: Vec<String> = inputs
        .kernel
        .failures()
        .map(|c| format!("{}: {}", c.id, c.detail))
        .collect();
    let uname_ok = inputs
        .kernel
        .get(rtcheck::evidence::id::BOOT_UNAME)
        .is_some_and(|c| c.status == rtcheck::Status::Pass);
    if !kernel_failures.is_empty() || !uname_ok {
        let detail = if kernel_failures.is_empty() {
            "no PREEMPT_RT evidence".to_string()
        } else {
            kernel_failures.join("; ")
        };
        add(
            ReasonCode::NotPreemptRt,
            format!("the kernel is not PREEMPT_RT ({detail})"),
        );
    }

    let not_on_cmdline = inputs.rt_cpus.difference(inputs.cmdline_isolated);
    let not_in_sysfs = inputs.rt_cpus.difference(inputs.sysfs_isolated);
    if !not_on_cmdline.is_empty() || !not_in_sysfs.is_empty() {
        let mut parts = Vec::new();
        if !not_on_cmdline.is_empty() {
            parts.push(format!(
                "CPUs {not_on_cmdline} are not in isolcpus/nohz_full on the command line"
            ));
        }
        if !not_in_sysfs.is_empty() {
            parts.push(format!(
                "CPUs {not_in_sysfs} are not in /sys/devices/system/cpu/isolated"
            ));
        }
        add(ReasonCode::NotIsolated, parts.join("; "));
    }

    if let Some(detail) = conformance::irqs_on_rt_cpus(inputs.irqs, inputs.rt_cpus) {
        add(ReasonCode::IrqsOnRtCpus, detail);
    }
    if let Some(detail) = conformance::governors_not_performance(inputs.governors, inputs.rt_cpus) {
        add(ReasonCode::GovernorNotPerformance, detail);
    }

    let mut warnings = Vec::new();
    for check in inputs.conformance {
        if matches!(
            check.code,
            ReasonCode::IrqsOnRtCpus | ReasonCode::GovernorNotPerformance
        ) {
            continue;
        }
        let reason = Reason {
            code: check.code,
            detail: check.detail.clone(),
        };
        match check.status {
            Status::Pass => {}
            Status::Warn => warnings.push(reason),
            Status::Invalid => add(reason.code, reason.detail),
        }
    }

    if let Some(why) = inputs.hypervisor {
        add(
            ReasonCode::Hypervisor,
            format!("running under a hypervisor ({why}): latencies are the host's, not this hardware's"),
        );
    }

    let needed = samples_needed(inputs.duration_s, inputs.interval_us);
    let measured: CpuSet = CpuSet(inputs.threads.iter().filter_map(|t| t.cpu).collect());
    let missing = inputs.rt_cpus.difference(&measured);
    if !missing.is_empty() {
        add(
            ReasonCode::TooFewSamples,
            format!("CPUs {missing} were not measured"),
        );
    }
    for thread in inputs.threads.iter().filter(|t| t.samples < needed) {
        add(
            ReasonCode::TooFewSamples,
            format!(
                "cpu{} delivered {} samples, {} needed (95% of {} s at {} us)",
                thread.cpu.map_or("?".into(), |c| c.to_string()),
                thread.samples,
                needed,
                inputs.duration_s,
                inputs.interval_us
            ),
        );
    }

    if let Some(problem) = load_problem(inputs.load) {
        add(ReasonCode::LoadDidNotRun, problem);
    }

    let worst = inputs.threads.iter().max_by_key(|t| t.max_us);
    let worst_us = worst.map_or(0, |t| t.max_us);
    let overflowed: Vec<String> = inputs
        .threads
        .iter()
        .filter(|t| t.overflows > 0 && t.max_us <= inputs.budget_us)
        .map(|t| format!("cpu{}", t.cpu.map_or("?".into(), |c| c.to_string())))
        .collect();
    if !overflowed.is_empty() {
        add(
            ReasonCode::HistogramOverflow,
            format!(
                "histogram overflowed on {} within budget; raise --histogram-max",
                overflowed.join(", ")
            ),
        );
    }

    let verdict = if !reasons.is_empty() {
        Verdict::Invalid
    } else if worst_us > inputs.budget_us {
        Verdict::Fail
    } else {
        Verdict::Pass
    };
    Assessment {
        verdict,
        reasons,
        worst_cpu: worst.and_then(|t| t.cpu),
        worst_us,
        samples_needed: needed,
        warnings,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rtcheck::evidence::check_running_kernel;

    struct Case {
        kernel: Evidence,
        rt: CpuSet,
        cmdline: CpuSet,
        sysfs: CpuSet,
        irqs: Vec<Irq>,
        governors: BTreeMap<u32, Option<String>>,
        hypervisor: Option<&'static str>,
        threads: Vec<ThreadResult>,
        load: LoadReport,
        conformance: Vec<Conformance>,
    }

    fn good() -> Case {
        let rt = CpuSet::parse("1-2").unwrap();
        Case {
            kernel: check_running_kernel("#1 SMP PREEMPT_RT x", Some("CONFIG_PREEMPT_RT=y\n")),
            cmdline: rt.clone(),
            sysfs: rt.clone(),
            irqs: vec![Irq {
                irq: "24".into(),
                effective: CpuSet::parse("0").unwrap(),
            }],
            governors: [(1, Some("performance".to_string())), (2, None)]
                .into_iter()
                .collect(),
            hypervisor: None,
            threads: (1..=2)
                .map(|cpu| ThreadResult {
                    thread: cpu as usize - 1,
                    cpu: Some(cpu),
                    samples: 5000,
                    max_us: 40,
                    ..Default::default()
                })
                .collect(),
            load: LoadReport {
                enabled: true,
                hackbench_runs: 3,
                hackbench_failures: 0,
                burner_threads: 1,
                io_bytes: 1 << 20,
                cpus: CpuSet::parse("0").unwrap(),
            },
            conformance: Vec::new(),
            rt,
        }
    }

    fn run(case: &Case) -> Assessment {
        assess(&Inputs {
            kernel: &case.kernel,
            rt_cpus: &case.rt,
            cmdline_isolated: &case.cmdline,
            sysfs_isolated: &case.sysfs,
            irqs: &case.irqs,
            governors: &case.governors,
            hypervisor: case.hypervisor,
            threads: &case.threads,
            duration_s: 1,
            interval_us: 200,
            budget_us: 100,
            load: &case.load,
            conformance: &case.conformance,
        })
    }

    fn codes(a: &Assessment) -> Vec<ReasonCode> {
        a.reasons.iter().map(|r| r.code).collect()
    }

    #[test]
    fn pass_fail_and_each_invalid_reason() {
        let pass = run(&good());
        assert_eq!(pass.verdict, Verdict::Pass, "{pass:?}");
        assert_eq!(pass.samples_needed, 4750);

        let mut fail = good();
        fail.threads[1].max_us = 101;
        let a = run(&fail);
        assert_eq!(
            (a.verdict, a.worst_cpu, a.worst_us),
            (Verdict::Fail, Some(2), 101)
        );

        type Edit = fn(&mut Case);
        let cases: Vec<(Edit, ReasonCode)> = vec![
            (
                |c| {
                    c.kernel = check_running_kernel(
                        "#1 SMP PREEMPT_DYNAMIC x",
                        Some("# CONFIG_PREEMPT_RT is not set\n"),
                    )
                },
                ReasonCode::NotPreemptRt,
            ),
            (
                |c| c.kernel = check_running_kernel("#1 SMP Mon PREEMPT_RT", None),
                ReasonCode::NotPreemptRt,
            ),
            (|c| c.cmdline = CpuSet::default(), ReasonCode::NotIsolated),
            (|c| c.sysfs = CpuSet::parse("1").unwrap(), ReasonCode::NotIsolated),
            (
                |c| {
                    c.irqs.push(Irq {
                        irq: "31".into(),
                        effective: CpuSet::parse("2").unwrap(),
                    })
                },
                ReasonCode::IrqsOnRtCpus,
            ),
            (
                |c| {
                    c.governors.insert(1, Some("powersave".into()));
                },
                ReasonCode::GovernorNotPerformance,
            ),
            (
                |c| c.hypervisor = Some("CPUID hypervisor bit set"),
                ReasonCode::Hypervisor,
            ),
            (|c| c.threads[0].samples = 100, ReasonCode::TooFewSamples),
            (
                |c| {
                    c.threads.pop();
                },
                ReasonCode::TooFewSamples,
            ),
            (|c| c.load.hackbench_runs = 0, ReasonCode::LoadDidNotRun),
            (|c| c.load.enabled = false, ReasonCode::LoadDidNotRun),
            (|c| c.load.io_bytes = 0, ReasonCode::LoadDidNotRun),
            (|c| c.threads[0].overflows = 3, ReasonCode::HistogramOverflow),
        ];
        for (edit, code) in cases {
            let mut case = good();
            edit(&mut case);
            let a = run(&case);
            assert_eq!(a.verdict, Verdict::Invalid, "{code:?}: {a:?}");
            assert_eq!(codes(&a), vec![code], "{a:?}");
        }

        // Conformance failures: INVALID-level ones are reasons, WARN-level
        // ones only warnings; IRQs and governors are judged once, above.
        let check = |code, status| Conformance {
            id: "x",
            code,
            status,
            detail: format!("{code} failed"),
        };
        let mut tuned = good();
        tuned.conformance = vec![
            check(ReasonCode::RtThrottling, Status::Invalid),
            check(ReasonCode::TimerMigration, Status::Warn),
            check(ReasonCode::IrqsOnRtCpus, Status::Invalid),
            check(ReasonCode::IdleStates, Status::Pass),
        ];
        let a = run(&tuned);
        assert_eq!(a.verdict, Verdict::Invalid, "{a:?}");
        assert_eq!(codes(&a), vec![ReasonCode::RtThrottling], "{a:?}");
        let warned: Vec<ReasonCode> = a.warnings.iter().map(|r| r.code).collect();
        assert_eq!(warned, vec![ReasonCode::TimerMigration], "{a:?}");
        tuned.conformance.remove(0);
        let a = run(&tuned);
        assert_eq!(
            a.verdict,
            Verdict::Pass,
            "a warning never changes the verdict: {a:?}"
        );
        assert_eq!(a.warnings.len(), 1);

        // INVALID wins over FAIL: an untrusted measurement proves nothing.
        let mut both = good();
        both.threads[0].max_us = 5000;
        both.hypervisor = Some("x");
        assert_eq!(run(&both).verdict, Verdict::Invalid);
        assert_eq!(exit_code(Verdict::Invalid), 4);
        assert_eq!(exit_code(Verdict::Fail), 3);
        assert_eq!(exit_code(Verdict::Pass), 0);
    }
}
