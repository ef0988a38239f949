//! How files reach a remote (an ostree repo for `publish`, an artifact
//! cache for `cache push`): [`LocalDir`] for a directory or `file://`,
//! [`ssh::SshDir`] for `ssh://user@host[:port]/path`. Every file goes to a
//! temp name and is renamed into place, so a reader sees it whole or not at
//! all. Nothing at the destination is trusted: a link there is never
//! followed, and a file there counts as what publish would write only when
//! its bytes hash the same.

use std::cell::{OnceCell, RefCell};
use std::collections::{HashMap, HashSet};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

use crate::io::records::{self, RecordError, RecordKind};
use crate::io::root::ImageRoot;
use crate::ostree as ost;

pub mod bounded;
pub mod ssh;
pub mod trust;

/// The prefix of every temp file and dir publish makes at the destination.
/// Nothing else there starts with it, so whatever carries it when a publish
/// starts (under the destination's lock) was left by a killed run.
pub const TEMP_PREFIX: &str = ".publish-";

/// The prefix of the temp files the confined root (contract
/// `io::root::ImageRoot`) writes beside a file; a kill mid-write leaves one.
pub const ROOT_TEMP_PREFIX: &str = ".imgbuild-";

/// The lock file that keeps two publishes to one destination apart.
pub const LOCK_FILE: &str = ".publish.lock";

/// The directories of an archive repo, parents first.
pub const REPO_DIRS: [&str; 9] = [
    "objects",
    "refs",
    "refs/heads",
    "refs/mirrors",
    "refs/remotes",
    "tmp",
    "state",
    "deltas",
    "extensions",
];

/// The config of the archive repos publish makes.
pub const REPO_CONFIG: &str = "[core]\nrepo_version=1\nmode=archive-z2\n";

/// The largest ref file and delta superblock read for the summary.
const REF_BYTES: u64 = 2 << 10;
const SUPERBLOCK_BYTES: u64 = 16 << 20;

/// What publish reads back is small (refs, summaries, metadata, records):
/// a planted huge file is refused, not read into memory.
pub const READ_LIMIT: u64 = 64 << 20;

/// How files reach the remote. Writes may be queued: [`Transport::flush`]
/// makes every earlier write visible, and callers flush at the end of each
/// phase that must be complete before the next one starts.
pub trait Transport {
    fn describe(&self) -> String;
    /// Makes DEST an archive repo if it is not one yet. A link at DEST or
    /// at any path publish writes there is refused before anything is made.
    fn ensure_repo(&self) -> Result<()>;
    /// Makes DEST a directory if it is not one yet (a remote cache).
    fn ensure_root(&self) -> Result<()>;
    /// Holds the destination for one publish; released when dropped.
    fn lock(&self) -> Result<Box<dyn std::any::Any>>;
    /// Removes the temp files and dirs ([`TEMP_PREFIX`]) a killed publish
    /// left behind; returns how many. Call it only while holding the lock.
    fn remove_stale_temps(&self) -> Result<usize>;
    /// Which of `files` (remote path, local file) the remote holds with the
    /// local file's bytes: written by this transport, or hashing the same.
    fn holding(&self, files: &[(PathBuf, PathBuf)]) -> Result<HashSet<PathBuf>>;
    /// A regular file's bytes (at most [`READ_LIMIT`]), never through a link.
    fn read(&self, rel: &Path) -> Result<Option<Vec<u8>>>;
    /// Writes `data` to `rel` atomically (temp name, then rename).
    fn put(&self, rel: &Path, data: &[u8]) -> Result<()>;
    /// Copies a local file to `rel` atomically; it may be queued until
    /// [`Transport::flush`].
    fn put_file(&self, rel: &Path, source: &Path) -> Result<()>;
    /// Makes every queued write visible at the remote.
    fn flush(&self) -> Result<()> {
        Ok(())
    }
    /// Removes `rel` if it exists.
    fn remove(&self, rel: &Path) -> Result<()>;
    /// The summary the remote's refs, commits and deltas call for, generated
    /// without touching the summary it serves.
    fn generate_summary(&self) -> Result<Vec<u8>>;
}

