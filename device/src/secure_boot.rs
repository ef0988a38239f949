//! UEFI Secure Boot on the device: what the firmware says (its `SecureBoot`
//! and `db` variables, read from efivarfs), and the check that refuses to
//! deploy a commit whose kernel the firmware would not start.
//!
//! With Secure Boot on, the firmware boots only a kernel (an EFI stub, a PE
//! file) whose Authenticode signature verifies against a certificate in its
//! `db`. A commit whose `vmlinuz` is signed by no such certificate deploys
//! fine and then does not boot, so provisioning and `emberrtos-update
//! upgrade` refuse it (exit 3) beside the RT gate, before anything is
//! deployed ([`require_trusted_kernel`]). The commit's own record of who
//! signed it is a claim: the signature on the committed file, checked with
//! `sbverify` against the firmware's certificates, is the fact. With Secure
//! Boot off nothing is checked.

use std::fmt;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow};
use serde::Serialize;

use super::system::System;
use emberrtos_contract::error::Refused;
use emberrtos_contract::gate::committed_image;
use emberrtos_contract::secure_boot::{Certificate, signed_by};

/// Where efivarfs is mounted, below the sysroot: `/sys/firmware/efi/efivars`
/// on the device. A scratch sysroot has none: Secure Boot reads as off.
pub const EFIVARS: &str = "sys/firmware/efi/efivars";
/// The `SecureBoot` variable (EFI_GLOBAL_VARIABLE).
pub const SECURE_BOOT_VAR: &str = "SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c";
/// The authorized signature database (EFI_IMAGE_SECURITY_DATABASE_GUID).
pub const DB_VAR: &str = "db-d719b2cb-3d3a-4596-a3bc-dad00e67656f";
/// EFI_CERT_X509_GUID a5c059a1-94e4-4aa7-87b5-ab155c2bf072, as UEFI stores
/// it (the first three fields little-endian).
const CERT_X509: [u8; 16] = [
    0xa1, 0x59, 0xc0, 0xa5, 0xe4, 0x94, 0xa7, 0x4a, 0x87, 0xb5, 0xab, 0x15, 0x5c, 0x2b, 0xf0, 0x72,
];
/// The attribute bytes every efivarfs file starts with.
const ATTRIBUTES: usize = 4;
/// An EFI_SIGNATURE_LIST's fixed part: SignatureType (16), then
/// SignatureListSize, SignatureHeaderSize and SignatureSize (u32 LE each).
const LIST_HEADER: usize = 28;
/// The owner GUID every EFI_SIGNATURE_DATA starts with.
const OWNER: usize = 16;

/// The efivars directory of `system`: `/sys/firmware/efi/efivars` on the
/// device, found below a scratch sysroot the way the ESP is.
pub fn efivars(system: &System) -> PathBuf {
    system.path.join(EFIVARS)
}

/// What the firmware says about Secure Boot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum State {
    On,
    /// Off, and why: the variable is 0, there is none, or no efivarfs at all.
    Off(String),
}

/// Pure: the `SecureBoot` variable as efivarfs shows it (4 attribute bytes,
/// then the value: 1 on, 0 off).
pub fn parse_secure_boot(bytes: &[u8]) -> Result<bool, String> {
    match bytes {
        [_, _, _, _, 1] => Ok(true),
        [_, _, _, _, 0] => Ok(false),
        [_, _, _, _, value] => Err(format!("value {value}, neither 0 (off) nor 1 (on)")),
        _ => Err(format!(
            "{} bytes, not 4 attribute bytes and a 1-byte value",
            bytes.len()
        )),
    }
}

