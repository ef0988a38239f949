//! Armored detached OpenPGP signatures with the real `gpg`: what anyone can
//! check with `gpg --verify RECORD.sig RECORD`. libostree signs commits and
//! summaries itself; this is for the files beside them (qualification and
//! promotion records).

use std::io::Write;
use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::tool;

/// What `gpg --verify --status-fd` said about one detached signature.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Verification {
    /// GOODSIG and VALIDSIG, and no bad or error status.
    pub good: bool,
    /// The primary key's fingerprint from VALIDSIG.
    pub primary_fingerprint: Option<String>,
    /// The signing (sub)key's fingerprint from VALIDSIG.
    pub signing_fingerprint: Option<String>,
    /// Why it is not good, in gpg's terms.
    pub problem: Option<String>,
}

impl Verification {
    /// Good, and made by the key whose primary fingerprint is `primary`
    /// (by it or one of its subkeys).
    pub fn good_by(&self, primary: &str) -> bool {
        self.good
            && self
                .primary_fingerprint
                .as_ref()
                .is_some_and(|f| f.eq_ignore_ascii_case(primary))
    }
}

/// Parses gpg's `--status-fd` lines (pure). Any BADSIG, ERRSIG, EXPSIG,
/// EXPKEYSIG, REVKEYSIG or NO_PUBKEY makes it not good.
pub fn parse_status(status: &str) -> Verification {
    let mut verification = Verification::default();
    let (mut goodsig, mut validsig) = (false, false);
    for line in status.lines() {
        let Some(rest) = line.strip_prefix("[GNUPG:] ") else {
            continue;
        };
        let fields: Vec<&str> = rest.split(' ').collect();
        match fields[0] {
            "GOODSIG" => goodsig = true,
            "VALIDSIG" => {
                validsig = true;
                verification.signing_fingerprint = fields.get(1).map(|s| s.to_string());
                verification.primary_fingerprint = fields.get(10).map(|s| s.to_string());
            }
            word @ ("BADSIG" | "ERRSIG" | "EXPSIG" | "EXPKEYSIG" | "REVKEYSIG" | "NO_PUBKEY") => {
                verification
                    .problem
                    .get_or_insert_with(|| problem_text(word).to_string());
            }
            _ => {}
        }
    }
    verification.good = goodsig && validsig && verification.problem.is_none();
    if !verification.good && verification.problem.is_none() {
        verification.problem = Some("no valid signature".into());
    }
    verification
}

fn problem_text(status: &str) -> &'static str {
    match status {
        "BADSIG" => "BAD signature: the file changed after it was signed",
        "ERRSIG" | "NO_PUBKEY" => "cannot check the signature (unknown key or algorithm)",
        "EXPSIG" => "the signature has expired",
        "EXPKEYSIG" => "signed by an expired key",
        _ => "signed by a revoked key",
    }
}

fn gpg(homedir: Option<&Path>) -> Result<Command> {
    let mut cmd = tool::command("gpg")?;
    // A planted signature must not make gpg fetch its key from anywhere.
    cmd.args(["--batch", "--no-tty", "--no-auto-key-retrieve"]);
    if let Some(dir) = homedir {
        cmd.arg("--homedir").arg(dir);
    }
    Ok(cmd)
}

fn temp_with(bytes: &[u8]) -> Result<tempfile::NamedTempFile> {
    let mut file = tempfile::NamedTempFile::new().context("creating a temp file for gpg")?;
    file.write_all(bytes)?;
    file.flush()?;
    Ok(file)
}

/// An armored detached signature of `data` by `key`.
pub fn sign_detached(data: &[u8], key: &str, homedir: Option<&Path>) -> Result<Vec<u8>> {
    let input = temp_with(data)?;
    let mut cmd = gpg(homedir)?;
    cmd.args(["--armor", "--detach-sign", "--local-user", key, "--output", "-"])
        .arg(input.path());
    let output = tool::run(&mut cmd).with_context(|| format!("signing with GPG key {key}"))?;
    if !output.stdout.starts_with(b"-----BEGIN PGP SIGNATURE-----") {
        bail!("gpg wrote no armored signature for key {key}");
    }
    Ok(output.stdout)
}

