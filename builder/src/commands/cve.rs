//! `imgbuild cve`: a commit's known vulnerabilities, from its SBOM and the
//! Debian security tracker's JSON export.

use std::collections::BTreeSet;
use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::Args;
use emberrtos_contract::error::BadInput;

use crate::cve::report::{Database, Report};
use crate::cve::sources::{self, InstalledSource};
use crate::cve::{matching, tracker};
use crate::io::hashing::HashingReader;

/// The largest export read: the tracker's whole JSON is some hundreds of
/// megabytes; anything past this is not it.
pub const MAX_TRACKER_BYTES: u64 = 2 << 30;

const OS_RELEASE: &str = "usr/lib/os-release";

#[derive(Args, Debug)]
pub struct CveArgs {
    /// The ostree repo holding the commit.
    #[arg(long)]
    repo: PathBuf,
    /// The commit (a ref or checksum).
    #[arg(value_name = "COMMIT")]
    rev: String,
    /// The Debian security tracker's JSON export
    /// (https://security-tracker.debian.org/tracker/data/json).
    #[arg(long, value_name = "FILE")]
    db: PathBuf,
    /// The Debian release to match [default: the commit's VERSION_CODENAME].
    #[arg(long, value_name = "CODENAME")]
    release: Option<String>,
}

/// The report of the commit `args` names.
pub fn run(args: CveArgs) -> Result<Report> {
    let repo = crate::ostree::open(&args.repo)?;
    let info = crate::ostree::read_commit(&repo, &args.rev)?;
    let (document, _, _) = crate::sbom::document_of_commit(&repo, &info)?;
    let installed = sources::installed_sources(&document)?;
    let release = match args.release {
        Some(name) if sources::valid_release(&name) => name,
        Some(name) => {
            return Err(BadInput::new("--release", format!("{name:?} is not a Debian code name")).into());
        }
        None => release_of_commit(&repo, &info.checksum)?,
    };
    let (issues, database) = read_tracker(&args.db, &release, &installed)?;
    let findings = matching::findings(&installed, &issues)
        .with_context(|| format!("matching against {}", args.db.display()))?;
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
    path: &Path,
    release: &str,
    installed: &[InstalledSource],
) -> Result<(tracker::Issues, Database)> {
    let bad = |message: String| BadInput::new("--db", format!("{}: {message}", path.display()));
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
