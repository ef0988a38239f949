//! `imgbuild qualify`: candidate machines booted from the live validation
//! ISO are measured over SSH, in parallel, and each measurement leaves a
//! signed `qualification/2` record beside the commit. `imgbuild promote`
//! moves a release ref only on enough valid PASS records for that commit.
//!
//! The target is untrusted: its host key must be one the operator pinned
//! (or the record says it was taken on first use) and stays pinned for the
//! run, everything it sends is capped and cleaned, and it is measured only
//! once it says it runs the ref's own kernel. Without attestation what it
//! says (identity, kernel, figures) is its own word, and the record says so.

pub mod attest;
pub mod listing;
pub mod measure;
pub mod probe;
pub mod promote;
pub mod record;
pub mod ssh;
pub mod target;

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, anyhow, bail};
use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
use rtreport::report::Progress;
use serde::Serialize;

use self::measure::{Measurement, Run};
use self::probe::Probe;
use self::record::{HostKeyRecord, KernelIdentity, Provenance, Record, TargetRecord};
use self::ssh::{Established, Limits, Session, SshError, SshOptions};
use self::target::Target;
use crate::io::gpg;
use crate::io::records::RecordKind;
use crate::ostree;
use crate::ui::Ui;
use emberrtos_contract::error::{Refused, exit};
use emberrtos_contract::gate;
use emberrtos_contract::io::root::ImageRoot;

pub use crate::io::{clean, clean_lines};

/// The kernel a target must run: the ref's commit, read afresh.
#[derive(Clone, Debug, Default)]
pub struct Expected {
    pub commit: String,
    pub ref_name: String,
    pub release: String,
    pub uts_version: String,
    pub bzimage_sha256: String,
    /// The machine of the commit's kernel.
    pub arch: Option<rtcheck::Arch>,
}

/// The ref must be a proven PREEMPT_RT build; its kernel is read out of the
/// commit itself.
pub fn expected_kernel(repo: &Path, ref_name: &str, stage: &str) -> Result<Expected> {
    let repository = ostree::open(repo)?;
    let commit = ostree::resolve(&repository, ref_name)?
        .ok_or_else(|| anyhow!("no ref {ref_name} in {}", repo.display()))?;
    gate::gate_commit_as(&repository, ref_name, &commit, stage, "nothing was done")?;
    let kernel = gate::verify_committed_kernel(&repository, &commit)?;
    Ok(Expected {
        commit,
        ref_name: ref_name.to_string(),
        release: kernel.release,
        uts_version: kernel.uts_version,
        bzimage_sha256: kernel.image_sha256,
        arch: kernel.evidence.arch,
    })
}

pub struct QualifyRequest {
    pub repo: PathBuf,
    pub ref_name: String,
    pub targets: Vec<Target>,
    pub run: Run,
    pub ssh: SshOptions,
    pub out: Option<PathBuf>,
    pub gpg_key: String,
    pub gpg_homedir: Option<PathBuf>,
    /// `--live-iso`: the ISO the targets booted; its initramfs is what a
    /// TPM must have measured. Without it no target is attested.
    pub live_iso: Option<PathBuf>,
    /// `--tpm-ca`: the certificates an EK certificate must chain to.
    pub tpm_ca: Option<PathBuf>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Measured,
    Refused,
    Error,
}

/// One target's row.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct TargetOutcome {
    pub target: String,
    pub status: Status,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub host_key: Option<String>,
    /// `pinned` or `trust-on-first-use`, once a key was trusted.
    pub host_key_established: Option<Established>,
    pub hardware_id: Option<String>,
    pub platform: Option<String>,
    pub verdict: Option<String>,
    pub reasons: Vec<String>,
    pub worst_us: Option<u64>,
    pub budget_us: u64,
    pub record: Option<PathBuf>,
    pub files: Option<PathBuf>,
}

#[derive(Clone, Debug, Serialize)]
pub struct QualifyReport {
    #[serde(rename = "ref")]
    pub ref_name: String,
    pub commit: String,
    pub targets: Vec<TargetOutcome>,
}

