//! The device's ostree sysroot, staged offline on a tmpfs: `ostree admin
//! init-fs --modern`, `os-init`, a local pull of the refs, the device's
//! remote, and the deployment with its kernel arguments.
//!
//! Everything goes through libostree (the `ostree` crate): init
//! (`ensure_initialized`, `init_osname`), the pull (`pull_with_options` from
//! a `file://` URL, which is what `ostree pull-local` does), the remote
//! (`remote_add`, `remote_gpg_import`), the config and the deploy
//! (`deploy_tree_with_options`, `simple_write_deployment`). Only GRUB's menu
//! needs the CLI (`ostree admin instutil grub2-generate`, see
//! [`super::bootloader`]), as libostree exports no API for it.
//!
//! The deploy syncs and freezes (FIFREEZE) the filesystem of `/boot`; on a
//! tmpfs that is refused and skipped, on the host's disk it would freeze the
//! host. So the staging directory must be a tmpfs ([`Staging::create`]).
//! Deployments are immutable (`chattr +i`); [`Staging`] clears the flag
//! before removing them, on every path.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use gio::prelude::FileExt;
use glib::prelude::*;
use ostree::gio;

use super::filesystem::{is_immutable, set_immutable};
use emberrtos_contract::io::root::ImageRoot;

/// The stateroot (`ostree admin os-init`) every disk deploys into.
pub const OSNAME: &str = "emberrtos";
/// The device's remote, when the disk is given one.
pub const REMOTE: &str = "emberrtos";
/// Where staging directories go: a tmpfs on every Linux host.
pub const STAGING_PARENT: &str = "/dev/shm";
const STAGING_PREFIX: &str = "imgbuild-disk-";

/// A staging directory on a tmpfs, removed with everything in it (immutable
/// deployments included) when dropped.
pub struct Staging {
    path: PathBuf,
}

impl Staging {
    /// Creates `<parent>/imgbuild-disk-<pid>-<random>`, first removing those
    /// that dead imgbuild processes left behind (a SIGKILL skips `Drop`).
    pub fn create(parent: &Path) -> Result<Staging> {
        require_tmpfs(parent)?;
        sweep_stale(parent);
        let dir = tempfile::Builder::new()
            .prefix(&format!("{STAGING_PREFIX}{}-", std::process::id()))
            .tempdir_in(parent)
            .with_context(|| format!("creating a staging dir in {}", parent.display()))?;
        Ok(Staging { path: dir.keep() })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if let Err(e) = remove_tree(&self.path) {
            eprintln!("warning: removing {}: {e:#}", self.path.display());
        }
    }
}

/// Refuses a staging parent that is not a tmpfs.
fn require_tmpfs(dir: &Path) -> Result<()> {
    if crate::io::filesystem_magic(dir)? != libc::TMPFS_MAGIC {
        bail!(
            "{} is not a tmpfs: ostree's deploy freezes the filesystem it writes to, so the sysroot is staged only on a tmpfs",
            dir.display()
        );
    }
    Ok(())
}

/// Removes staging dirs whose imgbuild process is gone.
fn sweep_stale(parent: &Path) {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix(STAGING_PREFIX)
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        let alive = Path::new(&format!("/proc/{pid}")).exists();
        if !alive && entry.file_type().is_ok_and(|t| t.is_dir()) {
            let _ = remove_tree(&entry.path());
        }
    }
}

/// Clears the immutable flag of every directory under `dir`, then removes it.
pub fn remove_tree(dir: &Path) -> Result<()> {
    if dir.symlink_metadata().is_err() {
        return Ok(());
    }
    for entry in walkdir::WalkDir::new(dir).into_iter().flatten() {
        if entry.file_type().is_dir() && is_immutable(entry.path())? {
            set_immutable(entry.path(), false)?;
        }
    }
    std::fs::remove_dir_all(dir).with_context(|| format!("removing {}", dir.display()))
}

