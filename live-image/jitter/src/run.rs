//! The orchestrator: one measurement with cyclictest (pick the CPUs, start
//! the load, run cyclictest, stop the load, assess, report), again in
//! containers with `--container`, or a soak of such runs with checkpoints.
//! rtla's measurement is in [`crate::rtla`]; what both share is in
//! [`crate::session`].

use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use tempfile::NamedTempFile;

use crate::checkpoint::{Checkpoint, SoakOptions, now_unix};
use crate::container;
use crate::cyclictest::{self, ThreadResult, cyclictest_json_file, run_cyclictest};
use crate::output::OutputFile;
use crate::process::INTERRUPTED;
use crate::progress::SoakSoFar;
use crate::report::{Report, Tool};
use crate::session::{
    Assessed, Options, Prepared, assess, build_report, prepare, run_params, start_load, stop_load,
};
use crate::verdict::LoadReport;

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

#[cfg(test)]
mod tests {
    use super::*;

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
}
