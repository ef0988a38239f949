//! Safe tarball extraction (`.tar`, `.tar.gz`, `.tar.xz`, `.tar.zst`).
//!
//! Every entry is checked before anything is written: absolute paths, `..`
//! components, links whose target leaves the tree, and entries that would be
//! written through a symlink are refused with an error naming the entry. The
//! archive is unpacked into a temp dir beside the destination and renamed
//! into place only when complete, so a partial tree never looks finished.
//!
//! A truncated archive is refused: the tar stream must end with its
//! end-of-archive marker (two zero blocks), and a compressed stream must end
//! as its format says (the decompressor reads and checks its trailer).

use std::cell::Cell;
use std::collections::HashSet;
use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::{Component, Path, PathBuf};
use std::rc::Rc;

use anyhow::{Context, Result, bail};

use crate::io::atomic::place_dir;
use crate::ui::Ui;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UnsafeEntry {
    #[error("archive entry {entry:?} has an absolute path")]
    Absolute { entry: String },
    #[error("archive entry {entry:?} has a `..` component")]
    ParentDir { entry: String },
    #[error("archive entry {entry:?} is a link to {target:?}, which is outside the extraction directory")]
    LinkEscapes { entry: String, target: String },
    #[error("archive entry {entry:?} would be written through the symlink {link:?}")]
    ThroughSymlink { entry: String, link: String },
    #[error("archive entry {entry:?} is a {kind}, which is not allowed here")]
    UnsupportedType { entry: String, kind: String },
}

/// The archive ends before its end-of-archive marker, or its compressed
/// stream ends before its trailer: it was cut short.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the archive is truncated: {0}")]
pub struct Truncated(pub String);

#[derive(Clone, Copy, Debug, Default)]
pub struct ExtractOptions {
    /// Keep uid/gid from the archive (rootfs tarballs; needs root).
    pub preserve_owners: bool,
    /// Skip device nodes and FIFOs instead of refusing them (rootfs
    /// tarballs: devtmpfs provides /dev on the target).
    pub skip_special_files: bool,
    /// Accept symlink targets anywhere, absolute ones included: in a rootfs
    /// they resolve on the target, not here. Writing through any symlink is
    /// still refused.
    pub rootfs_symlinks: bool,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExtractStats {
    pub entries: u64,
    pub bytes: u64,
    /// Special files left out (`skip_special_files`).
    pub skipped: u64,
}

/// Wraps `reader` in the decompressor its magic bytes call for.
fn decompress(mut reader: impl BufRead + 'static) -> std::io::Result<Box<dyn Read>> {
    let magic = reader.fill_buf()?;
    Ok(match magic {
        [0x1f, 0x8b, ..] => Box::new(flate2::read::GzDecoder::new(reader)),
        [0xfd, b'7', b'z', b'X', b'Z', 0, ..] => Box::new(liblzma::read::XzDecoder::new(reader)),
        [0x28, 0xb5, 0x2f, 0xfd, ..] => Box::new(zstd::stream::read::Decoder::with_buffer(reader)?),
        _ => Box::new(reader),
    })
}

/// Opens `archive` as an uncompressed tar stream, whatever its compression.
pub fn open_archive(archive: &Path) -> Result<Box<dyn Read>> {
    let file = File::open(archive).with_context(|| format!("opening {}", archive.display()))?;
    decompress(BufReader::with_capacity(1 << 20, file))
        .with_context(|| format!("reading {}", archive.display()))
}

/// Extracts `archive` into `dest`, which must not exist yet.
pub fn extract_tarball(
    archive: &Path,
    dest: &Path,
    options: ExtractOptions,
    ui: &Ui,
) -> Result<ExtractStats> {
    let file = File::open(archive).with_context(|| format!("opening {}", archive.display()))?;
    let name = archive
        .file_name()
        .unwrap_or_default()
        .to_string_lossy()
        .into_owned();
    let bar = ui.bytes(Some(file.metadata()?.len()), format!("extracting {name}"));
    // Progress counts compressed bytes, which is what the total is of.
    let reader = decompress(BufReader::with_capacity(1 << 20, bar.wrap_read(file)))?;
    let result =
        extract_reader(reader, dest, options).with_context(|| format!("extracting {}", archive.display()));
    bar.finish_and_clear();
    result
}

/// Extracts a tar stream into `dest` (which must not exist) atomically. If a
/// concurrent extraction renamed its tree to `dest` first, that tree is kept
/// and ours removed; the caller checks what it holds.
pub fn extract_reader(reader: impl Read, dest: &Path, options: ExtractOptions) -> Result<ExtractStats> {
    if dest.exists() {
        bail!("{} already exists", dest.display());
    }
    let parent = dest
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    let staging = tempfile::Builder::new()
        .prefix(".extracting-")
        .tempdir_in(parent)
        .with_context(|| format!("creating a staging dir in {}", parent.display()))?;
    let stats = unpack_checked(reader, staging.path(), options)?;
    place_dir(staging, dest, Path::is_dir)
        .with_context(|| format!("moving the extracted tree to {}", dest.display()))?;
    Ok(stats)
}

/// The lexical components of an entry path: refuses absolute paths and `..`.
fn checked_relative(path: &Path, entry: &str) -> Result<PathBuf, UnsafeEntry> {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::Normal(part) => out.push(part),
            Component::CurDir => {}
            Component::ParentDir => {
                return Err(UnsafeEntry::ParentDir {
                    entry: entry.to_string(),
                });
            }
            Component::RootDir | Component::Prefix(_) => {
                return Err(UnsafeEntry::Absolute {
                    entry: entry.to_string(),
                });
            }
        }
    }
    Ok(out)
}

