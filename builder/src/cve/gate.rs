//! The promotion gate on known vulnerabilities: every finding more urgent
//! than `--max-severity` refuses the promotion unless an authentic OpenVEX
//! statement (signed by the promotion's own key) clears it. VEX documents
//! that are not authentic or not readable are listed with the reason and
//! clear nothing.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, Result};
use emberrtos_contract::error::BadInput;

use super::matching::{Finding, State};
use super::report::{Database, Report};
use super::tracker::Urgency;
use super::vex::{self, Statement, VexStatus};
use crate::io::gpg;
use crate::io::hashing::sha256_hex;
use crate::transport::bounded::read_capped;

/// The largest VEX document read.
const MAX_VEX_BYTES: u64 = 16 << 20;

/// One `--vex` document as the gate took it.
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
    pub urgency: Urgency,
    pub status: VexStatus,
    pub reason: Option<String>,
    pub vex: String,
}

#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct GateReport {
    pub release: String,
    pub database: Database,
    pub max_severity: Urgency,
    /// Findings above the limit that nothing cleared: each refuses.
    pub blocking: Vec<Finding>,
    pub cleared: Vec<Cleared>,
    pub vex: Vec<VexDocument>,
}

/// Reads `path` and its armored detached signature `<path>.sig`; only a
/// good signature by the key whose primary fingerprint is `signer` lets its
/// statements count. A file that cannot be read at all is a usage error.
pub fn load_vex(path: &Path, signer: &str, homedir: Option<&Path>) -> Result<LoadedVex> {
    let bad = |message: String| BadInput::new("--vex", format!("{}: {message}", path.display()));
    let file = std::fs::File::open(path).map_err(|e| bad(e.to_string()))?;
    if !file.metadata().map_err(|e| bad(e.to_string()))?.is_file() {
        return Err(bad("not a regular file".into()).into());
    }
    let data =
        read_capped(file, MAX_VEX_BYTES).ok_or_else(|| bad(format!("larger than {MAX_VEX_BYTES} bytes")))?;
    let mut document = VexDocument {
        path: path.display().to_string(),
        sha256: sha256_hex(&data),
        ignored: None,
    };
    let sig_path = format!("{}.sig", path.display());
    let statements = match std::fs::read(&sig_path) {
        Err(e) => Err(format!("no signature {sig_path}: {e}")),
        Ok(signature) => {
            let verification = gpg::verify_detached(&data, &signature, homedir)
                .with_context(|| format!("checking {sig_path}"))?;
            authentic_statements(&data, &verification, signer)
        }
    };
    let statements = statements.unwrap_or_else(|why| {
        document.ignored = Some(why);
        Vec::new()
    });
    Ok(LoadedVex { document, statements })
}

/// The statements of a document whose signature check said `verification`.
fn authentic_statements(
    data: &[u8],
    verification: &gpg::Verification,
    signer: &str,
) -> Result<Vec<Statement>, String> {
    if !verification.good_by(signer) {
        let problem = verification
            .problem
            .as_deref()
            .unwrap_or("a good signature by another key");
        return Err(format!("not signed by the promotion's key {signer}: {problem}"));
    }
    let text = std::str::from_utf8(data).map_err(|_| "not UTF-8".to_string())?;
    vex::parse(text).map_err(|e| e.to_string())
}

/// Judges `report` against the limit and the documents (pure).
pub fn judge(report: Report, max_severity: Urgency, documents: Vec<LoadedVex>) -> GateReport {
    let mut blocking = Vec::new();
    let mut cleared = Vec::new();
    for finding in report.findings.into_iter().filter(|f| f.urgency > max_severity) {
        let clearing = documents.iter().find_map(|loaded| {
            vex::clearing(&loaded.statements, &finding).map(|statement| (loaded, statement))
        });
        match clearing {
            Some((loaded, statement)) => cleared.push(Cleared {
                id: finding.id,
                source: finding.source,
                urgency: finding.urgency,
                status: statement.status,
                reason: statement.reason.clone(),
                vex: loaded.document.path.clone(),
            }),
            None => blocking.push(finding),
        }
    }
    GateReport {
        release: report.release,
        database: report.database,
        max_severity,
        blocking,
        cleared,
        vex: documents.into_iter().map(|loaded| loaded.document).collect(),
    }
}

/// One refusal reason per blocking finding.
pub fn reasons(gate: &GateReport) -> Vec<String> {
    gate.blocking
        .iter()
        .map(|finding| {
            let state = match (finding.state, &finding.fixed_version) {
                (State::Affected, Some(fixed)) => format!("affected, fixed in {fixed}"),
                (State::Affected, None) => "affected, no fix yet".to_string(),
                (State::Undetermined, _) => "undetermined".to_string(),
            };
            format!(
                "{} ({}, above --max-severity {}) in {} {}: {state}; no authentic VEX statement clears it",
                finding.id,
                finding.urgency.as_str(),
                gate.max_severity.as_str(),
                finding.source,
                finding.installed_version
            )
        })
        .collect()
}

