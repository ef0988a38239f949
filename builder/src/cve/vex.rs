//! OpenVEX documents (`https://openvex.dev/ns/v0.2.0`): statements that a
//! vulnerability does not affect, or is fixed in, a product; read and
//! matched against findings (pure). Products are Debian source packages by
//! purl with `arch=source`: `pkg:deb/debian/SOURCE?arch=source` or
//! `pkg:deb/debian/SOURCE@VERSION?arch=source` (the source version
//! `imgbuild cve` prints). Any other product, a binary package's purl too,
//! matches nothing: the issue is in the source, and clearing one binary
//! must not clear its siblings.

use serde::Deserialize;

use super::matching::Finding;

/// A statement's status, as OpenVEX spells it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VexStatus {
    NotAffected,
    Affected,
    Fixed,
    UnderInvestigation,
}

impl VexStatus {
    const ALL: [VexStatus; 4] = [
        VexStatus::NotAffected,
        VexStatus::Affected,
        VexStatus::Fixed,
        VexStatus::UnderInvestigation,
    ];

    /// OpenVEX's word.
    pub fn as_str(self) -> &'static str {
        match self {
            VexStatus::NotAffected => "not_affected",
            VexStatus::Affected => "affected",
            VexStatus::Fixed => "fixed",
            VexStatus::UnderInvestigation => "under_investigation",
        }
    }

    /// Whether the statement takes the finding off the gate.
    pub fn clears(self) -> bool {
        matches!(self, VexStatus::NotAffected | VexStatus::Fixed)
    }
}

impl serde::Serialize for VexStatus {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for VexStatus {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let word = String::deserialize(deserializer)?;
        VexStatus::ALL
            .into_iter()
            .find(|status| status.as_str() == word)
            .ok_or_else(|| serde::de::Error::custom(format!("unknown status {word:?}")))
    }
}

/// One VEX document as a report or gate took it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct VexDocument {
    pub path: String,
    pub sha256: String,
    /// Why its statements count for nothing; `None` when they count.
    pub ignored: Option<String>,
}

/// A document, with its statements when it is authentic and readable.
pub struct LoadedVex {
    pub document: VexDocument,
    pub statements: Vec<Statement>,
}

/// A finding a statement cleared.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct Cleared {
    pub id: String,
    pub source: String,
    pub installed_version: String,
    pub urgency: super::tracker::Urgency,
    pub status: VexStatus,
    pub reason: Option<String>,
    /// The document whose statement cleared it.
    pub vex: String,
}

/// Splits `findings` into those no statement of `documents` clears and
/// those one does.
pub fn apply(findings: Vec<Finding>, documents: &[LoadedVex]) -> (Vec<Finding>, Vec<Cleared>) {
    let mut left = Vec::new();
    let mut cleared = Vec::new();
    for finding in findings {
        let clearing = documents
            .iter()
            .find_map(|loaded| clearing(&loaded.statements, &finding).map(|statement| (loaded, statement)));
        match clearing {
            Some((loaded, statement)) => cleared.push(Cleared {
                id: finding.id,
                source: finding.source,
                installed_version: finding.installed_version,
                urgency: finding.urgency,
                status: statement.status,
                reason: statement.reason.clone(),
                vex: loaded.document.path.clone(),
            }),
            None => left.push(finding),
        }
    }
    (left, cleared)
}

/// A Debian source package a statement names, at one version or any.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DebianSource {
    pub name: String,
    pub version: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Statement {
    pub vulnerability: String,
    pub products: Vec<DebianSource>,
    pub status: VexStatus,
    /// The justification, else the impact statement, of `not_affected`.
    pub reason: Option<String>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum VexError {
    #[error("not OpenVEX JSON: {0}")]
    Syntax(String),
    #[error("@context {0:?} is not OpenVEX's (https://openvex.dev/ns/…)")]
    Context(String),
    #[error("no statements")]
    Empty,
    #[error(
        "statement {index} ({vulnerability:?}): not_affected needs a justification or an impact_statement"
    )]
    Unjustified { index: usize, vulnerability: String },
}

#[derive(Deserialize)]
struct RawDocument {
    #[serde(rename = "@context")]
    context: String,
    statements: Vec<RawStatement>,
}

#[derive(Deserialize)]
struct RawStatement {
    vulnerability: RawVulnerability,
    #[serde(default)]
    products: Vec<RawProduct>,
    status: VexStatus,
    justification: Option<String>,
    impact_statement: Option<String>,
}

/// v0.2.0 has `{"name": ID}`; earlier versions the id alone.
#[derive(Deserialize)]
#[serde(untagged)]
enum RawVulnerability {
    Named { name: String },
    Id(String),
}