/// The transport `dest` names: `ssh://user@host[:port]/path`, else a
/// directory path or `file://`.
pub fn open(dest: &str) -> Result<Box<dyn Transport>> {
    if dest.starts_with("ssh://") {
        return Ok(Box::new(ssh::SshDir::parse(dest)?));
    }
    Ok(Box::new(LocalDir::parse(dest)?))
}

/// ostree's path for a loose object.
pub fn object_path(checksum: &str, kind: ostree::ObjectType) -> PathBuf {
    let ext = match kind {
        ostree::ObjectType::File => "filez",
        ostree::ObjectType::DirTree => "dirtree",
        ostree::ObjectType::DirMeta => "dirmeta",
        ostree::ObjectType::Commit => "commit",
        ostree::ObjectType::CommitMeta => "commitmeta",
        _ => "unknown",
    };
    PathBuf::from(format!("objects/{}/{}.{ext}", &checksum[..2], &checksum[2..]))
}

/// The checksum a ref file holds, when it holds one.
fn ref_checksum(data: &[u8]) -> Option<&str> {
    let text = std::str::from_utf8(data).ok()?.trim_end_matches('\n');
    records::check_commit(text).is_ok().then_some(text)
}

/// The files of `files` that are `known` (written or checked before), or
/// whose remote sha256 (`remote`, by path) is the local file's; those
/// become known.
fn held(
    files: &[(PathBuf, PathBuf)],
    known: &RefCell<HashSet<PathBuf>>,
    remote: impl FnOnce(&[&Path]) -> Result<HashMap<PathBuf, String>>,
) -> Result<HashSet<PathBuf>> {
    let unknown: Vec<&Path> = files
        .iter()
        .map(|(rel, _)| rel.as_path())
        .filter(|rel| !known.borrow().contains(*rel))
        .collect();
    let hashes = if unknown.is_empty() {
        HashMap::new()
    } else {
        remote(&unknown)?
    };
    let mut known = known.borrow_mut();
    for (rel, local) in files {
        let Some(remote_hash) = hashes.get(rel) else {
            continue;
        };
        if *remote_hash == crate::io::hashing::sha256_file(local, None)? {
            known.insert(rel.clone());
        }
    }
    Ok(files
        .iter()
        .filter(|(rel, _)| known.contains(rel))
        .map(|(rel, _)| rel.clone())
        .collect())
}

/// The summary of the scratch repo at `repo` (config, refs, ref commits,
/// delta superblocks copied from `dest`). Its config is checked first:
/// libostree's errors quote a bad config's lines, and what a planted file
/// holds is never shown.
fn summary_of_inputs(repo: &Path, dest: &str) -> Result<Vec<u8>> {
    check_config(&repo.join("config"), dest)?;
    for dir in REPO_DIRS {
        std::fs::create_dir_all(repo.join(dir))?;
    }
    let scratch = repo.with_extension("scratch");
    std::fs::create_dir(&scratch)?;
    ost::generate_summary(repo, &scratch)
}

/// An archive repo's config: a key file with `core.mode` archive(-z2).
fn check_config(config: &Path, dest: &str) -> Result<()> {
    let bad = || {
        anyhow::anyhow!("config on {dest} is not an ostree archive repo's config (its content is not shown)")
    };
    let keys = glib::KeyFile::new();
    keys.load_from_file(config, glib::KeyFileFlags::NONE)
        .map_err(|_| bad())?;
    let mode = keys.string("core", "mode").map_err(|_| bad())?;
    if !matches!(mode.as_str(), "archive-z2" | "archive") {
        return Err(bad());
    }
    Ok(())
}

/// Writes `data` to `rel` under the local dir `repo` (ours, not the remote).
fn write_scratch(repo: &Path, rel: &Path, data: &[u8]) -> Result<()> {
    let path = repo.join(rel);
    std::fs::create_dir_all(path.parent().expect("a file in the repo"))?;
    std::fs::write(&path, data).with_context(|| format!("writing {}", path.display()))
}

