//! `imgbuild promote`: a release ref moves to a commit only when enough
//! platforms (2 by default) have a valid signed PASS record for that exact
//! commit, measured through a pinned host key unless `--allow-tofu`. Every
//! record is re-verified here (signature, key, commit, verdict); nothing an
//! earlier run noted is trusted.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use anyhow::Result;
use serde::Serialize;

use super::record::{self, Record};
use super::ssh::Established;
use super::{clean, expected_kernel, short};
use crate::cve::gate::{self, GateReport};
use crate::cve::tracker::Urgency;
use crate::io::gpg::{self, Verification};
use crate::io::hashing::sha256_hex;
use crate::io::records::{self, RecordKind, StoredRecord};
use crate::ostree;
use crate::ui::Ui;
use emberrtos_contract::error::{BadInput, Refused};

pub const SCHEMA: &str = "promotion/1";

pub struct PromoteRequest {
    pub repo: PathBuf,
    pub from: String,
    pub to: String,
    pub gpg_key: String,
    pub gpg_homedir: Option<PathBuf>,
    /// Hardware ids that must each have a PASS.
    pub require: Vec<String>,
    /// Distinct platforms that must have a PASS, `--require`d ones included.
    pub min_platforms: usize,
    /// Its `tpm_ca` is `None`: [`PromoteRequest::tpm_ca`] is lent to it.
    pub policy: Policy<'static>,
    /// `--tpm-ca`.
    pub tpm_ca: Option<PathBuf>,
    /// The known-vulnerability gate, when asked for.
    pub cve: Option<CveGate>,
}

/// `--max-severity LEVEL [--cve-db FILE] [--vex FILE]…`.
pub struct CveGate {
    pub max_severity: Urgency,
    pub data: crate::cve::DataSource,
    /// Refuse data dated more than this many days ago.
    pub max_age: Option<u64>,
    pub vex: Vec<PathBuf>,
}

/// One record as promote judged it; `why` is `None` when it counts.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct Row {
    pub platform: String,
    pub name: String,
    pub verdict: String,
    pub worst_us: Option<u64>,
    pub budget_us: Option<u64>,
    pub record: String,
    pub sha256: String,
    /// The host key it was measured through.
    pub host_key: String,
    /// How that key was established: `pinned`, `trust-on-first-use`, `not stated`.
    pub host_key_established: String,
    /// `tpm2-quote` (checked again here) or `none`.
    pub attestation: String,
    pub finished: String,
    /// Signed by the key, readable, about this commit.
    pub valid: bool,
    pub why: Option<String>,
}

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct PromoteReport {
    pub commit: String,
    /// The machine of the commit's kernel.
    pub arch: Option<rtcheck::Arch>,
    pub from: String,
    pub to: String,
    pub rows: Vec<Row>,
    /// Set when the ref moved.
    pub promotion: Option<PathBuf>,
    pub previous: Option<String>,
    /// The known-vulnerability gate's judgement, when asked for.
    pub cve: Option<GateReport>,
}

/// What a PASS must have been measured against to count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Policy<'a> {
    /// The shortest measurement that counts, in seconds.
    pub min_duration_s: u64,
    /// The largest budget a PASS may have been judged against, in µs.
    pub max_budget_us: u64,
    /// Whether a PASS through a host key that was not pinned counts.
    pub allow_tofu: bool,
    /// Whether a PASS without a TPM's attestation counts.
    pub allow_unattested: bool,
    /// The TPM CAs an attested PASS's EK certificate must chain to.
    pub tpm_ca: Option<&'a Path>,
}

