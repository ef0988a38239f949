//! `jitter [DURATION] [options]`. Exit codes: 0 PASS, 1 error, 2 usage,
//! 3 FAIL, 4 INVALID; `jitter --check`: 0 when no check fails at INVALID
//! level (warnings allowed), 4 when one does.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use clap::Parser;

use crate::checkpoint::{self, Checkpoint, range};
use crate::cpus::CpuSet;
use crate::output::OutputFile;
use crate::report::{self, Tool};
use crate::run::{run, run_soak, soak_options};
use crate::session::Options;

#[derive(Parser, Debug)]
#[command(
    name = "jitter",
    version,
    about = "Worst-case latency validation: cyclictest under load, per-core worst case, verdict",
    after_help = "Exit status: 0 PASS, 1 error, 2 usage, 3 FAIL, 4 INVALID.\n\
                  With --check: 0 when no check fails at INVALID level (warnings allowed), 4 when one does."
)]
pub struct Cli {
    /// How long to measure: seconds, or with a suffix `s`, `m` or `h`
    /// (`jitter 300`, `jitter 10m`, `jitter 72h`).
    #[arg(default_value = "60", value_parser = parse_duration)]
    pub duration: u64,
    /// Worst-case latency allowed, in microseconds.
    #[arg(long, default_value_t = 100)]
    pub budget: u64,
    /// CPUs to measure [default: isolcpus/nohz_full, else all but CPU 0].
    #[arg(long, value_parser = parse_cpus)]
    pub rt_cpus: Option<CpuSet>,
    /// CPUs for the load and cyclictest's main thread [default: the rest].
    #[arg(long, value_parser = parse_cpus)]
    pub housekeeping: Option<CpuSet>,
    /// cyclictest interval, in microseconds.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(clap_range(range::INTERVAL_US)))]
    pub interval: u32,
    /// SCHED_FIFO priority of the measuring threads.
    #[arg(long, default_value_t = 99, value_parser = clap::value_parser!(u32).range(clap_range(range::PRIORITY)))]
    pub priority: u32,
    /// Measure without load (the verdict is then INVALID).
    #[arg(long)]
    pub no_load: bool,
    /// Write the JSON report here (`-` for stdout).
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write an SVG latency plot here.
    #[arg(long)]
    pub svg: Option<PathBuf>,
    /// Also keep the measuring tool's own output here (cyclictest's histogram
    /// and min/avg/max lines; with timerlat, what each rtla run printed).
    #[arg(long, visible_alias = "save-output")]
    pub save_cyclictest: Option<PathBuf>,
    /// Only print the PREEMPT_RT evidence of the running kernel (exit 0 if
    /// it is PREEMPT_RT, 3 if not).
    #[arg(long)]
    pub check_kernel: bool,
    /// Only run the RT configuration checks for the RT CPUs a measurement
    /// would use (honors --rt-cpus), print `CHECK STATUS DETAIL`, and exit 0
    /// when no check fails at INVALID level (warnings allowed), 4 when one does.
    #[arg(long, conflicts_with = "check_kernel")]
    pub check: bool,
    /// What measures: `cyclictest` (rt-tests), or `timerlat`: `rtla timerlat
    /// hist` (rtla 6.3 or later, kernel with CONFIG_TIMERLAT_TRACER), which
    /// also gives each core's IRQ latency.
    #[arg(long, value_enum, default_value = "cyclictest")]
    pub tool: ToolArg,
    /// timerlat: when an IRQ or thread latency reaches this many
    /// microseconds, rtla stops, analyses its cause (the report's `spikes`),
    /// and jitter starts it again for the time left (at most 10 analyses).
    #[arg(long, value_name = "US", value_parser = clap::value_parser!(u32).range(1..))]
    pub trace_threshold: Option<u32>,
    /// Largest histogram bucket, in microseconds.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(clap_range(range::HISTOGRAM_MAX_US)))]
    pub histogram_max: u32,
    /// Every 2 s while measuring, print on stderr
    /// `jitter: progress ELAPSED/TOTAL s, worst case MAX us` (without the
    /// worst case until cyclictest has reported one).
    #[arg(long)]
    pub progress: bool,
    /// Soak: measure in runs of --checkpoint-every under one load, and after
    /// each save the merged results in DIR/checkpoint.json, so that
    /// `jitter --resume DIR` can continue after jitter was killed.
    #[arg(long, value_name = "DIR", conflicts_with_all = ["check", "check_kernel"])]
    pub checkpoint_dir: Option<PathBuf>,
    /// With --checkpoint-dir: how long each run lasts between checkpoints.
    #[arg(long, default_value = "10m", value_parser = parse_duration, requires = "checkpoint_dir")]
    pub checkpoint_every: u64,
    /// Continue the soak saved in DIR/checkpoint.json for its remaining
    /// duration, with its options (measurement options given here are
    /// ignored; --json, --svg, --save-cyclictest and --progress apply).
    #[arg(long, value_name = "DIR", conflicts_with_all = ["check", "check_kernel", "checkpoint_dir"])]
    pub resume: Option<PathBuf>,
    /// After the host measurement, and under the same load, measure again
    /// inside one container per RT CPU, started as emberrtos-rt-run starts
    /// one (rootful podman: pinned to the CPU, SYS_NICE and IPC_LOCK only,
    /// rtprio 99, no network), from IMAGE in the local store, which must
    /// hold cyclictest. The report gets a `container` section.
    #[arg(long, value_name = "IMAGE", conflicts_with_all = ["check", "check_kernel"])]
    pub container: Option<String>,
    /// With --container: the most latency, in microseconds, the container
    /// may add to the host's worst case.
    #[arg(long, value_name = "US", default_value_t = 10, requires = "container")]
    pub container_budget: u64,
}