/// The public key of the one key `key` names (its primary fingerprint),
/// armored.
pub fn export_public(key: &str, homedir: Option<&Path>) -> Result<Vec<u8>> {
    let fingerprint = primary_fingerprint(key, homedir)?;
    let mut cmd = gpg(homedir)?;
    cmd.args(["--armor", "--export", "--", &fingerprint]);
    let output = tool::run(&mut cmd).with_context(|| format!("exporting GPG key {key}"))?;
    if !output.stdout.starts_with(b"-----BEGIN PGP PUBLIC KEY BLOCK-----") {
        bail!("gpg exported no public key for {key}");
    }
    Ok(output.stdout)
}

/// Checks a detached `signature` of `data`. gpg's exit status must agree
/// with its status lines for the signature to count.
pub fn verify_detached(data: &[u8], signature: &[u8], homedir: Option<&Path>) -> Result<Verification> {
    let (data_file, sig_file) = (temp_with(data)?, temp_with(signature)?);
    let mut cmd = gpg(homedir)?;
    cmd.args(["--status-fd", "1", "--verify"])
        .arg(sig_file.path())
        .arg(data_file.path());
    let output = cmd.output().context("running gpg --verify")?;
    let mut verification = parse_status(&String::from_utf8_lossy(&output.stdout));
    if verification.good && !output.status.success() {
        verification.good = false;
        verification.problem = Some(format!("gpg --verify failed ({})", output.status));
    }
    Ok(verification)
}

/// The primary fingerprint of the one key `key` names. gpg matches user ids
/// by substring, so a name that matches several keys (another key's user id
/// may contain it) is refused: a signature by the wrong key must not count.
pub fn primary_fingerprint(key: &str, homedir: Option<&Path>) -> Result<String> {
    let mut cmd = gpg(homedir)?;
    cmd.args(["--with-colons", "--fingerprint", "--list-keys", "--", key]);
    let output = tool::run(&mut cmd).with_context(|| format!("GPG key {key} is not in the keyring"))?;
    match parse_primary_fingerprints(&String::from_utf8_lossy(&output.stdout)).as_slice() {
        [one] => Ok(one.clone()),
        [] => bail!("GPG key {key} is not in the keyring"),
        many => bail!(
            "GPG key {key} names {} keys ({}): give the fingerprint of one",
            many.len(),
            many.join(", ")
        ),
    }
}

/// A keyring of its own, in a throwaway homedir, holding only the OpenPGP
/// public key(s) of one file: what a pinned key is checked with. Nothing
/// from the user's keyring (or any other key) can make a signature good.
#[derive(Debug)]
pub struct PinnedKeyring {
    home: tempfile::TempDir,
    /// The primary fingerprints of the keys imported.
    pub fingerprints: Vec<String>,
}

impl PinnedKeyring {
    /// Imports `public_key` (already checked to be a public key) into a
    /// fresh homedir.
    pub fn import(public_key: &[u8]) -> Result<PinnedKeyring> {
        let home = tempfile::Builder::new()
            .prefix("imgbuild-gpg-")
            .tempdir()
            .context("creating a throwaway GnuPG home")?;
        let key_file = temp_with(public_key)?;
        let mut cmd = gpg(Some(home.path()))?;
        cmd.arg("--import").arg(key_file.path());
        tool::run(&mut cmd).context("importing the pinned key")?;
        let mut cmd = gpg(Some(home.path()))?;
        cmd.args(["--with-colons", "--fingerprint", "--list-keys"]);
        let listing = tool::run(&mut cmd).context("listing the pinned key")?;
        let fingerprints = parse_primary_fingerprints(&String::from_utf8_lossy(&listing.stdout));
        if fingerprints.is_empty() {
            bail!("gpg imported no key from it");
        }
        Ok(PinnedKeyring { home, fingerprints })
    }