/// Pure: the X.509 certificates of the `db` variable as efivarfs shows it
/// (4 attribute bytes, then EFI_SIGNATURE_LISTs). Lists of other types
/// (hashes) are skipped; a size that does not fit is an error naming the
/// list's offset.
pub fn parse_db(bytes: &[u8]) -> Result<Vec<Certificate>, String> {
    let mut rest = bytes.get(ATTRIBUTES..).ok_or_else(|| {
        format!(
            "{} bytes, fewer than the {ATTRIBUTES} attribute bytes",
            bytes.len()
        )
    })?;
    let mut offset = ATTRIBUTES;
    let mut certificates = Vec::new();
    while !rest.is_empty() {
        let list =
            SignatureList::parse(rest).map_err(|e| format!("the signature list at byte {offset}: {e}"))?;
        if list.kind == CERT_X509 {
            certificates.extend(
                list.certificates()
                    .map_err(|e| format!("the list at byte {offset}: {e}"))?,
            );
        }
        rest = rest.get(list.size..).unwrap_or_default();
        offset += list.size;
    }
    Ok(certificates)
}

/// One EFI_SIGNATURE_LIST, checked: its size covers its header and a whole
/// number of entries, and it lies within the variable.
struct SignatureList<'a> {
    kind: [u8; 16],
    /// SignatureListSize: the bytes this list takes, never 0.
    size: usize,
    /// SignatureSize: one entry, owner GUID included.
    entry_size: usize,
    entries: &'a [u8],
}

impl<'a> SignatureList<'a> {
    fn parse(bytes: &'a [u8]) -> Result<SignatureList<'a>, String> {
        let (Some(kind), Some(size), Some(header), Some(entry_size)) = (
            bytes.get(..16).and_then(|b| <[u8; 16]>::try_from(b).ok()),
            u32_at(bytes, 16),
            u32_at(bytes, 20),
            u32_at(bytes, 24),
        ) else {
            return Err(format!(
                "{} trailing bytes, too few for a signature list ({LIST_HEADER} bytes of header)",
                bytes.len()
            ));
        };
        let body = LIST_HEADER
            .checked_add(header)
            .filter(|body| *body <= size)
            .ok_or_else(|| {
                format!("SignatureListSize {size} is smaller than its header ({LIST_HEADER} + SignatureHeaderSize {header})")
            })?;
        let entries = bytes.get(body..size).ok_or_else(|| {
            format!(
                "SignatureListSize {size} overruns the variable ({} bytes left)",
                bytes.len()
            )
        })?;
        if entry_size < OWNER {
            return Err(format!(
                "SignatureSize {entry_size} is smaller than the {OWNER}-byte owner GUID"
            ));
        }
        if entries.len() % entry_size != 0 {
            return Err(format!(
                "{} bytes of entries are not a whole number of {entry_size}-byte signatures",
                entries.len()
            ));
        }
        Ok(SignatureList {
            kind,
            size,
            entry_size,
            entries,
        })
    }

    /// The entries' data (after each owner GUID) as certificates.
    fn certificates(&self) -> Result<Vec<Certificate>, String> {
        if self.entry_size == OWNER && !self.entries.is_empty() {
            return Err("an X.509 entry holds no certificate (SignatureSize 16)".into());
        }
        Ok(self
            .entries
            .chunks_exact(self.entry_size)
            .map(|entry| Certificate {
                der: entry.get(OWNER..).unwrap_or_default().to_vec(),
            })
            .collect())
    }
}

/// The little-endian u32 at `at`, as a size.
fn u32_at(bytes: &[u8], at: usize) -> Option<usize> {
    let field = bytes.get(at..at.checked_add(4)?)?;
    usize::try_from(u32::from_le_bytes(field.try_into().ok()?)).ok()
}

/// The firmware's Secure Boot state from the efivars directory `efivars`.
/// No directory (not a UEFI boot) or no variable is off, saying which; a
/// variable that cannot be read or parsed is an error.
pub fn read_state(efivars: &Path) -> Result<State> {
    match std::fs::metadata(efivars) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok(State::Off(format!("no {}: not a UEFI boot", efivars.display())));
        }
        Err(e) => return Err(e).with_context(|| format!("reading {}", efivars.display())),
        Ok(_) => {}
    }
    let path = efivars.join(SECURE_BOOT_VAR);
    let bytes = match std::fs::read(&path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok(State::Off(format!(
                "no SecureBoot variable in {}",
                efivars.display()
            )));
        }
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    match parse_secure_boot(&bytes).map_err(|e| anyhow!("{}: {e}", path.display()))? {
        true => Ok(State::On),
        false => Ok(State::Off("the SecureBoot variable is 0".into())),
    }
}