/// A remote that is a directory on this machine (a web root). It is opened
/// once, after the link checks, and every access resolves inside that
/// directory (contract `io::root::ImageRoot`): a link swapped in later,
/// even for the root itself, is not followed out of it.
pub struct LocalDir {
    pub root: PathBuf,
    tree: OnceCell<ImageRoot>,
    /// Files written or checked identical by this transport.
    known: RefCell<HashSet<PathBuf>>,
}

/// The paths under the root publish makes or writes, parents first; none
/// may be a link.
pub(super) fn written_paths() -> impl Iterator<Item = &'static str> {
    REPO_DIRS
        .into_iter()
        .chain(["config", "summary", "summary.sig", LOCK_FILE])
        .chain(RecordKind::ALL.map(RecordKind::dir_name))
}

/// Refuses a link at `path` itself.
fn refuse_link(path: &Path) -> Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_symlink() => Err(RecordError::Symlink {
            path: path.to_path_buf(),
        }
        .into()),
        Ok(_) => Ok(()),
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ENOTDIR)) => Ok(()),
        Err(e) => Err(e).with_context(|| format!("checking {}", path.display())),
    }
}

/// Refuses a link at `root` or at any path publish writes under it, and a
/// `config` that is not a regular file, before anything is made there.
fn refuse_planted_links(root: &Path) -> Result<()> {
    refuse_link(root)?;
    for rel in written_paths() {
        refuse_link(&root.join(rel))?;
    }
    let config = root.join("config");
    match std::fs::symlink_metadata(&config) {
        Ok(meta) if !meta.is_file() => Err(RecordError::NotAFile { path: config }.into()),
        _ => Ok(()),
    }
}

fn same_inode(a: &std::fs::Metadata, b: &std::fs::Metadata) -> bool {
    (a.dev(), a.ino()) == (b.dev(), b.ino())
}

/// A name for a temp file beside `rel`.
fn temp_beside(rel: &Path) -> PathBuf {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    rel.with_file_name(format!("{TEMP_PREFIX}{}-{n}", std::process::id()))
}

impl LocalDir {
    pub fn new(root: impl Into<PathBuf>) -> LocalDir {
        LocalDir {
            root: root.into(),
            tree: OnceCell::new(),
            known: RefCell::new(HashSet::new()),
        }
    }

    /// Accepts a path or a `file://` URL: the user's own path, resolved once
    /// following their links (`/srv/www -> /data/www`); a link inside it, or
    /// one swapped in at the root later, is refused.
    pub fn parse(dest: &str) -> Result<LocalDir> {
        let path = match dest.strip_prefix("file://") {
            Some(path) => path,
            None if dest.contains("://") => {
                bail!("unsupported destination {dest:?}: use a directory path, file:// or ssh://")
            }
            None => dest,
        };
        if path.is_empty() {
            bail!("the destination {dest:?} names no directory");
        }
        let root =
            crate::io::resolve_user_path(Path::new(path)).with_context(|| format!("resolving {path}"))?;
        Ok(LocalDir::new(root))
    }

    /// The root, opened once: the link checks come before anything is made
    /// (`create` makes the root), and the directory opened must be the one
    /// checked.
    fn open_root(&self, create: bool) -> Result<&ImageRoot> {
        if let Some(tree) = self.tree.get() {
            return Ok(tree);
        }
        refuse_planted_links(&self.root)?;
        if create {
            std::fs::create_dir_all(&self.root)
                .with_context(|| format!("creating {}", self.root.display()))?;
        }
        let tree = ImageRoot::open(&self.root)?;
        // `..` stops at the confined root: this is the directory opened.
        let opened = tree.symlink_metadata(Path::new(".."))?;
        refuse_link(&self.root)?;
        let named = std::fs::symlink_metadata(&self.root)?;
        if !opened.is_some_and(|o| same_inode(&o, &named)) {
            bail!("{} changed while it was opened", self.root.display());
        }
        Ok(self.tree.get_or_init(|| tree))
    }

    fn tree(&self) -> Result<&ImageRoot> {
        self.open_root(false)
    }