impl QualifyReport {
    /// 0 all PASS; 1 a target errored; 3 one refused or FAILed; 4 one INVALID.
    pub fn exit_code(&self) -> u8 {
        let any = |f: &dyn Fn(&TargetOutcome) -> bool| self.targets.iter().any(f);
        let verdict = |o: &TargetOutcome, v: &str| o.verdict.as_deref() == Some(v);
        if any(&|o| o.status == Status::Error) {
            exit::ERROR
        } else if any(&|o| o.status == Status::Refused || verdict(o, "FAIL")) {
            exit::REFUSED
        } else if any(&|o| verdict(o, "INVALID")) {
            4
        } else {
            exit::OK
        }
    }
}

/// Qualifies every target at once; one failing never stops the others.
pub fn qualify(request: &QualifyRequest, ui: &Ui) -> Result<QualifyReport> {
    gpg::primary_fingerprint(&request.gpg_key, request.gpg_homedir.as_deref())
        .context("--gpg-key signs the records")?;
    let expected = expected_kernel(&request.repo, &request.ref_name, "qualify")?;
    let boot = match &request.live_iso {
        Some(iso) => Some(attest::live_iso_boot_files(iso, &expected.bzimage_sha256)?),
        None => None,
    };
    if let Some(ca) = &request.tpm_ca {
        std::fs::metadata(ca).with_context(|| format!("--tpm-ca {}", ca.display()))?;
    }
    open_destinations(request)?;
    ui.step(
        "qualify",
        format!(
            "{} target(s), {} s each, against {} ({}, {})",
            request.targets.len(),
            request.run.duration_s,
            request.ref_name,
            short(&expected.commit),
            expected.release
        ),
    );
    let multi = ui.multi();
    let targets = std::thread::scope(|scope| {
        let running: Vec<_> = request
            .targets
            .iter()
            .map(|target| {
                let line = TargetLine::new(target, request.run.duration_s, &multi, ui);
                let (expected, boot) = (&expected, boot.as_ref());
                scope.spawn(move || qualify_target(target, request, (expected, boot), &line))
            })
            .collect();
        running
            .into_iter()
            .map(|handle| handle.join().expect("a target's thread panicked"))
            .collect()
    });
    Ok(QualifyReport {
        ref_name: request.ref_name.clone(),
        commit: expected.commit,
        targets,
    })
}

/// Opens where the records and the operator's copies go before any target
/// is measured: a measurement is never taken only to be thrown away.
fn open_destinations(request: &QualifyRequest) -> Result<()> {
    ImageRoot::open(&request.repo)
        .with_context(|| format!("--repo {}: the records go there", request.repo.display()))?;
    if let Some(out) = &request.out {
        // Made when the first copies land; what exists of it must open.
        let existing = out.ancestors().find(|dir| dir.exists()).unwrap_or(Path::new("/"));
        ImageRoot::open(existing).with_context(|| format!("--out {}", out.display()))?;
    }
    Ok(())
}

/// The table of a qualify run: one row per target.
pub fn render(report: &QualifyReport) -> String {
    use std::fmt::Write as _;
    let mut out = format!(
        "{:<28} {:<20} {:<24} {:<9} {:>8} {:>9}  RECORD\n",
        "TARGET", "HARDWARE-ID", "PLATFORM", "VERDICT", "WORST-US", "BUDGET-US"
    );
    for o in &report.targets {
        let status = match o.status {
            Status::Measured => o.verdict.clone().unwrap_or_default(),
            Status::Refused => "REFUSED".into(),
            Status::Error => "ERROR".into(),
        };
        let worst = o.worst_us.map_or("-".into(), |us| us.to_string());
        let last = match (&o.record, &o.error) {
            (Some(path), _) => path.display().to_string(),
            (None, Some(error)) => error.lines().next().unwrap_or_default().to_string(),
            (None, None) => String::new(),
        };
        let _ = writeln!(
            out,
            "{:<28} {:<20} {:<24} {:<9} {:>8} {:>9}  {last}",
            o.target,
            o.hardware_id.as_deref().unwrap_or("-"),
            o.platform.as_deref().unwrap_or("-"),
            status,
            worst,
            o.budget_us
        );
    }
    out
}

/// `6a455e66…7d2b`.
pub fn short(commit: &str) -> String {
    match commit.len() {
        n if n > 12 => format!("{}…{}", &commit[..8], &commit[n - 4..]),
        _ => commit.to_string(),
    }
}

