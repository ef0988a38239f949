//! What changed between two commits' facts (pure).

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use crate::sbom::dpkg::version_cmp;
use emberrtos_contract::tree::TreeEntry;

/// A package by `(name, architecture)`, to its version.
pub type PackageVersions = BTreeMap<(String, String), String>;

#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub struct PackageChanges {
    pub added: Vec<PackageVersion>,
    pub removed: Vec<PackageVersion>,
    pub upgraded: Vec<VersionChange>,
    pub downgraded: Vec<VersionChange>,
}

#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct PackageVersion {
    pub name: String,
    pub architecture: String,
    pub version: String,
}

#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct VersionChange {
    pub name: String,
    pub architecture: String,
    pub from: String,
    pub to: String,
}

pub fn packages(from: &PackageVersions, to: &PackageVersions) -> PackageChanges {
    let mut changes = PackageChanges::default();
    let entry = |(name, architecture): &(String, String), version: &String| PackageVersion {
        name: name.clone(),
        architecture: architecture.clone(),
        version: version.clone(),
    };
    for (id, version) in to {
        match from.get(id) {
            None => changes.added.push(entry(id, version)),
            Some(old) if old != version => {
                let change = VersionChange {
                    name: id.0.clone(),
                    architecture: id.1.clone(),
                    from: old.clone(),
                    to: version.clone(),
                };
                // A version dpkg accepted but the parser does not is an upgrade by default.
                match version_cmp(version, old).unwrap_or(Ordering::Greater) {
                    Ordering::Less => changes.downgraded.push(change),
                    _ => changes.upgraded.push(change),
                }
            }
            Some(_) => {}
        }
    }
    for (id, version) in from {
        if !to.contains_key(id) {
            changes.removed.push(entry(id, version));
        }
    }
    changes
}

#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct SymbolChange {
    pub symbol: String,
    /// The `.config` value (`y`, `m`, `"text"`, `n` when "is not set"),
    /// `None` when the symbol is absent.
    pub from: Option<String>,
    pub to: Option<String>,
}

/// Symbols whose value differs between two `.config`s.
pub fn config_symbols(from: &rtcheck::kconfig::Config, to: &rtcheck::kconfig::Config) -> Vec<SymbolChange> {
    let value =
        |config: &rtcheck::kconfig::Config, symbol: &str| config.get(symbol).map(|v| v.to_config_text());
    let symbols: BTreeSet<&str> = from.iter().chain(to.iter()).map(|(s, _)| s).collect();
    symbols
        .into_iter()
        .filter_map(|symbol| {
            let (a, b) = (value(from, symbol), value(to, symbol));
            (a != b).then(|| SymbolChange {
                symbol: symbol.to_string(),
                from: a,
                to: b,
            })
        })
        .collect()
}

#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct ListChange {
    pub added: Vec<String>,
    pub removed: Vec<String>,
}

/// Kernel arguments added and removed (as multisets, in order).
pub fn kargs(from: &[String], to: &[String]) -> ListChange {
    let minus = |a: &[String], b: &[String]| {
        let mut left: Vec<&String> = b.iter().collect();
        a.iter()
            .filter(|item| match left.iter().position(|x| x == item) {
                Some(i) => {
                    left.remove(i);
                    false
                }
                None => true,
            })
            .cloned()
            .collect()
    };
    ListChange {
        added: minus(to, from),
        removed: minus(from, to),
    }
}

#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct FileChanges {
    pub added: Vec<String>,
    pub removed: Vec<String>,
    pub changed: Vec<String>,
    /// How many names each list left out ([`limit_names`]).
    #[serde(skip_serializing_if = "Omitted::is_none")]
    pub omitted: Omitted,
}

/// Counts of names left out of a group's lists.
#[derive(Clone, Copy, Debug, Default, Serialize, PartialEq, Eq)]
pub struct Omitted {
    pub added: usize,
    pub removed: usize,
    pub changed: usize,
}

impl Omitted {
    pub fn is_none(&self) -> bool {
        *self == Omitted::default()
    }
}

/// Keeps the first `per_group` names of each list of each group (all of
/// them when `per_group` is 0) and counts the rest in `omitted`.
pub fn limit_names(groups: &mut BTreeMap<String, FileChanges>, per_group: usize) {
    if per_group == 0 {
        return;
    }
    let cut = |list: &mut Vec<String>| {
        let over = list.len().saturating_sub(per_group);
        list.truncate(per_group);
        over
    };
    for group in groups.values_mut() {
        group.omitted = Omitted {
            added: cut(&mut group.added),
            removed: cut(&mut group.removed),
            changed: cut(&mut group.changed),
        };
    }
}

