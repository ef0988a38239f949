//! The configuration embedded by `CONFIG_IKCONFIG` (kernel/configs.c): a gzip
//! blob between the markers `IKCFG_ST` and `IKCFG_ED` inside vmlinux.

use std::io::Read;

const START: &[u8] = b"IKCFG_ST";
const END: &[u8] = b"IKCFG_ED";
/// Refuse to inflate more than this: a real .config is a few hundred KiB.
const MAX_CONFIG_BYTES: u64 = 16 << 20;

#[derive(Debug, thiserror::Error)]
pub enum IkconfigError {
    #[error("IKCFG_ST marker found without a matching IKCFG_ED")]
    NoEndMarker,
    #[error("embedded config is not valid gzip: {0}")]
    Gzip(std::io::Error),
    #[error("embedded config is larger than {MAX_CONFIG_BYTES} bytes")]
    TooLarge,
    #[error("embedded config is not UTF-8")]
    NotUtf8,
    #[cfg(feature = "image")]
    #[error("cannot decompress the bzImage payload: {0}")]
    Payload(String),
    #[cfg(feature = "image")]
    #[error(
        "the bzImage payload uses a codec this tool does not read (magic {0}); gzip, xz, lzma, zstd and lz4 are supported"
    )]
    UnsupportedCodec(String),
}

/// The first `needle` in `haystack` at or after `from`.
pub(crate) fn find(haystack: &[u8], needle: &[u8], from: usize) -> Option<usize> {
    haystack
        .get(from..)?
        .windows(needle.len())
        .position(|w| w == needle)
        .map(|p| p + from)
}

/// Finds and inflates the embedded config in an uncompressed kernel image.
/// `Ok(None)` means the kernel was built without `CONFIG_IKCONFIG`.
pub fn extract_from_vmlinux(vmlinux: &[u8]) -> Result<Option<String>, IkconfigError> {
    let Some(start) = find(vmlinux, START, 0) else {
        return Ok(None);
    };
    let body = start + START.len();
    let end = find(vmlinux, END, body).ok_or(IkconfigError::NoEndMarker)?;
    gunzip_text(&vmlinux[body..end]).map(Some)
}

/// Inflates gzip data that holds a config (also used for `/proc/config.gz`).
pub fn gunzip_text(data: &[u8]) -> Result<String, IkconfigError> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(data)
        .take(MAX_CONFIG_BYTES + 1)
        .read_to_end(&mut out)
        .map_err(IkconfigError::Gzip)?;
    if out.len() as u64 > MAX_CONFIG_BYTES {
        return Err(IkconfigError::TooLarge);
    }
    String::from_utf8(out).map_err(|_| IkconfigError::NotUtf8)
}

/// Decompresses the protected-mode payload of a bzImage: gzip, xz, zstd,
/// lzma or lz4 (the kernel's legacy LZ4 framing). bzip2 and lzo give
/// [`IkconfigError::UnsupportedCodec`].
#[cfg(feature = "image")]
pub fn decompress_payload(payload: &[u8]) -> Result<Vec<u8>, IkconfigError> {
    let mut out = Vec::new();
    let failed = |e: std::io::Error| IkconfigError::Payload(e.to_string());
    match payload {
        [0x1f, 0x8b, ..] => {
            flate2::read::GzDecoder::new(payload)
                .take(MAX_VMLINUX)
                .read_to_end(&mut out)
                .map_err(failed)?;
        }
        [0xfd, b'7', b'z', b'X', b'Z', 0x00, ..] => {
            liblzma::read::XzDecoder::new(payload)
                .take(MAX_VMLINUX)
                .read_to_end(&mut out)
                .map_err(failed)?;
        }
        [0x5d, 0x00, 0x00, ..] => {
            let stream =
                liblzma::stream::Stream::new_lzma_decoder(MAX_VMLINUX).map_err(|e| failed(e.into()))?;
            liblzma::read::XzDecoder::new_stream(payload, stream)
                .take(MAX_VMLINUX)
                .read_to_end(&mut out)
                .map_err(failed)?;
        }
        [0x28, 0xb5, 0x2f, 0xfd, ..] => {
            let mut decoder = zstd::stream::read::Decoder::with_buffer(payload).map_err(failed)?;
            // Kbuild compresses with --ultra -22, whose window exceeds the default limit.
            decoder.window_log_max(31).map_err(failed)?;
            decoder
                .single_frame()
                .take(MAX_VMLINUX)
                .read_to_end(&mut out)
                .map_err(failed)?;
        }
        [0x02, 0x21, 0x4c, 0x18, ..] => out = decompress_lz4_legacy(payload)?,
        other => {
            let magic: Vec<u8> = other.iter().take(4).copied().collect();
            return Err(IkconfigError::UnsupportedCodec(format!("{magic:02x?}")));
        }
    }
    Ok(out)
}

