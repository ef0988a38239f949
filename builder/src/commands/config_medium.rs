//! `imgbuild config-medium`: writes the configuration medium (docs/ARCHITECTURE.md,
//! "The device contract"), a small FAT image labelled [`LABEL`] that holds
//! `emberrtos/provision.yaml` (the validated file, byte for byte) and, when
//! `update-remote.gpg-key` names one, the publisher's key beside it.
//!
//! Every input is checked before anything is written; a bad one is a
//! [`ProvisionError`] naming the field (exit 2), and an `--out` that is one
//! of the inputs a [`BadInput`] (exit 2). The image is built without
//! loop mounts by mtools (`mformat`, `mmd`, `mcopy`) in a temp file beside
//! the output and renamed into place when complete. It is reproducible: the
//! volume id is derived from the content, and every timestamp is
//! `SOURCE_DATE_EPOCH` (else [`DEFAULT_EPOCH`]) in UTC.

use std::io::Read;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result};
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::io::hashing::sha256_file;
use crate::tool;
use emberrtos_contract::error::BadInput;
use emberrtos_contract::io::root::ImageRoot;
use emberrtos_contract::provision::{self, Flavor, LABEL, MEDIUM_FILE, Provision, ProvisionError};

/// The image size: 8 MiB, FAT12 with 2 KiB clusters, room for the file and
/// a few keys, small enough to `dd` to any stick.
pub const IMAGE_SIZE: u64 = 8 * 1024 * 1024;
/// The image's sectors (512 bytes), as mformat takes them.
const SECTORS: u64 = IMAGE_SIZE / 512;
use crate::stages::disk::filesystem::{FAT_FIRST_EPOCH as DEFAULT_EPOCH, LAST_FAT_EPOCH};
pub use emberrtos_contract::provision::MAX_INPUT_BYTES;

const GPG_KEY_FIELD: &str = "update-remote.gpg-key";

pub struct MediumOptions<'a> {
    /// The `provision.yaml` to put on the medium.
    pub provision: &'a Path,
    /// The image to write.
    pub out: &'a Path,
    /// The publisher key, instead of the file `update-remote.gpg-key` names
    /// beside the yaml.
    pub gpg_key: Option<&'a Path>,
}

/// What was written.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct MediumReport {
    pub image: PathBuf,
    pub sha256: String,
    pub size: u64,
    pub label: &'static str,
    /// The FAT volume serial, `XXXX-XXXX` as `blkid` prints it.
    pub volume_id: String,
    /// Paths on the medium.
    pub files: Vec<String>,
    pub flavor: Flavor,
    pub hostname: String,
}

/// A file for the medium: its path there, its bytes, and the host file
/// they were read from.
struct MediumFile {
    path: String,
    data: Vec<u8>,
    from: Input,
}

/// A host file read as an input: its path as given and its identity.
struct Input {
    shown: PathBuf,
    /// `(st_dev, st_ino)` of the file that was read.
    id: (u64, u64),
}

impl Input {
    fn new(shown: &Path, meta: &std::fs::Metadata) -> Input {
        Input {
            shown: shown.to_path_buf(),
            id: (meta.dev(), meta.ino()),
        }
    }
}

/// Validates the inputs, then writes the medium to `options.out`.
pub fn build(options: &MediumOptions) -> Result<MediumReport> {
    let (provision, files) = gather(options)?;
    refuse_overwriting_inputs(options.out, &files)?;
    tool::require("mformat")?;
    let serial = volume_serial(&files);
    let epoch = fat_epoch(std::env::var("SOURCE_DATE_EPOCH").ok().as_deref());
    write_image(&files, serial, epoch, options.out)?;
    Ok(MediumReport {
        image: options.out.to_path_buf(),
        sha256: sha256_file(options.out, None)?,
        size: IMAGE_SIZE,
        label: LABEL,
        volume_id: format!("{:04X}-{:04X}", serial >> 16, serial & 0xffff),
        files: files.into_iter().map(|f| f.path).collect(),
        flavor: provision.flavor,
        hostname: provision.hostname,
    })
}

