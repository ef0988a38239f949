//! The TPM 2.0 structures attestation reads, as tpm2-tools writes them
//! (big-endian, marshalled as the TPM does): a public area (`TPM2B_PUBLIC`),
//! a quote (`TPMS_ATTEST`) and its signature (`TPMT_SIGNATURE`). Pure
//! parsers on bytes from the target, which are untrusted: every length is
//! checked against what is left.

use sha2::{Digest, Sha256};
use thiserror::Error;

pub const ALG_RSA: u16 = 0x0001;
pub const ALG_SHA256: u16 = 0x000B;
pub const ALG_NULL: u16 = 0x0010;
pub const ALG_ECDSA: u16 = 0x0018;
pub const ALG_ECC: u16 = 0x0023;
pub const ECC_NIST_P256: u16 = 0x0003;
/// `TPM_GENERATED_VALUE`: only the TPM itself signs structures that start so.
pub const GENERATED: u32 = 0xff54_4347;
pub const ST_ATTEST_QUOTE: u16 = 0x8018;

/// `TPMA_OBJECT` bits an attestation key must have: its private part never
/// leaves the TPM (fixedTPM, fixedParent), was made inside it
/// (sensitiveDataOrigin), and it signs only what the TPM made (restricted,
/// sign).
pub const FIXED_TPM: u32 = 1 << 1;
pub const FIXED_PARENT: u32 = 1 << 4;
pub const SENSITIVE_DATA_ORIGIN: u32 = 1 << 5;
pub const RESTRICTED: u32 = 1 << 16;
pub const DECRYPT: u32 = 1 << 17;
pub const SIGN: u32 = 1 << 18;
pub const ATTESTATION_KEY: u32 = FIXED_TPM | FIXED_PARENT | SENSITIVE_DATA_ORIGIN | RESTRICTED | SIGN;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum TpmError {
    #[error("{what}: ends early (at byte {at})")]
    Short { what: &'static str, at: usize },
    #[error("{what}: {found} trailing byte(s)")]
    Trailing { what: &'static str, found: usize },
    #[error("{what}: {detail}")]
    Unsupported { what: &'static str, detail: String },
}

/// A cursor over big-endian TPM bytes.
struct Reader<'a> {
    what: &'static str,
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn new(what: &'static str, bytes: &'a [u8]) -> Reader<'a> {
        Reader { what, bytes, at: 0 }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], TpmError> {
        let end = self.at.checked_add(n).filter(|&end| end <= self.bytes.len());
        let end = end.ok_or(TpmError::Short {
            what: self.what,
            at: self.at,
        })?;
        let taken = &self.bytes[self.at..end];
        self.at = end;
        Ok(taken)
    }

    fn u8(&mut self) -> Result<u8, TpmError> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<u16, TpmError> {
        Ok(u16::from_be_bytes(self.take(2)?.try_into().expect("2 bytes")))
    }

    fn u32(&mut self) -> Result<u32, TpmError> {
        Ok(u32::from_be_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }

    /// A `TPM2B_*`: a 16-bit size, then that many bytes.
    fn sized(&mut self) -> Result<&'a [u8], TpmError> {
        let size = self.u16()?;
        self.take(size.into())
    }

    fn end(&self) -> Result<(), TpmError> {
        match self.bytes.len() - self.at {
            0 => Ok(()),
            found => Err(TpmError::Trailing {
                what: self.what,
                found,
            }),
        }
    }

    fn unsupported(&self, detail: String) -> TpmError {
        TpmError::Unsupported {
            what: self.what,
            detail,
        }
    }
}

/// The key a public area holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PublicKey {
    /// An RSA modulus and exponent (big-endian bytes).
    Rsa { modulus: Vec<u8>, exponent: u32 },
    /// A P-256 point.
    EccP256 { x: Vec<u8>, y: Vec<u8> },
}

/// A `TPMT_PUBLIC` with the bytes its name hashes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Public {
    pub attributes: u32,
    pub key: PublicKey,
    /// The marshalled `TPMT_PUBLIC`.
    pub area: Vec<u8>,
}

