//! What a commit's SBOM says is installed, as the tracker names it: Debian
//! source packages and versions, and the Debian release (pure).

use std::collections::BTreeMap;

use anyhow::{Result, bail};

use super::tracker::MAX_VERSION_BYTES;
use crate::sbom::document::Document;

/// A Debian source package installed in one version, and the binary
/// packages built from it that the image holds.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct InstalledSource {
    pub name: String,
    pub version: String,
    pub binaries: Vec<String>,
}

const DEBIAN_PURL: &str = "pkg:deb/debian/";

/// The Debian source packages of the document, one per source name and
/// version, sorted: those of its Debian packages (a `pkg:deb/debian/`
/// purl), and those of packages built here from Debian sources (the kernel
/// from `linux-source-*` is the source package `linux-6.12`, say, never the
/// `linux-image-*` package that is not installed). A Debian package without
/// a readable source is an error naming it: a CVE report that skips
/// packages would pass what it never looked at.
pub fn installed_sources(document: &Document) -> Result<Vec<InstalledSource>> {
    let mut sources: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    for package in &document.packages {
        let info = package.source_info.as_deref().unwrap_or_default();
        let is_deb = package.purl().is_some_and(|purl| purl.starts_with(DEBIAN_PURL));
        let (name, version) = match crate::sbom::parse_debian_source_info(info) {
            Some(source) => source,
            None if is_deb => bail!(
                "the SBOM's package {} states no Debian source package (sourceInfo {info:?})",
                package.spdx_id
            ),
            None => continue,
        };
        if version.len() > MAX_VERSION_BYTES || crate::sbom::dpkg::parse_version(version).is_err() {
            bail!(
                "the SBOM's package {} states source version {version:?}, not a Debian version",
                package.spdx_id
            );
        }
        let key = (name.to_string(), version.to_string());
        sources.entry(key).or_default().push(package.name.clone());
    }
    Ok(sources
        .into_iter()
        .map(|((name, version), binaries)| InstalledSource {
            name,
            version,
            binaries,
        })
        .collect())
}

/// How the document's kernel is matched: as the Debian source package it
/// was built from, or not at all, said so.
pub fn kernel_match(document: &Document) -> String {
    let Some(kernel) = document
        .packages
        .iter()
        .find(|p| p.spdx_id == crate::sbom::KERNEL_ID)
    else {
        return "NOT CHECKED: the SBOM states no kernel".into();
    };
    match crate::sbom::parse_debian_source_info(kernel.source_info.as_deref().unwrap_or_default()) {
        Some((name, version)) => format!("matched as the Debian source package {name} {version}"),
        None => format!(
            "NOT CHECKED: the SBOM states no Debian source for the kernel (linux {})",
            crate::io::clean(kernel.version_info.as_deref().unwrap_or("?"))
        ),
    }
}

/// `VERSION_CODENAME` of an os-release file (`bookworm`), when it is a
/// plain lower-case word.
pub fn release_codename(os_release: &str) -> Option<&str> {
    let value = os_release
        .lines()
        .find_map(|line| line.trim().strip_prefix("VERSION_CODENAME="))?;
    let value = value.trim_matches(|c| c == '"' || c == '\'');
    valid_release(value).then_some(value)
}

/// A Debian release's code name: 2 to 32 lower-case letters.
pub fn valid_release(name: &str) -> bool {
    (2..=32).contains(&name.len()) && name.bytes().all(|b| b.is_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sbom::document::Package;

    fn deb(name: &str, source: &str) -> Package {
        let mut package = Package::new(format!("SPDXRef-deb-{name}"), name)
            .with_purl(format!("{DEBIAN_PURL}{name}@1?arch=amd64"));
        package.source_info = Some(crate::sbom::debian_source_info(source, "2.36-9+deb12u10"));
        package
    }

    fn document(packages: Vec<Package>) -> Document {
        let mut document: Document = serde_json::from_str(
            r#"{"spdxVersion": "SPDX-2.3", "dataLicense": "CC0-1.0", "SPDXID": "SPDXRef-DOCUMENT",
                "name": "t", "documentNamespace": "https://example.org/t",
                "creationInfo": {"created": "2026-01-01T00:00:00Z", "creators": ["Tool: t"]},
                "packages": [], "relationships": []}"#,
        )
        .unwrap();
        document.packages = packages;
        document
    }

    #[test]
    fn binaries_of_one_source_are_one_source_package() {
        let tarball_kernel = Package::new("SPDXRef-kernel-linux".into(), "linux");
        let crate_package = Package::new("SPDXRef-crate-x".into(), "x").with_purl("pkg:cargo/x@1".into());
        let packages = vec![
            deb("libc6", "glibc"),
            deb("libc-bin", "glibc"),
            deb("bash", "bash"),
            tarball_kernel,
            crate_package,
        ];
        let sources = installed_sources(&document(packages.clone())).unwrap();
        let names: Vec<_> = sources
            .iter()
            .map(|s| (s.name.as_str(), s.binaries.len()))
            .collect();
        assert_eq!(
            names,
            [("bash", 1), ("glibc", 2)],
            "a kernel from a tarball has no Debian source"
        );
        assert_eq!(sources[1].version, "2.36-9+deb12u10");
        let mut debian_kernel = Package::new("SPDXRef-kernel-linux".into(), "linux");
        debian_kernel.source_info = Some(crate::sbom::debian_source_info(
            "linux-6.12",
            "6.12.118-1~deb12u1",
        ));
        let sources = installed_sources(&document([packages, vec![debian_kernel]].concat())).unwrap();
        let kernel = sources.iter().find(|s| s.name == "linux-6.12").unwrap();
        assert_eq!(kernel.version, "6.12.118-1~deb12u1");
        assert_eq!(kernel.binaries, ["linux"]);
    }

    #[test]
    fn a_debian_package_without_its_source_is_named() {
        let mut broken = deb("bash", "bash");
        broken.source_info = Some("built from the Debian source package Bash;rm 1".into());
        let error = installed_sources(&document(vec![broken]))
            .unwrap_err()
            .to_string();
        assert!(error.contains("SPDXRef-deb-bash"), "{error}");
    }

    #[test]
    fn the_report_says_how_the_kernel_was_matched() {
        assert_eq!(
            kernel_match(&document(vec![])),
            "NOT CHECKED: the SBOM states no kernel"
        );
        let mut kernel = Package::new(crate::sbom::KERNEL_ID.into(), "linux");
        kernel.version_info = Some("6.12.118".into());
        let tarball = kernel_match(&document(vec![kernel.clone()]));
        assert_eq!(
            tarball,
            "NOT CHECKED: the SBOM states no Debian source for the kernel (linux 6.12.118)"
        );
        kernel.source_info = Some(crate::sbom::debian_source_info(
            "linux-6.12",
            "6.12.118-1~deb12u1",
        ));
        assert_eq!(
            kernel_match(&document(vec![kernel])),
            "matched as the Debian source package linux-6.12 6.12.118-1~deb12u1"
        );
    }

    #[test]
    fn the_release_is_the_os_release_code_name() {
        let text = "PRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\nVERSION_CODENAME=bookworm\nID=debian\n";
        assert_eq!(release_codename(text), Some("bookworm"));
        assert_eq!(release_codename("VERSION_CODENAME=\"trixie\"\n"), Some("trixie"));
        assert_eq!(release_codename("VERSION_CODENAME=../x\n"), None);
        assert_eq!(release_codename("ID=debian\n"), None);
    }
}
