//! Signed records beside an ostree repo: the one store `qualify`,
//! `promote` and `publish` use.
//!
//! A record of a commit is `<repo>/<kind dir>/<commit>/<name>.json` with its
//! armored detached signature `<name>.json.sig` beside it. The repo is
//! hostile input (it may hold symlinks planted to make a root process read
//! or write elsewhere), so:
//!
//! - the kind dir (`qualifications`, `promotions`) and the commit dir must
//!   be real directories: a symlink or anything else there is an error that
//!   names the path. Every path resolves inside the repo ([`ImageRoot`]).
//! - record and signature files are checked with `lstat`, opened
//!   `O_NOFOLLOW` through the commit dir's descriptor, must be regular files
//!   and at most [`MAX_FILE_BYTES`].
//! - [`store`] writes the signature, then the record, each to a synced temp
//!   file renamed into place (the directory synced after), so a record never
//!   appears without its signature and nothing half-written looks valid. A
//!   temp file a kill leaves behind starts with `.` and does not end in
//!   `.json`: [`list`] never takes it for a record.

use std::fs::{File, Metadata};
use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

use emberrtos_contract::io::root::ImageRoot;

/// The largest record or signature file read or written: 16 MiB.
pub const MAX_FILE_BYTES: u64 = 16 * 1024 * 1024;

/// The longest record name, `.json` included.
pub const MAX_NAME_LEN: usize = 200;
/// The most records one commit may have of one kind (a planted flood is
/// refused, not read into memory).
pub const MAX_RECORDS: usize = 1000;

const RECORD_SUFFIX: &str = ".json";
const SIGNATURE_SUFFIX: &str = ".sig";

/// Which records: each kind has its own directory beside `objects/`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RecordKind {
    Qualification,
    Promotion,
}

impl RecordKind {
    pub const ALL: [RecordKind; 2] = [RecordKind::Qualification, RecordKind::Promotion];

    /// The directory of this kind's records, relative to the repo.
    pub fn dir_name(self) -> &'static str {
        match self {
            RecordKind::Qualification => "qualifications",
            RecordKind::Promotion => "promotions",
        }
    }

    /// The directory of a commit's records of this kind, relative to the
    /// repo (the same path on a remote).
    pub fn commit_dir(self, commit: &str) -> PathBuf {
        Path::new(self.dir_name()).join(commit)
    }
}

impl std::fmt::Display for RecordKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            RecordKind::Qualification => "qualification",
            RecordKind::Promotion => "promotion",
        })
    }
}

/// One record as stored: its bytes and its signature's, as read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredRecord {
    /// The file name of the `.json`.
    pub name: String,
    pub json: Vec<u8>,
    /// `None` when the `.json.sig` is missing: a verifier refuses such a record.
    pub signature: Option<Vec<u8>>,
}

impl StoredRecord {
    /// The file name of the signature: `<name>.sig`.
    pub fn signature_name(&self) -> String {
        signature_name(&self.name)
    }
}

fn signature_name(name: &str) -> String {
    format!("{name}{SIGNATURE_SUFFIX}")
}

/// What the store refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    #[error("{0:?} is not a commit checksum (64 lowercase hex digits)")]
    BadCommit(String),
    #[error("{name:?} is not a record name: {reason}")]
    BadName { name: String, reason: &'static str },
    #[error("{} is a symlink, which is never read or written through", path.display())]
    Symlink { path: PathBuf },
    #[error("{} is not a directory", path.display())]
    NotADirectory { path: PathBuf },
    #[error("{} is not a regular file", path.display())]
    NotAFile { path: PathBuf },
    #[error("{} is {size} bytes: a record or signature is at most {MAX_FILE_BYTES} bytes", path.display())]
    TooLarge { path: PathBuf, size: u64 },
}

/// Refuses anything but a 64-digit lowercase hex checksum.
pub fn check_commit(commit: &str) -> Result<(), RecordError> {
    let lowercase = commit.bytes().all(|b| !b.is_ascii_uppercase());
    if crate::io::hashing::is_sha256_hex(commit) && lowercase {
        Ok(())
    } else {
        Err(RecordError::BadCommit(commit.to_string()))
    }
}

