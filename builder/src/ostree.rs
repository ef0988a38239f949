//! libostree through the `ostree` crate: archive repos, commits with
//! metadata, refs, GPG signatures, detached metadata and the summary.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result, bail};
use glib::prelude::*;
use ostree::gio;
use serde::{Deserialize, Serialize};

/// A value in commit metadata (`a{sv}`).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub enum MetaValue {
    Str(String),
    Bool(bool),
    StrList(Vec<String>),
    U64(u64),
}

impl MetaValue {
    fn to_variant(&self) -> glib::Variant {
        match self {
            MetaValue::Str(s) => s.to_variant(),
            MetaValue::Bool(b) => b.to_variant(),
            MetaValue::StrList(v) => v.to_variant(),
            MetaValue::U64(n) => n.to_variant(),
        }
    }
}

pub type Metadata = BTreeMap<String, MetaValue>;

fn to_vardict(metadata: &Metadata) -> glib::Variant {
    let dict = glib::VariantDict::new(None);
    for (key, value) in metadata {
        dict.insert_value(key, &value.to_variant());
    }
    dict.end()
}

/// Opens the repo at `path`, creating an `archive` repo when none exists.
pub fn open_or_create(path: &Path) -> Result<ostree::Repo> {
    let repo = ostree::Repo::new_for_path(path);
    if path.join("config").is_file() {
        repo.open(gio::Cancellable::NONE)
            .with_context(|| format!("opening ostree repo {}", path.display()))?;
    } else {
        std::fs::create_dir_all(path).with_context(|| format!("creating {}", path.display()))?;
        repo.create(ostree::RepoMode::Archive, gio::Cancellable::NONE)
            .with_context(|| format!("creating archive ostree repo {}", path.display()))?;
    }
    Ok(repo)
}

/// Opens an existing repo.
pub fn open(path: &Path) -> Result<ostree::Repo> {
    if !path.join("config").is_file() {
        bail!("{} is not an ostree repo (no config file)", path.display());
    }
    let repo = ostree::Repo::new_for_path(path);
    repo.open(gio::Cancellable::NONE)
        .with_context(|| format!("opening ostree repo {}", path.display()))?;
    Ok(repo)
}

/// Objects a transaction wrote, from libostree's own accounting.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct WriteStats {
    pub content_objects_total: usize,
    pub content_objects_written: usize,
    pub metadata_objects_total: usize,
    pub metadata_objects_written: usize,
    pub content_bytes_written: u64,
}

pub struct CommitRequest<'a> {
    pub tree: &'a Path,
    pub subject: &'a str,
    pub metadata: &'a Metadata,
    /// Commit timestamp (`SOURCE_DATE_EPOCH`).
    pub timestamp: u64,
    /// The commit this one follows (the ref's current target), if any.
    pub parent: Option<&'a str>,
    /// Record every file as owned by root (for trees built unprivileged).
    pub force_root_owner: bool,
    /// Cancels the write; the transaction is then aborted.
    pub cancellable: Option<gio::Cancellable>,
    /// Called with the running count of files and directories written.
    pub on_entry: Option<Box<dyn Fn(usize)>>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct CommitResult {
    pub checksum: String,
    /// True when the parent already held exactly this tree and metadata, so
    /// it is returned instead of a new commit.
    pub reused_parent: bool,
    pub entries: usize,
    pub stats: WriteStats,
}

