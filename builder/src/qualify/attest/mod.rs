//! Attested qualification: the target's TPM vouches for what ran.
//!
//! 1. `attest keys` on the target makes its endorsement key (EK) and an
//!    attestation key (AK); the AK must be a restricted P-256 signing key
//!    made inside the TPM.
//! 2. Here, `tpm2_makecredential` seals a fresh secret to the EK and the
//!    AK's name: only the TPM holding both can open it (credential
//!    activation), so an AK from elsewhere cannot stand in.
//! 3. After the measurement, the target activates the credential and quotes
//!    PCRs 0-9 over `sha256(nonce ‖ sha256(report))`, and sends the
//!    firmware's event log.
//! 4. [`verify`]: the secret, the quote's signer, signature and qualifying
//!    data, the log's replay to the quoted PCRs, and the kernel and
//!    initramfs GRUB measured (PCR 9) against the ref's.
//!
//! The hardware id is then the EK's, whatever DMI strings the target shows.

pub mod eventlog;
pub mod record;
pub mod tpm;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use openssl::bn::BigNum;
use openssl::ec::{EcGroup, EcKey};
use openssl::ecdsa::EcdsaSig;
use openssl::nid::Nid;
use openssl::x509::X509;
use openssl::x509::store::X509StoreBuilder;
use sha2::{Digest, Sha256};
use thiserror::Error;

use self::eventlog::{EV_IPL, Event};
use self::record::{Attestation, BootFile, Endorsement, Signer};
use self::tpm::{PublicKey, TpmError};
use super::ssh::{Limits, Session};
use crate::io::hashing::sha256_file;
use crate::tool;
use emberrtos_contract::error::Refused;

/// The target's half, in the live ISO.
pub const SCRIPT: &str = "/usr/libexec/emberrtos/attest";
/// What `attest quote` asks for: the firmware (0-7) and GRUB's (8, 9) PCRs
/// of the sha256 bank.
pub const QUOTED_PCRS: [u32; 10] = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9];
/// GRUB measures every file it loads into PCR 9, every command into PCR 8.
const GRUB_FILES_PCR: u32 = 9;
const GRUB_COMMANDS_PCR: u32 = 8;
/// The endorsement hierarchy's handle, where the EK's qualified name starts.
const ENDORSEMENT_HIERARCHY: u32 = 0x4000_000b;

