//! Streaming sha256: files are hashed in fixed-size chunks, never held whole.

use std::fs::File;
use std::io::{self, Read, Write};
use std::path::Path;

use anyhow::{Context, Result};
use indicatif::ProgressBar;
use sha2::{Digest, Sha256};

const CHUNK: usize = 1 << 20;

pub use emberrtos_contract::io::sha256_hex;

/// Hashes everything `reader` yields, reporting bytes to `progress`.
pub fn sha256_reader(mut reader: impl Read, progress: Option<&ProgressBar>) -> io::Result<(String, u64)> {
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; CHUNK];
    let mut total = 0u64;
    loop {
        let n = match reader.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        hasher.update(&buf[..n]);
        total += n as u64;
        if let Some(bar) = progress {
            bar.inc(n as u64);
        }
    }
    Ok((hex::encode(hasher.finalize()), total))
}

pub fn sha256_file(path: &Path, progress: Option<&ProgressBar>) -> Result<String> {
    let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let (digest, _) = sha256_reader(file, progress).with_context(|| format!("reading {}", path.display()))?;
    Ok(digest)
}

/// A writer that hashes what passes through it.
pub struct HashingWriter<W> {
    inner: W,
    hasher: Sha256,
    written: u64,
}

impl<W: Write> HashingWriter<W> {
    pub fn new(inner: W) -> Self {
        HashingWriter {
            inner,
            hasher: Sha256::new(),
            written: 0,
        }
    }

    pub fn written(&self) -> u64 {
        self.written
    }

    /// The hex digest and the inner writer.
    pub fn finish(self) -> (String, W) {
        (hex::encode(self.hasher.finalize()), self.inner)
    }
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// A reader that hashes what passes through it: one pass both parses a
/// file and names the exact bytes parsed.
pub struct HashingReader<R> {
    inner: R,
    hasher: Sha256,
    read: u64,
}

impl<R: Read> HashingReader<R> {
    pub fn new(inner: R) -> Self {
        HashingReader {
            inner,
            hasher: Sha256::new(),
            read: 0,
        }
    }

    /// Reads what is left, then gives the hex digest and the byte count.
    pub fn finish(mut self) -> io::Result<(String, u64)> {
        io::copy(&mut self, &mut io::sink())?;
        Ok((hex::encode(self.hasher.finalize()), self.read))
    }
}

impl<R: Read> Read for HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        self.read += n as u64;
        Ok(n)
    }
}

/// A digest of a directory tree: every path, type, mode, owner, symlink
/// target and file content, in sorted order.
pub fn sha256_tree(root: &Path) -> Result<String> {
    use std::os::unix::fs::MetadataExt;
    let mut hasher = Sha256::new();
    for entry in walkdir::WalkDir::new(root).sort_by_file_name() {
        let entry = entry.with_context(|| format!("walking {}", root.display()))?;
        let rel = entry.path().strip_prefix(root).expect("inside the root");
        let meta = entry.path().symlink_metadata()?;
        hasher.update(rel.as_os_str().as_encoded_bytes());
        hasher.update(format!("\0{:o}:{}:{}\0", meta.mode(), meta.uid(), meta.gid()).as_bytes());
        if meta.file_type().is_symlink() {
            hasher.update(std::fs::read_link(entry.path())?.as_os_str().as_encoded_bytes());
        } else if meta.is_file() {
            hasher.update(sha256_file(entry.path(), None)?.as_bytes());
        }
        hasher.update(b"\n");
    }
    Ok(hex::encode(hasher.finalize()))
}

/// True for a 64-digit hex sha256.
pub fn is_sha256_hex(text: &str) -> bool {
    text.len() == 64 && text.bytes().all(|b| b.is_ascii_hexdigit())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_digest() {
        assert_eq!(
            sha256_hex("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        let (d, n) = sha256_reader(&b"abc"[..], None).unwrap();
        assert_eq!(d, sha256_hex("abc"));
        assert_eq!(n, 3);
        let mut reader = HashingReader::new(&b"abcd"[..]);
        let mut first = [0u8; 1];
        reader.read_exact(&mut first).unwrap();
        assert_eq!(
            reader.finish().unwrap(),
            (sha256_hex("abcd"), 4),
            "the rest is read too"
        );
        let mut w = HashingWriter::new(Vec::new());
        w.write_all(b"ab").unwrap();
        w.write_all(b"c").unwrap();
        assert_eq!(w.written(), 3);
        assert_eq!(w.finish().0, sha256_hex("abc"));
    }

    #[test]
    fn tree_digest_sees_content_modes_and_links() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a"), "1").unwrap();
        let first = sha256_tree(dir.path()).unwrap();
        assert_eq!(first, sha256_tree(dir.path()).unwrap());
        std::fs::set_permissions(dir.path().join("a"), std::fs::Permissions::from_mode(0o600)).unwrap();
        let second = sha256_tree(dir.path()).unwrap();
        assert_ne!(first, second);
        std::os::unix::fs::symlink("a", dir.path().join("b")).unwrap();
        assert_ne!(second, sha256_tree(dir.path()).unwrap());
    }

    #[test]
    fn hex_check() {
        assert!(is_sha256_hex(&sha256_hex("x")));
        assert!(!is_sha256_hex("abc"));
        assert!(!is_sha256_hex(&"g".repeat(64)));
    }
}