fn qualify_target(
    target: &Target,
    request: &QualifyRequest,
    (expected, boot): (&Expected, Option<&attest::BootFiles>),
    line: &TargetLine,
) -> TargetOutcome {
    let mut outcome = TargetOutcome {
        target: target.to_string(),
        status: Status::Measured,
        error: None,
        host_key: None,
        host_key_established: None,
        hardware_id: None,
        platform: None,
        verdict: None,
        reasons: Vec::new(),
        worst_us: None,
        budget_us: request.run.budget_us,
        record: None,
        files: None,
    };
    if let Err(error) = attempt(target, request, (expected, boot), line, &mut outcome) {
        let refused = error.chain().any(is_refusal);
        outcome.status = if refused { Status::Refused } else { Status::Error };
        // The chain may quote the target (a serde error quotes its JSON).
        let text = clean_lines(&format!("{error:#}"));
        line.say(&format!(
            "{}: {}",
            if refused { "REFUSED" } else { "ERROR" },
            text
        ));
        outcome.error = Some(text);
    }
    line.finish();
    outcome
}

/// A "no" about the target (exit 3), not a failure to reach or run it: a
/// [`Refused`], or a host key the operator did not pin.
fn is_refusal(error: &(dyn std::error::Error + 'static)) -> bool {
    error.is::<Refused>() || matches!(error.downcast_ref(), Some(SshError::NotPinned { .. }))
}

fn attempt(
    target: &Target,
    request: &QualifyRequest,
    (expected, boot): (&Expected, Option<&attest::BootFiles>),
    line: &TargetLine,
    outcome: &mut TargetOutcome,
) -> Result<()> {
    let session = Session::open(target, &request.ssh)?;
    let key = &session.host_key;
    let how = match session.established {
        Established::Pinned => "pinned by --known-hosts",
        Established::TrustOnFirstUse => "trusted on first use, not verified",
    };
    line.say(&format!("host key {} {} ({how})", key.algorithm, key.fingerprint));
    outcome.host_key = Some(key.fingerprint.clone());
    outcome.host_key_established = Some(session.established);
    let output = session.run(probe::PROBE_COMMAND, Limits::PROBE)?;
    let mut probe = probe::parse(&String::from_utf8_lossy(&output.stdout));
    outcome.hardware_id = Some(probe.hardware.id.clone());
    outcome.platform = Some(probe.hardware.platform());
    require_expected_kernel(&session, &probe, expected)?;
    let attesting = start_attestation(&session, &probe, boot, line)?;
    if let Some(started) = &attesting {
        probe.hardware.id = attest::hardware_id(&started.keys);
        outcome.hardware_id = Some(probe.hardware.id.clone());
    }
    line.say(&format!(
        "{} ({}): measuring",
        probe.hardware.id,
        probe.hardware.platform()
    ));
    let started = now();
    let measurement = measure::measure(&session, request.run, expected, &mut |p| line.progress(p))?;
    let finished = now();
    let report: serde_json::Value = serde_json::from_slice(&measurement.report_json)?;
    let attestation = attesting
        .as_ref()
        .map(|started| finish_attestation(&session, started, &report, request, line))
        .transpose()?;
    let record = build_record(
        (&session, &probe, expected),
        request.run,
        &measurement,
        (report, attestation),
        (started, finished),
    );
    let json = serde_json::to_vec_pretty(&record)?;
    let name = record::file_name(&record, &target.file_name());
    let (path, signature) = record::sign_and_store(
        &request.repo,
        RecordKind::Qualification,
        &expected.commit,
        &name,
        &json,
        &request.gpg_key,
        request.gpg_homedir.as_deref(),
    )?;
    if let Some(out) = &request.out {
        outcome.files = Some(save_files(out, target, &measurement, &json, &signature)?);
    }
    line.say(&format!("{}, worst case {} us", record.verdict, record.worst_us));
    outcome.verdict = Some(record.verdict);
    outcome.reasons = record.reasons;
    outcome.worst_us = Some(record.worst_us);
    outcome.record = Some(path);
    Ok(())
}

/// The target must have `jitter`, run the commit's kernel and pass
/// `jitter --check-kernel`; a wrong kernel is refused before any measuring.
fn require_expected_kernel(session: &Session, probe: &Probe, expected: &Expected) -> Result<()> {
    if probe.jitter.is_empty() {
        bail!("`jitter` is not on the target's PATH: boot the live validation ISO, which has it");
    }
    let mismatch = probe::kernel_mismatch(probe, expected.arch, &expected.release, &expected.uts_version);
    if !mismatch.is_empty() {
        return Err(refused(
            format!(
                "{} does not run the kernel of {}: nothing was measured",
                session.target, expected.ref_name
            ),
            mismatch,
        ));
    }
    let check = session.run("jitter --check-kernel", Limits::PROBE)?;
    match check.code {
        0 => Ok(()),
        3 => Err(refused(
            format!(
                "`jitter --check-kernel` on {} says the kernel is not PREEMPT_RT: nothing was measured",
                session.target
            ),
            String::from_utf8_lossy(&check.stdout)
                .lines()
                .map(clean)
                .filter(|l| !l.is_empty())
                .collect(),
        )),
        code => bail!(
            "`jitter --check-kernel` failed on the target (exit {code}): {}",
            clean(&check.stderr)
        ),
    }
}

fn refused(summary: String, reasons: Vec<String>) -> anyhow::Error {
    Refused {
        stage: "qualify".into(),
        summary,
        reasons,
    }
    .into()
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn operator_host() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname").map_or_else(|_| "unknown".into(), |h| clean(&h))
}

/// A TPM is asked only with `--live-iso` (its initramfs is what the TPM
/// must have measured).
fn start_attestation(
    session: &Session,
    probe: &Probe,
    boot: Option<&attest::BootFiles>,
    line: &TargetLine,
) -> Result<Option<attest::Started>> {
    match (probe.tpm, boot) {
        (true, Some(boot)) => Ok(Some(attest::start(session, boot)?)),
        (true, None) => {
            line.say("has a TPM, but without --live-iso it is not asked: the record says attestation none");
            Ok(None)
        }
        (false, _) => Ok(None),
    }
}

fn finish_attestation(
    session: &Session,
    started: &attest::Started,
    report: &serde_json::Value,
    request: &QualifyRequest,
    line: &TargetLine,
) -> Result<attest::record::Attestation> {
    let attestation = attest::finish(session, started, report, request.tpm_ca.as_deref())?;
    line.say(&format!(
        "attested by its TPM (EK {}, certificate {})",
        &attestation.ek.public_sha256[..16],
        attestation.ek.certificate_status
    ));
    Ok(attestation)
}

fn build_record(
    (session, probe, expected): (&Session, &Probe, &Expected),
    run: Run,
    measurement: &Measurement,
    (report, attestation): (serde_json::Value, Option<attest::record::Attestation>),
    (started, finished): (u64, u64),
) -> Record {
    let assessment = &measurement.report.assessment;
    let provenance = match attestation {
        Some(_) => Provenance::attested(),
        None => Provenance::reported_by_target(),
    };
    Record {
        schema: record::SCHEMA.into(),
        commit: expected.commit.clone(),
        ref_name: expected.ref_name.clone(),
        kernel: KernelIdentity {
            release: expected.release.clone(),
            uts_version: expected.uts_version.clone(),
            bzimage_sha256: expected.bzimage_sha256.clone(),
        },
        hardware: probe.hardware.clone(),
        target: TargetRecord {
            address: session.target.to_string(),
            host_key: HostKeyRecord {
                algorithm: session.host_key.algorithm.clone(),
                fingerprint: session.host_key.fingerprint.clone(),
                established: Some(session.established),
            },
        },
        provenance: Some(provenance),
        verdict: assessment.verdict.to_string(),
        reasons: assessment
            .reasons
            .iter()
            .map(|r| clean(&format!("{}: {}", r.code.as_str(), r.detail)))
            .collect(),
        worst_us: assessment.worst_us,
        budget_us: run.budget_us,
        duration_s: run.duration_s,
        started: record::rfc3339(started),
        finished: record::rfc3339(finished),
        operator_host: operator_host(),
        imgbuild_version: env!("CARGO_PKG_VERSION").into(),
        report,
        attestation,
    }
}

/// The operator's copies in `OUT/HOST-PORT/`, the record last.
fn save_files(
    out: &Path,
    target: &Target,
    m: &Measurement,
    json: &[u8],
    signature: &[u8],
) -> Result<PathBuf> {
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let root = ImageRoot::open(out)?;
    let dir = PathBuf::from(target.file_name());
    root.create_dir_all(&dir, 0o755)?;
    for (name, bytes) in [
        ("report.json", &m.report_json[..]),
        ("plot.svg", &m.plot_svg),
        ("cyclictest.txt", &m.cyclictest),
        ("record.json.sig", signature),
        ("record.json", json),
    ] {
        root.write_durable(&dir.join(name), bytes, 0o644)?;
    }
    Ok(out.join(dir))
}

/// One target's progress: a bar on a terminal, else a plain line every 10 s.
struct TargetLine {
    label: String,
    bar: ProgressBar,
    animated: bool,
    last_printed: std::sync::atomic::AtomicU64,
}

impl TargetLine {
    fn new(target: &Target, total_s: u64, multi: &MultiProgress, ui: &Ui) -> TargetLine {
        let bar = multi.add(ProgressBar::new(total_s));
        bar.set_style(
            ProgressStyle::with_template("{prefix} [{bar:24}] {pos}/{len} s {msg}")
                .expect("valid template")
                .progress_chars("=> "),
        );
        bar.set_prefix(target.to_string());
        TargetLine {
            label: target.to_string(),
            bar,
            animated: ui.is_animated(),
            last_printed: std::sync::atomic::AtomicU64::new(0),
        }
    }

    fn say(&self, text: &str) {
        let line = format!("    {}: {text}", self.label);
        if self.animated {
            self.bar.println(line)
        } else {
            eprintln!("{line}")
        }
    }

    fn progress(&self, progress: Progress) {
        use std::sync::atomic::Ordering;
        self.bar.set_position(progress.elapsed_s);
        let worst = progress
            .worst_us
            .map(|us| format!("worst case {us} us"))
            .unwrap_or_default();
        self.bar.set_message(worst.clone());
        let last = self.last_printed.load(Ordering::Relaxed);
        let due = progress.elapsed_s >= last + 10 || progress.elapsed_s >= progress.total_s;
        if !self.animated && due && progress.elapsed_s > last {
            self.last_printed.store(progress.elapsed_s, Ordering::Relaxed);
            self.say(&format!("{}/{} s, {worst}", progress.elapsed_s, progress.total_s));
        }
    }

    fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clean_drops_what_could_fool_a_terminal() {
        assert_eq!(clean("  Acme\u{1b}]52;c;eA==\u{7} Rig\n"), "Acme]52;c;eA== Rig");
        assert_eq!(clean("PASS\u{202e}LIAF"), "PASSLIAF");
        assert_eq!(clean(&"x".repeat(300)).len(), 256);
        assert_eq!(clean_lines("a\u{1b}[2J\nb"), "a[2J\nb");
    }

    #[test]
    fn exit_codes_rank_error_over_refusal_over_invalid() {
        let outcome = |status, verdict: Option<&str>| TargetOutcome {
            target: String::new(),
            status,
            error: None,
            host_key: None,
            host_key_established: None,
            hardware_id: None,
            platform: None,
            verdict: verdict.map(str::to_string),
            reasons: Vec::new(),
            worst_us: None,
            budget_us: 100,
            record: None,
            files: None,
        };
        let report = |targets| QualifyReport {
            ref_name: String::new(),
            commit: String::new(),
            targets,
        };
        let pass = || outcome(Status::Measured, Some("PASS"));
        let invalid = || outcome(Status::Measured, Some("INVALID"));
        let fail = || outcome(Status::Measured, Some("FAIL"));
        assert_eq!(report(vec![pass(), pass()]).exit_code(), 0);
        assert_eq!(report(vec![pass(), invalid()]).exit_code(), 4);
        assert_eq!(report(vec![invalid(), fail()]).exit_code(), 3);
        assert_eq!(
            report(vec![invalid(), outcome(Status::Refused, None)]).exit_code(),
            3
        );
        assert_eq!(report(vec![fail(), outcome(Status::Error, None)]).exit_code(), 1);
    }
}