/// Why a target's TPM evidence does not attest the run; each is a refusal.
#[derive(Debug, Error)]
pub enum AttestError {
    #[error("the target's `attest` output: {0}")]
    Output(String),
    #[error(transparent)]
    Tpm(#[from] TpmError),
    #[error(transparent)]
    Log(#[from] eventlog::LogError),
    #[error("the attestation key is not a TPM-made restricted signing key (attributes {0:#010x})")]
    NotAnAttestationKey(u32),
    #[error("the attestation key's name is not the name of its public area")]
    NameMismatch,
    #[error("the TPM did not open the credential sealed to its EK and AK: the AK is not bound to this EK")]
    CredentialNotActivated,
    #[error("the quote is not signed by the AK under the EK (its signer is another key)")]
    WrongSigner,
    #[error("the quote's signature does not verify with the AK")]
    BadSignature,
    #[error(
        "the quote's qualifying data is {found}, not sha256(nonce ‖ report sha256) = {expected}: a replayed quote, or a report changed after it"
    )]
    NotThisRun { found: String, expected: String },
    #[error("the quote covers PCRs {0:?}, not sha256:0-9")]
    WrongPcrs(Vec<(u16, Vec<u32>)>),
    #[error("the event log does not replay to the quoted PCRs: it is not the log of this boot")]
    LogDoesNotReplay,
    #[error("the {what} measured at boot is not the ref's ({expected}); GRUB measured: {measured}")]
    NotTheRef {
        what: &'static str,
        expected: String,
        measured: String,
    },
    #[error("GRUB loaded {path} (sha256 {sha256}), which is not a file of the live ISO")]
    ForeignFile { path: String, sha256: String },
    #[error("a GRUB event's text in the log is not what was measured")]
    ForgedEventText,
    #[error("GRUB measured {0} kernel command lines, not one")]
    KernelCmdlines(usize),
    #[error("the kernel booted with a command line that is not one of the live ISO's menu: {0}")]
    WrongCmdline(String),
    #[error("the EK is not a TPM's default RSA 2048 endorsement key (the TCG's template)")]
    NotTheEndorsementTemplate,
    #[error("the TPM holds no EK certificate, and --tpm-ca asks for one")]
    NoCertificate,
    #[error("the record's {0} is not what its evidence gives")]
    FieldMismatch(&'static str),
    #[error("the EK certificate does not hold the EK's public key")]
    CertificateMismatch,
    #[error("the EK certificate does not chain to --tpm-ca: {0}")]
    UntrustedCertificate(String),
}

/// What `attest keys` printed.
#[derive(Clone, Debug)]
pub struct Keys {
    /// `TPM2B_PUBLIC` bytes as the TPM gave them.
    pub ek_public: Vec<u8>,
    pub ek: tpm::Public,
    pub ak_public: Vec<u8>,
    pub ak: tpm::Public,
    /// DER, from the TPM's NV index, when it has one.
    pub ek_certificate: Option<Vec<u8>>,
}

/// `name=base64` lines of untrusted output; each name once.
fn fields(output: &str) -> Result<BTreeMap<String, Vec<u8>>, AttestError> {
    let mut fields = BTreeMap::new();
    for line in output.lines().filter(|l| !l.trim().is_empty()) {
        let (name, value) = line
            .split_once('=')
            .ok_or_else(|| AttestError::Output("a line without `=`".into()))?;
        let name = crate::io::clean(name);
        let bytes = BASE64
            .decode(value.trim())
            .map_err(|_| AttestError::Output(format!("{name} is not base64")))?;
        if fields.insert(name.clone(), bytes).is_some() {
            return Err(AttestError::Output(format!("{name} given twice")));
        }
    }
    Ok(fields)
}

fn field(fields: &mut BTreeMap<String, Vec<u8>>, name: &str) -> Result<Vec<u8>, AttestError> {
    fields
        .remove(name)
        .ok_or_else(|| AttestError::Output(format!("no {name}")))
}

/// Parses `attest keys`: the AK must be an attestation key, its name its own.
pub fn parse_keys(output: &str) -> Result<Keys, AttestError> {
    let mut fields = fields(output)?;
    let ek_public = field(&mut fields, "ek-public")?;
    let ak_public = field(&mut fields, "ak-public")?;
    let ak_name = field(&mut fields, "ak-name")?;
    let ek = tpm::parse_public(&ek_public)?;
    let ak = tpm::parse_public(&ak_public)?;
    check_keys(&ek, &ak)?;
    if ak.name() != ak_name {
        return Err(AttestError::NameMismatch);
    }
    Ok(Keys {
        ek_certificate: fields.remove("ek-certificate"),
        ek_public,
        ek,
        ak_public,
        ak,
    })
}

/// The EK must be the TCG's default template; the AK a restricted P-256
/// signing key made in the TPM.
fn check_keys(ek: &tpm::Public, ak: &tpm::Public) -> Result<(), AttestError> {
    if !tpm::is_default_rsa_ek(&ek.area) {
        return Err(AttestError::NotTheEndorsementTemplate);
    }
    let is_ak =
        ak.attributes & tpm::ATTESTATION_KEY == tpm::ATTESTATION_KEY && ak.attributes & tpm::DECRYPT == 0;
    if !is_ak || !matches!(ak.key, PublicKey::EccP256 { .. }) {
        return Err(AttestError::NotAnAttestationKey(ak.attributes));
    }
    Ok(())
}

/// The hardware id of a TPM: its EK's.
pub fn hardware_id(keys: &Keys) -> String {
    format!("hw-{}", &hex::encode(Sha256::digest(&keys.ek.area))[..16])
}

/// A fresh nonce, and a secret sealed to the target's EK and AK name.
pub struct Challenge {
    pub nonce: [u8; 32],
    secret: Vec<u8>,
    credential: Vec<u8>,
}

/// `tpm2_makecredential` without a TPM (`-T none`): software, on this side.
pub fn challenge(keys: &Keys) -> Result<Challenge> {
    let mut nonce = [0; 32];
    let mut secret = vec![0; 32];
    openssl::rand::rand_bytes(&mut nonce)?;
    openssl::rand::rand_bytes(&mut secret)?;
    let dir = tempfile::tempdir()?;
    let (ek, sealed, out) = (
        dir.path().join("ek.pub"),
        dir.path().join("secret"),
        dir.path().join("cred"),
    );
    std::fs::write(&ek, &keys.ek_public)?;
    std::fs::write(&sealed, &secret)?;
    tool::run(
        tool::command("tpm2_makecredential")?
            .args(["-T", "none", "-u"])
            .arg(&ek)
            .arg("-s")
            .arg(&sealed)
            .args(["-n", &hex::encode(keys.ak.name()), "-o"])
            .arg(&out),
    )
    .context("sealing the credential to the target's EK with tpm2_makecredential")?;
    Ok(Challenge {
        nonce,
        secret,
        credential: std::fs::read(&out)?,
    })
}

/// What the quote must carry: the nonce and the report, bound.
pub fn qualifying_data(nonce: &[u8], report_sha256: &[u8]) -> [u8; 32] {
    Sha256::new()
        .chain_update(nonce)
        .chain_update(report_sha256)
        .finalize()
        .into()
}

/// The report's hash as the quote binds it: of its canonical JSON, so a
/// record's copy of the report can be checked again later.
pub fn report_sha256(report: &serde_json::Value) -> [u8; 32] {
    Sha256::digest(serde_json::to_vec(report).expect("a JSON value serializes")).into()
}

/// The target's command for the quote: hex and base64 only.
pub fn quote_command(challenge: &Challenge, qualifying: &[u8]) -> String {
    format!(
        "{SCRIPT} quote {} {}",
        hex::encode(qualifying),
        BASE64.encode(&challenge.credential)
    )
}

/// What `attest quote` printed.
pub struct Evidence {
    pub secret: Vec<u8>,
    pub quote: Vec<u8>,
    pub signature: Vec<u8>,
    pub event_log: Vec<u8>,
}

pub fn parse_evidence(output: &str) -> Result<Evidence, AttestError> {
    let mut fields = fields(output)?;
    Ok(Evidence {
        secret: field(&mut fields, "secret")?,
        quote: field(&mut fields, "quote")?,
        signature: field(&mut fields, "signature")?,
        event_log: field(&mut fields, "event-log")?,
    })
}

/// What the target must have booted: the ISO's kernel (the ref's) and
/// initramfs, the only files GRUB may load (the ISO's own, and the menu
/// built into its signed GRUB), and the kernel command lines its menu gives.
#[derive(Clone, Debug, Default)]
pub struct BootFiles {
    pub kernel_sha256: String,
    pub initrd_sha256: String,
    /// Where they were read (the live ISO).
    pub source: PathBuf,
    /// The sha256 of every file GRUB may load.
    pub allowed: BTreeSet<String>,
    /// `/boot/vmlinuz ARGS` of each menu entry, as GRUB measures it.
    pub cmdlines: Vec<String>,
}

/// Reads the live ISO whole: its kernel must be the commit's.
pub fn live_iso_boot_files(iso: &Path, commit_kernel_sha256: &str) -> Result<BootFiles> {
    let dir = tempfile::tempdir()?;
    tool::run(
        tool::command("xorriso")?
            .args(["-osirrox", "on", "-indev"])
            .arg(iso)
            .args(["-extract", "/"])
            .arg(dir.path()),
    )
    .with_context(|| format!("reading --live-iso {}", iso.display()))?;
    let hash = |rel: &str| {
        sha256_file(&dir.path().join(rel), None)
            .with_context(|| format!("--live-iso {}: no /{rel}", iso.display()))
    };
    let (kernel_sha256, initrd_sha256) = (hash("boot/vmlinuz")?, hash("boot/initrd.img")?);
    anyhow::ensure!(
        kernel_sha256 == commit_kernel_sha256,
        "--live-iso {}: its kernel (sha256 {kernel_sha256}) is not the ref's ({commit_kernel_sha256})",
        iso.display()
    );
    let mut allowed = BTreeSet::new();
    for entry in walkdir::WalkDir::new(dir.path()).follow_links(false) {
        let entry = entry?;
        if entry.file_type().is_file() {
            allowed.insert(sha256_file(entry.path(), None)?);
        }
    }
    allowed.extend(
        crate::stages::iso::signed_grub_menus(iso)?
            .iter()
            .map(|menu| hex::encode(Sha256::digest(menu))),
    );
    let grub_cfg = std::fs::read_to_string(dir.path().join("boot/grub/grub.cfg")).unwrap_or_default();
    Ok(BootFiles {
        kernel_sha256,
        initrd_sha256,
        source: std::path::absolute(iso)?,
        allowed,
        cmdlines: menu_cmdlines(&grub_cfg),
    })
}

/// `/boot/vmlinuz ARGS` of each `linux`/`linuxefi` line of the ISO's menu,
/// as GRUB measures it: quotes removed, the harness's `$imgbuild_extra`
/// empty (pure).
pub fn menu_cmdlines(grub_cfg: &str) -> Vec<String> {
    grub_cfg
        .lines()
        .map(str::trim)
        .filter_map(|line| {
            line.strip_prefix("linuxefi ")
                .or_else(|| line.strip_prefix("linux "))
        })
        .map(|args| {
            let words: Vec<String> = args
                .split_whitespace()
                .filter(|word| *word != "$imgbuild_extra")
                .map(|word| word.replace('\'', ""))
                .collect();
            words.join(" ")
        })
        .collect()
}

/// A target's keys and the challenge made for them, before the measurement.
pub struct Started {
    pub keys: Keys,
    pub challenge: Challenge,
    /// What the target must have booted.
    pub boot: BootFiles,
}

/// Asks the target for its EK and a new AK, and seals a secret to them.
pub fn start(session: &Session, boot: &BootFiles) -> Result<Started> {
    let output = session.run(&format!("{SCRIPT} keys"), Limits::PROBE)?;
    if output.code != 0 {
        anyhow::bail!(
            "`{SCRIPT} keys` failed on the target (exit {}): {}",
            output.code,
            crate::io::clean(&output.stderr)
        );
    }
    let keys = parse_keys(&String::from_utf8_lossy(&output.stdout)).map_err(refusal)?;
    let challenge = challenge(&keys)?;
    Ok(Started {
        keys,
        challenge,
        boot: boot.clone(),
    })
}

/// After the measurement: the quote over the nonce and `report`, verified.
pub fn finish(
    session: &Session,
    started: &Started,
    report: &serde_json::Value,
    tpm_ca: Option<&Path>,
) -> Result<Attestation> {
    let report_sha256 = report_sha256(report);
    let qualifying = qualifying_data(&started.challenge.nonce, &report_sha256);
    let limits = Limits {
        stdout_bytes: EVIDENCE_BYTES,
        ..Limits::PROBE
    };
    let output = session.run(&quote_command(&started.challenge, &qualifying), limits)?;
    if output.code != 0 {
        return Err(refusal(AttestError::Output(format!(
            "`attest quote` failed (exit {}): {}",
            output.code,
            crate::io::clean(&output.stderr)
        ))));
    }
    let evidence = parse_evidence(&String::from_utf8_lossy(&output.stdout)).map_err(refusal)?;
    let Started {
        keys,
        challenge,
        boot,
    } = started;
    verify(keys, challenge, &evidence, &report_sha256, boot, tpm_ca).map_err(refusal)
}

/// The evidence's cap: the event log's, in base64, and the rest.
const EVIDENCE_BYTES: u64 = (eventlog::MAX_BYTES as u64) * 4 / 3 + (64 << 10);

/// A target whose evidence does not hold is refused, not an error.
fn refusal(error: AttestError) -> anyhow::Error {
    Refused {
        stage: "qualify".into(),
        summary: "the target's TPM does not attest this run: nothing was recorded".into(),
        reasons: vec![error.to_string()],
    }
    .into()
}

/// Checks the evidence against this run, and returns the record's part.
pub fn verify(
    keys: &Keys,
    challenge: &Challenge,
    evidence: &Evidence,
    report_sha256: &[u8],
    boot: &BootFiles,
    tpm_ca: Option<&Path>,
) -> Result<Attestation, AttestError> {
    if evidence.secret != challenge.secret {
        return Err(AttestError::CredentialNotActivated);
    }
    let qualifying = qualifying_data(&challenge.nonce, report_sha256);
    let boot_log = check_quote(
        keys,
        &evidence.quote,
        &evidence.signature,
        &qualifying,
        &evidence.event_log,
    )?;
    let (kernel, initrd, kernel_cmdline) = check_boot(&boot_log, boot)?;
    Ok(Attestation {
        method: record::METHOD.into(),
        result: record::ATTESTED.into(),
        nonce: hex::encode(challenge.nonce),
        report_sha256: hex::encode(report_sha256),
        qualifying_data: hex::encode(qualifying),
        quote: BASE64.encode(&evidence.quote),
        signature: BASE64.encode(&evidence.signature),
        pcrs: boot_log.pcrs_hex(),
        event_log: BASE64.encode(&evidence.event_log),
        event_log_sha256: hex::encode(Sha256::digest(&evidence.event_log)),
        event_log_events: boot_log.events.len(),
        ek: endorsement(keys, tpm_ca)?,
        ak: Signer {
            public: BASE64.encode(&keys.ak_public),
            name: hex::encode(keys.ak.name()),
            binding: record::BINDING.into(),
        },
        kernel,
        initrd,
        initrd_source: boot.source.display().to_string(),
        kernel_cmdline: Some(kernel_cmdline),
    })
}

/// What a record says ran, to check its attestation against.
pub struct Claimed<'a> {
    pub hardware_id: &'a str,
    /// The commit's kernel, as the record names it.
    pub kernel_sha256: &'a str,
    pub report: &'a serde_json::Value,
}