/// Judges one stored record (pure once its signature is checked) against
/// the key whose primary fingerprint is `signer`.
pub fn judge(
    stored: &StoredRecord,
    verification: Option<&Verification>,
    signer: &str,
    commit: &str,
    policy: Policy,
) -> Row {
    let parsed = serde_json::from_slice::<Record>(&stored.json);
    let mut row = Row {
        platform: "?".into(),
        name: String::new(),
        verdict: "?".into(),
        worst_us: None,
        budget_us: None,
        record: stored.name.clone(),
        sha256: sha256_hex(&stored.json),
        host_key: String::new(),
        host_key_established: String::new(),
        attestation: String::new(),
        finished: String::new(),
        valid: false,
        why: None,
    };
    if let Ok(record) = &parsed {
        row.platform = clean(&record.hardware.id);
        row.name = clean(&record.hardware.platform());
        row.verdict = clean(&record.verdict);
        row.worst_us = Some(record.worst_us);
        row.budget_us = Some(record.budget_us);
        row.host_key = clean(&record.target.host_key.fingerprint);
        row.host_key_established = record.host_key_established().into();
        row.attestation = clean(record.attestation());
        row.finished = clean(&record.finished);
    }
    let record = authentic(&parsed, verification, signer, commit);
    row.valid = record.is_ok();
    row.why = record
        .err()
        .or_else(|| parsed.ok().and_then(|r| why_not_pass(&r, policy)));
    row
}

/// The record, when it is signed by `signer`, readable and about `commit`;
/// else why not.
fn authentic<'a>(
    parsed: &'a serde_json::Result<Record>,
    verification: Option<&Verification>,
    signer: &str,
    commit: &str,
) -> Result<&'a Record, String> {
    let Some(verification) = verification else {
        return Err("unsigned: no .sig beside it".into());
    };
    if !verification.good {
        let problem = verification.problem.as_deref().unwrap_or("no valid signature");
        return Err(format!("bad signature: {problem}"));
    }
    if !verification.good_by(signer) {
        return Err("bad signature: signed by another key than --gpg-key".into());
    }
    let record = parsed
        .as_ref()
        .map_err(|error| clean(&format!("unreadable: {error}")))?;
    if !record::READABLE.contains(&record.schema.as_str()) {
        return Err(clean(&format!("unknown schema {:?}", record.schema)));
    }
    if record.commit != commit {
        return Err(clean(&format!("another commit ({})", short(&record.commit))));
    }
    Ok(record)
}

/// Why an authentic record is not a PASS that counts (pure).
fn why_not_pass(record: &Record, policy: Policy) -> Option<String> {
    why_not_a_good_verdict(record, policy)
        .or_else(|| {
            let established = record.target.host_key.established;
            (established != Some(Established::Pinned) && !policy.allow_tofu).then(|| {
                format!(
                    "PASS through a host key not pinned ({}): --allow-tofu counts it",
                    record.host_key_established()
                )
            })
        })
        .or_else(|| why_not_attested(record, policy))
}

/// An attested record's evidence is checked again; an unattested one
/// counts only with `--allow-unattested`.
fn why_not_attested(record: &Record, policy: Policy) -> Option<String> {
    let lenient = |why: &str| (!policy.allow_unattested).then(|| why.to_string());
    match record.check_attestation(policy.tpm_ca) {
        None => {
            lenient("PASS without a TPM attestation (the target's own word): --allow-unattested counts it")
        }
        Some(Ok(true)) => None,
        Some(Ok(false)) => lenient(
            "PASS attested by a TPM whose EK certificate was not checked: --tpm-ca checks it (or --allow-unattested)",
        ),
        Some(Err(error)) => Some(clean(&format!("its TPM attestation does not verify: {error}"))),
    }
}

fn why_not_a_good_verdict(record: &Record, policy: Policy) -> Option<String> {
    match record.verdict.as_str() {
        "PASS" if record.worst_us > record.budget_us => Some("PASS over its own budget".into()),
        "PASS" if record.duration_s < policy.min_duration_s => Some(format!(
            "PASS over only {} s (--min-duration {})",
            record.duration_s, policy.min_duration_s
        )),
        "PASS" if record.budget_us > policy.max_budget_us => Some(format!(
            "PASS against a {} us budget (--max-budget {})",
            record.budget_us, policy.max_budget_us
        )),
        "PASS" => None,
        "FAIL" => Some("FAIL: worst case over the budget".into()),
        "INVALID" => Some("INVALID: the measurement cannot be trusted".into()),
        other => Some(clean(&format!("unknown verdict {other:?}"))),
    }
}

