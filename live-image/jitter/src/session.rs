//! The measurement session every measuring tool shares: the options, the
//! CPUs, the preparation before measuring (root, tools, conformance checks,
//! high-resolution timers), the load around the measurement, and the report
//! with its verdict.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::conformance::{self, Conformance};
use crate::container::ContainerOptions;
use crate::cpus::{CpuSet, isolated_by_cmdline};
use crate::cyclictest::{RunParams, ThreadResult};
use crate::load::Load;
use crate::process::{MissingTool, install_signal_handlers, on_path};
use crate::report::{CoreStats, KernelInfo, Report, RunInfo, SCHEMA, Tool, Tuning};
use crate::system::{SystemState, read_system};
use crate::verdict::{self, LoadReport};

#[derive(Clone, Debug)]
pub struct Options {
    pub duration_s: u64,
    pub budget_us: u64,
    pub rt_cpus: Option<CpuSet>,
    pub housekeeping: Option<CpuSet>,
    pub interval_us: u32,
    pub priority: u32,
    pub no_load: bool,
    pub histogram_max_us: u32,
    /// Print a progress line every 2 s while measuring.
    pub progress: bool,
    /// What measures: cyclictest, or rtla timerlat.
    pub tool: Tool,
    /// timerlat: stop and analyse at a latency of this many µs.
    pub trace_threshold_us: Option<u32>,
    /// `--container`: measure again in RT containers.
    pub container: Option<ContainerOptions>,
}

/// RT CPUs: the option, else what the command line isolates, else all but
/// CPU 0. Housekeeping: the option, else the other online CPUs.
pub fn choose_cpus(options: &Options, system: &SystemState) -> Result<(CpuSet, CpuSet)> {
    let online = if system.online.is_empty() {
        CpuSet::parse("0").expect("valid")
    } else {
        system.online.clone()
    };
    let rt = match &options.rt_cpus {
        Some(set) => set.clone(),
        None => {
            let isolated = isolated_by_cmdline(&system.cmdline);
            if isolated.is_empty() {
                online.difference(&CpuSet::parse("0").expect("valid"))
            } else {
                isolated
            }
        }
    };
    let housekeeping = options
        .housekeeping
        .clone()
        .unwrap_or_else(|| online.difference(&rt));
    if rt.is_empty() {
        bail!(
            "no RT CPUs to measure (this system has {} online CPU(s)); pass --rt-cpus",
            online.len()
        );
    }
    if housekeeping.is_empty() {
        bail!("no housekeeping CPU left for the load and cyclictest's main thread; pass --housekeeping");
    }
    if !rt.intersection(&housekeeping).is_empty() {
        bail!("--rt-cpus {rt} and --housekeeping {housekeeping} overlap");
    }
    for (name, set) in [("--rt-cpus", &rt), ("--housekeeping", &housekeeping)] {
        let offline = set.difference(&online);
        if !offline.is_empty() {
            bail!("{name}: CPUs {offline} are not online (online: {online})");
        }
    }
    Ok((rt, housekeeping))
}

/// `jitter --check`: the conformance checks for the RT CPUs a measurement
/// with these options would use, read below `root`.
pub fn check_only(options: &Options, root: &Path) -> Result<(CpuSet, Vec<Conformance>)> {
    let system = read_system(root);
    let (rt_cpus, _) = choose_cpus(options, &system)?;
    let checks = conformance::check(root, &rt_cpus);
    Ok((rt_cpus, checks))
}

/// Waits until every CPU runs its hrtimers in high-resolution mode: for about
/// a second after boot they may not yet, and cyclictest would then measure
/// jiffies.
fn wait_for_hres(timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        let text = std::fs::read_to_string("/proc/timer_list").unwrap_or_default();
        let total = text.matches(".hres_active").count();
        let active = text
            .lines()
            .filter(|l| l.trim().starts_with(".hres_active") && l.trim().ends_with('1'))
            .count();
        if total > 0 && total == active {
            return true;
        }
        if total == 0 || Instant::now() >= deadline {
            return total > 0 && total == active;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// What every measurement needs before it starts: the system, the CPUs and
/// the conformance checks.
pub(crate) struct Prepared {
    pub system: SystemState,
    pub rt_cpus: CpuSet,
    pub housekeeping: CpuSet,
    pub checks: Vec<Conformance>,
}

pub(crate) fn prepare(options: &Options) -> Result<Prepared> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!(
            "jitter must run as root: {} needs SCHED_FIFO priority {} and mlockall",
            options.tool,
            options.priority
        );
    }
    match options.tool {
        Tool::Cyclictest if !on_path("cyclictest") => return Err(MissingTool::rt_tests("cyclictest").into()),
        Tool::Timerlat => crate::timerlat::check_installed()?,
        Tool::Cyclictest => {}
    }
    if !options.no_load && !on_path("hackbench") {
        return Err(MissingTool::rt_tests("hackbench").into());
    }
    if options.duration_s == 0 {
        bail!("the duration must be at least 1 second");
    }
    install_signal_handlers();
    let root = Path::new("/");
    let mut system = read_system(root);
    let (rt_cpus, housekeeping) = choose_cpus(options, &system)?;
    // IRQs the kernel will not move off the RT CPUs are exempt, as in the
    // `irq-affinity` check.
    system.irqs = crate::system::movable_irqs(root, &system.irqs, &rt_cpus);
    let checks = conformance::check(root, &rt_cpus);
    if !wait_for_hres(Duration::from_secs(15)) {
        eprintln!("jitter: warning: high-resolution timers are not active on every CPU");
    }
    Ok(Prepared {
        system,
        rt_cpus,
        housekeeping,
        checks,
    })
}

