//! fs-verity digests and the manifest that records one for every regular
//! file under `usr/` of a commit.
//!
//! A file's fs-verity digest is what the kernel measures once verity is on
//! for it (`FS_IOC_MEASURE_VERITY`): SHA-256 over a descriptor holding the
//! file's size and the root of a Merkle tree of SHA-256 over 4096-byte
//! blocks, no salt (the defaults of `fsverity digest` and of libostree's
//! `ex-fsverity`). The builder computes it here in userspace for the whole
//! tree and writes the [`Manifest`] into the tree at [`MANIFEST_PATH`]; the
//! commit records the manifest's own digest ([`key::MANIFEST_DIGEST`]), so
//! the signed commit vouches for every file. The device's health check
//! measures each deployed file and compares.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;

use anyhow::{Context, Result, bail};
use sha2::{Digest as _, Sha256};

/// Where the manifest lives in a tree.
pub const MANIFEST_PATH: &str = "usr/lib/emberrtos/fsverity-digests";
/// The block size of the Merkle tree.
pub const BLOCK_SIZE: usize = 4096;
/// `FS_VERITY_HASH_ALG_SHA256`.
pub const HASH_ALG_SHA256: u8 = 1;
/// The manifest's first line.
const HEADER: &str =
    "# fs-verity digests (sha256, 4096-byte blocks, no salt) of every regular file under usr/";

/// The commit metadata key that vouches for the manifest.
pub mod key {
    /// The fs-verity digest (hex) of the tree's [`super::MANIFEST_PATH`].
    pub const MANIFEST_DIGEST: &str = "imgbuild.fsverity.manifest-digest";
}

/// An fs-verity SHA-256 digest.
pub type Digest = [u8; 32];

/// The fs-verity digest of everything `reader` yields.
pub fn digest_of(mut reader: impl Read) -> std::io::Result<Digest> {
    let mut hashes = Vec::new();
    let mut block = vec![0u8; BLOCK_SIZE];
    let mut size = 0u64;
    loop {
        let filled = read_block(&mut reader, &mut block)?;
        if filled == 0 {
            break;
        }
        size += filled as u64;
        block[filled..].fill(0);
        hashes.extend_from_slice(&Sha256::digest(&block));
        if filled < BLOCK_SIZE {
            break;
        }
    }
    let root = merkle_root(hashes);
    Ok(descriptor_digest(size, &root))
}

/// The fs-verity digest of the file at `path`.
pub fn digest_file(path: &Path) -> Result<Digest> {
    let file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    digest_of(std::io::BufReader::with_capacity(1 << 16, file))
        .with_context(|| format!("reading {}", path.display()))
}