/// Writes `tree` as a commit inside a transaction that is aborted on any
/// error (including cancellation). Refs are not touched.
pub fn commit_tree(repo: &ostree::Repo, request: CommitRequest) -> Result<CommitResult> {
    let cancellable = request.cancellable.clone().unwrap_or_default();
    let transaction = repo
        .auto_transaction(Some(&cancellable))
        .context("starting an ostree transaction")?;
    let entries = std::rc::Rc::new(std::cell::Cell::new(0usize));
    let seen = entries.clone();
    let force_root = request.force_root_owner;
    let on_entry = request.on_entry;
    let modifier = ostree::RepoCommitModifier::new(
        // xattrs are skipped so the checksum depends only on the tree itself.
        ostree::RepoCommitModifierFlags::SKIP_XATTRS,
        Some(Box::new(
            move |_repo: &ostree::Repo, _path: &str, info: &gio::FileInfo| {
                seen.set(seen.get() + 1);
                if let Some(callback) = &on_entry {
                    callback(seen.get());
                }
                if force_root {
                    info.set_attribute_uint32("unix::uid", 0);
                    info.set_attribute_uint32("unix::gid", 0);
                }
                ostree::RepoCommitFilterResult::Allow
            },
        )),
    );
    let mtree = ostree::MutableTree::new();
    repo.write_directory_to_mtree(
        &gio::File::for_path(request.tree),
        &mtree,
        Some(&modifier),
        Some(&cancellable),
    )
    .with_context(|| format!("writing {} into the repo", request.tree.display()))?;
    let root = repo
        .write_mtree(&mtree, Some(&cancellable))
        .context("writing the tree objects")?
        .downcast::<ostree::RepoFile>()
        .map_err(|_| anyhow::anyhow!("write_mtree did not return a RepoFile"))?;
    let metadata = to_vardict(request.metadata);

    let reuse = match request.parent {
        Some(parent) => same_commit_content(repo, parent, &root, &metadata)?,
        None => false,
    };
    let checksum = if reuse {
        request.parent.unwrap_or_default().to_string()
    } else {
        repo.write_commit_with_time(
            request.parent,
            Some(request.subject),
            None,
            Some(&metadata),
            &root,
            request.timestamp,
            Some(&cancellable),
        )
        .context("writing the commit object")?
        .to_string()
    };
    let stats = stats_of(
        transaction
            .commit(Some(&cancellable))
            .context("committing the transaction")?,
    );
    Ok(CommitResult {
        checksum,
        reused_parent: reuse,
        entries: entries.get(),
        stats,
    })
}

fn stats_of(stats: ostree::RepoTransactionStats) -> WriteStats {
    WriteStats {
        content_objects_total: stats.get_content_objects_total(),
        content_objects_written: stats.get_content_objects_written(),
        metadata_objects_total: stats.get_metadata_objects_total(),
        metadata_objects_written: stats.get_metadata_objects_written(),
        content_bytes_written: stats.get_content_bytes_written(),
    }
}

fn same_commit_content(
    repo: &ostree::Repo,
    parent: &str,
    root: &ostree::RepoFile,
    metadata: &glib::Variant,
) -> Result<bool> {
    let commit = repo
        .load_variant(ostree::ObjectType::Commit, parent)
        .with_context(|| format!("loading parent commit {parent}"))?;
    let tree_contents = ostree::checksum_from_bytes_v(&commit.child_value(6));
    let tree_meta = ostree::checksum_from_bytes_v(&commit.child_value(7));
    Ok(Some(tree_contents) == root.tree_get_contents_checksum()
        && Some(tree_meta) == root.tree_get_metadata_checksum()
        && commit.child_value(0) == *metadata)
}

/// Resolves a ref or checksum; `None` when the ref does not exist.
pub fn resolve(repo: &ostree::Repo, rev: &str) -> Result<Option<String>> {
    Ok(repo
        .resolve_rev(rev, true)
        .with_context(|| format!("resolving {rev}"))?
        .map(|s| s.to_string()))
}

/// Points `ref_name` at `checksum` atomically.
pub fn set_ref(repo: &ostree::Repo, ref_name: &str, checksum: &str) -> Result<()> {
    repo.set_ref_immediate(None, ref_name, Some(checksum), gio::Cancellable::NONE)
        .with_context(|| format!("setting ref {ref_name} to {checksum}"))
}

