//! What the release site shows, read out of the repo and verified: every
//! ref's history, each commit's facts, checks, signatures, update sizes and
//! changes, and the qualification and promotion records stored beside it,
//! each with whether it is authentic.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use anyhow::Result;

use crate::cache::remote::Trust;
use crate::commands::diff::CommitDiff;
use crate::cve::DataSource;
use crate::io::gpg::PinnedKeyring;
use crate::io::records::{self, RecordKind, StoredRecord};
use crate::ostree::{self as ost, CommitInfo};
use crate::qualify::record::{READABLE, Record};
use crate::ui::Ui;

/// The most commits of one ref's history shown.
pub const MAX_HISTORY: usize = 500;

/// The files changed named per group on a commit's page.
const FILES_PER_GROUP: usize = 10;

/// Everything the site shows.
pub struct Site {
    pub refs: Vec<RefHistory>,
    /// Every commit of every history, by checksum.
    pub commits: BTreeMap<String, CommitView>,
    /// The primary fingerprints signatures were checked against.
    pub trusted: Vec<String>,
    /// The vulnerability data the changes were judged by, when any.
    pub cve_source: Option<String>,
}

/// A ref and its commits in the repo, newest first.
pub struct RefHistory {
    pub name: String,
    pub commits: Vec<String>,
}

/// Whether a signed file is what the trusted key signed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Authenticity {
    Authentic,
    Unsigned,
    /// Signed, but not good by the trusted key, or about something else.
    NotAuthentic(String),
}

impl Authenticity {
    /// The word pages show, which is also its style's class.
    pub fn word(&self) -> &'static str {
        match self {
            Authenticity::Authentic => "authentic",
            Authenticity::Unsigned => "unsigned",
            Authenticity::NotAuthentic(_) => "not-authentic",
        }
    }
}

/// One commit, as its page shows it.
pub struct CommitView {
    pub info: CommitInfo,
    pub evidence: Result<rtcheck::Evidence, String>,
    pub signature: Authenticity,
    /// Every object of the commit: what a first pull fetches.
    pub full_bytes: Result<u64, String>,
    /// The diff from its parent, when the parent is in the repo.
    pub changes: Option<Result<CommitDiff, String>>,
    pub records: Vec<RecordView>,
    pub promotions: Vec<PromotionView>,
}

/// A qualification record of a commit.
pub struct RecordView {
    /// Its file name in the repo.
    pub name: String,
    pub authenticity: Authenticity,
    pub record: Result<Record, String>,
}

/// A promotion record of a commit.
pub struct PromotionView {
    pub name: String,
    pub authenticity: Authenticity,
    pub to: String,
    pub promoted: String,
    /// The qualification records that allowed it.
    pub records: Vec<String>,
}

/// Reads the repo at `path`: its refs, their histories and every commit's
/// facts and records, checking each signature against `trust`'s key.
pub fn gather(path: &Path, trust: &Trust, cve: Option<&DataSource>, ui: &Ui) -> Result<Site> {
    let Trust::Pinned { keyring, .. } = trust else {
        anyhow::bail!("the site verifies every signature: it needs a pinned key");
    };
    let repo = ost::open(path)?;
    let keyring_dir = keyring.ostree_keyring_dir()?;
    let refs = histories(&repo)?;
    let wanted: BTreeSet<&String> = refs.iter().flat_map(|r| r.commits.iter()).collect();
    let mut commits = BTreeMap::new();
    for (n, checksum) in wanted.iter().enumerate() {
        ui.note(format!(
            "reading commit {} of {}: {checksum}",
            n + 1,
            wanted.len()
        ));
        let reader = CommitReader {
            repo: &repo,
            path,
            keyring,
            keyring_dir: keyring_dir.path(),
            cve,
        };
        commits.insert(checksum.to_string(), reader.read(checksum)?);
    }
    Ok(Site {
        refs,
        commits,
        trusted: keyring.fingerprints.clone(),
        cve_source: cve.map(|data| match data {
            DataSource::File { path, .. } => path.display().to_string(),
            DataSource::Cached(_) => "the data `imgbuild cve-db update` kept".to_string(),
        }),
    })
}

/// Every ref, by name, with its history: the tip, then each parent the
/// repo holds, at most [`MAX_HISTORY`].
fn histories(repo: &ostree::Repo) -> Result<Vec<RefHistory>> {
    let refs = repo.list_refs(None, gio::Cancellable::NONE)?;
    let mut names: Vec<String> = refs.keys().map(|name| name.to_string()).collect();
    names.sort();
    let mut out = Vec::new();
    for name in names {
        let mut commits = Vec::new();
        let mut next = Some(refs[name.as_str()].to_string());
        while let Some(checksum) = next.take().filter(|_| commits.len() < MAX_HISTORY) {
            let Ok(info) = ost::read_commit(repo, &checksum) else {
                break;
            };
            next = info.parent;
            commits.push(checksum);
        }
        out.push(RefHistory { name, commits });
    }
    Ok(out)
}

