//! The firmware's TPM event log in the TCG's crypto-agile form (what
//! Linux shows as `binary_bios_measurements`): a `Spec ID Event03` header,
//! then one event per measurement with its digests. Little-endian, as UEFI
//! writes it. A pure parser and a replay of the sha256 bank: what the PCRs
//! must hold if the log is the whole story of the boot.

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};
use thiserror::Error;

use super::tpm::ALG_SHA256;

/// `EV_NO_ACTION`: logged, never extended.
pub const EV_NO_ACTION: u32 = 0x3;
/// `EV_IPL`: what GRUB's `tpm` module logs for each file it loads (PCR 9)
/// and each command it runs (PCR 8).
pub const EV_IPL: u32 = 0xd;
/// Caps on the target's log.
pub const MAX_BYTES: usize = 4 << 20;
const MAX_EVENTS: usize = 65_536;
const MAX_ALGORITHMS: u32 = 16;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum LogError {
    #[error("the event log ends early (at byte {0})")]
    Short(usize),
    #[error("the event log is {0} bytes, over the cap of {MAX_BYTES}")]
    TooLarge(usize),
    #[error("the event log has no crypto-agile header (Spec ID Event03): not a TPM 2.0 log")]
    NotCryptoAgile,
    #[error("the event log has no sha256 bank")]
    NoSha256,
    #[error("event {index}: digest of algorithm {algorithm:#06x}, which the header does not list")]
    UnknownAlgorithm { index: usize, algorithm: u16 },
    #[error("the event log has over {MAX_EVENTS} events")]
    TooManyEvents,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    pub pcr: u32,
    pub kind: u32,
    pub sha256: [u8; 32],
    pub data: Vec<u8>,
}

impl Event {
    /// The event's data as text, without a trailing NUL (GRUB's are text).
    pub fn text(&self) -> String {
        let data = self.data.strip_suffix(&[0]).unwrap_or(&self.data);
        String::from_utf8_lossy(data).into_owned()
    }
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], LogError> {
        let end = self.at.checked_add(n).filter(|&end| end <= self.bytes.len());
        let end = end.ok_or(LogError::Short(self.at))?;
        let taken = &self.bytes[self.at..end];
        self.at = end;
        Ok(taken)
    }

    fn u16(&mut self) -> Result<u16, LogError> {
        Ok(u16::from_le_bytes(self.take(2)?.try_into().expect("2 bytes")))
    }

    fn u32(&mut self) -> Result<u32, LogError> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }

    fn done(&self) -> bool {
        self.at == self.bytes.len()
    }
}

/// The log's events after its header, with their sha256 digests.
pub fn parse(bytes: &[u8]) -> Result<Vec<Event>, LogError> {
    if bytes.len() > MAX_BYTES {
        return Err(LogError::TooLarge(bytes.len()));
    }
    let mut r = Reader { bytes, at: 0 };
    let sizes = parse_header(&mut r)?;
    if !sizes.contains_key(&ALG_SHA256) {
        return Err(LogError::NoSha256);
    }
    let mut events = Vec::new();
    while !r.done() {
        if events.len() == MAX_EVENTS {
            return Err(LogError::TooManyEvents);
        }
        events.push(parse_event(&mut r, &sizes, events.len() + 1)?);
    }
    Ok(events)
}

/// The SHA-1-form first event holding `TCG_EfiSpecIdEvent`: the digest
/// size of each algorithm the log carries.
fn parse_header(r: &mut Reader) -> Result<BTreeMap<u16, u16>, LogError> {
    let (_pcr, kind) = (r.u32()?, r.u32()?);
    r.take(20)?;
    let size = r.u32()? as usize;
    let mut spec = Reader {
        bytes: r.take(size)?,
        at: 0,
    };
    if kind != EV_NO_ACTION || spec.take(16).ok() != Some(b"Spec ID Event03\0") {
        return Err(LogError::NotCryptoAgile);
    }
    spec.take(4 + 4)?; // platformClass, versions, errata, uintnSize
    let count = spec.u32()?;
    if count > MAX_ALGORITHMS {
        return Err(LogError::NotCryptoAgile);
    }
    (0..count).map(|_| Ok((spec.u16()?, spec.u16()?))).collect()
}

fn parse_event(r: &mut Reader, sizes: &BTreeMap<u16, u16>, index: usize) -> Result<Event, LogError> {
    let (pcr, kind, count) = (r.u32()?, r.u32()?, r.u32()?);
    if count > MAX_ALGORITHMS {
        return Err(LogError::Short(r.at));
    }
    let mut sha256 = None;
    for _ in 0..count {
        let algorithm = r.u16()?;
        let size = *sizes
            .get(&algorithm)
            .ok_or(LogError::UnknownAlgorithm { index, algorithm })?;
        let digest = r.take(size.into())?;
        if algorithm == ALG_SHA256 {
            sha256 = digest.try_into().ok();
        }
    }
    let size = r.u32()? as usize;
    let data = r.take(size)?.to_vec();
    Ok(Event {
        pcr,
        kind,
        sha256: sha256.ok_or(LogError::NoSha256)?,
        data,
    })
}

