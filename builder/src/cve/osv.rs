//! OSV records of the Debian ecosystem, as osv.dev publishes them: a zip
//! of one JSON record per file
//! (`https://osv-vulnerabilities.storage.googleapis.com/Debian/all.zip`).
//!
//! Only the `DEBIAN-CVE-*` records are read: each holds the security
//! tracker's state of one CVE in each release (`Debian:12`), the same
//! facts as the tracker's JSON. The DSA, DLA and DTSA advisories name CVEs
//! those records already hold; they are counted and skipped.
//!
//! A record's range is read only in the two shapes the tracker's data has:
//! `introduced 0` (no fix yet) and `introduced 0, fixed V`. Any other shape
//! is an error naming the record, never a guess.

use std::collections::BTreeSet;
use std::io::{Read, Seek};

use serde::Deserialize;

use super::tracker::{Issue, Issues, MAX_VERSION_BYTES, Status, Urgency, Wanted, valid_id};

/// The largest record read.
pub const MAX_RECORD_BYTES: u64 = 4 << 20;

/// The most files a zip may list.
pub const MAX_ENTRIES: usize = 1_000_000;

/// The most bytes all records may expand to: osv.dev's Debian zip expands
/// to about a gigabyte.
pub const MAX_EXPANDED_BYTES: u64 = 8 << 30;

/// The number of a Debian release: OSV names releases `Debian:12`.
pub fn release_number(codename: &str) -> Option<u32> {
    let number = match codename {
        "buster" => 10,
        "bullseye" => 11,
        "bookworm" => 12,
        "trixie" => 13,
        "forky" => 14,
        "duke" => 15,
        _ => return None,
    };
    Some(number)
}

/// What a read of the zip counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    /// `DEBIAN-CVE-*` records read.
    pub records: usize,
    /// Advisories (DSA, DLA, DTSA, …) skipped.
    pub advisories: usize,
    /// Records osv.dev marks withdrawn, skipped.
    pub withdrawn: usize,
}

/// The zip could not be read; `place` is the record's file, or "the zip".
#[derive(Debug, thiserror::Error)]
#[error("{place}: {message}")]
pub struct OsvError {
    pub place: String,
    pub message: String,
}

impl OsvError {
    fn new(place: &str, message: impl ToString) -> OsvError {
        OsvError {
            place: crate::io::clean(place),
            message: message.to_string(),
        }
    }
}

/// Reads every record of the zip, keeping what `wanted` names; without a
/// release, every record's ranges are checked and none is kept.
pub fn parse_zip(reader: impl Read + Seek, wanted: &Wanted) -> Result<(Issues, Tally), OsvError> {
    let ecosystem = match wanted.release {
        None => None,
        Some(codename) => Some(format!(
            "Debian:{}",
            release_number(codename).ok_or_else(|| OsvError::new(
                "the zip",
                format!("OSV names Debian releases by number, and imgbuild does not know the number of {codename:?}")
            ))?
        )),
    };
    let mut archive = zip::ZipArchive::new(reader).map_err(|e| OsvError::new("the zip", e))?;
    // Every local header must match the central directory: no duplicate
    // names (one would hide the other), no overlapping or unlisted entries.
    archive
        .validate_header_consistency()
        .map_err(|e| OsvError::new("the zip", e))?;
    if archive.len() > MAX_ENTRIES {
        let message = format!("{} files, more than the {MAX_ENTRIES} read", archive.len());
        return Err(OsvError::new("the zip", message));
    }
    let mut read = Reading {
        ecosystem,
        wanted,
        issues: Issues::new(),
        tally: Tally::default(),
        ids: BTreeSet::new(),
        expanded: 0,
    };
    for index in 0..archive.len() {
        let place = match archive.name_for_index(index) {
            Some(Ok(name)) => name.into_owned(),
            _ => format!("file {index} of the zip"),
        };
        let mut entry = archive.by_index(index).map_err(|e| OsvError::new(&place, e))?;
        if entry.is_dir() {
            continue;
        }
        let name = entry
            .name()
            .map_err(|e| OsvError::new("the zip", e))?
            .into_owned();
        let text = read.entry_text(&mut entry, &name)?;
        read.record(&text)
            .map_err(|message| OsvError::new(&name, message))?;
    }
    Ok((read.issues, read.tally))
}

/// The state of one read of a zip.
struct Reading<'a> {
    /// `Debian:12`; `None`: check every record, keep none.
    ecosystem: Option<String>,
    wanted: &'a Wanted<'a>,
    issues: Issues,
    tally: Tally,
    /// The ids of the records read, to refuse a second record of one.
    ids: BTreeSet<String>,
    expanded: u64,
}