/// Reads and checks every input: the yaml, then the key it names.
fn gather(options: &MediumOptions) -> Result<(Provision, Vec<MediumFile>), ProvisionError> {
    let name = options.provision.display().to_string();
    let file_error = |message: String| ProvisionError {
        file: name.clone(),
        field: String::new(),
        position: None,
        message,
    };
    let (bytes, from) =
        read_regular_file(options.provision).map_err(|e| file_error(format!("cannot read: {e}")))?;
    let text = String::from_utf8(bytes).map_err(|_| file_error("is not UTF-8 text".into()))?;
    let provision = provision::parse(&text, &name)?;
    let mut files = vec![MediumFile {
        path: MEDIUM_FILE.to_string(),
        data: text.into_bytes(),
        from,
    }];
    if let Some(key) = gpg_key(&provision, options)? {
        files.push(key);
    }
    Ok((provision, files))
}

/// The key file for `update-remote.gpg-key`: `--gpg-key`, else the file of
/// that name beside the yaml (resolved inside the yaml's directory, so a
/// symlink cannot carry a host file onto the medium).
fn gpg_key(provision: &Provision, options: &MediumOptions) -> Result<Option<MediumFile>, ProvisionError> {
    let Some(path) = provision.gpg_key_on_medium() else {
        return match options.gpg_key {
            Some(given) => Err(provision.error(
                GPG_KEY_FIELD,
                format!(
                    "--gpg-key {} was given but update-remote.gpg-key does not name the key's file on the medium",
                    given.display()
                ),
            )),
            None => Ok(None),
        };
    };
    let name = path
        .strip_prefix(&format!("{}/", provision::MEDIUM_DIR))
        .expect("under the medium dir");
    let (data, from) = match options.gpg_key {
        Some(given) => read_regular_file(given)
            .map_err(|e| provision.error(GPG_KEY_FIELD, format!("--gpg-key {}: {e}", given.display())))?,
        None => read_beside(options.provision, name).map_err(|e| {
            provision.error(
                GPG_KEY_FIELD,
                format!("{e:#}; put the key beside the yaml or pass --gpg-key FILE"),
            )
        })?,
    };
    crate::ostree::gpg_public_key(&data).map_err(|e| provision.error(GPG_KEY_FIELD, e))?;
    Ok(Some(MediumFile { path, data, from }))
}

/// Refuses an `--out` that is one of the files read: the same file once
/// links are followed (same device and inode, which canonical paths that
/// compare equal also are). An output that does not exist yet is no input.
fn refuse_overwriting_inputs(out: &Path, files: &[MediumFile]) -> Result<(), BadInput> {
    let Ok(meta) = std::fs::metadata(out) else {
        return Ok(());
    };
    match files.iter().find(|file| file.from.id == (meta.dev(), meta.ino())) {
        Some(file) => Err(BadInput::new(
            "--out",
            format!(
                "{} is the input {}: the image would overwrite it; write it elsewhere",
                out.display(),
                file.from.shown.display()
            ),
        )),
        None => Ok(()),
    }
}

/// Reads `rel` inside the directory of `yaml`, refusing anything but a
/// regular file (a symlink, a FIFO, a device).
fn read_beside(yaml: &Path, rel: &str) -> Result<(Vec<u8>, Input)> {
    let dir = match yaml.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    let root = ImageRoot::open(dir)?;
    let shown = dir.join(rel);
    let meta = root
        .symlink_metadata(Path::new(rel))?
        .with_context(|| format!("{} not found", shown.display()))?;
    anyhow::ensure!(meta.is_file(), "{} is not a regular file", shown.display());
    anyhow::ensure!(
        meta.len() <= MAX_INPUT_BYTES,
        "{} is larger than {MAX_INPUT_BYTES} bytes",
        shown.display()
    );
    Ok((root.read(Path::new(rel))?, Input::new(&shown, &meta)))
}

/// Reads a regular file of at most [`MAX_INPUT_BYTES`]; opening never blocks
/// on a FIFO.
fn read_regular_file(path: &Path) -> std::io::Result<(Vec<u8>, Input)> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    let mut data = Vec::new();
    file.take(MAX_INPUT_BYTES + 1).read_to_end(&mut data)?;
    if data.len() as u64 > MAX_INPUT_BYTES {
        return Err(std::io::Error::other(format!(
            "larger than {MAX_INPUT_BYTES} bytes"
        )));
    }
    Ok((data, Input::new(path, &meta)))
}