impl Public {
    /// The TPM's name of the object: the name algorithm, then its digest
    /// of the public area.
    pub fn name(&self) -> Vec<u8> {
        let mut name = ALG_SHA256.to_be_bytes().to_vec();
        name.extend_from_slice(&Sha256::digest(&self.area));
        name
    }
}

/// The authPolicy of the TCG's default EK: PolicySecret(TPM_RH_ENDORSEMENT).
const EK_POLICY: [u8; 32] = [
    0x83, 0x71, 0x97, 0x67, 0x44, 0x84, 0xb3, 0xf8, 0x1a, 0x90, 0xcc, 0x8d, 0x46, 0xa5, 0xd7, 0x24, 0xfd,
    0x52, 0xd7, 0x6e, 0x06, 0x52, 0x0b, 0x64, 0xf2, 0xa1, 0xda, 0x1b, 0x33, 0x14, 0x69, 0xaa,
];

/// Whether `area` (a `TPMT_PUBLIC`) is the TCG's default RSA 2048 EK
/// (EK Credential Profile, template L-1): fixedTPM, fixedParent,
/// sensitiveDataOrigin, adminWithPolicy, restricted and decrypt; the
/// endorsement policy; AES-128-CFB; no scheme; 2048 bits; the default
/// exponent; a 256-byte modulus. Nothing else may vary, so a key with a
/// weak exponent or other bytes cannot pass for an EK whose certificate it
/// borrows.
pub fn is_default_rsa_ek(area: &[u8]) -> bool {
    let mut template = Vec::with_capacity(60);
    template.extend_from_slice(&ALG_RSA.to_be_bytes());
    template.extend_from_slice(&ALG_SHA256.to_be_bytes());
    template.extend_from_slice(&0x0003_00b2u32.to_be_bytes());
    template.extend_from_slice(&32u16.to_be_bytes());
    template.extend_from_slice(&EK_POLICY);
    // AES, 128 bits, CFB; no scheme; 2048 bits; exponent 0 (65537); 256 bytes.
    template.extend_from_slice(&[
        0x00, 0x06, 0x00, 0x80, 0x00, 0x43, 0x00, 0x10, 0x08, 0x00, 0, 0, 0, 0, 0x01, 0x00,
    ]);
    area.len() == template.len() + 256 && area.starts_with(&template)
}

/// A `TPM2B_PUBLIC` of an RSA or P-256 key with the name algorithm sha256.
pub fn parse_public(bytes: &[u8]) -> Result<Public, TpmError> {
    let mut outer = Reader::new("public area", bytes);
    let area = outer.sized()?;
    outer.end()?;
    let mut r = Reader::new("public area", area);
    let kind = r.u16()?;
    let name_alg = r.u16()?;
    if name_alg != ALG_SHA256 {
        return Err(r.unsupported(format!("name algorithm {name_alg:#06x}, not sha256")));
    }
    let attributes = r.u32()?;
    r.sized()?; // authPolicy
    skip_symmetric(&mut r)?;
    skip_scheme(&mut r)?;
    let key = match kind {
        ALG_RSA => {
            let _bits = r.u16()?;
            let exponent = match r.u32()? {
                0 => 65537,
                e => e,
            };
            PublicKey::Rsa {
                modulus: r.sized()?.to_vec(),
                exponent,
            }
        }
        ALG_ECC => {
            let curve = r.u16()?;
            if curve != ECC_NIST_P256 {
                return Err(r.unsupported(format!("curve {curve:#06x}, not NIST P-256")));
            }
            skip_scheme(&mut r)?; // kdf
            let x = r.sized()?.to_vec();
            let y = r.sized()?.to_vec();
            PublicKey::EccP256 { x, y }
        }
        other => return Err(r.unsupported(format!("key type {other:#06x}, neither RSA nor ECC"))),
    };
    r.end()?;
    Ok(Public {
        attributes,
        key,
        area: area.to_vec(),
    })
}

