//! Reading a commit's tree out of an ostree repo: entries, listings and
//! file contents, never following a symlink.

use anyhow::{Context, Result, bail};
use ostree::gio;
use ostree::gio::prelude::*;

/// The type of an entry in the commit, not following symlinks; `None` when absent.
pub fn entry_type(file: &gio::File) -> Result<Option<gio::FileType>> {
    match file.query_info(
        "standard::type",
        gio::FileQueryInfoFlags::NOFOLLOW_SYMLINKS,
        gio::Cancellable::NONE,
    ) {
        Ok(info) => Ok(Some(info.file_type())),
        Err(e) if e.matches(gio::IOErrorEnum::NotFound) => Ok(None),
        Err(e) => Err(e).with_context(|| format!("reading {} in the commit", file.uri())),
    }
}

/// The names of the entries of a directory in the commit.
pub fn children(dir: &gio::File) -> Result<Vec<(String, gio::FileType)>> {
    let entries = dir
        .enumerate_children(
            "standard::name,standard::type",
            gio::FileQueryInfoFlags::NOFOLLOW_SYMLINKS,
            gio::Cancellable::NONE,
        )
        .with_context(|| format!("listing {} in the commit", dir.uri()))?;
    let mut out = Vec::new();
    for info in entries {
        let info = info.with_context(|| format!("listing {} in the commit", dir.uri()))?;
        out.push((info.name().to_string_lossy().into_owned(), info.file_type()));
    }
    out.sort();
    Ok(out)
}

/// The content of a regular file in the commit, read from its object.
pub fn contents(file: &gio::File) -> Result<Vec<u8>> {
    use std::io::Read;
    let repo_file = file
        .downcast_ref::<ostree::RepoFile>()
        .context("not a file inside an ostree commit")?;
    repo_file
        .ensure_resolved()
        .with_context(|| format!("resolving {} in the commit", file.uri()))?;
    let checksum = repo_file.checksum();
    let (stream, _, _) = repo_file
        .repo()
        .load_file(&checksum, gio::Cancellable::NONE)
        .with_context(|| format!("loading {} (object {checksum}) from the repo", file.uri()))?;
    let mut bytes = Vec::new();
    if let Some(stream) = stream {
        stream
            .into_read()
            .read_to_end(&mut bytes)
            .with_context(|| format!("reading {} from the repo", file.uri()))?;
    }
    Ok(bytes)
}

/// The root of commit `rev` (a ref or checksum) and its checksum.
pub fn commit_root(repo: &ostree::Repo, rev: &str) -> Result<(gio::File, String)> {
    let (root, checksum) = repo
        .read_commit(rev, gio::Cancellable::NONE)
        .with_context(|| format!("reading commit {rev}"))?;
    Ok((root, checksum.to_string()))
}

/// The bytes of the regular file at `path` (relative) in the tree; `None`
/// when absent. Anything but a regular file there, or one larger than
/// `limit` bytes, is an error.
pub fn read_regular(root: &gio::File, path: &str, limit: u64) -> Result<Option<Vec<u8>>> {
    let file = root.resolve_relative_path(path);
    match entry_type(&file)? {
        None => return Ok(None),
        Some(gio::FileType::Regular) => {}
        Some(other) => bail!("/{path} in the commit is not a regular file but {other:?}"),
    }
    let size = file
        .query_info(
            "standard::size",
            gio::FileQueryInfoFlags::NOFOLLOW_SYMLINKS,
            gio::Cancellable::NONE,
        )
        .with_context(|| format!("reading /{path} in the commit"))?
        .size();
    if u64::try_from(size).map_or(true, |size| size > limit) {
        bail!("/{path} in the commit holds {size} bytes, more than the {limit} read here");
    }
    contents(&file).map(Some)
}

/// An entry of a tree listing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TreeEntry {
    Directory,
    /// A regular file or symlink, by its ostree file object checksum (which
    /// covers content, link target, mode, owner and xattrs).
    Object(String),
}