/// Refuses anything but a plain file name of `[A-Za-z0-9._@+-]` that ends
/// in `.json`, does not start with `.` and is at most [`MAX_NAME_LEN`].
pub fn check_name(name: &str) -> Result<(), RecordError> {
    let bad = |reason| {
        Err(RecordError::BadName {
            name: name.to_string(),
            reason,
        })
    };
    if name.len() > MAX_NAME_LEN {
        return bad("longer than 200 characters");
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"._@+-".contains(&b))
    {
        return bad("only letters, digits and `._@+-` are allowed");
    }
    if name.starts_with('.') {
        return bad("it must not start with `.`");
    }
    if !name.ends_with(RECORD_SUFFIX) {
        return bad("it must end in `.json`");
    }
    Ok(())
}

/// Every record of `kind` for `commit`, sorted by name; empty when the
/// directory is absent. Names that are not record names (temp files, a
/// signature without its record) are ignored.
pub fn list(repo: &Path, kind: RecordKind, commit: &str) -> Result<Vec<StoredRecord>> {
    check_commit(commit)?;
    let root = ImageRoot::open(repo)?;
    let Some(dir) = CommitDir::open(&root, kind, commit, false)? else {
        return Ok(Vec::new());
    };
    let mut names = Vec::new();
    for entry in
        std::fs::read_dir(dir.fd_path()).with_context(|| format!("listing {}", dir.path.display()))?
    {
        let entry = entry.with_context(|| format!("listing {}", dir.path.display()))?;
        if let Some(name) = entry.file_name().to_str()
            && check_name(name).is_ok()
        {
            names.push(name.to_string());
        }
    }
    if names.len() > MAX_RECORDS {
        bail!(
            "{} holds {} records, more than {MAX_RECORDS}: refusing to read them all",
            dir.path.display(),
            names.len()
        );
    }
    names.sort();
    names
        .into_iter()
        .map(|name| {
            let json = dir
                .read(&name)?
                .with_context(|| format!("{} vanished while being listed", dir.path.join(&name).display()))?;
            let signature = dir.read(&signature_name(&name))?;
            Ok(StoredRecord {
                name,
                json,
                signature,
            })
        })
        .collect()
}

/// Stores a record and its signature: the signature first, then the
/// record, each a synced temp file renamed into place. Creates the
/// directories (0755) when missing. Returns the record's path.
pub fn store(
    repo: &Path,
    kind: RecordKind,
    commit: &str,
    name: &str,
    json: &[u8],
    signature: &[u8],
) -> Result<PathBuf> {
    check_commit(commit)?;
    check_name(name)?;
    let rel = kind.commit_dir(commit);
    for (file, data) in [(signature_name(name), signature), (name.to_string(), json)] {
        if data.len() as u64 > MAX_FILE_BYTES {
            let path = repo.join(&rel).join(file);
            return Err(RecordError::TooLarge {
                path,
                size: data.len() as u64,
            }
            .into());
        }
    }
    let root = ImageRoot::open(repo)?;
    CommitDir::open(&root, kind, commit, true)?;
    // The commit dir was just checked to be a real directory; the writes
    // resolve inside the repo and replace (never follow) a link at the name.
    root.write_durable(&rel.join(signature_name(name)), signature, 0o644)?;
    root.write_durable(&rel.join(name), json, 0o644)?;
    Ok(repo.join(rel).join(name))
}

/// A commit's record directory, open: reads go through its descriptor.
struct CommitDir {
    dir: File,
    /// For messages.
    path: PathBuf,
}

impl CommitDir {
    /// Checks (and when `create`, makes) `<kind dir>/<commit>` a real
    /// directory at each level, then opens it. `None` when absent and not
    /// to be created.
    fn open(root: &ImageRoot, kind: RecordKind, commit: &str, create: bool) -> Result<Option<CommitDir>> {
        let rel = kind.commit_dir(commit);
        let Some(meta) = real_dirs(root, &rel, create)? else {
            return Ok(None);
        };
        let path = root.path().join(&rel);
        let dir = root.open_file(&rel)?;
        let opened = dir
            .metadata()
            .with_context(|| format!("reading {}", path.display()))?;
        if !same_inode(&meta, &opened) {
            anyhow::bail!("{} changed while it was being opened", path.display());
        }
        Ok(Some(CommitDir { dir, path }))
    }

    /// The directory through its descriptor: a name joined to it resolves
    /// in this very directory, whatever happens to the path meanwhile.
    fn fd_path(&self) -> PathBuf {
        PathBuf::from(format!("/proc/self/fd/{}", self.dir.as_raw_fd()))
    }

