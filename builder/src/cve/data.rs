//! Reading vulnerability data from a file in either form it comes in: the
//! Debian security tracker's JSON export, or osv.dev's zip of Debian OSV
//! records. A file's first bytes say which it is.

use std::fs::File;
use std::io::{BufReader, Read, Seek};
use std::path::Path;
use std::time::SystemTime;

use anyhow::{Context, Result};
use emberrtos_contract::error::BadInput;

use super::osv;
use super::tracker::{self, Issues, Wanted};
use crate::io::hashing::{HashingReader, sha256_reader};

/// The largest data file read: the tracker's whole JSON is some hundreds of
/// megabytes; anything past this is not it.
pub const MAX_DATA_BYTES: u64 = 2 << 30;

/// The forms of vulnerability data imgbuild reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// `https://security-tracker.debian.org/tracker/data/json`.
    TrackerJson,
    /// `https://osv-vulnerabilities.storage.googleapis.com/Debian/all.zip`.
    OsvZip,
}

impl Format {
    /// The name reports and the cache give it.
    pub fn as_str(self) -> &'static str {
        match self {
            Format::TrackerJson => "debian-security-tracker-json",
            Format::OsvZip => "osv-debian-zip",
        }
    }

    /// The form of a file that starts with `start`: a zip is OSV records,
    /// anything else must be the tracker's JSON.
    fn of_start(start: &[u8]) -> Format {
        if start.starts_with(b"PK\x03\x04") {
            Format::OsvZip
        } else {
            Format::TrackerJson
        }
    }
}

/// A data file to read, and how errors name it.
#[derive(Clone, Copy, Debug)]
pub struct DataFile<'a> {
    pub path: &'a Path,
    /// The file's name in messages (where the cache's copy came from).
    pub shown: &'a str,
    /// The option that named it.
    pub option: &'a str,
}

/// What one read of a data file gave.
#[derive(Debug)]
pub struct DataRead {
    pub format: Format,
    pub issues: Issues,
    pub sha256: String,
    pub bytes: u64,
    /// When the file was last written.
    pub modified: SystemTime,
    /// Source packages (the tracker) or records (OSV) read.
    pub entries: usize,
    /// What was read, counted: `61234 source packages`.
    pub summary: String,
}

/// Reads `file`, keeping what `wanted` names. A file that is not one of the
/// two forms, or is broken, is an error naming it and the place.
pub fn read(file: DataFile, wanted: &Wanted) -> Result<DataRead> {
    let bad = |message: String| BadInput::new(file.option, format!("{}: {message}", file.shown));
    let (mut handle, meta) = crate::io::open_regular(file.path).map_err(bad)?;
    if meta.len() > MAX_DATA_BYTES {
        let message = format!("{} bytes, more than the {MAX_DATA_BYTES} read", meta.len());
        return Err(bad(message).into());
    }
    let format =
        Format::of_start(&first_bytes(&mut handle).with_context(|| format!("reading {}", file.shown))?);
    let parsed = match format {
        Format::TrackerJson => read_tracker(handle, wanted, &bad),
        Format::OsvZip => read_osv(handle, wanted, &bad),
    }
    .map_err(|e| match e.is::<BadInput>() {
        true => e,
        false => e.context(format!("reading {}", file.shown)),
    })?;
    Ok(DataRead {
        format,
        issues: parsed.issues,
        sha256: parsed.sha256,
        bytes: parsed.bytes,
        modified: meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
        entries: parsed.entries,
        summary: parsed.summary,
    })
}

/// The first four bytes (fewer in a shorter file); the file is left at its start.
fn first_bytes(file: &mut File) -> std::io::Result<Vec<u8>> {
    let mut start = Vec::with_capacity(4);
    Read::by_ref(file).take(4).read_to_end(&mut start)?;
    file.rewind()?;
    Ok(start)
}

/// What changes when a file's content does: its size and change time.
fn content_state(file: &File) -> std::io::Result<(u64, i64, i64)> {
    use std::os::unix::fs::MetadataExt;
    let meta = file.metadata()?;
    Ok((meta.size(), meta.ctime(), meta.ctime_nsec()))
}

/// One form's reading of a file.
struct Parsed {
    issues: Issues,
    sha256: String,
    bytes: u64,
    entries: usize,
    summary: String,
}

fn read_tracker(file: File, wanted: &Wanted, bad: &dyn Fn(String) -> BadInput) -> Result<Parsed> {
    let mut reader = BufReader::with_capacity(1 << 20, HashingReader::new(file.take(MAX_DATA_BYTES)));
    let (issues, packages) = tracker::parse(&mut reader, wanted)
        .map_err(|e| bad(format!("not the Debian security tracker's JSON: {e}")))?;
    let (sha256, bytes) = reader.into_inner().finish()?;
    Ok(Parsed {
        issues,
        sha256,
        bytes,
        entries: packages,
        summary: format!("{packages} source packages"),
    })
}

/// A zip is hashed, then read again: its content must not change between.
fn read_osv(mut file: File, wanted: &Wanted, bad: &dyn Fn(String) -> BadInput) -> Result<Parsed> {
    let before = content_state(&file)?;
    let (sha256, bytes) = sha256_reader(Read::by_ref(&mut file).take(MAX_DATA_BYTES), None)?;
    file.rewind()?;
    let mut reader = BufReader::with_capacity(64 << 10, file);
    let (issues, tally) = osv::parse_zip(&mut reader, wanted)
        .map_err(|e| bad(format!("not osv.dev's zip of Debian OSV records: {e}")))?;
    if content_state(reader.get_ref())? != before {
        anyhow::bail!("it changed while it was read (sha256 {sha256} before); run again");
    }
    let summary = format!(
        "{} DEBIAN-CVE records; {} advisories and {} withdrawn records skipped",
        tally.records, tally.advisories, tally.withdrawn
    );
    Ok(Parsed {
        issues,
        sha256,
        bytes,
        entries: tally.records,
        summary,
    })
}
