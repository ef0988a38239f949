//! The base rootfs as a commit of its own, in a build repo beside the stage
//! directories: imported once per base tarball, then checked out with
//! hardlinks for every composition. The commit stage takes the files that
//! are still linked to their objects by (device, inode) without reading
//! them ([`crate::ostree::CommitRequest::hardlinked`]), so a one-file
//! overlay change re-hashes that file, not the 10,000 of the base.
//!
//! What keeps this honest: every write into an image tree goes through
//! [`ImageRoot`](emberrtos_contract::io::root::ImageRoot), which breaks a file's hardlink
//! before changing its bytes or its attributes, so no composition ever
//! modifies an object of the build repo.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::cache::FileStamp;
use crate::io::hashing::sha256_hex;
use crate::ostree::{self, CommitRequest, Metadata};
use crate::tool;
use crate::ui::Ui;

/// Where the build repo lives in a work dir.
pub const BUILD_REPO_DIR: &str = "build-repo";

/// Internal refs of imported bases: `imgbuild/base/<sha256>`.
pub const REF_PREFIX: &str = "imgbuild/base/";

/// Changes with imgbuild (and so with how a tarball is extracted), so an
/// import by an older imgbuild is not reused.
const IMPORT_FORMAT: &str = concat!("imgbuild ", env!("CARGO_PKG_VERSION"), " extract 1");

/// The build repo of a work dir, for a build run as root: the repo is
/// `bare`, whose objects keep their real owners and modes on disk, which
/// only root can set. An unprivileged build extracts the base every time
/// (a `bare-user` checkout shows masked modes on disk, which the confined
/// root's writes would carry over).
pub fn build_repo_path(work_dir: &Path) -> Option<PathBuf> {
    tool::running_as_root().then(|| work_dir.join(BUILD_REPO_DIR))
}

/// Opens the build repo, creating it (private to root, host xattrs such
/// as SELinux labels ignored: commits skip xattrs) when missing.
fn open_build_repo(path: &Path) -> Result<::ostree::Repo> {
    let existed = path.join("config").is_file();
    let repo = ostree::open_or_create_with_mode(path, ::ostree::RepoMode::Bare)?;
    if !existed {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700))?;
        let config = repo.copy_config();
        config.set_boolean("core", "disable-xattrs", true);
        repo.write_config(&config)
            .with_context(|| format!("configuring the build repo {}", path.display()))?;
    }
    if repo.mode() != ::ostree::RepoMode::Bare {
        anyhow::bail!(
            "{} is a {:?} ostree repo, not the bare build repo imgbuild makes; remove it",
            path.display(),
            repo.mode()
        );
    }
    Ok(repo)
}

/// The ref of a base tarball's commit: the file itself (size, mtime, inode,
/// device) and this imgbuild's version name it, so a tarball rebuilt under
/// the same cache key (a Debian base made again from a newer archive) is
/// imported afresh, and so is every base after an upgrade of imgbuild.
pub fn base_ref(tarball: &Path) -> Result<String> {
    let stamp = FileStamp::of(tarball)?;
    let identity = serde_json::to_string(&stamp)?;
    Ok(format!(
        "{REF_PREFIX}{}",
        sha256_hex(format!("{IMPORT_FORMAT}\n{identity}\n"))
    ))
}

/// Checks the base out to `dest` (which must not exist) with hardlinks,
/// importing the tarball first when the build repo has no commit of it.
/// `scratch` is a directory on the same filesystem for the import.
pub fn check_out(build_repo: &Path, tarball: &Path, scratch: &Path, dest: &Path, ui: &Ui) -> Result<()> {
    let repo = open_build_repo(build_repo)?;
    let ref_name = base_ref(tarball)?;
    let import_dir = scratch.join("base.import");
    super::remove_if_exists(&import_dir)?;
    let checksum = match ostree::resolve(&repo, &ref_name)? {
        Some(checksum) => {
            ui.note(format!(
                "base rootfs: commit {checksum} of {} (no extraction)",
                tarball.display()
            ));
            checksum
        }
        None => import(&repo, tarball, &import_dir, &ref_name, ui)?,
    };
    ostree::checkout_hardlinked(&repo, &checksum, dest)
}

/// Extracts the tarball as [`super::compose`] always has, moves its files
/// into the repo as one commit and only then sets the ref: a kill before
/// that leaves no ref, and the rerun imports again.
fn import(
    repo: &::ostree::Repo,
    tarball: &Path,
    import_dir: &Path,
    ref_name: &str,
    ui: &Ui,
) -> Result<String> {
    super::extract_base(tarball, import_dir, ui)?;
    ui.note(format!(
        "importing the base rootfs into the build repo as {ref_name}"
    ));
    let result = ostree::commit_tree(
        repo,
        CommitRequest {
            tree: import_dir,
            subject: "imgbuild base rootfs",
            metadata: &Metadata::new(),
            timestamp: 0,
            parent: None,
            force_root_owner: false,
            cancellable: None,
            on_entry: None,
            hardlinked: false,
            consume: true,
            parent_repo: None,
        },
    )
    .with_context(|| format!("importing {} into the build repo", tarball.display()))?;
    ostree::set_ref(repo, ref_name, &result.checksum)?;
    super::remove_if_exists(import_dir)?;
    Ok(result.checksum)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rewritten_tarball_gets_a_new_ref() {
        let dir = tempfile::tempdir().unwrap();
        let tarball = dir.path().join("base.tar");
        std::fs::write(&tarball, b"one").unwrap();
        let first = base_ref(&tarball).unwrap();
        assert!(first.starts_with(REF_PREFIX), "{first}");
        assert_eq!(base_ref(&tarball).unwrap(), first);
        std::fs::write(dir.path().join("new"), b"two!").unwrap();
        std::fs::rename(dir.path().join("new"), &tarball).unwrap();
        assert_ne!(base_ref(&tarball).unwrap(), first);
    }
}
