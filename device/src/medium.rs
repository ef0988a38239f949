//! The configuration medium on the device: any FAT or ISO 9660 filesystem
//! labelled `EMBERCFG`, mounted read-only, `nosuid,nodev,noexec`, in a
//! private directory, and read as hostile input: every path is resolved
//! inside the medium, only regular files are read, and each read is
//! size-limited.

use std::ffi::CString;
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use emberrtos_contract::io::root::ImageRoot;
use emberrtos_contract::provision::MAX_INPUT_BYTES;

/// The filesystems a medium may hold.
const FILESYSTEMS: &[&str] = &["vfat", "iso9660"];

/// A medium's files, confined to it.
pub struct Medium {
    root: ImageRoot,
    /// Unmounts the medium when dropped; none for a plain directory.
    _mount: Option<Mounted>,
}

impl Medium {
    /// A directory holding the medium's files (tests, or a medium mounted by hand).
    pub fn dir(path: &Path) -> Result<Medium> {
        Ok(Medium {
            root: ImageRoot::open(path)
                .with_context(|| format!("opening the medium directory {}", path.display()))?,
            _mount: None,
        })
    }

    /// Finds the filesystem labelled `label` (waiting up to `wait` for udev
    /// to announce it) and mounts it; `None` when there is none.
    pub fn find(label: &str, wait: Duration) -> Result<Option<Medium>> {
        let Some(device) = find_device(label, wait)? else {
            return Ok(None);
        };
        let mounted = Mounted::new(&device)?;
        Ok(Some(Medium {
            root: ImageRoot::open(&mounted.dir)?,
            _mount: Some(mounted),
        }))
    }

    /// The bytes of regular file `rel` on the medium, at most
    /// `MAX_INPUT_BYTES`. Links resolve inside the medium; anything but a
    /// regular file (a FIFO, a device, a directory) is refused before it is opened.
    pub fn read(&self, rel: &str) -> Result<Vec<u8>> {
        let rel = Path::new(rel);
        let resolved = self
            .root
            .resolved(rel)
            .with_context(|| format!("{} is not on the medium", rel.display()))?;
        let is_file = self
            .root
            .symlink_metadata(&resolved)?
            .is_some_and(|meta| meta.is_file());
        if !is_file {
            bail!("{} on the medium is not a regular file", rel.display());
        }
        let mut data = Vec::new();
        self.root
            .open_file(&resolved)?
            .take(MAX_INPUT_BYTES + 1)
            .read_to_end(&mut data)
            .with_context(|| format!("reading {} from the medium", rel.display()))?;
        if data.len() as u64 > MAX_INPUT_BYTES {
            bail!(
                "{} on the medium is larger than {MAX_INPUT_BYTES} bytes",
                rel.display()
            );
        }
        Ok(data)
    }
}