/// `ostree admin init-fs --modern SYSROOT` and `ostree admin os-init`.
pub fn init(sysroot: &Path) -> Result<()> {
    ImageRoot::open(sysroot)?.create_dir_all(Path::new("boot"), 0o755)?;
    let handle = ostree::Sysroot::new(Some(&gio::File::for_path(sysroot)));
    handle
        .ensure_initialized(gio::Cancellable::NONE)
        .context("initializing the sysroot")?;
    handle
        .load(gio::Cancellable::NONE)
        .context("loading the sysroot")?;
    handle
        .init_osname(OSNAME, gio::Cancellable::NONE)
        .with_context(|| format!("creating the stateroot {OSNAME}"))?;
    Ok(())
}

/// The sysroot's repo (`SYSROOT/ostree/repo`).
pub fn repo(sysroot: &Path) -> Result<ostree::Repo> {
    crate::ostree::open(&sysroot.join("ostree/repo"))
}

/// Pulls `commits` (checksums, so exactly what the gate passed) from the
/// repo at `source` (`ostree pull-local`), without GPG checks: the source is
/// the build's own repo.
pub fn pull_local(dest: &ostree::Repo, source: &Path, commits: &[&str]) -> Result<()> {
    let source = std::path::absolute(source)?;
    let url = url::Url::from_directory_path(&source)
        .map_err(|()| anyhow::anyhow!("{} cannot be a file:// URL", source.display()))?;
    let options = glib::VariantDict::new(None);
    options.insert_value("refs", &commits.to_variant());
    options.insert_value("flags", &(ostree::RepoPullFlags::NONE.bits() as i32).to_variant());
    options.insert_value("gpg-verify", &false.to_variant());
    options.insert_value("gpg-verify-summary", &false.to_variant());
    dest.pull_with_options(url.as_str(), &options.end(), None, gio::Cancellable::NONE)
        .with_context(|| format!("pulling {} from {}", commits.join(", "), source.display()))
}

/// Points `ref_name` (under `remote` when given) at `checksum`.
pub fn set_ref(repo: &ostree::Repo, remote: Option<&str>, ref_name: &str, checksum: &str) -> Result<()> {
    repo.set_ref_immediate(remote, ref_name, Some(checksum), gio::Cancellable::NONE)
        .with_context(|| format!("setting ref {ref_name} to {checksum}"))
}

/// Adds the device's remote [`REMOTE`] at `url` with GPG verification of
/// commits and summary, trusting the OpenPGP public key(s) in `key`. The
/// import runs `ostree remote gpg-import`: the crate's `remote_gpg_import`
/// cannot pass "all keys" (it sends an empty list, and libostree then
/// exports none).
pub fn add_remote(repo: &ostree::Repo, repo_path: &Path, url: &str, key: &[u8]) -> Result<()> {
    let options = glib::VariantDict::new(None);
    for name in ["gpg-verify", "gpg-verify-summary"] {
        options.insert_value(name, &"true".to_variant());
    }
    repo.remote_add(REMOTE, Some(url), Some(&options.end()), gio::Cancellable::NONE)
        .with_context(|| format!("adding the remote {REMOTE} ({url})"))?;
    let mut key_file = tempfile::NamedTempFile::new().context("creating a temp file for the key")?;
    std::io::Write::write_all(&mut key_file, key)?;
    let output = crate::tool::run(
        crate::tool::command("ostree")?
            .arg(format!("--repo={}", repo_path.display()))
            .args(["remote", "gpg-import", REMOTE, "--keyring"])
            .arg(key_file.path()),
    )
    .context("importing the remote's GPG key")?;
    let said = String::from_utf8_lossy(&output.stdout);
    if said.trim().starts_with("Imported 0 ") {
        bail!("the remote's GPG key file holds no key that could be imported");
    }
    Ok(())
}