/// A platform's newest authentic record decides for it (pure): an older
/// PASS does not count once a newer FAIL or INVALID says otherwise.
pub fn supersede(rows: &mut [Row]) {
    let newest: Vec<(String, String, String)> = rows
        .iter()
        .filter(|row| row.valid)
        .map(|row| (row.platform.clone(), row.finished.clone(), row.record.clone()))
        .collect();
    for row in rows.iter_mut().filter(|row| row.why.is_none()) {
        let newer = newest.iter().find(|(platform, finished, record)| {
            *platform == row.platform && (finished, record) > (&row.finished, &row.record)
        });
        if let Some((_, _, record)) = newer {
            row.why = Some(format!("superseded by the newer {record}"));
        }
    }
}

/// Whether the rows allow the promotion (pure): the platforms that passed,
/// or why not. Platforms measured through one host key count once: one
/// machine cannot stand for several.
pub fn decide(
    rows: &[Row],
    require: &[String],
    min_platforms: usize,
) -> Result<BTreeSet<String>, Vec<String>> {
    let counted: Vec<&Row> = rows.iter().filter(|row| row.why.is_none()).collect();
    let passed: BTreeSet<String> = counted.iter().map(|row| row.platform.clone()).collect();
    let machines: BTreeSet<&str> = counted.iter().map(|row| row.host_key.as_str()).collect();
    let mut problems: Vec<String> = require
        .iter()
        .filter(|id| !passed.contains(*id))
        .map(|id| format!("required platform {id} has no valid PASS record for this commit"))
        .collect();
    let distinct = passed.len().min(machines.len());
    if distinct < min_platforms {
        problems.push(format!(
            "{distinct} platform(s) passed on distinct machines, at least {min_platforms} needed"
        ));
    }
    if problems.is_empty() {
        Ok(passed)
    } else {
        Err(problems)
    }
}

/// Why `name` cannot be a release ref (pure): libostree's own check, and
/// git's rules it lets through (`..`, empty components, an edge `/`).
pub fn ref_name_problem(name: &str) -> Option<String> {
    if let Err(error) = ::ostree::validate_rev(name) {
        return Some(error.to_string());
    }
    if name.contains("..") || name.split('/').any(str::is_empty) {
        return Some("`..`, `//` and a leading or trailing `/` are not allowed".into());
    }
    None
}

fn check_request(request: &PromoteRequest) -> Result<()> {
    if let Some(problem) = ref_name_problem(&request.to) {
        return Err(BadInput::new("--to", format!("{:?} is not a ref name: {problem}", request.to)).into());
    }
    if request.min_platforms == 0 && request.require.is_empty() {
        return Err(BadInput::new(
            "--min-platforms",
            "0 without --require would promote on no measurement",
        )
        .into());
    }
    Ok(())
}

