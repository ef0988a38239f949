//! One measurement: pick the CPUs, start the load, run cyclictest, stop the
//! load, assess, report.

use std::io::{BufReader, Read};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use tempfile::NamedTempFile;

use crate::checkpoint::{Checkpoint, SoakOptions, now_unix};
use crate::child::die_with_jitter;
use crate::conformance::{self, Conformance};
use crate::container::{self, ContainerOptions};
use crate::cpus::{CpuSet, isolated_by_cmdline};
use crate::cyclictest::{self, RunParams, ThreadResult};
use crate::load::{Load, pin_current_thread};
use crate::output::OutputFile;
use crate::progress::{LiveWorst, Reporter, SoakSoFar};
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

/// A program jitter needs that is not installed, and its Debian package.
#[derive(Clone, Debug, thiserror::Error)]
#[error(
    "`{program}` is not installed: install the Debian package {package} (apt-get install {package}){note}"
)]
pub struct MissingTool {
    pub program: String,
    pub package: String,
    /// What else to know, e.g. which version is needed.
    pub note: String,
}

impl MissingTool {
    pub fn rt_tests(program: &str) -> MissingTool {
        MissingTool {
            program: program.into(),
            package: "rt-tests".into(),
            note: String::new(),
        }
    }
}

pub(crate) static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

fn install_signal_handlers() {
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe {
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
    }
}

pub(crate) fn on_path(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join(program).is_file()))
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

/// What a measuring tool printed, read to its end.
pub(crate) struct ToolOutput {
    pub stdout: String,
    pub stderr: String,
}

/// How a measuring tool's stderr is read: to its end, into a string.
pub(crate) type StderrReader = Box<dyn FnOnce(std::process::ChildStderr) -> String + Send>;

/// Runs a measuring tool (cyclictest, rtla) to its end from the housekeeping
/// CPUs. An interrupt of jitter reaches it as SIGINT, on which both tools
/// print what they measured. With `progress`, prints the progress line over
/// that many seconds (within a soak, over the whole soak); `worst` is the
/// live worst case it shows.
pub(crate) fn run_tool(
    command: &mut Command,
    missing: MissingTool,
    housekeeping: &CpuSet,
    progress: Option<(u64, Option<SoakSoFar>)>,
    (worst, read_stderr): (LiveWorst, StderrReader),
) -> Result<ToolOutput> {
    // Pin ourselves (and so the tool's start-up) to the housekeeping CPUs.
    let _ = pin_current_thread(housekeeping);
    let mut child = die_with_jitter(command)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => anyhow::Error::new(missing.clone()),
            _ => anyhow::Error::new(e).context(format!("starting {}", missing.program)),
        })?;
    let mut stdout_pipe = child.stdout.take().expect("piped");
    let stderr_pipe = child.stderr.take().expect("piped");
    let out_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stdout_pipe.read_to_string(&mut s);
        s
    });
    let err_reader = std::thread::spawn(move || read_stderr(stderr_pipe));
    let mut progress = progress.map(|(total_s, soak)| Reporter::new(child.id(), total_s, worst, soak));
    let mut forwarded = false;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if INTERRUPTED.load(Ordering::SeqCst) && !forwarded {
            // SAFETY: signals our own child.
            unsafe {
                libc::kill(child.id() as i32, libc::SIGINT);
            }
            forwarded = true;
        }
        if !forwarded && let Some(progress) = progress.as_mut() {
            progress.tick();
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let stdout = out_reader.join().unwrap_or_default();
    let stderr = err_reader.join().unwrap_or_default();
    if !status.success() && !forwarded {
        bail!("{} failed ({status}): {}", missing.program, stderr.trim());
    }
    Ok(ToolOutput { stdout, stderr })
}

struct CyclictestOutput {
    stdout: String,
    json: Option<String>,
}

