//! arm64 kernel images. The `Image` header (Documentation/arch/arm64/booting.rst)
//! and the two wrappings kernels ship in: gzip (`Image.gz`) and the EFI
//! zboot image (`vmlinuz.efi`, drivers/firmware/efi/libstub/zboot-header.S).
//! An `Image` has no version pointer: its version string is the kernel's own
//! `linux_banner`, which [`crate::uts::linux_banners`] finds.

use serde::{Deserialize, Serialize};

use crate::bzimage::u32_at;

/// "ARM\x64", little-endian, at 0x38 of every `Image` since Linux 3.17.
const IMAGE_MAGIC: &[u8; 4] = b"ARM\x64";
const IMAGE_MAGIC_AT: usize = 0x38;
const HEADER_LEN: usize = 0x40;
const TEXT_OFFSET: usize = 0x08;
const IMAGE_SIZE: usize = 0x10;
const FLAGS: usize = 0x18;
const ZBOOT_TYPE: &[u8; 4] = b"zimg";
const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];
const ZBOOT_PAYLOAD_OFFSET: usize = 0x08;
const ZBOOT_PAYLOAD_SIZE: usize = 0x0c;
const ZBOOT_CODEC: usize = 0x18;
/// The codec name ends before the PE magic at 0x38.
const ZBOOT_CODEC_END: usize = 0x38;

/// What the RT checks read from an `Image` header.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageHeader {
    pub text_offset: u64,
    /// Bytes the kernel occupies once loaded, its BSS included.
    pub image_size: u64,
    /// 4, 16 or 64 (KiB), or `None` when the header leaves it unspecified.
    pub page_kib: Option<u32>,
    /// The header's first bytes are `MZ`: the image is also an EFI application.
    pub efi_stub: bool,
}

/// How the `Image` was wrapped in the file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Wrapping {
    /// The `Image` itself (`arch/arm64/boot/Image`, Debian's `vmlinuz`).
    Plain,
    /// `Image.gz`.
    Gzip,
    /// An EFI zboot image whose payload is compressed with `codec`.
    Zboot { codec: String },
}

impl std::fmt::Display for Wrapping {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Wrapping::Plain => f.write_str("an Image"),
            Wrapping::Gzip => f.write_str("a gzip-compressed Image"),
            Wrapping::Zboot { codec } => write!(f, "an EFI zboot image ({codec})"),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Arm64Error {
    #[error("file is {len} bytes, too short for an arm64 Image header")]
    TooShort { len: usize },
    #[error("no `ARM\\x64` magic at 0x38 (found {found:02x?}): not an arm64 Image")]
    BadMagic { found: [u8; 4] },
    #[error("the Image header says big-endian: EmberRTOS boots little-endian arm64 only")]
    BigEndian,
    #[error(
        "the Image header's image_size is 0: a kernel older than 3.17, whose header the boot loader cannot trust"
    )]
    NoImageSize,
    #[error("the zboot payload ({offset:#x} + {size:#x}) lies outside the {len:#x}-byte file")]
    ZbootOutOfBounds { offset: usize, size: usize, len: usize },
    #[error("the zboot header's compression type is not NUL-terminated text")]
    ZbootCodec,
    #[error("cannot unwrap the kernel: {0}")]
    Unwrap(String),
}

fn u64_at(data: &[u8], offset: usize) -> u64 {
    u64::from_le_bytes(data[offset..offset + 8].try_into().expect("slice of 8"))
}

/// True when `file` can only be an arm64 kernel in a form [`unwrap`] reads,
/// as its first bytes say: an `Image`, a zboot image, or a gzip stream (an
/// `Image.gz`: no other kernel ships as a bare gzip stream).
pub fn looks_like(file: &[u8]) -> bool {
    file.get(IMAGE_MAGIC_AT..IMAGE_MAGIC_AT + 4)
        .is_some_and(|m| m == IMAGE_MAGIC)
        || zboot_codec_field(file).is_some()
        || file.starts_with(&GZIP_MAGIC)
}