/// `--tool`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ToolArg {
    Cyclictest,
    Timerlat,
}

impl From<ToolArg> for Tool {
    fn from(tool: ToolArg) -> Tool {
        match tool {
            ToolArg::Cyclictest => Tool::Cyclictest,
            ToolArg::Timerlat => Tool::Timerlat,
        }
    }
}

/// What clap cannot say: options that only apply to one tool.
fn check_combinations(cli: &Cli) -> Result<(), String> {
    let timerlat = cli.tool == ToolArg::Timerlat;
    if cli.trace_threshold.is_some() && !timerlat {
        return Err("--trace-threshold needs --tool timerlat".into());
    }
    if timerlat && (cli.checkpoint_dir.is_some() || cli.resume.is_some()) {
        return Err("soaks (--checkpoint-dir, --resume) run cyclictest; drop --tool timerlat".into());
    }
    if cli.container.is_some() && (timerlat || cli.checkpoint_dir.is_some() || cli.resume.is_some()) {
        return Err(
            "--container measures one cyclictest run; drop --tool timerlat, --checkpoint-dir and --resume"
                .into(),
        );
    }
    if cli
        .container
        .as_deref()
        .is_some_and(|image| image.is_empty() || image.starts_with('-'))
    {
        return Err("--container: give the name of an image in podman's local store".into());
    }
    Ok(())
}

/// A duration in seconds: `90`, `90s`, `10m`, `72h`. Refuses 0, a number
/// too large, and any other suffix.
pub fn parse_duration(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (number, suffix) = text.split_at(split);
    let unit: u64 = match suffix {
        "" | "s" => 1,
        "m" => 60,
        "h" => 3600,
        other => {
            return Err(format!(
                "{text:?}: unknown unit {other:?}; give seconds, or a number with s, m or h (90s, 10m, 72h)"
            ));
        }
    };
    if number.is_empty() {
        return Err(format!("{text:?}: no number; give e.g. 90s, 10m or 72h"));
    }
    let value: u64 = number
        .parse()
        .map_err(|_| format!("{text:?}: the number is too large"))?;
    let seconds = value
        .checked_mul(unit)
        .ok_or_else(|| format!("{text:?}: too long a duration"))?;
    if !range::DURATION_S.contains(&seconds) {
        return Err(format!(
            "{text:?}: the duration must be at least {} second",
            range::DURATION_S.start()
        ));
    }
    Ok(seconds)
}

/// A range of [`checkpoint::range`] as clap's integer parsers take it.
fn clap_range(range: std::ops::RangeInclusive<u64>) -> std::ops::RangeInclusive<i64> {
    let signed = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    signed(*range.start())..=signed(*range.end())
}

fn parse_cpus(text: &str) -> Result<CpuSet, String> {
    CpuSet::parse(text).map_err(|e| e.to_string())
}