    /// Checks a detached `signature` of `data` with this keyring alone.
    pub fn verify(&self, data: &[u8], signature: &[u8]) -> Result<Verification> {
        verify_detached(data, signature, Some(self.home.path()))
    }

    /// The pinned keys as a binary keyring, `trusted.gpg` in a new
    /// directory: the form libostree verifies commits with.
    pub fn ostree_keyring_dir(&self) -> Result<tempfile::TempDir> {
        let dir = tempfile::Builder::new()
            .prefix("imgbuild-keyring-")
            .tempdir()
            .context("creating a keyring directory")?;
        let mut cmd = gpg(Some(self.home.path()))?;
        cmd.arg("--export");
        let exported = tool::run(&mut cmd).context("exporting the pinned key")?;
        std::fs::write(dir.path().join("trusted.gpg"), exported.stdout).context("writing the keyring")?;
        Ok(dir)
    }

    /// Good, and by one of the pinned keys (or a subkey of one).
    pub fn good(&self, verification: &Verification) -> bool {
        self.fingerprints.iter().any(|f| verification.good_by(f))
    }
}

impl Drop for PinnedKeyring {
    /// gpg may have started an agent for the throwaway home: stop it.
    fn drop(&mut self) {
        if let Ok(mut cmd) = tool::command("gpgconf") {
            let _ = cmd
                .arg("--homedir")
                .arg(self.home.path())
                .args(["--kill", "all"])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .status();
        }
    }
}

/// The primary keys' fingerprints in `gpg --with-colons` output (pure): the
/// `fpr` record right after each `pub` record.
pub fn parse_primary_fingerprints(colons: &str) -> Vec<String> {
    let mut fingerprints = Vec::new();
    let mut after_pub = false;
    for line in colons.lines() {
        if let Some(rest) = line.strip_prefix("fpr:") {
            if after_pub && let Some(fpr) = rest.split(':').nth(8).filter(|f| !f.is_empty()) {
                fingerprints.push(fpr.to_string());
            }
            after_pub = false;
        } else {
            after_pub = line.starts_with("pub:");
        }
    }
    fingerprints
}

/// Throwaway signing keys for unit tests.
#[cfg(test)]
pub(crate) mod test_keys {
    use std::path::Path;
    use std::process::Command;

    /// A passphrase-less ed25519 key `name` in its own homedir; its
    /// armored public key and fingerprint.
    pub struct TestKey {
        pub home: tempfile::TempDir,
        pub fingerprint: String,
        pub public: Vec<u8>,
    }

