//! Known vulnerabilities of a commit: the Debian source packages its SBOM
//! lists, matched against the Debian security tracker's data for the
//! commit's Debian release; OpenVEX statements, and the promotion gate on
//! what is left.

pub mod changes;
pub mod gate;
pub mod matching;
pub mod report;
pub mod sources;
pub mod tracker;
pub mod vex;

use std::collections::BTreeSet;
use std::fs::File;
use std::io::{BufReader, Read};
use std::path::Path;
use std::time::SystemTime;

use anyhow::{Context, Result};
use emberrtos_contract::error::BadInput;

use crate::io::gpg;
use crate::io::hashing::{HashingReader, sha256_hex};
use crate::transport::bounded::read_capped;
use report::{Database, Report};
use sources::InstalledSource;
use vex::{LoadedVex, VexDocument};

/// The largest export read: the tracker's whole JSON is some hundreds of
/// megabytes; anything past this is not it.
pub const MAX_TRACKER_BYTES: u64 = 2 << 30;

/// The largest VEX document read.
const MAX_VEX_BYTES: u64 = 16 << 20;

/// The largest detached signature read.
const MAX_SIGNATURE_BYTES: u64 = 64 << 10;

/// Opens a regular file (through symlinks: the user names it): a FIFO or
/// device in its place is refused, never waited on or read without end.
fn open_regular(path: &Path) -> Result<(File, std::fs::Metadata), String> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| e.to_string())?;
    let meta = file.metadata().map_err(|e| e.to_string())?;
    if !meta.is_file() {
        return Err("not a regular file".into());
    }
    Ok((file, meta))
}

const OS_RELEASE: &str = "usr/lib/os-release";

/// A tracker export, and the option that named it (for errors).
#[derive(Clone, Copy, Debug)]
pub struct TrackerFile<'a> {
    pub path: &'a Path,
    pub option: &'a str,
}

/// The report of commit `rev` in `repo`: its SBOM (checked against the
/// metadata) against the export, for `release` or else the commit's own.
pub fn report_of_commit(
    repo: &ostree::Repo,
    rev: &str,
    db: TrackerFile,
    release: Option<&str>,
) -> Result<Report> {
    let info = crate::ostree::read_commit(repo, rev)?;
    let (document, _, _) = crate::sbom::document_of_commit(repo, &info)?;
    let installed = sources::installed_sources(&document)?;
    let release = match release {
        Some(name) => name.to_string(),
        None => release_of_commit(repo, &info.checksum)?,
    };
    let (issues, database) = read_tracker(db, &release, &installed)?;
    let findings = matching::findings(&installed, &issues)
        .with_context(|| format!("matching against {}", db.path.display()))?;
    let mut report = Report::new(info.checksum, release, database, installed.len(), findings);
    report.kernel = sources::kernel_match(&document);
    Ok(report)
}

/// The commit's Debian release, from its os-release.
fn release_of_commit(repo: &ostree::Repo, checksum: &str) -> Result<String> {
    let (root, _) = emberrtos_contract::tree::commit_root(repo, checksum)?;
    let bytes = emberrtos_contract::tree::read_regular(&root, OS_RELEASE, 64 << 10)?.with_context(|| {
        format!("commit {checksum} has no /{OS_RELEASE}: name the release with --release")
    })?;
    let text = String::from_utf8_lossy(&bytes);
    sources::release_codename(&text)
        .map(str::to_string)
        .with_context(|| {
            format!(
                "commit {checksum}: /{OS_RELEASE} has no VERSION_CODENAME: name the release with --release"
            )
        })
}

/// Reads `path` and its armored detached signature `<path>.sig`; only a
/// good signature by the key whose primary fingerprint is `signer` lets its
/// statements count. A file that cannot be read at all is a usage error
/// (`option`); one that is not authentic or not OpenVEX is kept, ignored,
/// with the reason.
pub fn load_vex(path: &Path, option: &str, signer: &str, homedir: Option<&Path>) -> Result<LoadedVex> {
    let bad = |message: String| BadInput::new(option, format!("{}: {message}", path.display()));
    let (file, _) = open_regular(path).map_err(bad)?;
    let data =
        read_capped(file, MAX_VEX_BYTES).ok_or_else(|| bad(format!("larger than {MAX_VEX_BYTES} bytes")))?;
    let mut document = VexDocument {
        path: path.display().to_string(),
        sha256: sha256_hex(&data),
        ignored: None,
    };
    let sig_path = format!("{}.sig", path.display());
    let signature = open_regular(Path::new(&sig_path)).and_then(|(file, _)| {
        read_capped(file, MAX_SIGNATURE_BYTES).ok_or_else(|| "too large for a signature".to_string())
    });
    let statements = match signature {
        Err(e) => Err(format!("no signature {sig_path}: {e}")),
        Ok(signature) => {
            let verification = gpg::verify_detached(&data, &signature, homedir)
                .with_context(|| format!("checking {sig_path}"))?;
            authentic_statements(&data, &verification, signer)
        }
    };
    let statements = statements.unwrap_or_else(|why| {
        document.ignored = Some(why);
        Vec::new()
    });
    Ok(LoadedVex { document, statements })
}

