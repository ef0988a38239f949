//! x86 bzImage setup header (Documentation/arch/x86/boot.rst).

use serde::{Deserialize, Serialize};

const SETUP_SECTS: usize = 0x1f1;
const BOOT_FLAG: usize = 0x1fe;
const HEADER_MAGIC: usize = 0x202;
const PROTOCOL_VERSION: usize = 0x206;
const KERNEL_VERSION_PTR: usize = 0x20e;
const PAYLOAD_OFFSET: usize = 0x248;
const PAYLOAD_LENGTH: usize = 0x24c;
/// `kernel_version` is relative to the start of the header sector.
const KERNEL_VERSION_BASE: usize = 0x200;
const SECTOR: usize = 512;

/// The parsed parts of the setup header that the RT checks need.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetupHeader {
    /// Boot protocol (major, minor), e.g. (2, 15).
    pub protocol: (u8, u8),
    /// Size of the real-mode setup code in bytes, including the boot sector.
    pub setup_size: usize,
    pub version: KernelVersion,
    /// Offset and length of the compressed kernel within the file (protocol >= 2.08).
    pub payload: Option<(usize, usize)>,
}

/// The version string: `<release> (<builder>) <UTS_VERSION>`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelVersion {
    pub raw: String,
    pub release: String,
    pub builder: String,
    pub uts_version: String,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BzImageError {
    #[error("file is {len} bytes, too short for an x86 boot setup header")]
    TooShort { len: usize },
    #[error("no `HdrS` magic at 0x202 (found {found:02x?}): not an x86 bzImage")]
    BadMagic { found: [u8; 4] },
    #[error("boot protocol {major}.{minor:02} is older than 2.00 and has no version string")]
    ProtocolTooOld { major: u8, minor: u8 },
    #[error("kernel_version pointer at 0x20e is zero: the image carries no version string")]
    NoVersionString,
    #[error("version string offset {offset:#x} is outside the setup sectors (which end at {setup_end:#x})")]
    VersionOutsideSetup { offset: usize, setup_end: usize },
    #[error("setup sectors end at {setup_end:#x} but the file is only {len:#x} bytes (truncated)")]
    Truncated { setup_end: usize, len: usize },
    #[error("version string at {offset:#x} has no NUL terminator inside the setup sectors")]
    Unterminated { offset: usize },
    #[error("version string is not valid UTF-8")]
    NotUtf8,
    #[error("version string is not `<release> (<builder>) <version>`: {0:?}")]
    MalformedVersion(String),
    #[error(
        "version string reads more than one way (`) #` occurs {count} times, so the builder may hide a second UTS_VERSION): {raw:?}"
    )]
    AmbiguousVersion { count: usize, raw: String },
}

fn u16_at(data: &[u8], offset: usize) -> u16 {
    u16::from_le_bytes([data[offset], data[offset + 1]])
}

pub(crate) fn u32_at(data: &[u8], offset: usize) -> u32 {
    u32::from_le_bytes([data[offset], data[offset + 1], data[offset + 2], data[offset + 3]])
}