/// The FAT volume serial: the first 32 bits of a hash of every file's path
/// and content, so one input gives one image.
fn volume_serial(files: &[MediumFile]) -> u32 {
    let mut hash = Sha256::new();
    for file in files {
        for part in [file.path.as_bytes(), &file.data] {
            hash.update((part.len() as u64).to_le_bytes());
            hash.update(part);
        }
    }
    let digest = hash.finalize();
    u32::from_be_bytes(digest[..4].try_into().expect("4 bytes"))
}

/// The timestamp of every entry: `SOURCE_DATE_EPOCH` when it is a number,
/// held inside what FAT can represent, else [`DEFAULT_EPOCH`].
fn fat_epoch(source_date_epoch: Option<&str>) -> u64 {
    source_date_epoch
        .and_then(|s| s.trim().parse::<u64>().ok())
        .map_or(DEFAULT_EPOCH, |e| e.clamp(DEFAULT_EPOCH, LAST_FAT_EPOCH))
}

/// Builds the image in a temp file beside `out` and renames it into place.
fn write_image(files: &[MediumFile], serial: u32, epoch: u64, out: &Path) -> Result<()> {
    let dir = match out.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    let temp = tempfile::Builder::new()
        .prefix(".config-medium-")
        .suffix(".tmp")
        .tempfile_in(dir)
        .with_context(|| format!("creating a temp file in {}", dir.display()))?;
    temp.as_file()
        .set_len(IMAGE_SIZE)
        .with_context(|| format!("sizing {}", temp.path().display()))?;
    let staging = tempfile::tempdir().context("creating a staging dir")?;
    let mtools = |tool: &str| -> Result<Command> {
        let mut cmd = tool::command(tool)?;
        cmd.env("MTOOLS_SKIP_CHECK", "1")
            .env("MTOOLSRC", "/dev/null")
            .env("TZ", "UTC")
            .env("SOURCE_DATE_EPOCH", epoch.to_string())
            .arg("-i")
            .arg(temp.path());
        Ok(cmd)
    };
    tool::run(mtools("mformat")?.args([
        "-v",
        LABEL,
        "-N",
        &format!("{serial:08x}"),
        "-T",
        &SECTORS.to_string(),
        "-h",
        "1",
        "-s",
        "32",
        "::",
    ]))?;
    for dir in directories(files) {
        tool::run(mtools("mmd")?.arg(format!("::{dir}")))?;
    }
    for (i, file) in files.iter().enumerate() {
        let host = staging.path().join(i.to_string());
        std::fs::write(&host, &file.data).with_context(|| format!("writing {}", host.display()))?;
        tool::run(mtools("mcopy")?.arg(&host).arg(format!("::{}", file.path)))?;
    }
    // Public content only (the yaml, public keys): readable like any image.
    temp.as_file()
        .set_permissions(std::fs::Permissions::from_mode(0o644))
        .with_context(|| format!("setting the mode of {}", temp.path().display()))?;
    temp.as_file()
        .sync_all()
        .with_context(|| format!("syncing {}", temp.path().display()))?;
    temp.persist(out)
        .with_context(|| format!("renaming the image to {}", out.display()))?;
    Ok(())
}

/// Every directory the files need, parents first.
fn directories(files: &[MediumFile]) -> Vec<String> {
    let mut dirs: Vec<String> = files
        .iter()
        .flat_map(|f| {
            let parts: Vec<&str> = f.path.split('/').collect();
            (1..parts.len()).map(move |n| parts[..n].join("/"))
        })
        .collect();
    dirs.sort();
    dirs.dedup();
    dirs
}

#[cfg(test)]
mod tests {
    use super::*;
    use emberrtos_contract::error::{exit, exit_code};

    const KEY: &str =
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIMb0BNNQoj3nWEsjM+9r/UoI4GBWm7F3uUbLuQGNTzYr ops@example.org";
    /// A binary public key packet (tag 6) and a user ID packet (tag 13).
    const PUBLIC_KEY: [u8; 8] = [0x98, 2, 4, 0, 0xb4, 2, b'i', b'd'];

    fn file(path: &str, data: &[u8]) -> MediumFile {
        MediumFile {
            path: path.into(),
            data: data.to_vec(),
            from: Input {
                shown: PathBuf::from(path),
                id: (0, 0),
            },
        }
    }