/// Checks a record's attestation again, from the record alone: its keys
/// (the EK template, the AK's attributes), every field derived from the
/// evidence, the quote's signature over `sha256(nonce ‖ sha256(its
/// report))`, the log's replay and its texts, the measured kernel against
/// the record's kernel, the initramfs and command line it states, and its
/// hardware id against the EK. With `tpm_ca`, the EK certificate must chain
/// to it: `Ok(true)`; without, `Ok(false)` (the EK is not endorsed here).
/// Not the credential's activation, which only the run could see.
pub fn recheck(
    attestation: &Attestation,
    claimed: &Claimed,
    tpm_ca: Option<&Path>,
) -> Result<bool, AttestError> {
    let decode =
        |what: &'static str, text: &str| BASE64.decode(text).map_err(|_| AttestError::FieldMismatch(what));
    let ek_public = decode("ek.public", &attestation.ek.public)?;
    let ak_public = decode("ak.public", &attestation.ak.public)?;
    let keys = Keys {
        ek: tpm::parse_public(&ek_public)?,
        ak: tpm::parse_public(&ak_public)?,
        ek_public,
        ak_public,
        ek_certificate: attestation
            .ek
            .certificate
            .as_deref()
            .map(|c| decode("ek.certificate", c))
            .transpose()?,
    };
    check_keys(&keys.ek, &keys.ak)?;
    let nonce = hex::decode(&attestation.nonce).map_err(|_| AttestError::FieldMismatch("nonce"))?;
    let report = report_sha256(claimed.report);
    let qualifying = qualifying_data(&nonce, &report);
    let event_log = decode("event-log", &attestation.event_log)?;
    for (field, stated, derived) in [
        ("method", attestation.method.clone(), record::METHOD.to_string()),
        ("result", attestation.result.clone(), record::ATTESTED.to_string()),
        ("hardware id", claimed.hardware_id.to_string(), hardware_id(&keys)),
        (
            "ek.public-sha256",
            attestation.ek.public_sha256.clone(),
            hex::encode(Sha256::digest(&keys.ek.area)),
        ),
        (
            "ak.name",
            attestation.ak.name.clone(),
            hex::encode(keys.ak.name()),
        ),
        (
            "report-sha256",
            attestation.report_sha256.clone(),
            hex::encode(report),
        ),
        (
            "qualifying-data",
            attestation.qualifying_data.clone(),
            hex::encode(qualifying),
        ),
        (
            "event-log-sha256",
            attestation.event_log_sha256.clone(),
            hex::encode(Sha256::digest(&event_log)),
        ),
    ] {
        if stated != derived {
            return Err(AttestError::FieldMismatch(field));
        }
    }
    let quote = decode("quote", &attestation.quote)?;
    let log = check_quote(
        &keys,
        &quote,
        &decode("signature", &attestation.signature)?,
        &qualifying,
        &event_log,
    )?;
    measured(&log, "kernel", claimed.kernel_sha256)?;
    measured(&log, "initramfs", &attestation.initrd.sha256)?;
    if Some(log.kernel_cmdline()?) != attestation.kernel_cmdline {
        return Err(AttestError::FieldMismatch("kernel-cmdline"));
    }
    match (tpm_ca, &keys.ek_certificate) {
        (None, _) => Ok(false),
        (Some(_), None) => Err(AttestError::NoCertificate),
        (Some(ca), Some(der)) => check_certificate(&keys, der, Some(ca)).map(|_| true),
    }
}