/// Issuer fingerprints (subpacket 33) and key IDs (subpacket 16) of an
/// OpenPGP v4 signature packet, as uppercase hex.
pub fn signature_issuers(packet: &[u8]) -> Vec<String> {
    let mut issuers = Vec::new();
    let Some(&tag) = packet.first() else {
        return issuers;
    };
    // Packet header: new format (0xC2 + length) or old format (0x88..0x8B).
    let body_start = if tag & 0x40 != 0 {
        match packet.get(1) {
            Some(&l) if l < 192 => 2,
            Some(&l) if l < 224 => 3,
            Some(255) => 6,
            _ => return issuers,
        }
    } else {
        match tag & 0x03 {
            0 => 2,
            1 => 3,
            2 => 5,
            _ => 1,
        }
    };
    let Some(body) = packet.get(body_start..) else {
        return issuers;
    };
    if body.first() != Some(&4) || body.len() < 6 {
        return issuers;
    }
    let mut at = 4;
    for _ in 0..2 {
        let Some(len) = body
            .get(at..at + 2)
            .map(|b| u16::from_be_bytes([b[0], b[1]]) as usize)
        else {
            break;
        };
        let Some(area) = body.get(at + 2..at + 2 + len) else {
            break;
        };
        let mut i = 0;
        while i < area.len() {
            let (size, header) = match area[i] {
                l @ 0..192 => (l as usize, 1),
                l @ 192..=254 => match area.get(i + 1) {
                    Some(&next) => ((((l as usize) - 192) << 8) + next as usize + 192, 2),
                    None => break,
                },
                _ => match area.get(i + 1..i + 5) {
                    Some(b) => (u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize, 5),
                    None => break,
                },
            };
            let Some(sub) = area.get(i + header..i + header + size) else {
                break;
            };
            match sub.split_first() {
                Some((33, rest)) if rest.len() > 1 => issuers.push(hex::encode_upper(&rest[1..])),
                Some((16, rest)) => issuers.push(hex::encode_upper(rest)),
                _ => {}
            }
            i += header + size;
        }
        at += 2 + len;
    }
    issuers
}

/// Whether the commit's detached metadata holds a signature by `key_id`
/// (a fingerprint or key ID, matched on its trailing hex digits).
pub fn signed_by(repo: &ostree::Repo, checksum: &str, key_id: &str) -> Result<bool> {
    let wanted: String = key_id
        .trim_start_matches("0x")
        .chars()
        .filter(|c| !c.is_whitespace())
        .collect::<String>()
        .to_uppercase();
    let Some(detached) = repo.read_commit_detached_metadata(checksum, gio::Cancellable::NONE)? else {
        return Ok(false);
    };
    let Some(signatures) = glib::VariantDict::new(Some(&detached)).lookup_value("ostree.gpgsigs", None)
    else {
        return Ok(false);
    };
    Ok(signatures.iter().any(|signature| {
        let bytes: Vec<u8> = signature.iter().filter_map(|b| b.get::<u8>()).collect();
        signature_issuers(&bytes)
            .iter()
            .any(|issuer| issuer.ends_with(&wanted) || wanted.ends_with(issuer.as_str()))
    }))
}

/// GPG-signs a commit unless `key_id` already signed it; true when it signed.
pub fn sign_commit(
    repo: &ostree::Repo,
    checksum: &str,
    key_id: &str,
    homedir: Option<&Path>,
) -> Result<bool> {
    if signed_by(repo, checksum, key_id)? {
        return Ok(false);
    }
    let homedir = homedir.map(|h| h.to_string_lossy().into_owned());
    repo.sign_commit(checksum, key_id, homedir.as_deref(), gio::Cancellable::NONE)
        .with_context(|| format!("signing commit {checksum} with GPG key {key_id}"))?;
    Ok(true)
}

/// Regenerates the summary, signing it when a key is given.
pub fn update_summary(repo: &ostree::Repo, key_id: Option<&str>, homedir: Option<&Path>) -> Result<()> {
    repo.regenerate_summary(None, gio::Cancellable::NONE)
        .context("regenerating the summary")?;
    if let Some(key) = key_id {
        let homedir = homedir.map(|h| h.to_string_lossy().into_owned());
        repo.add_gpg_signature_summary(&[key], homedir.as_deref(), gio::Cancellable::NONE)
            .with_context(|| format!("signing the summary with GPG key {key}"))?;
    }
    Ok(())
}

