//! The CVE report of one commit, as JSON and as text (pure).

use std::collections::BTreeMap;
use std::fmt::Write;

use super::matching::{Finding, State};
use super::vex::{self, Cleared, LoadedVex, VexDocument};

/// The vulnerability data a report was made from.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct Database {
    pub format: &'static str,
    /// The file it was read from, or the URL or file `imgbuild cve-db
    /// update` took it from.
    pub source: String,
    pub sha256: String,
    pub bytes: u64,
    /// The data's date (UTC): when the file was last written, or the
    /// server's `Last-Modified` when it was downloaded.
    pub modified: String,
    /// Whole days since then.
    pub age_days: u64,
}

#[cfg(test)]
impl Database {
    /// A database for tests: `db.json`, written 2026-12-01.
    pub fn example() -> Database {
        Database {
            format: "debian-security-tracker-json",
            source: "db.json".into(),
            sha256: "ab".repeat(32),
            bytes: 42,
            modified: "2026-12-01T00:00:00Z".into(),
            age_days: 0,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct Report {
    pub commit: String,
    /// The Debian release matched (`bookworm`).
    pub release: String,
    pub database: Database,
    pub source_packages: usize,
    /// How the kernel was matched, or why it was not.
    pub kernel: String,
    /// Findings by state and urgency: `{"affected": {"high": 2}}`.
    pub counts: BTreeMap<&'static str, BTreeMap<&'static str, usize>>,
    pub findings: Vec<Finding>,
    /// Findings an authentic VEX statement cleared (not in `findings`).
    pub cleared: Vec<Cleared>,
    pub vex: Vec<VexDocument>,
}

impl Report {
    pub fn new(
        commit: String,
        release: String,
        database: Database,
        source_packages: usize,
        findings: Vec<Finding>,
    ) -> Report {
        Report {
            commit,
            release,
            database,
            source_packages,
            kernel: "not stated".into(),
            counts: counts(&findings),
            findings,
            cleared: Vec::new(),
            vex: Vec::new(),
        }
    }

    /// Moves the findings the documents' statements clear to `cleared`.
    pub fn clear_with(&mut self, documents: Vec<LoadedVex>) {
        let (left, cleared) = vex::apply(std::mem::take(&mut self.findings), &documents);
        self.counts = counts(&left);
        self.findings = left;
        self.cleared.extend(cleared);
        self.vex
            .extend(documents.into_iter().map(|loaded| loaded.document));
    }
}

fn counts(findings: &[Finding]) -> BTreeMap<&'static str, BTreeMap<&'static str, usize>> {
    let mut counts: BTreeMap<&'static str, BTreeMap<&'static str, usize>> = BTreeMap::new();
    for finding in findings {
        *counts
            .entry(finding.state.as_str())
            .or_default()
            .entry(finding.urgency.as_str())
            .or_default() += 1;
    }
    counts
}

/// The lines for cleared findings and ignored VEX documents.
pub fn render_vex(out: &mut String, cleared: &[Cleared], documents: &[VexDocument]) {
    for cleared in cleared {
        let _ = writeln!(
            out,
            "  cleared  {} in {} {}: {} ({}) by {}",
            cleared.id,
            cleared.source,
            cleared.installed_version,
            cleared.status.as_str(),
            crate::io::clean(cleared.reason.as_deref().unwrap_or("-")),
            cleared.vex
        );
    }
    for document in documents {
        if let Some(why) = &document.ignored {
            let _ = writeln!(out, "  ignored  {}: {}", document.path, crate::io::clean(why));
        }
    }
}

/// The report as text: a heading, then a line per finding.
pub fn render(report: &Report) -> String {
    let mut out = String::new();
    let db = &report.database;
    let count = |state: State| report.findings.iter().filter(|f| f.state == state).count();
    let _ = writeln!(out, "commit   {}", report.commit);
    let _ = writeln!(out, "release  Debian {}", report.release);
    let _ = writeln!(out, "kernel   {}", report.kernel);
    let _ = writeln!(
        out,
        "database {} ({}, {} bytes, sha256 {}, dated {})",
        db.source, db.format, db.bytes, db.sha256, db.modified
    );
    let _ = writeln!(
        out,
        "checked  {} source packages: {} affected, {} undetermined, {} cleared by VEX",
        report.source_packages,
        count(State::Affected),
        count(State::Undetermined),
        report.cleared.len()
    );
    for finding in &report.findings {
        let state = match (&finding.state, &finding.fixed_version) {
            (State::Affected, Some(fixed)) => format!("fixed in {fixed}"),
            (State::Affected, None) => "no fix yet".to_string(),
            (State::Undetermined, _) => "undetermined".to_string(),
        };
        let installed = format!("{} {}", finding.source, finding.installed_version);
        let _ = writeln!(
            out,
            "{:<20} {:<12} {:<40} {state}",
            finding.id,
            finding.urgency.as_str(),
            installed
        );
    }
    render_vex(&mut out, &report.cleared, &report.vex);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cve::tracker::Urgency;

    #[test]
    fn the_text_names_each_finding_and_its_fix() {
        let finding = |id: &str, state, urgency, fixed: Option<&str>| Finding {
            id: id.into(),
            source: "bash".into(),
            installed_version: "5.2.15-2".into(),
            binaries: vec!["bash".into()],
            state,
            urgency,
            fixed_version: fixed.map(String::from),
        };
        let findings = vec![
            finding("CVE-2022-3715", State::Affected, Urgency::High, Some("5.2.15-3")),
            finding("CVE-2019-18276", State::Affected, Urgency::Low, None),
            finding("TEMP-0000000-ABCDEF", State::Undetermined, Urgency::Low, None),
        ];
        let database = Database::example();
        let report = Report::new("c0".repeat(32), "bookworm".into(), database, 7, findings);
        assert_eq!(report.counts["affected"]["low"], 1);
        assert_eq!(report.counts["undetermined"]["low"], 1);
        let text = render(&report);
        assert!(
            text.contains("checked  7 source packages: 2 affected, 1 undetermined, 0 cleared by VEX"),
            "{text}"
        );
        assert!(
            text.contains("CVE-2022-3715        high         bash 5.2.15-2"),
            "{text}"
        );
        assert!(
            text.lines()
                .any(|l| l.starts_with("CVE-2022-3715") && l.ends_with("fixed in 5.2.15-3"))
        );
        assert!(
            text.lines()
                .any(|l| l.starts_with("CVE-2019-18276") && l.ends_with("no fix yet"))
        );
        assert!(
            text.lines()
                .any(|l| l.starts_with("TEMP-") && l.ends_with("undetermined"))
        );
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["findings"][0]["state"], "affected");
        assert_eq!(json["findings"][0]["urgency"], "high");
        assert_eq!(json["findings"][0]["fixed-version"], "5.2.15-3");
    }
}
