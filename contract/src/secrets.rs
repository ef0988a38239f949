//! Private key material recognised wherever a public key or a shipped file
//! is expected: the secrets scan of image trees and the key checks of
//! remotes and media, down to the packets of an OpenPGP key file.

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

// ---- OpenPGP packets (RFC 9580, 4.2-4.3): what a key file really holds. ----

/// Packet tags of private key material: secret key (5) and secret subkey (7).
pub const OPENPGP_SECRET_TAGS: [u8; 2] = [5, 7];

/// The packets of an OpenPGP stream, as far as their headers can be read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Packets {
    pub packets: Vec<Packet>,
    /// The offset of a byte that starts no packet, where the walk stopped.
    pub unreadable: Option<usize>,
}

/// One packet of an OpenPGP packet stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Packet {
    /// Where its header starts.
    pub offset: usize,
    pub tag: u8,
}

/// Every packet of a binary OpenPGP stream, in order, each header read
/// with its length (old format: one, two, four octets or indeterminate; new
/// format: one, two, five octets or a chain of partial lengths). A body that
/// runs to or past the end ends the stream: no further header can hide in
/// it. A byte that starts no packet stops the walk. Linear in the data:
/// every step moves forward at least one byte.
pub fn openpgp_packets(data: &[u8]) -> Packets {
    let mut read = Packets::default();
    let mut at = 0;
    while at < data.len() {
        let Some(tag) = packet_tag(data[at]) else {
            read.unreadable = Some(at);
            break;
        };
        read.packets.push(Packet { offset: at, tag });
        match packet_end(data, at) {
            Some(end) => at = end,
            None => break,
        }
    }
    read
}

/// The tag of a packet header's first octet; `None` when bit 7 is clear.
fn packet_tag(ctb: u8) -> Option<u8> {
    match ctb {
        _ if ctb & 0x80 == 0 => None,
        _ if ctb & 0x40 != 0 => Some(ctb & 0x3f),
        _ => Some((ctb >> 2) & 0x0f),
    }
}

/// Where the packet at `at` ends; `None` when its length is cut off or
/// indeterminate (the body runs to the end).
fn packet_end(data: &[u8], at: usize) -> Option<usize> {
    if data[at] & 0x40 != 0 {
        return new_format_end(data, at + 1);
    }
    let octets = match data[at] & 0x03 {
        0 => 1,
        1 => 2,
        2 => 4,
        _ => return None,
    };
    let length = big_endian(data.get(at + 1..at + 1 + octets)?);
    (at + 1 + octets).checked_add(length)
}

/// The end of a new-format body whose first length octet is at `at`:
/// partial lengths (224-254) chain chunks until a final length.
fn new_format_end(data: &[u8], mut at: usize) -> Option<usize> {
    loop {
        let first = *data.get(at)?;
        let (octets, length) = match first {
            0..=191 => (1, usize::from(first)),
            192..=223 => {
                let second = usize::from(*data.get(at + 1)?);
                (2, ((usize::from(first) - 192) << 8) + second + 192)
            }
            255 => (5, big_endian(data.get(at + 1..at + 5)?)),
            partial => (1, 1 << (partial & 0x1f)),
        };
        at = at.checked_add(octets)?.checked_add(length)?;
        if !(224..=254).contains(&first) {
            return Some(at);
        }
    }
}

fn big_endian(octets: &[u8]) -> usize {
    octets.iter().fold(0, |n, &b| (n << 8) | usize::from(b))
}

/// The decoded bodies of every ASCII-armored block `label` in `text`
/// (`PGP PUBLIC KEY BLOCK`): armor headers (`Key: value`) and the `=`
/// checksum line left out, the rest read as base64. `Err` says what is not
/// base64.
pub fn openpgp_armored(text: &[u8], label: &str) -> Result<Vec<Vec<u8>>, String> {
    let (begin, end) = (
        format!("-----BEGIN {label}-----"),
        format!("-----END {label}-----"),
    );
    let mut blocks = Vec::new();
    let mut body: Option<Vec<u8>> = None;
    for line in text.split(|&b| b == b'\n').map(<[u8]>::trim_ascii) {
        match &mut body {
            None if line == begin.as_bytes() => body = Some(Vec::new()),
            None => {}
            Some(_) if line == end.as_bytes() => blocks.push(base64(&body.take().unwrap_or_default())?),
            Some(text) if !line.starts_with(b"=") && !line.contains(&b':') => text.extend_from_slice(line),
            Some(_) => {}
        }
    }
    if let Some(text) = body {
        blocks.push(base64(&text)?);
    }
    Ok(blocks)
}

