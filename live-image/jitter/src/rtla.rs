//! `jitter --tool timerlat`: the measurement made by `rtla timerlat hist`
//! under the same load, on the same CPUs, at the same interval and priority
//! as cyclictest's. With a trace threshold, rtla stops at the first latency
//! over it and analyses it; jitter keeps the analysis and starts rtla again
//! for the time left, up to [`MAX_SPIKES`] analyses, so the run still lasts
//! the duration asked for.

use std::process::Command;
use std::sync::atomic::Ordering;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use rtreport::report::Spike;

use crate::checkpoint::{MergedCore, merge};
use crate::cyclictest::ThreadResult;
use crate::output::OutputFile;
use crate::process::{INTERRUPTED, StderrReader, hint_privileges, run_tool};
use crate::progress::{LiveWorst, SoakSoFar};
use crate::report::{Latency, Report};
use crate::session::{Options, Prepared, build_report, prepare, run_params, start_load, stop_load};
use crate::timerlat::{self, missing_rtla};

/// The runs stopped on a spike in one measurement; later runs go without a
/// threshold.
pub const MAX_SPIKES: usize = 10;

/// Every rtla run of one measurement, merged.
#[derive(Default)]
struct Measured {
    /// The first run's arguments (later runs differ only in `-d` and the threshold).
    args: Vec<String>,
    /// What every run printed, one after the other.
    output: String,
    /// The latency the RT thread sees: in user space when rtla runs user
    /// threads, else the kernel thread's.
    thread: Vec<MergedCore>,
    irq: Vec<MergedCore>,
    /// With user threads: their wake-up latency in the kernel.
    kernel_thread: Vec<MergedCore>,
    spikes: Vec<Spike>,
    /// The runs rtla stopped on a spike (analysed or not).
    stops: usize,
}

impl Measured {
    fn so_far(&self, elapsed_s: u64, total_s: u64) -> SoakSoFar {
        SoakSoFar {
            elapsed_s,
            total_s,
            samples: self.thread.iter().map(|c| c.samples).sum(),
            worst_us: self.thread.iter().map(|c| c.max_us).max(),
        }
    }

    /// Adds one run's histograms; returns whether rtla stopped on a spike.
    fn add_run(&mut self, args: Vec<String>, stdout: &str) -> Result<bool> {
        let cores = timerlat::parse_hist(stdout).context("parsing rtla's histogram")?;
        for core in cores {
            merge(&mut self.irq, &[core.irq]);
            match core.user {
                // The latency an RT task sees is the user-space one.
                Some(user) => {
                    merge(&mut self.thread, &[user]);
                    merge(&mut self.kernel_thread, &[core.thread]);
                }
                None => merge(&mut self.thread, &[core.thread]),
            }
        }
        self.output.push_str(stdout);
        if self.args.is_empty() {
            self.args = args;
        }
        if !timerlat::hit_stop(stdout) {
            return Ok(false);
        }
        self.stops += 1;
        for spike in timerlat::parse_analysis(stdout) {
            eprintln!("jitter: {}", timerlat::spike_line(&spike));
            self.spikes.push(spike);
        }
        Ok(true)
    }
}

/// One rtla run of `args` to its end; what it printed on stdout.
fn run_rtla(args: &[String], options: &Options, prepared: &Prepared, progress: SoakSoFar) -> Result<String> {
    // rtla writes nothing unless told (-t); should one ever, not here.
    let workdir = tempfile::tempdir().context("creating a working directory for rtla")?;
    let read_all: StderrReader = Box::new(|mut pipe| {
        let mut text = String::new();
        let _ = std::io::Read::read_to_string(&mut pipe, &mut text);
        text
    });
    let remaining = progress.total_s.saturating_sub(progress.elapsed_s);
    let output = run_tool(
        Command::new("rtla").args(args).current_dir(workdir.path()),
        missing_rtla(),
        &prepared.housekeeping,
        options.progress.then_some((remaining, Some(progress))),
        (LiveWorst::default(), read_all),
    )
    .map_err(hint_privileges)?;
    Ok(output.stdout)
}