struct CommitReader<'a> {
    repo: &'a ostree::Repo,
    path: &'a Path,
    keyring: &'a PinnedKeyring,
    keyring_dir: &'a Path,
    cve: Option<&'a DataSource>,
}

impl CommitReader<'_> {
    fn read(&self, checksum: &str) -> Result<CommitView> {
        let info = ost::read_commit(self.repo, checksum)?;
        let changes = info
            .parent
            .as_deref()
            .filter(|parent| ost::read_commit(self.repo, parent).is_ok())
            .map(|parent| {
                crate::commands::diff::diff(self.path, parent, checksum, FILES_PER_GROUP, self.cve)
                    .map_err(|e| format!("{e:#}"))
            });
        Ok(CommitView {
            evidence: crate::stages::commit::full_evidence(&info).map_err(|e| format!("{e:#}")),
            signature: self.commit_signature(&info)?,
            full_bytes: crate::commands::publish::objects_bytes(self.repo, self.path, None, checksum)
                .map_err(|e| format!("{e:#}")),
            changes,
            records: self.qualifications(checksum)?,
            promotions: self.promotions(checksum)?,
            info,
        })
    }

    /// Authentic when one signature is good by the trusted key.
    fn commit_signature(&self, info: &CommitInfo) -> Result<Authenticity> {
        let signatures = ost::commit_signatures(self.repo, info, self.keyring_dir)?;
        let trusted = |signer: &str| {
            self.keyring
                .fingerprints
                .iter()
                .any(|f| ost::same_key(f, signer) && signer.len() >= 16)
        };
        Ok(if signatures.is_empty() {
            Authenticity::Unsigned
        } else if signatures.iter().any(|s| s.valid && trusted(&s.signer)) {
            Authenticity::Authentic
        } else {
            let signers: Vec<&str> = signatures.iter().map(|s| s.signer.as_str()).collect();
            Authenticity::NotAuthentic(format!(
                "no good signature by the trusted key (signed by {})",
                signers.join(", ")
            ))
        })
    }

    fn verify(&self, stored: &StoredRecord) -> Result<Authenticity> {
        let Some(signature) = &stored.signature else {
            return Ok(Authenticity::Unsigned);
        };
        let verification = self.keyring.verify(&stored.json, signature)?;
        Ok(match self.keyring.good(&verification) {
            true => Authenticity::Authentic,
            false => Authenticity::NotAuthentic(crate::io::clean(
                verification
                    .problem
                    .as_deref()
                    .unwrap_or("a good signature by another key"),
            )),
        })
    }

    fn qualifications(&self, checksum: &str) -> Result<Vec<RecordView>> {
        let mut views = Vec::new();
        for stored in records::list(self.path, RecordKind::Qualification, checksum)? {
            let mut authenticity = self.verify(&stored)?;
            let record = parse_record(&stored.json, checksum);
            if let (Authenticity::Authentic, Err(why)) = (&authenticity, &record) {
                authenticity = Authenticity::NotAuthentic(why.clone());
            }
            views.push(RecordView {
                name: crate::io::clean(&stored.name),
                authenticity,
                record,
            });
        }
        Ok(views)
    }

    fn promotions(&self, checksum: &str) -> Result<Vec<PromotionView>> {
        let mut views = Vec::new();
        for stored in records::list(self.path, RecordKind::Promotion, checksum)? {
            let mut authenticity = self.verify(&stored)?;
            let doc: serde_json::Value = serde_json::from_slice(&stored.json).unwrap_or_default();
            let text = |key: &str| crate::io::clean(doc[key].as_str().unwrap_or("?"));
            if let (Authenticity::Authentic, Err(why)) = (&authenticity, promotion_problem(&doc, checksum)) {
                authenticity = Authenticity::NotAuthentic(why);
            }
            let records = doc["records"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|row| row["record"].as_str())
                .map(crate::io::clean)
                .collect();
            views.push(PromotionView {
                name: crate::io::clean(&stored.name),
                authenticity,
                to: text("to"),
                promoted: text("promoted"),
                records,
            });
        }
        Ok(views)
    }
}

/// Whether a promotion record is one, of `commit`.
fn promotion_problem(doc: &serde_json::Value, commit: &str) -> Result<(), String> {
    if doc["schema"].as_str() != Some(crate::qualify::promote::SCHEMA) {
        return Err(format!("not a {} record", crate::qualify::promote::SCHEMA));
    }
    if doc["commit"].as_str() != Some(commit) {
        return Err("about another commit".into());
    }
    if doc["to"].as_str().is_none() || doc["promoted"].as_str().is_none() {
        return Err("it names no ref or time".into());
    }
    Ok(())
}

/// A record of a schema this imgbuild reads, about `commit`.
fn parse_record(json: &[u8], commit: &str) -> Result<Record, String> {
    let record: Record = serde_json::from_slice(json).map_err(|e| format!("unreadable: {e}"))?;
    if !READABLE.contains(&record.schema.as_str()) {
        return Err(format!(
            "schema {:?} is not one this imgbuild reads",
            crate::io::clean(&record.schema)
        ));
    }
    if record.commit != commit {
        return Err("about another commit".into());
    }
    Ok(record)
}