/// Resolves a symlink target relative to the link's directory, lexically, and
/// refuses it if it leaves the root.
fn check_symlink_target(entry_rel: &Path, target: &Path, entry: &str) -> Result<(), UnsafeEntry> {
    let escapes = || UnsafeEntry::LinkEscapes {
        entry: entry.to_string(),
        target: target.display().to_string(),
    };
    let mut depth: Vec<&std::ffi::OsStr> = entry_rel
        .parent()
        .map(|p| {
            p.components()
                .filter_map(|c| match c {
                    Component::Normal(s) => Some(s),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default();
    for component in target.components() {
        match component {
            Component::Normal(part) => depth.push(part),
            Component::CurDir => {}
            Component::ParentDir => {
                depth.pop().ok_or_else(escapes)?;
            }
            Component::RootDir | Component::Prefix(_) => return Err(escapes()),
        }
    }
    Ok(())
}

/// A reader that remembers whether it reached the end of its input.
struct EofWatch<R> {
    inner: R,
    hit_eof: Rc<Cell<bool>>,
}

impl<R: Read> Read for EofWatch<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        if n == 0 && !buf.is_empty() {
            self.hit_eof.set(true);
        }
        Ok(n)
    }
}

const BLOCK: usize = 512;

/// After the tar reader stopped at the first zero block: the second zero
/// block must follow, and the rest of the stream (record padding) must read
/// to its end without error, so the decompressor checks its trailer.
fn check_archive_end(mut rest: impl Read) -> Result<()> {
    let mut block = [0u8; BLOCK];
    if rest.read_exact(&mut block).is_err() {
        return Err(Truncated("it has only one of the two zero blocks that end an archive".into()).into());
    }
    if block.iter().any(|&b| b != 0) {
        bail!("the archive has a lone zero block followed by data");
    }
    std::io::copy(&mut rest, &mut std::io::sink())
        .map_err(anyhow::Error::new)
        .context("reading past the end-of-archive marker")
        .map_err(as_truncation)?;
    Ok(())
}

/// An error caused by input that ended too early (the tar reader's own EOF
/// or a decompressor's `UnexpectedEof`) becomes a [`Truncated`].
fn as_truncation(error: anyhow::Error) -> anyhow::Error {
    let ended_early = error.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == std::io::ErrorKind::UnexpectedEof)
    });
    if ended_early {
        error.context(Truncated("its data ends too early".into()))
    } else {
        error
    }
}

/// A directory whose mode and owner are applied after its entries.
struct DirAttrs {
    path: PathBuf,
    mode: u32,
    uid: u64,
    gid: u64,
}

fn unpack_checked(reader: impl Read, root: &Path, options: ExtractOptions) -> Result<ExtractStats> {
    let hit_eof = Rc::new(Cell::new(false));
    let mut archive = tar::Archive::new(EofWatch {
        inner: reader,
        hit_eof: hit_eof.clone(),
    });
    archive.set_preserve_permissions(true);
    archive.set_preserve_mtime(true);
    archive.set_preserve_ownerships(options.preserve_owners);
    archive.set_unpack_xattrs(false);
    let mut directories = Vec::new();
    let unpacked = unpack_entries(&mut archive, root, options, &mut directories);
    // The tar reader treats the end of its input as the end of the archive,
    // and may report a cut inside an entry as some other error: either way,
    // an input that ended before the end-of-archive marker is a truncation.
    if hit_eof.get() {
        let truncated = Truncated("it ends before its end-of-archive marker".into());
        return Err(match unpacked {
            Ok(_) => truncated.into(),
            Err(e) => e.context(truncated),
        });
    }
    let stats = unpacked.map_err(as_truncation)?;
    check_archive_end(archive.into_inner())?;
    apply_dir_attrs(directories, options)?;
    Ok(stats)
}

