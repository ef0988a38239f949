//! `imgbuild cve`: a commit's known vulnerabilities, from its SBOM and
//! Debian's vulnerability data, less what signed VEX clears.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;
use emberrtos_contract::error::BadInput;

use crate::cve::report::Report;
use crate::cve::{DataSource, sources};
use crate::io::{gpg, user_path};
use crate::ui::Ui;

#[derive(Args, Debug)]
pub struct CveArgs {
    /// The ostree repo holding the commit.
    #[arg(long, value_parser = user_path)]
    repo: PathBuf,
    /// The commit (a ref or checksum).
    #[arg(value_name = "COMMIT")]
    rev: String,
    /// Vulnerability data: the Debian security tracker's JSON export
    /// (https://security-tracker.debian.org/tracker/data/json) or osv.dev's
    /// zip of Debian OSV records [default: what `imgbuild cve-db update`
    /// kept in the cache].
    #[arg(long, value_name = "FILE")]
    db: Option<PathBuf>,
    /// Cache directory [default: $IMGBUILD_CACHE, else ~/.cache/imgbuild].
    #[arg(long, value_name = "DIR", conflicts_with = "db", value_parser = user_path)]
    cache_dir: Option<PathBuf>,
    /// The Debian release to match [default: the commit's VERSION_CODENAME].
    #[arg(long, value_name = "CODENAME")]
    release: Option<String>,
    /// Fail when the data is dated more than DAYS days ago (without it,
    /// more than 7 days is a warning).
    #[arg(long, value_name = "DAYS")]
    max_age: Option<u64>,
    /// An OpenVEX document whose statements clear findings; it counts only
    /// with an armored detached signature FILE.sig by --gpg-key. Repeatable.
    #[arg(long, value_name = "FILE", requires = "gpg_key")]
    vex: Vec<PathBuf>,
    /// The key VEX documents must be signed by.
    #[arg(long, value_name = "KEYID")]
    gpg_key: Option<String>,
    /// The GnuPG home holding that key [default: $GNUPGHOME, else ~/.gnupg].
    #[arg(long, value_name = "DIR")]
    gpg_homedir: Option<PathBuf>,
}

/// The report of the commit `args` names.
pub fn run(args: CveArgs, ui: &Ui) -> Result<Report> {
    if let Some(name) = args
        .release
        .as_deref()
        .filter(|name| !sources::valid_release(name))
    {
        return Err(BadInput::new("--release", format!("{name:?} is not a Debian code name")).into());
    }
    let repo = crate::ostree::open(&args.repo)?;
    let data = DataSource::choose(args.db, "--db", args.cache_dir)?;
    let mut report = crate::cve::report_of_commit(&repo, &args.rev, &data, args.release.as_deref())?;
    if let Some(warning) = crate::cve::check_age(&report.database, args.max_age)? {
        ui.warn(warning);
    }
    if let Some(key) = &args.gpg_key {
        let homedir = args.gpg_homedir.as_deref();
        let signer = gpg::primary_fingerprint(key, homedir)?;
        let documents = args
            .vex
            .iter()
            .map(|path| crate::cve::load_vex(path, "--vex", &signer, homedir))
            .collect::<Result<Vec<_>>>()?;
        report.clear_with(documents);
    }
    Ok(report)
}