/// The sha256 value each of `pcrs` holds after the log's events are
/// extended in order. A `StartupLocality` event starts PCR 0 at the
/// locality the firmware started from.
pub fn replay(events: &[Event], pcrs: &[u32]) -> BTreeMap<u32, [u8; 32]> {
    let mut values: BTreeMap<u32, [u8; 32]> = pcrs.iter().map(|&pcr| (pcr, [0; 32])).collect();
    for event in events {
        let Some(value) = values.get_mut(&event.pcr) else {
            continue;
        };
        if event.kind == EV_NO_ACTION {
            // Only before PCR 0's first extend, and exactly the spec's 17 bytes.
            let locality = event.data.strip_prefix(b"StartupLocality\0");
            if let (0, Some(&[locality]), true) = (event.pcr, locality, *value == [0; 32]) {
                value[31] = locality;
            }
            continue;
        }
        let mut hasher = Sha256::new();
        hasher.update(*value);
        hasher.update(event.sha256);
        *value = hasher.finalize().into();
    }
    values
}

/// The digest a quote over `pcrs` (in order) carries for these values.
pub fn pcr_digest(values: &BTreeMap<u32, [u8; 32]>, pcrs: &[u32]) -> Vec<u8> {
    let mut hasher = Sha256::new();
    for pcr in pcrs {
        hasher.update(values.get(pcr).copied().unwrap_or([0; 32]));
    }
    hasher.finalize().to_vec()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A log as OVMF writes it: the header (sha1 and sha256 banks), then
    /// `events` as (pcr, type, data), each digest the sha256 of its data
    /// (sha1 digests zero).
    pub(crate) fn log(events: &[(u32, u32, &[u8])]) -> Vec<u8> {
        let digested: Vec<_> = events
            .iter()
            .map(|&(pcr, kind, data)| (pcr, kind, Sha256::digest(data).into(), data))
            .collect();
        log_of(&digested)
    }

    /// [`log`] with the digests given: GRUB's are of the files it loaded.
    pub(crate) fn log_of(events: &[(u32, u32, [u8; 32], &[u8])]) -> Vec<u8> {
        let mut spec = b"Spec ID Event03\0".to_vec();
        spec.extend_from_slice(&[0, 0, 0, 0, 0, 2, 0, 2]);
        spec.extend_from_slice(&2u32.to_le_bytes());
        spec.extend_from_slice(&[0x04, 0x00, 20, 0x00, 0x0b, 0x00, 32, 0x00, 0]);
        let mut out = Vec::new();
        out.extend_from_slice(&0u32.to_le_bytes());
        out.extend_from_slice(&EV_NO_ACTION.to_le_bytes());
        out.extend_from_slice(&[0; 20]);
        out.extend_from_slice(&(spec.len() as u32).to_le_bytes());
        out.extend_from_slice(&spec);
        for (pcr, kind, digest, data) in events {
            out.extend_from_slice(&pcr.to_le_bytes());
            out.extend_from_slice(&kind.to_le_bytes());
            out.extend_from_slice(&2u32.to_le_bytes());
            out.extend_from_slice(&[0x04, 0x00]);
            out.extend_from_slice(&[0; 20]);
            out.extend_from_slice(&[0x0b, 0x00]);
            out.extend_from_slice(digest);
            out.extend_from_slice(&(data.len() as u32).to_le_bytes());
            out.extend_from_slice(data);
        }
        out
    }

    #[test]
    fn events_parse_and_replay_as_a_tpm_extends() {
        let bytes = log(&[
            (9, EV_IPL, b"(cd0)/boot/vmlinuz\0"),
            (8, EV_IPL, b"grub_cmd: boot\0"),
        ]);
        let events = parse(&bytes).unwrap();
        assert_eq!(events.len(), 2);
        assert_eq!(events[0].text(), "(cd0)/boot/vmlinuz");
        assert_eq!(
            events[0].sha256.as_slice(),
            Sha256::digest(b"(cd0)/boot/vmlinuz\0").as_slice()
        );
        let values = replay(&events, &[8, 9]);
        let extended: [u8; 32] = Sha256::new()
            .chain_update([0u8; 32])
            .chain_update(events[0].sha256)
            .finalize()
            .into();
        assert_eq!(values[&9], extended);
        assert_ne!(values[&8], [0; 32]);
        assert_eq!(pcr_digest(&values, &[8, 9]).len(), 32);
        assert_ne!(pcr_digest(&values, &[8, 9]), pcr_digest(&values, &[9, 8]));
    }

    #[test]
    fn a_no_action_event_is_not_extended_but_sets_the_startup_locality() {
        let bytes = log(&[(0, EV_NO_ACTION, b"StartupLocality\0\x03")]);
        let values = replay(&parse(&bytes).unwrap(), &[0]);
        let mut expected = [0; 32];
        expected[31] = 3;
        assert_eq!(values[&0], expected);
    }

    #[test]
    fn cut_foreign_and_oversized_logs_are_errors() {
        let bytes = log(&[(9, EV_IPL, b"x")]);
        assert_eq!(
            parse(&bytes[..bytes.len() - 1]),
            Err(LogError::Short(bytes.len() - 1))
        );
        let mut sha1_log = bytes.clone();
        sha1_log[32..47].copy_from_slice(b"Spec ID Event02");
        assert_eq!(parse(&sha1_log), Err(LogError::NotCryptoAgile));
        assert_eq!(
            parse(&vec![0; MAX_BYTES + 1]),
            Err(LogError::TooLarge(MAX_BYTES + 1))
        );
        assert_eq!(parse(&[]), Err(LogError::Short(0)));
    }
}