/// How the measuring tool runs for `duration_s`, whichever it is.
pub(crate) fn run_params(options: &Options, prepared: &Prepared, duration_s: u64) -> RunParams {
    RunParams {
        duration_s,
        interval_us: options.interval_us,
        priority: options.priority,
        rt_cpus: prepared.rt_cpus.clone(),
        housekeeping: prepared.housekeeping.clone(),
        histogram_max_us: options.histogram_max_us,
    }
}

pub(crate) fn start_load(
    options: &Options,
    prepared: &Prepared,
    seconds: u64,
    args: &[String],
) -> Result<Option<Load>> {
    let (rt_cpus, housekeeping) = (&prepared.rt_cpus, &prepared.housekeeping);
    let load_text = if options.no_load {
        "no load".to_string()
    } else {
        format!("load on CPUs {housekeeping}")
    };
    let program = match options.tool {
        Tool::Cyclictest => "cyclictest",
        Tool::Timerlat => "rtla",
    };
    eprintln!(
        "jitter: measuring CPUs {rt_cpus} for {seconds} s ({load_text}): {program} {}",
        args.join(" ")
    );
    if options.no_load {
        return Ok(None);
    }
    Ok(Some(Load::start(housekeeping).context("starting the load")?))
}

pub(crate) fn stop_load(load: Option<Load>, prepared: &Prepared) -> LoadReport {
    match load {
        Some(load) => {
            if let Some(error) = load.last_error() {
                eprintln!("jitter: load: {error}");
            }
            load.stop()
        }
        None => LoadReport {
            cpus: prepared.housekeeping.clone(),
            ..LoadReport::default()
        },
    }
}

/// What a set of measured threads is judged with, besides the options.
pub(crate) struct Assessed<'a> {
    pub system: &'a SystemState,
    pub rt_cpus: &'a CpuSet,
    pub load: &'a LoadReport,
    pub checks: &'a [Conformance],
}

/// The verdict on `threads`, measured on this system under this load.
pub(crate) fn assess(
    options: &Options,
    inputs: &Assessed,
    threads: &[ThreadResult],
) -> crate::report::Assessment {
    let system = inputs.system;
    verdict::assess(&verdict::Inputs {
        kernel: &system.kernel,
        rt_cpus: inputs.rt_cpus,
        cmdline_isolated: &isolated_by_cmdline(&system.cmdline),
        sysfs_isolated: &system.isolated,
        irqs: &system.irqs,
        governors: &system.governors,
        hypervisor: system.hypervisor.as_deref(),
        threads,
        duration_s: options.duration_s,
        interval_us: options.interval_us,
        budget_us: options.budget_us,
        load: inputs.load,
        conformance: inputs.checks,
    })
}

