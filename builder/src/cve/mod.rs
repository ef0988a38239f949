//! Known vulnerabilities of a commit: the Debian source packages its SBOM
//! lists, matched against the Debian security tracker's data for the
//! commit's Debian release; OpenVEX statements, and the promotion gate on
//! what is left.

pub mod changes;
pub mod data;
pub mod gate;
pub mod matching;
pub mod osv;
pub mod report;
pub mod sources;
pub mod store;
pub mod tracker;
pub mod vex;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use anyhow::{Context, Result};
use emberrtos_contract::error::BadInput;

use crate::cache::Cache;
use crate::io::gpg;
use crate::io::hashing::sha256_hex;
use crate::transport::bounded::read_capped;
use data::DataFile;
use report::{Database, Report};
use sources::InstalledSource;
use tracker::{Issues, Wanted};
use vex::{LoadedVex, VexDocument};

/// The largest VEX document read.
const MAX_VEX_BYTES: u64 = 16 << 20;

/// The largest detached signature read.
const MAX_SIGNATURE_BYTES: u64 = 64 << 10;

const OS_RELEASE: &str = "usr/lib/os-release";

/// Where a report's vulnerability data is read.
#[derive(Clone, Debug)]
pub enum DataSource {
    /// A file named on the command line with `option`.
    File { path: PathBuf, option: &'static str },
    /// What `imgbuild cve-db update` kept in this cache.
    Cached(Box<Cache>),
}

impl DataSource {
    /// `file` when one was named with `option`, else the cache in
    /// `cache_dir` (or the default cache).
    pub fn choose(
        file: Option<PathBuf>,
        option: &'static str,
        cache_dir: Option<PathBuf>,
    ) -> Result<DataSource> {
        Ok(match file {
            Some(path) => DataSource::File { path, option },
            None => DataSource::Cached(Box::new(Cache::open(
                &cache_dir.unwrap_or_else(Cache::default_root),
            )?)),
        })
    }
}

/// The report of commit `rev` in `repo`: its SBOM (checked against the
/// metadata) against the data, for `release` or else the commit's own.
pub fn report_of_commit(
    repo: &ostree::Repo,
    rev: &str,
    data: &DataSource,
    release: Option<&str>,
) -> Result<Report> {
    let mut reports = reports_of_commits(repo, &[rev], data, release)?;
    Ok(reports.remove(0))
}

/// The reports of commits `revs`, as [`report_of_commit`] makes each, from
/// one read of the data per Debian release among them.
pub fn reports_of_commits(
    repo: &ostree::Repo,
    revs: &[&str],
    data: &DataSource,
    release: Option<&str>,
) -> Result<Vec<Report>> {
    let commits = revs
        .iter()
        .map(|rev| commit_sources(repo, rev, release))
        .collect::<Result<Vec<_>>>()?;
    let mut reads = BTreeMap::new();
    for commit in &commits {
        if !reads.contains_key(&commit.release) {
            let names: BTreeSet<String> = commits
                .iter()
                .filter(|other| other.release == commit.release)
                .flat_map(|other| other.installed.iter().map(|s| s.name.clone()))
                .collect();
            reads.insert(
                commit.release.clone(),
                read_issues(data, &commit.release, &names)?,
            );
        }
    }
    commits
        .into_iter()
        .map(|commit| {
            let (issues, database) = &reads[&commit.release];
            let findings = matching::findings(&commit.installed, issues)
                .with_context(|| format!("matching against {}", database.source))?;
            let count = commit.installed.len();
            let mut report = Report::new(commit.checksum, commit.release, database.clone(), count, findings);
            report.kernel = commit.kernel;
            Ok(report)
        })
        .collect()
}

/// What a report needs of a commit.
struct CommitSources {
    checksum: String,
    release: String,
    installed: Vec<InstalledSource>,
    /// How the kernel is matched.
    kernel: String,
}

/// The source packages of commit `rev`, from its SBOM, and its release.
fn commit_sources(repo: &ostree::Repo, rev: &str, release: Option<&str>) -> Result<CommitSources> {
    let info = crate::ostree::read_commit(repo, rev)?;
    let (document, _, _) = crate::sbom::document_of_commit(repo, &info)?;
    let release = match release {
        Some(name) => name.to_string(),
        None => release_of_commit(repo, &info.checksum)?,
    };
    Ok(CommitSources {
        installed: sources::installed_sources(&document)?,
        kernel: sources::kernel_match(&document),
        checksum: info.checksum,
        release,
    })
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
    let (file, _) = crate::io::open_regular(path).map_err(bad)?;
    let data =
        read_capped(file, MAX_VEX_BYTES).ok_or_else(|| bad(format!("larger than {MAX_VEX_BYTES} bytes")))?;
    let mut document = VexDocument {
        path: path.display().to_string(),
        sha256: sha256_hex(&data),
        ignored: None,
    };
    let sig_path = format!("{}.sig", path.display());
    let signature = crate::io::open_regular(Path::new(&sig_path)).and_then(|(file, _)| {
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

/// Fails when the data is older than `max_age` days; else a warning when
/// it is older than [`WARN_AGE_DAYS`] and no limit was given.
pub fn check_age(database: &Database, max_age: Option<u64>) -> Result<Option<String>> {
    let age = database.age_days;
    let said = |limit: u64| {
        format!(
            "{}: the data is dated {} ({age} days ago), more than {limit} days ago",
            database.source, database.modified
        )
    };
    match max_age {
        Some(limit) if age > limit => anyhow::bail!(
            "{}: run `imgbuild cve-db update`, or raise --max-age",
            said(limit)
        ),
        None if age > WARN_AGE_DAYS => Ok(Some(format!(
            "{}: the report may miss newer issues",
            said(WARN_AGE_DAYS)
        ))),
        _ => Ok(None),
    }
}

/// The data's age in whole days, from its date and `now`.
pub fn age_days(modified: SystemTime, now: SystemTime) -> u64 {
    now.duration_since(modified)
        .map_or(0, |age| age.as_secs() / 86_400)
}

/// The release's issues of the source packages `names`, and what was read.
fn read_issues(data: &DataSource, release: &str, names: &BTreeSet<String>) -> Result<(Issues, Database)> {
    let wanted = Wanted {
        release: Some(release),
        sources: Some(names),
    };
    let (read, source, written) = match data {
        DataSource::File { path, option } => {
            let shown = path.display().to_string();
            let file = DataFile {
                path,
                shown: &shown,
                option,
            };
            let read = data::read(file, &wanted)?;
            let written = read.modified;
            (read, shown, written)
        }
        DataSource::Cached(cache) => {
            let (read, current) = store::read_current(cache, &wanted)?;
            let written = current.date().unwrap_or(SystemTime::UNIX_EPOCH);
            (read, crate::io::clean(&current.source), written)
        }
    };
    // Valid data with nothing for these packages in this release (`{}`,
    // another distribution's data, another release's name) must not become
    // a report of no vulnerabilities.
    if read.issues.values().all(Vec::is_empty) && !names.is_empty() {
        let message = format!(
            "{source} has no issue for Debian {release} in any of the {} source packages looked up: it is not the data of {release}",
            names.len()
        );
        return Err(match data {
            DataSource::File { option, .. } => BadInput::new(option, message).into(),
            DataSource::Cached(_) => anyhow::anyhow!(message),
        });
    }
    let since_epoch = written.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    let database = Database {
        format: read.format.as_str(),
        source,
        sha256: read.sha256,
        bytes: read.bytes,
        modified: rtreport::utc::rfc3339(since_epoch.as_secs()),
        age_days: age_days(written, SystemTime::now()),
    };
    Ok((read.issues, database))
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