/// Adds keys to a commit's detached metadata, keeping what is there
/// (signatures included).
pub fn add_detached_metadata(repo: &ostree::Repo, checksum: &str, entries: &Metadata) -> Result<()> {
    let existing = repo
        .read_commit_detached_metadata(checksum, gio::Cancellable::NONE)
        .with_context(|| format!("reading detached metadata of {checksum}"))?;
    let dict = glib::VariantDict::new(existing.as_ref());
    for (key, value) in entries {
        dict.insert_value(key, &value.to_variant());
    }
    repo.write_commit_detached_metadata(checksum, Some(&dict.end()), gio::Cancellable::NONE)
        .with_context(|| format!("writing detached metadata of {checksum}"))
}

/// A commit as `inspect` shows it.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct CommitInfo {
    pub checksum: String,
    pub parent: Option<String>,
    pub subject: String,
    pub timestamp: u64,
    pub metadata: BTreeMap<String, serde_json::Value>,
    pub detached_metadata: BTreeMap<String, serde_json::Value>,
}

fn dict_to_json(dict: &glib::Variant) -> BTreeMap<String, serde_json::Value> {
    let mut out = BTreeMap::new();
    for entry in dict.iter() {
        let key = entry.child_value(0).str().unwrap_or_default().to_string();
        let value = entry.child_value(1);
        let value = value.as_variant().unwrap_or(value);
        out.insert(key, variant_to_json(&value));
    }
    out
}

/// Converts the variant types found in commit metadata to JSON.
pub fn variant_to_json(v: &glib::Variant) -> serde_json::Value {
    use serde_json::Value;
    match v.type_().as_str() {
        "s" | "o" | "g" => Value::String(v.str().unwrap_or_default().to_string()),
        "b" => Value::Bool(v.get::<bool>().unwrap_or_default()),
        "t" => v.get::<u64>().map_or(Value::Null, Into::into),
        "x" => v.get::<i64>().map_or(Value::Null, Into::into),
        "u" => v.get::<u32>().map_or(Value::Null, Into::into),
        "i" => v.get::<i32>().map_or(Value::Null, Into::into),
        "y" => v.get::<u8>().map_or(Value::Null, Into::into),
        "v" => v
            .as_variant()
            .map_or(Value::Null, |inner| variant_to_json(&inner)),
        "ay" => Value::String(format!("<{} bytes>", v.n_children())),
        "a{sv}" => Value::Object(dict_to_json(v).into_iter().collect()),
        t if t.starts_with('a') => Value::Array(v.iter().map(|c| variant_to_json(&c)).collect()),
        _ => Value::String(v.print(true).to_string()),
    }
}

/// Loads a commit by ref or checksum.
pub fn read_commit(repo: &ostree::Repo, rev: &str) -> Result<CommitInfo> {
    let checksum = resolve(repo, rev)?.with_context(|| format!("no ref or commit named {rev}"))?;
    let commit = repo
        .load_variant(ostree::ObjectType::Commit, &checksum)
        .with_context(|| format!("loading commit {checksum}"))?;
    let detached = repo
        .read_commit_detached_metadata(&checksum, gio::Cancellable::NONE)
        .with_context(|| format!("reading detached metadata of {checksum}"))?;
    Ok(CommitInfo {
        parent: ostree::commit_get_parent(&commit).map(|p| p.to_string()),
        subject: commit.child_value(3).str().unwrap_or_default().to_string(),
        timestamp: ostree::commit_get_timestamp(&commit),
        metadata: dict_to_json(&commit.child_value(0)),
        detached_metadata: detached.as_ref().map(dict_to_json).unwrap_or_default(),
        checksum,
    })
}