/// Sets `sysroot.<key>` in the repo's config.
pub fn set_sysroot_config(repo: &ostree::Repo, key: &str, value: &str) -> Result<()> {
    set_repo_config(repo, "sysroot", key, value)
}

/// Sets `<section>.<key>` in the repo's config.
pub fn set_repo_config(repo: &ostree::Repo, section: &str, key: &str, value: &str) -> Result<()> {
    let config = repo.copy_config();
    config.set_string(section, key, value);
    repo.write_config(&config)
        .with_context(|| format!("setting {section}.{key}={value}"))
}

/// What the deploy made.
#[derive(Clone, Debug)]
pub struct Deployed {
    /// The deployment's root directory.
    pub dir: PathBuf,
    /// The `/boot/loader.N` ostree wrote and pointed `/boot/loader` at.
    pub bootversion: i32,
    /// The origin's refspec.
    pub refspec: String,
}

/// `ostree admin deploy --os=emberrtos --karg=… CHECKSUM` with `refspec` as
/// the origin (what `ostree admin upgrade` follows).
pub fn deploy(sysroot: &Path, checksum: &str, refspec: &str, kargs: &[String]) -> Result<Deployed> {
    let handle = ostree::Sysroot::new(Some(&gio::File::for_path(sysroot)));
    handle
        .load(gio::Cancellable::NONE)
        .context("loading the sysroot")?;
    let origin = handle.origin_new_from_refspec(refspec);
    let argv: Vec<&str> = kargs.iter().map(String::as_str).collect();
    let opts = ostree::SysrootDeployTreeOpts {
        override_kernel_argv: Some(&argv),
        ..Default::default()
    };
    let deployment = handle
        .deploy_tree_with_options(
            Some(OSNAME),
            checksum,
            Some(&origin),
            None,
            Some(&opts),
            gio::Cancellable::NONE,
        )
        .with_context(|| format!("deploying {checksum}"))?;
    handle
        .simple_write_deployment(
            Some(OSNAME),
            &deployment,
            None,
            ostree::SysrootSimpleWriteDeploymentFlags::NONE,
            gio::Cancellable::NONE,
        )
        .context("writing the deployment and its boot entry")?;
    let dir = handle
        .deployment_directory(&deployment)
        .path()
        .context("the deployment has no local path")?;
    handle
        .load(gio::Cancellable::NONE)
        .context("reloading the sysroot")?;
    check_deployments(&handle, checksum, refspec)?;
    Ok(Deployed {
        dir,
        bootversion: handle.bootversion(),
        refspec: refspec.to_string(),
    })
}

/// Exactly one deployment, of `checksum`, whose origin follows `refspec`.
fn check_deployments(handle: &ostree::Sysroot, checksum: &str, refspec: &str) -> Result<()> {
    let deployments = handle.deployments();
    let [deployment] = &deployments[..] else {
        bail!("expected one deployment, found {}", deployments.len());
    };
    if deployment.csum() != checksum {
        bail!("the deployment is of {}, not {checksum}", deployment.csum());
    }
    let origin = deployment
        .origin()
        .and_then(|o| o.string("origin", "refspec").ok())
        .map(|s| s.to_string());
    if origin.as_deref() != Some(refspec) {
        bail!("the deployment's origin is {origin:?}, not {refspec:?}");
    }
    Ok(())
}

/// The deployment's `/etc/fstab`: `/boot` and the ESP by UUID (root is
/// mounted by the initramfs, from `root=`).
pub fn fstab(boot_uuid: &str, esp_volume_id: &str) -> String {
    format!(
        "# Written by imgbuild disk. The root filesystem is mounted by the initramfs (root=UUID=…).\n\
         UUID={boot_uuid} /boot ext4 defaults 0 2\n\
         UUID={esp_volume_id} /boot/efi vfat umask=0077,nofail 0 2\n"
    )
}