#[derive(Deserialize)]
struct RawProduct {
    #[serde(rename = "@id")]
    id: String,
}

/// Reads an OpenVEX document; any statement it cannot take makes the whole
/// document refused, so a half-read document never clears anything.
pub fn parse(text: &str) -> Result<Vec<Statement>, VexError> {
    let raw: RawDocument = serde_json::from_str(text).map_err(|e| VexError::Syntax(e.to_string()))?;
    if !raw.context.starts_with("https://openvex.dev/ns") {
        return Err(VexError::Context(raw.context));
    }
    if raw.statements.is_empty() {
        return Err(VexError::Empty);
    }
    raw.statements
        .into_iter()
        .enumerate()
        .map(|(index, statement)| statement_of(index, statement))
        .collect()
}

fn statement_of(index: usize, raw: RawStatement) -> Result<Statement, VexError> {
    let vulnerability = match raw.vulnerability {
        RawVulnerability::Named { name } | RawVulnerability::Id(name) => name,
    };
    let reason = raw.justification.or(raw.impact_statement);
    if raw.status == VexStatus::NotAffected && reason.is_none() {
        return Err(VexError::Unjustified { index, vulnerability });
    }
    Ok(Statement {
        vulnerability,
        products: raw.products.iter().filter_map(|p| debian_source(&p.id)).collect(),
        status: raw.status,
        reason,
    })
}

/// `pkg:deb/debian/NAME[@VERSION]?arch=source[…][#…]`, the version
/// percent-decoded; `None` for anything else, binary packages included.
pub fn debian_source(purl: &str) -> Option<DebianSource> {
    let rest = purl.strip_prefix("pkg:deb/debian/")?;
    let rest = rest.split('#').next().unwrap_or_default();
    let (rest, qualifiers) = rest.split_once('?')?;
    if !qualifiers.split('&').any(|q| q == "arch=source") {
        return None;
    }
    let (name, version) = match rest.split_once('@') {
        Some((name, version)) => (name, Some(percent_decode(version)?)),
        None => (rest, None),
    };
    crate::sbom::dpkg::valid_name("Source", name).then(|| DebianSource {
        name: name.to_string(),
        version,
    })
}

fn percent_decode(text: &str) -> Option<String> {
    let mut bytes = Vec::with_capacity(text.len());
    let mut rest = text.as_bytes();
    while let Some((&first, tail)) = rest.split_first() {
        if first == b'%' {
            let hex = std::str::from_utf8(tail.get(..2)?).ok()?;
            bytes.push(u8::from_str_radix(hex, 16).ok()?);
            rest = &tail[2..];
        } else {
            bytes.push(first);
            rest = tail;
        }
    }
    String::from_utf8(bytes).ok()
}

