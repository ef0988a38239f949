//! The qualification record (`qualification/2`): which kernel, on which
//! hardware, measured how, with which verdict, and how each of those was
//! established. Signed with an armored GPG detached signature and stored
//! beside the commit (`<repo>/qualifications/<commit>/`), signature first.
//! `qualification/1` records (without `provenance` and the host key's
//! `established`) still read.

use std::path::{Path, PathBuf};

use anyhow::Result;
use serde::{Deserialize, Serialize};

use super::attest::{self, record::Attestation};
use super::probe::Hardware;
use super::ssh::Established;
use crate::io::gpg;
use crate::io::records::{self, RecordKind};

pub const SCHEMA: &str = "qualification/2";

/// The schemas read: [`SCHEMA`], and the first, which does not say how its
/// host key or facts were established.
pub const READABLE: [&str; 2] = ["qualification/1", SCHEMA];

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct KernelIdentity {
    pub release: String,
    pub uts_version: String,
    pub bzimage_sha256: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct HostKeyRecord {
    pub algorithm: String,
    pub fingerprint: String,
    /// `pinned` or `trust-on-first-use`; absent in `qualification/1`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub established: Option<Established>,
}

/// Where the record's facts come from. Without attestation every one of
/// them is the target's own word, under the host key above.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct Provenance {
    /// `none`: no TPM quote or other hardware-rooted proof (issue 41).
    pub attestation: String,
    /// The hardware id hashes DMI strings, `/proc/cpuinfo` and
    /// `/proc/meminfo` as the target's shell printed them.
    pub identity_source: String,
    /// The target ran the commit's kernel because its `uname -r`/`-v` and
    /// `jitter --check-kernel` said so.
    pub kernel_source: String,
    /// The verdict and figures are the report the target's `jitter` wrote.
    pub measurement_source: String,
}

impl Provenance {
    /// Without a TPM: nothing beyond the target's word.
    pub fn reported_by_target() -> Provenance {
        Provenance {
            attestation: "none".into(),
            identity_source: "dmi-cpuinfo-meminfo-reported-by-target".into(),
            kernel_source: "uname-and-check-kernel-reported-by-target".into(),
            measurement_source: "jitter-report-from-target".into(),
        }
    }

    /// With a verified TPM quote ([`Attestation`]): the identity is the
    /// EK's, the kernel and initramfs are what GRUB measured, and the
    /// report is the one the quote binds.
    pub fn attested() -> Provenance {
        Provenance {
            attestation: ATTESTED_BY.into(),
            identity_source: "tpm-endorsement-key".into(),
            kernel_source: "measured-boot-quoted-by-tpm".into(),
            measurement_source: "jitter-report-bound-to-tpm-quote".into(),
        }
    }
}

/// `provenance.attestation` of an attested record.
pub const ATTESTED_BY: &str = super::attest::record::METHOD;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct TargetRecord {
    pub address: String,
    pub host_key: HostKeyRecord,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct Record {
    pub schema: String,
    pub commit: String,
    #[serde(rename = "ref")]
    pub ref_name: String,
    pub kernel: KernelIdentity,
    pub hardware: Hardware,
    pub target: TargetRecord,
    /// Absent in `qualification/1`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provenance: Option<Provenance>,
    /// `PASS`, `FAIL` or `INVALID`, as jitter judged.
    pub verdict: String,
    pub reasons: Vec<String>,
    pub worst_us: u64,
    pub budget_us: u64,
    pub duration_s: u64,
    /// UTC, RFC 3339.
    pub started: String,
    pub finished: String,
    pub operator_host: String,
    pub imgbuild_version: String,
    /// The whole jitter report (`jitter-report/2`).
    pub report: serde_json::Value,
    /// The TPM's evidence, when the target was attested.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attestation: Option<Attestation>,
}

impl Record {
    /// How its host key was established: `pinned`, `trust-on-first-use`,
    /// or `not stated` (a `qualification/1` record).
    /// What its attestation establishes, checked again (see [`attest::recheck`]).
    pub fn attestation_summary(&self) -> String {
        match &self.attestation {
            None => "none (hardware, kernel and figures are the target's own word)".into(),
            Some(attestation) => attest::describe(attestation, &self.claimed()),
        }
    }

    /// Checks its attestation again ([`attest::recheck`]): `None` when it
    /// has none, else whether its EK's certificate chained to `tpm_ca`.
    pub fn check_attestation(&self, tpm_ca: Option<&std::path::Path>) -> Option<Result<bool, String>> {
        let attestation = self.attestation.as_ref()?;
        Some(attest::recheck(attestation, &self.claimed(), tpm_ca).map_err(|e| e.to_string()))
    }

    fn claimed(&self) -> attest::Claimed<'_> {
        attest::Claimed {
            hardware_id: &self.hardware.id,
            kernel_sha256: &self.kernel.bzimage_sha256,
            report: &self.report,
        }
    }

    /// `tpm2-quote` when a TPM attested the run, else `none`.
    pub fn attestation(&self) -> &str {
        match (&self.provenance, &self.attestation) {
            (Some(p), Some(_)) => &p.attestation,
            _ => "none",
        }
    }

    pub fn host_key_established(&self) -> &'static str {
        self.target
            .host_key
            .established
            .map_or("not stated", Established::as_str)
    }
}

