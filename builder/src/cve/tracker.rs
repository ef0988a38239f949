//! The Debian security tracker's JSON export
//! (`https://security-tracker.debian.org/tracker/data/json`), read in one
//! pass that keeps only one release of the source packages asked for: the
//! whole export is some hundreds of megabytes once parsed, the part an image
//! needs a few hundred kilobytes.
//!
//! Its shape: `{ SOURCE: { ID: { "releases": { RELEASE: { "status",
//! "fixed_version"?, "urgency", ... } }, ... } } }`, where ID is a CVE id
//! or a `TEMP-` id the tracker gives an issue that has none yet.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::io::Read;

use serde::Deserialize;
use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, Visitor};

/// What the tracker says of an issue in one release.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// Not fixed in the release.
    Open,
    /// Fixed in `fixed_version` (`0`: the release was never affected).
    Resolved,
    /// Not yet known whether the release is affected.
    Undetermined,
}

impl Status {
    fn parse(word: &str) -> Option<Status> {
        match word {
            "open" => Some(Status::Open),
            "resolved" => Some(Status::Resolved),
            "undetermined" => Some(Status::Undetermined),
            _ => None,
        }
    }
}

/// The longest version the export may state: Debian's are short, and
/// comparing huge digit runs costs time quadratic in their length.
pub const MAX_VERSION_BYTES: usize = 128;

/// Debian's urgency of an issue in a release, least urgent first. An
/// urgency the tracker has not assigned, or one this version of imgbuild
/// does not know, ranks above `high`: a gate treats what it cannot rank as
/// the worst.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Urgency {
    Unimportant,
    Low,
    Medium,
    High,
    /// `end-of-life`: the release no longer gets security support for the package.
    EndOfLife,
    /// `not yet assigned`, or a word imgbuild does not know.
    Unassigned,
}

impl Urgency {
    /// Reads the tracker's word; a trailing `*` (an urgency the tracker
    /// took over from elsewhere) ranks as the word itself.
    pub fn parse(text: &str) -> Urgency {
        match text.trim_end_matches('*') {
            "unimportant" => Urgency::Unimportant,
            "low" => Urgency::Low,
            "medium" => Urgency::Medium,
            "high" => Urgency::High,
            "end-of-life" => Urgency::EndOfLife,
            _ => Urgency::Unassigned,
        }
    }

    /// Every urgency, least urgent first.
    pub const ALL: [Urgency; 6] = [
        Urgency::Unimportant,
        Urgency::Low,
        Urgency::Medium,
        Urgency::High,
        Urgency::EndOfLife,
        Urgency::Unassigned,
    ];

    /// The urgency [`as_str`](Urgency::as_str) spells `word`, exactly.
    pub fn from_word(word: &str) -> Option<Urgency> {
        Urgency::ALL.into_iter().find(|u| u.as_str() == word)
    }

    /// The word options and reports use (`--max-severity medium`).
    pub fn as_str(self) -> &'static str {
        match self {
            Urgency::Unimportant => "unimportant",
            Urgency::Low => "low",
            Urgency::Medium => "medium",
            Urgency::High => "high",
            Urgency::EndOfLife => "end-of-life",
            Urgency::Unassigned => "unassigned",
        }
    }
}

impl serde::Serialize for Urgency {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

/// One issue of a source package in the release asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Issue {
    pub id: String,
    pub status: Status,
    pub urgency: Urgency,
    /// The first version of the source package with the fix.
    pub fixed_version: Option<String>,
}

/// The issues of each source package asked for, by source package name.
pub type Issues = BTreeMap<String, Vec<Issue>>;

/// Which part of the data to keep.
pub struct Wanted<'a> {
    /// The release's code name (`bookworm`); `None`: no issue is kept.
    pub release: Option<&'a str>,
    /// Source package names; `None`: every package is read through and
    /// checked (as `imgbuild cve-db update` does before it keeps a file).
    pub sources: Option<&'a BTreeSet<String>>,
}