/// The report of one measurement: the assessment and every figure behind it
/// (`checks` are the conformance checks run before measuring).
pub fn build_report(
    options: &Options,
    system: &SystemState,
    (rt_cpus, housekeeping): (CpuSet, CpuSet),
    args: Vec<String>,
    load_report: LoadReport,
    threads: &[ThreadResult],
    checks: &[Conformance],
) -> Report {
    let cmdline_isolated = isolated_by_cmdline(&system.cmdline);
    let inputs = Assessed {
        system,
        rt_cpus: &rt_cpus,
        load: &load_report,
        checks,
    };
    let assessment = assess(options, &inputs, threads);
    let irqs_on_rt_cpus = system
        .irqs
        .iter()
        .filter(|i| !i.effective.intersection(&rt_cpus).is_empty())
        .cloned()
        .collect();
    let cores: Vec<CoreStats> = threads.iter().map(CoreStats::from).collect();
    Report {
        schema: SCHEMA.into(),
        jitter_version: env!("CARGO_PKG_VERSION").into(),
        kernel: KernelInfo {
            release: system.release.clone(),
            uts_version: system.uts_version.clone(),
            preempt_rt: system.kernel.failures().next().is_none()
                && system
                    .kernel
                    .get(rtcheck::evidence::id::BOOT_UNAME)
                    .is_some_and(|c| c.status == rtcheck::Status::Pass),
            evidence: system.kernel.clone(),
        },
        cmdline: system.cmdline.clone(),
        tuning: Tuning {
            rt_cpus,
            housekeeping,
            cmdline_isolated,
            sysfs_isolated: system.isolated.clone(),
            nohz_full: system.nohz_full.clone(),
            irqs_on_rt_cpus,
            governors: system.governors.clone(),
            hypervisor: system.hypervisor.clone(),
        },
        run: RunInfo {
            duration_s: options.duration_s,
            interval_us: options.interval_us,
            priority: options.priority,
            budget_us: options.budget_us,
            histogram_max_us: options.histogram_max_us,
            cyclictest_args: if options.tool == Tool::Cyclictest {
                args.clone()
            } else {
                Vec::new()
            },
            load: load_report,
            functional_only: system.hypervisor.is_some(),
            tool: options.tool,
            tool_args: if options.tool == Tool::Cyclictest {
                Vec::new()
            } else {
                args
            },
        },
        tail: Some(tail_of(&cores, options)),
        soak: None,
        spikes: Vec::new(),
        container: None,
        cores,
        assessment,
    }
}