impl Reading<'_> {
    /// The text of one file of the zip, within the caps.
    fn entry_text(&mut self, entry: &mut impl Read, name: &str) -> Result<String, OsvError> {
        if !name.ends_with(".json") {
            return Err(OsvError::new(name, "not a .json record"));
        }
        let mut text = String::new();
        entry
            .take(MAX_RECORD_BYTES + 1)
            .read_to_string(&mut text)
            .map_err(|e| OsvError::new(name, e))?;
        if text.len() as u64 > MAX_RECORD_BYTES {
            return Err(OsvError::new(
                name,
                format!("larger than {MAX_RECORD_BYTES} bytes"),
            ));
        }
        self.expanded += text.len() as u64;
        if self.expanded > MAX_EXPANDED_BYTES {
            let message = format!("the records expand to more than {MAX_EXPANDED_BYTES} bytes");
            return Err(OsvError::new("the zip", message));
        }
        Ok(text)
    }

    /// Reads one record's text.
    fn record(&mut self, text: &str) -> Result<(), String> {
        let record: Record = serde_json::from_str(text).map_err(|e| format!("not an OSV record: {e}"))?;
        let Some(id) = record.id.strip_prefix("DEBIAN-") else {
            self.tally.advisories += 1;
            return Ok(());
        };
        if !valid_id(id) {
            let id = crate::io::clean(&record.id);
            return Err(format!("{id:?} is not DEBIAN- and a CVE or TEMP id"));
        }
        if record.withdrawn.is_some() {
            self.tally.withdrawn += 1;
            return Ok(());
        }
        self.tally.records += 1;
        if !self.ids.insert(id.to_string()) {
            return Err(format!("a second record of {id}"));
        }
        let mut packages = BTreeSet::new();
        for affected in &record.affected {
            let package = &affected.package;
            if !packages.insert((&package.ecosystem, &package.name)) {
                return Err(format!("{} is stated twice", shown(package)));
            }
            self.affected(id, affected)?;
        }
        Ok(())
    }

    /// Reads one `affected` entry of record `id`.
    fn affected(&mut self, id: &str, affected: &Affected) -> Result<(), String> {
        let package = &affected.package;
        let ours = self.ecosystem.as_deref().is_some_and(|e| e == package.ecosystem);
        let checked = self.ecosystem.is_none() || ours;
        if !checked || !self.wanted.has_source(&package.name) {
            return Ok(());
        }
        let issue = issue_of(id, affected).map_err(|e| format!("{}: {e}", shown(package)))?;
        if !ours {
            return Ok(());
        }
        self.issues.entry(package.name.clone()).or_default().push(issue);
        Ok(())
    }
}

/// A package as messages name it: `bash in Debian:12`, made safe to show.
fn shown(package: &Package) -> String {
    let (name, ecosystem) = (&package.name, &package.ecosystem);
    crate::io::clean(&format!("{name} in {ecosystem}"))
}

/// The issue an entry states, from its one range.
fn issue_of(id: &str, affected: &Affected) -> Result<Issue, String> {
    let [range] = affected.ranges.as_slice() else {
        return Err(format!(
            "{} ranges; imgbuild reads records of one",
            affected.ranges.len()
        ));
    };
    if range.kind != "ECOSYSTEM" {
        let kind = crate::io::clean(&range.kind);
        return Err(format!("a range of type {kind:?}, not ECOSYSTEM"));
    }
    let fixed = match range.events.as_slice() {
        [first] if first.is("introduced", "0") => None,
        [first, second] if first.is("introduced", "0") => Some(second.fixed()?),
        _ => return Err("a range other than `introduced 0` with at most one `fixed`".into()),
    };
    if fixed.is_some_and(|version| version.len() > MAX_VERSION_BYTES) {
        return Err(format!("a fixed version of more than {MAX_VERSION_BYTES} bytes"));
    }
    let urgency = affected.ecosystem_specific.urgency.as_deref();
    Ok(Issue {
        id: id.to_string(),
        status: if fixed.is_some() {
            Status::Resolved
        } else {
            Status::Open
        },
        urgency: urgency.map_or(Urgency::Unassigned, Urgency::parse),
        fixed_version: fixed.map(str::to_string),
    })
}

/// An OSV record, the fields imgbuild reads.
#[derive(Deserialize)]
struct Record {
    id: String,
    withdrawn: Option<String>,
    #[serde(default)]
    affected: Vec<Affected>,
}

