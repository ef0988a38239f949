//! The `attestation` of a `qualification/2` record: the TPM's evidence as
//! it was verified, whole, so it can be checked again without the target.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A TPM 2.0 quote over the boot PCRs with an AK bound to the EK.
pub const METHOD: &str = "tpm2-quote";
/// The result of a verified attestation.
pub const ATTESTED: &str = "attested";
/// How the AK was tied to the EK.
pub const BINDING: &str = "credential-activation";

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct Attestation {
    pub method: String,
    pub result: String,
    /// This run's nonce (hex).
    pub nonce: String,
    /// The sha256 of the record's report, as compact JSON.
    pub report_sha256: String,
    /// `sha256(nonce ‖ report-sha256)`: what the quote carries.
    pub qualifying_data: String,
    /// `TPMS_ATTEST` and `TPMT_SIGNATURE`, base64.
    pub quote: String,
    pub signature: String,
    /// The sha256 bank's PCRs 0-9 as the event log replays and the quote signs.
    pub pcrs: BTreeMap<String, String>,
    /// The firmware's event log, base64.
    pub event_log: String,
    pub event_log_sha256: String,
    pub event_log_events: usize,
    pub ek: Endorsement,
    pub ak: Signer,
    /// What GRUB measured into PCR 9: the commit's kernel, the live ISO's initramfs.
    pub kernel: BootFile,
    pub initrd: BootFile,
    /// The ISO the initramfs was compared with.
    pub initrd_source: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_cmdline: Option<String>,
}

/// The endorsement key: the hardware identity.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct Endorsement {
    /// `TPM2B_PUBLIC`, base64.
    pub public: String,
    /// The sha256 of its public area; the hardware id is `hw-` and its first 16 digits.
    pub public_sha256: String,
    /// DER, base64, when the TPM holds one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub certificate: Option<String>,
    /// `verified: …`, `present, not checked: …` or `none: …`.
    pub certificate_status: String,
}

/// The attestation key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct Signer {
    pub public: String,
    pub name: String,
    pub binding: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct BootFile {
    /// The path GRUB logged.
    pub path: String,
    pub sha256: String,
}
