//! Overlays: directory trees copied onto the rootfs in recipe order.
//!
//! Git keeps only the executable bit, so modes other than 0644/0755 and
//! owners other than root are declared in an optional `overlay.attrs` file at
//! the overlay's root:
//!
//! ```text
//! # path                          mode  owner
//! /etc/sudoers.d/ops              0440  0:0
//! /var/lib/app                    0750  101:101
//! ```
//!
//! Symlinks are recorded as symlinks. Paths are resolved inside the rootfs,
//! so an absolute symlink in the rootfs never redirects a write to the host.

use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use anyhow::{Context, Result, bail};

pub const ATTRS_FILE: &str = "overlay.attrs";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Attr {
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}:{line}: {message}")]
pub struct AttrsError {
    pub file: String,
    pub line: usize,
    pub message: String,
}

/// Parses `overlay.attrs` text into path (relative, no leading `/`) → attr.
pub fn parse_attrs(text: &str, file: &str) -> Result<BTreeMap<PathBuf, Attr>, AttrsError> {
    let mut attrs = BTreeMap::new();
    for (index, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let error = |message: String| AttrsError {
            file: file.to_string(),
            line: index + 1,
            message,
        };
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [path, mode, owner] = fields.as_slice() else {
            return Err(error(format!(
                "expected `<path> <mode> <uid>:<gid>`, got {line:?}"
            )));
        };
        let rel = path.strip_prefix('/').filter(|p| !p.is_empty()).ok_or_else(|| {
            error(format!(
                "path {path:?} must be absolute, as it will be on the target"
            ))
        })?;
        if Path::new(rel)
            .components()
            .any(|c| !matches!(c, Component::Normal(_)))
        {
            return Err(error(format!("path {path:?} must not contain `.` or `..`")));
        }
        let mode = u32::from_str_radix(mode, 8)
            .ok()
            .filter(|m| *m <= 0o7777 && mode.len() >= 3)
            .ok_or_else(|| error(format!("mode {mode:?} is not an octal permission like 0644")))?;
        let (uid, gid) = owner
            .split_once(':')
            .and_then(|(u, g)| Some((u.parse().ok()?, g.parse().ok()?)))
            .ok_or_else(|| error(format!("owner {owner:?} must be numeric `uid:gid`")))?;
        if attrs
            .insert(PathBuf::from(rel), Attr { mode, uid, gid })
            .is_some()
        {
            return Err(error(format!("{path} is listed twice")));
        }
    }
    Ok(attrs)
}

/// Resolves `rel` inside `root` the way the target will see it: symlinks in
/// the rootfs are followed relative to `root` (absolute targets included),
/// and the result never leaves `root`. The last component is followed only
/// when `follow_last` (directories: `lib/` must land in `usr/lib/` when
/// `lib -> usr/lib`; files and links replace what is there).
pub fn resolve_in_root(root: &Path, rel: &Path, follow_last: bool) -> Result<PathBuf> {
    let mut components: Vec<std::ffi::OsString> =
        rel.components().map(|c| c.as_os_str().to_os_string()).collect();
    let last = if follow_last { None } else { components.pop() };
    if let Some(name) = &last
        && !matches!(Path::new(name).components().next(), Some(Component::Normal(_)))
    {
        bail!("path {} must end in a name", rel.display());
    }
    let mut pending: Vec<std::ffi::OsString> = components.into_iter().rev().collect();
    let mut resolved = PathBuf::new();
    let mut hops = 0;
    while let Some(part) = pending.pop() {
        match Path::new(&part).components().next() {
            Some(Component::Normal(_)) => {}
            Some(Component::ParentDir) => {
                resolved.pop();
                continue;
            }
            _ => continue,
        }
        let candidate = resolved.join(&part);
        match std::fs::symlink_metadata(root.join(&candidate)) {
            Ok(meta) if meta.file_type().is_symlink() => {
                hops += 1;
                if hops > 40 {
                    bail!("too many symlinks resolving {} in the rootfs", rel.display());
                }
                let target = std::fs::read_link(root.join(&candidate))?;
                if target.is_absolute() {
                    resolved = PathBuf::new();
                }
                pending.extend(target.components().rev().map(|c| c.as_os_str().to_os_string()));
            }
            _ => resolved = candidate,
        }
    }
    Ok(match last {
        Some(name) => root.join(resolved).join(name),
        None => root.join(resolved),
    })
}