    /// The bytes of regular file `name`, never through a link; `None` when absent.
    fn read(&self, name: &str) -> Result<Option<Vec<u8>>> {
        let (fd_path, path) = (self.fd_path().join(name), self.path.join(name));
        let meta = match std::fs::symlink_metadata(&fd_path) {
            Ok(meta) => meta,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        };
        if meta.file_type().is_symlink() {
            return Err(RecordError::Symlink { path }.into());
        }
        check_file(&meta, &path)?;
        // O_NONBLOCK: a FIFO swapped in after the check does not hang the open.
        let file = super::open_nofollow(&fd_path).with_context(|| format!("opening {}", path.display()))?;
        let opened = file
            .metadata()
            .with_context(|| format!("reading {}", path.display()))?;
        check_file(&opened, &path)?;
        let mut data = Vec::new();
        file.take(MAX_FILE_BYTES + 1)
            .read_to_end(&mut data)
            .with_context(|| format!("reading {}", path.display()))?;
        if data.len() as u64 > MAX_FILE_BYTES {
            let size = data.len() as u64;
            return Err(RecordError::TooLarge { path, size }.into());
        }
        Ok(Some(data))
    }
}

/// Checks that every component of `rel` in `root` is a real directory (a
/// symlink or anything else is an error naming the path), creating the
/// missing ones (0755) when `create`. Returns the last one's metadata, or
/// `None` when one is missing and `create` is false (or `rel` is empty).
pub fn real_dirs(root: &ImageRoot, rel: &Path, create: bool) -> Result<Option<Metadata>> {
    let mut done = PathBuf::new();
    let mut last = None;
    for part in rel.components() {
        let std::path::Component::Normal(name) = part else {
            anyhow::bail!("{} is not a plain relative path", rel.display());
        };
        done.push(name);
        let path = root.path().join(&done);
        let meta = match root.symlink_metadata(&done)? {
            Some(meta) => meta,
            None if create => {
                root.create_dir_all(&done, 0o755)?;
                root.set_mode(&done, 0o755)?;
                root.symlink_metadata(&done)?
                    .with_context(|| format!("{} vanished after being created", path.display()))?
            }
            None => return Ok(None),
        };
        if meta.file_type().is_symlink() {
            return Err(RecordError::Symlink { path }.into());
        }
        if !meta.is_dir() {
            return Err(RecordError::NotADirectory { path }.into());
        }
        last = Some(meta);
    }
    Ok(last)
}

fn same_inode(a: &Metadata, b: &Metadata) -> bool {
    (a.dev(), a.ino()) == (b.dev(), b.ino())
}

