//! The promotion gate on known vulnerabilities: every finding at or above
//! `--max-severity` that no authentic OpenVEX statement (signed by the
//! promotion's own key) cleared refuses the promotion (pure).

use super::matching::{Finding, State};
use super::report::{Database, Report, render_vex};
use super::tracker::Urgency;
use super::vex::{Cleared, VexDocument};

#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct GateReport {
    pub release: String,
    pub database: Database,
    pub max_severity: Urgency,
    /// How the kernel was matched, or why it was not.
    pub kernel: String,
    /// Findings at or above the limit that nothing cleared: each refuses.
    pub blocking: Vec<Finding>,
    pub cleared: Vec<Cleared>,
    pub vex: Vec<VexDocument>,
}

/// Judges a report, VEX already applied, against the limit.
pub fn judge(report: Report, max_severity: Urgency) -> GateReport {
    GateReport {
        release: report.release,
        database: report.database,
        max_severity,
        kernel: report.kernel,
        blocking: report
            .findings
            .into_iter()
            .filter(|finding| finding.urgency >= max_severity)
            .collect(),
        cleared: report.cleared,
        vex: report.vex,
    }
}

/// One refusal reason per blocking finding.
pub fn reasons(gate: &GateReport) -> Vec<String> {
    gate.blocking
        .iter()
        .map(|finding| {
            let state = match (finding.state, &finding.fixed_version) {
                (State::Affected, Some(fixed)) => format!("affected, fixed in {fixed}"),
                (State::Affected, None) => "affected, no fix yet".to_string(),
                (State::Undetermined, _) => "undetermined".to_string(),
            };
            format!(
                "{} ({}, at or above --max-severity {}) in {} {}: {state}; no authentic VEX statement clears it",
                finding.id,
                finding.urgency.as_str(),
                gate.max_severity.as_str(),
                finding.source,
                finding.installed_version
            )
        })
        .collect()
}

/// The gate as text, after promote's table.
pub fn render(gate: &GateReport) -> String {
    let mut out = format!(
        "cve: Debian {}, {} (sha256 {}), --max-severity {}: {} blocking, {} cleared by VEX\n",
        gate.release,
        gate.database.source,
        gate.database.sha256,
        gate.max_severity.as_str(),
        gate.blocking.len(),
        gate.cleared.len()
    );
    out.push_str(&format!("  kernel   {}\n", gate.kernel));
    render_vex(&mut out, &gate.cleared, &gate.vex);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cve::vex::{self, LoadedVex};

    fn finding(id: &str, urgency: Urgency) -> Finding {
        Finding {
            id: id.into(),
            source: "glibc".into(),
            installed_version: "2.36-9+deb12u10".into(),
            binaries: vec!["libc6".into()],
            state: State::Affected,
            urgency,
            fixed_version: Some("2.36-9+deb12u11".into()),
        }
    }

    fn report(findings: Vec<Finding>, documents: Vec<LoadedVex>) -> Report {
        let database = Database::example();
        let mut report = Report::new("c".repeat(64), "bookworm".into(), database, 1, findings);
        report.clear_with(documents);
        report
    }

    fn loaded(path: &str, statements: &str, ignored: Option<&str>) -> LoadedVex {
        let document =
            format!(r#"{{"@context": "https://openvex.dev/ns/v0.2.0", "statements": [{statements}]}}"#);
        LoadedVex {
            document: VexDocument {
                path: path.into(),
                sha256: crate::io::hashing::sha256_hex(&document),
                ignored: ignored.map(String::from),
            },
            statements: match ignored {
                None => vex::parse(&document).unwrap(),
                Some(_) => Vec::new(),
            },
        }
    }

    const CLEARS_HIGH: &str = r#"{"vulnerability": {"name": "CVE-2023-0002"}, "products": [{"@id": "pkg:deb/debian/glibc?arch=source"}],
        "status": "not_affected", "justification": "component_not_present"}"#;

    #[test]
    fn only_findings_at_or_above_the_limit_refuse_and_vex_clears_them() {
        let findings = vec![
            finding("CVE-2023-0001", Urgency::Unassigned),
            finding("CVE-2023-0002", Urgency::High),
            finding("CVE-2023-0003", Urgency::Medium),
        ];
        let gate = judge(report(findings.clone(), vec![]), Urgency::High);
        let blocking: Vec<_> = gate.blocking.iter().map(|f| f.id.as_str()).collect();
        assert_eq!(blocking, ["CVE-2023-0001", "CVE-2023-0002"]);
        let reasons = reasons(&gate);
        assert!(
            reasons[1].starts_with(
                "CVE-2023-0002 (high, at or above --max-severity high) in glibc 2.36-9+deb12u10: affected, fixed in 2.36-9+deb12u11"
            ),
            "{reasons:?}"
        );
        let gate = judge(
            report(findings, vec![loaded("ok.vex", CLEARS_HIGH, None)]),
            Urgency::High,
        );
        let blocking: Vec<_> = gate.blocking.iter().map(|f| f.id.as_str()).collect();
        assert_eq!(blocking, ["CVE-2023-0001"]);
        assert_eq!(gate.cleared[0].id, "CVE-2023-0002");
        assert_eq!(gate.cleared[0].vex, "ok.vex");
        let text = render(&gate);
        assert!(
            text.contains("cleared  CVE-2023-0002 in glibc 2.36-9+deb12u10: not_affected (component_not_present) by ok.vex"),
            "{text}"
        );
    }

    #[test]
    fn an_ignored_document_clears_nothing_and_says_why() {
        let ignored = loaded("bad.vex", CLEARS_HIGH, Some("no signature bad.vex.sig"));
        let gate = judge(
            report(vec![finding("CVE-2023-0002", Urgency::High)], vec![ignored]),
            Urgency::High,
        );
        assert_eq!(gate.blocking.len(), 1);
        assert!(render(&gate).contains("ignored  bad.vex: no signature bad.vex.sig"));
    }
}
