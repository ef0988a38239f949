//! UEFI Secure Boot: what a commit records of its signed kernel, and the
//! checks that the committed `vmlinuz` is the image the build's gate signed.
//!
//! The builder signs the kernel (an EFI stub, PE/COFF) after the verify
//! stage proved it and records three keys ([`key`]): the signed image's
//! sha256, the certificate's sha256 and the certificate itself (public).
//! Every later gate (`publish`, `disk`, the device) re-reads the committed
//! file and verifies its Authenticode signature with `sbverify` (Debian's
//! sbsigntool) against that certificate, or against the one it was told to
//! expect: a record is a claim, the signature on the file is the fact.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::{Context, Result};
use sha2::{Digest, Sha256};

use crate::error::MissingTool;
use crate::ostree::CommitInfo;

/// The commit metadata keys of a signed kernel.
pub mod key {
    /// The sha256 of the signed `vmlinuz` as committed.
    pub const KERNEL_SHA256: &str = "imgbuild.secure-boot.kernel-sha256";
    /// The sha256 of the signing certificate (DER): its fingerprint.
    pub const CERT_SHA256: &str = "imgbuild.secure-boot.cert-sha256";
    /// The signing certificate, PEM.
    pub const CERTIFICATE: &str = "imgbuild.secure-boot.certificate";
}

/// An X.509 certificate, as PEM and DER.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Certificate {
    pub der: Vec<u8>,
}

impl Certificate {
    /// Pure: the one `CERTIFICATE` block of a PEM text. A private key, a
    /// second block or anything else is an error saying what was found.
    pub fn parse_pem(text: &str) -> Result<Certificate, String> {
        let blocks = text.matches("-----BEGIN ").count();
        if blocks != 1 {
            return Err(format!("expected one PEM CERTIFICATE block, found {blocks}"));
        }
        let start = text.find("-----BEGIN ").unwrap_or(0);
        let (label, der) = pem_rfc7468::decode_vec(text[start..].trim_end().as_bytes())
            .map_err(|e| format!("not a PEM certificate: {e}"))?;
        if label != "CERTIFICATE" {
            return Err(format!("the PEM block is a {label}, not a CERTIFICATE"));
        }
        Ok(Certificate { der })
    }

    /// The certificate as PEM text.
    pub fn pem(&self) -> String {
        pem_rfc7468::encode_string("CERTIFICATE", pem_rfc7468::LineEnding::LF, &self.der).unwrap_or_default()
    }

    /// The sha256 of the DER, in hex: what firmware tools and `openssl x509
    /// -fingerprint -sha256` show (without the colons).
    pub fn fingerprint(&self) -> String {
        hex::encode(Sha256::digest(&self.der))
    }
}

/// What a commit records of its signed kernel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SignedKernel {
    pub kernel_sha256: String,
    pub cert: Certificate,
}

/// The commit's signed-kernel record: all three keys or none (`None`);
/// some but not all, a certificate that does not parse, or a fingerprint
/// that is not the certificate's is an error naming the key.
pub fn record_of(info: &CommitInfo) -> Result<Option<SignedKernel>> {
    let get = |name: &str| info.metadata.get(name).and_then(|v| v.as_str());
    let (kernel, fingerprint, pem) = (
        get(key::KERNEL_SHA256),
        get(key::CERT_SHA256),
        get(key::CERTIFICATE),
    );
    let checksum = &info.checksum;
    let (kernel, fingerprint, pem) = match (kernel, fingerprint, pem) {
        (None, None, None) => return Ok(None),
        (Some(k), Some(f), Some(p)) => (k, f, p),
        _ => anyhow::bail!(
            "commit {checksum}: the secure-boot record is incomplete ({}, {} and {} go together)",
            key::KERNEL_SHA256,
            key::CERT_SHA256,
            key::CERTIFICATE
        ),
    };
    let cert = Certificate::parse_pem(pem)
        .map_err(|e| anyhow::anyhow!("commit {checksum}: {}: {e}", key::CERTIFICATE))?;
    if cert.fingerprint() != fingerprint {
        anyhow::bail!(
            "commit {checksum}: {} is {fingerprint}, but the recorded certificate's is {}",
            key::CERT_SHA256,
            cert.fingerprint()
        );
    }
    Ok(Some(SignedKernel {
        kernel_sha256: kernel.to_string(),
        cert,
    }))
}

