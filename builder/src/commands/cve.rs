//! `imgbuild cve`: a commit's known vulnerabilities, from its SBOM and the
//! Debian security tracker's JSON export.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;
use emberrtos_contract::error::BadInput;

use crate::cve::report::Report;
use crate::cve::{TrackerFile, sources};

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
    if let Some(name) = args
        .release
        .as_deref()
        .filter(|name| !sources::valid_release(name))
    {
        return Err(BadInput::new("--release", format!("{name:?} is not a Debian code name")).into());
    }
    let repo = crate::ostree::open(&args.repo)?;
    let db = TrackerFile {
        path: &args.db,
        option: "--db",
    };
    crate::cve::report_of_commit(&repo, &args.rev, db, args.release.as_deref())
}
