//! What a release changes in known vulnerabilities: the findings one commit
//! has and the next has not (fixed), and the other way (introduced) (pure).

use std::collections::BTreeSet;

use super::matching::Finding;
use super::report::Report;

#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct CveChanges {
    /// The export both were matched against.
    pub database_sha256: String,
    /// In the first commit, not in the second (as the first has them).
    pub fixed: Vec<Finding>,
    /// In the second commit, not in the first (as the second has them).
    pub introduced: Vec<Finding>,
}

/// The changes from `from` to `to`, by issue id and source package: an
/// issue whose package moved to another still-affected version is in
/// neither list.
pub fn changes(from: &Report, to: &Report) -> CveChanges {
    let key = |f: &Finding| (f.id.clone(), f.source.clone());
    let keys = |report: &Report| report.findings.iter().map(key).collect::<BTreeSet<_>>();
    let (before, after) = (keys(from), keys(to));
    let only = |report: &Report, other: &BTreeSet<(String, String)>| {
        let findings = report.findings.iter().filter(|f| !other.contains(&key(f)));
        findings.cloned().collect()
    };
    CveChanges {
        database_sha256: to.database.sha256.clone(),
        fixed: only(from, &after),
        introduced: only(to, &before),
    }
}

/// The changes as text, one line per issue.
pub fn render(changes: &CveChanges) -> String {
    let mut out = format!(
        "cve: {} fixed, {} introduced (tracker export sha256 {})\n",
        changes.fixed.len(),
        changes.introduced.len(),
        changes.database_sha256
    );
    for (word, findings) in [("fixed", &changes.fixed), ("introduced", &changes.introduced)] {
        for f in findings {
            out.push_str(&format!(
                "  {word:<10} {} ({}) in {} {}\n",
                f.id,
                f.urgency.as_str(),
                f.source,
                f.installed_version
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cve::matching::State;
    use crate::cve::report::Database;
    use crate::cve::tracker::Urgency;

    fn report(findings: &[(&str, &str, &str)]) -> Report {
        let findings = findings
            .iter()
            .map(|(id, source, version)| Finding {
                id: id.to_string(),
                source: source.to_string(),
                installed_version: version.to_string(),
                binaries: vec![],
                state: State::Affected,
                urgency: Urgency::Low,
                fixed_version: None,
            })
            .collect();
        let database = Database::example();
        Report::new("c".repeat(64), "bookworm".into(), database, 3, findings)
    }

    #[test]
    fn fixed_and_introduced_are_by_issue_and_package() {
        let v1 = report(&[
            ("CVE-1", "bash", "5.2-1"),
            ("CVE-2", "zlib", "1.2"),
            ("CVE-3", "glibc", "2.36-9"),
        ]);
        let v2 = report(&[
            ("CVE-2", "zlib", "1.3"),
            ("CVE-3", "glibc", "2.36-9"),
            ("CVE-4", "tree", "2.1"),
        ]);
        let changes = changes(&v1, &v2);
        let ids = |list: &[Finding]| list.iter().map(|f| f.id.clone()).collect::<Vec<_>>();
        assert_eq!(ids(&changes.fixed), ["CVE-1"]);
        assert_eq!(ids(&changes.introduced), ["CVE-4"]);
        let text = render(&changes);
        assert!(text.starts_with("cve: 1 fixed, 1 introduced"), "{text}");
        assert!(
            text.contains("  fixed      CVE-1 (low) in bash 5.2-1\n"),
            "{text}"
        );
        assert!(text.contains("  introduced CVE-4 (low) in tree 2.1\n"), "{text}");
    }
}
