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

#[cfg(test)]
mod tests {
    use super::*;

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
