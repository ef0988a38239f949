//! The SPDX 2.3 JSON document, as far as imgbuild writes and reads it.

use serde::{Deserialize, Serialize};

pub const NOASSERTION: &str = "NOASSERTION";

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Document {
    pub spdx_version: String,
    pub data_license: String,
    #[serde(rename = "SPDXID")]
    pub spdx_id: String,
    pub name: String,
    pub document_namespace: String,
    pub creation_info: CreationInfo,
    pub packages: Vec<Package>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<File>,
    pub relationships: Vec<Relationship>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub has_extracted_licensing_infos: Vec<ExtractedLicense>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CreationInfo {
    pub created: String,
    pub creators: Vec<String>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Package {
    #[serde(rename = "SPDXID")]
    pub spdx_id: String,
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version_info: Option<String>,
    pub supplier: String,
    pub download_location: String,
    pub files_analyzed: bool,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub checksums: Vec<Checksum>,
    pub license_concluded: String,
    pub license_declared: String,
    pub copyright_text: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_info: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub comment: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub primary_package_purpose: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub external_refs: Vec<ExternalRef>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct File {
    #[serde(rename = "SPDXID")]
    pub spdx_id: String,
    pub file_name: String,
    pub checksums: Vec<Checksum>,
    pub license_concluded: String,
    pub copyright_text: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub comment: Option<String>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Checksum {
    pub algorithm: String,
    pub checksum_value: String,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ExternalRef {
    pub reference_category: String,
    pub reference_type: String,
    pub reference_locator: String,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "camelCase")]
pub struct Relationship {
    pub spdx_element_id: String,
    pub relationship_type: String,
    pub related_spdx_element: String,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ExtractedLicense {
    pub license_id: String,
    pub name: String,
    pub extracted_text: String,
}

impl Package {
    /// A package with nothing asserted beyond its name.
    pub fn new(spdx_id: String, name: &str) -> Package {
        Package {
            spdx_id,
            name: name.to_string(),
            version_info: None,
            supplier: NOASSERTION.into(),
            download_location: NOASSERTION.into(),
            files_analyzed: false,
            checksums: Vec::new(),
            license_concluded: NOASSERTION.into(),
            license_declared: NOASSERTION.into(),
            copyright_text: NOASSERTION.into(),
            source_info: None,
            comment: None,
            primary_package_purpose: None,
            external_refs: Vec::new(),
        }
    }

    pub fn purl(&self) -> Option<&str> {
        self.external_refs
            .iter()
            .find(|r| r.reference_type == "purl")
            .map(|r| r.reference_locator.as_str())
    }

    pub fn with_purl(mut self, purl: String) -> Package {
        self.external_refs.push(ExternalRef {
            reference_category: "PACKAGE-MANAGER".into(),
            reference_type: "purl".into(),
            reference_locator: purl,
        });
        self
    }
}

impl Checksum {
    pub fn sha256(hex: &str) -> Checksum {
        Checksum {
            algorithm: "SHA256".into(),
            checksum_value: hex.to_string(),
        }
    }
}

impl Relationship {
    pub fn new(from: &str, kind: &str, to: &str) -> Relationship {
        Relationship {
            spdx_element_id: from.to_string(),
            relationship_type: kind.to_string(),
            related_spdx_element: to.to_string(),
        }
    }
}

/// `name` with every character SPDX ids do not allow (`[A-Za-z0-9.-]`) as
/// `-`. A name that needed changing gets a digest of itself appended, so
/// two names never share an id.
pub fn id_string(name: &str) -> String {
    let cleaned: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect();
    if cleaned == name {
        cleaned
    } else {
        let digest = crate::io::hashing::sha256_hex(name);
        format!("{cleaned}-{}", &digest[..8])
    }
}

/// An SPDX element id: `SPDXRef-<kind>-<name>`.
pub fn element_id(kind: &str, name: &str) -> String {
    format!("SPDXRef-{kind}-{}", id_string(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn element_ids_hold_only_allowed_characters_and_stay_apart() {
        assert_eq!(element_id("deb", "bash-amd64"), "SPDXRef-deb-bash-amd64");
        let plus = element_id("deb", "libstdc++6");
        let dash = element_id("deb", "libstdc--6");
        assert_ne!(plus, dash);
        assert!(plus.starts_with("SPDXRef-deb-libstdc--6-"), "{plus}");
        assert!(
            plus.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-')
        );
    }
}