impl Wanted<'_> {
    /// Whether the source package `name` is read.
    pub fn has_source(&self, name: &str) -> bool {
        self.sources.is_none_or(|sources| sources.contains(name))
    }
}

/// The export could not be read; where, when the JSON says.
#[derive(Debug, thiserror::Error)]
#[error("{}", describe(.line, .column, .message))]
pub struct TrackerError {
    pub line: usize,
    pub column: usize,
    pub message: String,
}

fn describe(line: &usize, column: &usize, message: &str) -> String {
    match line {
        0 => message.to_string(),
        _ => format!("line {line}, column {column}: {message}"),
    }
}

impl From<serde_json::Error> for TrackerError {
    fn from(error: serde_json::Error) -> TrackerError {
        let message = error.to_string();
        // serde_json appends " at line L column C": the fields hold them.
        let message = match message.rfind(" at line ") {
            Some(at) if error.line() > 0 => message[..at].to_string(),
            _ => message,
        };
        TrackerError {
            line: error.line(),
            column: error.column(),
            message,
        }
    }
}

/// Reads the export from `reader`, keeping what `wanted` names; also the
/// number of source packages it lists.
pub fn parse(reader: impl Read, wanted: &Wanted) -> Result<(Issues, usize), TrackerError> {
    let mut deserializer = serde_json::Deserializer::from_reader(reader);
    let read = ExportSeed(wanted).deserialize(&mut deserializer)?;
    deserializer.end()?;
    Ok(read)
}

/// True for `CVE-YYYY-NNNN…` and the tracker's `TEMP-NNNNNNN-XXXXXX` ids:
/// nothing else may reach a report or a web page as an id.
pub fn valid_id(id: &str) -> bool {
    if let Some(rest) = id.strip_prefix("CVE-") {
        let (year, number) = rest.split_once('-').unwrap_or(("", ""));
        return year.len() == 4
            && (4..=19).contains(&number.len())
            && year.bytes().chain(number.bytes()).all(|b| b.is_ascii_digit());
    }
    if let Some(rest) = id.strip_prefix("TEMP-") {
        return (1..=40).contains(&rest.len())
            && rest.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
    }
    false
}

struct ExportSeed<'a>(&'a Wanted<'a>);

impl<'de> DeserializeSeed<'de> for ExportSeed<'_> {
    type Value = (Issues, usize);

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for ExportSeed<'_> {
    type Value = (Issues, usize);

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an object of source packages")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut issues = Issues::new();
        let mut packages = 0;
        while let Some(source) = map.next_key::<String>()? {
            packages += 1;
            if self.0.has_source(&source) {
                let found = map.next_value_seed(PackageSeed(self.0.release))?;
                if issues.insert(source.clone(), found).is_some() {
                    return Err(de::Error::custom(format!(
                        "source package {source:?} is listed twice"
                    )));
                }
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok((issues, packages))
    }
}

/// One source package's issues: those with an entry for the release.
struct PackageSeed<'a>(Option<&'a str>);

impl<'de> DeserializeSeed<'de> for PackageSeed<'_> {
    type Value = Vec<Issue>;

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<Vec<Issue>, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for PackageSeed<'_> {
    type Value = Vec<Issue>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an object of issues by id")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Vec<Issue>, A::Error> {
        let mut issues: Vec<Issue> = Vec::new();
        while let Some(id) = map.next_key::<String>()? {
            if !valid_id(&id) {
                return Err(de::Error::custom(format!("{id:?} is not a CVE or TEMP id")));
            }
            if issues.iter().any(|issue| issue.id == id) {
                return Err(de::Error::custom(format!("{id} is listed twice")));
            }
            let mut entry: IssueEntry = map.next_value()?;
            match self.0 {
                Some(name) => {
                    if let Some(release) = entry.releases.remove(name) {
                        issues.push(issue_of(id, release).map_err(de::Error::custom)?);
                    }
                }
                // Checking the whole export: every release's entry is read.
                None => {
                    for release in entry.releases.into_values() {
                        issue_of(id.clone(), release).map_err(de::Error::custom)?;
                    }
                }
            }
        }
        Ok(issues)
    }
}