/// rtla runs for the whole duration: again after each spike it stopped on.
fn measure(options: &Options, prepared: &Prepared) -> Result<Measured> {
    let started = Instant::now();
    let mut measured = Measured::default();
    loop {
        let elapsed_s = started.elapsed().as_secs();
        if elapsed_s >= options.duration_s || INTERRUPTED.load(Ordering::SeqCst) {
            break;
        }
        let threshold = options.trace_threshold_us.filter(|_| measured.stops < MAX_SPIKES);
        let params = run_params(options, prepared, options.duration_s - elapsed_s);
        let args = timerlat::arguments(&params, threshold);
        let stdout = run_rtla(
            &args,
            options,
            prepared,
            measured.so_far(elapsed_s, options.duration_s),
        )?;
        if !measured.add_run(args, &stdout)? {
            break;
        }
    }
    if measured.thread.is_empty() {
        bail!("rtla measured nothing");
    }
    Ok(measured)
}

fn latency(core: &MergedCore) -> Latency {
    Latency::from(&core.to_thread())
}

/// The whole measurement with rtla; keeps rtla's own output in
/// `save_output` if given.
pub fn run(options: &Options, save_output: Option<OutputFile>) -> Result<Report> {
    let prepared = prepare(options)?;
    let params = run_params(options, &prepared, options.duration_s);
    let first = timerlat::arguments(&params, options.trace_threshold_us);
    let load = start_load(options, &prepared, options.duration_s, &first)?;
    let measured = measure(options, &prepared);
    let load_report = stop_load(load, &prepared);
    let measured = measured?;
    if let Some(file) = save_output {
        file.write(measured.output.as_bytes())?;
    }
    let threads: Vec<ThreadResult> = measured.thread.iter().map(MergedCore::to_thread).collect();
    let mut report = build_report(
        options,
        &prepared.system,
        (prepared.rt_cpus.clone(), prepared.housekeeping.clone()),
        measured.args,
        load_report,
        &threads,
        &prepared.checks,
    );
    let of_cpu = |cores: &[MergedCore], cpu| cores.iter().find(|c| c.cpu == cpu).map(latency);
    for core in &mut report.cores {
        core.irq = of_cpu(&measured.irq, core.cpu);
        core.kernel_thread = of_cpu(&measured.kernel_thread, core.cpu);
    }
    report.spikes = measured.spikes;
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    const RUN: &str = "Index   IRQ-001   Thr-001   Usr-001\n2  3  0  0\n4  0  3  0\n5  0  0  3\nover: 0 0 0\ncount: 3 3 3\nmin: 2 4 5\navg: 2 4 5\nmax: 2 4 5\n";

    #[test]
    fn runs_merge_and_a_stopped_run_brings_its_spikes() {
        let mut measured = Measured::default();
        let stopped = format!(
            "{RUN}{}\n## CPU 1 hit stop tracing, analyzing it ##\n  Blocking thread:   4.00 us (80.00 %)\n------\n  Thread latency:   5.00 us (100%)\n",
            timerlat::HIT_STOP
        );
        assert!(measured.add_run(vec!["first".into()], &stopped).unwrap());
        assert!(!measured.add_run(vec!["second".into()], RUN).unwrap());
        assert_eq!((measured.stops, measured.spikes.len()), (1, 1));
        assert_eq!(measured.args, ["first"]);
        assert_eq!(measured.thread[0].samples, 6);
        assert_eq!(measured.irq[0].histogram[2], 6);
        assert_eq!(measured.thread[0].histogram[5], 6, "the user-space latency");
        assert_eq!(measured.kernel_thread[0].histogram[4], 6);
        assert_eq!(measured.so_far(7, 10).samples, 6);
        assert_eq!(measured.so_far(7, 10).worst_us, Some(5));
        assert!(measured.add_run(vec![], "garbage").is_err());
    }
}
