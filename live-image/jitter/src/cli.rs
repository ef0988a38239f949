//! `jitter [DURATION] [options]`. Exit codes: 0 PASS, 1 error, 2 usage,
//! 3 FAIL, 4 INVALID.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Result;
use clap::Parser;

use crate::cpus::CpuSet;
use crate::output::OutputFile;
use crate::report;
use crate::run::{Options, run};

#[derive(Parser, Debug)]
#[command(
    name = "jitter",
    version,
    about = "Worst-case latency validation: cyclictest under load, per-core worst case, verdict"
)]
pub struct Cli {
    /// Seconds to measure (`jitter 300` qualifies a platform).
    #[arg(default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
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
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(10..))]
    pub interval: u32,
    /// SCHED_FIFO priority of the measuring threads.
    #[arg(long, default_value_t = 99, value_parser = clap::value_parser!(u32).range(1..=99))]
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
    /// Also keep cyclictest's own output (histogram and its min/avg/max lines) here.
    #[arg(long)]
    pub save_cyclictest: Option<PathBuf>,
    /// Only print the PREEMPT_RT evidence of the running kernel (exit 0 if
    /// it is PREEMPT_RT, 3 if not).
    #[arg(long)]
    pub check_kernel: bool,
    /// Largest histogram bucket, in microseconds.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub histogram_max: u32,
    /// Every 2 s while measuring, print on stderr
    /// `jitter: progress ELAPSED/TOTAL s, worst case MAX us` (without the
    /// worst case until cyclictest has reported one).
    #[arg(long)]
    pub progress: bool,
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
    let outputs = Outputs::open(cli)?;
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
    };
    let report = run(&options, outputs.cyclictest)?;
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
        file.write(report::svg(&report)?.as_bytes())?;
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