/// Whether the PE image at `image` carries an Authenticode signature that
/// verifies with `cert` (`sbverify --cert`). A missing sbverify is an error,
/// never a "no".
pub fn signed_by(image: &Path, cert: &Certificate) -> Result<bool> {
    let mut pem = tempfile::NamedTempFile::new().context("a temporary file for the certificate")?;
    pem.write_all(cert.pem().as_bytes())?;
    pem.flush()?;
    let status = Command::new("sbverify")
        .arg("--cert")
        .arg(pem.path())
        .arg(image)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    match status {
        Ok(status) => Ok(status.success()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(MissingTool {
            tool: "sbverify".into(),
            package: "sbsigntool".into(),
        }
        .into()),
        Err(e) => Err(e).context("running sbverify"),
    }
}

/// Why the committed kernel at `image` (whose sha256 is `image_sha256`)
/// would not boot under a firmware that trusts `expected` (or, when none is
/// given, is not what `record` says was signed); empty when it would.
pub fn kernel_problems(
    image: &Path,
    image_sha256: &str,
    record: Option<&SignedKernel>,
    expected: Option<&Certificate>,
) -> Result<Vec<String>> {
    let mut problems = Vec::new();
    if let Some(record) = record {
        if record.kernel_sha256 != image_sha256 {
            problems.push(format!(
                "the committed vmlinuz (sha256 {image_sha256}) is not the signed image the build recorded (sha256 {})",
                record.kernel_sha256
            ));
        }
        if !signed_by(image, &record.cert)? {
            problems.push(format!(
                "the committed vmlinuz carries no valid signature by the recorded certificate (sha256 {})",
                record.cert.fingerprint()
            ));
        }
    }
    if let Some(expected) = expected {
        let by = record.map(|r| r.cert.fingerprint());
        if by.as_deref().is_some_and(|by| by != expected.fingerprint()) {
            problems.push(format!(
                "the kernel was signed with certificate sha256 {}, not the expected {}",
                by.unwrap_or_default(),
                expected.fingerprint()
            ));
        } else if !signed_by(image, expected)? {
            problems.push(format!(
                "the committed vmlinuz is not signed by the expected certificate (sha256 {})",
                expected.fingerprint()
            ));
        }
    }
    Ok(problems)
}

#[cfg(test)]
mod tests {
    use super::*;

    // A self-signed test certificate; its key was never kept.
    const CERT: &str = include_str!("../testdata/secure-boot-test-cert.pem");

    #[test]
    fn a_certificate_round_trips_and_has_a_stable_fingerprint() {
        let cert = Certificate::parse_pem(CERT).unwrap();
        assert_eq!(Certificate::parse_pem(&cert.pem()).unwrap(), cert);
        // openssl x509 -noout -fingerprint -sha256
        assert_eq!(
            cert.fingerprint(),
            "660a80357ab1c786b2b09dd4f25995fa10f97b6a956ac64aaa1aab136ecfcb92"
        );
        assert_eq!(cert.fingerprint(), hex::encode(Sha256::digest(&cert.der)));
    }

    #[test]
    fn anything_but_one_certificate_is_refused() {
        let key = "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n";
        assert!(Certificate::parse_pem(key).unwrap_err().contains("PRIVATE KEY"));
        let two = format!("{CERT}{CERT}");
        assert!(Certificate::parse_pem(&two).unwrap_err().contains("found 2"));
        assert!(Certificate::parse_pem("").unwrap_err().contains("found 0"));
        let broken = CERT.replace("MIIBkT", "M!IBkT");
        assert!(Certificate::parse_pem(&broken).is_err());
    }
}
