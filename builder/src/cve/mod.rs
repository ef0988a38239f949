//! Known vulnerabilities of a commit: the Debian source packages its SBOM
//! lists, matched against the Debian security tracker's data for the
//! commit's Debian release; OpenVEX statements, and the promotion gate on
//! what is left.

pub mod gate;
pub mod matching;
pub mod report;
pub mod sources;
pub mod tracker;
pub mod vex;

use std::collections::BTreeSet;
use std::fs::File;
use std::io::BufReader;
use std::path::Path;

use anyhow::{Context, Result};
use emberrtos_contract::error::BadInput;

use crate::io::hashing::HashingReader;
use report::{Database, Report};
use sources::InstalledSource;

/// The largest export read: the tracker's whole JSON is some hundreds of
/// megabytes; anything past this is not it.
pub const MAX_TRACKER_BYTES: u64 = 2 << 30;

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
    Ok(Report::new(
        info.checksum,
        release,
        database,
        installed.len(),
        findings,
    ))
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

/// The release's issues of the installed sources, and what was read.
fn read_tracker(
    db: TrackerFile,
    release: &str,
    installed: &[InstalledSource],
) -> Result<(tracker::Issues, Database)> {
    let path = db.path;
    let bad = |message: String| BadInput::new(db.option, format!("{}: {message}", path.display()));
    let file = File::open(path).map_err(|e| bad(e.to_string()))?;
    let meta = file.metadata().map_err(|e| bad(e.to_string()))?;
    if !meta.is_file() {
        return Err(bad("not a regular file".into()).into());
    }
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
    let mut reader = BufReader::with_capacity(1 << 20, HashingReader::new(file));
    let issues = tracker::parse(&mut reader, &wanted)
        .map_err(|e| bad(format!("not the Debian security tracker's JSON: {e}")))?;
    let (sha256, bytes) = reader
        .into_inner()
        .finish()
        .with_context(|| format!("reading {}", path.display()))?;
    let database = Database {
        format: "debian-security-tracker-json",
        path: path.display().to_string(),
        sha256,
        bytes,
    };
    Ok((issues, database))
}
