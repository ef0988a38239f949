//! libostree through the `ostree` crate: archive repos, commits with
//! metadata, refs, GPG signatures, detached metadata and the summary. The
//! reads both sides make (commits, remotes, pulls, signatures) are the
//! commit contract's, re-exported here.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result, bail};
use gio::prelude::FileExt;
use glib::prelude::*;
use ostree::gio;
use serde::{Deserialize, Serialize};

pub use emberrtos_contract::ostree::*;

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
    open_or_create_with_mode(path, ostree::RepoMode::Archive)
}

/// Opens the repo at `path`, creating one in `mode` when none exists.
pub fn open_or_create_with_mode(path: &Path, mode: ostree::RepoMode) -> Result<ostree::Repo> {
    let repo = ostree::Repo::new_for_path(path);
    if path.join("config").is_file() {
        repo.open(gio::Cancellable::NONE)
            .with_context(|| format!("opening ostree repo {}", path.display()))?;
    } else {
        std::fs::create_dir_all(path).with_context(|| format!("creating {}", path.display()))?;
        repo.create(mode, gio::Cancellable::NONE)
            .with_context(|| format!("creating {mode:?} ostree repo {}", path.display()))?;
    }
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
    /// Files taken by (device, inode) from a hardlinked checkout, not read.
    #[serde(default)]
    pub devino_cache_hits: usize,
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
    /// The tree is a hardlink checkout of this (bare) repo, in which every
    /// write broke the link first ([`emberrtos_contract::io::root::ImageRoot`] does): a
    /// file still linked to an object is taken by its (device, inode) as
    /// that object, without being read again.
    pub hardlinked: bool,
    /// Move the tree's files into the repo instead of copying them; the
    /// tree is consumed (an import from a scratch directory).
    pub consume: bool,
    /// The repo holding `parent`, when it is not this one.
    pub parent_repo: Option<&'a ostree::Repo>,
}

