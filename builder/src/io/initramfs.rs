//! Reproducible initramfs archives: cpio newc with sorted entries (parents
//! before children), fixed mtimes and inode numbers, compressed with a codec
//! the kernel was built to unpack.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::fs::File;
use std::io::{self, BufWriter, Read, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};

use anyhow::{Context, Result, bail};
use rtcheck::kconfig::Config;

use emberrtos_contract::io::root::ImageRoot;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Data {
    Bytes(Vec<u8>),
    /// Read when the archive is written.
    Path(PathBuf),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Node {
    Dir,
    File(Data),
    Symlink(String),
    CharDevice { major: u32, minor: u32 },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub node: Node,
    /// Permission bits (with setuid/setgid/sticky).
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
}

/// An archive under construction, keyed by path without a leading `/`.
#[derive(Clone, Debug, Default)]
pub struct Archive {
    entries: BTreeMap<String, Entry>,
}

fn normalize(path: &str) -> Result<String> {
    let mut parts = Vec::new();
    for component in Path::new(path).components() {
        match component {
            Component::Normal(p) => parts.push(p.to_str().context("non-UTF-8 path")?.to_string()),
            Component::RootDir | Component::CurDir => {}
            _ => bail!("archive path {path:?} must not contain `..`"),
        }
    }
    if parts.is_empty() {
        bail!("empty archive path");
    }
    Ok(parts.join("/"))
}

impl Archive {
    pub fn new() -> Self {
        Archive::default()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn get(&self, path: &str) -> Option<&Entry> {
        self.entries.get(path.trim_start_matches('/'))
    }

    /// Paths in archive order.
    pub fn paths(&self) -> impl Iterator<Item = &str> {
        self.entries.keys().map(String::as_str)
    }

    /// Adds (or replaces) an entry, creating missing parent directories (0755).
    /// A parent that is a symlink or a file is refused: the kernel would
    /// follow it or drop the entry, so the archive would not mean what it says.
    /// A directory with entries below it is only ever replaced by a directory.
    pub fn insert(&mut self, path: &str, entry: Entry) -> Result<()> {
        let path = normalize(path)?;
        let mut parent = Path::new(&path).parent();
        while let Some(p) = parent.filter(|p| !p.as_os_str().is_empty()) {
            let key = p.to_str().expect("utf-8").to_string();
            let existing = self.entries.entry(key.clone()).or_insert(Entry {
                node: Node::Dir,
                mode: 0o755,
                uid: 0,
                gid: 0,
            });
            if existing.node != Node::Dir {
                bail!("cannot add /{path} to the archive: its parent /{key} is not a directory");
            }
            parent = p.parent();
        }
        if entry.node != Node::Dir && self.has_children(&path) {
            bail!("cannot replace the directory /{path} in the archive: it has entries");
        }
        self.entries.insert(path, entry);
        Ok(())
    }

    fn has_children(&self, dir: &str) -> bool {
        let prefix = format!("{dir}/");
        self.entries
            .range(prefix.clone()..)
            .next()
            .is_some_and(|(key, _)| key.starts_with(&prefix))
    }

    /// Follows `path` through the archive's own symlinks, as the kernel will
    /// once it is unpacked as `/`, to the regular file it names.
    pub fn resolve_file(&self, path: &str) -> Result<String> {
        let resolved = walk_links(Path::new(path), |here| {
            Ok(match here.to_str().and_then(|key| self.entries.get(key)) {
                None => Step::Missing,
                Some(Entry {
                    node: Node::Symlink(target),
                    ..
                }) => Step::Link(PathBuf::from(target)),
                Some(Entry { node: Node::Dir, .. }) => Step::Dir,
                Some(_) => Step::Other,
            })
        })?
        .with_context(|| {
            format!(
                "/{} does not lead to anything in the archive",
                path.trim_start_matches('/')
            )
        })?;
        let key = utf8(&resolved.path)?;
        match self.entries.get(key) {
            Some(Entry {
                node: Node::File(_), ..
            }) => Ok(key.to_string()),
            _ => bail!(
                "/{} leads to /{key}, which is not a file in the archive",
                path.trim_start_matches('/')
            ),
        }
    }

    pub fn dir(&mut self, path: &str, mode: u32) -> Result<()> {
        self.insert(
            path,
            Entry {
                node: Node::Dir,
                mode,
                uid: 0,
                gid: 0,
            },
        )
    }

    pub fn file(&mut self, path: &str, mode: u32, data: Data) -> Result<()> {
        self.insert(
            path,
            Entry {
                node: Node::File(data),
                mode,
                uid: 0,
                gid: 0,
            },
        )
    }

    pub fn symlink(&mut self, path: &str, target: &str) -> Result<()> {
        self.insert(
            path,
            Entry {
                node: Node::Symlink(target.into()),
                mode: 0o777,
                uid: 0,
                gid: 0,
            },
        )
    }

    /// Adds a whole directory tree under `prefix`, keeping modes, owners and
    /// symlinks; hard links become separate files.
    pub fn add_tree(&mut self, source: &Path, prefix: &str) -> Result<usize> {
        let mut added = 0;
        for entry in walkdir::WalkDir::new(source).min_depth(1).sort_by_file_name() {
            let entry = entry.with_context(|| format!("walking {}", source.display()))?;
            let rel = entry
                .path()
                .strip_prefix(source)
                .expect("inside")
                .to_str()
                .context("non-UTF-8 path")?;
            let path = format!("{prefix}/{rel}");
            let meta = entry.path().symlink_metadata()?;
            let node = if meta.file_type().is_symlink() {
                Node::Symlink(
                    std::fs::read_link(entry.path())?
                        .to_str()
                        .context("non-UTF-8 link")?
                        .to_string(),
                )
            } else if meta.is_dir() {
                Node::Dir
            } else if meta.is_file() {
                Node::File(Data::Path(entry.path().to_path_buf()))
            } else {
                // Device nodes are created by devtmpfs at boot.
                continue;
            };
            self.insert(
                &path,
                Entry {
                    node,
                    mode: meta.mode() & 0o7777,
                    uid: meta.uid(),
                    gid: meta.gid(),
                },
            )?;
            added += 1;
        }
        Ok(added)
    }

    /// Writes the uncompressed cpio newc stream.
    pub fn write_cpio(&self, out: impl Write, mtime: u32) -> Result<()> {
        use cpio::newc::{Builder, ModeFileType, trailer};
        let mut out = out;
        for (ino, (path, entry)) in self.entries.iter().enumerate() {
            let (kind, data): (ModeFileType, Option<Vec<u8>>) = match &entry.node {
                Node::Dir => (ModeFileType::Directory, None),
                Node::File(Data::Bytes(b)) => (ModeFileType::Regular, Some(b.clone())),
                Node::File(Data::Path(p)) => {
                    let mut bytes = Vec::new();
                    File::open(p)
                        .and_then(|mut f| f.read_to_end(&mut bytes))
                        .with_context(|| format!("reading {}", p.display()))?;
                    (ModeFileType::Regular, Some(bytes))
                }
                Node::Symlink(target) => (ModeFileType::Symlink, Some(target.as_bytes().to_vec())),
                Node::CharDevice { .. } => (ModeFileType::Char, None),
            };
            let mut builder = Builder::new(path)
                .ino(ino as u32 + 1)
                .uid(entry.uid)
                .gid(entry.gid)
                .mode(entry.mode)
                .set_mode_file_type(kind)
                .mtime(mtime)
                .nlink(if matches!(entry.node, Node::Dir) { 2 } else { 1 });
            if let Node::CharDevice { major, minor } = entry.node {
                builder = builder.rdev_major(major).rdev_minor(minor);
            }
            let data = data.unwrap_or_default();
            let size = u32::try_from(data.len()).with_context(|| format!("{path} is larger than 4 GiB"))?;
            let mut writer = builder.write(&mut out, size);
            writer.write_all(&data)?;
            writer.finish()?;
        }
        trailer(&mut out)?;
        Ok(())
    }

    /// Writes the compressed archive to `path` and returns its sha256.
    pub fn write_compressed(&self, path: &Path, codec: Codec, mtime: u32) -> Result<String> {
        let file = File::create(path).with_context(|| format!("creating {}", path.display()))?;
        let hashing = crate::io::hashing::HashingWriter::new(BufWriter::with_capacity(1 << 20, file));
        let hashing = match codec {
            Codec::Gzip => {
                let mut encoder = flate2::GzBuilder::new()
                    .mtime(0)
                    .write(hashing, flate2::Compression::new(6));
                self.write_cpio(&mut encoder, mtime)?;
                encoder.finish()?
            }
            Codec::Zstd => {
                let mut encoder = zstd::Encoder::new(hashing, 10)?;
                encoder.include_checksum(true)?;
                self.write_cpio(&mut encoder, mtime)?;
                encoder.finish()?
            }
        };
        let (digest, buffered) = hashing.finish();
        buffered
            .into_inner()
            .map_err(|e| io::Error::other(e.to_string()))?
            .sync_all()?;
        Ok(digest)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Codec {
    Gzip,
    Zstd,
}

/// The best initramfs codec the kernel config can unpack.
pub fn codec_for(config: &Config) -> Result<Codec> {
    if config.is_enabled("CONFIG_RD_ZSTD") {
        Ok(Codec::Zstd)
    } else if config.is_enabled("CONFIG_RD_GZIP") {
        Ok(Codec::Gzip)
    } else {
        bail!(
            "the kernel config enables neither CONFIG_RD_ZSTD nor CONFIG_RD_GZIP: it cannot unpack an initramfs"
        )
    }
}

/// Where a path leads inside a tree: the symlinks crossed on the way (each
/// with its target as written) and the final path, which crosses none.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resolved {
    pub links: Vec<(PathBuf, PathBuf)>,
    pub path: PathBuf,
}

/// What a tree (an image root or an archive) holds at a path.
enum Step {
    Missing,
    Link(PathBuf),
    Dir,
    Other,
}

/// Linux's limit on symlinks followed in one lookup.
const MAX_LINKS: usize = 40;

/// Follows `path` through the symlinks of a tree the way the target's kernel
/// would with that tree as `/`: absolute targets restart at the root and
/// `..` stops there. None when the path does not exist.
fn walk_links(path: &Path, mut lookup: impl FnMut(&Path) -> Result<Step>) -> Result<Option<Resolved>> {
    // A stack of names still to walk, the next one on top; None means `/`.
    let mut todo: Vec<Option<OsString>> = Vec::new();
    let stack = |todo: &mut Vec<Option<OsString>>, path: &Path| {
        for component in path.components().rev() {
            match component {
                Component::RootDir => todo.push(None),
                Component::CurDir | Component::Prefix(_) => {}
                other => todo.push(Some(other.as_os_str().to_os_string())),
            }
        }
    };
    stack(&mut todo, path);
    let (mut done, mut links) = (PathBuf::new(), Vec::new());
    while let Some(part) = todo.pop() {
        let Some(name) = part else {
            done = PathBuf::new();
            continue;
        };
        if name == ".." {
            done.pop();
            continue;
        }
        let here = done.join(&name);
        match lookup(&here)? {
            Step::Missing => return Ok(None),
            Step::Link(target) => {
                if links.len() == MAX_LINKS {
                    bail!("too many levels of symlinks resolving {}", path.display());
                }
                stack(&mut todo, &target);
                links.push((here, target));
            }
            Step::Dir => done = here,
            Step::Other if todo.is_empty() => done = here,
            Step::Other => return Ok(None),
        }
    }
    Ok(Some(Resolved { links, path: done }))
}

/// Resolves `path` inside an image tree; the host is never consulted.
pub fn resolve_in_tree(root: &ImageRoot, path: &Path) -> Result<Option<Resolved>> {
    walk_links(path, |here| {
        Ok(match root.symlink_metadata(here)? {
            None => Step::Missing,
            Some(meta) if meta.file_type().is_symlink() => Step::Link(root.read_link(here)?),
            Some(meta) if meta.is_dir() => Step::Dir,
            Some(_) => Step::Other,
        })
    })
}

/// Where the loader of `arch` looks for libraries when there is no
/// ld.so.cache: Debian's multiarch directories first.
fn library_dirs(arch: rtcheck::Arch) -> [String; 6] {
    let multiarch = arch.multiarch();
    [
        format!("lib/{multiarch}"),
        format!("usr/lib/{multiarch}"),
        "lib64".into(),
        "usr/lib64".into(),
        "lib".into(),
        "usr/lib".into(),
    ]
}

/// Adds a dynamically linked program from the image tree `root` with its
/// loader and the shared libraries it needs, all read inside the tree. Every
/// symlink crossed on the way (`lib64 -> usr/lib64`, the loader's link into
/// the multiarch dir) is added as it is in the tree, so each path the
/// program and the loader use leads to a file in the archive.
pub fn add_program_with_libraries(archive: &mut Archive, root: &ImageRoot, program: &str) -> Result<()> {
    let mut pending = vec![program.to_string()];
    let mut done = BTreeSet::new();
    while let Some(path) = pending.pop() {
        if !done.insert(path.clone()) {
            continue;
        }
        let bytes = add_from_tree(archive, root, &path)?;
        let dynamic =
            rtcheck::elf::dynamic(&bytes).with_context(|| format!("reading ELF headers of {path}"))?;
        pending.extend(dynamic.interpreter);
        let arch = rtcheck::elf::header(&bytes)
            .and_then(|header| header.arch())
            .with_context(|| format!("{path} is not a program for a machine imgbuild builds for"))?;
        for library in dynamic.needed {
            let found = find_library(root, &library, arch)?
                .with_context(|| format!("{path} needs {library}, which is not in the image tree"))?;
            pending.push(found);
        }
    }
    for path in &done {
        archive
            .resolve_file(path)
            .with_context(|| format!("the archive is inconsistent for {path}"))?;
    }
    Ok(())
}

/// Adds the file at `path` in the tree, and the symlinks that lead to it;
/// returns its bytes.
fn add_from_tree(archive: &mut Archive, root: &ImageRoot, path: &str) -> Result<Vec<u8>> {
    let resolved = resolve_in_tree(root, Path::new(path))?
        .with_context(|| format!("{path} is not in the image tree {}", root.path().display()))?;
    for (link, target) in &resolved.links {
        archive.symlink(utf8(link)?, utf8(target)?)?;
    }
    let meta = root
        .symlink_metadata(&resolved.path)?
        .filter(|m| m.is_file())
        .with_context(|| format!("{path} is not a regular file in the image tree"))?;
    let bytes = root.read(&resolved.path)?;
    archive.file(
        utf8(&resolved.path)?,
        meta.mode() & 0o7777,
        Data::Bytes(bytes.clone()),
    )?;
    Ok(bytes)
}

/// The path, in one of the loader's directories, of `library` in the tree.
fn find_library(root: &ImageRoot, library: &str, arch: rtcheck::Arch) -> Result<Option<String>> {
    if library.contains('/') {
        return Ok(Some(library.to_string()));
    }
    for dir in library_dirs(arch) {
        let candidate = format!("/{dir}/{library}");
        let resolved = resolve_in_tree(root, Path::new(&candidate))?;
        if resolved.is_some_and(|r| {
            root.symlink_metadata(&r.path)
                .ok()
                .flatten()
                .is_some_and(|m| m.is_file())
        }) {
            return Ok(Some(candidate));
        }
    }
    Ok(None)
}

fn utf8(path: &Path) -> Result<&str> {
    path.to_str()
        .with_context(|| format!("non-UTF-8 path {}", path.display()))
}

/// What [`unpack`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Unpacked {
    pub entries: usize,
    /// Entries the kernel would drop too: their parent is missing or is not a
    /// directory once links are followed.
    pub skipped: Vec<String>,
}

/// Unpacks an uncompressed cpio newc stream into `root` the way the kernel
/// populates its rootfs: entries in order, a parent must already exist
/// (through links), owners are not kept. For checks that run what an
/// initramfs holds.
pub fn unpack(cpio_bytes: &[u8], root: &ImageRoot) -> Result<Unpacked> {
    let mut unpacked = Unpacked::default();
    let mut reader = cpio_bytes;
    loop {
        let mut entry = cpio::NewcReader::new(reader).context("reading a cpio header")?;
        if entry.entry().is_trailer() {
            return Ok(unpacked);
        }
        let name = entry.entry().name().to_string();
        let mode = entry.entry().mode();
        let mut data = Vec::new();
        entry
            .read_to_end(&mut data)
            .with_context(|| format!("reading {name} from the cpio"))?;
        reader = entry.finish()?;
        let rel = Path::new(&name);
        let parent = rel.parent().unwrap_or(Path::new(""));
        if !parent.as_os_str().is_empty() && !root.is_dir(parent) {
            unpacked.skipped.push(name);
            continue;
        }
        match mode & 0o170000 {
            0o040000 => root.create_dir_all(rel, mode & 0o7777)?,
            0o100000 => root.write(rel, &data, mode & 0o7777)?,
            0o120000 => root.symlink(
                rel,
                Path::new(std::str::from_utf8(&data).context("non-UTF-8 link")?),
            )?,
            _ => {
                unpacked.skipped.push(name);
                continue;
            }
        }
        unpacked.entries += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_back(bytes: &[u8]) -> Vec<(String, u32, Vec<u8>)> {
        let mut out = Vec::new();
        let mut reader = bytes;
        loop {
            let entry = cpio::NewcReader::new(reader).unwrap();
            if entry.entry().is_trailer() {
                break;
            }
            let name = entry.entry().name().to_string();
            let mode = entry.entry().mode();
            let mut data = Vec::new();
            let mut entry = entry;
            entry.read_to_end(&mut data).unwrap();
            reader = entry.finish().unwrap();
            out.push((name, mode, data));
        }
        out
    }

    #[test]
    fn sorted_with_parents_first_and_reproducible() {
        let mut archive = Archive::new();
        archive
            .file("/usr/bin/tool", 0o4755, Data::Bytes(b"#!/bin/sh\n".to_vec()))
            .unwrap();
        archive.symlink("/bin", "usr/bin").unwrap();
        archive
            .file("/init", 0o755, Data::Bytes(b"init".to_vec()))
            .unwrap();
        archive.dir("/tmp", 0o1777).unwrap();
        let mut first = Vec::new();
        archive.write_cpio(&mut first, 1000).unwrap();
        let mut second = Vec::new();
        archive.write_cpio(&mut second, 1000).unwrap();
        assert_eq!(first, second);
        let entries = read_back(&first);
        let names: Vec<&str> = entries.iter().map(|e| e.0.as_str()).collect();
        assert_eq!(names, ["bin", "init", "tmp", "usr", "usr/bin", "usr/bin/tool"]);
        let tool = entries.iter().find(|e| e.0 == "usr/bin/tool").unwrap();
        assert_eq!(tool.1 & 0o7777, 0o4755);
        assert_eq!(tool.1 & 0o170000, 0o100000);
        assert_eq!(entries[0].2, b"usr/bin");
        assert_eq!(entries[2].1 & 0o7777, 0o1777);
    }

    #[test]
    fn refuses_parent_components() {
        assert!(Archive::new().dir("../x", 0o755).is_err());
        assert!(Archive::new().dir("/", 0o755).is_err());
    }

    #[test]
    fn compressed_archives_are_stable() {
        let dir = tempfile::tempdir().unwrap();
        let mut archive = Archive::new();
        archive.file("init", 0o755, Data::Bytes(vec![7; 10_000])).unwrap();
        for codec in [Codec::Gzip, Codec::Zstd] {
            let a = archive.write_compressed(&dir.path().join("a"), codec, 5).unwrap();
            let b = archive.write_compressed(&dir.path().join("b"), codec, 5).unwrap();
            assert_eq!(a, b, "{codec:?}");
        }
    }

    #[test]
    fn codec_follows_the_kernel_config() {
        assert_eq!(
            codec_for(&Config::parse("CONFIG_RD_ZSTD=y\nCONFIG_RD_GZIP=y\n").unwrap()).unwrap(),
            Codec::Zstd
        );
        assert_eq!(
            codec_for(&Config::parse("CONFIG_RD_GZIP=y\n").unwrap()).unwrap(),
            Codec::Gzip
        );
        assert!(codec_for(&Config::parse("# CONFIG_RD_GZIP is not set\n").unwrap()).is_err());
    }

    #[test]
    fn program_with_libraries_from_a_root() {
        let mut archive = Archive::new();
        let host = ImageRoot::open(Path::new("/")).unwrap();
        add_program_with_libraries(&mut archive, &host, "/usr/bin/ls").unwrap();
        assert!(archive.get("usr/bin/ls").is_some());
        assert!(
            archive.paths().any(|p| p.contains("libc.so")),
            "{:?}",
            archive.paths().collect::<Vec<_>>()
        );
        archive.resolve_file("/lib64/ld-linux-x86-64.so.2").unwrap();
    }

    use std::os::unix::fs::symlink;

    /// A merged-/usr tree whose loader link is absolute, as on Debian bookworm.
    fn linked_tree() -> (tempfile::TempDir, ImageRoot) {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::create_dir_all(d.join("usr/lib/x86_64-linux-gnu")).unwrap();
        std::fs::create_dir_all(d.join("usr/lib64")).unwrap();
        std::fs::write(d.join("usr/lib/x86_64-linux-gnu/ld.so"), "loader").unwrap();
        symlink("/usr/lib64", d.join("lib64")).unwrap();
        symlink("usr/lib", d.join("lib")).unwrap();
        symlink("/lib/x86_64-linux-gnu/ld.so", d.join("usr/lib64/ld.so")).unwrap();
        symlink("../../../../..", d.join("up")).unwrap();
        symlink("loop-b", d.join("loop-a")).unwrap();
        symlink("loop-a", d.join("loop-b")).unwrap();
        let root = ImageRoot::open(d).unwrap();
        (dir, root)
    }

    #[test]
    fn resolves_links_inside_the_tree_only() {
        let (_dir, root) = linked_tree();
        let resolved = resolve_in_tree(&root, Path::new("/lib64/ld.so"))
            .unwrap()
            .unwrap();
        assert_eq!(resolved.path, Path::new("usr/lib/x86_64-linux-gnu/ld.so"));
        let links: Vec<_> = resolved
            .links
            .iter()
            .map(|(l, t)| (l.to_str().unwrap(), t.to_str().unwrap()))
            .collect();
        assert_eq!(
            links,
            [
                ("lib64", "/usr/lib64"),
                ("usr/lib64/ld.so", "/lib/x86_64-linux-gnu/ld.so"),
                ("lib", "usr/lib")
            ]
        );
        let up = resolve_in_tree(&root, Path::new("up/usr/lib64/../lib64/ld.so"))
            .unwrap()
            .unwrap();
        assert_eq!(up.path, Path::new("usr/lib/x86_64-linux-gnu/ld.so"));
        assert_eq!(
            resolve_in_tree(&root, Path::new("/usr/bin/missing")).unwrap(),
            None
        );
        assert_eq!(resolve_in_tree(&root, Path::new("lib64/ld.so/x")).unwrap(), None);
        let looped = resolve_in_tree(&root, Path::new("loop-a/x")).unwrap_err();
        assert!(format!("{looped:#}").contains("too many levels"), "{looped:#}");
    }

    #[test]
    fn archive_paths_never_sit_under_a_link() {
        let mut archive = Archive::new();
        archive.symlink("lib64", "usr/lib64").unwrap();
        let err = archive
            .file("lib64/ld.so", 0o755, Data::Bytes(vec![]))
            .unwrap_err();
        assert!(err.to_string().contains("/lib64 is not a directory"), "{err}");
        archive
            .file("usr/lib/x/ld.so", 0o755, Data::Bytes(vec![]))
            .unwrap();
        assert!(archive.symlink("usr/lib", "/elsewhere").is_err());
        // The link dangles: `usr/lib64` is not in the archive.
        assert!(archive.resolve_file("lib64/ld.so").is_err());
        archive.symlink("usr/lib64/ld.so", "/usr/lib/x/ld.so").unwrap();
        assert_eq!(archive.resolve_file("/lib64/ld.so").unwrap(), "usr/lib/x/ld.so");
        assert!(
            archive.resolve_file("usr/lib").is_err(),
            "a directory is not a file"
        );
    }

    #[test]
    fn the_loader_and_its_links_come_from_the_tree() {
        let (_dir, root) = linked_tree();
        let mut archive = Archive::new();
        add_from_tree(&mut archive, &root, "/lib64/ld.so").unwrap();
        assert_eq!(
            archive.get("lib64").unwrap().node,
            Node::Symlink("/usr/lib64".into())
        );
        assert_eq!(archive.get("lib").unwrap().node, Node::Symlink("usr/lib".into()));
        assert_eq!(
            archive.get("usr/lib/x86_64-linux-gnu/ld.so").unwrap().node,
            Node::File(Data::Bytes(b"loader".to_vec()))
        );
        assert_eq!(
            archive.resolve_file("lib64/ld.so").unwrap(),
            "usr/lib/x86_64-linux-gnu/ld.so"
        );
    }

    /// The cpio the old code made: a file under `lib64 -> usr/lib64` with no `usr/lib64`.
    #[test]
    fn unpack_drops_what_the_kernel_drops() {
        use cpio::newc::{Builder, ModeFileType, trailer};
        let mut cpio = Vec::new();
        for (name, kind, mode, data) in [
            ("lib64", ModeFileType::Symlink, 0o777, &b"usr/lib64"[..]),
            ("lib64/ld.so", ModeFileType::Regular, 0o755, b"host loader"),
            ("usr", ModeFileType::Directory, 0o755, b""),
            ("usr/bin", ModeFileType::Directory, 0o755, b""),
            ("usr/bin/tool", ModeFileType::Regular, 0o4755, b"tool"),
        ] {
            let builder = Builder::new(name).mode(mode).set_mode_file_type(kind);
            let mut writer = builder.write(&mut cpio, data.len() as u32);
            writer.write_all(data).unwrap();
            writer.finish().unwrap();
        }
        trailer(&mut cpio).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let unpacked = unpack(&cpio, &ImageRoot::open(dir.path()).unwrap()).unwrap();
        assert_eq!(unpacked.skipped, ["lib64/ld.so"]);
        assert_eq!(unpacked.entries, 4);
        assert!(!dir.path().join("usr/lib64").exists());
        let tool = dir.path().join("usr/bin/tool");
        assert_eq!(std::fs::read(&tool).unwrap(), b"tool");
        assert_eq!(std::fs::metadata(&tool).unwrap().mode() & 0o7777, 0o4755);
    }
}
