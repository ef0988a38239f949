//! The system a device command works on: the ostree sysroot, the deployment
//! that stands for "this system", and its `/` and `/var` as confined roots.
//!
//! On the device (`--sysroot /`) that is the booted deployment and the live
//! `/` and `/var`. On a scratch sysroot (tests, or an image mounted for
//! repair) it is the default deployment: its checkout is `/`, and `/var` is
//! the stateroot's `var`, which ostree bind-mounts there at boot. Writes go
//! through [`ImageRoot`] either way, so a link in `/etc` or `/var` never
//! carries one outside.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use ostree::gio;

use emberrtos_contract::io::root::ImageRoot;

/// Whether a command only reads the sysroot or changes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    Read,
    /// Locks the sysroot; on the device, in a private mount namespace where
    /// libostree may remount `/sysroot` read-write.
    Write,
}

pub struct System {
    /// The sysroot's directory (`/` on the device).
    pub path: PathBuf,
    pub sysroot: ostree::Sysroot,
    /// The running device (`--sysroot /`), as opposed to a scratch sysroot.
    pub live: bool,
    /// `/` of this system.
    pub root: ImageRoot,
    /// `/var` of this system.
    pub var: ImageRoot,
    /// The booted deployment on the device; the default one elsewhere.
    pub current: ostree::Deployment,
}

impl System {
    pub fn open(sysroot: &Path, access: Access) -> Result<System> {
        let live = std::fs::canonicalize(sysroot)
            .with_context(|| format!("opening sysroot {}", sysroot.display()))?
            == Path::new("/");
        if live && access == Access::Write {
            enter_private_mount_namespace()?;
        }
        let handle = ostree::Sysroot::new(Some(&gio::File::for_path(sysroot)));
        if access == Access::Write {
            handle
                .initialize_with_mount_namespace(gio::Cancellable::NONE)
                .context("preparing the sysroot for changes")?;
        }
        handle
            .load(gio::Cancellable::NONE)
            .with_context(|| format!("loading the ostree sysroot {}", sysroot.display()))?;
        if access == Access::Write {
            handle.lock().context("locking the ostree sysroot")?;
        }
        let current = match live {
            true => handle
                .require_booted_deployment()
                .context("this system was not booted from an ostree deployment")?,
            false => match handle.deployments().into_iter().next() {
                Some(deployment) => deployment,
                None => bail!("{} has no deployment", sysroot.display()),
            },
        };
        let (root, var) = match live {
            true => (
                ImageRoot::open(Path::new("/"))?,
                ImageRoot::open(Path::new("/var"))?,
            ),
            false => {
                let checkout = sysroot.join(handle.deployment_dirpath(&current).as_str());
                let var = stateroot_var(sysroot, &current.osname());
                (ImageRoot::open(&checkout)?, ImageRoot::open(&var)?)
            }
        };
        Ok(System {
            path: sysroot.to_path_buf(),
            sysroot: handle,
            live,
            root,
            var,
            current,
        })
    }

    pub fn repo(&self) -> ostree::Repo {
        self.sysroot.repo()
    }

    pub fn osname(&self) -> String {
        self.current.osname().to_string()
    }

    /// Which tree holds absolute `path` of this system, and where in it:
    /// links are followed inside `/` (`/root` -> `/var/roothome`), and what
    /// lands under `/var` is in [`System::var`].
    pub fn place(&self, path: &Path) -> Result<(&ImageRoot, PathBuf)> {
        let resolved = self.root.resolved_partial(path)?;
        Ok(match resolved.strip_prefix("var") {
            Ok(in_var) => (&self.var, in_var.to_path_buf()),
            Err(_) => (&self.root, resolved),
        })
    }
}

/// The persistent `/var` of stateroot `osname`.
pub fn stateroot_var(sysroot: &Path, osname: &str) -> PathBuf {
    sysroot.join("ostree/deploy").join(osname).join("var")
}

/// Moves this process into a mount namespace of its own whose mounts do not
/// propagate back (a slave of the host's): libostree's read-write remount of
/// `/sysroot` and the configuration medium's mount stay private to it and
/// vanish with it. libostree sees a namespace in use and does not unshare again.
fn enter_private_mount_namespace() -> Result<()> {
    // SAFETY: unshare and mount take no pointers we own beyond the static
    // C strings passed; they change only this process's mount namespace.
    unsafe {
        if libc::unshare(libc::CLONE_NEWNS) != 0 {
            return Err(std::io::Error::last_os_error()).context("unshare(CLONE_NEWNS)");
        }
        let flags = libc::MS_REC | libc::MS_SLAVE;
        if libc::mount(
            c"none".as_ptr(),
            c"/".as_ptr(),
            std::ptr::null(),
            flags,
            std::ptr::null(),
        ) != 0
        {
            return Err(std::io::Error::last_os_error())
                .context("making / a slave mount in the new namespace");
        }
    }
    Ok(())
}

/// Makes the mount at `mount_point` writable if it is read-only: a bind
/// remount, which changes this mount's flag only (the filesystem is
/// already read-write under `/`). Call it in the private namespace
/// [`System::open`] enters for [`Access::Write`], where it stays.
pub fn remount_writable(mount_point: &Path) -> Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let target = std::ffi::CString::new(mount_point.as_os_str().as_bytes())?;
    // SAFETY: `target` is a NUL-terminated path that outlives both calls,
    // and `stat` is a plain struct the kernel fills.
    unsafe {
        let mut stat: libc::statvfs = std::mem::zeroed();
        if libc::statvfs(target.as_ptr(), &mut stat) != 0 {
            return Err(std::io::Error::last_os_error())
                .with_context(|| format!("statvfs {}", mount_point.display()));
        }
        if stat.f_flag & libc::ST_RDONLY == 0 {
            return Ok(());
        }
        let flags = libc::MS_REMOUNT | libc::MS_BIND;
        if libc::mount(
            std::ptr::null(),
            target.as_ptr(),
            std::ptr::null(),
            flags,
            std::ptr::null(),
        ) != 0
        {
            return Err(std::io::Error::last_os_error())
                .with_context(|| format!("remounting {} read-write", mount_point.display()));
        }
    }
    Ok(())
}

/// The refspec a deployment tracks (`remote:ref` or a local `ref`).
pub fn origin_refspec(deployment: &ostree::Deployment) -> Result<String> {
    let origin = deployment
        .origin()
        .with_context(|| format!("deployment {} has no origin", deployment.csum()))?;
    let refspec = origin
        .string("origin", "refspec")
        .with_context(|| format!("the origin of deployment {} names no refspec", deployment.csum()))?;
    Ok(refspec.to_string())
}

/// A refspec split into its remote (if any) and its ref, both validated by libostree.
pub fn split_refspec(refspec: &str) -> Result<(Option<String>, String)> {
    let (remote, ref_name) =
        ostree::parse_refspec(refspec).with_context(|| format!("{refspec:?} is not an ostree refspec"))?;
    Ok((remote.map(|r| r.to_string()), ref_name.to_string()))
}
