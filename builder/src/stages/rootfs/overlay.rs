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
use std::fs::Metadata;
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};

use anyhow::{Context, Result, bail};

use emberrtos_contract::io::root::ImageRoot;

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

/// What applying an overlay did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Applied {
    pub files: usize,
    pub dirs: usize,
    pub symlinks: usize,
}

fn read_attrs(overlay: &Path) -> Result<BTreeMap<PathBuf, Attr>> {
    let attrs_path = overlay.join(ATTRS_FILE);
    if !attrs_path.is_file() {
        return Ok(BTreeMap::new());
    }
    let text =
        std::fs::read_to_string(&attrs_path).with_context(|| format!("reading {}", attrs_path.display()))?;
    let attrs = parse_attrs(&text, &attrs_path.display().to_string())?;
    if let Some(missing) = attrs
        .keys()
        .find(|path| std::fs::symlink_metadata(overlay.join(path)).is_err())
    {
        bail!(
            "{}: {} is not in the overlay",
            attrs_path.display(),
            missing.display()
        );
    }
    Ok(attrs)
}

/// Copies `overlay` onto the tree. Paths resolve inside it: a directory
/// follows a link already in the tree (`lib/` lands in `usr/lib/`), a file
/// or symlink replaces what is at its place.
pub fn apply(overlay: &Path, root: &ImageRoot) -> Result<Applied> {
    let attrs = read_attrs(overlay)?;
    let mut applied = Applied::default();
    let walker = walkdir::WalkDir::new(overlay).min_depth(1).sort_by_file_name();
    for entry in walker {
        let entry = entry.with_context(|| format!("walking overlay {}", overlay.display()))?;
        let rel = entry.path().strip_prefix(overlay).expect("inside the overlay");
        if rel == Path::new(ATTRS_FILE) {
            continue;
        }
        let meta = entry.path().symlink_metadata()?;
        let attr = attrs.get(rel).copied().unwrap_or(Attr {
            mode: if meta.is_dir() || meta.mode() & 0o111 != 0 {
                0o755
            } else {
                0o644
            },
            uid: 0,
            gid: 0,
        });
        apply_entry(root, entry.path(), rel, &meta, attr, attrs.contains_key(rel))?;
        match meta.file_type() {
            t if t.is_dir() => applied.dirs += 1,
            t if t.is_symlink() => applied.symlinks += 1,
            _ => applied.files += 1,
        }
    }
    Ok(applied)
}

fn apply_entry(
    root: &ImageRoot,
    source: &Path,
    rel: &Path,
    meta: &Metadata,
    attr: Attr,
    listed: bool,
) -> Result<()> {
    let file_type = meta.file_type();
    if file_type.is_dir() {
        if root.is_dir(rel) {
            // An existing directory (or a link to one) keeps its attributes
            // unless overlay.attrs names it.
            return match listed {
                true => root.set_attr(&root.resolved(rel)?, attr.mode, attr.uid, attr.gid),
                false => Ok(()),
            };
        }
        root.remove(rel)?;
        root.create_dir_all(rel, attr.mode)?;
    } else if file_type.is_symlink() {
        root.symlink(rel, &std::fs::read_link(source)?)?;
    } else if file_type.is_file() {
        root.copy_in(source, rel, attr.mode)?;
    } else {
        bail!(
            "{}: overlays may hold only files, directories and symlinks",
            source.display()
        );
    }
    root.set_attr(rel, attr.mode, attr.uid, attr.gid)
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
    fn apply_keeps_modes_owners_and_symlinks() {
        let dir = tempfile::tempdir().unwrap();
        let (overlay, root) = (dir.path().join("overlay"), dir.path().join("root"));
        std::fs::create_dir_all(overlay.join("etc/sudoers.d")).unwrap();
        std::fs::create_dir_all(overlay.join("usr/bin")).unwrap();
        std::fs::write(overlay.join("etc/sudoers.d/ops"), "ops ALL=(ALL) ALL\n").unwrap();
        std::fs::write(overlay.join("usr/bin/tool"), "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(
            overlay.join("usr/bin/tool"),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .unwrap();
        std::os::unix::fs::symlink("/usr/bin/tool", overlay.join("usr/bin/alias")).unwrap();
        std::fs::write(overlay.join(ATTRS_FILE), "/etc/sudoers.d/ops 0440 0:0\n").unwrap();
        std::fs::create_dir_all(root.join("etc")).unwrap();
        // An absolute symlink in the rootfs must not redirect the write to the host.
        std::os::unix::fs::symlink("/", root.join("usr")).unwrap();
        let applied = apply(&overlay, &ImageRoot::open(&root).unwrap()).unwrap();
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
        let root = ImageRoot::create(&dir.path().join("root")).unwrap();
        let err = apply(dir.path(), &root).unwrap_err();
        assert!(err.to_string().contains("not in the overlay"), "{err}");
    }
}