/// The x86 boot parameters the kernel keeps, relative to the sysroot: the
/// EFI stub wrote the firmware's Secure Boot state into them at boot, which
/// holds even when EFI runtime services are off (PREEMPT_RT's default), so
/// efivarfs shows nothing.
pub const BOOT_PARAMS: &str = "sys/kernel/boot_params/data";
/// `struct boot_params.secure_boot` (arch/x86/include/uapi/asm/bootparam.h).
const BOOT_PARAMS_SECURE_BOOT: usize = 0x1ec;

/// Pure: the Secure Boot state in the x86 boot parameters (`enum
/// efi_secureboot_mode`: 0 unset, 1 unknown, 2 disabled, 3 enabled).
pub fn parse_boot_params(bytes: &[u8]) -> Result<State, String> {
    match bytes.get(BOOT_PARAMS_SECURE_BOOT) {
        Some(3) => Ok(State::On),
        Some(2) => Ok(State::Off("disabled, as the kernel's EFI stub found it".into())),
        Some(0) => Ok(State::Off(
            "the kernel was not started through its EFI stub".into(),
        )),
        Some(1) => Err("the kernel's EFI stub could not tell the Secure Boot state".into()),
        Some(other) => Err(format!("secure_boot is {other}, not a state the kernel defines")),
        None => Err(format!("{} bytes: too short for boot parameters", bytes.len())),
    }
}

/// The firmware's Secure Boot state on `system`: from the kernel's boot
/// parameters (x86), else from efivarfs.
pub fn firmware_state(system: &System) -> Result<State> {
    let params = system.path.join(BOOT_PARAMS);
    match std::fs::read(&params) {
        Ok(bytes) => parse_boot_params(&bytes).map_err(|e| anyhow!("{}: {e}", params.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => read_state(&efivars(system)),
        Err(e) => Err(e).with_context(|| format!("reading {}", params.display())),
    }
}

/// The certificates the firmware trusts: its `db` when efivarfs shows it;
/// else (EFI runtime services off) the certificate that signed the running
/// deployment's kernel, which the firmware verified to boot it.
fn trusted_certificates(system: &System, repo: &ostree::Repo) -> Result<Vec<Certificate>> {
    let db_error = match read_db(&efivars(system)) {
        Ok(certificates) if !certificates.is_empty() => return Ok(certificates),
        Ok(_) => anyhow!("db holds no X.509 certificate"),
        Err(e) => e,
    };
    let running = system.current.csum().to_string();
    let info = emberrtos_contract::ostree::read_commit(repo, &running)?;
    match emberrtos_contract::secure_boot::record_of(&info)? {
        Some(record) => {
            println!(
                "the firmware's db is not readable ({db_error:#}): trusting the certificate of the running kernel, sha256 {}",
                record.cert.fingerprint()
            );
            Ok(vec![record.cert])
        }
        None => Err(db_error.context(format!(
            "and the running commit {running} records no signed kernel"
        ))),
    }
}

/// The X.509 certificates in the firmware's `db`.
pub fn read_db(efivars: &Path) -> Result<Vec<Certificate>> {
    let path = efivars.join(DB_VAR);
    let bytes = std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
    parse_db(&bytes).map_err(|e| anyhow!("{}: {e}", path.display()))
}

/// The Secure Boot line of `emberrtos-update status` (and its JSON field):
/// `on`, `off (why)`, or `unknown (the error)`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct Status {
    /// `on`, `off` or `unknown`.
    pub state: &'static str,
    /// Why it is off, or why it is unknown.
    pub detail: Option<String>,
}

impl Status {
    pub fn of(state: Result<State>) -> Status {
        match state {
            Ok(State::On) => Status {
                state: "on",
                detail: None,
            },
            Ok(State::Off(why)) => Status {
                state: "off",
                detail: Some(why),
            },
            Err(e) => Status {
                state: "unknown",
                detail: Some(format!("{e:#}")),
            },
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.detail {
            Some(detail) => write!(f, "{} ({detail})", self.state),
            None => f.write_str(self.state),
        }
    }
}

/// What let a commit through.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Secure Boot is off (why): nothing was checked.
    Unchecked(String),
    /// Signed by the `db` certificate with this sha256 fingerprint.
    Trusted(String),
}

/// Refuses (exit 3, naming `stage` and what did not happen: `consequence`)
/// commit `checksum` when the firmware has Secure Boot on and the commit's
/// `vmlinuz` is not signed by a certificate in its `db`. Fail closed: a
/// `SecureBoot` or `db` variable that cannot be read, or a signature that
/// cannot be checked, is a refusal too. Secure Boot off: nothing is checked.
pub fn require_trusted_kernel(
    system: &System,
    repo: &ostree::Repo,
    checksum: &str,
    stage: &str,
    consequence: &str,
) -> Result<()> {
    let gate = Gate {
        checksum,
        stage,
        consequence,
    };
    let verdict = judge_with(
        firmware_state(system),
        || trusted_certificates(system, repo),
        || committed_image(repo, checksum),
        &gate,
    )?;
    match verdict {
        Verdict::Unchecked(why) => {
            println!("Secure Boot is off ({why}): the kernel's signature is not checked")
        }
        Verdict::Trusted(fingerprint) => println!(
            "Secure Boot is on: commit {checksum}'s kernel is signed by the firmware's db certificate sha256 {fingerprint}"
        ),
    }
    Ok(())
}

/// Who refuses, and what a refusal means.
struct Gate<'a> {
    checksum: &'a str,
    stage: &'a str,
    consequence: &'a str,
}