/// Reads and validates an `Image` header. Never panics on any input.
pub fn read_header(image: &[u8]) -> Result<ImageHeader, Arm64Error> {
    if image.len() < HEADER_LEN {
        return Err(Arm64Error::TooShort { len: image.len() });
    }
    let magic: [u8; 4] = image[IMAGE_MAGIC_AT..IMAGE_MAGIC_AT + 4]
        .try_into()
        .expect("slice of 4");
    if &magic != IMAGE_MAGIC {
        return Err(Arm64Error::BadMagic { found: magic });
    }
    let flags = u64_at(image, FLAGS);
    if flags & 1 != 0 {
        return Err(Arm64Error::BigEndian);
    }
    let image_size = u64_at(image, IMAGE_SIZE);
    if image_size == 0 {
        return Err(Arm64Error::NoImageSize);
    }
    let page_kib = match (flags >> 1) & 3 {
        1 => Some(4),
        2 => Some(16),
        3 => Some(64),
        _ => None,
    };
    Ok(ImageHeader {
        text_offset: u64_at(image, TEXT_OFFSET),
        image_size,
        page_kib,
        efi_stub: image.starts_with(b"MZ"),
    })
}

/// The zboot header's codec bytes, when `file` starts like a zboot image.
fn zboot_codec_field(file: &[u8]) -> Option<&[u8]> {
    (file.len() >= HEADER_LEN && file.starts_with(b"MZ") && &file[4..8] == ZBOOT_TYPE)
        .then(|| &file[ZBOOT_CODEC..ZBOOT_CODEC_END])
}

/// The `Image` inside `file` and how it was wrapped: the file itself, a
/// gzip stream, or a zboot payload (gzip, xz, lzma, zstd or lz4).
#[cfg(feature = "image")]
pub fn unwrap(file: &[u8]) -> Result<(Wrapping, std::borrow::Cow<'_, [u8]>), Arm64Error> {
    use std::borrow::Cow;

    use crate::ikconfig::decompress_payload;
    let inflate = |data: &[u8]| decompress_payload(data).map_err(|e| Arm64Error::Unwrap(e.to_string()));
    if let Some(field) = zboot_codec_field(file) {
        let nul = field.iter().position(|&b| b == 0).ok_or(Arm64Error::ZbootCodec)?;
        let codec = std::str::from_utf8(&field[..nul])
            .ok()
            .filter(|c| !c.is_empty() && c.bytes().all(|b| b.is_ascii_alphanumeric()))
            .ok_or(Arm64Error::ZbootCodec)?
            .to_string();
        let offset = u32_at(file, ZBOOT_PAYLOAD_OFFSET) as usize;
        let size = u32_at(file, ZBOOT_PAYLOAD_SIZE) as usize;
        let payload = offset
            .checked_add(size)
            .and_then(|end| file.get(offset..end))
            .ok_or(Arm64Error::ZbootOutOfBounds {
                offset,
                size,
                len: file.len(),
            })?;
        return Ok((Wrapping::Zboot { codec }, Cow::Owned(inflate(payload)?)));
    }
    if file.starts_with(&GZIP_MAGIC) {
        return Ok((Wrapping::Gzip, Cow::Owned(inflate(file)?)));
    }
    Ok((Wrapping::Plain, Cow::Borrowed(file)))
}

/// Minimal arm64 images for tests: a header, a banner and, optionally, an
/// embedded config, plain or wrapped.
#[cfg(feature = "image")]
pub mod synthetic {
    use super::*;
    use crate::bzimage::synthetic::{gzip, vmlinux};

    /// An `Image` (EFI stub, 4 KiB pages) whose banner is for `version`
    /// (`<release> (<builder>) <UTS_VERSION>`) and that embeds `config`.
    pub fn image(version: &str, config: Option<&str>) -> Vec<u8> {
        let mut image = vec![0u8; HEADER_LEN];
        image[..2].copy_from_slice(b"MZ");
        image[TEXT_OFFSET..TEXT_OFFSET + 8].copy_from_slice(&0u64.to_le_bytes());
        image[FLAGS..FLAGS + 8].copy_from_slice(&0b010u64.to_le_bytes());
        image[IMAGE_MAGIC_AT..IMAGE_MAGIC_AT + 4].copy_from_slice(IMAGE_MAGIC);
        image.extend(vmlinux(version, config));
        let size = (image.len() as u64).next_multiple_of(4096) + 4096;
        image[IMAGE_SIZE..IMAGE_SIZE + 8].copy_from_slice(&size.to_le_bytes());
        image
    }

