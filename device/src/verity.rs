//! The OS tree proven unchanged: every regular file under `/usr` of the
//! deployment carries fs-verity (the kernel verifies each block it reads
//! against the file's Merkle tree, and refuses writes), and its measured
//! digest is the one the commit's manifest records
//! ([`emberrtos_contract::verity`]). The manifest itself is measured
//! against the digest in the signed commit.
//!
//! Files the build put on the disk are sealed on the first check (the
//! image is written by `mkfs.ext4 -d`, which cannot turn verity on);
//! libostree seals what the device pulls later (`ex-fsverity.required`).
//! Sealing a changed file does not hide it: its digest is not the
//! manifest's.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;

use anyhow::{Context, Result, bail};

use crate::system::{Access, System};
use emberrtos_contract::io::root::ImageRoot;
use emberrtos_contract::ostree as ost;
use emberrtos_contract::verity::{self, Digest, Manifest};

/// `_IOW('f', 133, struct fsverity_enable_arg)` (linux/fsverity.h).
const FS_IOC_ENABLE_VERITY: libc::c_ulong = 0x4080_6685;
/// `_IOWR('f', 134, struct fsverity_digest)`.
const FS_IOC_MEASURE_VERITY: libc::c_ulong = 0xc004_6686;

/// `struct fsverity_enable_arg`: version 1, SHA-256, 4096-byte blocks, no
/// salt, no signature.
#[repr(C)]
struct EnableArg {
    version: u32,
    hash_algorithm: u32,
    block_size: u32,
    salt_size: u32,
    salt_ptr: u64,
    sig_size: u32,
    reserved1: u32,
    sig_ptr: u64,
    reserved2: [u64; 11],
}

/// `struct fsverity_digest` with room for any digest.
#[repr(C)]
struct MeasureArg {
    algorithm: u16,
    size: u16,
    digest: [u8; 64],
}

/// The file's fs-verity digest; `None` when verity is not on for it.
pub fn measure(file: &File) -> std::io::Result<Option<Digest>> {
    let mut arg = MeasureArg {
        algorithm: 0,
        size: 64,
        digest: [0; 64],
    };
    // SAFETY: the kernel writes at most `size` digest bytes into `arg`,
    // which lives across the call.
    let rc = unsafe { libc::ioctl(file.as_raw_fd(), FS_IOC_MEASURE_VERITY as _, &mut arg) };
    if rc != 0 {
        let error = std::io::Error::last_os_error();
        return match error.raw_os_error() == Some(libc::ENODATA) {
            true => Ok(None),
            false => Err(error),
        };
    }
    if arg.algorithm != u16::from(verity::HASH_ALG_SHA256) || arg.size != 32 {
        return Err(std::io::Error::other(format!(
            "verity uses hash algorithm {} ({} bytes), not SHA-256",
            arg.algorithm, arg.size
        )));
    }
    let mut digest = [0u8; 32];
    digest.copy_from_slice(&arg.digest[..32]);
    Ok(Some(digest))
}

/// Turns fs-verity on for `file` (opened read-only, on a writable mount):
/// the kernel reads it whole to build the Merkle tree.
pub fn enable(file: &File) -> std::io::Result<()> {
    let arg = EnableArg {
        version: 1,
        hash_algorithm: u32::from(verity::HASH_ALG_SHA256),
        block_size: verity::BLOCK_SIZE as u32,
        salt_size: 0,
        salt_ptr: 0,
        sig_size: 0,
        reserved1: 0,
        sig_ptr: 0,
        reserved2: [0; 11],
    };
    // SAFETY: `arg` is a complete fsverity_enable_arg with no pointers.
    let rc = unsafe { libc::ioctl(file.as_raw_fd(), FS_IOC_ENABLE_VERITY as _, &arg) };
    match rc == 0 {
        true => Ok(()),
        false => match std::io::Error::last_os_error() {
            e if e.raw_os_error() == Some(libc::EEXIST) => Ok(()),
            e => Err(e),
        },
    }
}