impl Gate<'_> {
    fn refuse(&self, summary: String, reasons: Vec<String>) -> anyhow::Error {
        Refused {
            stage: self.stage.into(),
            summary: format!("{summary}; {}", self.consequence),
            reasons,
        }
        .into()
    }

    /// Secure Boot is on and the kernel is not proven signed by `db`.
    fn untrusted(&self, reasons: Vec<String>) -> anyhow::Error {
        self.refuse(
            format!(
                "Secure Boot is on and commit {}'s kernel is not signed by a certificate the firmware trusts",
                self.checksum
            ),
            reasons,
        )
    }
}

/// [`judge_with`] on an efivars directory alone.
#[cfg(test)]
fn judge(efivars: &Path, image: impl FnOnce() -> Result<Vec<u8>>, gate: &Gate) -> Result<Verdict> {
    judge_with(read_state(efivars), || read_db(efivars), image, gate)
}

/// The decision: Secure Boot off lets anything through without reading the
/// kernel (`image`); on, the kernel must verify against a `trusted` certificate.
fn judge_with(
    state: Result<State>,
    trusted: impl FnOnce() -> Result<Vec<Certificate>>,
    image: impl FnOnce() -> Result<Vec<u8>>,
    gate: &Gate,
) -> Result<Verdict> {
    match state {
        Ok(State::Off(why)) => return Ok(Verdict::Unchecked(why)),
        Ok(State::On) => {}
        Err(e) => {
            return Err(gate.refuse(
                format!(
                    "the firmware's Secure Boot state cannot be read, so commit {}'s kernel signature cannot be judged",
                    gate.checksum
                ),
                vec![format!("{e:#}")],
            ));
        }
    }
    let certificates = trusted().map_err(|e| gate.untrusted(vec![format!("{e:#}")]))?;
    if certificates.is_empty() {
        return Err(gate.untrusted(vec!["db holds no X.509 certificate".into()]));
    }
    let kernel = temp_file(&image()?)?;
    let mut reasons = Vec::new();
    for certificate in &certificates {
        let fingerprint = certificate.fingerprint();
        match signed_by(kernel.path(), certificate) {
            Ok(true) => return Ok(Verdict::Trusted(fingerprint)),
            Ok(false) => reasons.push(format!(
                "db certificate sha256 {fingerprint}: the kernel's signature does not verify against it"
            )),
            Err(e) => reasons.push(format!(
                "db certificate sha256 {fingerprint}: the signature cannot be checked: {e:#}"
            )),
        }
    }
    Err(gate.untrusted(reasons))
}