pub fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { 2 } else { 0 });
        }
    };
    if let Err(problem) = check_combinations(&cli) {
        eprintln!("error: {problem}");
        return ExitCode::from(2);
    }
    match execute(&cli) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("jitter: error: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn execute(cli: &Cli) -> Result<u8> {
    if cli.check_kernel {
        let system = crate::system::read_system(std::path::Path::new("/"));
        for check in &system.kernel.checks {
            println!(" {check}");
        }
        let rt = system.kernel.all_passed(&[rtcheck::evidence::id::BOOT_UNAME]);
        println!(" PREEMPT_RT: {}", if rt { "yes" } else { "NO" });
        return Ok(if rt { 0 } else { 3 });
    }
    let options = Options {
        duration_s: cli.duration,
        budget_us: cli.budget,
        rt_cpus: cli.rt_cpus.clone(),
        housekeeping: cli.housekeeping.clone(),
        interval_us: cli.interval,
        priority: cli.priority,
        no_load: cli.no_load,
        histogram_max_us: cli.histogram_max,
        progress: cli.progress,
        tool: cli.tool.into(),
        trace_threshold_us: cli.trace_threshold,
        container: cli
            .container
            .clone()
            .map(|image| crate::container::ContainerOptions {
                image,
                budget_us: cli.container_budget,
            }),
    };
    if let Some(dir) = &cli.checkpoint_dir {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        if checkpoint::path(dir).exists() {
            bail!(
                "{} already holds a soak: continue it with `jitter --resume {}`, or remove it",
                checkpoint::path(dir).display(),
                dir.display()
            );
        }
    }
    if cli.check {
        let (rt_cpus, checks) = crate::session::check_only(&options, Path::new("/"))?;
        println!("RT CPUs {rt_cpus}");
        print!("{}", crate::conformance::table(&checks));
        return Ok(crate::conformance::exit_code(&checks));
    }
    let resumed = cli.resume.as_deref().map(Checkpoint::read).transpose()?;
    let mut outputs = Outputs::open(cli)?;
    let save_cyclictest = outputs.cyclictest.take();
    let report = if let (Some(dir), Some(checkpoint)) = (&cli.resume, resumed) {
        let options = soak_options(&checkpoint.options, cli.progress);
        let every_s = checkpoint.options.checkpoint_every_s;
        run_soak(&options, dir, every_s, Some(checkpoint), save_cyclictest)?
    } else if let Some(dir) = &cli.checkpoint_dir {
        run_soak(&options, dir, cli.checkpoint_every, None, save_cyclictest)?
    } else {
        run(&options, save_cyclictest)?
    };
    if outputs.json_to_stdout {
        eprint!("{}", report::table(&report));
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report::table(&report));
    }
    if let Some(file) = outputs.json {
        file.write((serde_json::to_string_pretty(&report)? + "\n").as_bytes())?;
    }
    if let Some(file) = outputs.svg {
        file.write(crate::plot::svg(&report)?.as_bytes())?;
    }
    Ok(crate::verdict::exit_code(report.verdict()))
}

/// Every file the run writes, opened before it measures.
struct Outputs {
    json_to_stdout: bool,
    json: Option<OutputFile>,
    svg: Option<OutputFile>,
    cyclictest: Option<OutputFile>,
}