/// What an attestation establishes, in a line, checked again without a
/// TPM CA: what verified, and that the EK's endorsement was not checked.
pub fn describe(attestation: &Attestation, claimed: &Claimed) -> String {
    match recheck(attestation, claimed, None) {
        Ok(_) => crate::io::clean(&format!(
            "TPM 2.0 quote verifies (EK {}; its certificate not checked here, give promote --tpm-ca): kernel {}, initramfs {}",
            claimed.hardware_id,
            claimed.kernel_sha256.get(..16).unwrap_or_default(),
            attestation.initrd.sha256.get(..16).unwrap_or_default(),
        )),
        Err(error) => crate::io::clean(&format!("claimed, but does NOT verify: {error}")),
    }
}

/// A log that replays to a quote, with its PCR values.
pub struct BootLog {
    pub events: Vec<Event>,
    pub values: BTreeMap<u32, [u8; 32]>,
}

impl BootLog {
    fn pcrs_hex(&self) -> BTreeMap<String, String> {
        self.values
            .iter()
            .map(|(pcr, value)| (pcr.to_string(), hex::encode(value)))
            .collect()
    }

    /// The one command line GRUB measured into PCR 8 for the kernel. Each
    /// PCR 8 event's text must be what was measured: GRUB extends the
    /// sha256 of the text after its prefix.
    fn kernel_cmdline(&self) -> Result<String, AttestError> {
        let mut cmdlines = Vec::new();
        for event in self
            .events
            .iter()
            .filter(|e| e.pcr == GRUB_COMMANDS_PCR && e.kind == EV_IPL)
        {
            let text = event.text();
            let (prefix, body) = ["grub_cmd: ", "kernel_cmdline: ", "module_cmdline: "]
                .iter()
                .find_map(|prefix| text.strip_prefix(prefix).map(|body| (*prefix, body)))
                .ok_or(AttestError::ForgedEventText)?;
            if Sha256::digest(body.as_bytes()).as_slice() != event.sha256 {
                return Err(AttestError::ForgedEventText);
            }
            if prefix == "kernel_cmdline: " {
                cmdlines.push(body.to_string());
            }
        }
        match <[String; 1]>::try_from(cmdlines) {
            Ok([cmdline]) => Ok(cmdline),
            Err(all) => Err(AttestError::KernelCmdlines(all.len())),
        }
    }