/// `TPMT_SYM_DEF_OBJECT`: an algorithm, then key bits and mode unless null.
fn skip_symmetric(r: &mut Reader) -> Result<(), TpmError> {
    if r.u16()? != ALG_NULL {
        r.take(4)?;
    }
    Ok(())
}

/// A scheme or KDF: an algorithm, then its hash unless null.
fn skip_scheme(r: &mut Reader) -> Result<(), TpmError> {
    if r.u16()? != ALG_NULL {
        r.u16()?;
    }
    Ok(())
}

/// What a `TPMS_ATTEST` of a quote says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Quote {
    /// The signing key's qualified name.
    pub signer: Vec<u8>,
    /// The qualifying data the quote was asked with.
    pub extra_data: Vec<u8>,
    pub reset_count: u32,
    /// `(hash algorithm, PCR indices)` in the order the digest covers them.
    pub selection: Vec<(u16, Vec<u32>)>,
    /// The digest of the selected PCRs' values, in order.
    pub pcr_digest: Vec<u8>,
}

/// A quote's `TPMS_ATTEST` (the message tpm2_quote signs).
pub fn parse_quote(bytes: &[u8]) -> Result<Quote, TpmError> {
    let mut r = Reader::new("quote", bytes);
    if r.u32()? != GENERATED {
        return Err(r.unsupported("not made by a TPM (no TPM_GENERATED_VALUE)".into()));
    }
    let kind = r.u16()?;
    if kind != ST_ATTEST_QUOTE {
        return Err(r.unsupported(format!("type {kind:#06x}, not a quote")));
    }
    let signer = r.sized()?.to_vec();
    let extra_data = r.sized()?.to_vec();
    r.take(8)?; // clock
    let reset_count = r.u32()?;
    r.take(4 + 1 + 8)?; // restartCount, safe, firmwareVersion
    let selection = parse_selection(&mut r)?;
    let pcr_digest = r.sized()?.to_vec();
    r.end()?;
    Ok(Quote {
        signer,
        extra_data,
        reset_count,
        selection,
        pcr_digest,
    })
}

/// `TPML_PCR_SELECTION`: per bank, a bitmap of PCRs.
fn parse_selection(r: &mut Reader) -> Result<Vec<(u16, Vec<u32>)>, TpmError> {
    let count = r.u32()?;
    if count > 16 {
        return Err(r.unsupported(format!("{count} PCR banks")));
    }
    (0..count)
        .map(|_| {
            let hash = r.u16()?;
            let size = r.u8()?;
            let bitmap = r.take(size.into())?;
            let pcrs = (0..u32::from(size) * 8)
                .filter(|&i| bitmap[(i / 8) as usize] & (1 << (i % 8)) != 0)
                .collect();
            Ok((hash, pcrs))
        })
        .collect()
}

/// An ECDSA signature with sha256 (`TPMT_SIGNATURE`): r and s.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EcdsaSignature {
    pub r: Vec<u8>,
    pub s: Vec<u8>,
}