impl Outputs {
    fn open(cli: &Cli) -> Result<Outputs> {
        let open = |path: Option<&Path>| path.map(OutputFile::open).transpose();
        let json_to_stdout = cli.json.as_deref().is_some_and(|p| p.as_os_str() == "-");
        Ok(Outputs {
            json_to_stdout,
            json: open(cli.json.as_deref().filter(|_| !json_to_stdout))?,
            svg: open(cli.svg.as_deref())?,
            cyclictest: open(cli.save_cyclictest.as_deref())?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        for (text, seconds) in [
            ("90", 90),
            ("90s", 90),
            ("10m", 600),
            ("72h", 259_200),
            ("1", 1),
            (" 5m ", 300),
        ] {
            assert_eq!(parse_duration(text), Ok(seconds), "{text}");
        }
        let error = |text: &str| parse_duration(text).unwrap_err();
        assert!(error("0").contains("at least 1 second"), "{}", error("0"));
        assert!(error("0h").contains("at least 1 second"));
        assert!(error("5d").contains("unknown unit \"d\""), "{}", error("5d"));
        assert!(error("5ms").contains("unknown unit"));
        assert!(error("1.5h").contains("unknown unit"));
        assert!(error("-5").contains("unknown unit"));
        assert!(error("h").contains("no number"));
        assert!(error("").contains("no number"));
        assert!(error("99999999999999999999").contains("too large"));
        assert!(error("6000000000000000h").contains("too long"));
        assert_eq!(parse_duration("18446744073709551615s"), Ok(u64::MAX));
    }

    #[test]
    fn the_command_line_takes_exactly_the_checkpoint_ranges() {
        let parse =
            |option: &str, value: u64| Cli::try_parse_from(["jitter", option, &value.to_string()]).is_ok();
        for (option, range) in [
            ("--interval", range::INTERVAL_US),
            ("--priority", range::PRIORITY),
            ("--histogram-max", range::HISTOGRAM_MAX_US),
        ] {
            let (low, high) = (*range.start(), *range.end());
            assert!(parse(option, low) && parse(option, high), "{option}");
            assert!(!parse(option, low - 1) && !parse(option, high + 1), "{option}");
        }
        assert!(parse_duration("0").is_err() && parse_duration("1").is_ok());
    }

    #[test]
    fn duration_and_check_on_the_command_line() {
        let cli = Cli::try_parse_from(["jitter", "72h"]).unwrap();
        assert_eq!(cli.duration, 72 * 3600);
        assert_eq!(Cli::try_parse_from(["jitter"]).unwrap().duration, 60);
        assert!(Cli::try_parse_from(["jitter", "0"]).is_err());
        let check = Cli::try_parse_from(["jitter", "--check", "--rt-cpus", "1"]).unwrap();
        assert!(check.check);
        assert_eq!(check.rt_cpus, Some(CpuSet::parse("1").unwrap()));
        assert!(Cli::try_parse_from(["jitter", "--check", "--check-kernel"]).is_err());
    }

    #[test]
    fn tool_options_on_the_command_line() {
        let parse = |args: &[&str]| Cli::try_parse_from([&["jitter"], args].concat()).unwrap();
        assert_eq!(parse(&[]).tool, ToolArg::Cyclictest);
        let timerlat = parse(&["10", "--tool", "timerlat", "--trace-threshold", "1"]);
        assert_eq!(
            (timerlat.tool, timerlat.trace_threshold),
            (ToolArg::Timerlat, Some(1))
        );
        assert_eq!(check_combinations(&timerlat), Ok(()));
        assert!(Cli::try_parse_from(["jitter", "--tool", "perf"]).is_err());
        assert!(Cli::try_parse_from(["jitter", "--tool", "timerlat", "--trace-threshold", "0"]).is_err());
        let threshold_alone = check_combinations(&parse(&["--trace-threshold", "5"])).unwrap_err();
        assert!(threshold_alone.contains("--tool timerlat"), "{threshold_alone}");
        let soak = check_combinations(&parse(&["--tool", "timerlat", "--checkpoint-dir", "/d"])).unwrap_err();
        assert!(soak.contains("soaks"), "{soak}");
        assert!(check_combinations(&parse(&["--tool", "timerlat", "--resume", "/d"])).is_err());
    }

    #[test]
    fn container_options_on_the_command_line() {
        let parse = |args: &[&str]| Cli::try_parse_from([&["jitter"], args].concat());
        let run = parse(&["10", "--container", "localhost/rt-test"]).unwrap();
        assert_eq!(
            (run.container.as_deref(), run.container_budget),
            (Some("localhost/rt-test"), 10)
        );
        assert_eq!(check_combinations(&run), Ok(()));
        let budget = parse(&["--container", "img", "--container-budget", "25"]).unwrap();
        assert_eq!(budget.container_budget, 25);
        assert!(
            parse(&["--container-budget", "25"]).is_err(),
            "a budget without --container"
        );
        assert!(parse(&["--container", "img", "--check"]).is_err());
        for refused in [
            &["--container", "img", "--tool", "timerlat"][..],
            &["--container", "img", "--checkpoint-dir", "/d"],
            &["--container=-x"],
        ] {
            let problem = check_combinations(&parse(refused).unwrap()).unwrap_err();
            assert!(problem.starts_with("--container"), "{refused:?}: {problem}");
        }
    }

    #[test]
    fn soak_options_on_the_command_line() {
        let soak = Cli::try_parse_from(["jitter", "72h", "--checkpoint-dir", "/d"]).unwrap();
        assert_eq!(soak.checkpoint_dir, Some(PathBuf::from("/d")));
        assert_eq!(soak.checkpoint_every, 600);
        let every =
            Cli::try_parse_from(["jitter", "--checkpoint-dir", "/d", "--checkpoint-every", "5s"]).unwrap();
        assert_eq!(every.checkpoint_every, 5);
        assert!(Cli::try_parse_from(["jitter", "--checkpoint-every", "5s"]).is_err());
        let resume = Cli::try_parse_from(["jitter", "--resume", "/d"]).unwrap();
        assert_eq!(resume.resume, Some(PathBuf::from("/d")));
        assert!(Cli::try_parse_from(["jitter", "--resume", "/d", "--checkpoint-dir", "/e"]).is_err());
        assert!(Cli::try_parse_from(["jitter", "--resume", "/d", "--check"]).is_err());
    }
}