    /// PCR 9's files: `path sha256` each.
    fn files(&self) -> impl Iterator<Item = (&Event, String)> {
        self.events
            .iter()
            .filter(|e| e.pcr == GRUB_FILES_PCR && e.kind == EV_IPL)
            .map(|e| (e, hex::encode(e.sha256)))
    }
}

/// The quote's signer, signature, qualifying data and PCRs, and the log
/// replayed to them. Also what `promote` checks again from a record.
pub fn check_quote(
    keys: &Keys,
    quote_bytes: &[u8],
    signature: &[u8],
    qualifying: &[u8],
    event_log: &[u8],
) -> Result<BootLog, AttestError> {
    let quote = tpm::parse_quote(quote_bytes)?;
    if quote.signer != qualified_name(keys) {
        return Err(AttestError::WrongSigner);
    }
    verify_signature(&keys.ak, quote_bytes, &tpm::parse_signature(signature)?)?;
    if quote.extra_data != qualifying {
        return Err(AttestError::NotThisRun {
            found: hex::encode(&quote.extra_data),
            expected: hex::encode(qualifying),
        });
    }
    if quote.selection != [(tpm::ALG_SHA256, QUOTED_PCRS.to_vec())] {
        return Err(AttestError::WrongPcrs(quote.selection));
    }
    let events = eventlog::parse(event_log)?;
    let values = eventlog::replay(&events, &QUOTED_PCRS);
    if eventlog::pcr_digest(&values, &QUOTED_PCRS) != quote.pcr_digest {
        return Err(AttestError::LogDoesNotReplay);
    }
    Ok(BootLog { events, values })
}

/// The AK's qualified name under the EK in the endorsement hierarchy: what
/// the TPM puts in a quote as its signer.
fn qualified_name(keys: &Keys) -> Vec<u8> {
    let qualify = |parent: &[u8], name: &[u8]| {
        let mut out = tpm::ALG_SHA256.to_be_bytes().to_vec();
        out.extend_from_slice(&Sha256::new().chain_update(parent).chain_update(name).finalize());
        out
    };
    let ek = qualify(&ENDORSEMENT_HIERARCHY.to_be_bytes(), &keys.ek.name());
    qualify(&ek, &keys.ak.name())
}

fn verify_signature(
    ak: &tpm::Public,
    message: &[u8],
    signature: &tpm::EcdsaSignature,
) -> Result<(), AttestError> {
    let PublicKey::EccP256 { x, y } = &ak.key else {
        return Err(AttestError::NotAnAttestationKey(ak.attributes));
    };
    let valid = || -> Result<bool, openssl::error::ErrorStack> {
        let group = EcGroup::from_curve_name(Nid::X9_62_PRIME256V1)?;
        let (x, y) = (BigNum::from_slice(x)?, BigNum::from_slice(y)?);
        let key = EcKey::from_public_key_affine_coordinates(&group, &x, &y)?;
        let signature = EcdsaSig::from_private_components(
            BigNum::from_slice(&signature.r)?,
            BigNum::from_slice(&signature.s)?,
        )?;
        signature.verify(&Sha256::digest(message), &key)
    };
    match valid() {
        Ok(true) => Ok(()),
        _ => Err(AttestError::BadSignature),
    }
}

/// What GRUB did, as the log says and the quote vouches: every file it
/// loaded is the ISO's, among them the ref's kernel and the ISO's
/// initramfs; every command's text is what was measured; and the kernel's
/// one command line is one of the ISO's menu entries.
fn check_boot(log: &BootLog, boot: &BootFiles) -> Result<(BootFile, BootFile, String), AttestError> {
    if let Some((event, sha256)) = log.files().find(|(_, digest)| !boot.allowed.contains(digest)) {
        return Err(AttestError::ForeignFile {
            path: crate::io::clean(&event.text()),
            sha256,
        });
    }
    let kernel = measured(log, "kernel", &boot.kernel_sha256)?;
    let initrd = measured(log, "initramfs", &boot.initrd_sha256)?;
    let cmdline = log.kernel_cmdline()?;
    if !boot.cmdlines.contains(&cmdline) {
        return Err(AttestError::WrongCmdline(crate::io::clean(&cmdline)));
    }
    Ok((kernel, initrd, cmdline))
}

/// The PCR 9 event with `sha256`, as the record states it.
fn measured(log: &BootLog, what: &'static str, sha256: &str) -> Result<BootFile, AttestError> {
    log.files()
        .find(|(_, digest)| digest == sha256)
        .map(|(event, digest)| BootFile {
            path: crate::io::clean(&event.text()),
            sha256: digest,
        })
        .ok_or_else(|| AttestError::NotTheRef {
            what,
            expected: sha256.to_string(),
            measured: log
                .files()
                .filter(|(e, _)| !e.text().ends_with(".mod"))
                .map(|(e, digest)| format!("{} {}", crate::io::clean(&e.text()), &digest[..16]))
                .collect::<Vec<_>>()
                .join(", "),
        })
}