/// What the tree check found wrong, by path from `/`.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Findings {
    pub changed: Vec<String>,
    pub missing: Vec<String>,
    pub added: Vec<String>,
}

impl Findings {
    fn is_empty(&self) -> bool {
        self.changed.is_empty() && self.missing.is_empty() && self.added.is_empty()
    }

    /// One line: the first few paths of each kind, and how many in all.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        for (what, paths) in [
            ("changed", &self.changed),
            ("missing", &self.missing),
            ("not in the commit", &self.added),
        ] {
            if let Some(first) = paths.first() {
                let more = match paths.len() {
                    1 => String::new(),
                    n => format!(" and {} more", n - 1),
                };
                parts.push(format!("{what}: /{first}{more}"));
            }
        }
        parts.join("; ")
    }
}

/// The built-in `tree` check: seals what is not sealed yet, then measures
/// the manifest and every file against the booted commit.
pub fn check_tree(system: &System) -> Result<String> {
    let started = std::time::Instant::now();
    let info = ost::read_commit(&system.repo(), &system.current.csum())?;
    let Some(expected) = info
        .metadata
        .get(verity::key::MANIFEST_DIGEST)
        .and_then(|v| v.as_str())
    else {
        return Ok("the commit records no fs-verity manifest (built before sealing): not checked".into());
    };
    let expected = verity::parse_digest(expected)
        .map_err(|e| anyhow::anyhow!("the commit's {}: {e}", verity::key::MANIFEST_DIGEST))?;
    let manifest_path = [verity::MANIFEST_PATH.to_string()];
    let (manifest_digest, mut sealed_now) = measure_sealing(system, &manifest_path)?;
    if manifest_digest[verity::MANIFEST_PATH] != expected {
        bail!(
            "/{} is not the commit's: fs-verity digest {}",
            verity::MANIFEST_PATH,
            hex::encode(manifest_digest[verity::MANIFEST_PATH])
        );
    }
    let text = String::from_utf8(system.root.read(Path::new(verity::MANIFEST_PATH))?)
        .with_context(|| format!("/{} is not UTF-8", verity::MANIFEST_PATH))?;
    let manifest = Manifest::parse(&text)?;
    let on_disk: BTreeSet<String> = verity::usr_files(system.root.path())
        .context("listing the files under /usr")?
        .into_iter()
        .collect();
    let present: Vec<String> = manifest
        .files
        .keys()
        .filter(|p| on_disk.contains(p.as_str()))
        .cloned()
        .collect();
    let (digests, sealed) = measure_sealing(system, &present)?;
    sealed_now += sealed;
    let findings = compare(&manifest, &digests, on_disk);
    if !findings.is_empty() {
        bail!("the OS tree is not the commit's: {}", findings.describe());
    }
    Ok(format!(
        "{} files under /usr match the commit's fs-verity digests ({sealed_now} sealed on this boot, {:.1} s)",
        manifest.files.len(),
        started.elapsed().as_secs_f64()
    ))
}

/// Each of `paths` measured, sealing first what carries no fs-verity yet;
/// the digests and how many were sealed now.
fn measure_sealing(system: &System, paths: &[String]) -> Result<(BTreeMap<String, Digest>, usize)> {
    let mut digests = BTreeMap::new();
    let mut unsealed = Vec::new();
    for rel in paths {
        match measure_file(&system.root, rel)? {
            Some(digest) => {
                digests.insert(rel.clone(), digest);
            }
            None => unsealed.push(rel.clone()),
        }
    }
    seal(system, &unsealed)?;
    for rel in &unsealed {
        let digest = measure_file(&system.root, rel)?
            .with_context(|| format!("/{rel} is not sealed after sealing it"))?;
        digests.insert(rel.clone(), digest);
    }
    Ok((digests, unsealed.len()))
}

