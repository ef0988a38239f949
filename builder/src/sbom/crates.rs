//! The crates a binary of this workspace is built from, from `Cargo.lock`
//! (pure). The lock does not say which of a workspace member's
//! dependencies are dev-only, so the members' manifests do.

use std::collections::{BTreeMap, BTreeSet};
use std::str::FromStr;

use anyhow::{Context, Result};

/// A crate in the closure.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct LockedCrate {
    pub name: String,
    pub version: String,
    /// The `.crate` file's sha256, for registry crates.
    pub checksum: Option<String>,
    /// From crates.io (else a workspace member or another source).
    pub crates_io: bool,
    /// `(name, version)` of what it depends on, within the closure.
    pub dependencies: Vec<(String, String)>,
}

impl LockedCrate {
    pub fn purl(&self) -> String {
        format!("pkg:cargo/{}@{}", self.name, self.version)
    }
}

/// The dependency names only `[dev-dependencies]` of a manifest names.
pub fn dev_only_dependencies(manifest: &str) -> Result<BTreeSet<String>> {
    let table: toml::Table = manifest
        .parse()
        .context("parsing a workspace member's Cargo.toml")?;
    let names = |section: &str| -> BTreeSet<String> {
        table
            .get(section)
            .and_then(|v| v.as_table())
            .map(|deps| {
                deps.iter()
                    .map(|(key, spec)| {
                        spec.get("package")
                            .and_then(|p| p.as_str())
                            .unwrap_or(key)
                            .to_string()
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut kept = names("dependencies");
    kept.extend(names("build-dependencies"));
    Ok(names("dev-dependencies").difference(&kept).cloned().collect())
}

/// Every crate `root` (a workspace member) is built from, itself included,
/// sorted. `dev_only` gives, per workspace member, the dependencies not to
/// follow.
pub fn closure(
    lock: &str,
    root: &str,
    dev_only: &BTreeMap<String, BTreeSet<String>>,
) -> Result<Vec<LockedCrate>> {
    let lockfile = cargo_lock::Lockfile::from_str(lock).context("parsing Cargo.lock")?;
    let by_id: BTreeMap<(String, String), &cargo_lock::Package> = lockfile
        .packages
        .iter()
        .map(|p| ((p.name.to_string(), p.version.to_string()), p))
        .collect();
    let start = lockfile
        .packages
        .iter()
        .find(|p| p.name.as_str() == root && p.source.is_none())
        .with_context(|| format!("Cargo.lock has no workspace member {root}"))?;
    let mut seen = BTreeMap::new();
    let mut queue = vec![start];
    while let Some(package) = queue.pop() {
        let id = (package.name.to_string(), package.version.to_string());
        if seen.contains_key(&id) {
            continue;
        }
        let skipped = dev_only
            .get(package.name.as_str())
            .filter(|_| package.source.is_none());
        let mut dependencies = Vec::new();
        for dependency in &package.dependencies {
            if skipped.is_some_and(|names| names.contains(dependency.name.as_str())) {
                continue;
            }
            let dep_id = (dependency.name.to_string(), dependency.version.to_string());
            let locked = by_id
                .get(&dep_id)
                .with_context(|| format!("Cargo.lock: {} {} is not locked", dep_id.0, dep_id.1))?;
            queue.push(locked);
            dependencies.push(dep_id);
        }
        dependencies.sort();
        seen.insert(
            id.clone(),
            LockedCrate {
                name: id.0,
                version: id.1,
                checksum: package.checksum.as_ref().map(|c| c.to_string()),
                crates_io: package.source.as_ref().is_some_and(|s| s.is_default_registry()),
                dependencies,
            },
        );
    }
    Ok(seen.into_values().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOCK: &str = r#"
version = 4

[[package]]
name = "app"
version = "0.1.0"
dependencies = ["lib", "tester"]

[[package]]
name = "lib"
version = "1.2.3"
source = "registry+https://github.com/rust-lang/crates.io-index"
checksum = "0000000000000000000000000000000000000000000000000000000000000001"
dependencies = ["inner 0.2.0"]

[[package]]
name = "inner"
version = "0.2.0"
source = "registry+https://github.com/rust-lang/crates.io-index"
checksum = "0000000000000000000000000000000000000000000000000000000000000002"

[[package]]
name = "inner"
version = "0.3.0"
source = "registry+https://github.com/rust-lang/crates.io-index"
checksum = "0000000000000000000000000000000000000000000000000000000000000003"

[[package]]
name = "tester"
version = "1.0.0"
source = "registry+https://github.com/rust-lang/crates.io-index"
checksum = "0000000000000000000000000000000000000000000000000000000000000004"
"#;

    #[test]
    fn the_closure_follows_locked_versions_and_skips_dev_dependencies() {
        let manifest = "[dependencies]\nlib = \"1\"\n[dev-dependencies]\ntester = \"1\"\nlib = \"1\"\n";
        let dev_only = BTreeMap::from([("app".to_string(), dev_only_dependencies(manifest).unwrap())]);
        assert_eq!(dev_only["app"], BTreeSet::from(["tester".to_string()]));
        let crates = closure(LOCK, "app", &dev_only).unwrap();
        let ids: Vec<_> = crates
            .iter()
            .map(|c| format!("{} {}", c.name, c.version))
            .collect();
        assert_eq!(ids, ["app 0.1.0", "inner 0.2.0", "lib 1.2.3"]);
        assert!(!crates[0].crates_io && crates[1].crates_io);
        assert_eq!(crates[2].purl(), "pkg:cargo/lib@1.2.3");
        assert_eq!(
            crates[2].dependencies,
            [("inner".to_string(), "0.2.0".to_string())]
        );
        assert!(crates[1].checksum.as_deref().unwrap().ends_with("02"));
        let with_tests = closure(LOCK, "app", &BTreeMap::new()).unwrap();
        assert_eq!(with_tests.len(), 4);
        assert!(
            closure(LOCK, "lib", &BTreeMap::new()).is_err(),
            "lib is no workspace member"
        );
    }
}