#[cfg(feature = "image")]
const MAX_VMLINUX: u64 = 256 << 20;

/// The kernel's legacy LZ4 format: a magic, then blocks of `u32 size` +
/// compressed data, each inflating to at most 8 MiB. Kbuild appends the
/// uncompressed size, which reads as an impossible block size and ends it.
#[cfg(feature = "image")]
fn decompress_lz4_legacy(payload: &[u8]) -> Result<Vec<u8>, IkconfigError> {
    const MAGIC: u32 = 0x184c_2102;
    const CHUNK: usize = 8 << 20;
    let mut out = Vec::new();
    let mut chunk = vec![0u8; CHUNK];
    let mut at = 4;
    while let Some(size_bytes) = payload.get(at..at + 4) {
        let size = u32::from_le_bytes(size_bytes.try_into().expect("4 bytes"));
        if size == MAGIC {
            at += 4;
            continue;
        }
        let Some(block) = payload.get(at + 4..at + 4 + size as usize) else {
            break;
        };
        let n = lz4_flex::block::decompress_into(block, &mut chunk)
            .map_err(|e| IkconfigError::Payload(format!("lz4: {e}")))?;
        out.extend_from_slice(&chunk[..n]);
        if out.len() as u64 > MAX_VMLINUX {
            return Err(IkconfigError::Payload(
                "lz4 payload inflates beyond 256 MiB".into(),
            ));
        }
        at += 4 + size as usize;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        enc.write_all(data).unwrap();
        enc.finish().unwrap()
    }

    #[test]
    fn extracts_between_markers() {
        let config = "CONFIG_PREEMPT_RT=y\n";
        let mut vmlinux = b"\x7fELF....junk".to_vec();
        vmlinux.extend_from_slice(START);
        vmlinux.extend(gzip(config.as_bytes()));
        vmlinux.extend_from_slice(END);
        vmlinux.extend_from_slice(b"more");
        assert_eq!(extract_from_vmlinux(&vmlinux).unwrap().as_deref(), Some(config));
    }

    #[test]
    fn absent_and_broken() {
        assert!(extract_from_vmlinux(b"no config here").unwrap().is_none());
        assert!(matches!(
            extract_from_vmlinux(b"IKCFG_STabc"),
            Err(IkconfigError::NoEndMarker)
        ));
        assert!(matches!(
            extract_from_vmlinux(b"IKCFG_STnot gzipIKCFG_ED"),
            Err(IkconfigError::Gzip(_))
        ));
    }

    #[cfg(feature = "image")]
    #[test]
    fn payload_codecs() {
        let data = b"vmlinux payload".repeat(100);
        assert_eq!(decompress_payload(&gzip(&data)).unwrap(), data);
        let xz = {
            let mut enc = liblzma::write::XzEncoder::new(Vec::new(), 6);
            enc.write_all(&data).unwrap();
            let mut v = enc.finish().unwrap();
            v.extend_from_slice(&[1, 2, 3, 4]); // kbuild appends the size
            v
        };
        assert_eq!(decompress_payload(&xz).unwrap(), data);
        let mut zst = zstd::encode_all(&data[..], 19).unwrap();
        zst.extend_from_slice(&[1, 2, 3, 4]);
        assert_eq!(decompress_payload(&zst).unwrap(), data);
        let mut lz4 = 0x184c_2102u32.to_le_bytes().to_vec();
        // An LZ4 block of one literal run: token 0xF0, length extension, bytes.
        let mut block = vec![0xf0];
        let mut rest = data.len() - 15;
        while rest >= 255 {
            block.push(255);
            rest -= 255;
        }
        block.push(rest as u8);
        block.extend_from_slice(&data);
        lz4.extend_from_slice(&(block.len() as u32).to_le_bytes());
        lz4.extend_from_slice(&block);
        lz4.extend_from_slice(&(data.len() as u32).to_le_bytes());
        assert_eq!(decompress_payload(&lz4).unwrap(), data);
        assert!(matches!(
            decompress_payload(b"BZh91AY"),
            Err(IkconfigError::UnsupportedCodec(_))
        ));
        assert!(
            decompress_payload(&[0x02, 0x21, 0x4c, 0x18, 5, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff]).is_err()
        );
    }
}