/// `bytes` in a temporary file, for `sbverify`.
fn temp_file(bytes: &[u8]) -> Result<tempfile::NamedTempFile> {
    let mut file = tempfile::NamedTempFile::new().context("a temporary file for the committed kernel")?;
    file.write_all(bytes)
        .and_then(|()| file.flush())
        .context("writing the committed kernel to a temporary file")?;
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    // A self-signed test certificate (the contract's); its key was never kept.
    const CERT: &str = include_str!("../../contract/testdata/secure-boot-test-cert.pem");
    const FINGERPRINT: &str = "660a80357ab1c786b2b09dd4f25995fa10f97b6a956ac64aaa1aab136ecfcb92";
    /// EFI_CERT_SHA256_GUID c1c41626-504c-4092-aca9-41f936934328, as stored.
    const CERT_SHA256: [u8; 16] = [
        0x26, 0x16, 0xc4, 0xc1, 0x4c, 0x50, 0x92, 0x40, 0xac, 0xa9, 0x41, 0xf9, 0x36, 0x93, 0x43, 0x28,
    ];
    const ATTRS: [u8; 4] = [0x27, 0, 0, 0];

    fn cert() -> Certificate {
        Certificate::parse_pem(CERT).unwrap()
    }

    /// One EFI_SIGNATURE_LIST of `kind` with `header` and `entries` (each
    /// owner GUID + data, all of one size).
    fn list(kind: [u8; 16], header: &[u8], entries: &[Vec<u8>]) -> Vec<u8> {
        let entry_size = entries.first().map_or(OWNER + 32, |e| OWNER + e.len());
        let size = LIST_HEADER + header.len() + entries.len() * entry_size;
        let mut out = kind.to_vec();
        for field in [size, header.len(), entry_size] {
            out.extend(u32::try_from(field).unwrap().to_le_bytes());
        }
        out.extend(header);
        for data in entries {
            out.extend([0x11; OWNER]);
            out.extend(data);
        }
        out
    }

    fn db(lists: &[Vec<u8>]) -> Vec<u8> {
        let mut out = ATTRS.to_vec();
        lists.iter().for_each(|l| out.extend(l));
        out
    }

    fn with_size(mut list: Vec<u8>, at: usize, value: u32) -> Vec<u8> {
        list[at..at + 4].copy_from_slice(&value.to_le_bytes());
        list
    }

    #[test]
    fn the_boot_parameters_say_what_the_efi_stub_found() {
        let params = |mode: u8| {
            let mut bytes = vec![0u8; 4096];
            bytes[0x1ec] = mode;
            parse_boot_params(&bytes)
        };
        assert_eq!(params(3), Ok(State::On));
        assert!(matches!(params(2), Ok(State::Off(why)) if why.contains("disabled")));
        assert!(matches!(params(0), Ok(State::Off(why)) if why.contains("EFI stub")));
        assert!(params(1).unwrap_err().contains("could not tell"));
        assert!(params(9).unwrap_err().contains("9"));
        assert!(parse_boot_params(&[3; 16]).unwrap_err().contains("too short"));
    }

    #[test]
    fn the_secure_boot_variable_is_one_byte_after_the_attributes() {
        assert_eq!(parse_secure_boot(&[6, 0, 0, 0, 1]), Ok(true));
        assert_eq!(parse_secure_boot(&[6, 0, 0, 0, 0]), Ok(false));
        assert!(
            parse_secure_boot(&[6, 0, 0, 0, 2])
                .unwrap_err()
                .contains("value 2")
        );
        for bad in [&[][..], &[6, 0, 0, 0], &[6, 0, 0, 0, 1, 0]] {
            assert!(parse_secure_boot(bad).unwrap_err().contains("bytes"), "{bad:?}");
        }
    }

    #[test]
    fn db_keeps_the_x509_certificates_and_skips_hashes() {
        let der = cert().der;
        let bytes = db(&[
            list(CERT_SHA256, &[], &[vec![0xaa; 32], vec![0xbb; 32]]),
            list(CERT_X509, &[], std::slice::from_ref(&der)),
            list(CERT_X509, &[1, 2, 3], &[vec![7; 5], vec![8; 5]]),
        ]);
        let certificates = parse_db(&bytes).unwrap();
        assert_eq!(certificates.len(), 3);
        assert_eq!(certificates[0].fingerprint(), FINGERPRINT);
        assert_eq!(certificates[1].der, vec![7; 5]);
        assert_eq!(certificates[2].der, vec![8; 5]);
        assert_eq!(parse_db(&ATTRS), Ok(vec![]));
        assert_eq!(
            parse_db(&db(&[list(CERT_SHA256, &[], &[vec![0; 32]])])),
            Ok(vec![])
        );
    }

    #[test]
    fn a_malformed_db_is_an_error_naming_the_size() {
        let good = list(CERT_X509, &[], &[vec![1; 8]]);
        let error = |bytes: Vec<u8>| parse_db(&bytes).unwrap_err();
        assert!(error(vec![0, 0]).contains("attribute bytes"));
        // SignatureListSize below its header (which would never advance).
        assert!(error(db(&[with_size(good.clone(), 16, 0)])).contains("smaller than its header"));
        assert!(error(db(&[with_size(good.clone(), 20, 30)])).contains("smaller than its header"));
        assert!(error(db(&[with_size(good.clone(), 20, u32::MAX)])).contains("smaller than its header"));
        // Entries that overrun the list, or the list the variable.
        assert!(error(db(&[with_size(good.clone(), 24, 30)])).contains("whole number"));
        assert!(error(db(&[with_size(good.clone(), 16, 200)])).contains("overruns"));
        assert!(error(db(&[with_size(good.clone(), 24, 15)])).contains("SignatureSize 15"));
        assert!(error(db(&[with_size(good.clone(), 24, 0)])).contains("SignatureSize 0"));
        assert!(error(db(&[list(CERT_X509, &[], &[vec![]])])).contains("holds no certificate"));
        // Trailing garbage after a good list, named by its offset.
        let mut trailing = db(std::slice::from_ref(&good));
        trailing.extend([0xff; 5]);
        let message = error(trailing);
        assert!(
            message.contains(&format!("byte {}", ATTRIBUTES + good.len())),
            "{message}"
        );
        assert!(message.contains("5 trailing bytes"), "{message}");
    }

    proptest::proptest! {
        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..512)) {
            let _ = parse_db(&bytes);
            let _ = parse_secure_boot(&bytes);
        }

        #[test]
        fn random_sizes_never_panic(
            sizes in proptest::collection::vec(proptest::num::u32::ANY, 3),
            tail in proptest::collection::vec(proptest::num::u8::ANY, 0..256),
        ) {
            let mut bytes = ATTRS.to_vec();
            bytes.extend(CERT_X509);
            sizes.iter().for_each(|s| bytes.extend(s.to_le_bytes()));
            bytes.extend(tail);
            let _ = parse_db(&bytes);
        }
    }

    /// An efivars directory with the given variables.
    fn efivars_with(secure_boot: Option<u8>, db: Option<&[u8]>) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        if let Some(value) = secure_boot {
            std::fs::write(dir.path().join(SECURE_BOOT_VAR), [6, 0, 0, 0, value]).unwrap();
        }
        if let Some(db) = db {
            std::fs::write(dir.path().join(DB_VAR), db).unwrap();
        }
        dir
    }

    const GATE: Gate = Gate {
        checksum: "abc123",
        stage: "update",
        consequence: "not deployed",
    };

    fn refused(result: Result<Verdict>) -> Refused {
        let error = result.unwrap_err();
        assert_eq!(emberrtos_contract::error::exit_code(&error), 3, "{error:#}");
        error.downcast::<Refused>().unwrap()
    }

    #[test]
    fn secure_boot_off_checks_nothing_and_says_why() {
        let never = || -> Result<Vec<u8>> { panic!("the kernel was read with Secure Boot off") };
        let off = efivars_with(Some(0), None);
        assert_eq!(
            judge(off.path(), never, &GATE).unwrap(),
            Verdict::Unchecked("the SecureBoot variable is 0".into())
        );
        let no_variable = efivars_with(None, None);
        let Verdict::Unchecked(why) = judge(no_variable.path(), never, &GATE).unwrap() else {
            panic!("checked")
        };
        assert!(why.contains("no SecureBoot variable"), "{why}");
        let missing = off.path().join("no-efivars");
        let Verdict::Unchecked(why) = judge(&missing, never, &GATE).unwrap() else {
            panic!("checked")
        };
        assert!(why.contains("not a UEFI boot"), "{why}");
        assert_eq!(Status::of(read_state(&missing)).state, "off");
        assert_eq!(
            Status::of(read_state(off.path())).to_string(),
            "off (the SecureBoot variable is 0)"
        );
    }

    #[test]
    fn secure_boot_on_refuses_an_unsigned_kernel_naming_the_certificate() {
        let efivars = efivars_with(Some(1), Some(&db(&[list(CERT_X509, &[], &[cert().der])])));
        assert_eq!(Status::of(read_state(efivars.path())).to_string(), "on");
        let refusal = refused(judge(
            efivars.path(),
            || Ok(b"MZ, but no signature".to_vec()),
            &GATE,
        ));
        assert_eq!(refusal.stage, "update");
        assert!(refusal.summary.starts_with("Secure Boot is on"), "{refusal}");
        assert!(
            refusal
                .summary
                .contains("abc123's kernel is not signed by a certificate the firmware trusts"),
            "{refusal}"
        );
        assert!(refusal.summary.ends_with("not deployed"), "{refusal}");
        assert_eq!(refusal.reasons.len(), 1, "{refusal}");
        assert!(refusal.reasons[0].contains(FINGERPRINT), "{refusal}");
    }

    #[test]
    fn secure_boot_on_fails_closed() {
        let never = || -> Result<Vec<u8>> { panic!("read the kernel") };
        let empty = efivars_with(Some(1), Some(&db(&[list(CERT_SHA256, &[], &[vec![0; 32]])])));
        let refusal = refused(judge(empty.path(), never, &GATE));
        assert_eq!(refusal.reasons, ["db holds no X.509 certificate"]);
        let no_db = efivars_with(Some(1), None);
        let refusal = refused(judge(no_db.path(), never, &GATE));
        assert!(refusal.summary.starts_with("Secure Boot is on"), "{refusal}");
        assert!(refusal.reasons[0].contains(DB_VAR), "{refusal}");
        let broken_db = efivars_with(Some(1), Some(&[0, 0]));
        assert!(refused(judge(broken_db.path(), never, &GATE)).reasons[0].contains("attribute bytes"));
        let broken = efivars_with(Some(7), None);
        let refusal = refused(judge(broken.path(), never, &GATE));
        assert!(
            refusal.summary.contains("Secure Boot state cannot be read"),
            "{refusal}"
        );
        assert_eq!(Status::of(read_state(broken.path())).state, "unknown");
    }

    fn skip(test: &str, why: &str) {
        eprintln!("SKIPPED {test}: {why}");
    }

    /// Runs `program` with `args` in `dir`; its stderr when it fails.
    fn run(dir: &Path, program: &str, args: &[&str]) -> Result<(), String> {
        let out = Command::new(program)
            .args(args)
            .current_dir(dir)
            .output()
            .map_err(|e| format!("{program}: {e}"))?;
        match out.status.success() {
            true => Ok(()),
            false => Err(format!("{program}: {}", String::from_utf8_lossy(&out.stderr))),
        }
    }

    fn on_path(program: &str) -> bool {
        std::env::var_os("PATH")
            .is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join(program).is_file()))
    }

    /// A key and certificate (`<name>.key`, `<name>.crt`) made with openssl.
    fn certificate(dir: &Path, name: &str) -> Result<Certificate, String> {
        let (key, crt) = (format!("{name}.key"), format!("{name}.crt"));
        let subject = format!("/CN={name}/");
        run(
            dir,
            "openssl",
            &[
                "req", "-new", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", &key, "-out", &crt,
                "-subj", &subject, "-days", "1",
            ],
        )?;
        Certificate::parse_pem(&std::fs::read_to_string(dir.join(&crt)).map_err(|e| e.to_string())?)
    }

    /// An unsigned PE (GRUB's EFI image), and it signed by `name`'s key.
    fn signed_pe(dir: &Path, name: &str) -> Result<(Vec<u8>, Vec<u8>), String> {
        run(
            dir,
            "grub-mkimage",
            &["-O", "x86_64-efi", "-p", "/", "-o", "unsigned.efi", "normal"],
        )?;
        let (key, crt) = (format!("{name}.key"), format!("{name}.crt"));
        run(
            dir,
            "sbsign",
            &[
                "--key",
                &key,
                "--cert",
                &crt,
                "--output",
                "signed.efi",
                "unsigned.efi",
            ],
        )?;
        let read = |file: &str| std::fs::read(dir.join(file)).map_err(|e| e.to_string());
        Ok((read("unsigned.efi")?, read("signed.efi")?))
    }

    #[test]
    fn a_kernel_signed_by_a_db_certificate_passes_and_others_are_refused() {
        const TEST: &str = "a_kernel_signed_by_a_db_certificate_passes_and_others_are_refused";
        let dir = tempfile::tempdir().unwrap();
        let made = certificate(dir.path(), "trusted").and_then(|trusted| {
            let other = certificate(dir.path(), "other")?;
            let (unsigned, signed) = signed_pe(dir.path(), "trusted")?;
            match on_path("sbverify") {
                true => Ok((trusted, other, unsigned, signed)),
                false => Err("sbverify is not installed (sbsigntool)".into()),
            }
        });
        let (trusted, other, unsigned, signed) = match made {
            Ok(made) => made,
            Err(why) => return skip(TEST, &why),
        };
        let both = db(&[
            list(CERT_X509, &[], std::slice::from_ref(&other.der)),
            list(CERT_X509, &[], std::slice::from_ref(&trusted.der)),
        ]);
        let efivars = efivars_with(Some(1), Some(&both));
        assert_eq!(
            judge(efivars.path(), || Ok(signed.clone()), &GATE).unwrap(),
            Verdict::Trusted(trusted.fingerprint())
        );
        let refusal = refused(judge(efivars.path(), || Ok(unsigned), &GATE));
        assert_eq!(refusal.reasons.len(), 2, "{refusal}");
        assert!(refusal.reasons[0].contains(&other.fingerprint()), "{refusal}");
        assert!(refusal.reasons[1].contains(&trusted.fingerprint()), "{refusal}");
        // Signed, but by a key the firmware does not trust.
        let only_other = efivars_with(
            Some(1),
            Some(&db(&[list(CERT_X509, &[], std::slice::from_ref(&other.der))])),
        );
        let refusal = refused(judge(only_other.path(), || Ok(signed), &GATE));
        assert!(refusal.reasons[0].contains(&other.fingerprint()), "{refusal}");
    }
}