/// Judges every record of the commit; on success writes the signed
/// promotion record, signs the commit, moves the ref and signs the summary.
/// A refusal is a [`Refused`] error, after `on_rows` has seen the table.
pub fn promote(
    request: &PromoteRequest,
    ui: &Ui,
    on_rows: &mut dyn FnMut(&PromoteReport),
) -> Result<PromoteReport> {
    check_request(request)?;
    let homedir = request.gpg_homedir.as_deref();
    let signer = gpg::primary_fingerprint(&request.gpg_key, homedir)?;
    let expected = expected_kernel(&request.repo, &request.from, "promote")?;
    let commit = expected.commit;
    let machine = expected.arch.map_or("an unknown machine", rtcheck::Arch::name);
    ui.step(
        "promote",
        format!(
            "{} → {} at {} (for {machine})",
            request.from,
            request.to,
            short(&commit)
        ),
    );
    let rows = judge_all(request, &commit, &signer)?;
    let repository = ostree::open(&request.repo)?;
    let cve = match &request.cve {
        Some(asked) => Some(judge_cve(&repository, asked, &commit, &signer, homedir, ui)?),
        None => None,
    };
    let mut report = PromoteReport {
        commit: commit.clone(),
        arch: expected.arch,
        from: request.from.clone(),
        to: request.to.clone(),
        rows,
        promotion: None,
        previous: ostree::resolve(&repository, &request.to)?,
        cve,
    };
    let mut problems = decide(&report.rows, &request.require, request.min_platforms)
        .err()
        .unwrap_or_default();
    problems.extend(report.cve.iter().flat_map(gate::reasons));
    if !problems.is_empty() {
        on_rows(&report);
        return Err(Refused {
            stage: "promote".into(),
            summary: format!("{} is not moved to {}", request.to, short(&commit)),
            reasons: problems,
        }
        .into());
    }
    let promotion = write_promotion(request, &report)?;
    ostree::sign_commit(&repository, &commit, &request.gpg_key, homedir)?;
    ostree::set_ref(&repository, &request.to, &commit)?;
    ostree::update_summary(&repository, Some(&request.gpg_key), homedir)?;
    ui.note(format!("{} → {commit}", request.to));
    report.promotion = Some(promotion);
    on_rows(&report);
    Ok(report)
}

/// The commit's known vulnerabilities, read again from the commit and the
/// data, less what authentic VEX documents clear, against the limit.
fn judge_cve(
    repo: &::ostree::Repo,
    asked: &CveGate,
    commit: &str,
    signer: &str,
    homedir: Option<&std::path::Path>,
    ui: &Ui,
) -> Result<GateReport> {
    let mut report = crate::cve::report_of_commit(repo, commit, &asked.data, None)?;
    if let Some(warning) = crate::cve::check_age(&report.database, asked.max_age)? {
        ui.warn(warning);
    }
    let documents = asked
        .vex
        .iter()
        .map(|path| crate::cve::load_vex(path, "--vex", signer, homedir))
        .collect::<Result<Vec<_>>>()?;
    report.clear_with(documents);
    Ok(gate::judge(report, asked.max_severity))
}

fn judge_all(request: &PromoteRequest, commit: &str, signer: &str) -> Result<Vec<Row>> {
    let homedir = request.gpg_homedir.as_deref();
    let mut rows = Vec::new();
    for stored in records::list(&request.repo, RecordKind::Qualification, commit)? {
        let verification = stored
            .signature
            .as_ref()
            .map(|signature| gpg::verify_detached(&stored.json, signature, homedir))
            .transpose()?;
        rows.push(judge(
            &stored,
            verification.as_ref(),
            signer,
            commit,
            Policy {
                tpm_ca: request.tpm_ca.as_deref(),
                ..request.policy
            },
        ));
    }
    supersede(&mut rows);
    for id in &request.require {
        if !rows.iter().any(|row| &row.platform == id) {
            rows.push(Row {
                platform: id.clone(),
                verdict: "-".into(),
                why: Some("missing: no record for this commit".into()),
                ..Row::default()
            });
        }
    }
    Ok(rows)
}

/// The promotion's own signed record: which records allowed it.
fn write_promotion(request: &PromoteRequest, report: &PromoteReport) -> Result<PathBuf> {
    let now = super::now();
    let counted: Vec<&Row> = report.rows.iter().filter(|row| row.why.is_none()).collect();
    let document = serde_json::json!({
        "schema": SCHEMA,
        "commit": report.commit,
        "from": request.from,
        "to": request.to,
        "previous": report.previous,
        "require": request.require,
        "min-platforms": request.min_platforms,
        "allow-tofu": request.policy.allow_tofu,
        "allow-unattested": request.policy.allow_unattested,
        "tpm-ca": request.tpm_ca,
        "records": counted,
        "judged": report.rows,
        "cve": report.cve,
        "promoted": record::rfc3339(now),
        "operator-host": super::operator_host(),
        "imgbuild-version": env!("CARGO_PKG_VERSION"),
    });
    let json = serde_json::to_vec_pretty(&document)?;
    let to: String = request
        .to
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    let time: String = record::rfc3339(now)
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .collect();
    let (path, _) = record::sign_and_store(
        &request.repo,
        RecordKind::Promotion,
        &report.commit,
        &format!("{to}-{time}.json"),
        &json,
        &request.gpg_key,
        request.gpg_homedir.as_deref(),
    )?;
    Ok(path)
}