/// Runs cyclictest to its end (see [`run_tool`]).
fn run_cyclictest(
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
    let read_stderr: StderrReader =
        Box::new(move |pipe| cyclictest::read_stderr(BufReader::new(pipe), |max| recorder.record(max)));
    let output = run_tool(command, missing, housekeeping, progress, (worst, read_stderr));
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

/// Adds the hint for a tool that could not lock memory or get RT priority.
pub(crate) fn hint_privileges(error: anyhow::Error) -> anyhow::Error {
    let text = format!("{error:#}").to_lowercase();
    if text.contains("mlockall") || text.contains("scheduling policy") || text.contains("permission denied") {
        anyhow::anyhow!(
            "{error:#}\nhint: run as root on the target (not in an unprivileged container), with RLIMIT_RTPRIO and RLIMIT_MEMLOCK unlimited"
        )
    } else {
        error
    }
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
fn cyclictest_json_file() -> Result<Option<NamedTempFile>> {
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
        Tool::Timerlat => crate::rtla::check_installed()?,
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

/// One cyclictest run: its arguments, its own output, its per-thread results.
struct Measured {
    args: Vec<String>,
    stdout: String,
    threads: Vec<ThreadResult>,
}

/// cyclictest's arguments for one run of `duration_s`, and the file for
/// its JSON.
struct Plan {
    args: Vec<String>,
    json_file: Option<NamedTempFile>,
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

fn plan(options: &Options, prepared: &Prepared, duration_s: u64) -> Result<Plan> {
    let params = run_params(options, prepared, duration_s);
    let json_file = cyclictest_json_file()?;
    let args = cyclictest::arguments(&params, json_file.as_ref().map(NamedTempFile::path));
    Ok(Plan { args, json_file })
}

/// Runs cyclictest once as `plan` says (the load, if any, already runs).
fn measure_once(
    plan: Plan,
    prepared: &Prepared,
    progress: Option<(u64, Option<SoakSoFar>)>,
) -> Result<Measured> {
    let json_path = plan.json_file.as_ref().map(NamedTempFile::path);
    let measured = run_cyclictest(&plan.args, json_path, &prepared.housekeeping, progress)?;
    drop(plan.json_file);
    let text = cyclictest::parse_histogram(&measured.stdout).context("parsing cyclictest's histogram")?;
    let json = measured
        .json
        .as_deref()
        .map(cyclictest::parse_json)
        .transpose()
        .context("parsing cyclictest's JSON")?;
    let threads = cyclictest::combine(text, json, &prepared.rt_cpus);
    Ok(Measured {
        args: plan.args,
        stdout: measured.stdout,
        threads,
    })
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

/// Runs the whole measurement; keeps cyclictest's own output in
/// `save_cyclictest` if given (opened by the caller before measuring).
/// With `--container`, measures again in containers under the same load.
pub fn run(options: &Options, save_cyclictest: Option<OutputFile>) -> Result<Report> {
    if options.tool == Tool::Timerlat {
        return crate::rtla::run(options, save_cyclictest);
    }
    let prepared = prepare(options)?;
    let claim = options
        .container
        .as_ref()
        .map(|_| container::claim(&prepared.rt_cpus))
        .transpose()?;
    let plan = plan(options, &prepared, options.duration_s)?;
    let load = start_load(options, &prepared, options.duration_s, &plan.args)?;
    let progress = options.progress.then_some((options.duration_s, None));
    let measured = measure_once(plan, &prepared, progress);
    let in_containers = match (&measured, &options.container) {
        (Ok(_), Some(wanted)) if !INTERRUPTED.load(Ordering::SeqCst) => Some(container::measure(
            wanted,
            &run_params(options, &prepared, options.duration_s),
        )),
        _ => None,
    };
    let load_report = stop_load(load, &prepared);
    drop(claim);
    let measured = measured?;
    let in_containers = in_containers.transpose()?;
    if let Some(file) = save_cyclictest {
        file.write(measured.stdout.as_bytes())?;
    }
    let mut report = build_report(
        options,
        &prepared.system,
        (prepared.rt_cpus.clone(), prepared.housekeeping.clone()),
        measured.args,
        load_report,
        &measured.threads,
        &prepared.checks,
    );
    if let (Some(wanted), Some((threads, commands))) = (&options.container, in_containers) {
        let inputs = Assessed {
            system: &prepared.system,
            rt_cpus: &prepared.rt_cpus,
            load: &report.run.load,
            checks: &prepared.checks,
        };
        let assessment = assess(options, &inputs, &threads);
        report.container = Some(container::section(
            wanted,
            commands,
            &threads,
            assessment,
            &report.assessment,
        ));
    } else if options.container.is_some() {
        bail!("interrupted before the container measurement");
    }
    Ok(report)
}

/// The options a soak's checkpoint fixes, as measurement options.
pub fn soak_options(saved: &SoakOptions, progress: bool) -> Options {
    Options {
        duration_s: saved.duration_s,
        budget_us: saved.budget_us,
        rt_cpus: Some(saved.rt_cpus.clone()),
        housekeeping: Some(saved.housekeeping.clone()),
        interval_us: saved.interval_us,
        priority: saved.priority,
        no_load: saved.no_load,
        histogram_max_us: saved.histogram_max_us,
        progress,
        tool: Tool::Cyclictest,
        trace_threshold_us: None,
        container: None,
    }
}

/// Sums the load of two runs.
fn add_load(total: &mut LoadReport, run: LoadReport) {
    total.enabled |= run.enabled;
    total.hackbench_runs += run.hackbench_runs;
    total.hackbench_failures += run.hackbench_failures;
    total.burner_threads = total.burner_threads.max(run.burner_threads);
    total.io_bytes += run.io_bytes;
    total.cpus = run.cpus;
}

/// The length of the next cyclictest run of a soak: to the next minute of
/// measured time (a run's worst case is that minute's), the next
/// checkpoint or the end, whichever comes first.
fn run_length(checkpoint: &Checkpoint, next_checkpoint_s: u64) -> u64 {
    let elapsed = checkpoint.elapsed_s;
    let next_minute = (elapsed / 60 + 1) * 60;
    (next_minute.min(next_checkpoint_s) - elapsed)
        .min(checkpoint.remaining_s())
        .max(1)
}

/// A soak: cyclictest runs of at most a minute under one load, merged into
/// `dir/checkpoint.json` every `every_s`; continues `resumed` if given. The
/// report covers every segment of the soak, with each minute's worst case.
pub fn run_soak(
    options: &Options,
    dir: &Path,
    every_s: u64,
    resumed: Option<Checkpoint>,
    save_cyclictest: Option<OutputFile>,
) -> Result<Report> {
    let prepared = prepare(options)?;
    let mut checkpoint = resumed.unwrap_or_else(|| {
        Checkpoint::new(SoakOptions {
            duration_s: options.duration_s,
            budget_us: options.budget_us,
            rt_cpus: prepared.rt_cpus.clone(),
            housekeeping: prepared.housekeeping.clone(),
            interval_us: options.interval_us,
            priority: options.priority,
            no_load: options.no_load,
            histogram_max_us: options.histogram_max_us,
            checkpoint_every_s: every_s,
        })
    });
    checkpoint.start_segment(now_unix());
    checkpoint.write(dir)?;
    let first = plan(options, &prepared, every_s.min(checkpoint.remaining_s()).max(1))?;
    let load = start_load(options, &prepared, checkpoint.remaining_s(), &first.args)?;
    drop(first);
    let mut last_stdout = String::new();
    let mut failed = None;
    let mut next_checkpoint_s = checkpoint.elapsed_s + every_s;
    while checkpoint.remaining_s() > 0 && !INTERRUPTED.load(Ordering::SeqCst) {
        let seconds = run_length(&checkpoint, next_checkpoint_s);
        let so_far = SoakSoFar {
            elapsed_s: checkpoint.elapsed_s,
            total_s: checkpoint.options.duration_s,
            samples: checkpoint.samples(),
            worst_us: checkpoint.cores.iter().map(|c| c.max_us).max(),
        };
        let started = Instant::now();
        let progress = options.progress.then_some((seconds, Some(so_far)));
        let measured = match plan(options, &prepared, seconds)
            .and_then(|plan| measure_once(plan, &prepared, progress))
        {
            Ok(measured) => measured,
            Err(error) => {
                failed = Some(error);
                break;
            }
        };
        // Interrupted, cyclictest stops early with what it measured.
        let measured_s = if INTERRUPTED.load(Ordering::SeqCst) {
            started.elapsed().as_secs().min(seconds)
        } else {
            seconds
        };
        checkpoint.add_run(measured_s, &measured.threads, now_unix());
        checkpoint.cyclictest_args = measured.args;
        last_stdout = measured.stdout;
        if checkpoint.elapsed_s < next_checkpoint_s && checkpoint.remaining_s() > 0 {
            continue;
        }
        next_checkpoint_s = checkpoint.elapsed_s + every_s;
        if let Err(error) = checkpoint.write(dir) {
            failed = Some(error);
            break;
        }
        eprintln!(
            "jitter: checkpoint {}/{} s, {} samples",
            checkpoint.elapsed_s,
            checkpoint.options.duration_s,
            checkpoint.samples()
        );
    }
    add_load(&mut checkpoint.load, stop_load(load, &prepared));
    if let Some(error) = failed {
        return Err(error);
    }
    checkpoint.write(dir)?;
    if checkpoint.remaining_s() > 0 {
        bail!(
            "interrupted after {}/{} s; continue with `jitter --resume {}`",
            checkpoint.elapsed_s,
            checkpoint.options.duration_s,
            dir.display()
        );
    }
    if let Some(file) = save_cyclictest {
        file.write(last_stdout.as_bytes())?;
    }
    let mut report = build_report(
        options,
        &prepared.system,
        (prepared.rt_cpus, prepared.housekeeping),
        checkpoint.cyclictest_args.clone(),
        checkpoint.load.clone(),
        &checkpoint.threads(),
        &prepared.checks,
    );
    report.soak = Some(checkpoint.soak());
    Ok(report)
}

/// What a set of measured threads is judged with, besides the options.
struct Assessed<'a> {
    system: &'a SystemState,
    rt_cpus: &'a CpuSet,
    load: &'a LoadReport,
    checks: &'a [Conformance],
}

/// The verdict on `threads`, measured on this system under this load.
fn assess(options: &Options, inputs: &Assessed, threads: &[ThreadResult]) -> crate::report::Assessment {
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
fn tail_of(cores: &[CoreStats], options: &Options) -> rtcheck::tail::Tail {
    let merged = rtcheck::tail::merge(cores.iter().map(|core| core.histogram.as_slice()));
    let histogram = rtcheck::tail::Histogram {
        buckets: &merged,
        overflows: cores.iter().map(|core| core.overflows).sum(),
        range_us: u64::from(options.histogram_max_us),
        max_us: cores.iter().map(|core| core.max_us).max().unwrap_or(0),
    };
    rtcheck::tail::assess(histogram, options.budget_us, options.interval_us)
}

#[cfg(test)]
mod tests {
    use super::*;
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
            code: rtcheck::jitter::ReasonCode::TimerMigration,
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
                .all(|r| r.code != rtcheck::jitter::ReasonCode::TimerMigration),
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
    fn soak_runs_end_at_each_minute_checkpoint_and_the_end() {
        let soak = |duration_s, elapsed_s| {
            let mut checkpoint = Checkpoint::new(SoakOptions {
                duration_s,
                ..crate::checkpoint::tests::options()
            });
            checkpoint.elapsed_s = elapsed_s;
            checkpoint
        };
        assert_eq!(run_length(&soak(3600, 0), 600), 60);
        assert_eq!(run_length(&soak(3600, 45), 600), 15, "to the minute");
        assert_eq!(run_length(&soak(40, 10), 15), 5, "to the checkpoint");
        assert_eq!(run_length(&soak(100, 90), 600), 10, "to the end");
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