    /// The opened root, with every directory of `rel` a real one (made when
    /// missing, never a link).
    fn dirs_of(&self, rel: &Path) -> Result<&ImageRoot> {
        let tree = self.tree()?;
        records::real_dirs(tree, rel.parent().unwrap_or(Path::new("")), true)?;
        Ok(tree)
    }

    /// Writes `rel` through a temp file beside it (made by `write`), synced,
    /// then renamed into place; the temp file goes on any error.
    fn land(&self, rel: &Path, write: impl FnOnce(&ImageRoot, &Path) -> Result<()>) -> Result<()> {
        let tree = self.dirs_of(rel)?;
        let temp = temp_beside(rel);
        let landed = write(tree, &temp)
            .and_then(|()| Ok(tree.open_file(&temp)?.sync_all()?))
            .and_then(|()| tree.rename(&temp, rel));
        if landed.is_err() {
            let _ = tree.remove(&temp);
        }
        landed.with_context(|| format!("writing {}", self.root.join(rel).display()))?;
        self.known.borrow_mut().insert(rel.to_path_buf());
        Ok(())
    }

    /// Fails unless `file` (opened by its path) is what `rel` is inside the
    /// opened root: a link on the way would have led elsewhere.
    fn check_inside(&self, rel: &Path, file: &std::fs::File) -> Result<std::fs::Metadata> {
        let meta = file.metadata()?;
        let inside = self.tree()?.symlink_metadata(rel)?;
        if !inside.is_some_and(|m| same_inode(&m, &meta)) {
            bail!(
                "{} leads out of the destination (a link on the way) or changed",
                self.root.join(rel).display()
            );
        }
        Ok(meta)
    }

    /// The regular file at `rel`, never through a link, without blocking
    /// on a FIFO; `None` when missing.
    fn open_inside(&self, rel: &Path) -> Result<Option<std::fs::File>> {
        let path = self.tree()?.path().join(rel);
        let file = match crate::io::open_nofollow(&path) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
                return Err(RecordError::Symlink { path }.into());
            }
            Err(e) => return Err(e).with_context(|| format!("opening {}", path.display())),
        };
        if !self.check_inside(rel, &file)?.is_file() {
            return Err(RecordError::NotAFile { path }.into());
        }
        Ok(Some(file))
    }

    /// The sha256 of each of `rels` that is a regular file at the destination.
    fn hashes(&self, rels: &[&Path]) -> Result<HashMap<PathBuf, String>> {
        let mut hashes = HashMap::new();
        for rel in rels {
            // A link or anything else at the name is not held (a write replaces it).
            if !self.tree()?.symlink_metadata(rel)?.is_some_and(|m| m.is_file()) {
                continue;
            }
            if let Some(file) = self.open_inside(rel)? {
                let path = self.root.join(rel);
                let (hash, _) = crate::io::hashing::sha256_reader(file, None)
                    .with_context(|| format!("reading {}", path.display()))?;
                hashes.insert(rel.to_path_buf(), hash);
            }
        }
        Ok(hashes)
    }

    /// The regular files under `dir` of at most `max` bytes, relative to the root.
    fn small_files(&self, dir: &str, max: u64) -> Result<Vec<PathBuf>> {
        let top = self.tree()?.path();
        let mut files = Vec::new();
        for entry in walkdir::WalkDir::new(top.join(dir)).follow_root_links(false) {
            let entry = match entry {
                Err(e)
                    if e.io_error()
                        .is_some_and(|e| e.kind() == std::io::ErrorKind::NotFound) =>
                {
                    break;
                }
                entry => entry.with_context(|| format!("listing {}", top.join(dir).display()))?,
            };
            if entry.file_type().is_file() && entry.metadata()?.len() <= max {
                files.push(
                    entry
                        .path()
                        .strip_prefix(top)
                        .expect("under the root")
                        .to_path_buf(),
                );
            }
        }
        Ok(files)
    }

    /// Copies into the scratch repo `repo` what the summary is made from:
    /// the config, each ref that holds a checksum, its commit object, and
    /// each delta superblock.
    fn copy_summary_inputs(&self, repo: &Path) -> Result<()> {
        let config = self
            .read(Path::new("config"))?
            .with_context(|| format!("{} has no config", self.describe()))?;
        write_scratch(repo, Path::new("config"), &config)?;
        for rel in self.small_files("refs/heads", REF_BYTES)? {
            let Some(data) = self.read(&rel)? else { continue };
            let Some(checksum) = ref_checksum(&data) else {
                continue;
            };
            let commit = object_path(checksum, ostree::ObjectType::Commit);
            if let Some(object) = self.read(&commit)? {
                write_scratch(repo, &rel, &data)?;
                write_scratch(repo, &commit, &object)?;
            }
        }
        for rel in self.small_files("deltas", SUPERBLOCK_BYTES)? {
            if rel.ends_with("superblock")
                && let Some(data) = self.read(&rel)?
            {
                write_scratch(repo, &rel, &data)?;
            }
        }
        Ok(())
    }
}

