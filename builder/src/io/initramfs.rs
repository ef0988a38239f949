//! Reproducible initramfs archives: cpio newc with sorted entries (parents
//! before children), fixed mtimes and inode numbers, compressed with a codec
//! the kernel was built to unpack.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, BufWriter, Read, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use anyhow::{Context, Result, bail};
use rtcheck::kconfig::Config;

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
    pub fn insert(&mut self, path: &str, entry: Entry) -> Result<()> {
        let path = normalize(path)?;
        let mut parent = Path::new(&path).parent();
        while let Some(p) = parent.filter(|p| !p.as_os_str().is_empty()) {
            let key = p.to_str().expect("utf-8").to_string();
            self.entries.entry(key).or_insert(Entry {
                node: Node::Dir,
                mode: 0o755,
                uid: 0,
                gid: 0,
            });
            parent = p.parent();
        }
        self.entries.insert(path, entry);
        Ok(())
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

/// Adds a dynamically linked program from `root` with its loader and the
/// shared libraries it needs (found in `root`'s library directories).
pub fn add_program_with_libraries(archive: &mut Archive, root: &Path, program: &str) -> Result<()> {
    const LIB_DIRS: &[&str] = &[
        "usr/lib/x86_64-linux-gnu",
        "lib/x86_64-linux-gnu",
        "usr/lib64",
        "lib64",
        "usr/lib",
        "lib",
    ];
    let mut pending = vec![program.trim_start_matches('/').to_string()];
    let mut done = std::collections::BTreeSet::new();
    while let Some(rel) = pending.pop() {
        if !done.insert(rel.clone()) {
            continue;
        }
        let host_path = root.join(&rel);
        let bytes = std::fs::read(&host_path).with_context(|| format!("reading {}", host_path.display()))?;
        let mode = std::fs::metadata(&host_path)?.permissions().mode() & 0o7777;
        archive.file(&rel, mode, Data::Bytes(bytes.clone()))?;
        let dynamic =
            rtcheck::elf::dynamic(&bytes).with_context(|| format!("reading ELF headers of {rel}"))?;
        if let Some(interp) = dynamic.interpreter {
            let interp_rel = interp.trim_start_matches('/').to_string();
            let real = std::fs::canonicalize(root.join(&interp_rel)).ok();
            // The loader path is usually a symlink into the multiarch dir; keep both.
            if let Some(real) = real.and_then(|r| r.strip_prefix(root).ok().map(Path::to_path_buf)) {
                let real = real.to_str().context("non-UTF-8 path")?.to_string();
                if real != interp_rel {
                    archive.symlink(&interp_rel, &format!("/{real}"))?;
                }
                pending.push(real);
            } else {
                pending.push(interp_rel);
            }
        }
        for library in dynamic.needed {
            let found = LIB_DIRS
                .iter()
                .map(|dir| format!("{dir}/{library}"))
                .find(|candidate| root.join(candidate).exists())
                .with_context(|| format!("{rel} needs {library}, which is not in the rootfs"))?;
            let real = std::fs::canonicalize(root.join(&found))?;
            let real_rel = real
                .strip_prefix(root)
                .unwrap_or(&real)
                .to_str()
                .context("non-UTF-8 path")?
                .to_string();
            if real_rel != found {
                archive.symlink(&found, &format!("/{real_rel}"))?;
            }
            pending.push(real_rel);
        }
    }
    Ok(())
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
        add_program_with_libraries(&mut archive, Path::new("/"), "/usr/bin/ls").unwrap();
        assert!(archive.get("usr/bin/ls").is_some());
        assert!(
            archive.paths().any(|p| p.contains("libc.so")),
            "{:?}",
            archive.paths().collect::<Vec<_>>()
        );
        assert!(archive.get("lib64/ld-linux-x86-64.so.2").is_some());
    }
}