/// The fs-verity digest of `rel` under `root`; `None` when not sealed.
fn measure_file(root: &ImageRoot, rel: &str) -> Result<Option<Digest>> {
    let file = root.open_file(Path::new(rel))?;
    measure(&file).with_context(|| {
        format!("measuring /{rel} (does the kernel have FS_VERITY and ext4 the verity feature?)")
    })
}

/// Seals `paths` of the booted deployment through `/sysroot`, made
/// writable inside this process's own mount namespace only.
fn seal(system: &System, paths: &[String]) -> Result<()> {
    if paths.is_empty() {
        return Ok(());
    }
    let writable = System::open(&system.path, Access::Write)?;
    if writable.live {
        crate::system::remount_writable(Path::new("/sysroot"))?;
    }
    let checkout = writable
        .path
        .join(writable.sysroot.deployment_dirpath(&writable.current).as_str());
    let deployment = ImageRoot::open(&checkout)?;
    for rel in paths {
        let file = deployment.open_file(Path::new(rel))?;
        enable(&file).with_context(|| format!("sealing /{rel} with fs-verity"))?;
    }
    Ok(())
}

/// Each measured digest against the manifest's, and the files either side
/// lacks (pure).
fn compare(manifest: &Manifest, digests: &BTreeMap<String, Digest>, on_disk: BTreeSet<String>) -> Findings {
    let changed = digests
        .iter()
        .filter(|(rel, digest)| manifest.files.get(*rel) != Some(digest))
        .map(|(rel, _)| rel.clone())
        .collect();
    let missing = manifest
        .files
        .keys()
        .filter(|p| !on_disk.contains(p.as_str()))
        .cloned()
        .collect();
    let added = on_disk
        .into_iter()
        .filter(|p| p != verity::MANIFEST_PATH && !manifest.files.contains_key(p))
        .collect();
    Findings {
        changed,
        missing,
        added,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn findings_name_the_first_path_of_each_kind_and_count_the_rest() {
        let findings = Findings {
            changed: vec!["usr/bin/a".into(), "usr/bin/b".into(), "usr/bin/c".into()],
            missing: vec![],
            added: vec!["usr/bin/x".into()],
        };
        assert_eq!(
            findings.describe(),
            "changed: /usr/bin/a and 2 more; not in the commit: /usr/bin/x"
        );
        assert!(Findings::default().is_empty());
    }

    #[test]
    fn compare_finds_changed_missing_and_added_files() {
        let manifest = Manifest {
            files: BTreeMap::from([
                ("usr/bin/same".to_string(), [1; 32]),
                ("usr/bin/changed".to_string(), [2; 32]),
                ("usr/bin/gone".to_string(), [3; 32]),
            ]),
        };
        let digests = BTreeMap::from([
            ("usr/bin/same".to_string(), [1; 32]),
            ("usr/bin/changed".to_string(), [9; 32]),
        ]);
        let on_disk = [
            "usr/bin/same",
            "usr/bin/changed",
            "usr/bin/new",
            verity::MANIFEST_PATH,
        ]
        .map(String::from)
        .into();
        assert_eq!(
            compare(&manifest, &digests, on_disk),
            Findings {
                changed: vec!["usr/bin/changed".into()],
                missing: vec!["usr/bin/gone".into()],
                added: vec!["usr/bin/new".into()],
            }
        );
    }

    /// The ioctl numbers as linux/fsverity.h builds them.
    #[test]
    fn ioctl_numbers_encode_direction_size_type_and_number() {
        let encode = |dir: libc::c_ulong, size: usize, nr: libc::c_ulong| {
            (dir << 30) | ((size as libc::c_ulong) << 16) | (libc::c_ulong::from(b'f') << 8) | nr
        };
        assert_eq!(FS_IOC_ENABLE_VERITY, encode(1, size_of::<EnableArg>(), 133));
        assert_eq!(FS_IOC_MEASURE_VERITY, encode(3, 4, 134));
        assert_eq!(size_of::<EnableArg>(), 128);
    }
}