/// The group of a path: its first two components (`usr/bin`, `etc/ssh`),
/// or one for a file right under the top (`etc`).
pub fn group_of(path: &str) -> String {
    let mut parts = path.splitn(3, '/');
    match (parts.next(), parts.next(), parts.next()) {
        (Some(top), Some(second), Some(_)) => format!("{top}/{second}"),
        (Some(top), _, _) => top.to_string(),
        _ => String::new(),
    }
}

/// How one path differs between two trees.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Change {
    Added,
    Removed,
    Changed,
}

/// Whether `path` has entries under it in `tree`.
fn has_children(tree: &BTreeMap<String, TreeEntry>, path: &str) -> bool {
    let prefix = format!("{path}/");
    tree.range(prefix.clone()..)
        .next()
        .is_some_and(|(child, _)| child.starts_with(&prefix))
}

/// An entry added to or removed from `tree` is listed itself when it is a
/// file or symlink, or a directory with nothing under it to show it.
fn listed(tree: &BTreeMap<String, TreeEntry>, path: &str, entry: &TreeEntry) -> bool {
    match entry {
        TreeEntry::Object(_) => true,
        TreeEntry::Directory => !has_children(tree, path),
    }
}

/// How `path` differs from `from` to `to`, if it is listed.
fn change_of(
    from: &BTreeMap<String, TreeEntry>,
    to: &BTreeMap<String, TreeEntry>,
    path: &str,
) -> Option<Change> {
    match (from.get(path), to.get(path)) {
        (None, Some(entry)) => listed(to, path, entry).then_some(Change::Added),
        (Some(entry), None) => listed(from, path, entry).then_some(Change::Removed),
        (Some(a), Some(b)) if a != b => Some(Change::Changed),
        _ => None,
    }
}