    /// `image` wrapped as a zboot image whose payload is gzip.
    pub fn zboot(image: &[u8]) -> Vec<u8> {
        let payload = gzip(image);
        let mut file = vec![0u8; 0x100];
        file[..2].copy_from_slice(b"MZ");
        file[4..8].copy_from_slice(ZBOOT_TYPE);
        file[ZBOOT_PAYLOAD_OFFSET..ZBOOT_PAYLOAD_OFFSET + 4].copy_from_slice(&0x100u32.to_le_bytes());
        file[ZBOOT_PAYLOAD_SIZE..ZBOOT_PAYLOAD_SIZE + 4]
            .copy_from_slice(&(payload.len() as u32).to_le_bytes());
        file[ZBOOT_CODEC..ZBOOT_CODEC + 4].copy_from_slice(b"gzip");
        file[IMAGE_MAGIC_AT..IMAGE_MAGIC_AT + 4].copy_from_slice(&0x8182_23cdu32.to_le_bytes());
        file.extend(payload);
        file
    }
}

#[cfg(all(test, feature = "image"))]
mod tests {
    use super::synthetic::{image, zboot};
    use super::*;
    use crate::bzimage::synthetic::gzip;

    const VERSION: &str = "6.12.58 (builder@host) #1 SMP PREEMPT_RT Sat Nov 29 00:00:00 UTC 2025";

    #[test]
    fn the_header_of_an_image_reads_back() {
        let plain = image(VERSION, None);
        let header = read_header(&plain).unwrap();
        assert_eq!(header.page_kib, Some(4));
        assert!(header.efi_stub);
        assert!(header.image_size >= plain.len() as u64);
        assert!(looks_like(&plain));
    }

    #[test]
    fn every_wrapping_gives_back_the_same_image() {
        let plain = image(VERSION, Some("CONFIG_PREEMPT_RT=y\n"));
        let (wrapping, inner) = unwrap(&plain).unwrap();
        assert_eq!((wrapping, inner.as_ref()), (Wrapping::Plain, plain.as_slice()));
        let gzipped = gzip(&plain);
        let (wrapping, inner) = unwrap(&gzipped).unwrap();
        assert_eq!((wrapping, inner.as_ref()), (Wrapping::Gzip, plain.as_slice()));
        let zboot = zboot(&plain);
        assert!(looks_like(&zboot));
        assert!(
            read_header(&zboot).is_err(),
            "a zboot file is not itself an Image"
        );
        let (wrapping, inner) = unwrap(&zboot).unwrap();
        assert_eq!(wrapping, Wrapping::Zboot { codec: "gzip".into() });
        assert_eq!(inner.as_ref(), plain.as_slice());
    }

    #[test]
    fn bad_headers_are_refused_naming_why() {
        assert_eq!(read_header(b"MZ"), Err(Arm64Error::TooShort { len: 2 }));
        let mut bad = image(VERSION, None);
        bad[IMAGE_MAGIC_AT] = b'X';
        assert!(matches!(read_header(&bad), Err(Arm64Error::BadMagic { .. })));
        let mut big_endian = image(VERSION, None);
        big_endian[FLAGS] |= 1;
        assert_eq!(read_header(&big_endian), Err(Arm64Error::BigEndian));
        let mut old = image(VERSION, None);
        old[IMAGE_SIZE..IMAGE_SIZE + 8].fill(0);
        assert_eq!(read_header(&old), Err(Arm64Error::NoImageSize));
    }

    #[test]
    fn a_zboot_payload_outside_the_file_is_refused() {
        let mut file = zboot(&image(VERSION, None));
        file[ZBOOT_PAYLOAD_SIZE..ZBOOT_PAYLOAD_SIZE + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(unwrap(&file), Err(Arm64Error::ZbootOutOfBounds { .. })));
        let mut file = zboot(&image(VERSION, None));
        file[ZBOOT_CODEC..ZBOOT_CODEC_END].fill(b'a');
        assert_eq!(unwrap(&file).unwrap_err(), Arm64Error::ZbootCodec);
    }

    proptest::proptest! {
        #[test]
        fn no_input_panics(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..256)) {
            let _ = read_header(&bytes);
            let _ = looks_like(&bytes);
            let _ = unwrap(&bytes);
        }
    }
}