/// Fills `block` as far as `reader` goes; the count read.
fn read_block(reader: &mut impl Read, block: &mut [u8]) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < block.len() {
        match reader.read(&mut block[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

/// The root hash over the data blocks' hashes: all zeros for an empty file,
/// the single block's hash for a file of one block, else each level packs
/// the hashes below into zero-padded blocks until one block remains.
fn merkle_root(mut hashes: Vec<u8>) -> Digest {
    let mut root = [0u8; 32];
    if hashes.is_empty() {
        return root;
    }
    while hashes.len() > 32 {
        hashes = hashes
            .chunks(BLOCK_SIZE)
            .flat_map(|chunk| {
                let mut block = chunk.to_vec();
                block.resize(BLOCK_SIZE, 0);
                Sha256::digest(&block)
            })
            .collect();
    }
    root.copy_from_slice(&hashes);
    root
}

/// SHA-256 of `struct fsverity_descriptor` (version 1, 256 bytes).
fn descriptor_digest(size: u64, root: &Digest) -> Digest {
    let mut descriptor = [0u8; 256];
    descriptor[0] = 1;
    descriptor[1] = HASH_ALG_SHA256;
    descriptor[2] = BLOCK_SIZE.trailing_zeros() as u8;
    descriptor[8..16].copy_from_slice(&size.to_le_bytes());
    descriptor[16..48].copy_from_slice(root);
    Sha256::digest(descriptor).into()
}

/// Why a manifest does not parse; `line` counts from 1.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ManifestError {
    #[error("{MANIFEST_PATH} does not start with its header line")]
    Header,
    #[error("{MANIFEST_PATH} line {line}: {why}")]
    Line { line: usize, why: String },
}

/// Every regular file under `usr/` and its digest, by path from the root.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Manifest {
    pub files: BTreeMap<String, Digest>,
}

impl Manifest {
    /// Computes the manifest of `root`'s `usr/` (links are not followed; the
    /// manifest's own path is left out).
    pub fn of_tree(root: &Path) -> Result<Manifest> {
        let mut files = BTreeMap::new();
        for name in usr_files(root)? {
            check_path(&name).map_err(|why| anyhow::anyhow!("the manifest cannot hold {why}"))?;
            if name != MANIFEST_PATH {
                let digest = digest_file(&root.join(&name))?;
                files.insert(name, digest);
            }
        }
        Ok(Manifest { files })
    }

    /// The manifest file: the header, then `HEX PATH` a line, by path.
    pub fn render(&self) -> String {
        let mut text = format!("{HEADER}\n");
        for (path, digest) in &self.files {
            text.push_str(&format!("{} {path}\n", hex::encode(digest)));
        }
        text
    }

    /// Parses [`Manifest::render`]'s output (pure).
    pub fn parse(text: &str) -> Result<Manifest, ManifestError> {
        let mut lines = text.lines();
        if lines.next() != Some(HEADER) {
            return Err(ManifestError::Header);
        }
        let mut files = BTreeMap::new();
        for (index, line) in lines.enumerate() {
            let bad = |why: String| ManifestError::Line { line: index + 2, why };
            let (hex_digest, path) = line
                .split_once(' ')
                .ok_or_else(|| bad("no space between digest and path".into()))?;
            let digest = parse_digest(hex_digest).map_err(bad)?;
            check_path(path).map_err(bad)?;
            if files.insert(path.to_string(), digest).is_some() {
                return Err(bad(format!("{path} is listed twice")));
            }
        }
        Ok(Manifest { files })
    }
}

/// Every regular file under `usr/` of `root` (links not followed), by
/// path from `root`, sorted; a name that is not UTF-8, which no manifest
/// holds, is an error naming it.
pub fn usr_files(root: &Path) -> Result<Vec<String>> {
    let mut names = Vec::new();
    for entry in walkdir::WalkDir::new(root.join("usr")).sort_by_file_name() {
        let entry = entry.with_context(|| format!("walking {}/usr", root.display()))?;
        if entry.file_type().is_file() {
            let rel = entry.path().strip_prefix(root).expect("walked under root");
            let Some(name) = rel.to_str() else {
                bail!(
                    "/{} has a name that is not UTF-8, which no manifest holds",
                    rel.display()
                );
            };
            names.push(name.to_string());
        }
    }
    Ok(names)
}

/// A digest written as 64 lowercase hex digits (pure).
pub fn parse_digest(text: &str) -> Result<Digest, String> {
    let mut digest = [0u8; 32];
    let lowercase = text
        .bytes()
        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    match lowercase && hex::decode_to_slice(text, &mut digest).is_ok() {
        true => Ok(digest),
        false => Err(format!("{text:?} is not 64 lowercase hex digits")),
    }
}

/// A manifest path: `usr/...`, relative, no empty, `.` or `..` component,
/// no control character (pure).
pub fn check_path(path: &str) -> Result<(), String> {
    let components_ok = path.split('/').all(|c| !c.is_empty() && c != "." && c != "..");
    if !path.starts_with("usr/") || !components_ok {
        return Err(format!("{path:?} is not a plain path under usr/"));
    }
    if path.chars().any(char::is_control) {
        return Err(format!("{path:?} holds a control character"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex_of(data: &[u8]) -> String {
        hex::encode(digest_of(data).unwrap())
    }

    /// Known answers from fsverity-utils' `fsverity digest` (Debian 12):
    /// empty, one partial block, one full block, a block and a byte, and
    /// 130 blocks (two levels of hash blocks).
    #[test]
    fn digests_match_fsverity_utils() {
        assert_eq!(
            hex_of(b""),
            "3d248ca542a24fc62d1c43b916eae5016878e2533c88238480b26128a1f1af95"
        );
        assert_eq!(
            hex_of(b"hello"),
            "555b589c26ee43b7a2510e6c67ced9fb3190b6da6e9e683984551f5d77a763de"
        );
        assert_eq!(
            hex_of(&[b'a'; 4096]),
            "a2a808ddaced77f0b6b3068f47b14b5a1fb3fc43674993ab11b8e7e6f2d089e2"
        );
        assert_eq!(
            hex_of(&[b'b'; 4097]),
            "c6d5cc0703d262023822da09bfdf7bf3f2cc8d084bcac090bf6e9089a8d0e49f"
        );
        let big: Vec<u8> = (0..4096 * 129 + 5).map(|i| ((i * 7 + 3) % 251) as u8).collect();
        assert_eq!(
            hex_of(&big),
            "4cdc6f30f163dba9388e441a78331d8bb4c7913903e47c1b550d6d56441f69b1"
        );
    }

    #[test]
    fn a_flipped_byte_changes_the_digest() {
        let mut data = vec![7u8; 3 * 4096];
        let before = digest_of(&data[..]).unwrap();
        data[5000] ^= 1;
        assert_ne!(before, digest_of(&data[..]).unwrap());
    }

    #[test]
    fn the_manifest_reads_back_what_it_wrote() {
        let manifest = Manifest {
            files: BTreeMap::from([
                ("usr/bin/a b".to_string(), [1; 32]),
                ("usr/lib/x".to_string(), [2; 32]),
            ]),
        };
        assert_eq!(Manifest::parse(&manifest.render()), Ok(manifest));
    }

    #[test]
    fn bad_manifests_name_the_line() {
        let line = |text: &str| match Manifest::parse(&format!("{HEADER}\n{text}\n")) {
            Err(ManifestError::Line { line, .. }) => line,
            other => panic!("{text:?} parsed: {other:?}"),
        };
        let digest = "ab".repeat(32);
        assert_eq!(line(&format!("{digest} usr/../etc/shadow")), 2);
        assert_eq!(line(&format!("{digest} /usr/bin/x")), 2);
        assert_eq!(line(&format!("{digest} etc/passwd")), 2);
        assert_eq!(line(&format!("{} usr/bin/x", "AB".repeat(32))), 2);
        assert_eq!(line(&format!("{digest}usr/bin/x")), 2);
        assert_eq!(line(&format!("{digest} usr/x\n{digest} usr/x")), 3);
        assert_eq!(Manifest::parse("usr/x"), Err(ManifestError::Header));
    }

    #[test]
    fn the_tree_manifest_covers_regular_files_under_usr_only() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("usr/lib/emberrtos")).unwrap();
        std::fs::create_dir_all(root.join("etc")).unwrap();
        std::fs::write(root.join("usr/lib/a"), b"hello").unwrap();
        std::fs::write(root.join("etc/b"), b"x").unwrap();
        std::fs::write(root.join(MANIFEST_PATH), b"old").unwrap();
        std::os::unix::fs::symlink("/etc/shadow", root.join("usr/lib/link")).unwrap();
        let manifest = Manifest::of_tree(root).unwrap();
        let paths: Vec<&str> = manifest.files.keys().map(String::as_str).collect();
        assert_eq!(paths, ["usr/lib/a"]);
        assert_eq!(hex::encode(manifest.files["usr/lib/a"]), hex_of(b"hello"));
    }
}