/// Removes whatever is at `path` (file, symlink or directory tree).
fn remove_existing(path: &Path) -> Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.is_dir() => std::fs::remove_dir_all(path),
        Ok(_) => std::fs::remove_file(path),
        Err(_) => return Ok(()),
    }
    .with_context(|| format!("replacing {}", path.display()))
}

fn set_attr(path: &Path, attr: Attr) -> Result<()> {
    std::os::unix::fs::lchown(path, Some(attr.uid), Some(attr.gid))
        .with_context(|| format!("setting the owner of {}", path.display()))?;
    if !std::fs::symlink_metadata(path)?.file_type().is_symlink() {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(attr.mode))
            .with_context(|| format!("setting the mode of {}", path.display()))?;
    }
    Ok(())
}

/// What applying an overlay did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Applied {
    pub files: usize,
    pub dirs: usize,
    pub symlinks: usize,
}

/// Copies `overlay` onto the rootfs at `root`.
pub fn apply(overlay: &Path, root: &Path) -> Result<Applied> {
    let attrs_path = overlay.join(ATTRS_FILE);
    let attrs = if attrs_path.is_file() {
        let text = std::fs::read_to_string(&attrs_path)?;
        parse_attrs(&text, &attrs_path.display().to_string())?
    } else {
        BTreeMap::new()
    };
    for path in attrs.keys() {
        if std::fs::symlink_metadata(overlay.join(path)).is_err() {
            bail!(
                "{}: {} is not in the overlay",
                attrs_path.display(),
                path.display()
            );
        }
    }
    let mut applied = Applied::default();
    let walker = walkdir::WalkDir::new(overlay).min_depth(1).sort_by_file_name();
    for entry in walker {
        let entry = entry.with_context(|| format!("walking overlay {}", overlay.display()))?;
        let rel = entry
            .path()
            .strip_prefix(overlay)
            .expect("inside the overlay")
            .to_path_buf();
        if rel == Path::new(ATTRS_FILE) {
            continue;
        }
        let source_meta = entry.path().symlink_metadata()?;
        let default_mode = if source_meta.is_dir() || source_meta.mode() & 0o111 != 0 {
            0o755
        } else {
            0o644
        };
        let attr = attrs.get(&rel).copied().unwrap_or(Attr {
            mode: default_mode,
            uid: 0,
            gid: 0,
        });
        let file_type = entry.file_type();
        let dest = resolve_in_root(root, &rel, file_type.is_dir())?;
        if file_type.is_dir() {
            match std::fs::symlink_metadata(&dest) {
                Ok(meta) if meta.is_dir() => {
                    if attrs.contains_key(&rel) {
                        set_attr(&dest, attr)?;
                    }
                }
                _ => {
                    remove_existing(&dest)?;
                    std::fs::create_dir_all(&dest).with_context(|| format!("creating {}", dest.display()))?;
                    set_attr(&dest, attr)?;
                }
            }
            applied.dirs += 1;
        } else if file_type.is_symlink() {
            remove_existing(&dest)?;
            let target = std::fs::read_link(entry.path())?;
            std::os::unix::fs::symlink(&target, &dest)
                .with_context(|| format!("creating symlink {}", dest.display()))?;
            std::os::unix::fs::lchown(&dest, Some(attr.uid), Some(attr.gid))?;
            applied.symlinks += 1;
        } else if file_type.is_file() {
            remove_existing(&dest)?;
            std::fs::copy(entry.path(), &dest)
                .with_context(|| format!("copying {} to {}", entry.path().display(), dest.display()))?;
            set_attr(&dest, attr)?;
            applied.files += 1;
        } else {
            bail!(
                "{}: overlays may hold only files, directories and symlinks",
                entry.path().display()
            );
        }
    }
    Ok(applied)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attrs_parse_and_errors() {
        let attrs = parse_attrs(
            "# c\n/etc/sudoers.d/ops 0440 0:0\n/var/lib/app  0750 101:102\n",
            "a",
        )
        .unwrap();
        assert_eq!(
            attrs[Path::new("etc/sudoers.d/ops")],
            Attr {
                mode: 0o440,
                uid: 0,
                gid: 0
            }
        );
        assert_eq!(attrs[Path::new("var/lib/app")].gid, 102);
        for (bad, needle) in [
            ("etc/x 0644 0:0", "must be absolute"),
            ("/etc/../x 0644 0:0", "`..`"),
            ("/etc/x 0999 0:0", "octal"),
            ("/etc/x 0644 root:root", "numeric"),
            ("/etc/x 0644", "expected"),
            ("/x 0644 0:0\n/x 0600 0:0", "listed twice"),
        ] {
            let err = parse_attrs(bad, "overlay.attrs").unwrap_err();
            assert!(err.message.contains(needle), "{bad}: {err}");
            assert!(err.to_string().starts_with("overlay.attrs:"), "{err}");
        }
    }

    #[test]
    fn resolution_stays_inside_the_root() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("usr/lib")).unwrap();
        std::os::unix::fs::symlink("usr/lib", root.join("lib")).unwrap();
        std::fs::create_dir_all(root.join("etc")).unwrap();
        std::os::unix::fs::symlink("/usr/lib", root.join("etc/abs")).unwrap();
        std::os::unix::fs::symlink("../../../../..", root.join("etc/up")).unwrap();
        assert_eq!(
            resolve_in_root(root, Path::new("lib/x"), false).unwrap(),
            root.join("usr/lib/x")
        );
        assert_eq!(
            resolve_in_root(root, Path::new("etc/abs/x"), false).unwrap(),
            root.join("usr/lib/x")
        );
        assert_eq!(
            resolve_in_root(root, Path::new("etc/up/x"), false).unwrap(),
            root.join("x")
        );
        // A file replaces a symlink in the last place; a directory follows it.
        assert_eq!(
            resolve_in_root(root, Path::new("lib"), false).unwrap(),
            root.join("lib")
        );
        assert_eq!(
            resolve_in_root(root, Path::new("lib"), true).unwrap(),
            root.join("usr/lib")
        );
    }

    #[test]
    fn apply_keeps_modes_owners_and_symlinks() {
        let dir = tempfile::tempdir().unwrap();
        let (overlay, root) = (dir.path().join("overlay"), dir.path().join("root"));
        std::fs::create_dir_all(overlay.join("etc/sudoers.d")).unwrap();
        std::fs::create_dir_all(overlay.join("usr/bin")).unwrap();
        std::fs::write(overlay.join("etc/sudoers.d/ops"), "ops ALL=(ALL) ALL\n").unwrap();
        std::fs::write(overlay.join("usr/bin/tool"), "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(
            overlay.join("usr/bin/tool"),
            std::fs::Permissions::from_mode(0o755),
        )
        .unwrap();
        std::os::unix::fs::symlink("/usr/bin/tool", overlay.join("usr/bin/alias")).unwrap();
        std::fs::write(overlay.join(ATTRS_FILE), "/etc/sudoers.d/ops 0440 0:0\n").unwrap();
        std::fs::create_dir_all(root.join("etc")).unwrap();
        // An absolute symlink in the rootfs must not redirect the write to the host.
        std::os::unix::fs::symlink("/", root.join("usr")).unwrap();
        let applied = apply(&overlay, &root).unwrap();
        assert_eq!(
            applied,
            Applied {
                files: 2,
                dirs: 4,
                symlinks: 1
            }
        );
        assert!(
            std::fs::symlink_metadata(root.join("usr"))
                .unwrap()
                .file_type()
                .is_symlink()
        );
        let ops = std::fs::metadata(root.join("etc/sudoers.d/ops")).unwrap();
        assert_eq!(ops.mode() & 0o7777, 0o440);
        assert_eq!(
            std::fs::read_link(root.join("bin/alias")).unwrap(),
            PathBuf::from("/usr/bin/tool")
        );
        assert_eq!(
            std::fs::metadata(root.join("bin/tool")).unwrap().mode() & 0o777,
            0o755
        );
        assert!(!root.join(ATTRS_FILE).exists());
    }

    #[test]
    fn attrs_for_missing_paths_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(ATTRS_FILE), "/etc/nothing 0600 0:0\n").unwrap();
        let err = apply(dir.path(), &dir.path().join("root")).unwrap_err();
        assert!(err.to_string().contains("not in the overlay"), "{err}");
    }
}