fn unpack_entries(
    archive: &mut tar::Archive<impl Read>,
    root: &Path,
    options: ExtractOptions,
    directories: &mut Vec<DirAttrs>,
) -> Result<ExtractStats> {
    use tar::EntryType;
    let mut symlinks: HashSet<PathBuf> = HashSet::new();
    let mut stats = ExtractStats::default();
    for entry in archive.entries().context("reading the archive")? {
        let mut entry = entry.context("reading an archive entry")?;
        let raw_path = entry.path().context("decoding an entry path")?.into_owned();
        let name = raw_path.display().to_string();
        let kind = entry.header().entry_type();
        if matches!(
            kind,
            EntryType::XGlobalHeader | EntryType::XHeader | EntryType::GNULongName | EntryType::GNULongLink
        ) {
            continue;
        }
        let rel = checked_relative(&raw_path, &name)?;
        if rel.as_os_str().is_empty() {
            continue; // the archive's own `./`
        }
        // The entry itself counts too: `a -> /etc` then a directory `a/`
        // would otherwise chmod and chown the host's /etc.
        if let Some(link) = rel.ancestors().find(|a| symlinks.contains(*a)) {
            return Err(UnsafeEntry::ThroughSymlink {
                entry: name,
                link: link.display().to_string(),
            }
            .into());
        }
        let target = root.join(&rel);
        match kind {
            EntryType::Directory => {
                // Modes are applied at the end: a read-only directory must
                // still receive the entries that follow it.
                std::fs::create_dir_all(&target).with_context(|| format!("creating {name}"))?;
                let header = entry.header();
                directories.push(DirAttrs {
                    path: target,
                    mode: header.mode().unwrap_or(0o755),
                    uid: header.uid().unwrap_or(0),
                    gid: header.gid().unwrap_or(0),
                });
            }
            EntryType::Regular | EntryType::Continuous => {
                ensure_parent(&target)?;
                entry.unpack(&target).with_context(|| format!("writing {name}"))?;
                stats.bytes += entry.header().size().unwrap_or(0);
            }
            EntryType::Symlink => {
                let link = entry
                    .link_name()
                    .context("decoding a link target")?
                    .with_context(|| format!("symlink {name} has no target"))?
                    .into_owned();
                if !options.rootfs_symlinks {
                    check_symlink_target(&rel, &link, &name)?;
                }
                ensure_parent(&target)?;
                entry
                    .unpack(&target)
                    .with_context(|| format!("creating symlink {name}"))?;
                symlinks.insert(rel);
            }
            EntryType::Link => {
                let link = entry
                    .link_name()
                    .context("decoding a link target")?
                    .with_context(|| format!("hard link {name} has no target"))?
                    .into_owned();
                let link_rel = checked_relative(&link, &name).map_err(|_| UnsafeEntry::LinkEscapes {
                    entry: name.clone(),
                    target: link.display().to_string(),
                })?;
                if let Some(via) = link_rel.ancestors().find(|a| symlinks.contains(*a)) {
                    return Err(UnsafeEntry::ThroughSymlink {
                        entry: name,
                        link: via.display().to_string(),
                    }
                    .into());
                }
                ensure_parent(&target)?;
                std::fs::hard_link(root.join(&link_rel), &target)
                    .with_context(|| format!("creating hard link {name} -> {}", link.display()))?;
            }
            EntryType::Char | EntryType::Block | EntryType::Fifo if options.skip_special_files => {
                stats.skipped += 1;
                continue;
            }
            other => {
                return Err(UnsafeEntry::UnsupportedType {
                    entry: name,
                    kind: format!("{other:?}"),
                }
                .into());
            }
        }
        stats.entries += 1;
    }
    Ok(stats)
}

fn apply_dir_attrs(directories: Vec<DirAttrs>, options: ExtractOptions) -> Result<()> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    for dir in directories.into_iter().rev() {
        // Through a descriptor that cannot be a symlink: never a host directory.
        let handle = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
            .open(&dir.path)
            .with_context(|| format!("opening {}", dir.path.display()))?;
        if options.preserve_owners {
            std::os::unix::fs::fchown(&handle, u32::try_from(dir.uid).ok(), u32::try_from(dir.gid).ok())
                .with_context(|| format!("setting the owner of {}", dir.path.display()))?;
        }
        handle
            .set_permissions(std::fs::Permissions::from_mode(dir.mode & 0o7777))
            .with_context(|| format!("setting the mode of {}", dir.path.display()))?;
    }
    Ok(())
}

fn ensure_parent(path: &Path) -> Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_paths() {
        assert_eq!(
            checked_relative(Path::new("./a/b"), "x").unwrap(),
            PathBuf::from("a/b")
        );
        assert!(matches!(
            checked_relative(Path::new("a/../../b"), "x"),
            Err(UnsafeEntry::ParentDir { .. })
        ));
        assert!(matches!(
            checked_relative(Path::new("/etc/x"), "x"),
            Err(UnsafeEntry::Absolute { .. })
        ));
    }

    #[test]
    fn symlink_targets() {
        assert!(check_symlink_target(Path::new("a/b/link"), Path::new("../c"), "x").is_ok());
        assert!(check_symlink_target(Path::new("a/b/link"), Path::new("../../c"), "x").is_ok());
        assert!(check_symlink_target(Path::new("a/b/link"), Path::new("../../../c"), "x").is_err());
        assert!(check_symlink_target(Path::new("link"), Path::new("/"), "x").is_err());
        assert!(check_symlink_target(Path::new("link"), Path::new("."), "x").is_ok());
    }
}