/// Reads and validates the setup header of `image`. Never panics on any input.
pub fn read_setup_header(image: &[u8]) -> Result<SetupHeader, BzImageError> {
    if image.len() < KERNEL_VERSION_PTR + 2 {
        return Err(BzImageError::TooShort { len: image.len() });
    }
    let magic: [u8; 4] = image[HEADER_MAGIC..HEADER_MAGIC + 4]
        .try_into()
        .expect("slice of 4");
    if &magic != b"HdrS" {
        return Err(BzImageError::BadMagic { found: magic });
    }
    let protocol_raw = u16_at(image, PROTOCOL_VERSION);
    let protocol = ((protocol_raw >> 8) as u8, protocol_raw as u8);
    if protocol.0 < 2 {
        return Err(BzImageError::ProtocolTooOld {
            major: protocol.0,
            minor: protocol.1,
        });
    }
    // The boot flag is part of every bzImage but old loaders tolerate its
    // absence; it is not needed for anything below, so it is only informative.
    let _boot_flag = u16_at(image, BOOT_FLAG);
    let setup_sects = match image[SETUP_SECTS] {
        0 => 4,
        n => n as usize,
    };
    let setup_size = (setup_sects + 1) * SECTOR;
    if image.len() < setup_size {
        return Err(BzImageError::Truncated {
            setup_end: setup_size,
            len: image.len(),
        });
    }
    let pointer = u16_at(image, KERNEL_VERSION_PTR) as usize;
    if pointer == 0 {
        return Err(BzImageError::NoVersionString);
    }
    let offset = pointer + KERNEL_VERSION_BASE;
    if offset >= setup_size {
        return Err(BzImageError::VersionOutsideSetup {
            offset,
            setup_end: setup_size,
        });
    }
    let setup = &image[offset..setup_size];
    let nul = setup
        .iter()
        .position(|&b| b == 0)
        .ok_or(BzImageError::Unterminated { offset })?;
    let raw = std::str::from_utf8(&setup[..nul]).map_err(|_| BzImageError::NotUtf8)?;
    let version = parse_version_string(raw)?;

    let payload = (protocol >= (2, 8) && image.len() >= PAYLOAD_LENGTH + 4)
        .then(|| {
            let start = setup_size.checked_add(u32_at(image, PAYLOAD_OFFSET) as usize)?;
            let len = u32_at(image, PAYLOAD_LENGTH) as usize;
            (len > 0 && start.checked_add(len)? <= image.len()).then_some((start, len))
        })
        .flatten();

    Ok(SetupHeader {
        protocol,
        setup_size,
        version,
        payload,
    })
}

/// Splits `6.12.1 (user@host) #1 SMP PREEMPT_RT date` into its parts. The builder
/// is matched with balanced parentheses because Debian's contains none but a
/// hostname may. A builder that could end at more than one `) #` (a crafted
/// host such as `h) #1 SMP PREEMPT_RT (x`) makes the string ambiguous: refused.
pub fn parse_version_string(raw: &str) -> Result<KernelVersion, BzImageError> {
    let malformed = || BzImageError::MalformedVersion(raw.to_string());
    let (release, rest) = raw.split_once(" (").ok_or_else(malformed)?;
    let count = rest.matches(") #").count();
    if count > 1 {
        return Err(BzImageError::AmbiguousVersion {
            count,
            raw: raw.to_string(),
        });
    }
    let close = closing_paren(rest).ok_or_else(malformed)?;
    let builder = &rest[..close];
    let uts_version = rest[close + 1..].trim();
    if release.trim().is_empty() || uts_version.is_empty() {
        return Err(malformed());
    }
    Ok(KernelVersion {
        raw: raw.to_string(),
        release: release.trim().to_string(),
        builder: builder.to_string(),
        uts_version: uts_version.to_string(),
    })
}

/// Where in `s` the `)` closes a group opened just before `s`, counting the
/// groups nested in it.
pub(crate) fn closing_paren(s: &str) -> Option<usize> {
    let mut depth = 1usize;
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth == 0 {
                    return Some(i);
                }
            }
            _ => {}
        }
    }
    None
}

/// Minimal bzImages for tests, here and in the crates that gate on them: a
/// setup header, a version string and, optionally, a gzip payload with an
/// embedded config. No real kernel is needed to exercise a gate.
pub mod synthetic {
    use std::io::Write;

    use super::*;

    /// An image whose setup header points at `version`, with no payload.
    pub fn image(version: &str, setup_sects: u8) -> Vec<u8> {
        let setup_size = (setup_sects as usize + 1) * SECTOR;
        let mut image = vec![0u8; setup_size + 1024];
        image[SETUP_SECTS] = setup_sects;
        image[BOOT_FLAG..BOOT_FLAG + 2].copy_from_slice(&0xaa55u16.to_le_bytes());
        image[HEADER_MAGIC..HEADER_MAGIC + 4].copy_from_slice(b"HdrS");
        image[PROTOCOL_VERSION..PROTOCOL_VERSION + 2].copy_from_slice(&0x020fu16.to_le_bytes());
        let at = 0x400;
        image[KERNEL_VERSION_PTR..KERNEL_VERSION_PTR + 2]
            .copy_from_slice(&((at - KERNEL_VERSION_BASE) as u16).to_le_bytes());
        image[at..at + version.len()].copy_from_slice(version.as_bytes());
        image
    }

