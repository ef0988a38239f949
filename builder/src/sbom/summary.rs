//! What `inspect --sbom` says of an SBOM: how many packages of each kind,
//! and the licenses seen (pure).

use std::collections::BTreeMap;

use serde::Serialize;

use super::document::Document;

#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub struct Summary {
    pub packages: usize,
    /// Packages by kind: `deb`, `crate`, `kernel`, `bin`, `overlay`, `OS`.
    pub by_kind: BTreeMap<String, usize>,
    /// Each declared license (an SPDX expression or NOASSERTION) and how
    /// many packages declare it.
    pub licenses: BTreeMap<String, usize>,
    pub files: usize,
    pub relationships: usize,
}

/// The kind an element id names: `SPDXRef-<kind>-…`.
fn kind_of(spdx_id: &str) -> String {
    let rest = spdx_id.strip_prefix("SPDXRef-").unwrap_or(spdx_id);
    rest.split('-').next().unwrap_or(rest).to_string()
}

pub fn summarize(document: &Document) -> Summary {
    let mut by_kind = BTreeMap::new();
    let mut licenses = BTreeMap::new();
    for package in &document.packages {
        *by_kind.entry(kind_of(&package.spdx_id)).or_insert(0) += 1;
        *licenses.entry(package.license_declared.clone()).or_insert(0) += 1;
    }
    Summary {
        packages: document.packages.len(),
        by_kind,
        licenses,
        files: document.files.len(),
        relationships: document.relationships.len(),
    }
}

/// The summary as `inspect` prints it.
pub fn render(summary: &Summary) -> String {
    let kinds: Vec<String> = summary.by_kind.iter().map(|(k, n)| format!("{n} {k}")).collect();
    let mut out = format!(
        "{} packages ({}), {} files, {} relationships\nlicenses seen ({}):\n",
        summary.packages,
        kinds.join(", "),
        summary.files,
        summary.relationships,
        summary.licenses.len()
    );
    let mut licenses: Vec<_> = summary.licenses.iter().collect();
    licenses.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    for (license, count) in licenses {
        out.push_str(&format!("  {count:>4}  {license}\n"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_come_from_the_element_ids() {
        assert_eq!(kind_of("SPDXRef-deb-bash-amd64"), "deb");
        assert_eq!(kind_of("SPDXRef-OS"), "OS");
        assert_eq!(kind_of("SPDXRef-crate-serde-1.0.0"), "crate");
    }
}