/// The issue `id` as the release's entry states it.
fn issue_of(id: String, release: ReleaseEntry) -> Result<Issue, String> {
    let status = Status::parse(&release.status).ok_or_else(|| {
        format!(
            "{id}: status {:?} is not open, resolved or undetermined",
            crate::io::clean(&release.status)
        )
    })?;
    if let Some(fixed) = release
        .fixed_version
        .as_ref()
        .filter(|v| v.len() > MAX_VERSION_BYTES)
    {
        return Err(format!(
            "{id}: fixed_version of {} bytes, more than {MAX_VERSION_BYTES}",
            fixed.len()
        ));
    }
    Ok(Issue {
        id,
        status,
        urgency: Urgency::parse(&release.urgency),
        fixed_version: release.fixed_version,
    })
}

/// An issue as the export has it; the fields not named here (description,
/// scope, bug numbers, repositories) are skipped unread.
#[derive(Deserialize)]
struct IssueEntry {
    #[serde(default)]
    releases: BTreeMap<String, ReleaseEntry>,
}

#[derive(Deserialize)]
struct ReleaseEntry {
    status: String,
    fixed_version: Option<String>,
    #[serde(default)]
    urgency: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXPORT: &str = r#"{
      "bash": {
        "CVE-2022-3715": {"description": "heap overflow", "scope": "local",
          "releases": {"bookworm": {"status": "resolved", "repositories": {"bookworm": "5.2.15-2"},
                                    "fixed_version": "5.2.15-1", "urgency": "low"},
                       "bullseye": {"status": "open", "urgency": "high"}}},
        "TEMP-0000000-1B2C3D": {"releases": {"bookworm": {"status": "undetermined", "urgency": "not yet assigned"}}},
        "CVE-2019-18276": {"releases": {"sid": {"status": "open", "urgency": "low"}}}
      },
      "zlib": {"CVE-2022-37434": {"releases": {"bookworm": {"status": "open", "urgency": "high"}}}},
      "openssl": {"CVE-2024-0001": {"releases": {"bookworm": {"status": "open", "urgency": "medium**"}}}}
    }"#;

    fn wanted(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    #[test]
    fn only_the_asked_release_of_the_asked_sources_is_kept() {
        let sources = wanted(&["bash", "openssl", "absent"]);
        let (issues, packages) = parse(
            EXPORT.as_bytes(),
            &Wanted {
                release: Some("bookworm"),
                sources: Some(&sources),
            },
        )
        .unwrap();
        assert_eq!(packages, 3);
        assert_eq!(issues.keys().collect::<Vec<_>>(), ["bash", "openssl"]);
        let bash = &issues["bash"];
        assert_eq!(bash.len(), 2, "sid's issue is not bookworm's: {bash:?}");
        assert_eq!(bash[0].id, "CVE-2022-3715");
        assert_eq!(bash[0].status, Status::Resolved);
        assert_eq!(bash[0].urgency, Urgency::Low);
        assert_eq!(bash[0].fixed_version.as_deref(), Some("5.2.15-1"));
        assert_eq!(bash[1].status, Status::Undetermined);
        assert_eq!(bash[1].urgency, Urgency::Unassigned);
        assert_eq!(issues["openssl"][0].urgency, Urgency::Medium);
    }

    #[test]
    fn a_broken_export_is_an_error_with_its_line() {
        let sources = wanted(&["bash"]);
        let wanted = Wanted {
            release: Some("bookworm"),
            sources: Some(&sources),
        };
        let truncated = &EXPORT[..EXPORT.len() / 2];
        let error = parse(truncated.as_bytes(), &wanted).unwrap_err();
        assert!(error.line > 1, "{error}");
        assert!(
            error
                .to_string()
                .starts_with(&format!("line {}, column ", error.line)),
            "{error}"
        );
        let bad_status = r#"{"bash": {"CVE-2020-0001": {"releases": {"bookworm": {"status": "fixed"}}}}}"#;
        let error = parse(bad_status.as_bytes(), &wanted).unwrap_err();
        assert!(error.message.contains("status \"fixed\" is not open"), "{error}");
        let escape = r#"{"bash": {"CVE-2020-0001": {"releases": {"bookworm": {"status": "\u001b[2J"}}}}}"#;
        let error = parse(escape.as_bytes(), &wanted).unwrap_err();
        assert!(
            !error.to_string().contains('\u{1b}'),
            "a terminal escape reached the message: {error:?}"
        );
        let twice = r#"{"bash": {}, "bash": {}}"#;
        assert!(
            parse(twice.as_bytes(), &wanted)
                .unwrap_err()
                .message
                .contains("listed twice")
        );
        let huge = format!(
            r#"{{"bash": {{"CVE-2020-0001": {{"releases": {{"bookworm": {{"status": "resolved", "fixed_version": "1{}"}}}}}}}}}}"#,
            "0".repeat(MAX_VERSION_BYTES)
        );
        assert!(
            parse(huge.as_bytes(), &wanted)
                .unwrap_err()
                .message
                .contains("more than 128")
        );
        let bad_id = r#"{"bash": {"<script>": {"releases": {}}}}"#;
        let error = parse(bad_id.as_bytes(), &wanted).unwrap_err();
        assert!(error.message.contains("is not a CVE or TEMP id"), "{error}");
        let trailing = format!("{EXPORT} []");
        assert!(parse(trailing.as_bytes(), &wanted).is_err());
        // A package nobody asked for is skipped unread, even with a bad id.
        let skipped = r#"{"other": {"<script>": 1}, "bash": {}}"#;
        assert!(parse(skipped.as_bytes(), &wanted).unwrap().0["bash"].is_empty());
    }

    #[test]
    fn checking_the_whole_export_reads_every_release_and_keeps_none() {
        let everything = Wanted {
            release: None,
            sources: None,
        };
        let (issues, packages) = parse(EXPORT.as_bytes(), &everything).unwrap();
        assert_eq!(packages, 3);
        assert!(issues.values().all(Vec::is_empty), "{issues:?}");
        // A bad entry in any release of any package is found.
        let bad = r#"{"other": {"CVE-2020-0001": {"releases": {"buster": {"status": "fixed"}}}}}"#;
        let error = parse(bad.as_bytes(), &everything).unwrap_err();
        assert!(error.message.contains("status \"fixed\""), "{error}");
    }

    #[test]
    fn ids_are_cve_or_temp_ids_only() {
        for good in [
            "CVE-2024-1234",
            "CVE-2021-44228",
            "CVE-2024-1234567",
            "TEMP-0000000-1B2C3D",
        ] {
            assert!(valid_id(good), "{good}");
        }
        for bad in [
            "CVE-24-1234",
            "CVE-2024-12",
            "CVE-2024-12a4",
            "cve-2024-1234",
            "TEMP-",
            "TEMP-a b",
            "GHSA-x",
            "",
        ] {
            assert!(!valid_id(bad), "{bad}");
        }
    }

    #[test]
    fn urgencies_rank_what_cannot_be_ranked_as_the_worst() {
        assert!(Urgency::parse("unimportant") < Urgency::parse("low"));
        assert!(Urgency::parse("low**") < Urgency::parse("medium"));
        assert!(Urgency::parse("high") < Urgency::parse("not yet assigned"));
        assert_eq!(Urgency::parse("critical"), Urgency::Unassigned);
        assert_eq!(Urgency::parse("end-of-life").as_str(), "end-of-life");
        for urgency in Urgency::ALL {
            assert_eq!(Urgency::from_word(urgency.as_str()), Some(urgency));
        }
        assert!(Urgency::ALL.is_sorted());
        assert_eq!(
            Urgency::from_word("not yet assigned"),
            None,
            "options take the report's words"
        );
    }
}