    /// Like [`image`] with `payload` as the compressed kernel.
    pub fn image_with_payload(version: &str, payload: &[u8]) -> Vec<u8> {
        let mut image = image(version, 30);
        let setup_size = 31 * SECTOR;
        image.truncate(setup_size + 16);
        image[PAYLOAD_OFFSET..PAYLOAD_OFFSET + 4].copy_from_slice(&16u32.to_le_bytes());
        image[PAYLOAD_LENGTH..PAYLOAD_LENGTH + 4].copy_from_slice(&(payload.len() as u32).to_le_bytes());
        image.extend_from_slice(payload);
        image
    }

    pub fn gzip(data: &[u8]) -> Vec<u8> {
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        encoder.write_all(data).expect("writing to a Vec");
        encoder.finish().expect("writing to a Vec")
    }

    /// The `linux_banner` (with its NUL) of a kernel whose setup header says
    /// `version`, as kbuild writes it; nothing when `version` does not parse.
    pub fn banner(version: &str) -> Vec<u8> {
        parse_version_string(version).map_or_else(
            |_| Vec::new(),
            |v| {
                format!(
                    "Linux version {} ({}) (synthetic-cc 1.0, synthetic-ld 1.0) {}\n\0",
                    v.release, v.builder, v.uts_version
                )
                .into_bytes()
            },
        )
    }

    /// An uncompressed kernel: its banner for `version` and `config` as
    /// IKCONFIG (or none).
    pub fn vmlinux(version: &str, config: Option<&str>) -> Vec<u8> {
        let mut vmlinux = b"\x7fELF...".to_vec();
        vmlinux.extend(banner(version));
        if let Some(config) = config {
            vmlinux.extend_from_slice(b"IKCFG_ST");
            vmlinux.extend(gzip(config.as_bytes()));
            vmlinux.extend_from_slice(b"IKCFG_ED");
        }
        vmlinux
    }