/// `/dev/disk/by-label/<label>` once udev has settled, polled until `wait`
/// is over (a USB stick may announce itself late); the device it names.
fn find_device(label: &str, wait: Duration) -> Result<Option<PathBuf>> {
    let link = Path::new("/dev/disk/by-label").join(label);
    let deadline = Instant::now() + wait;
    let _ = std::process::Command::new("udevadm")
        .args(["settle", &format!("--timeout={}", wait.as_secs().max(1))])
        .status();
    loop {
        if link.exists() {
            return std::fs::canonicalize(&link)
                .map(Some)
                .with_context(|| format!("resolving {}", link.display()));
        }
        if Instant::now() >= deadline {
            return Ok(None);
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// A read-only mount in a fresh private directory, undone when dropped.
struct Mounted {
    dir: PathBuf,
    _parent: tempfile::TempDir,
}

impl Mounted {
    fn new(device: &Path) -> Result<Mounted> {
        let parent = tempfile::Builder::new()
            .prefix("emberrtos-medium-")
            .tempdir_in("/run")
            .context("creating a mount point in /run")?;
        let dir = parent.path().join("medium");
        std::fs::create_dir(&dir)?;
        let source = CString::new(device.as_os_str().as_bytes())?;
        let target = CString::new(dir.as_os_str().as_bytes())?;
        let flags = libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
        let mut errors = Vec::new();
        for fs in FILESYSTEMS {
            let fstype = CString::new(*fs)?;
            // SAFETY: every pointer is a NUL-terminated string that outlives the call.
            let rc = unsafe {
                libc::mount(
                    source.as_ptr(),
                    target.as_ptr(),
                    fstype.as_ptr(),
                    flags,
                    std::ptr::null(),
                )
            };
            if rc == 0 {
                return Ok(Mounted { dir, _parent: parent });
            }
            errors.push(format!("{fs}: {}", std::io::Error::last_os_error()));
        }
        bail!(
            "mounting the configuration medium {} read-only failed ({})",
            device.display(),
            errors.join("; ")
        )
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if let Ok(target) = CString::new(self.dir.as_os_str().as_bytes()) {
            // SAFETY: a NUL-terminated path; MNT_DETACH never blocks on a busy mount.
            unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn reads_stay_inside_the_medium() {
        let host = tempfile::tempdir().unwrap();
        std::fs::write(host.path().join("secret"), "host\n").unwrap();
        let dir = tempfile::tempdir().unwrap();
        let medium_dir = dir.path();
        std::fs::create_dir_all(medium_dir.join("emberrtos/keys")).unwrap();
        std::fs::write(medium_dir.join("emberrtos/provision.yaml"), "flavor: rt\n").unwrap();
        std::fs::write(medium_dir.join("emberrtos/keys/k.asc"), "key\n").unwrap();
        symlink(host.path().join("secret"), medium_dir.join("emberrtos/abs.asc")).unwrap();
        symlink("../../../../../../../..", medium_dir.join("emberrtos/up")).unwrap();
        symlink("keys/k.asc", medium_dir.join("emberrtos/rel.asc")).unwrap();
        symlink("/emberrtos/keys/k.asc", medium_dir.join("emberrtos/rooted.asc")).unwrap();
        let medium = Medium::dir(medium_dir).unwrap();

        assert_eq!(medium.read("emberrtos/provision.yaml").unwrap(), b"flavor: rt\n");
        // Links resolve inside the medium: relative, and absolute ones re-rooted.
        assert_eq!(medium.read("emberrtos/rel.asc").unwrap(), b"key\n");
        assert_eq!(medium.read("emberrtos/rooted.asc").unwrap(), b"key\n");
        // A link to a host file, or out through `..`, never reaches the host.
        assert!(medium.read("emberrtos/abs.asc").is_err());
        let up = host.path().join("secret");
        let through_up = format!("emberrtos/up{}", up.display());
        assert!(medium.read(&through_up).is_err());
        assert!(medium.read("emberrtos/../../secret").is_err());
        // Only regular files.
        assert!(format!("{:#}", medium.read("emberrtos/keys").unwrap_err()).contains("not a regular file"));
        let fifo = CString::new(medium_dir.join("emberrtos/fifo.asc").as_os_str().as_bytes()).unwrap();
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
        assert!(medium.read("emberrtos/fifo.asc").is_err());
        // Bounded.
        std::fs::write(
            medium_dir.join("emberrtos/big"),
            vec![b'x'; MAX_INPUT_BYTES as usize + 1],
        )
        .unwrap();
        assert!(format!("{:#}", medium.read("emberrtos/big").unwrap_err()).contains("larger than"));
    }

    /// A 23 KB medium once made a 33 MB `authorized_keys`: one long key
    /// aliased thousands of times. Read as provisioning reads it, the file is
    /// refused before it is deserialized; a key given twice is kept once.
    #[test]
    fn a_medium_cannot_amplify_or_repeat_roots_keys() {
        use emberrtos_contract::provision::{self, MEDIUM_FILE};
        const KEY: &str = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIMb0BNNQoj3nWEsjM+9r/UoI4GBWm7F3uUbLuQGNTzYr ops@example.org";
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("emberrtos")).unwrap();
        let medium = Medium::dir(dir.path()).unwrap();
        let parse = |keys: String| {
            let text = format!("flavor: standard\nhostname: a\nssh-authorized-keys: [{keys}]\n");
            std::fs::write(dir.path().join(MEDIUM_FILE), text).unwrap();
            let read = String::from_utf8(medium.read(MEDIUM_FILE).unwrap()).unwrap();
            provision::parse(&read, MEDIUM_FILE)
        };
        let long = format!("'{KEY}{}'", "c".repeat(6000));
        let amplified = parse(format!("&k {long},{}", vec!["*k"; 4000].join(","))).unwrap_err();
        assert!(amplified.message.contains("aliases expand"), "{amplified}");
        let twice = parse(format!("'{KEY}', '{KEY}'")).unwrap();
        assert_eq!(twice.authorized_keys(), format!("{KEY}\n"));
    }
}
