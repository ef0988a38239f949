//! The latency check of an RT trial boot: `jitter` measures the isolated
//! cores for the commit's `latency-seconds` against its `budget-us`. PASS
//! passes, FAIL fails the boot, INVALID (a VM, SMIs) follows `on-invalid`.
//! The JSON report is kept in `/var/lib/emberrtos/health/`.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use rtreport::report::{Report, Verdict};

use super::record::{CheckResult, Outcome};
use emberrtos_contract::paths::JITTER_INSTALL_PATH;
use emberrtos_contract::policy::{HealthPolicy, OnInvalid};

/// The check's name in the record and on the console.
pub const NAME: &str = "latency";
/// Where reports are kept, relative to `/var`.
pub const REPORT_DIR: &str = "lib/emberrtos/health";

/// Runs jitter under `root` (`/`) and judges its report, written to
/// `report` (a path on the running system, in a directory that exists).
pub fn measure(root: &Path, policy: &HealthPolicy, report: &Path) -> CheckResult {
    let judged = run_jitter(root, policy, report).and_then(|(code, text)| judge(code, &text, policy));
    let (outcome, detail) = judged.unwrap_or_else(|e| (Outcome::Fail, format!("{e:#}")));
    CheckResult {
        name: NAME.into(),
        outcome,
        required: true,
        detail,
    }
}

fn run_jitter(root: &Path, policy: &HealthPolicy, report: &Path) -> Result<(i32, String)> {
    let jitter: PathBuf = root.join(JITTER_INSTALL_PATH);
    // jitter's own run is bounded by its duration; the margin covers load
    // start-up and the report.
    let limit = (policy.latency_seconds + 120).to_string();
    let status = Command::new("timeout")
        .args(["-k", "10", &limit])
        .arg(&jitter)
        .arg(policy.latency_seconds.to_string())
        .arg("--budget")
        .arg(policy.budget_us.to_string())
        .arg("--json")
        .arg(report)
        .stdout(std::process::Stdio::null())
        .status()
        .with_context(|| format!("running {}", jitter.display()))?;
    let code = status.code().unwrap_or(-1);
    let text = std::fs::read_to_string(report)
        .with_context(|| format!("jitter exited {status} without a report at {}", report.display()))?;
    Ok((code, text))
}

/// Pure: the outcome of a jitter run from its exit code and JSON report.
/// The exit code must agree with the report's verdict (0 PASS, 3 FAIL,
/// 4 INVALID): a report left by an earlier run never passes a later one.
pub fn judge(code: i32, report: &str, policy: &HealthPolicy) -> Result<(Outcome, String)> {
    let report: Report = serde_json::from_str(report).context("reading jitter's JSON report")?;
    let verdict = report.verdict();
    let expected = match verdict {
        Verdict::Pass => 0,
        Verdict::Fail => 3,
        Verdict::Invalid => 4,
    };
    if code != expected {
        bail!("jitter exited {code} but its report says {verdict}");
    }
    let worst = format!(
        "worst case {} us, budget {} us",
        report.assessment.worst_us, report.run.budget_us
    );
    Ok(match verdict {
        Verdict::Pass => (Outcome::Pass, format!("PASS, {worst}")),
        Verdict::Fail => (Outcome::Fail, format!("FAIL, {worst}")),
        Verdict::Invalid => {
            let why: Vec<String> = report
                .assessment
                .reasons
                .iter()
                .map(|r| r.detail.clone())
                .collect();
            let outcome = match policy.on_invalid {
                OnInvalid::Warn => Outcome::Warn,
                OnInvalid::Fail => Outcome::Fail,
            };
            let detail = format!(
                "INVALID, {worst}; on-invalid: {} ({}); why: {}",
                policy.on_invalid.as_str(),
                match policy.on_invalid {
                    OnInvalid::Warn => "VMs are always INVALID: the boot passes",
                    OnInvalid::Fail => "the boot fails",
                },
                why.join("; ")
            );
            (outcome, detail)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A real INVALID report (a VM): worst case 1431 us, budget 100 us.
    const INVALID: &str = include_str!("../../../live-image/jitter/tests/fixtures/jitter-report-1.json");

    fn with_verdict(verdict: &str) -> String {
        INVALID.replace("\"verdict\": \"INVALID\"", &format!("\"verdict\": \"{verdict}\""))
    }

    #[test]
    fn invalid_follows_the_policy_and_says_so() {
        let warn = HealthPolicy::default();
        let (outcome, detail) = judge(4, INVALID, &warn).unwrap();
        assert_eq!(outcome, Outcome::Warn);
        assert!(
            detail.contains("INVALID") && detail.contains("hypervisor"),
            "{detail}"
        );
        assert!(
            detail.contains("on-invalid: warn (VMs are always INVALID"),
            "{detail}"
        );
        let fail = HealthPolicy {
            on_invalid: OnInvalid::Fail,
            ..HealthPolicy::default()
        };
        assert_eq!(judge(4, INVALID, &fail).unwrap().0, Outcome::Fail);
    }

    #[test]
    fn over_budget_fails_and_the_exit_code_must_agree_with_the_report() {
        let policy = HealthPolicy::default();
        let fail = with_verdict("FAIL");
        assert_ne!(fail, INVALID, "the fixture's verdict was not replaced");
        let (outcome, detail) = judge(3, &fail, &policy).unwrap();
        assert_eq!(outcome, Outcome::Fail);
        assert!(detail.contains("worst case 1431 us, budget 100 us"), "{detail}");
        assert_eq!(judge(0, &with_verdict("PASS"), &policy).unwrap().0, Outcome::Pass);
        // A stale PASS report next to a run that failed proves nothing.
        assert!(judge(1, &with_verdict("PASS"), &policy).is_err());
        assert!(judge(0, INVALID, &policy).is_err());
        assert!(judge(0, "{}", &policy).is_err());
    }
}