/// The confidence in the worst case, over every measured core.
fn tail_of(cores: &[CoreStats], options: &Options) -> rtreport::tail::Tail {
    let merged = rtreport::tail::merge(cores.iter().map(|core| core.histogram.as_slice()));
    let histogram = rtreport::tail::Histogram {
        buckets: &merged,
        overflows: cores.iter().map(|core| core.overflows).sum(),
        range_us: u64::from(options.histogram_max_us),
        max_us: cores.iter().map(|core| core.max_us).max().unwrap_or(0),
    };
    rtreport::tail::assess(histogram, options.budget_us, options.interval_us)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cyclictest;
    use crate::system::Irq;

    fn options() -> Options {
        Options {
            duration_s: 1,
            budget_us: 100,
            rt_cpus: None,
            housekeeping: None,
            interval_us: 200,
            priority: 99,
            no_load: false,
            histogram_max_us: 1000,
            progress: false,
            tool: Tool::Cyclictest,
            trace_threshold_us: None,
            container: None,
        }
    }

    fn system(online: &str, cmdline: &str) -> SystemState {
        SystemState {
            online: CpuSet::parse(online).unwrap(),
            cmdline: cmdline.into(),
            ..SystemState::default()
        }
    }

    /// A report built from the cyclictest fixtures on a 2-CPU VM with a
    /// PREEMPT_RT kernel: what `jitter --json` writes for that measurement.
    fn fixture_report() -> Report {
        let fixture = |name: &str| {
            let path = Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/fixtures")
                .join(name);
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        };
        let rt_cpus = CpuSet::parse("1").unwrap();
        let housekeeping = CpuSet::parse("0").unwrap();
        let text = cyclictest::parse_histogram(&fixture("rt-tests-2.4-histogram.txt")).unwrap();
        let json = cyclictest::parse_json(&fixture("rt-tests-2.4-histogram.json")).unwrap();
        let threads = cyclictest::combine(text, Some(json), &CpuSet::parse("0-1").unwrap());
        let uts_version = "#1 SMP PREEMPT_RT Sun Nov 30 00:00:00 UTC 2025";
        let system = SystemState {
            release: "6.12.117-rt".into(),
            uts_version: uts_version.into(),
            kernel: rtcheck::evidence::check_running_kernel(uts_version, Some("CONFIG_PREEMPT_RT=y\n")),
            cmdline: "console=ttyS0 isolcpus=managed_irq,domain,1 nohz_full=1".into(),
            online: CpuSet::parse("0-1").unwrap(),
            isolated: rt_cpus.clone(),
            nohz_full: rt_cpus.clone(),
            irqs: vec![
                Irq {
                    irq: "4".into(),
                    effective: CpuSet::parse("0").unwrap(),
                },
                Irq {
                    irq: "24".into(),
                    effective: CpuSet::parse("0-1").unwrap(),
                },
            ],
            governors: [(0, None), (1, Some("powersave".to_string()))]
                .into_iter()
                .collect(),
            hypervisor: Some("CPUID hypervisor bit set".into()),
        };
        let load = LoadReport {
            enabled: true,
            hackbench_runs: 4,
            hackbench_failures: 0,
            burner_threads: 1,
            io_bytes: 3 << 20,
            cpus: housekeeping.clone(),
        };
        let options = Options {
            duration_s: 2,
            histogram_max_us: 60,
            ..options()
        };
        let args = vec![
            "-m".to_string(),
            "-q".to_string(),
            "-h".to_string(),
            "60".to_string(),
        ];
        let mut report = build_report(
            &options,
            &system,
            (rt_cpus, housekeeping),
            args,
            load,
            &threads,
            &[],
        );
        report.jitter_version = "0.1.0".into();
        report
    }

    /// The JSON report is a contract with imgbuild's boot stage and ci/e2e:
    /// it must serialize byte for byte as the committed `jitter-report/2`
    /// fixture (set JITTER_BLESS=1 to rewrite it after a schema change).
    #[test]
    fn json_report_matches_the_schema_fixture() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/jitter-report-2.json");
        let json = serde_json::to_string_pretty(&fixture_report()).unwrap() + "\n";
        if std::env::var_os("JITTER_BLESS").is_some() {
            std::fs::write(&path, &json).unwrap();
        }
        let expected = std::fs::read_to_string(&path).unwrap();
        assert_eq!(
            json, expected,
            "the jitter-report/2 JSON changed; change SCHEMA if intended"
        );
    }

    /// A WARN-level conformance failure is printed after the verdict and
    /// kept in the JSON, without changing the verdict.
    #[test]
    fn conformance_warnings_in_the_report() {
        let mut report = fixture_report();
        let checks = [Conformance {
            id: "timer-migration",
            code: rtreport::report::ReasonCode::TimerMigration,
            status: conformance::Status::Warn,
            detail: "/proc/sys/kernel/timer_migration is 1".into(),
        }];
        report.assessment = verdict::assess(&verdict::Inputs {
            conformance: &checks,
            ..inputs_of(&report)
        });
        let table = crate::report::table(&report);
        let verdict_at = table.find("VERDICT: INVALID").expect("verdict");
        let warn_at = table
            .find("WARN   timer-migration: /proc/sys/kernel/timer_migration is 1\n")
            .unwrap_or_else(|| panic!("{table}"));
        assert!(warn_at > verdict_at, "{table}");
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["assessment"]["warnings"][0]["code"], "timer-migration");
        assert!(
            report
                .assessment
                .reasons
                .iter()
                .all(|r| r.code != rtreport::report::ReasonCode::TimerMigration),
            "{table}"
        );
    }

    fn inputs_of(report: &Report) -> verdict::Inputs<'_> {
        verdict::Inputs {
            kernel: &report.kernel.evidence,
            rt_cpus: &report.tuning.rt_cpus,
            cmdline_isolated: &report.tuning.cmdline_isolated,
            sysfs_isolated: &report.tuning.sysfs_isolated,
            irqs: &report.tuning.irqs_on_rt_cpus,
            governors: &report.tuning.governors,
            hypervisor: report.tuning.hypervisor.as_deref(),
            threads: &[],
            duration_s: report.run.duration_s,
            interval_us: report.run.interval_us,
            budget_us: report.run.budget_us,
            load: &report.run.load,
            conformance: &[],
        }
    }

    #[test]
    fn cpu_defaults() {
        let (rt, hk) = choose_cpus(&options(), &system("0-3", "isolcpus=managed_irq,domain,2-3")).unwrap();
        assert_eq!((rt.to_string(), hk.to_string()), ("2-3".into(), "0-1".into()));
        let (rt, hk) = choose_cpus(&options(), &system("0-3", "quiet")).unwrap();
        assert_eq!((rt.to_string(), hk.to_string()), ("1-3".into(), "0".into()));
        let mut explicit = options();
        explicit.rt_cpus = Some(CpuSet::parse("1").unwrap());
        explicit.housekeeping = Some(CpuSet::parse("0").unwrap());
        let (rt, hk) = choose_cpus(&explicit, &system("0-3", "")).unwrap();
        assert_eq!((rt.to_string(), hk.to_string()), ("1".into(), "0".into()));
    }

    #[test]
    fn cpu_errors() {
        assert!(choose_cpus(&options(), &system("0", "")).is_err());
        let mut overlap = options();
        overlap.rt_cpus = Some(CpuSet::parse("0-1").unwrap());
        overlap.housekeeping = Some(CpuSet::parse("1").unwrap());
        assert!(
            choose_cpus(&overlap, &system("0-3", ""))
                .unwrap_err()
                .to_string()
                .contains("overlap")
        );
        let mut offline = options();
        offline.rt_cpus = Some(CpuSet::parse("7").unwrap());
        assert!(
            choose_cpus(&offline, &system("0-3", ""))
                .unwrap_err()
                .to_string()
                .contains("not online")
        );
    }
}