/// The EK, its certificate, and whether the certificate chains to `ca`.
fn endorsement(keys: &Keys, ca: Option<&Path>) -> Result<Endorsement, AttestError> {
    let certificate_status = match (&keys.ek_certificate, ca) {
        (None, Some(_)) => return Err(AttestError::NoCertificate),
        (None, None) => "none: the TPM holds no EK certificate".to_string(),
        (Some(der), _) => check_certificate(keys, der, ca)?,
    };
    Ok(Endorsement {
        public: BASE64.encode(&keys.ek_public),
        public_sha256: hex::encode(Sha256::digest(&keys.ek.area)),
        certificate: keys.ek_certificate.as_ref().map(|der| BASE64.encode(der)),
        certificate_status,
    })
}

fn check_certificate(keys: &Keys, der: &[u8], ca: Option<&Path>) -> Result<String, AttestError> {
    let untrusted =
        |e: &dyn std::fmt::Display| AttestError::UntrustedCertificate(crate::io::clean(&e.to_string()));
    let certificate = X509::from_der(der).map_err(|e| untrusted(&e))?;
    let PublicKey::Rsa { modulus, exponent } = &keys.ek.key else {
        return Err(AttestError::CertificateMismatch);
    };
    let key = certificate
        .public_key()
        .and_then(|k| k.rsa())
        .map_err(|e| untrusted(&e))?;
    let exponent = BigNum::from_u32(*exponent).map_err(|e| untrusted(&e))?;
    if key.n().to_vec() != *modulus || key.e().to_vec() != exponent.to_vec() {
        return Err(AttestError::CertificateMismatch);
    }
    let Some(ca) = ca else {
        return Ok("present, not checked: no --tpm-ca given".into());
    };
    let bundle = std::fs::read(ca).map_err(|e| untrusted(&e))?;
    let mut store = X509StoreBuilder::new().map_err(|e| untrusted(&e))?;
    for cert in X509::stack_from_pem(&bundle).map_err(|e| untrusted(&e))? {
        store.add_cert(cert).map_err(|e| untrusted(&e))?;
    }
    let store = store.build();
    let chain = openssl::stack::Stack::new().map_err(|e| untrusted(&e))?;
    let mut context = openssl::x509::X509StoreContext::new().map_err(|e| untrusted(&e))?;
    let verified = context
        .init(&store, &certificate, &chain, |c| {
            let ok = c.verify_cert()?;
            Ok(if ok { Ok(()) } else { Err(c.error().to_string()) })
        })
        .map_err(|e| untrusted(&e))?;
    verified.map_err(|e| untrusted(&e))?;
    Ok(format!("verified: chains to --tpm-ca {}", ca.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_nonce_and_the_report_are_both_bound() {
        let base = qualifying_data(&[1; 32], &[2; 32]);
        assert_ne!(base, qualifying_data(&[3; 32], &[2; 32]));
        assert_ne!(base, qualifying_data(&[1; 32], &[4; 32]));
        assert_eq!(report_sha256(&serde_json::json!({"b": 1, "a": 2})), {
            let digest: [u8; 32] = Sha256::digest(br#"{"a":2,"b":1}"#).into();
            digest
        });
    }

    #[test]
    fn output_lines_are_base64_each_named_once() {
        assert!(matches!(parse_keys("ek-public=AAAA\n"), Err(AttestError::Output(m)) if m == "no ak-public"));
        let short = parse_keys("ek-public=AAAA\nak-public=AAAA\nak-name=AAAA\n");
        assert!(
            matches!(short, Err(AttestError::Tpm(TpmError::Trailing { .. }))),
            "{short:?}"
        );
        assert!(matches!(fields("x=!!"), Err(AttestError::Output(m)) if m == "x is not base64"));
        assert!(matches!(fields("x=AA==\nx=AA=="), Err(AttestError::Output(m)) if m == "x given twice"));
        assert!(matches!(parse_evidence("secret=AA=="), Err(AttestError::Output(m)) if m == "no quote"));
    }
}

/// The whole exchange with a real TPM: swtpm on loopback, tpm2-tools, and
/// the live ISO's own `attest` script, with an event log made to match the
/// PCRs extended here as GRUB would.
#[cfg(all(test, feature = "fixtures"))]
mod swtpm_tests {
    use std::process::{Child, Command};

    use super::eventlog::tests::log_of;
    use super::*;

    const SCRIPT_IN_TREE: &str = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../live-image/rootfs/usr/libexec/emberrtos/attest"
    );

    struct Tpm {
        dir: tempfile::TempDir,
        swtpm: Child,
        tcti: String,
    }

    impl Drop for Tpm {
        fn drop(&mut self) {
            let _ = self.swtpm.kill();
            let _ = self.swtpm.wait();
        }
    }

    fn run(cmd: &mut Command) -> Vec<u8> {
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "{cmd:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    }

    /// A manufactured TPM (EK certificate from swtpm's local CA) serving on loopback.
    fn tpm() -> Tpm {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        std::fs::create_dir(&state).unwrap();
        run(Command::new("swtpm_setup")
            .args(["--tpm2", "--create-ek-cert", "--lock-nvram", "--tpmstate"])
            .arg(&state));
        // tpm2-tools' swtpm TCTI takes the control channel at port + 1.
        let port = crate::commands::vm::free_loopback_port().unwrap();
        let ctrl = port + 1;
        let swtpm = Command::new("swtpm")
            .args([
                "socket",
                "--tpm2",
                "--flags",
                "not-need-init,startup-clear",
                "--tpmstate",
            ])
            .arg(format!("dir={}", state.display()))
            .args(["--server", &format!("type=tcp,port={port},bindaddr=127.0.0.1")])
            .args(["--ctrl", &format!("type=tcp,port={ctrl},bindaddr=127.0.0.1")])
            .spawn()
            .unwrap();
        let tcti = format!("swtpm:host=127.0.0.1,port={port}");
        for _ in 0..100 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        Tpm { dir, swtpm, tcti }
    }

    impl Tpm {
        fn attest(&self, args: &[&str]) -> std::process::Output {
            Command::new(SCRIPT_IN_TREE)
                .args(args)
                .env("TPM2TOOLS_TCTI", &self.tcti)
                .env("ATTEST_STATE", self.dir.path().join("attest"))
                .env("ATTEST_EVENT_LOG", self.dir.path().join("log"))
                .output()
                .unwrap()
        }

        /// Extends PCRs as GRUB does, and writes the log of it: each event
        /// `(pcr, its text in the log, the bytes measured)`.
        fn boot(&self, events: &[(u32, &str, &[u8])]) -> Vec<u8> {
            let mut logged = Vec::new();
            for (pcr, text, bytes) in events {
                let digest: [u8; 32] = Sha256::digest(bytes).into();
                run(Command::new("tpm2_pcrextend")
                    .arg(format!("{pcr}:sha256={}", hex::encode(digest)))
                    .env("TPM2TOOLS_TCTI", &self.tcti));
                logged.push((*pcr, EV_IPL, digest, text.as_bytes()));
            }
            let log = log_of(&logged);
            std::fs::write(self.dir.path().join("log"), &log).unwrap();
            log
        }

        fn keys(&self) -> Keys {
            let out = self.attest(&["keys"]);
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
            parse_keys(&String::from_utf8_lossy(&out.stdout)).unwrap()
        }

        fn quote(&self, challenge: &Challenge, qualifying: &[u8]) -> std::process::Output {
            let command = quote_command(challenge, qualifying);
            let args: Vec<&str> = command.split(' ').skip(1).collect();
            self.attest(&args)
        }
    }

    const KERNEL: &[u8] = b"the ref's kernel";
    const INITRD: &[u8] = b"the live initramfs";
    const CMDLINE: &str = "/boot/vmlinuz nohz_full=1 console=ttyS0,115200";

    /// GRUB's events of the live ISO's boot: the kernel, its command line, the initramfs.
    fn grub_boot<'a>(
        cmdline_logged: &'a str,
        extra: &'a [(u32, &'a str, &'a [u8])],
    ) -> Vec<(u32, &'a str, &'a [u8])> {
        let mut events = vec![
            (9, "/boot/vmlinuz\0", KERNEL),
            (8, cmdline_logged, CMDLINE.as_bytes()),
            (9, "/boot/initrd.img\0", INITRD),
        ];
        events.extend_from_slice(extra);
        events
    }

    fn boot_files() -> BootFiles {
        BootFiles {
            kernel_sha256: hex::encode(Sha256::digest(KERNEL)),
            initrd_sha256: hex::encode(Sha256::digest(INITRD)),
            source: "live.iso".into(),
            allowed: [KERNEL, INITRD]
                .iter()
                .map(|f| hex::encode(Sha256::digest(f)))
                .collect(),
            cmdlines: vec![CMDLINE.into()],
        }
    }

    /// swtpm's local CA, as `--tpm-ca`.
    fn ca_bundle(dir: &Path) -> PathBuf {
        let ca = Path::new("/var/lib/swtpm-localca");
        let pems: Vec<u8> = ["issuercert.pem", "swtpm-localca-rootca-cert.pem"]
            .iter()
            .flat_map(|name| std::fs::read(ca.join(name)).unwrap())
            .collect();
        let bundle = dir.join("ca.pem");
        std::fs::write(&bundle, pems).unwrap();
        bundle
    }

    /// A TPM booted through `events`, its keys, and its quote over `report`.
    fn quoted(events: &[(u32, &str, &[u8])], report: &[u8]) -> (Tpm, Keys, Challenge, Evidence) {
        let tpm = tpm();
        tpm.boot(events);
        let keys = tpm.keys();
        let challenge = challenge(&keys).unwrap();
        let out = tpm.quote(&challenge, &qualifying_data(&challenge.nonce, report));
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let evidence = parse_evidence(&String::from_utf8_lossy(&out.stdout)).unwrap();
        (tpm, keys, challenge, evidence)
    }

    #[test]
    fn a_real_tpm_attests_and_every_forgery_is_refused() {
        let report = [7u8; 32];
        let (a, keys, challenge, evidence) = quoted(
            &grub_boot(
                "kernel_cmdline: /boot/vmlinuz nohz_full=1 console=ttyS0,115200\0",
                &[],
            ),
            &report,
        );
        let bundle = ca_bundle(a.dir.path());
        let verify_with =
            |keys: &Keys, challenge: &Challenge, evidence: &Evidence, report: &[u8], boot: &BootFiles| {
                verify(keys, challenge, evidence, report, boot, None)
            };
        let attested = verify(
            &keys,
            &challenge,
            &evidence,
            &report,
            &boot_files(),
            Some(&bundle),
        )
        .unwrap();
        assert_eq!(attested.kernel.path, "/boot/vmlinuz");
        assert_eq!(attested.initrd.sha256, boot_files().initrd_sha256);
        assert_eq!(attested.kernel_cmdline.as_deref(), Some(CMDLINE));
        assert!(
            attested.ek.certificate_status.starts_with("verified"),
            "{attested:?}"
        );
        let unchecked = verify_with(&keys, &challenge, &evidence, &report, &boot_files()).unwrap();
        assert!(unchecked.ek.certificate_status.contains("not checked"));

        // A report changed after the quote; the quote replayed to a later run.
        let changed = verify_with(&keys, &challenge, &evidence, &[8; 32], &boot_files());
        assert!(
            matches!(changed, Err(AttestError::NotThisRun { .. })),
            "{changed:?}"
        );
        let later = Challenge {
            nonce: [9; 32],
            ..challenge.clone_for_test()
        };
        let replayed = verify_with(&keys, &later, &evidence, &report, &boot_files());
        assert!(
            matches!(replayed, Err(AttestError::NotThisRun { .. })),
            "{replayed:?}"
        );
        // Another initramfs than the ISO's; another menu than the ISO's.
        let other = BootFiles {
            initrd_sha256: hex::encode(Sha256::digest(b"a modified initramfs")),
            ..boot_files()
        };
        let modified = verify_with(&keys, &challenge, &evidence, &report, &other);
        assert!(
            matches!(&modified, Err(AttestError::NotTheRef { what: "initramfs", measured, .. }) if measured.contains("/boot/initrd.img")),
            "{modified:?}"
        );
        let menu = BootFiles {
            cmdlines: vec!["/boot/vmlinuz quiet".into()],
            ..boot_files()
        };
        let cmdline = verify_with(&keys, &challenge, &evidence, &report, &menu);
        assert!(
            matches!(cmdline, Err(AttestError::WrongCmdline(_))),
            "{cmdline:?}"
        );
        // A log that is not this boot's.
        let mut cut = evidence.event_log.clone();
        cut.truncate(cut.len() - (4 + 4 + 4 + 2 + 20 + 2 + 32 + 4 + "/boot/initrd.img\0".len()));
        let short_log = Evidence {
            event_log: cut,
            ..evidence.clone_for_test()
        };
        let replay = verify_with(&keys, &challenge, &short_log, &report, &boot_files());
        assert!(matches!(replay, Err(AttestError::LogDoesNotReplay)), "{replay:?}");
        // --tpm-ca asks for an EK certificate the TPM does not hold.
        let no_certificate = Keys {
            ek_certificate: None,
            ..keys.clone()
        };
        let bare = verify(
            &no_certificate,
            &challenge,
            &evidence,
            &report,
            &boot_files(),
            Some(&bundle),
        );
        assert!(matches!(bare, Err(AttestError::NoCertificate)), "{bare:?}");
        // An EK with the certificate's modulus but another exponent.
        let mut weak = keys.ek.area.clone();
        weak[48] = 3;
        assert!(!tpm::is_default_rsa_ek(&weak));
        assert!(tpm::is_default_rsa_ek(&keys.ek.area));

        // The record's attestation checks again from the record alone.
        let claimed_report = serde_json::json!({"schema": "jitter-report/2", "x": 0.1});
        let claimed_sha = report_sha256(&claimed_report);
        let (_b, b_keys, b_challenge, b_evidence) = quoted(
            &grub_boot(
                "kernel_cmdline: /boot/vmlinuz nohz_full=1 console=ttyS0,115200\0",
                &[],
            ),
            &claimed_sha,
        );
        let stored = verify(
            &b_keys,
            &b_challenge,
            &b_evidence,
            &claimed_sha,
            &boot_files(),
            None,
        )
        .unwrap();
        let kernel = hex::encode(Sha256::digest(KERNEL));
        let id = hardware_id(&b_keys);
        let claimed = Claimed {
            hardware_id: &id,
            kernel_sha256: &kernel,
            report: &claimed_report,
        };
        assert!(
            !recheck(&stored, &claimed, None).unwrap(),
            "the EK is not endorsed without a CA"
        );
        assert!(recheck(&stored, &claimed, Some(&bundle)).unwrap());
        let other_report = serde_json::json!({"schema": "jitter-report/2", "x": 0.2});
        let swapped_report = Claimed {
            report: &other_report,
            ..claimed
        };
        assert!(matches!(
            recheck(&stored, &swapped_report, None),
            Err(AttestError::FieldMismatch("report-sha256"))
        ));
        let renamed = Claimed {
            hardware_id: "hw-0000000000000000",
            ..claimed
        };
        assert!(matches!(
            recheck(&stored, &renamed, None),
            Err(AttestError::FieldMismatch("hardware id"))
        ));

        // Another TPM: another hardware id; its AK cannot stand in for a's,
        // and a credential sealed to its keys does not open in a.
        assert_ne!(hardware_id(&keys), hardware_id(&b_keys));
        let swapped = Keys {
            ak: b_keys.ak.clone(),
            ak_public: b_keys.ak_public.clone(),
            ..keys.clone()
        };
        let foreign = verify_with(&swapped, &challenge, &evidence, &report, &boot_files());
        assert!(matches!(foreign, Err(AttestError::WrongSigner)), "{foreign:?}");
        let for_b = super::challenge(&b_keys).unwrap();
        let out = a.quote(&for_b, &[1; 32]);
        assert!(!out.status.success());
        assert!(String::from_utf8_lossy(&out.stderr).contains("tpm2_activatecredential failed"));
    }

    #[test]
    fn a_boot_beyond_the_live_isos_files_and_texts_is_refused() {
        let report = [7u8; 32];
        // An extra initramfs (a cpio that overlays /init), loaded after the ISO's.
        let cpio: &[(u32, &str, &[u8])] = &[(9, "/boot/x.cpio\0", b"overlay")];
        let (_t, keys, challenge, evidence) = quoted(
            &grub_boot(
                "kernel_cmdline: /boot/vmlinuz nohz_full=1 console=ttyS0,115200\0",
                cpio,
            ),
            &report,
        );
        let extra = verify(&keys, &challenge, &evidence, &report, &boot_files(), None);
        assert!(
            matches!(&extra, Err(AttestError::ForeignFile { path, .. }) if path == "/boot/x.cpio"),
            "{extra:?}"
        );
        // A log whose command line text is not what was measured.
        let (_t, keys, challenge, evidence) =
            quoted(&grub_boot("kernel_cmdline: /boot/vmlinuz quiet\0", &[]), &report);
        let forged = verify(&keys, &challenge, &evidence, &report, &boot_files(), None);
        assert!(matches!(forged, Err(AttestError::ForgedEventText)), "{forged:?}");
    }

    impl Challenge {
        fn clone_for_test(&self) -> Challenge {
            Challenge {
                nonce: self.nonce,
                secret: self.secret.clone(),
                credential: self.credential.clone(),
            }
        }
    }

    impl Evidence {
        fn clone_for_test(&self) -> Evidence {
            Evidence {
                secret: self.secret.clone(),
                quote: self.quote.clone(),
                signature: self.signature.clone(),
                event_log: self.event_log.clone(),
            }
        }
    }
}