/// A regular file of at most [`MAX_FILE_BYTES`].
fn check_file(meta: &Metadata, path: &Path) -> Result<(), RecordError> {
    if !meta.is_file() {
        return Err(RecordError::NotAFile {
            path: path.to_path_buf(),
        });
    }
    if meta.len() > MAX_FILE_BYTES {
        return Err(RecordError::TooLarge {
            path: path.to_path_buf(),
            size: meta.len(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{PermissionsExt, symlink};

    use RecordKind::{Promotion, Qualification};

    const COMMIT: &str = "2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae";

    /// A scratch repo and the directory of COMMIT's records of `kind` in it.
    fn repo(kind: RecordKind) -> (tempfile::TempDir, PathBuf) {
        let repo = tempfile::tempdir().unwrap();
        std::fs::create_dir(repo.path().join("objects")).unwrap();
        let dir = repo.path().join(kind.commit_dir(COMMIT));
        (repo, dir)
    }

    /// Stores a record of COMMIT signed `s`.
    fn put(repo: &tempfile::TempDir, kind: RecordKind, name: &str, json: &[u8]) -> Result<PathBuf> {
        store(repo.path(), kind, COMMIT, name, json, b"s")
    }

    fn listed(repo: &tempfile::TempDir, kind: RecordKind) -> Result<Vec<StoredRecord>> {
        list(repo.path(), kind, COMMIT)
    }

    fn record_error(err: &anyhow::Error) -> &RecordError {
        err.downcast_ref::<RecordError>()
            .unwrap_or_else(|| panic!("not a RecordError: {err:#}"))
    }

    #[test]
    fn round_trip() {
        let (repo, dir) = repo(Qualification);
        let (name, json, signature) = (
            "rt-latency@lab+1.json",
            b"{\"ok\":true}",
            b"-----BEGIN PGP SIGNATURE-----\n",
        );
        let path = store(repo.path(), Qualification, COMMIT, name, json, signature).unwrap();
        assert_eq!(path, dir.join(name));
        assert_eq!(std::fs::read(&path).unwrap(), json);
        assert_eq!(
            std::fs::read(dir.join("rt-latency@lab+1.json.sig")).unwrap(),
            signature
        );
        for d in [repo.path().join("qualifications"), dir.clone()] {
            assert_eq!(std::fs::metadata(&d).unwrap().permissions().mode() & 0o777, 0o755);
        }
        let record = StoredRecord {
            name: name.into(),
            json: json.to_vec(),
            signature: Some(signature.to_vec()),
        };
        assert_eq!(listed(&repo, Qualification).unwrap(), vec![record]);
        // The other kind is another directory, absent: empty.
        assert_eq!(listed(&repo, Promotion).unwrap(), vec![]);
        // Storing again replaces both; nothing is left beside them.
        put(&repo, Qualification, name, b"2").unwrap();
        let again = &listed(&repo, Qualification).unwrap()[0];
        assert_eq!(
            (&again.json[..], again.signature.as_deref()),
            (&b"2"[..], Some(&b"s"[..]))
        );
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 2);
    }

    #[test]
    fn listing_is_sorted_by_name() {
        let (repo, dir) = repo(Promotion);
        for name in ["b.json", "a.json", "c-1.json", "C.json"] {
            put(&repo, Promotion, name, name.as_bytes()).unwrap();
        }
        let names: Vec<_> = listed(&repo, Promotion)
            .unwrap()
            .into_iter()
            .map(|r| r.name)
            .collect();
        assert_eq!(names, ["C.json", "a.json", "b.json", "c-1.json"]);
        assert!(dir.join("a.json.sig").is_file());
    }

    #[test]
    fn a_symlinked_directory_is_refused() {
        let (repo, link) = repo(Qualification);
        let elsewhere = tempfile::tempdir().unwrap();
        std::fs::write(elsewhere.path().join("planted.json"), b"{}").unwrap();
        std::fs::create_dir(link.parent().unwrap()).unwrap();
        symlink(elsewhere.path(), &link).unwrap();
        for err in [
            listed(&repo, Qualification).unwrap_err(),
            put(&repo, Qualification, "x.json", b"{}").unwrap_err(),
        ] {
            assert_eq!(record_error(&err), &RecordError::Symlink { path: link.clone() });
            assert!(
                format!("{err:#}").contains(&link.display().to_string()),
                "{err:#}"
            );
        }
        let planted = std::fs::read_dir(elsewhere.path()).unwrap().count();
        assert_eq!(planted, 1, "written through the link");

        // The kind dir as a link, even to a directory inside the repo.
        std::fs::create_dir_all(repo.path().join("objects").join(COMMIT)).unwrap();
        symlink("objects", repo.path().join("promotions")).unwrap();
        let err = listed(&repo, Promotion).unwrap_err();
        let path = repo.path().join("promotions");
        assert_eq!(record_error(&err), &RecordError::Symlink { path });

        // A file where the commit dir goes.
        std::fs::remove_file(&link).unwrap();
        std::fs::write(&link, b"").unwrap();
        let err = put(&repo, Qualification, "x.json", b"{}").unwrap_err();
        assert_eq!(record_error(&err), &RecordError::NotADirectory { path: link });
    }

    #[test]
    fn a_symlinked_record_or_signature_is_refused() {
        let (repo, dir) = repo(Qualification);
        let secret = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(secret.path(), b"host secret").unwrap();
        put(&repo, Qualification, "a.json", b"{}").unwrap();
        // Its signature's place goes to a planted link below.
        std::fs::remove_file(dir.join("a.json.sig")).unwrap();
        // Links as a record and as a signature; a directory named like a record.
        for (planted, link) in [("b.json", true), ("a.json.sig", true), ("d.json", false)] {
            let path = dir.join(planted);
            let expected = if link {
                symlink(secret.path(), &path).unwrap();
                RecordError::Symlink { path: path.clone() }
            } else {
                std::fs::create_dir(&path).unwrap();
                RecordError::NotAFile { path: path.clone() }
            };
            let err = listed(&repo, Qualification).unwrap_err();
            assert_eq!(record_error(&err), &expected);
            std::fs::remove_file(&path)
                .or_else(|_| std::fs::remove_dir(&path))
                .unwrap();
        }
        assert_eq!(std::fs::read(secret.path()).unwrap(), b"host secret");
    }

    #[test]
    fn oversize_files_are_refused() {
        let (repo, dir) = repo(Promotion);
        let path = put(&repo, Promotion, "big.json", b"{}").unwrap();
        let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        file.set_len(MAX_FILE_BYTES + 1).unwrap();
        let err = listed(&repo, Promotion).unwrap_err();
        let size = MAX_FILE_BYTES + 1;
        assert_eq!(record_error(&err), &RecordError::TooLarge { path, size });
        // Exactly the limit is fine.
        file.set_len(MAX_FILE_BYTES).unwrap();
        let json = &listed(&repo, Promotion).unwrap()[0].json;
        assert_eq!(json.len() as u64, MAX_FILE_BYTES);

        let big = vec![b' '; MAX_FILE_BYTES as usize + 1];
        let err = put(&repo, Promotion, "b.json", &big).unwrap_err();
        assert!(
            matches!(record_error(&err), RecordError::TooLarge { .. }),
            "{err:#}"
        );
        let err = store(repo.path(), Promotion, COMMIT, "b.json", b"{}", &big).unwrap_err();
        assert!(
            matches!(record_error(&err), RecordError::TooLarge { .. }),
            "{err:#}"
        );
        assert!(!dir.join("b.json.sig").exists());
    }

    #[test]
    fn bad_commits_and_names_are_refused() {
        let (repo, _) = repo(Qualification);
        for commit in [
            "",
            "2c26",
            &COMMIT.to_uppercase(),
            &format!("{COMMIT}0"),
            &"zz".repeat(32),
            &format!("../{}", &COMMIT[3..]),
        ] {
            let bad = RecordError::BadCommit(commit.to_string());
            let err = list(repo.path(), Qualification, commit).unwrap_err();
            assert_eq!(record_error(&err), &bad);
            let err = store(repo.path(), Qualification, commit, "a.json", b"{}", b"s").unwrap_err();
            assert_eq!(record_error(&err), &bad);
        }
        let long = format!("{}.json", "a".repeat(MAX_NAME_LEN - 4));
        for name in [
            "",
            ".json",
            ".hidden.json",
            "a.json.sig",
            "a.txt",
            "../a.json",
            "a/b.json",
            "a b.json",
            "ä.json",
            "a\n.json",
            &long,
        ] {
            let err = put(&repo, Qualification, name, b"{}").unwrap_err();
            assert!(
                matches!(record_error(&err), RecordError::BadName { .. }),
                "{name:?}: {err:#}"
            );
        }
        check_name(&long[1..]).unwrap();
        check_name("A-z_0.9@x+y.json").unwrap();
        assert!(
            !repo.path().join("qualifications").exists(),
            "a refused store wrote"
        );
    }

    #[test]
    fn a_missing_signature_is_listed_as_none() {
        let (repo, dir) = repo(Qualification);
        put(&repo, Qualification, "a.json", b"{}").unwrap();
        std::fs::write(dir.join("unsigned.json"), b"{\"u\":1}").unwrap();
        let records = listed(&repo, Qualification).unwrap();
        assert_eq!(records.len(), 2);
        assert_eq!(records[1].name, "unsigned.json");
        assert_eq!(records[1].json, b"{\"u\":1}");
        assert_eq!(records[1].signature, None);
    }

    #[test]
    fn temp_leftovers_and_strays_are_ignored() {
        let (repo, dir) = repo(Qualification);
        put(&repo, Qualification, "a.json", b"{}").unwrap();
        // What a kill mid-store leaves (ImageRoot's temp names), and strays.
        for stray in [
            ".imgbuild-123-0",
            ".tmp-x",
            ".x.json",
            "orphan.json.sig",
            "notes.txt",
        ] {
            std::fs::write(dir.join(stray), b"half").unwrap();
        }
        let names: Vec<_> = listed(&repo, Qualification)
            .unwrap()
            .into_iter()
            .map(|r| r.name)
            .collect();
        assert_eq!(names, ["a.json"]);
    }
}