pub use rtreport::utc::rfc3339;

/// The record's file name: platform, start time and target, so two machines
/// of one model qualified in the same second do not collide. A long host
/// name is replaced by its hash, to keep the name short.
pub fn file_name(record: &Record, target_file_name: &str) -> String {
    let time: String = record
        .started
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .collect();
    let target = match target_file_name.len() {
        0..=64 => target_file_name.to_string(),
        _ => crate::io::hashing::sha256_hex(target_file_name)[..16].to_string(),
    };
    format!("{}-{time}-{target}.json", record.hardware.id)
}

/// Signs `json` with `key` and stores both (signature first) as `kind`
/// records of `commit`; returns the record's path and the signature.
pub fn sign_and_store(
    repo: &Path,
    kind: RecordKind,
    commit: &str,
    name: &str,
    json: &[u8],
    gpg_key: &str,
    gpg_homedir: Option<&Path>,
) -> Result<(PathBuf, Vec<u8>)> {
    let signature = gpg::sign_detached(json, gpg_key, gpg_homedir)?;
    let path = records::store(repo, kind, commit, name, json, &signature)?;
    Ok((path, signature))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Record {
        Record {
            schema: SCHEMA.into(),
            commit: "a".repeat(64),
            ref_name: "emberrtos/x86_64/rt".into(),
            kernel: KernelIdentity {
                release: "6.12.117".into(),
                uts_version: "#1".into(),
                bzimage_sha256: "b".repeat(64),
            },
            hardware: Hardware {
                id: "hw-0123456789abcdef".into(),
                ..Hardware::default()
            },
            target: TargetRecord {
                address: "root@127.0.0.1:2222".into(),
                host_key: HostKeyRecord {
                    algorithm: "ssh-ed25519".into(),
                    fingerprint: "SHA256:x".into(),
                    established: Some(Established::TrustOnFirstUse),
                },
            },
            provenance: Some(Provenance::reported_by_target()),
            verdict: "INVALID".into(),
            reasons: vec![],
            worst_us: 1,
            budget_us: 100,
            duration_s: 10,
            started: rfc3339(1_764_605_700),
            finished: rfc3339(1_764_605_712),
            operator_host: "ci".into(),
            imgbuild_version: "0.1.0".into(),
            report: serde_json::Value::Null,
            attestation: None,
        }
    }

    #[test]
    fn times_and_names() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_764_605_700), "2025-12-01T16:15:00Z");
        let record = sample();
        assert_eq!(
            file_name(&record, "127.0.0.1-2222"),
            "hw-0123456789abcdef-20251201T161500Z-127.0.0.1-2222.json"
        );
        let long = "h".repeat(200);
        assert!(file_name(&record, &long).len() < 80);
        let json = serde_json::to_value(&record).unwrap();
        assert_eq!(json["ref"], "emberrtos/x86_64/rt");
        assert_eq!(json["kernel"]["bzimage-sha256"], "b".repeat(64));
        assert_eq!(json["target"]["host-key"]["fingerprint"], "SHA256:x");
        assert_eq!(json["hardware"]["sys-vendor"], "");
        assert_eq!(json["schema"], "qualification/2");
        assert_eq!(json["target"]["host-key"]["established"], "trust-on-first-use");
        assert_eq!(json["provenance"]["attestation"], "none");
        assert_eq!(
            json["provenance"]["identity-source"],
            "dmi-cpuinfo-meminfo-reported-by-target"
        );
        assert_eq!(record.host_key_established(), "trust-on-first-use");
    }

    #[test]
    fn a_first_schema_record_still_reads_and_states_no_pinning() {
        let mut json = serde_json::to_value(Record {
            schema: "qualification/1".into(),
            ..sample()
        })
        .unwrap();
        json["target"]["host-key"]
            .as_object_mut()
            .unwrap()
            .remove("established");
        json.as_object_mut().unwrap().remove("provenance");
        let read: Record = serde_json::from_value(json).unwrap();
        assert!(READABLE.contains(&read.schema.as_str()));
        assert_eq!(read.provenance, None);
        assert_eq!(read.host_key_established(), "not stated");
    }
}