/// GRUB's settings for `grub-mkconfig` on the device, which ostree's grub2
/// backend runs (through `/etc/grub.d/15_ostree`) on every deploy;
/// `15_ostree` sources this file and fails without it.
pub const DEFAULT_GRUB: &str = "\
# Written by imgbuild disk. On every deploy on this device ostree's grub2
# backend runs grub-mkconfig, whose /etc/grub.d/15_ostree writes the menu
# into /boot/loader.N/grub.cfg; the ESP's GRUB reads /boot/loader/grub.cfg.
GRUB_DEFAULT=0
GRUB_TIMEOUT=1
GRUB_TIMEOUT_STYLE=menu
GRUB_DISTRIBUTOR=EmberRTOS
GRUB_CMDLINE_LINUX=\"\"
GRUB_CMDLINE_LINUX_DEFAULT=\"\"
GRUB_TERMINAL=\"serial console\"
GRUB_SERIAL_COMMAND=\"serial --unit=0 --speed=115200\"
GRUB_DISABLE_OS_PROBER=true
GRUB_DISABLE_RECOVERY=true
GRUB_DISABLE_SUBMENU=y
";

/// Writes the deployment's `/etc/fstab`, and `/etc/default/grub` unless the
/// commit ships one, through the confined root.
pub fn write_etc(deployment: &Path, fstab_text: &str) -> Result<()> {
    let root = ImageRoot::open(deployment)?;
    root.write(Path::new("etc/fstab"), fstab_text.as_bytes(), 0o644)?;
    if !root.is_file(Path::new("etc/default/grub")) {
        root.write(Path::new("etc/default/grub"), DEFAULT_GRUB.as_bytes(), 0o644)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fstab_mounts_boot_and_the_esp_by_uuid() {
        let text = fstab("0b6c4ad4-1d3f-8a2e-9c1b-77f0e5d2a001", "1234-ABCD");
        let lines: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
        assert_eq!(
            lines,
            [
                "UUID=0b6c4ad4-1d3f-8a2e-9c1b-77f0e5d2a001 /boot ext4 defaults 0 2",
                "UUID=1234-ABCD /boot/efi vfat umask=0077,nofail 0 2",
            ]
        );
    }

    #[test]
    fn a_disk_backed_dir_is_refused_for_staging() {
        let dir = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        let err = Staging::create(dir.path()).err().expect("not a tmpfs");
        assert!(format!("{err:#}").contains("not a tmpfs"), "{err:#}");
    }

    #[test]
    fn staging_is_removed_with_immutable_dirs_inside() {
        let staging = Staging::create(Path::new(STAGING_PARENT)).unwrap();
        let path = staging.path().to_path_buf();
        let deploy = path.join("ostree/deploy/x/deploy/abc.0");
        std::fs::create_dir_all(deploy.join("etc")).unwrap();
        std::fs::write(deploy.join("etc/f"), "x").unwrap();
        let immutable = std::process::Command::new("chattr")
            .arg("+i")
            .arg(&deploy)
            .status()
            .is_ok_and(|s| s.success());
        if !immutable {
            eprintln!("skipping the immutable part: chattr +i failed (not root?)");
        }
        drop(staging);
        assert!(!path.exists());
    }

    #[test]
    fn stale_staging_of_dead_processes_is_swept() {
        let parent = tempfile::tempdir_in(STAGING_PARENT).unwrap();
        // pid_max is at most 2^22: this pid never runs.
        let stale = parent.path().join(format!("{STAGING_PREFIX}99999999-abc"));
        let live = parent
            .path()
            .join(format!("{STAGING_PREFIX}{}-abc", std::process::id()));
        let other = parent.path().join("unrelated-99999999");
        for dir in [&stale, &live, &other] {
            std::fs::create_dir_all(dir.join("sub")).unwrap();
        }
        sweep_stale(parent.path());
        assert!(!stale.exists());
        assert!(live.exists() && other.exists());
    }
}