/// Files (and symlinks) added, removed and changed, by group. A directory
/// is listed only where nothing under it shows the change: added or removed
/// empty, or changed from or to another type (a link turned directory).
pub fn files(
    from: &BTreeMap<String, TreeEntry>,
    to: &BTreeMap<String, TreeEntry>,
) -> BTreeMap<String, FileChanges> {
    let mut groups: BTreeMap<String, FileChanges> = BTreeMap::new();
    let paths: BTreeSet<&String> = from.keys().chain(to.keys()).collect();
    for path in paths {
        let Some(change) = change_of(from, to, path) else {
            continue;
        };
        let group = groups.entry(group_of(path)).or_default();
        let list = match change {
            Change::Added => &mut group.added,
            Change::Removed => &mut group.removed,
            Change::Changed => &mut group.changed,
        };
        list.push(path.clone());
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_past_the_limit_are_counted_not_listed() {
        let names = |n: usize, kind: &str| (0..n).map(|i| format!("usr/bin/{kind}{i}")).collect::<Vec<_>>();
        let mut groups = BTreeMap::from([(
            "usr/bin".to_string(),
            FileChanges {
                added: names(5, "a"),
                removed: names(2, "r"),
                changed: names(3, "c"),
                omitted: Omitted::default(),
            },
        )]);
        let all = groups.clone();
        limit_names(&mut groups, 0);
        assert_eq!(groups, all);
        limit_names(&mut groups, 3);
        let group = &groups["usr/bin"];
        assert_eq!(group.added, ["usr/bin/a0", "usr/bin/a1", "usr/bin/a2"]);
        assert_eq!(group.removed.len(), 2);
        assert_eq!(group.changed.len(), 3);
        assert_eq!(
            group.omitted,
            Omitted {
                added: 2,
                removed: 0,
                changed: 0
            }
        );
    }

    fn versions(list: &[(&str, &str)]) -> PackageVersions {
        list.iter()
            .map(|(n, v)| ((n.to_string(), "amd64".to_string()), v.to_string()))
            .collect()
    }

    #[test]
    fn packages_added_removed_up_and_downgraded() {
        let from = versions(&[
            ("bash", "5.2.15-2"),
            ("gone", "1.0"),
            ("libc6", "2.36-9+deb12u10"),
            ("old", "1:2.0"),
        ]);
        let to = versions(&[
            ("bash", "5.2.15-2+b7"),
            ("libc6", "2.36-9+deb12u9"),
            ("old", "3.0"),
            ("tree", "2.1.0-1"),
        ]);
        let changes = packages(&from, &to);
        assert_eq!(
            changes.added.iter().map(|p| p.name.as_str()).collect::<Vec<_>>(),
            ["tree"]
        );
        assert_eq!(
            changes
                .removed
                .iter()
                .map(|p| p.name.as_str())
                .collect::<Vec<_>>(),
            ["gone"]
        );
        assert_eq!(
            changes
                .upgraded
                .iter()
                .map(|p| p.name.as_str())
                .collect::<Vec<_>>(),
            ["bash"]
        );
        // An epoch outranks the upstream version: 1:2.0 to 3.0 goes down.
        assert_eq!(
            changes
                .downgraded
                .iter()
                .map(|p| p.name.as_str())
                .collect::<Vec<_>>(),
            ["libc6", "old"]
        );
        assert_eq!(packages(&from, &from), PackageChanges::default());
    }

    #[test]
    fn symbols_changed_with_their_values() {
        let a = rtcheck::kconfig::Config::parse(
            "CONFIG_A=y\nCONFIG_B=\"x\"\n# CONFIG_C is not set\nCONFIG_D=y\n",
        )
        .unwrap();
        let b =
            rtcheck::kconfig::Config::parse("CONFIG_A=y\nCONFIG_B=\"y\"\nCONFIG_C=y\nCONFIG_E=m\n").unwrap();
        let changes = config_symbols(&a, &b);
        let names: Vec<_> = changes.iter().map(|c| c.symbol.as_str()).collect();
        assert_eq!(
            names,
            ["B", "C", "D", "E"]
                .map(|s| format!("CONFIG_{s}"))
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>()
        );
        assert_eq!(changes[3].from, None);
        assert_eq!(changes[3].to.as_deref(), Some("m"));
        assert!(config_symbols(&a, &a).is_empty());
    }

    #[test]
    fn kargs_as_multisets() {
        let s = |list: &[&str]| list.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let change = kargs(
            &s(&["quiet", "isolcpus=1", "quiet"]),
            &s(&["quiet", "isolcpus=1,2"]),
        );
        assert_eq!(change.added, ["isolcpus=1,2"]);
        assert_eq!(change.removed, ["isolcpus=1", "quiet"]);
    }

    fn tree(list: &[(&str, &str)]) -> BTreeMap<String, TreeEntry> {
        list.iter()
            .map(|(p, c)| {
                let entry = if *c == "dir" {
                    TreeEntry::Directory
                } else {
                    TreeEntry::Object(c.to_string())
                };
                (p.to_string(), entry)
            })
            .collect()
    }

    #[test]
    fn files_by_group_and_directories_only_where_nothing_else_shows_them() {
        let from = tree(&[
            ("etc", "dir"),
            ("etc/hostname", "a"),
            ("usr/bin", "dir"),
            ("usr/bin/sh", "b"),
            ("usr/lib/x", "c"),
            ("var/cache", "dir"),
        ]);
        let to = tree(&[
            ("etc", "dir"),
            ("etc/hostname", "a"),
            ("usr/bin/sh", "B"),
            ("usr/bin/tree", "t"),
            ("usr/share/doc", "dir"),
            ("usr/share/doc/tree", "dir"),
            ("usr/share/doc/tree/README", "r"),
            ("var/lib", "dir"),
        ]);
        let groups = files(&from, &to);
        assert_eq!(
            groups.keys().collect::<Vec<_>>(),
            ["usr/bin", "usr/lib", "usr/share", "var"]
        );
        assert_eq!(groups["usr/bin"].added, ["usr/bin/tree"]);
        assert_eq!(groups["usr/bin"].changed, ["usr/bin/sh"]);
        assert_eq!(groups["usr/lib"].removed, ["usr/lib/x"]);
        // A new directory shows by its files; an empty one by itself.
        assert_eq!(groups["usr/share"].added, ["usr/share/doc/tree/README"]);
        assert_eq!(groups["var"].added, ["var/lib"]);
        assert_eq!(groups["var"].removed, ["var/cache"]);
        assert_eq!(group_of("etc/hostname"), "etc");
    }

    #[test]
    fn a_link_turned_directory_and_a_new_link_target_are_changed() {
        let from = tree(&[("lib64", "link-to-usr-lib64"), ("bin", "link-to-usr-bin")]);
        let to = tree(&[
            ("lib64", "dir"),
            ("lib64/ld-linux-x86-64.so.2", "evil"),
            ("bin", "link-to-tmp"),
        ]);
        let groups = files(&from, &to);
        assert_eq!(groups["lib64"].changed, ["lib64"]);
        assert_eq!(groups["lib64"].added, ["lib64/ld-linux-x86-64.so.2"]);
        assert_eq!(groups["bin"].changed, ["bin"]);
        // And back: the directory turned link is changed too.
        assert_eq!(files(&to, &from)["lib64"].changed, ["lib64"]);
        assert_eq!(files(&to, &from)["lib64"].removed, ["lib64/ld-linux-x86-64.so.2"]);
    }
}
