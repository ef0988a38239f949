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
}

fn find(haystack: &[u8], needle: &[u8], from: usize) -> Option<usize> {
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

/// Decompresses the protected-mode payload of a bzImage (gzip, xz or zstd, the
/// codecs distributions use). Other codecs give an error naming the magic.
#[cfg(feature = "image")]
pub fn decompress_payload(payload: &[u8]) -> Result<Vec<u8>, IkconfigError> {
    // vmlinux for x86_64 is well under 256 MiB even with every debug option.
    const MAX_VMLINUX: u64 = 256 << 20;
    let mut out = Vec::new();
    let result = match payload {
        [0x1f, 0x8b, ..] => flate2::read::GzDecoder::new(payload)
            .take(MAX_VMLINUX)
            .read_to_end(&mut out),
        [0xfd, b'7', b'z', b'X', b'Z', 0x00, ..] => liblzma::read::XzDecoder::new(payload)
            .take(MAX_VMLINUX)
            .read_to_end(&mut out),
        [0x28, 0xb5, 0x2f, 0xfd, ..] => {
            let decoder = zstd::stream::read::Decoder::with_buffer(payload)
                .and_then(|mut d| {
                    // Kbuild compresses with --ultra -22, whose window exceeds the default limit.
                    d.window_log_max(31)?;
                    Ok(d.single_frame())
                })
                .map_err(|e| IkconfigError::Payload(e.to_string()))?;
            decoder.take(MAX_VMLINUX).read_to_end(&mut out)
        }
        other => {
            let magic: Vec<u8> = other.iter().take(6).copied().collect();
            return Err(IkconfigError::Payload(format!(
                "unsupported compression (magic {magic:02x?}); gzip, xz and zstd are supported"
            )));
        }
    };
    result.map_err(|e| IkconfigError::Payload(e.to_string()))?;
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
        assert!(decompress_payload(b"BZh91AY").is_err());
    }
}
