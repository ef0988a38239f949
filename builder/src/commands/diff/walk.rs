//! Every entry of a commit's tree, from its root, with an explicit stack: a
//! hostile commit's depth costs a bounded list, never the call stack, and a
//! path deeper than [`MAX_DEPTH`] is an error naming it.

use std::collections::BTreeMap;

use anyhow::{Context, Result, bail};
use ostree::gio;
use ostree::gio::prelude::*;

use emberrtos_contract::tree::{self, TreeEntry};

/// The most components a path in a commit may have (`usr/bin/sh` has 3).
pub const MAX_DEPTH: usize = 256;

/// A directory still to list: it, its path from the root, its depth.
type Pending = (gio::File, String, usize);

/// Every entry under `root` (a commit's root), by its path relative to it,
/// entering directories but not symlinks. An entry more than `max_depth`
/// components deep is an error naming its path and the limit.
pub fn walk(root: &gio::File, max_depth: usize) -> Result<BTreeMap<String, TreeEntry>> {
    let mut entries = BTreeMap::new();
    let mut pending: Vec<Pending> = vec![(root.clone(), String::new(), 0)];
    while let Some((dir, dir_path, depth)) = pending.pop() {
        for (name, kind) in tree::children(&dir)? {
            let path = match dir_path.as_str() {
                "" => name.clone(),
                _ => format!("{dir_path}/{name}"),
            };
            if depth >= max_depth {
                bail!(
                    "/{path} is {} levels deep, deeper than the {max_depth} levels \
                     imgbuild diff reads",
                    depth + 1
                );
            }
            let child = dir.child(&name);
            if kind == gio::FileType::Directory {
                entries.insert(path.clone(), TreeEntry::Directory);
                pending.push((child, path, depth + 1));
            } else {
                let checksum = object_checksum(&child, &path)?;
                entries.insert(path, TreeEntry::Object(checksum));
            }
        }
    }
    Ok(entries)
}

/// The file object checksum of a regular file or symlink in a commit (it
/// covers content, link target, mode, owner and xattrs).
pub fn object_checksum(file: &gio::File, path: &str) -> Result<String> {
    let repo_file = file
        .downcast_ref::<ostree::RepoFile>()
        .context("not a file inside an ostree commit")?;
    repo_file
        .ensure_resolved()
        .with_context(|| format!("resolving /{path} in the commit"))?;
    Ok(repo_file.checksum().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    use crate::ostree::{self as ost, CommitRequest, Metadata};

    /// `depth` nested directories `d` in `tree`, a file in the last one.
    fn chain(tree: &Path, depth: usize) -> String {
        let relative = vec!["d"; depth].join("/");
        std::fs::create_dir_all(tree.join(&relative)).unwrap();
        std::fs::write(tree.join(&relative).join("f"), b"bottom").unwrap();
        relative
    }

    /// Commits `tree` into a new repo in `dir`; its checksum.
    fn commit(dir: &Path, tree: &Path) -> String {
        let repo = ost::open_or_create(&dir.join("repo")).unwrap();
        let request = CommitRequest {
            tree,
            subject: "chain",
            metadata: &Metadata::new(),
            timestamp: 1,
            parent: None,
            force_root_owner: true,
            cancellable: None,
            on_entry: None,
            hardlinked: false,
            consume: false,
            parent_repo: None,
        };
        ost::commit_tree(&repo, request).unwrap().checksum
    }

    /// Walks commit `checksum` of the repo in `dir` to `max_depth`.
    fn walk_commit(dir: &Path, checksum: &str, max_depth: usize) -> Result<BTreeMap<String, TreeEntry>> {
        let repo = ost::open(&dir.join("repo")).unwrap();
        walk(&tree::commit_root(&repo, checksum).unwrap().0, max_depth)
    }

    #[test]
    fn a_chain_as_deep_as_the_limit_is_walked_whole() {
        let dir = tempfile::tempdir().unwrap();
        let tree = dir.path().join("tree");
        let bottom = chain(&tree, MAX_DEPTH - 1);
        let checksum = commit(dir.path(), &tree);
        let entries = walk_commit(dir.path(), &checksum, MAX_DEPTH).unwrap();
        assert_eq!(entries.len(), MAX_DEPTH);
        assert!(matches!(entries[&format!("{bottom}/f")], TreeEntry::Object(_)));
        assert_eq!(entries[&bottom], TreeEntry::Directory);
    }

    #[test]
    fn a_chain_deeper_than_the_limit_is_an_error_naming_the_path_and_the_limit() {
        let dir = tempfile::tempdir().unwrap();
        let tree = dir.path().join("tree");
        chain(&tree, MAX_DEPTH + 10);
        let checksum = commit(dir.path(), &tree);
        let error = walk_commit(dir.path(), &checksum, MAX_DEPTH)
            .unwrap_err()
            .to_string();
        let first_too_deep = vec!["d"; MAX_DEPTH + 1].join("/");
        assert!(
            error.starts_with(&format!(
                "/{first_too_deep} is 257 levels deep, deeper than the 256 levels"
            )),
            "{error}"
        );
    }

    /// 1000 levels walked on a thread with a 256 KiB stack: far less than
    /// one call frame per level would need.
    #[test]
    fn a_deep_chain_costs_no_stack_per_level() {
        let dir = tempfile::tempdir().unwrap();
        let tree = dir.path().join("tree");
        let bottom = chain(&tree, 1000);
        let checksum = commit(dir.path(), &tree);
        let repo_dir = dir.path().to_path_buf();
        let entries = std::thread::Builder::new()
            .stack_size(256 * 1024)
            .spawn(move || walk_commit(&repo_dir, &checksum, usize::MAX).map(|e| e.len()))
            .unwrap()
            .join()
            .unwrap()
            .unwrap();
        assert_eq!(entries, 1001, "{bottom}");
    }
}