/// The statement of `statements` that clears `finding`: its id, a product
/// naming its source package at its installed version (any version for
/// `not_affected` without one; `fixed` must name the version), and
/// `not_affected` or `fixed`; and no statement saying `affected` or
/// `under_investigation` for it.
pub fn clearing<'a>(statements: &'a [Statement], finding: &Finding) -> Option<&'a Statement> {
    let about = |statement: &&Statement| {
        statement.vulnerability == finding.id
            && statement.products.iter().any(|product| {
                product.name == finding.source
                    && match &product.version {
                        Some(version) => *version == finding.installed_version,
                        None => statement.status != VexStatus::Fixed,
                    }
            })
    };
    let mut relevant = statements.iter().filter(about);
    if relevant.clone().any(|statement| !statement.status.clears()) {
        return None;
    }
    relevant.next()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cve::matching::State;
    use crate::cve::tracker::Urgency;

    const DOCUMENT: &str = r#"{
      "@context": "https://openvex.dev/ns/v0.2.0",
      "@id": "https://emberrtos.example/vex/1",
      "author": "EmberRTOS security",
      "timestamp": "2026-12-01T00:00:00Z",
      "version": 1,
      "statements": [
        {"vulnerability": {"name": "CVE-2023-4911"},
         "products": [{"@id": "pkg:deb/debian/glibc@2.36-9%2Bdeb12u10?arch=source"}],
         "status": "not_affected", "justification": "vulnerable_code_not_in_execute_path"},
        {"vulnerability": "CVE-2019-18276", "products": [{"@id": "pkg:deb/debian/bash?arch=source"}],
         "status": "affected", "action_statement": "none"},
        {"vulnerability": {"name": "CVE-2022-0001"},
         "products": [{"@id": "pkg:oci/other"}, {"@id": "pkg:deb/debian/zlib@1%3A1.2.13?arch=source"},
                      {"@id": "pkg:deb/debian/zlib?arch=amd64"}],
         "status": "fixed"},
        {"vulnerability": {"name": "CVE-2022-0002"}, "products": [{"@id": "pkg:deb/debian/zlib?arch=source"}],
         "status": "fixed"},
        {"vulnerability": {"name": "CVE-2022-0003"}, "products": [{"@id": "pkg:deb/debian/zlib?arch=source"}],
         "status": "not_affected", "impact_statement": "not built"},
        {"vulnerability": {"name": "CVE-2022-0003"},
         "products": [{"@id": "pkg:deb/debian/zlib@1%3A1.2.13?arch=source"}], "status": "under_investigation"}
      ]
    }"#;

    fn finding(id: &str, source: &str, version: &str) -> Finding {
        Finding {
            id: id.into(),
            source: source.into(),
            installed_version: version.into(),
            binaries: vec![],
            state: State::Affected,
            urgency: Urgency::High,
            fixed_version: None,
        }
    }

    #[test]
    fn statements_clear_their_source_at_their_version() {
        let statements = parse(DOCUMENT).unwrap();
        assert_eq!(statements.len(), 6);
        assert_eq!(
            statements[2].products.len(),
            1,
            "neither the OCI product nor a binary package is a Debian source"
        );
        let glibc = finding("CVE-2023-4911", "glibc", "2.36-9+deb12u10");
        let cleared = clearing(&statements, &glibc).unwrap();
        assert_eq!(
            cleared.reason.as_deref(),
            Some("vulnerable_code_not_in_execute_path")
        );
        let newer = finding("CVE-2023-4911", "glibc", "2.36-9+deb12u11");
        assert!(clearing(&statements, &newer).is_none(), "another version");
        let other_id = finding("CVE-2023-4912", "glibc", "2.36-9+deb12u10");
        assert!(clearing(&statements, &other_id).is_none());
        let bash = finding("CVE-2019-18276", "bash", "5.2.15-2");
        assert!(clearing(&statements, &bash).is_none(), "affected clears nothing");
        let zlib = |id: &str| finding(id, "zlib", "1:1.2.13");
        assert!(clearing(&statements, &zlib("CVE-2022-0001")).is_some());
        assert!(
            clearing(&statements, &zlib("CVE-2022-0002")).is_none(),
            "fixed must name the version"
        );
        let investigated = clearing(&statements, &zlib("CVE-2022-0003"));
        assert!(
            investigated.is_none(),
            "another statement says it is still being looked at"
        );
    }

    #[test]
    fn a_document_it_cannot_take_whole_is_refused() {
        assert!(matches!(parse("{"), Err(VexError::Syntax(_))));
        let context = DOCUMENT.replace("https://openvex.dev/ns/v0.2.0", "https://example.org/ns");
        assert!(matches!(parse(&context), Err(VexError::Context(_))));
        let unjustified = DOCUMENT.replace(r#", "justification": "vulnerable_code_not_in_execute_path""#, "");
        assert_eq!(
            parse(&unjustified),
            Err(VexError::Unjustified {
                index: 0,
                vulnerability: "CVE-2023-4911".into()
            })
        );
        let unknown_status = DOCUMENT.replace(r#""status": "fixed""#, r#""status": "wontfix""#);
        assert!(matches!(parse(&unknown_status), Err(VexError::Syntax(_))));
        let empty = r#"{"@context": "https://openvex.dev/ns/v0.2.0", "statements": []}"#;
        assert_eq!(parse(empty), Err(VexError::Empty));
    }

    #[test]
    fn debian_purls_name_a_source_and_maybe_a_version() {
        let epoch = debian_source("pkg:deb/debian/zlib@1%3A1.2.13.dfsg-1?arch=source").unwrap();
        assert_eq!(
            (epoch.name.as_str(), epoch.version.as_deref()),
            ("zlib", Some("1:1.2.13.dfsg-1"))
        );
        let any = debian_source("pkg:deb/debian/bash?distro=debian-12&arch=source").unwrap();
        assert_eq!(any.version, None);
        for bad in [
            "pkg:deb/ubuntu/bash?arch=source",
            "pkg:deb/debian/Bash?arch=source",
            "pkg:deb/debian/bash@1%zz?arch=source",
            "pkg:deb/debian/bash",
            "pkg:deb/debian/bash@5.2?arch=amd64",
            "bash",
        ] {
            assert_eq!(debian_source(bad), None, "{bad}");
        }
    }
}