    /// A kernel image with a gzip payload that carries the banner matching
    /// `version` and embeds `config` as IKCONFIG (or embeds none).
    pub fn kernel(version: &str, config: Option<&str>) -> Vec<u8> {
        image_with_payload(version, &gzip(&vmlinux(version, config)))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::synthetic::image as synthetic_image;
    use super::*;

    #[test]
    fn reads_a_synthetic_header() {
        let image = synthetic_image("6.12.117 (builder@ci) #1 SMP PREEMPT_RT Thu Jan 1 1970", 30);
        let header = read_setup_header(&image).unwrap();
        assert_eq!(header.protocol, (2, 15));
        assert_eq!(header.setup_size, 31 * 512);
        assert_eq!(header.version.release, "6.12.117");
        assert_eq!(header.version.builder, "builder@ci");
        assert_eq!(header.version.uts_version, "#1 SMP PREEMPT_RT Thu Jan 1 1970");
    }

    #[test]
    fn builder_with_parentheses() {
        let v = parse_version_string("6.1.0 (me@host (lab)) #2 SMP x").unwrap();
        assert_eq!(v.builder, "me@host (lab)");
        assert_eq!(v.uts_version, "#2 SMP x");
    }

    #[test]
    fn refuses_bad_magic() {
        let mut image = synthetic_image("6.12 (a@b) #1 SMP", 30);
        image[HEADER_MAGIC] = b'X';
        assert!(matches!(
            read_setup_header(&image),
            Err(BzImageError::BadMagic { .. })
        ));
    }

    #[test]
    fn refuses_offset_past_setup() {
        let mut image = synthetic_image("6.12 (a@b) #1 SMP", 1);
        // Setup is 2 sectors (0x400 bytes); point the string at 0x500.
        image[KERNEL_VERSION_PTR..KERNEL_VERSION_PTR + 2].copy_from_slice(&0x300u16.to_le_bytes());
        let err = read_setup_header(&image).unwrap_err();
        assert_eq!(
            err,
            BzImageError::VersionOutsideSetup {
                offset: 0x500,
                setup_end: 0x400
            }
        );
    }

    #[test]
    fn refuses_truncated_files() {
        let image = synthetic_image("6.12 (a@b) #1 SMP", 30);
        assert!(matches!(
            read_setup_header(&image[..0x100]),
            Err(BzImageError::TooShort { .. })
        ));
        assert!(matches!(
            read_setup_header(&image[..0x300]),
            Err(BzImageError::Truncated { .. })
        ));
        assert!(read_setup_header(&[]).is_err());
    }

    #[test]
    fn refuses_unterminated_and_missing_versions() {
        let mut image = synthetic_image("6.12 (a@b) #1 SMP", 1);
        let setup_end = 0x400;
        for b in &mut image[0x3f0..setup_end] {
            *b = b'A';
        }
        image[KERNEL_VERSION_PTR..KERNEL_VERSION_PTR + 2].copy_from_slice(&0x1f0u16.to_le_bytes());
        assert!(matches!(
            read_setup_header(&image),
            Err(BzImageError::Unterminated { .. })
        ));
        image[KERNEL_VERSION_PTR..KERNEL_VERSION_PTR + 2].copy_from_slice(&0u16.to_le_bytes());
        assert_eq!(read_setup_header(&image), Err(BzImageError::NoVersionString));
    }

    #[test]
    fn refuses_old_protocol() {
        let mut image = synthetic_image("6.12 (a@b) #1 SMP", 30);
        image[PROTOCOL_VERSION..PROTOCOL_VERSION + 2].copy_from_slice(&0x0104u16.to_le_bytes());
        assert!(matches!(
            read_setup_header(&image),
            Err(BzImageError::ProtocolTooOld { .. })
        ));
    }

    #[test]
    fn refuses_a_version_string_that_reads_two_ways() {
        // A crafted build host `k@h) #1 SMP PREEMPT_RT (x` on a PREEMPT_DYNAMIC kernel.
        let spoof = "6.1.0-57-cloud-amd64 (k@h) #1 SMP PREEMPT_RT (x) #1 SMP PREEMPT_DYNAMIC Debian 6.1.192-3 (2026-11-26)";
        assert!(matches!(
            parse_version_string(spoof),
            Err(BzImageError::AmbiguousVersion { count: 2, .. })
        ));
        let image = synthetic_image(spoof, 30);
        assert!(matches!(
            read_setup_header(&image),
            Err(BzImageError::AmbiguousVersion { .. })
        ));
        let genuine = parse_version_string(
            "6.1.0-41-rt-amd64 (debian-kernel@lists.debian.org) #1 SMP PREEMPT_RT Debian 6.1.192-3 (2026-11-26)",
        )
        .unwrap();
        assert_eq!(
            genuine.uts_version,
            "#1 SMP PREEMPT_RT Debian 6.1.192-3 (2026-11-26)"
        );
    }

    #[test]
    fn refuses_malformed_version_strings() {
        for bad in ["6.12", "6.12 (unclosed #1", " (a@b) #1", "6.12 (a@b)"] {
            assert!(parse_version_string(bad).is_err(), "{bad}");
        }
    }

    proptest::proptest! {
        #[test]
        fn never_panics_on_random_bytes(data in proptest::collection::vec(proptest::num::u8::ANY, 0..4096)) {
            let _ = read_setup_header(&data);
        }

        #[test]
        fn never_panics_on_mutated_headers(
            pointer in proptest::num::u16::ANY,
            sects in proptest::num::u8::ANY,
            payload_offset in proptest::num::u32::ANY,
            payload_len in proptest::num::u32::ANY,
            cut in 0usize..20000,
        ) {
            let mut image = synthetic_image("6.12 (a@b) #1 SMP PREEMPT_RT x", 30);
            image[KERNEL_VERSION_PTR..KERNEL_VERSION_PTR + 2].copy_from_slice(&pointer.to_le_bytes());
            image[SETUP_SECTS] = sects;
            image[PAYLOAD_OFFSET..PAYLOAD_OFFSET + 4].copy_from_slice(&payload_offset.to_le_bytes());
            image[PAYLOAD_LENGTH..PAYLOAD_LENGTH + 4].copy_from_slice(&payload_len.to_le_bytes());
            image.truncate(cut.min(image.len()));
            let _ = read_setup_header(&image);
        }
    }
}