/// Whether a directory entry is a temp file or dir of publish or of the confined root.
fn is_publish_temp(entry: &walkdir::DirEntry) -> bool {
    let name = entry.file_name().to_string_lossy();
    entry.depth() > 0 && (name.starts_with(TEMP_PREFIX) || name.starts_with(ROOT_TEMP_PREFIX))
}

impl Transport for LocalDir {
    fn describe(&self) -> String {
        format!("file://{}", self.root.display())
    }

    fn ensure_repo(&self) -> Result<()> {
        let tree = self.open_root(true)?;
        for dir in REPO_DIRS {
            records::real_dirs(tree, Path::new(dir), true)?;
        }
        if tree.symlink_metadata(Path::new("config"))?.is_none() {
            tree.write_new(Path::new("config"), REPO_CONFIG.as_bytes(), 0o644)?;
        }
        Ok(())
    }

    fn ensure_root(&self) -> Result<()> {
        self.open_root(true).map(drop)
    }

    fn lock(&self) -> Result<Box<dyn std::any::Any>> {
        use std::os::unix::fs::OpenOptionsExt;
        let path = self.tree()?.path().join(LOCK_FILE);
        // A link or FIFO planted at the name is refused, not followed.
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(&path)
            .with_context(|| format!("opening {}", path.display()))?;
        self.check_inside(Path::new(LOCK_FILE), &file)?;
        file.lock()
            .with_context(|| format!("locking {}", path.display()))?;
        Ok(Box::new(file))
    }

    fn remove_stale_temps(&self) -> Result<usize> {
        let tree = self.tree()?;
        let mut stale = Vec::new();
        let mut walk = walkdir::WalkDir::new(tree.path())
            .follow_root_links(false)
            .into_iter();
        while let Some(entry) = walk.next() {
            let entry = entry.with_context(|| format!("listing {}", self.root.display()))?;
            if is_publish_temp(&entry) {
                if entry.file_type().is_dir() {
                    walk.skip_current_dir();
                }
                stale.push(
                    entry
                        .path()
                        .strip_prefix(tree.path())
                        .expect("under the root")
                        .to_path_buf(),
                );
            }
        }
        for rel in &stale {
            tree.remove(rel)
                .with_context(|| format!("removing stale {}", self.root.join(rel).display()))?;
        }
        Ok(stale.len())
    }

    fn holding(&self, files: &[(PathBuf, PathBuf)]) -> Result<HashSet<PathBuf>> {
        held(files, &self.known, |rels| self.hashes(rels))
    }

    /// Never through a link planted at the name or on the way (an error),
    /// and a FIFO there cannot hang the read.
    fn read(&self, rel: &Path) -> Result<Option<Vec<u8>>> {
        let Some(file) = self.open_inside(rel)? else {
            return Ok(None);
        };
        let path = self.root.join(rel);
        let data = bounded::read_capped(file, READ_LIMIT)
            .with_context(|| format!("{} is larger than {READ_LIMIT} bytes", path.display()))?;
        Ok(Some(data))
    }