    fn gpg(home: &Path, args: &[&str]) -> Vec<u8> {
        let out = Command::new("gpg")
            .arg("--homedir")
            .arg(home)
            .args(["--batch", "--passphrase", ""])
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "gpg {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    }

    impl TestKey {
        pub fn generate(name: &str) -> TestKey {
            let home = tempfile::Builder::new().prefix("gpg").tempdir_in("/tmp").unwrap();
            let uid = format!("{name} <{name}@example.org>");
            gpg(
                home.path(),
                &["--quick-gen-key", &uid, "ed25519", "sign", "never"],
            );
            let colons = gpg(home.path(), &["--with-colons", "--fingerprint", "--list-keys"]);
            let fingerprint = super::parse_primary_fingerprints(&String::from_utf8_lossy(&colons))
                .pop()
                .unwrap();
            let public = gpg(home.path(), &["--armor", "--export", &fingerprint]);
            TestKey {
                home,
                fingerprint,
                public,
            }
        }

        pub fn sign(&self, data: &[u8]) -> Vec<u8> {
            super::sign_detached(data, &self.fingerprint, Some(self.home.path())).unwrap()
        }
    }

    impl Drop for TestKey {
        fn drop(&mut self) {
            let _ = Command::new("gpgconf")
                .arg("--homedir")
                .arg(self.home.path())
                .args(["--kill", "all"])
                .status();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "[GNUPG:] NEWSIG\n[GNUPG:] KEY_CONSIDERED AAAA 0\n[GNUPG:] SIG_ID x 2026-12-01 1\n\
[GNUPG:] GOODSIG 1122334455667788 imgbuild <ci@example.org>\n\
[GNUPG:] VALIDSIG SUBKEYFPR 2026-12-01 1764547200 0 4 0 22 10 00 PRIMARYFPR\n\
[GNUPG:] TRUST_ULTIMATE 0 pgp\n";

    #[test]
    fn a_good_signature_names_its_keys() {
        let v = parse_status(GOOD);
        assert!(v.good, "{v:?}");
        assert_eq!(v.primary_fingerprint.as_deref(), Some("PRIMARYFPR"));
        assert_eq!(v.signing_fingerprint.as_deref(), Some("SUBKEYFPR"));
        assert!(v.good_by("primaryfpr"));
        // Only the primary key names who signed.
        assert!(!v.good_by("SUBKEYFPR"));
        assert!(!v.good_by("OTHER"));
        // A suffix of a fingerprint is not the fingerprint.
        assert!(!v.good_by("FPR"));
    }

    #[test]
    fn bad_or_missing_statuses_are_not_good() {
        let bad = parse_status("[GNUPG:] NEWSIG\n[GNUPG:] BADSIG 1122334455667788 someone\n");
        assert!(!bad.good);
        assert!(bad.problem.unwrap().contains("BAD signature"));
        let unknown = parse_status("[GNUPG:] ERRSIG 1122 1 10 00 1764547200 9 -\n[GNUPG:] NO_PUBKEY 1122\n");
        assert!(!unknown.good);
        assert!(unknown.problem.unwrap().contains("unknown key"));
        let goodsig_only = parse_status("[GNUPG:] GOODSIG 11 x\n");
        assert!(!goodsig_only.good);
        assert_eq!(parse_status("").problem.as_deref(), Some("no valid signature"));
        let mixed = format!("{GOOD}[GNUPG:] EXPKEYSIG 11 x\n");
        assert!(!parse_status(&mixed).good);
        // Status words inside a user id are not statuses.
        assert!(!parse_status("gpg: [GNUPG:] GOODSIG\n").good);
    }

    #[test]
    fn a_pinned_keyring_counts_only_its_own_keys_signatures() {
        use test_keys::TestKey;
        let (pinned, other) = (TestKey::generate("pinned"), TestKey::generate("other"));
        let ring = PinnedKeyring::import(&pinned.public).unwrap();
        assert_eq!(ring.fingerprints, std::slice::from_ref(&pinned.fingerprint));
        assert!(ring.good(&ring.verify(b"data", &pinned.sign(b"data")).unwrap()));
        let by_other = ring.verify(b"data", &other.sign(b"data")).unwrap();
        assert!(!by_other.good && !ring.good(&by_other), "{by_other:?}");
        let changed = ring.verify(b"datA", &pinned.sign(b"data")).unwrap();
        assert!(!ring.good(&changed), "{changed:?}");
        assert!(PinnedKeyring::import(b"not a key").is_err());
    }

    #[test]
    fn primary_fingerprints_follow_pub_records() {
        let colons = "tru::1:1764547200:0:3:1:5\npub:u:255:22:1122334455667788:1764547200:::u:::scESC:::::ed25519:::0:\n\
fpr:::::::::AAAABBBBCCCCDDDDEEEEFFFF0000111122223333:\nuid:u::::1764547200::X::imgbuild <ci@example.org>::::::::::0:\n\
sub:u:255:18:99:1764547200::::::e:::::cv25519::\nfpr:::::::::9999888877776666555544443333222211110000:\n";
        assert_eq!(
            parse_primary_fingerprints(colons),
            vec!["AAAABBBBCCCCDDDDEEEEFFFF0000111122223333".to_string()]
        );
        let two = format!("{colons}pub:u:255:22:55:1::::::scESC:\nfpr:::::::::1234:\n");
        assert_eq!(parse_primary_fingerprints(&two).len(), 2);
        assert!(parse_primary_fingerprints("pub:u:255\n").is_empty());
    }
}
