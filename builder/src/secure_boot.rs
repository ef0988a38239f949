//! The Secure Boot signing key: checked when it is named, used only by the
//! gate (the verify stage signs the kernel it proved; the disk stage signs
//! the shim and GRUB that verify it).
//!
//! The key never leaves its file: `sbsign` reads it in place and writes the
//! signed image to a temporary file inside the work dir, which is renamed
//! into place once the signature verifies, and removed otherwise.
//!
//! sbsign stamps its signature with the time (a signingTime attribute), so
//! it runs under `faketime` at the build's SOURCE_DATE_EPOCH: the same
//! inputs sign to the same bytes, and two runners commit the same tree.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

use crate::tool;
use emberrtos_contract::error::BadInput;
use emberrtos_contract::secure_boot::{Certificate, signed_by};

/// A Secure Boot key and its certificate (PEM files).
#[derive(Clone, Debug)]
pub struct SigningKey {
    pub key: PathBuf,
    pub cert: Certificate,
}

/// A PEM certificate named by `option` (exit 2 naming the file).
pub fn load_certificate(option: &str, path: &Path) -> Result<Certificate, BadInput> {
    let bad = |message: String| BadInput::new(option, format!("{}: {message}", path.display()));
    let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
    Certificate::parse_pem(&text).map_err(bad)
}

/// Pure: why a private key file with these permission bits must not be
/// used (readable or writable by anyone but its owner), or `None`.
pub fn key_mode_problem(mode: u32) -> Option<String> {
    (mode & 0o077 != 0).then(|| {
        format!(
            "the private key is accessible to others (mode {:04o}): chmod 600 it",
            mode & 0o7777
        )
    })
}

impl SigningKey {
    /// Checks and loads a key and certificate; `options` names them as the
    /// user did (`--secure-boot-key`, `secure-boot.key`). Exit 2 naming the
    /// file when the key is not its owner's alone, is not a PEM private key,
    /// or the certificate does not parse.
    pub fn load(key: &Path, cert: &Path, options: (&str, &str)) -> Result<SigningKey, BadInput> {
        let (key_option, cert_option) = options;
        let bad = |option: &str, path: &Path, message: String| {
            BadInput::new(option, format!("{}: {message}", path.display()))
        };
        let meta = std::fs::metadata(key).map_err(|e| bad(key_option, key, e.to_string()))?;
        if !meta.is_file() {
            return Err(bad(key_option, key, "not a regular file".into()));
        }
        if let Some(problem) = key_mode_problem(std::os::unix::fs::PermissionsExt::mode(&meta.permissions()))
        {
            return Err(bad(key_option, key, problem));
        }
        let text = std::fs::read_to_string(key).map_err(|e| bad(key_option, key, e.to_string()))?;
        if !text.contains("-----BEGIN ") || !text.contains("PRIVATE KEY-----") {
            return Err(bad(key_option, key, "not a PEM private key".into()));
        }
        Ok(SigningKey {
            key: key.to_path_buf(),
            cert: load_certificate(cert_option, cert)?,
        })
    }

    /// Signs the PE image `input` into `output` (`sbsign`, its clock frozen
    /// at `epoch`), through a temporary file in `scratch` that is removed
    /// unless the signature verifies with the certificate.
    pub fn sign(&self, input: &Path, output: &Path, scratch: &Path, epoch: u64) -> Result<()> {
        let cert = tempfile::Builder::new()
            .prefix(".cert-")
            .tempfile_in(scratch)
            .context("a temporary certificate file in the work dir")?;
        std::fs::write(cert.path(), self.cert.pem())?;
        let signed = tempfile::Builder::new()
            .prefix(".signing-")
            .tempfile_in(scratch)
            .context("a temporary file in the work dir to sign into")?;
        tool::run(
            tool::command("faketime")?
                .env("TZ", "UTC")
                .arg("-f")
                .arg(frozen_clock(epoch))
                .arg(tool::find_in("sbsign", std::env::var_os("PATH").as_deref())?)
                .arg("--key")
                .arg(&self.key)
                .arg("--cert")
                .arg(cert.path())
                .arg("--output")
                .arg(signed.path())
                .arg(input),
        )
        .with_context(|| format!("signing {}", input.display()))?;
        if !signed_by(signed.path(), &self.cert)? {
            bail!(
                "sbsign's output for {} does not verify with the certificate (does the key belong to it?)",
                input.display()
            );
        }
        std::fs::set_permissions(signed.path(), std::os::unix::fs::PermissionsExt::from_mode(0o644))?;
        signed
            .persist(output)
            .with_context(|| format!("placing {}", output.display()))?;
        Ok(())
    }
}

/// Pure: `faketime`'s frozen clock for a Unix time, `2025-11-30 00:00:00`
/// (read as UTC).
pub fn frozen_clock(epoch: u64) -> String {
    rtreport::utc::rfc3339(epoch).replace('T', " ").replace('Z', "")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_signing_clock_is_the_build_epoch_in_utc() {
        assert_eq!(frozen_clock(1_764_460_800), "2025-11-30 00:00:00");
        assert_eq!(frozen_clock(0), "1970-01-01 00:00:00");
    }

    #[test]
    fn only_an_owner_only_key_is_accepted() {
        assert_eq!(key_mode_problem(0o600), None);
        assert_eq!(key_mode_problem(0o400), None);
        assert!(key_mode_problem(0o644).unwrap().contains("mode 0644"));
        assert!(key_mode_problem(0o640).is_some());
        assert!(key_mode_problem(0o602).is_some());
        assert!(key_mode_problem(0o100600 | 0o004).unwrap().contains("0604"));
    }
}