#[derive(Deserialize)]
struct Affected {
    package: Package,
    #[serde(default)]
    ranges: Vec<Range>,
    #[serde(default)]
    ecosystem_specific: EcosystemSpecific,
}

#[derive(Deserialize)]
struct Package {
    name: String,
    ecosystem: String,
}

#[derive(Deserialize)]
struct Range {
    #[serde(rename = "type")]
    kind: String,
    events: Vec<Event>,
}

/// One event: exactly one of its fields is set in a valid record.
#[derive(Deserialize)]
struct Event {
    introduced: Option<String>,
    fixed: Option<String>,
    last_affected: Option<String>,
    limit: Option<String>,
}

impl Event {
    fn fields(&self) -> usize {
        [&self.introduced, &self.fixed, &self.last_affected, &self.limit]
            .into_iter()
            .filter(|field| field.is_some())
            .count()
    }

    /// Whether this event is `kind` (`introduced`) with `value` alone.
    fn is(&self, kind: &str, value: &str) -> bool {
        self.fields() == 1 && kind == "introduced" && self.introduced.as_deref() == Some(value)
    }

    /// The version of a `fixed` event alone.
    fn fixed(&self) -> Result<&str, String> {
        match (&self.fixed, self.fields()) {
            (Some(version), 1) => Ok(version),
            _ => Err("a second event that is not `fixed`".into()),
        }
    }
}

#[derive(Deserialize, Default)]
struct EcosystemSpecific {
    urgency: Option<String>,
}

#[cfg(test)]
pub mod tests {
    use super::*;
    use std::io::{Cursor, Write};