/// The table promote shows: why each record counts or not.
pub fn render(rows: &[Row]) -> String {
    use std::fmt::Write as _;
    let mut out = format!(
        "{:<20} {:<32} {:<9} {:>8} {:>9}  WHY\n",
        "PLATFORM", "NAME", "VERDICT", "WORST-US", "BUDGET-US"
    );
    let number = |n: Option<u64>| n.map_or("-".into(), |n| n.to_string());
    for row in rows {
        let _ = writeln!(
            out,
            "{:<20} {:<32} {:<9} {:>8} {:>9}  {}",
            row.platform,
            row.name,
            row.verdict,
            number(row.worst_us),
            number(row.budget_us),
            row.why.as_deref().unwrap_or("counts")
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const COMMIT: &str = "1111111111111111111111111111111111111111111111111111111111111111";
    const KEY: &str = "AAAABBBBCCCCDDDDEEEEFFFF0000111122223333";

    const POLICY: Policy = Policy {
        min_duration_s: 300,
        max_budget_us: 100,
        allow_tofu: false,
        allow_unattested: true,
        tpm_ca: None,
    };

    fn stored(commit: &str, verdict: &str, worst: u64) -> StoredRecord {
        stored_with(commit, verdict, worst, |_| {})
    }

    fn stored_with(
        commit: &str,
        verdict: &str,
        worst: u64,
        edit: impl FnOnce(&mut serde_json::Value),
    ) -> StoredRecord {
        let mut json = serde_json::json!({
            "schema": record::SCHEMA, "commit": commit, "ref": "x/rt",
            "kernel": {"release": "6.12", "uts-version": "#1", "bzimage-sha256": "00"},
            "hardware": {"id": "hw-a", "sys-vendor": "Acme", "product-name": "Rig-A", "board-name": "",
                "bios-version": "", "cpu-model": "", "microcode": "", "cores": 2, "memory-kib": 1},
            "target": {"address": "root@h:22",
                "host-key": {"algorithm": "ssh-ed25519", "fingerprint": "SHA256:x", "established": "pinned"}},
            "verdict": verdict, "reasons": [], "worst-us": worst, "budget-us": 100, "duration-s": 300,
            "started": "", "finished": "", "operator-host": "", "imgbuild-version": "", "report": null,
        });
        edit(&mut json);
        StoredRecord {
            name: "hw-a.json".into(),
            json: serde_json::to_vec(&json).unwrap(),
            signature: Some(b"sig".to_vec()),
        }
    }

    fn good() -> Verification {
        Verification {
            good: true,
            primary_fingerprint: Some(KEY.into()),
            signing_fingerprint: Some(KEY.into()),
            problem: None,
        }
    }

    fn why(stored: &StoredRecord, verification: Option<&Verification>) -> Option<String> {
        judge(stored, verification, KEY, COMMIT, POLICY).why
    }

    #[test]
    fn only_a_good_pass_for_this_commit_counts() {
        let pass = stored(COMMIT, "PASS", 40);
        assert_eq!(why(&pass, Some(&good())), None);
        let row = judge(&pass, Some(&good()), KEY, COMMIT, POLICY);
        assert!(row.valid);
        assert_eq!((row.platform.as_str(), row.name.as_str()), ("hw-a", "Acme Rig-A"));
        assert!(
            why(&stored(COMMIT, "FAIL", 400), Some(&good()))
                .unwrap()
                .starts_with("FAIL")
        );
        assert!(
            why(&stored(COMMIT, "INVALID", 4), Some(&good()))
                .unwrap()
                .starts_with("INVALID")
        );
        assert!(
            why(&stored(&"2".repeat(64), "PASS", 4), Some(&good()))
                .unwrap()
                .starts_with("another commit")
        );
        assert!(
            why(&stored(COMMIT, "PASS", 101), Some(&good()))
                .unwrap()
                .contains("over its own budget")
        );
        let bad = Verification {
            good: false,
            problem: Some("BAD signature".into()),
            ..good()
        };
        assert!(why(&pass, Some(&bad)).unwrap().starts_with("bad signature"));
        let other_key = Verification {
            primary_fingerprint: Some("F".repeat(40)),
            signing_fingerprint: Some("F".repeat(40)),
            ..good()
        };
        assert!(why(&pass, Some(&other_key)).unwrap().contains("another key"));
        assert!(why(&pass, None).unwrap().starts_with("unsigned"));
        let garbage = StoredRecord {
            json: b"{".to_vec(),
            ..pass.clone()
        };
        assert!(why(&garbage, Some(&good())).unwrap().starts_with("unreadable"));
        let short = stored_with(COMMIT, "PASS", 40, |j| j["duration-s"] = 10.into());
        assert!(why(&short, Some(&good())).unwrap().contains("--min-duration 300"));
        let lax = stored_with(COMMIT, "PASS", 400, |j| j["budget-us"] = 1000.into());
        assert!(why(&lax, Some(&good())).unwrap().contains("--max-budget 100"));
    }

    #[test]
    fn an_unattested_pass_counts_only_with_allow_unattested_and_a_forged_one_never() {
        let strict = Policy {
            allow_unattested: false,
            ..POLICY
        };
        let plain = stored(COMMIT, "PASS", 40);
        let row = judge(&plain, Some(&good()), KEY, COMMIT, strict);
        assert_eq!(row.attestation, "none");
        assert!(row.why.unwrap().contains("--allow-unattested"));
        assert_eq!(judge(&plain, Some(&good()), KEY, COMMIT, POLICY).why, None);
        // Claiming an attestation whose quote is not a TPM's counts under no policy.
        let forged = stored_with(COMMIT, "PASS", 40, |j| {
            j["provenance"] = serde_json::json!({"attestation": "tpm2-quote", "identity-source": "tpm-endorsement-key",
                "kernel-source": "x", "measurement-source": "x"});
            j["attestation"] = serde_json::json!({"method": "tpm2-quote", "result": "attested", "nonce": "00",
                "report-sha256": "00", "qualifying-data": "00", "quote": "AAAA", "signature": "AAAA", "pcrs": {},
                "event-log": "AAAA", "event-log-sha256": "00", "event-log-events": 0,
                "ek": {"public": "AAAA", "public-sha256": "00", "certificate-status": "none"},
                "ak": {"public": "AAAA", "name": "00", "binding": "credential-activation"},
                "kernel": {"path": "k", "sha256": "00"}, "initrd": {"path": "i", "sha256": "00"},
                "initrd-source": "iso"});
        });
        for policy in [strict, POLICY] {
            let row = judge(&forged, Some(&good()), KEY, COMMIT, policy);
            assert_eq!(row.attestation, "tpm2-quote");
            assert!(row.why.unwrap().contains("attestation does not verify"));
        }
    }

    #[test]
    fn a_pass_through_an_unpinned_host_key_counts_only_with_allow_tofu() {
        let tofu = stored_with(COMMIT, "PASS", 40, |j| {
            j["target"]["host-key"]["established"] = "trust-on-first-use".into()
        });
        let row = judge(&tofu, Some(&good()), KEY, COMMIT, POLICY);
        assert!(row.valid);
        assert_eq!(row.host_key_established, "trust-on-first-use");
        let why_tofu = row.why.unwrap();
        assert!(
            why_tofu.contains("trust-on-first-use") && why_tofu.contains("--allow-tofu"),
            "{why_tofu}"
        );
        // A qualification/1 record does not say: it is not taken as pinned.
        let first = stored_with(COMMIT, "PASS", 40, |j| {
            j["schema"] = "qualification/1".into();
            j["target"]["host-key"]
                .as_object_mut()
                .unwrap()
                .remove("established");
        });
        assert!(why(&first, Some(&good())).unwrap().contains("not stated"));
        let lenient = Policy {
            allow_tofu: true,
            ..POLICY
        };
        for stored in [&tofu, &first] {
            assert_eq!(judge(stored, Some(&good()), KEY, COMMIT, lenient).why, None);
        }
        // A bad verdict is said first, whatever the key.
        let tofu_fail = stored_with(COMMIT, "FAIL", 400, |j| {
            j["target"]["host-key"]["established"] = "trust-on-first-use".into()
        });
        assert!(why(&tofu_fail, Some(&good())).unwrap().starts_with("FAIL"));
        let unknown = stored_with(COMMIT, "PASS", 40, |j| j["schema"] = "qualification/9".into());
        assert!(why(&unknown, Some(&good())).unwrap().contains("unknown schema"));
    }

    #[test]
    fn a_newer_authentic_record_supersedes_a_pass() {
        let at = |verdict: &str, finished: &str, name: &str| {
            let mut stored = stored_with(COMMIT, verdict, 40, |j| j["finished"] = finished.into());
            stored.name = name.into();
            judge(&stored, Some(&good()), KEY, COMMIT, POLICY)
        };
        let mut rows = vec![
            at("PASS", "2026-12-01T10:00:00Z", "a.json"),
            at("FAIL", "2026-12-01T11:00:00Z", "b.json"),
        ];
        supersede(&mut rows);
        assert_eq!(rows[0].why.as_deref(), Some("superseded by the newer b.json"));
        let mut rows = vec![
            at("FAIL", "2026-12-01T10:00:00Z", "a.json"),
            at("PASS", "2026-12-01T11:00:00Z", "b.json"),
        ];
        supersede(&mut rows);
        assert_eq!(rows[1].why, None);
        // A forged newer record (another key) supersedes nothing.
        let mut forged = at("FAIL", "2027-01-01T00:00:00Z", "c.json");
        forged.valid = false;
        let mut rows = vec![at("PASS", "2026-12-01T11:00:00Z", "b.json"), forged];
        supersede(&mut rows);
        assert_eq!(rows[0].why, None);
    }

    fn row(platform: &str, counts: bool) -> Row {
        Row {
            platform: platform.into(),
            verdict: "PASS".into(),
            host_key: format!("SHA256:{platform}"),
            valid: true,
            why: (!counts).then(|| "FAIL".into()),
            ..Row::default()
        }
    }

    #[test]
    fn release_ref_names() {
        assert_eq!(ref_name_problem("emberrtos/x86_64/rt-stable"), None);
        for bad in ["a..b", "/rt", "rt/", "a//b", "", "x y", "rt~1"] {
            assert!(ref_name_problem(bad).is_some(), "{bad:?}");
        }
    }

    #[test]
    fn decide_counts_distinct_platforms_and_requirements() {
        let rows = [row("hw-a", true), row("hw-a", true), row("hw-b", false)];
        assert_eq!(decide(&rows, &[], 1).unwrap().len(), 1);
        assert!(decide(&rows, &[], 2).unwrap_err()[0].contains("1 platform(s) passed"));
        assert!(decide(&rows, &["hw-a".into()], 1).is_ok());
        assert!(decide(&rows, &["hw-b".into()], 1).unwrap_err()[0].contains("hw-b"));
        assert!(decide(&[], &[], 1).is_err());
        assert!(decide(&[row("hw-a", false)], &[], 1).is_err());
        // Two ids measured through one host key are one machine.
        let one_machine = [
            row("hw-a", true),
            Row {
                host_key: "SHA256:hw-a".into(),
                ..row("hw-b", true)
            },
        ];
        assert!(decide(&one_machine, &[], 2).unwrap_err()[0].contains("distinct machines"));
        assert!(decide(&[row("hw-a", true), row("hw-b", true)], &[], 2).is_ok());
    }
}
