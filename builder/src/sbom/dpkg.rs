//! The Debian packages installed in a root, from dpkg's status file (pure).

use std::str::FromStr;

use deb822_lossless::{Deb822, Paragraph};

/// Where dpkg's status file is in a root: in a committed tree `/var` has
/// moved to the factory ([`FACTORY_VAR`](crate::stages::rootfs::layout::FACTORY_VAR)),
/// in a plain root (the live image's) it is where dpkg keeps it.
pub const STATUS_PATHS: &[&str] = &["usr/share/factory/var/lib/dpkg/status", "var/lib/dpkg/status"];

/// One installed package, as dpkg records it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InstalledPackage {
    pub name: String,
    pub version: String,
    pub architecture: String,
    /// The source package (the binary's own name when the field is absent).
    pub source: String,
    /// The source version (the binary's version when not stated).
    pub source_version: String,
    /// `Pre-Depends` then `Depends`: each entry's alternatives, by package name.
    pub depends: Vec<Vec<String>>,
    /// The virtual packages it provides, by name.
    pub provides: Vec<String>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum StatusError {
    #[error("dpkg status is not deb822: {0}")]
    Syntax(String),
    #[error("dpkg status paragraph {paragraph}: no {field} field")]
    MissingField { paragraph: usize, field: &'static str },
    #[error(
        "dpkg status paragraph {paragraph}: {field} {value:?} is not a Debian package name or architecture"
    )]
    BadName {
        paragraph: usize,
        field: &'static str,
        value: String,
    },
    #[error("dpkg status lists {name}:{architecture} installed twice")]
    Duplicate { name: String, architecture: String },
}

/// Debian policy 5.6.1: `[a-z0-9][a-z0-9+.-]+`; architectures `[a-z0-9-]+`.
pub fn valid_name(field: &str, value: &str) -> bool {
    let allowed = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || "+.-".contains(c);
    match field {
        "Architecture" => {
            !value.is_empty()
                && value
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        }
        _ => {
            value.len() >= 2
                && value.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
                && value.chars().all(allowed)
        }
    }
}

/// The installed packages (`Status: install ok installed`), sorted by name
/// and architecture. Half-installed and removed-but-configured ones are left out.
pub fn parse_status(text: &str) -> Result<Vec<InstalledPackage>, StatusError> {
    let document = Deb822::from_str(text).map_err(|e| StatusError::Syntax(e.to_string()))?;
    let mut packages = Vec::new();
    for (index, paragraph) in document.paragraphs().enumerate() {
        let installed = paragraph
            .get("Status")
            .is_some_and(|status| status.split_whitespace().eq(["install", "ok", "installed"]));
        if installed {
            packages.push(installed_package(&paragraph, index + 1)?);
        }
    }
    packages.sort_by(|a, b| (&a.name, &a.architecture).cmp(&(&b.name, &b.architecture)));
    if let Some(twice) = packages
        .windows(2)
        .find(|w| (&w[0].name, &w[0].architecture) == (&w[1].name, &w[1].architecture))
    {
        return Err(StatusError::Duplicate {
            name: twice[0].name.clone(),
            architecture: twice[0].architecture.clone(),
        });
    }
    Ok(packages)
}

fn installed_package(paragraph: &Paragraph, index: usize) -> Result<InstalledPackage, StatusError> {
    let field = |field: &'static str| {
        paragraph
            .get(field)
            .map(|v| v.trim().to_string())
            .ok_or(StatusError::MissingField {
                paragraph: index,
                field,
            })
    };
    let checked = |name: &'static str| {
        let value = field(name)?;
        match valid_name(name, &value) {
            true => Ok(value),
            false => Err(StatusError::BadName {
                paragraph: index,
                field: name,
                value,
            }),
        }
    };
    let name = checked("Package")?;
    let version = field("Version")?;
    let architecture = checked("Architecture")?;
    let (source, source_version) = match paragraph.get("Source") {
        Some(source) => split_source(&source, &version),
        None => (name.clone(), version.clone()),
    };
    let mut depends = Vec::new();
    for key in ["Pre-Depends", "Depends"] {
        if let Some(list) = paragraph.get(key) {
            depends.extend(relation_names(&list));
        }
    }
    let provides = paragraph
        .get("Provides")
        .map(|list| relation_names(&list).into_iter().flatten().collect())
        .unwrap_or_default();
    Ok(InstalledPackage {
        name,
        version,
        architecture,
        source,
        source_version,
        depends,
        provides,
    })
}