pub fn parse_signature(bytes: &[u8]) -> Result<EcdsaSignature, TpmError> {
    let mut r = Reader::new("signature", bytes);
    let (alg, hash) = (r.u16()?, r.u16()?);
    if (alg, hash) != (ALG_ECDSA, ALG_SHA256) {
        return Err(r.unsupported(format!(
            "scheme {alg:#06x} with hash {hash:#06x}, not ECDSA with sha256"
        )));
    }
    let signature = EcdsaSignature {
        r: r.sized()?.to_vec(),
        s: r.sized()?.to_vec(),
    };
    r.end()?;
    Ok(signature)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sized(bytes: &[u8]) -> Vec<u8> {
        let mut out = (bytes.len() as u16).to_be_bytes().to_vec();
        out.extend_from_slice(bytes);
        out
    }

    /// A P-256 restricted signing key's public area, as tpm2_createak makes it.
    fn ak_area() -> Vec<u8> {
        let mut area = Vec::new();
        area.extend_from_slice(&ALG_ECC.to_be_bytes());
        area.extend_from_slice(&ALG_SHA256.to_be_bytes());
        area.extend_from_slice(&ATTESTATION_KEY.to_be_bytes());
        area.extend_from_slice(&sized(&[]));
        area.extend_from_slice(&ALG_NULL.to_be_bytes());
        area.extend_from_slice(&[0x00, 0x18, 0x00, 0x0b]); // ECDSA, sha256
        area.extend_from_slice(&ECC_NIST_P256.to_be_bytes());
        area.extend_from_slice(&ALG_NULL.to_be_bytes());
        area.extend_from_slice(&sized(&[1; 32]));
        area.extend_from_slice(&sized(&[2; 32]));
        area
    }

    #[test]
    fn an_attestation_key_parses_and_its_name_hashes_its_area() {
        let public = parse_public(&sized(&ak_area())).unwrap();
        assert_eq!(public.attributes, ATTESTATION_KEY);
        assert_eq!(
            public.key,
            PublicKey::EccP256 {
                x: vec![1; 32],
                y: vec![2; 32]
            }
        );
        let name = public.name();
        assert_eq!(&name[..2], &[0x00, 0x0b]);
        assert_eq!(&name[2..], Sha256::digest(ak_area()).as_slice());
    }

    #[test]
    fn short_long_and_foreign_areas_are_errors() {
        let area = ak_area();
        let mut short = sized(&area);
        short.truncate(short.len() - 1);
        assert!(matches!(parse_public(&short), Err(TpmError::Short { .. })));
        let mut long = sized(&area);
        long.push(0);
        assert!(matches!(
            parse_public(&long),
            Err(TpmError::Trailing { found: 1, .. })
        ));
        let mut sha1 = area.clone();
        sha1[2..4].copy_from_slice(&[0x00, 0x04]);
        assert!(matches!(
            parse_public(&sized(&sha1)),
            Err(TpmError::Unsupported { .. })
        ));
        assert!(matches!(parse_public(&[0xff, 0xff]), Err(TpmError::Short { .. })));
    }

    fn quote_bytes(magic: u32) -> Vec<u8> {
        let mut q = magic.to_be_bytes().to_vec();
        q.extend_from_slice(&ST_ATTEST_QUOTE.to_be_bytes());
        q.extend_from_slice(&sized(&[7; 34]));
        q.extend_from_slice(&sized(&[9; 32]));
        q.extend_from_slice(&[0; 8]);
        q.extend_from_slice(&5u32.to_be_bytes());
        q.extend_from_slice(&[0; 13]);
        q.extend_from_slice(&1u32.to_be_bytes());
        q.extend_from_slice(&ALG_SHA256.to_be_bytes());
        q.extend_from_slice(&[3, 0xff, 0x03, 0x00]);
        q.extend_from_slice(&sized(&[4; 32]));
        q
    }

    #[test]
    fn a_quote_names_its_pcrs_in_order() {
        let quote = parse_quote(&quote_bytes(GENERATED)).unwrap();
        assert_eq!(quote.signer, vec![7; 34]);
        assert_eq!(quote.extra_data, vec![9; 32]);
        assert_eq!(quote.reset_count, 5);
        assert_eq!(quote.selection, vec![(ALG_SHA256, (0..10).collect())]);
        assert_eq!(quote.pcr_digest, vec![4; 32]);
        assert!(matches!(
            parse_quote(&quote_bytes(0)),
            Err(TpmError::Unsupported { .. })
        ));
    }

    #[test]
    fn only_ecdsa_sha256_signatures_parse() {
        let mut sig = vec![0x00, 0x18, 0x00, 0x0b];
        sig.extend_from_slice(&sized(&[1; 32]));
        sig.extend_from_slice(&sized(&[2; 32]));
        assert_eq!(parse_signature(&sig).unwrap().s, vec![2; 32]);
        sig[1] = 0x14; // RSASSA
        assert!(matches!(parse_signature(&sig), Err(TpmError::Unsupported { .. })));
    }
}
