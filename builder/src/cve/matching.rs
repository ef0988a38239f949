//! Which of the tracker's issues a commit's source packages have, in
//! Debian's version order (pure).

use anyhow::{Context, Result};

use super::sources::InstalledSource;
use super::tracker::{Issue, Issues, Status, Urgency};
use crate::sbom::dpkg::parse_version;

/// Whether the installed version has the issue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    /// Older than the fix, or no fix yet.
    Affected,
    /// The tracker does not yet know whether the release is affected.
    Undetermined,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::Affected => "affected",
            State::Undetermined => "undetermined",
        }
    }
}

impl serde::Serialize for State {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

/// One issue of one installed source package.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct Finding {
    pub id: String,
    pub source: String,
    pub installed_version: String,
    pub binaries: Vec<String>,
    pub state: State,
    pub urgency: Urgency,
    /// The first version with the fix; none when there is no fix yet.
    pub fixed_version: Option<String>,
}

/// The findings, most urgent first, then by id and source.
pub fn findings(sources: &[InstalledSource], issues: &Issues) -> Result<Vec<Finding>> {
    let mut found = Vec::new();
    for source in sources {
        for issue in issues.get(&source.name).into_iter().flatten() {
            let state = state_of(source, issue)
                .with_context(|| format!("{} of source package {}", issue.id, source.name))?;
            if let Some(state) = state {
                found.push(Finding {
                    id: issue.id.clone(),
                    source: source.name.clone(),
                    installed_version: source.version.clone(),
                    binaries: source.binaries.clone(),
                    state,
                    urgency: issue.urgency,
                    fixed_version: issue
                        .fixed_version
                        .clone()
                        .filter(|_| issue.status == Status::Resolved),
                });
            }
        }
    }
    found.sort_by(|a, b| {
        b.urgency
            .cmp(&a.urgency)
            .then_with(|| (&a.id, &a.source).cmp(&(&b.id, &b.source)))
    });
    Ok(found)
}

/// Whether `source` as installed has `issue`; `None` when it does not.
fn state_of(source: &InstalledSource, issue: &Issue) -> Result<Option<State>> {
    let fixed = match (issue.status, issue.fixed_version.as_deref()) {
        (Status::Open, _) => return Ok(Some(State::Affected)),
        (Status::Undetermined, _) | (Status::Resolved, None) => return Ok(Some(State::Undetermined)),
        // `0`: the release never had the issue.
        (Status::Resolved, Some("0")) => return Ok(None),
        (Status::Resolved, Some(fixed)) => fixed,
    };
    let fixed = parse_version(fixed).context("the tracker's fixed version")?;
    let installed = parse_version(&source.version).context("the installed version")?;
    Ok((installed < fixed).then_some(State::Affected))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn source(name: &str, version: &str) -> InstalledSource {
        InstalledSource {
            name: name.into(),
            version: version.into(),
            binaries: vec![format!("{name}-bin")],
        }
    }

    fn issue(id: &str, status: Status, urgency: &str, fixed: Option<&str>) -> Issue {
        Issue {
            id: id.into(),
            status,
            urgency: Urgency::parse(urgency),
            fixed_version: fixed.map(String::from),
        }
    }

    fn ids(found: &[Finding]) -> Vec<(&str, State)> {
        found.iter().map(|f| (f.id.as_str(), f.state)).collect()
    }

    #[test]
    fn versions_compare_in_debian_order() {
        let issues = Issues::from([(
            "openssl".to_string(),
            vec![
                issue(
                    "CVE-2024-0001",
                    Status::Resolved,
                    "medium",
                    Some("3.0.15-1~deb12u1"),
                ),
                issue(
                    "CVE-2024-0002",
                    Status::Resolved,
                    "high",
                    Some("3.0.11-1~deb12u2"),
                ),
                issue("CVE-2024-0003", Status::Resolved, "low", Some("3.0.14")),
                issue("CVE-2024-0004", Status::Resolved, "high", Some("0")),
                issue("CVE-2024-0005", Status::Resolved, "high", Some("1:1.0")),
            ],
        )]);
        let found = findings(&[source("openssl", "3.0.14-1~deb12u2")], &issues).unwrap();
        // 3.0.14-1~deb12u2 < 3.0.15-1~deb12u1 and < 1:1.0 (an epoch wins);
        // > 3.0.11-1~deb12u2 and > 3.0.14; `0` was never affected.
        assert_eq!(
            ids(&found),
            [
                ("CVE-2024-0005", State::Affected),
                ("CVE-2024-0001", State::Affected)
            ]
        );
        assert_eq!(found[1].fixed_version.as_deref(), Some("3.0.15-1~deb12u1"));
        assert_eq!(found[1].binaries, ["openssl-bin"]);
    }

    #[test]
    fn open_and_undetermined_issues_are_reported_most_urgent_first() {
        let issues = Issues::from([
            (
                "bash".to_string(),
                vec![issue("CVE-2019-18276", Status::Open, "low", None)],
            ),
            (
                "systemd".to_string(),
                vec![
                    issue(
                        "TEMP-0000000-ABCDEF",
                        Status::Undetermined,
                        "not yet assigned",
                        None,
                    ),
                    issue("CVE-2023-0001", Status::Resolved, "unimportant", None),
                    issue("CVE-2023-0002", Status::Open, "high", Some("252.40-1")),
                ],
            ),
            (
                "absent".to_string(),
                vec![issue("CVE-2020-0001", Status::Open, "high", None)],
            ),
        ]);
        let installed = [
            source("bash", "5.2.15-2+b7"),
            source("systemd", "252.39-1~deb12u1"),
        ];
        let found = findings(&installed, &issues).unwrap();
        assert_eq!(
            ids(&found),
            [
                ("TEMP-0000000-ABCDEF", State::Undetermined),
                ("CVE-2023-0002", State::Affected),
                ("CVE-2019-18276", State::Affected),
                ("CVE-2023-0001", State::Undetermined),
            ]
        );
        assert_eq!(
            found[1].fixed_version, None,
            "an open issue has no fix, whatever the export says"
        );
    }

    #[test]
    fn a_bad_fixed_version_names_the_issue() {
        let issues = Issues::from([(
            "bash".to_string(),
            vec![issue("CVE-2022-3715", Status::Resolved, "low", Some("v5"))],
        )]);
        let error = findings(&[source("bash", "5.2.15-2")], &issues).unwrap_err();
        let text = format!("{error:#}");
        assert!(text.contains("CVE-2022-3715 of source package bash"), "{text}");
        assert!(text.contains("\"v5\""), "{text}");
    }
}