/// `Source: foo (1.2-3)` or `Source: foo`.
fn split_source(field: &str, version: &str) -> (String, String) {
    let field = field.trim();
    match field.split_once('(') {
        Some((name, rest)) => (
            name.trim().to_string(),
            rest.trim_end_matches(')').trim().to_string(),
        ),
        None => (field.to_string(), version.to_string()),
    }
}

/// The package names of a relation field (`a (>= 1), b:any | c [amd64]`):
/// per entry, its alternatives.
pub fn relation_names(field: &str) -> Vec<Vec<String>> {
    field
        .split(',')
        .map(|entry| {
            entry
                .split('|')
                .filter_map(|alternative| {
                    let name = alternative
                        .trim()
                        .split(|c: char| c.is_whitespace() || c == '(' || c == '[' || c == '<' || c == ':')
                        .next()?;
                    (!name.is_empty()).then(|| name.to_string())
                })
                .collect::<Vec<_>>()
        })
        .filter(|alternatives| !alternatives.is_empty())
        .collect()
}

/// A version that is not a valid Debian version.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("version {version:?} is not a valid Debian version: {reason}")]
pub struct BadVersion {
    pub version: String,
    pub reason: String,
}

/// Parses a version with Debian's syntax (`[epoch:]upstream[-revision]`).
/// The upstream part must start with a digit, as Debian policy requires:
/// without that rule `v9` would sort after `10.0`.
pub fn parse_version(version: &str) -> Result<debversion::Version, BadVersion> {
    let bad = |reason: &str| BadVersion {
        version: version.to_string(),
        reason: reason.to_string(),
    };
    let parsed: debversion::Version = version
        .parse()
        .map_err(|e: debversion::ParseError| bad(&e.to_string()))?;
    if !parsed.upstream_version.starts_with(|c: char| c.is_ascii_digit()) {
        return Err(bad("the upstream version must start with a digit"));
    }
    if parsed.epoch.is_none() && parsed.upstream_version.contains(':') {
        return Err(bad("a colon is allowed only after an epoch (`1:2.0`)"));
    }
    if parsed.debian_revision.is_none() && parsed.upstream_version.contains('-') {
        return Err(bad("the Debian revision after the last `-` is empty"));
    }
    Ok(parsed)
}