    /// A zip of `files` (name, text), deflated as osv.dev's are.
    pub fn zip_of(files: &[(&str, &str)]) -> Vec<u8> {
        let mut writer = zip::ZipWriter::new(Cursor::new(Vec::new()));
        let options =
            zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Deflated);
        for (name, text) in files {
            writer.start_file(*name, options).unwrap();
            writer.write_all(text.as_bytes()).unwrap();
        }
        writer.finish().unwrap().into_inner()
    }

    fn record(id: &str, package: &str, ecosystem: &str, events: &str, urgency: &str) -> String {
        format!(
            r#"{{"id": "{id}", "modified": "2026-12-01T00:00:00Z", "upstream": ["{}"],
               "affected": [{{"package": {{"name": "{package}", "ecosystem": "{ecosystem}"}},
                 "ranges": [{{"type": "ECOSYSTEM", "events": {events}}}],
                 "ecosystem_specific": {{"urgency": "{urgency}"}}}}]}}"#,
            id.trim_start_matches("DEBIAN-")
        )
    }

    fn read(zip: &[u8], release: Option<&str>, names: &[&str]) -> Result<(Issues, Tally), OsvError> {
        let sources: BTreeSet<String> = names.iter().map(|n| n.to_string()).collect();
        let wanted = Wanted {
            release,
            sources: Some(&sources),
        };
        parse_zip(Cursor::new(zip), &wanted)
    }

    #[test]
    fn the_release_records_of_the_asked_sources_are_kept() {
        let fixed = r#"[{"introduced": "0"}, {"fixed": "5.2.15-3"}]"#;
        let open = r#"[{"introduced": "0"}]"#;
        let zip = zip_of(&[
            (
                "DEBIAN-CVE-2022-3715.json",
                &record("DEBIAN-CVE-2022-3715", "bash", "Debian:12", fixed, "high"),
            ),
            (
                "DEBIAN-CVE-2019-18276.json",
                &record("DEBIAN-CVE-2019-18276", "bash", "Debian:12", open, "low*"),
            ),
            (
                "DEBIAN-CVE-2020-0001.json",
                &record("DEBIAN-CVE-2020-0001", "bash", "Debian:13", open, "high"),
            ),
            (
                "DEBIAN-CVE-2020-0002.json",
                &record("DEBIAN-CVE-2020-0002", "zlib", "Debian:12", open, "high"),
            ),
            (
                "DSA-5000-1.json",
                &record("DSA-5000-1", "bash", "Debian:12", "[]", "high"),
            ),
            (
                "DEBIAN-CVE-2020-0003.json",
                r#"{"id": "DEBIAN-CVE-2020-0003", "withdrawn": "2026-01-01T00:00:00Z", "affected": []}"#,
            ),
        ]);
        let (issues, tally) = read(&zip, Some("bookworm"), &["bash"]).unwrap();
        assert_eq!(
            tally,
            Tally {
                records: 4,
                advisories: 1,
                withdrawn: 1
            }
        );
        assert_eq!(issues.keys().collect::<Vec<_>>(), ["bash"], "{issues:?}");
        let bash = &issues["bash"];
        assert_eq!(bash.len(), 2, "trixie's issue is not bookworm's: {bash:?}");
        assert_eq!(bash[0].id, "CVE-2022-3715");
        assert_eq!(
            (bash[0].status, bash[0].urgency),
            (Status::Resolved, Urgency::High)
        );
        assert_eq!(bash[0].fixed_version.as_deref(), Some("5.2.15-3"));
        assert_eq!((bash[1].status, bash[1].urgency), (Status::Open, Urgency::Low));
    }

    #[test]
    fn a_range_not_of_the_trackers_shapes_is_an_error_naming_the_record() {
        for events in [
            r#"[{"introduced": "1.0-1"}, {"fixed": "1.0-2"}]"#,
            r#"[{"introduced": "0"}, {"last_affected": "1.0-2"}]"#,
            r#"[{"introduced": "0", "fixed": "1.0-2"}]"#,
            r#"[{"introduced": "0"}, {"fixed": "1.0-2"}, {"introduced": "1.1"}]"#,
            "[]",
        ] {
            let zip = zip_of(&[(
                "r.json",
                &record("DEBIAN-CVE-2020-0001", "bash", "Debian:12", events, "low"),
            )]);
            let error = read(&zip, Some("bookworm"), &["bash"]).unwrap_err();
            assert_eq!(error.place, "r.json", "{events}: {error}");
            assert!(error.message.starts_with("bash in Debian:12: "), "{error}");
        }
        // Checking the whole zip reads every package's ranges.
        let bad = record("DEBIAN-CVE-2020-0001", "other", "Debian:11", "[]", "low");
        let wanted = Wanted {
            release: None,
            sources: None,
        };
        let error = parse_zip(Cursor::new(zip_of(&[("r.json", &bad)])), &wanted).unwrap_err();
        assert!(error.message.starts_with("other in Debian:11"), "{error}");
    }

    /// A record's start with one more entry for bash in Debian:12.
    const TWICE: &str = r#""affected": [{"package": {"name": "bash", "ecosystem": "Debian:12"},
        "ranges": [{"type": "ECOSYSTEM", "events": [{"introduced": "0"}]}]}, "#;

    #[test]
    fn hostile_zips_are_errors_with_their_place() {
        let open = r#"[{"introduced": "0"}]"#;
        let good = record("DEBIAN-CVE-2020-0001", "bash", "Debian:12", open, "low");
        let cases: Vec<(Vec<u8>, &str, &str)> = vec![
            (b"PK\x03\x04 not a zip".to_vec(), "the zip", ""),
            (zip_of(&[("README", "hello")]), "README", "not a .json record"),
            (
                zip_of(&[("a.json", "{\"id\": 1}")]),
                "a.json",
                "not an OSV record",
            ),
            (
                zip_of(&[("a.json", &good[..good.len() / 2])]),
                "a.json",
                "not an OSV record",
            ),
            (
                zip_of(&[("a.json", &good.replace("DEBIAN-CVE-2020-0001", "DEBIAN-<b>"))]),
                "a.json",
                "is not DEBIAN- and a CVE or TEMP id",
            ),
            (
                zip_of(&[("a.json", &good), ("b.json", &good)]),
                "b.json",
                "a second record of CVE-2020-0001",
            ),
            (
                zip_of(&[("a.json", &good.replace(r#""affected": ["#, TWICE))]),
                "a.json",
                "bash in Debian:12 is stated twice",
            ),
            (
                zip_of(&[("big.json", &" ".repeat(MAX_RECORD_BYTES as usize + 1))]),
                "big.json",
                "larger than",
            ),
            (
                zip_of(&[("\u{1b}[2J.json", "[")]),
                "[2J.json",
                "not an OSV record",
            ),
        ];
        for (zip, place, message) in cases {
            let error = read(&zip, Some("bookworm"), &["bash"]).unwrap_err();
            assert_eq!(error.place, place, "{error}");
            assert!(error.message.contains(message), "{error}");
        }
        let error = read(&zip_of(&[("a.json", &good)]), Some("hamm"), &["bash"]).unwrap_err();
        assert!(
            error.message.contains("does not know the number of \"hamm\""),
            "{error}"
        );
    }

    #[test]
    fn release_numbers_are_debians() {
        assert_eq!(release_number("bookworm"), Some(12));
        assert_eq!(release_number("trixie"), Some(13));
        assert_eq!(release_number("sid"), None);
    }
}