/// The statements of a document whose signature check said `verification`.
fn authentic_statements(
    data: &[u8],
    verification: &gpg::Verification,
    signer: &str,
) -> Result<Vec<vex::Statement>, String> {
    if !verification.good_by(signer) {
        let problem = verification
            .problem
            .as_deref()
            .unwrap_or("a good signature by another key");
        return Err(format!("not signed by the key {signer}: {problem}"));
    }
    let text = std::str::from_utf8(data).map_err(|_| "not UTF-8".to_string())?;
    vex::parse(text).map_err(|e| e.to_string())
}

/// Data older than this many days gets a warning unless `--max-age` says.
pub const WARN_AGE_DAYS: u64 = 7;

/// Fails when the export is older than `max_age` days; else a warning when
/// it is older than [`WARN_AGE_DAYS`] and no limit was given.
pub fn check_age(database: &Database, max_age: Option<u64>) -> Result<Option<String>> {
    let age = database.age_days;
    let said = |limit: u64| {
        format!(
            "{} was written {} ({age} days ago), more than {limit} days ago",
            database.path, database.modified
        )
    };
    match max_age {
        Some(limit) if age > limit => anyhow::bail!("{}: fetch newer data, or raise --max-age", said(limit)),
        None if age > WARN_AGE_DAYS => Ok(Some(format!(
            "{}: the report may miss newer issues",
            said(WARN_AGE_DAYS)
        ))),
        _ => Ok(None),
    }
}

/// The export's age in whole days, from its `modified` time and `now`.
pub fn age_days(modified: SystemTime, now: SystemTime) -> u64 {
    now.duration_since(modified)
        .map_or(0, |age| age.as_secs() / 86_400)
}

/// The release's issues of the installed sources, and what was read.
fn read_tracker(
    db: TrackerFile,
    release: &str,
    installed: &[InstalledSource],
) -> Result<(tracker::Issues, Database)> {
    let path = db.path;
    let bad = |message: String| BadInput::new(db.option, format!("{}: {message}", path.display()));
    let (file, meta) = open_regular(path).map_err(bad)?;
    if meta.len() > MAX_TRACKER_BYTES {
        return Err(bad(format!(
            "{} bytes, more than the {MAX_TRACKER_BYTES} a tracker export may have",
            meta.len()
        ))
        .into());
    }
    let names: BTreeSet<String> = installed.iter().map(|s| s.name.clone()).collect();
    let wanted = tracker::Wanted {
        release,
        sources: &names,
    };
    let mut reader = BufReader::with_capacity(1 << 20, HashingReader::new(file.take(MAX_TRACKER_BYTES)));
    let issues = tracker::parse(&mut reader, &wanted)
        .map_err(|e| bad(format!("not the Debian security tracker's JSON: {e}")))?;
    // Valid JSON with nothing for these packages in this release (`{}`,
    // another distribution's data, another release's name) must not become
    // a report of no vulnerabilities.
    if issues.values().all(Vec::is_empty) && !names.is_empty() {
        return Err(bad(format!(
            "has no issue for Debian {release} in any of the commit's {} source packages: not the Debian security tracker's data for {release}",
            names.len()
        ))
        .into());
    }
    let (sha256, bytes) = reader
        .into_inner()
        .finish()
        .with_context(|| format!("reading {}", path.display()))?;
    let written = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
    let modified = written
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |since| since.as_secs());
    let database = Database {
        format: "debian-security-tracker-json",
        path: path.display().to_string(),
        sha256,
        bytes,
        modified: rtreport::utc::rfc3339(modified),
        age_days: age_days(written, SystemTime::now()),
    };
    Ok((issues, database))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_signature_by_another_key_is_not_authentic() {
        let good_by_other = gpg::Verification {
            good: true,
            primary_fingerprint: Some("B".repeat(40)),
            ..Default::default()
        };
        let why = authentic_statements(b"{}", &good_by_other, &"A".repeat(40)).unwrap_err();
        assert!(why.contains("not signed by the key"), "{why}");
        let good = gpg::Verification {
            primary_fingerprint: Some("A".repeat(40)),
            ..good_by_other
        };
        let why = authentic_statements(b"{", &good, &"A".repeat(40)).unwrap_err();
        assert!(why.starts_with("not OpenVEX JSON"), "{why}");
    }

    #[test]
    fn ages_are_whole_days_and_never_negative() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(100 * 86_400);
        assert_eq!(age_days(now - Duration::from_secs(3 * 86_400 + 5), now), 3);
        assert_eq!(
            age_days(now + Duration::from_secs(86_400), now),
            0,
            "a file from the future"
        );
    }
}