/// The commit modifier flags of a request: xattrs are skipped so the
/// checksum depends only on the tree itself.
fn modifier_flags(request: &CommitRequest) -> ostree::RepoCommitModifierFlags {
    let mut flags = ostree::RepoCommitModifierFlags::SKIP_XATTRS;
    if request.hardlinked {
        flags |= ostree::RepoCommitModifierFlags::DEVINO_CANONICAL;
    }
    if request.consume {
        flags |= ostree::RepoCommitModifierFlags::CONSUME;
    }
    flags
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
    if request.hardlinked {
        // The (device, inode) of every loose object: one fstatat each. The
        // map is rebuilt here rather than carried from the checkout, so a
        // commit in a later run than the checkout is still fast.
        repo.scan_hardlinks(Some(&cancellable))
            .context("scanning the repo's objects for hardlinks")?;
    }
    let entries = std::rc::Rc::new(std::cell::Cell::new(0usize));
    let seen = entries.clone();
    let force_root = request.force_root_owner;
    let flags = modifier_flags(&request);
    let on_entry = request.on_entry;
    let modifier = ostree::RepoCommitModifier::new(
        flags,
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
        Some(parent) => same_commit_content(request.parent_repo.unwrap_or(repo), parent, &root, &metadata)?,
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

/// Checks `commit` out to `dest` (which must not exist) with every file a
/// hardlink to its object, as a `bare` or `bare-user` repo allows. Empty
/// files are copied, so no object reaches the filesystem's link limit; a
/// file that cannot be linked is copied, which a later commit reads again.
pub fn checkout_hardlinked(repo: &ostree::Repo, commit: &str, dest: &Path) -> Result<()> {
    let mode = match repo.mode() {
        ostree::RepoMode::BareUser => ostree::RepoCheckoutMode::User,
        ostree::RepoMode::Bare => ostree::RepoCheckoutMode::None,
        other => bail!("a hardlink checkout needs a bare or bare-user repo, not {other:?}"),
    };
    let options = ostree::RepoCheckoutAtOptions {
        mode,
        force_copy_zerosized: true,
        ..Default::default()
    };
    repo.checkout_at(
        Some(&options),
        libc::AT_FDCWD,
        dest,
        commit,
        gio::Cancellable::NONE,
    )
    .with_context(|| format!("checking out {commit} to {}", dest.display()))
}

/// Whether libostree's devino cache maps every file under `dir` to the
/// right object. Before 2023.4 it looks inodes up by their low 32 bits
/// (fixed upstream in de6fddc6), which is exact only where inode numbers
/// are 32-bit: ext2/3/4. Elsewhere (XFS, btrfs, tmpfs) an older libostree
/// could take a file for another object, so the tree is read instead.
pub fn inode_lookup_is_exact(dir: &Path) -> Result<bool> {
    Ok(ostree::check_version(2023, 4) || crate::io::filesystem_magic(dir)? == libc::EXT4_SUPER_MAGIC)
}

/// The version of the libostree this process runs against, as
/// `(year, release)`: libostree only answers "at least this version?", so
/// this asks for the highest version it says yes to.
pub fn library_version() -> (u32, u32) {
    highest_version(ostree::check_version)
}

/// The highest `(year, release)` that `at_least` accepts (libostree's
/// versions: years since 2012, releases 1 to a dozen or so).
pub fn highest_version(at_least: impl Fn(u32, u32) -> bool) -> (u32, u32) {
    let year = (2012..=2200).take_while(|&y| at_least(y, 0)).last().unwrap_or(0);
    let release = (0..=99).take_while(|&r| at_least(year, r)).last().unwrap_or(0);
    (year, release)
}

/// Copies `checksum` (a commit and what it references) from the local repo
/// at `source` into `repo`. Every object copied is checksummed again on the
/// way in; objects `repo` already has are not read.
pub fn pull_local(repo: &ostree::Repo, source: &Path, checksum: &str) -> Result<()> {
    let options = glib::VariantDict::new(None);
    options.insert_value("refs", &vec![checksum.to_string()].to_variant());
    options.insert_value(
        "flags",
        &(ostree::RepoPullFlags::UNTRUSTED.bits() as i32).to_variant(),
    );
    options.insert_value("gpg-verify", &false.to_variant());
    let url = gio::File::for_path(std::path::absolute(source)?).uri();
    repo.pull_with_options(&url, &options.end(), None, gio::Cancellable::NONE)
        .with_context(|| format!("copying commit {checksum} from {}", source.display()))
}

fn stats_of(stats: ostree::RepoTransactionStats) -> WriteStats {
    WriteStats {
        content_objects_total: stats.get_content_objects_total(),
        content_objects_written: stats.get_content_objects_written(),
        metadata_objects_total: stats.get_metadata_objects_total(),
        metadata_objects_written: stats.get_metadata_objects_written(),
        content_bytes_written: stats.get_content_bytes_written(),
        devino_cache_hits: stats.get_devino_cache_hits(),
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

/// Points `ref_name` at `checksum` atomically.
pub fn set_ref(repo: &ostree::Repo, ref_name: &str, checksum: &str) -> Result<()> {
    repo.set_ref_immediate(None, ref_name, Some(checksum), gio::Cancellable::NONE)
        .with_context(|| format!("setting ref {ref_name} to {checksum}"))
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

/// Generates the summary of the repo at `root` as bytes, leaving the repo's
/// own `summary` alone: libostree regenerates it in a shadow repo built in
/// `scratch` (an empty directory) whose objects, refs and deltas are the
/// repo's own, through symlinks.
pub fn generate_summary(root: &Path, scratch: &Path) -> Result<Vec<u8>> {
    let root = std::path::absolute(root).with_context(|| format!("resolving {}", root.display()))?;
    std::fs::copy(root.join("config"), scratch.join("config"))
        .with_context(|| format!("copying the config of {}", root.display()))?;
    std::fs::create_dir(scratch.join("tmp"))?;
    for shared in ["objects", "refs", "deltas"] {
        std::os::unix::fs::symlink(root.join(shared), scratch.join(shared))
            .with_context(|| format!("linking {shared} into {}", scratch.display()))?;
    }
    let shadow = open(scratch)?;
    shadow
        .regenerate_summary(None, gio::Cancellable::NONE)
        .with_context(|| format!("generating the summary of {}", root.display()))?;
    std::fs::read(scratch.join("summary")).context("reading the generated summary")
}

/// A detached GPG signature of a summary, as libostree writes `summary.sig`.
pub fn sign_summary(
    repo: &ostree::Repo,
    summary: &[u8],
    key_id: &str,
    homedir: Option<&Path>,
) -> Result<Vec<u8>> {
    let homedir = homedir.map(|h| h.to_string_lossy().into_owned());
    let signature = repo
        .gpg_sign_data(
            &glib::Bytes::from(summary),
            None,
            &[key_id],
            homedir.as_deref(),
            gio::Cancellable::NONE,
        )
        .with_context(|| format!("signing the summary with GPG key {key_id}"))?;
    Ok(signature.to_vec())
}

/// Whether two summaries list the same refs, commits, deltas and metadata,
/// ignoring when each was generated.
pub fn same_summary(a: &[u8], b: &[u8]) -> bool {
    let parse = |data: &[u8]| {
        let ty = glib::VariantTy::new("(a(s(taya{sv}))a{sv})").expect("valid type");
        let summary = glib::Variant::from_bytes_with_type(&glib::Bytes::from(data), ty).normal_form();
        let metadata = glib::VariantDict::new(Some(&summary.child_value(1)));
        metadata.remove("ostree.summary.last-modified");
        (summary.child_value(0), metadata.end())
    };
    parse(a) == parse(b)
}

/// Regenerates the summary, signed when a key is given. The new summary is
/// generated and signed before either file in the repo changes; then the
/// signature is renamed into place, then the summary (see
/// [`summary_files_in_order`]).
pub fn update_summary(repo: &ostree::Repo, key_id: Option<&str>, homedir: Option<&Path>) -> Result<()> {
    let root = repo.path().path().context("the repo has no local path")?;
    let scratch = tempfile::Builder::new()
        .prefix(".imgbuild-summary-")
        .tempdir_in(&root)
        .with_context(|| format!("creating a scratch dir in {}", root.display()))?;
    let summary = generate_summary(&root, scratch.path())?;
    let signature = match key_id {
        Some(key) => Some(sign_summary(repo, &summary, key, homedir)?),
        None => None,
    };
    for (name, data) in summary_files_in_order(&summary, signature.as_deref()) {
        let path = root.join(name);
        match data {
            Some(data) => crate::io::atomic::write_file_atomic(&path, data)?,
            None => remove_if_present(&path)?,
        }
    }
    Ok(())
}

/// The order in which a new summary and its signature replace the old ones:
/// `summary.sig` (written, or removed when unsigned) first, `summary` last.
/// A reader fetches `summary` and then `summary.sig`, so with this order it
/// never pairs a new summary with an old or missing signature: once the new
/// summary is visible, its signature already is. A reader between the two
/// renames (or after a kill there) sees the old summary with the new
/// signature, which fails verification and is retried; the next publish
/// completes the pair. Nothing unsigned is ever served as signed.
pub fn summary_files_in_order<'a>(
    summary: &'a [u8],
    signature: Option<&'a [u8]>,
) -> [(&'static str, Option<&'a [u8]>); 2] {
    [("summary.sig", signature), ("summary", Some(summary))]
}

fn remove_if_present(path: &Path) -> Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(e).with_context(|| format!("removing {}", path.display()))
        }
        _ => Ok(()),
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_highest_version_the_library_accepts() {
        let library = |year: u32, release: u32| (year, release) <= (2022, 7);
        assert_eq!(highest_version(library), (2022, 7));
        assert_eq!(highest_version(|y, r| (y, r) <= (2013, 0)), (2013, 0));
        // The running libostree is itself at least what the crate needs.
        let (year, release) = library_version();
        assert!((year, release) >= (2022, 7), "{year}.{release}");
        assert!(ostree::check_version(year, release));
        assert!(!ostree::check_version(year, release + 1));
    }
}

/// One GPG signature of a commit, as libostree verified it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommitSignature {
    /// The signing key's primary fingerprint (or its key id, when the key
    /// is not in any keyring the check used).
    pub signer: String,
    /// A good signature by a key the check had.
    pub valid: bool,
}

/// The commit's GPG signatures, verified with the keyrings in
/// `keyring_dir` alone; none when it has none.
pub fn commit_signatures(
    repo: &ostree::Repo,
    info: &CommitInfo,
    keyring_dir: &Path,
) -> Result<Vec<CommitSignature>> {
    let has_any = info
        .detached_metadata
        .get("ostree.gpgsigs")
        .and_then(|v| v.as_array())
        .is_some_and(|signatures| !signatures.is_empty());
    if !has_any {
        return Ok(Vec::new());
    }
    use glib::translate::IntoGlib;
    let keyring_dir = gio::File::for_path(keyring_dir);
    let result = repo
        .verify_commit_ext(
            &info.checksum,
            Some(&keyring_dir),
            gio::File::NONE,
            gio::Cancellable::NONE,
        )
        .with_context(|| format!("verifying the signatures of commit {}", info.checksum))?;
    let attr = |signature: &glib::Variant, attr: ostree::GpgSignatureAttr| {
        signature.try_child_value(attr.into_glib() as usize)
    };
    Ok((0..result.count_all())
        .map(|index| {
            let signature = result.all(index);
            let text = |a| attr(&signature, a).and_then(|v| v.str().map(str::to_string));
            CommitSignature {
                signer: text(ostree::GpgSignatureAttr::FingerprintPrimary)
                    .filter(|f| !f.is_empty())
                    .or_else(|| text(ostree::GpgSignatureAttr::Fingerprint))
                    .unwrap_or_default(),
                valid: attr(&signature, ostree::GpgSignatureAttr::Valid)
                    .and_then(|v| v.get::<bool>())
                    .unwrap_or(false),
            }
        })
        .collect())
}