    /// A dir with `provision.yaml` naming `publisher.asc`, and that key.
    fn workspace(key: &[u8]) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let yaml = dir.path().join("provision.yaml");
        std::fs::write(
            &yaml,
            format!(
                "flavor: rt\nhostname: cell-07\nssh-authorized-keys: [\"{KEY}\"]\nupdate-remote: {{url: https://updates.example.org/emberrtos/, gpg-key: publisher.asc}}\n"
            ),
        )
        .unwrap();
        std::fs::write(dir.path().join("publisher.asc"), key).unwrap();
        (dir, yaml)
    }

    fn build_to(yaml: &Path, out: &Path, gpg_key: Option<&Path>) -> anyhow::Error {
        let options = MediumOptions {
            provision: yaml,
            out,
            gpg_key,
        };
        build(&options).expect_err("must be refused")
    }

    #[test]
    fn an_output_that_is_an_input_is_refused_before_anything_is_written() {
        let (dir, yaml) = workspace(&PUBLIC_KEY);
        let key = dir.path().join("publisher.asc");
        let given = dir.path().join("given.asc");
        std::fs::write(&given, PUBLIC_KEY).unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::os::unix::fs::symlink(&yaml, dir.path().join("link.img")).unwrap();
        std::fs::hard_link(&yaml, dir.path().join("hard.img")).unwrap();
        let yaml_text = std::fs::read(&yaml).unwrap();
        for (out, gpg_key, input) in [
            (yaml.clone(), None, &yaml),
            (dir.path().join("./sub/../provision.yaml"), None, &yaml),
            (dir.path().join("link.img"), None, &yaml),
            (dir.path().join("hard.img"), None, &yaml),
            (key.clone(), None, &key),
            (given.clone(), Some(given.as_path()), &given),
        ] {
            let e = build_to(&yaml, &out, gpg_key);
            let bad = e.downcast_ref::<BadInput>().unwrap_or_else(|| panic!("{e:#}"));
            assert_eq!(bad.option, "--out");
            assert!(
                bad.message.contains(&format!("is the input {}", input.display())),
                "{bad}"
            );
            assert_eq!(exit_code(&e), exit::USAGE);
        }
        assert_eq!(std::fs::read(&yaml).unwrap(), yaml_text);
        assert_eq!(std::fs::read(&key).unwrap(), PUBLIC_KEY);
        assert_eq!(std::fs::read(&given).unwrap(), PUBLIC_KEY);
    }

    #[test]
    fn a_binary_secret_key_is_refused_and_never_reaches_the_medium() {
        // The public key followed by a secret subkey packet (tag 7).
        let with_secret = [&PUBLIC_KEY[..], &[0x9c, 1, 4]].concat();
        for key in [&with_secret[..], &[0x95, 1, 4][..], &[0xc5, 1, 4]] {
            let (dir, yaml) = workspace(key);
            let out = dir.path().join("cfg.img");
            let e = build_to(&yaml, &out, None);
            let e = e
                .downcast_ref::<ProvisionError>()
                .unwrap_or_else(|| panic!("{e:#}"));
            assert_eq!(e.field, GPG_KEY_FIELD);
            assert!(e.message.contains("private key"), "{e}");
            assert!(!out.exists());
            let given = build_to(&yaml, &out, Some(&dir.path().join("publisher.asc")));
            assert!(format!("{given:#}").contains("private key"), "{given:#}");
            assert!(!out.exists());
        }
    }

    #[test]
    fn directories_come_parents_first() {
        assert_eq!(
            directories(&[
                file("emberrtos/provision.yaml", b""),
                file("emberrtos/keys/a/p.asc", b"")
            ]),
            ["emberrtos", "emberrtos/keys", "emberrtos/keys/a"]
        );
    }

    #[test]
    fn epochs_stay_inside_fat_time() {
        assert_eq!(fat_epoch(None), DEFAULT_EPOCH);
        assert_eq!(fat_epoch(Some("0")), DEFAULT_EPOCH);
        assert_eq!(fat_epoch(Some("garbage")), DEFAULT_EPOCH);
        assert_eq!(fat_epoch(Some(" 1700000000\n")), 1_700_000_000);
        assert_eq!(fat_epoch(Some("99999999999")), LAST_FAT_EPOCH);
    }

    #[test]
    fn volume_serial_follows_the_content() {
        let one = |path: &str, data: &[u8]| volume_serial(&[file(path, data)]);
        assert_eq!(one("a", b"x"), one("a", b"x"));
        assert_ne!(one("a", b"x"), one("a", b"y"));
        assert_ne!(one("ab", b"x"), one("a", b"bx"));
    }
}