    fn put(&self, rel: &Path, data: &[u8]) -> Result<()> {
        self.land(rel, |tree, temp| tree.write(temp, data, 0o644))
    }

    fn put_file(&self, rel: &Path, source: &Path) -> Result<()> {
        self.land(rel, |tree, temp| tree.copy_in(source, temp, 0o644))
    }

    fn remove(&self, rel: &Path) -> Result<()> {
        self.known.borrow_mut().remove(rel);
        self.tree()?.remove(rel)
    }

    fn generate_summary(&self) -> Result<Vec<u8>> {
        let scratch = tempfile::Builder::new()
            .prefix("imgbuild-summary-")
            .tempdir()
            .context("creating a scratch dir")?;
        let repo = scratch.path().join("repo");
        self.copy_summary_inputs(&repo)?;
        summary_of_inputs(&repo, &self.describe())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    /// A destination dir and a dir outside it, in one temp dir.
    fn dirs() -> (tempfile::TempDir, PathBuf, PathBuf) {
        let temp = tempfile::tempdir().unwrap();
        let (www, outside) = (temp.path().join("www"), temp.path().join("outside"));
        std::fs::create_dir(&outside).unwrap();
        (temp, www, outside)
    }

    fn entries(dir: &Path) -> Vec<std::ffi::OsString> {
        let mut names: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn a_link_at_the_root_or_at_a_path_publish_writes_is_refused_before_anything_is_made() {
        let (_temp, www, outside) = dirs();
        symlink(&outside, &www).unwrap();
        let err = format!("{:#}", LocalDir::new(&www).ensure_repo().unwrap_err());
        assert!(err.contains(&format!("{} is a symlink", www.display())), "{err}");
        assert!(entries(&outside).is_empty(), "made through the root link");

        std::fs::remove_file(&www).unwrap();
        std::fs::create_dir(&www).unwrap();
        for planted in ["refs", "refs/heads", "deltas", "summary.sig", LOCK_FILE] {
            let link = www.join(planted);
            std::fs::create_dir_all(link.parent().unwrap()).unwrap();
            symlink(&outside, &link).unwrap();
            let err = format!("{:#}", LocalDir::new(&www).ensure_repo().unwrap_err());
            assert!(err.contains(&format!("{} is a symlink", link.display())), "{err}");
            assert!(entries(&outside).is_empty(), "made through {planted}");
            assert!(!www.join("config").exists() && !www.join("objects").exists());
            std::fs::remove_file(&link).unwrap();
        }
        LocalDir::new(&www).ensure_repo().unwrap();
        assert_eq!(std::fs::read_to_string(www.join("config")).unwrap(), REPO_CONFIG);
    }

    #[test]
    fn the_users_own_link_to_the_web_root_is_followed_once() {
        let (temp, www, _outside) = dirs();
        std::fs::create_dir(&www).unwrap();
        let link = temp.path().join("www-link");
        symlink(&www, &link).unwrap();
        let dest = LocalDir::parse(&format!("file://{}", link.display())).unwrap();
        assert_eq!(dest.root, www.canonicalize().unwrap());
        dest.ensure_repo().unwrap();
        assert_eq!(std::fs::read_to_string(www.join("config")).unwrap(), REPO_CONFIG);
        assert!(
            std::fs::symlink_metadata(&link).unwrap().is_symlink(),
            "the link was replaced"
        );
        // Not yet made: below the deepest directory that exists.
        let below = LocalDir::parse(&link.join("new/www").display().to_string()).unwrap();
        assert_eq!(below.root, www.canonicalize().unwrap().join("new/www"));
        assert!(LocalDir::parse("file://").is_err());
    }

    #[test]
    fn a_planted_config_is_never_followed_copied_or_shown() {
        let (_temp, www, outside) = dirs();
        let secret = outside.join("shadow");
        std::fs::write(&secret, "root:SECRET-HASH:19000::::::\n").unwrap();
        std::fs::create_dir(&www).unwrap();
        symlink(&secret, www.join("config")).unwrap();
        let err = format!("{:#}", LocalDir::new(&www).ensure_repo().unwrap_err());
        assert!(
            err.contains(&format!("{} is a symlink", www.join("config").display())),
            "{err}"
        );
        assert!(!err.contains("SECRET"), "{err}");

        // A regular config that is not a repo's: named, its lines not shown.
        std::fs::remove_file(www.join("config")).unwrap();
        std::fs::copy(&secret, www.join("config")).unwrap();
        let remote = LocalDir::new(&www);
        remote.ensure_repo().unwrap();
        let err = format!("{:#}", remote.generate_summary().unwrap_err());
        assert!(
            err.contains("config on file://") && err.contains("not shown"),
            "{err}"
        );
        assert!(!err.contains("SECRET"), "{err}");
        let copies = walkdir::WalkDir::new(&www)
            .into_iter()
            .filter_map(Result::ok)
            .filter(|e| e.file_type().is_file() && e.path() != www.join("config"))
            .filter(|e| {
                std::fs::read(e.path())
                    .unwrap()
                    .windows(6)
                    .any(|w| w == b"SECRET")
            })
            .count();
        assert_eq!(copies, 0, "the planted config was copied into the web root");
    }

    #[test]
    fn writes_stay_in_the_root_opened_when_its_path_becomes_a_link() {
        let (temp, www, outside) = dirs();
        let remote = LocalDir::new(&www);
        remote.ensure_repo().unwrap();
        let moved = temp.path().join("moved");
        std::fs::rename(&www, &moved).unwrap();
        symlink(&outside, &www).unwrap();
        remote.put(Path::new("refs/heads/r"), b"data\n").unwrap();
        let source = temp.path().join("object");
        std::fs::write(&source, b"object").unwrap();
        remote
            .put_file(Path::new("objects/ab/cd.filez"), &source)
            .unwrap();
        assert!(
            entries(&outside).is_empty(),
            "a write followed the swapped-in link"
        );
        assert_eq!(std::fs::read(moved.join("refs/heads/r")).unwrap(), b"data\n");
        assert_eq!(
            std::fs::read(moved.join("objects/ab/cd.filez")).unwrap(),
            b"object"
        );
        // A read by a path that leads out of the opened root is refused.
        std::fs::write(outside.join("config"), REPO_CONFIG).unwrap();
        assert!(remote.read(Path::new("config")).is_err());
    }

    #[test]
    fn a_file_at_the_destination_is_held_only_with_the_local_bytes() {
        let (temp, www, outside) = dirs();
        let remote = LocalDir::new(&www);
        remote.ensure_repo().unwrap();
        let local = temp.path().join("local.filez");
        std::fs::write(&local, b"the real object").unwrap();
        let file = |name: &str| (PathBuf::from(format!("objects/ab/{name}.filez")), local.clone());
        let (same, planted, linked, missing) =
            (file("same"), file("planted"), file("linked"), file("missing"));
        std::fs::create_dir_all(www.join("objects/ab")).unwrap();
        std::fs::write(www.join(&same.0), b"the real object").unwrap();
        std::fs::write(www.join(&planted.0), b"the fake object").unwrap();
        std::fs::write(outside.join("real"), b"the real object").unwrap();
        symlink(outside.join("real"), www.join(&linked.0)).unwrap();
        let held = remote
            .holding(&[same.clone(), planted.clone(), linked.clone(), missing.clone()])
            .unwrap();
        assert_eq!(held, HashSet::from([same.0.clone()]));
        // What this transport wrote is held without reading it back.
        remote.put_file(&planted.0, &local).unwrap();
        assert!(
            remote
                .holding(std::slice::from_ref(&planted))
                .unwrap()
                .contains(&planted.0)
        );
    }

    #[test]
    fn only_ref_files_holding_a_checksum_count() {
        let c = "ab".repeat(32);
        assert_eq!(ref_checksum(format!("{c}\n").as_bytes()), Some(c.as_str()));
        assert_eq!(ref_checksum(c.to_uppercase().as_bytes()), None);
        assert_eq!(ref_checksum(b"root:x:0:0:root:/root:/bin/bash\n"), None);
        assert_eq!(ref_checksum(b""), None);
    }
}
