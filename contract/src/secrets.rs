//! Private key material recognised wherever a public key or a shipped file
//! is expected: the secrets scan of image trees and the key checks of
//! remotes and media.

/// The label of the first private key block in `text`: a line that is
/// `-----BEGIN <label>-----` where the label names a private key
/// (`PRIVATE KEY`, `RSA PRIVATE KEY`, `OPENSSH PRIVATE KEY`,
/// `ENCRYPTED PRIVATE KEY`, `PGP PRIVATE KEY BLOCK`, ...). The marker must
/// end its line, so a program quoting it in a string is not a key.
pub fn private_key_label(text: &[u8]) -> Option<String> {
    const BEGIN: &[u8] = b"-----BEGIN ";
    const DASHES: &[u8] = b"-----";
    text.split(|&b| b == b'\n').find_map(|line| {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let label = line
            .trim_ascii_start()
            .strip_prefix(BEGIN)?
            .strip_suffix(DASHES)?;
        let label = std::str::from_utf8(label).ok()?;
        let private = label == "PRIVATE KEY"
            || label.ends_with(" PRIVATE KEY")
            || label.ends_with(" PRIVATE KEY BLOCK");
        private.then(|| label.to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn private_key_labels() {
        for (text, label) in [
            (
                "-----BEGIN OPENSSH PRIVATE KEY-----\nb3Bl\n",
                Some("OPENSSH PRIVATE KEY"),
            ),
            (
                "x\r\n-----BEGIN RSA PRIVATE KEY-----\r\nProc-Type: 4,ENCRYPTED\r\n",
                Some("RSA PRIVATE KEY"),
            ),
            ("-----BEGIN PRIVATE KEY-----\nMII\n", Some("PRIVATE KEY")),
            (
                "cert\n-----BEGIN ENCRYPTED PRIVATE KEY-----\n",
                Some("ENCRYPTED PRIVATE KEY"),
            ),
            ("  -----BEGIN EC PRIVATE KEY-----\n", Some("EC PRIVATE KEY")),
            (
                "-----BEGIN PGP PRIVATE KEY BLOCK-----\n",
                Some("PGP PRIVATE KEY BLOCK"),
            ),
            ("-----BEGIN CERTIFICATE-----\nMII\n", None),
            ("-----BEGIN PUBLIC KEY-----\nMII\n", None),
            ("-----BEGIN PGP PUBLIC KEY BLOCK-----\n", None),
            ("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAA host\n", None),
            ("const char *m = \"-----BEGIN RSA PRIVATE KEY-----\";\n", None),
            (
                "if (!strcmp(l, \"-----BEGIN OPENSSH PRIVATE KEY-----\\n\"))\n",
                None,
            ),
            ("-----BEGIN NOT A PRIVATE KEYS-----\n", None),
            ("", None),
        ] {
            assert_eq!(private_key_label(text.as_bytes()).as_deref(), label, "{text:?}");
        }
    }
}