/// The gate as text, after promote's table.
pub fn render(gate: &GateReport) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "cve: Debian {}, {} (sha256 {}), --max-severity {}: {} blocking, {} cleared by VEX",
        gate.release,
        gate.database.path,
        gate.database.sha256,
        gate.max_severity.as_str(),
        gate.blocking.len(),
        gate.cleared.len()
    );
    for cleared in &gate.cleared {
        let reason = cleared.reason.as_deref().unwrap_or("-");
        let _ = writeln!(
            out,
            "  cleared  {} in {}: {:?} ({reason}) by {}",
            cleared.id, cleared.source, cleared.status, cleared.vex
        );
    }
    for document in &gate.vex {
        if let Some(why) = &document.ignored {
            let _ = writeln!(out, "  ignored  {}: {why}", document.path);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn finding(id: &str, urgency: Urgency) -> Finding {
        Finding {
            id: id.into(),
            source: "glibc".into(),
            installed_version: "2.36-9+deb12u10".into(),
            binaries: vec!["libc6".into()],
            state: State::Affected,
            urgency,
            fixed_version: Some("2.36-9+deb12u11".into()),
        }
    }

    fn report(findings: Vec<Finding>) -> Report {
        let database = Database {
            format: "debian-security-tracker-json",
            path: "db.json".into(),
            sha256: "ab".repeat(32),
            bytes: 1,
        };
        Report::new("c".repeat(64), "bookworm".into(), database, 1, findings)
    }

    fn loaded(path: &str, statements: &str, ignored: Option<&str>) -> LoadedVex {
        let document =
            format!(r#"{{"@context": "https://openvex.dev/ns/v0.2.0", "statements": [{statements}]}}"#);
        LoadedVex {
            document: VexDocument {
                path: path.into(),
                sha256: sha256_hex(&document),
                ignored: ignored.map(String::from),
            },
            statements: match ignored {
                None => vex::parse(&document).unwrap(),
                Some(_) => Vec::new(),
            },
        }
    }

    const CLEARS_HIGH: &str = r#"{"vulnerability": {"name": "CVE-2023-0002"}, "products": [{"@id": "pkg:deb/debian/glibc"}],
        "status": "not_affected", "justification": "component_not_present"}"#;

    #[test]
    fn only_findings_above_the_limit_refuse_and_vex_clears_them() {
        let findings = vec![
            finding("CVE-2023-0001", Urgency::Unassigned),
            finding("CVE-2023-0002", Urgency::High),
            finding("CVE-2023-0003", Urgency::Medium),
        ];
        let gate = judge(report(findings.clone()), Urgency::Medium, vec![]);
        let blocking: Vec<_> = gate.blocking.iter().map(|f| f.id.as_str()).collect();
        assert_eq!(blocking, ["CVE-2023-0001", "CVE-2023-0002"]);
        let reasons = reasons(&gate);
        assert!(reasons[1].starts_with("CVE-2023-0002 (high, above --max-severity medium) in glibc 2.36-9+deb12u10: affected, fixed in 2.36-9+deb12u11"), "{reasons:?}");
        let gate = judge(
            report(findings),
            Urgency::Medium,
            vec![loaded("ok.vex", CLEARS_HIGH, None)],
        );
        let blocking: Vec<_> = gate.blocking.iter().map(|f| f.id.as_str()).collect();
        assert_eq!(blocking, ["CVE-2023-0001"]);
        assert_eq!(gate.cleared[0].id, "CVE-2023-0002");
        assert_eq!(gate.cleared[0].vex, "ok.vex");
        assert!(
            render(&gate)
                .contains("cleared  CVE-2023-0002 in glibc: NotAffected (component_not_present) by ok.vex")
        );
    }

    #[test]
    fn an_ignored_document_clears_nothing_and_says_why() {
        let ignored = loaded("bad.vex", CLEARS_HIGH, Some("no signature bad.vex.sig"));
        let gate = judge(
            report(vec![finding("CVE-2023-0002", Urgency::High)]),
            Urgency::Low,
            vec![ignored],
        );
        assert_eq!(gate.blocking.len(), 1);
        assert!(render(&gate).contains("ignored  bad.vex: no signature bad.vex.sig"));
    }

    #[test]
    fn a_signature_by_another_key_is_not_authentic() {
        let good_by_other = gpg::Verification {
            good: true,
            primary_fingerprint: Some("B".repeat(40)),
            ..Default::default()
        };
        let why = authentic_statements(b"{}", &good_by_other, &"A".repeat(40)).unwrap_err();
        assert!(why.contains("not signed by the promotion's key"), "{why}");
        let good = gpg::Verification {
            primary_fingerprint: Some("A".repeat(40)),
            ..good_by_other
        };
        let why = authentic_statements(b"{", &good, &"A".repeat(40)).unwrap_err();
        assert!(why.starts_with("not OpenVEX JSON"), "{why}");
    }
}
