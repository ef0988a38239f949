//! Stage-agnostic helpers: the confined root (every write into an image
//! tree), hashing, archive extraction, initramfs writing, QEMU.

pub mod atomic;
pub mod extract;
pub mod gpg;
pub mod hashing;
pub mod initramfs;
pub mod qemu;
pub mod records;
pub use emberrtos_contract::io::root;

/// The filesystem type (`statfs`'s `f_type`, e.g. `libc::TMPFS_MAGIC`) of
/// the filesystem holding `dir`.
pub fn filesystem_magic(dir: &std::path::Path) -> anyhow::Result<i64> {
    use anyhow::Context;
    let c_path = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes())?;
    // SAFETY: statfs fills the zeroed struct; the path is NUL-terminated.
    let mut stat: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statfs(c_path.as_ptr(), &mut stat) } != 0 {
        return Err(std::io::Error::last_os_error()).with_context(|| format!("statfs {}", dir.display()));
    }
    Ok(stat.f_type)
}

/// Text from a target, a record or a hostile file, made safe to show and store: control
/// characters and bidirectional overrides dropped, trimmed, at most 256
/// characters.
pub fn clean(text: &str) -> String {
    let shown = |c: &char| {
        !c.is_control()
            && !matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
    };
    text.chars()
        .filter(shown)
        .take(256)
        .collect::<String>()
        .trim()
        .to_string()
}

/// [`clean`] on each line.
pub fn clean_lines(text: &str) -> String {
    text.lines().map(clean).collect::<Vec<_>>().join("\n")
}

/// Opens a regular file (through symlinks: the user names it): a FIFO or
/// device in its place is refused, never waited on or read without end.
pub fn open_regular(path: &std::path::Path) -> Result<(std::fs::File, std::fs::Metadata), String> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| e.to_string())?;
    let meta = file.metadata().map_err(|e| e.to_string())?;
    if !meta.is_file() {
        return Err("not a regular file".into());
    }
    Ok((file, meta))
}

/// Opens `path` for reading without following a symlink at its last
/// component, and without blocking on a FIFO swapped in for a file.
pub fn open_nofollow(path: &std::path::Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
}

/// The first `len` bytes of the file at `path` (fewer when it is shorter).
pub fn read_head(path: &std::path::Path, len: usize) -> anyhow::Result<Vec<u8>> {
    use anyhow::Context;
    use std::io::Read;
    let mut head = Vec::with_capacity(len);
    std::fs::File::open(path)
        .and_then(|file| file.take(len as u64).read_to_end(&mut head))
        .with_context(|| format!("reading {}", path.display()))?;
    Ok(head)
}

/// The ELF header at the start of the file at `path`, if it is one.
pub fn elf_header(path: &std::path::Path) -> anyhow::Result<Option<rtcheck::elf::Header>> {
    Ok(rtcheck::elf::header(&read_head(path, rtcheck::elf::HEADER_LEN)?))
}

/// A path the user gave (command line, recipe), resolved once as they mean
/// it: symlinks in it are followed, so `--repo ./repo` with `repo ->
/// work/repo`, or `/srv/ostree -> /data/ostree`, names the real directory.
/// Confinement applies inside the tree it names, never to the user's own
/// path. The parts that do not exist yet are kept below the deepest
/// existing directory. A clap `value_parser`.
pub fn user_path(text: &str) -> Result<std::path::PathBuf, String> {
    if text.is_empty() {
        return Err("an empty path".into());
    }
    resolve_user_path(std::path::Path::new(text)).map_err(|e| e.to_string())
}

/// [`user_path`] for a path already split from its text (a recipe's, joined
/// to the recipe's directory).
pub fn resolve_user_path(path: &std::path::Path) -> std::io::Result<std::path::PathBuf> {
    let path = std::path::absolute(path)?;
    let mut existing = path.as_path();
    let mut missing = Vec::new();
    loop {
        if let Ok(real) = existing.canonicalize() {
            return Ok(missing.iter().rev().fold(real, |path, part| path.join(part)));
        }
        match (existing.parent(), existing.file_name()) {
            (Some(parent), Some(name)) => {
                missing.push(name.to_os_string());
                existing = parent;
            }
            _ => return Ok(path),
        }
    }
}