/// Compares versions in Debian's order (`dpkg --compare-versions`):
/// `2026.11.2` > `2026.11.1`, `1.10` > `1.9`, `2.1~rc1` < `2.1` < `2.1-1`.
pub fn version_cmp(a: &str, b: &str) -> Result<std::cmp::Ordering, BadVersion> {
    Ok(parse_version(a)?.cmp(&parse_version(b)?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cmp::Ordering;

    fn cmp(a: &str, b: &str) -> Ordering {
        version_cmp(a, b).unwrap()
    }

    #[test]
    fn versions_follow_debian_order() {
        assert_eq!(cmp("2026.11.2", "2026.11.1"), Ordering::Greater);
        assert_eq!(cmp("1.10", "1.9"), Ordering::Greater);
        assert_eq!(cmp("1.0", "1.0"), Ordering::Equal);
        assert_eq!(cmp("1.0", "1.0.1"), Ordering::Less);
        assert_eq!(cmp("2026.11.1-rc1", "2026.11.1-rc2"), Ordering::Less);
        // A release candidate sorts before its release with `~` ...
        assert_eq!(cmp("2.1~rc1", "2.1"), Ordering::Less);
        assert_eq!(cmp("2.1~rc1", "2.1~rc2"), Ordering::Less);
        // ... while `-rc1` is a Debian revision, which sorts after the bare release.
        assert_eq!(cmp("2.1-rc1", "2.1"), Ordering::Greater);
        assert_eq!(cmp("2.1-rc1", "2.1.1"), Ordering::Less);
        assert_eq!(cmp("10.0", "9"), Ordering::Greater);
        assert_eq!(cmp("1:1.0", "9.0"), Ordering::Greater);
        assert_eq!(cmp("1.0+b1", "1.0"), Ordering::Greater);
    }

    #[test]
    fn versions_that_are_not_debian_are_refused() {
        for bad in [
            "", "v9", "release", "-1", "1.0 beta", "1_0", "a:1.0", "1.0:x", "2.1/rc1", "1.0-",
        ] {
            let err = parse_version(bad).expect_err(bad);
            assert_eq!(err.version, bad);
            assert!(err.to_string().contains("not a valid Debian version"), "{err}");
        }
        assert!(
            parse_version("v9")
                .unwrap_err()
                .reason
                .contains("start with a digit")
        );
        assert!(version_cmp("10.0", "v9").is_err());
        for good in [
            "1",
            "2026.11.1",
            "2.1~rc1",
            "2.1-rc1",
            "1:2.0-3+b1",
            "0.1+git20260101",
        ] {
            parse_version(good).expect(good);
        }
    }

    const STATUS: &str = "\
Package: libc6
Status: install ok installed
Architecture: amd64
Multi-Arch: same
Source: glibc
Version: 2.36-9+deb12u10
Depends: libgcc-s1
Description: GNU C Library: Shared libraries
 Contains the standard libraries.

Package: bash
Essential: yes
Status: install ok installed
Architecture: amd64
Version: 5.2.15-2+b7
Pre-Depends: libc6 (>= 2.36), libtinfo6 (>= 6)
Depends: base-files (>= 2.1.12), debianutils (>= 5.6-0.1)
Provides: sh

Package: gone
Status: deinstall ok config-files
Architecture: amd64
Version: 1.0

Package: perl-base
Status: install ok installed
Architecture: amd64
Source: perl (5.36.0-7+deb12u2)
Version: 5.36.0-7+deb12u2
Depends: libc6:any | libc6.1 [alpha], dpkg (>= 1.17.17)
";

    #[test]
    fn installed_packages_with_source_and_relations() {
        let packages = parse_status(STATUS).unwrap();
        let names: Vec<_> = packages.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["bash", "libc6", "perl-base"]);
        let bash = &packages[0];
        assert_eq!(
            (bash.source.as_str(), bash.source_version.as_str()),
            ("bash", "5.2.15-2+b7")
        );
        assert_eq!(
            bash.depends,
            [["libc6"], ["libtinfo6"], ["base-files"], ["debianutils"]]
        );
        assert_eq!(bash.provides, ["sh"]);
        assert_eq!(packages[1].source, "glibc");
        assert_eq!(packages[1].source_version, "2.36-9+deb12u10");
        assert_eq!(packages[2].source_version, "5.36.0-7+deb12u2");
        assert_eq!(packages[2].depends, vec![vec!["libc6", "libc6.1"], vec!["dpkg"]]);
    }

    #[test]
    fn a_paragraph_without_a_version_is_named() {
        let err = parse_status("Package: ab\nStatus: install ok installed\nArchitecture: all\n").unwrap_err();
        assert_eq!(
            err,
            StatusError::MissingField {
                paragraph: 1,
                field: "Version"
            }
        );
        assert_eq!(err.to_string(), "dpkg status paragraph 1: no Version field");
    }

    #[test]
    fn hostile_names_and_duplicates_are_refused() {
        let one = |name: &str, arch: &str| {
            format!("Package: {name}\nStatus: install ok installed\nArchitecture: {arch}\nVersion: 1\n\n")
        };
        for (name, arch) in [
            ("evil/../bash", "amd64"),
            ("Bash", "amd64"),
            ("x", "amd64"),
            ("ok", "amd 64"),
            ("ok", "a_b"),
        ] {
            let err = parse_status(&one(name, arch)).unwrap_err();
            assert!(matches!(err, StatusError::BadName { .. }), "{name} {arch}: {err}");
        }
        let twice = format!("{}{}", one("bash", "amd64"), one("bash", "amd64"));
        assert_eq!(
            parse_status(&twice).unwrap_err().to_string(),
            "dpkg status lists bash:amd64 installed twice"
        );
        assert_eq!(
            parse_status(&format!("{}{}", one("bash", "amd64"), one("bash", "i386")))
                .unwrap()
                .len(),
            2
        );
    }
}