/// Standard base64; `=` padding ends the data, and nothing may follow it.
fn base64(text: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Vec::with_capacity(text.len() / 4 * 3);
    let (mut bits, mut count) = (0u32, 0);
    let mut padded = false;
    for &c in text {
        let value = match c {
            b'=' => {
                padded = true;
                continue;
            }
            _ if padded => return Err("the armored key continues after its base64 padding".into()),
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return Err(format!("the armored key is not base64 (byte {c:#04x})")),
        };
        bits = (bits << 6) | u32::from(value);
        count += 6;
        if count >= 8 {
            count -= 8;
            out.push((bits >> count) as u8);
            bits &= (1 << count) - 1;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openpgp_packet_headers_of_every_length_form_are_walked() {
        let tags = |data: &[u8]| -> Vec<u8> {
            let read = openpgp_packets(data);
            assert_eq!(read.unreadable, None, "{data:02x?}");
            read.packets.iter().map(|p| p.tag).collect()
        };
        // Old format: tag 6 with one-, two- and four-octet lengths, then tag 13 indeterminate.
        let mut old = vec![0x98, 2, 0xaa, 0xbb, 0x99, 0, 1, 0xcc, 0x9a, 0, 0, 0, 1, 0xdd];
        old.extend([0xb7, 1, 2, 3]);
        assert_eq!(tags(&old), [6, 6, 6, 13]);
        // New format: one-, two- (192 + 1) and five-octet lengths, then partial chunks.
        let mut new = vec![0xc6, 1, 0];
        new.extend([0xce, 192, 1]);
        new.extend(vec![0; 193]);
        new.extend([0xcd, 255, 0, 0, 0, 2, b'i', b'd']);
        new.extend([0xcb, 0xe1, 0, 0, 0x01, 0]); // partial 2 bytes, then a final 1
        new.extend([0xc7, 0]);
        assert_eq!(tags(&new), [6, 14, 13, 11, 7]);
        // A body cut off ends the stream; a byte with bit 7 clear starts no packet.
        assert_eq!(tags(&[0x99, 0x01, 0x0d, 0x04]), [6]);
        assert_eq!(tags(&[0xc6, 0xff, 0xff]), [6]);
        assert_eq!(tags(&[0xc6, 0xe5]), [6]);
        let stopped = openpgp_packets(&[0xc6, 0, 0x41, 0xc5, 0]);
        assert_eq!(stopped.packets, [Packet { offset: 0, tag: 6 }]);
        assert_eq!(stopped.unreadable, Some(2));
        assert_eq!(tags(&[]), Vec::<u8>::new());
    }

    #[test]
    fn armored_blocks_are_decoded_without_headers_or_checksum() {
        let text = b"x\n-----BEGIN PGP PUBLIC KEY BLOCK-----\nComment: c\n\nmQIN\nBA==\n=abcd\n-----END PGP PUBLIC KEY BLOCK-----\n";
        assert_eq!(
            openpgp_armored(text, "PGP PUBLIC KEY BLOCK").unwrap(),
            [vec![0x99, 0x02, 0x0d, 0x04]]
        );
        assert!(openpgp_armored(text, "PGP MESSAGE").unwrap().is_empty());
        let bad = b"-----BEGIN PGP PUBLIC KEY BLOCK-----\nmQ*N\n";
        assert!(openpgp_armored(bad, "PGP PUBLIC KEY BLOCK").is_err());
        let after_padding = b"-----BEGIN PGP PUBLIC KEY BLOCK-----\nmQ==\nlQ\n";
        assert!(openpgp_armored(after_padding, "PGP PUBLIC KEY BLOCK").is_err());
    }

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
