//! The measurement on the target: `jitter --progress` in a scratch
//! directory, then the report, the plot and cyclictest's raw histogram
//! fetched back. The report is checked against the run that was asked for.

use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use rtreport::report::{Progress, Report, Verdict};

use super::ssh::{Limits, Session};
use super::{Expected, clean, clean_lines};

/// Each fetched file is capped at this many bytes; the report, which goes
/// into the record, at [`REPORT_LIMIT`].
pub const FILE_LIMIT: u64 = 32 << 20;
pub const REPORT_LIMIT: u64 = 4 << 20;

/// The files a measurement leaves, as fetched.
pub struct Measurement {
    pub report: Report,
    pub report_json: Vec<u8>,
    pub plot_svg: Vec<u8>,
    pub cyclictest: Vec<u8>,
}

/// What was asked of jitter.
#[derive(Clone, Copy, Debug)]
pub struct Run {
    pub duration_s: u64,
    pub budget_us: u64,
}

/// Whether `path` is what `mktemp -d /tmp/imgbuild-qualify.XXXXXX` makes
/// (pure): it goes into later commands, so nothing else is accepted.
pub fn is_scratch_dir(path: &str) -> bool {
    path.strip_prefix("/tmp/imgbuild-qualify.")
        .is_some_and(|suffix| suffix.len() >= 6 && suffix.bytes().all(|b| b.is_ascii_alphanumeric()))
}

/// Runs jitter on the target and fetches its files; the scratch directory
/// is removed afterwards, whatever happened.
pub fn measure(
    session: &Session,
    run: Run,
    expected: &Expected,
    on_progress: &mut dyn FnMut(Progress),
) -> Result<Measurement> {
    let output = session.run("mktemp -d /tmp/imgbuild-qualify.XXXXXX", Limits::PROBE)?;
    let dir = String::from_utf8_lossy(&output.stdout).trim().to_string();
    ensure!(
        output.code == 0 && is_scratch_dir(&dir),
        "the target's mktemp gave {:?}, not a scratch directory",
        clean(&dir)
    );
    let measured = run_jitter(session, &dir, run, on_progress)
        .and_then(|code| fetch(session, &dir).map(|measurement| (code, measurement)));
    let _ = session.run(&format!("rm -rf -- {dir}"), Limits::PROBE);
    let (exit_code, measurement) = measured?;
    check_report(&measurement.report, run, expected, exit_code)?;
    Ok(measurement)
}

/// jitter's exit code, once it is a verdict's.
fn run_jitter(session: &Session, dir: &str, run: Run, on_progress: &mut dyn FnMut(Progress)) -> Result<i32> {
    let command = format!(
        "cd {dir} && jitter {} --budget {} --progress --json report.json --svg plot.svg --save-cyclictest cyclictest.txt",
        run.duration_s, run.budget_us
    );
    let limits = Limits {
        deadline: Duration::from_secs(run.duration_s + 300),
        stdout_bytes: 1 << 20,
    };
    let output = session.run_watching(&command, limits, &mut |line| {
        if let Some(progress) = Progress::parse(line) {
            on_progress(progress);
        }
    })?;
    // 0 PASS, 3 FAIL, 4 INVALID: a verdict. Anything else is an error.
    if ![0, 3, 4].contains(&output.code) {
        let tail = crate::tool::tail_lines(&clean_lines(&output.stderr), 8);
        bail!("jitter failed on the target (exit {}):\n{tail}", output.code);
    }
    Ok(output.code)
}

fn fetch(session: &Session, dir: &str) -> Result<Measurement> {
    let read = |name: &str, limit| session.read_file(&format!("{dir}/{name}"), limit);
    let report_json = read("report.json", REPORT_LIMIT)?;
    let report: Report =
        serde_json::from_slice(&report_json).context("the target's report.json is not a jitter report")?;
    Ok(Measurement {
        report,
        report_json,
        plot_svg: read("plot.svg", FILE_LIMIT)?,
        cyclictest: read("cyclictest.txt", FILE_LIMIT)?,
    })
}

/// The report must be of the run asked for, on the expected kernel, and
/// its verdict consistent with its own figures and jitter's exit code.
pub fn check_report(report: &Report, run: Run, expected: &Expected, exit_code: i32) -> Result<()> {
    let mut problems = Vec::new();
    if i32::from(report.verdict().exit_code()) != exit_code {
        problems.push(format!(
            "it says {} but jitter exited {exit_code}",
            report.verdict()
        ));
    }
    if report.run.duration_s != run.duration_s || report.run.budget_us != run.budget_us {
        problems.push(format!(
            "it measured {} s against {} us, {} s against {} us was asked",
            report.run.duration_s, report.run.budget_us, run.duration_s, run.budget_us
        ));
    }
    if report.kernel.release != expected.release || report.kernel.uts_version != expected.uts_version {
        problems.push(format!(
            "it names kernel {:?}, not the commit's",
            clean(&report.kernel.release)
        ));
    }
    if report.verdict() == Verdict::Pass && report.assessment.worst_us > run.budget_us {
        problems.push(format!(
            "it says PASS with a worst case of {} us over the {} us budget",
            report.assessment.worst_us, run.budget_us
        ));
    }
    match problems.is_empty() {
        true => Ok(()),
        false => bail!(
            "the target's jitter report cannot be trusted: {}",
            problems.join("; ")
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_mktemp_scratch_dirs_are_used() {
        assert!(is_scratch_dir("/tmp/imgbuild-qualify.Ab12Cd"));
        for bad in [
            "/tmp/imgbuild-qualify.Ab1",
            "/tmp/imgbuild-qualify.Ab12C; rm -rf /",
            "/tmp/imgbuild-qualify.../../etc",
            "/tmp/x",
            "",
            "/tmp/imgbuild-qualify.Ab12Cd\n/etc",
        ] {
            assert!(!is_scratch_dir(bad), "{bad:?}");
        }
    }

    const FIXTURE: &str = include_str!("../../../live-image/jitter/tests/fixtures/jitter-report-1.json");

    fn fixture() -> (Report, Run, Expected) {
        let report: Report = serde_json::from_str(FIXTURE).unwrap();
        let run = Run {
            duration_s: report.run.duration_s,
            budget_us: report.run.budget_us,
        };
        let expected = Expected {
            release: report.kernel.release.clone(),
            uts_version: report.kernel.uts_version.clone(),
            ..Expected::default()
        };
        (report, run, expected)
    }

    #[test]
    fn reports_of_another_run_or_kernel_are_refused() {
        let (report, run, expected) = fixture();
        let code = |report: &Report| i32::from(report.verdict().exit_code());
        check_report(&report, run, &expected, code(&report)).unwrap();
        assert!(check_report(&report, run, &expected, 7).is_err());
        let longer = Run {
            duration_s: run.duration_s + 1,
            ..run
        };
        assert!(check_report(&report, longer, &expected, code(&report)).is_err());
        let other_kernel = Expected {
            release: "9.9.9".into(),
            ..expected.clone()
        };
        assert!(check_report(&report, run, &other_kernel, code(&report)).is_err());
        let mut lying = report.clone();
        lying.assessment.verdict = Verdict::Pass;
        lying.assessment.worst_us = run.budget_us + 1;
        let error = check_report(&lying, run, &expected, 0).unwrap_err();
        assert!(error.to_string().contains("says PASS"), "{error}");
    }
}
