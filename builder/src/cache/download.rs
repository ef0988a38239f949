//! Downloads and imports into the cache's blob store: a URL fetched with
//! retries, deadlines and a size cap, or a local file hashed (with a memo)
//! and copied in; either is checked against its sha256 before it is kept.
//! Below both the fetch stage and the remote cache ([`super::remote`]).

use std::fs::File;
use std::io::{self, BufWriter};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

use super::{BlobLookup, Cache, FileStamp};
use crate::io::hashing::{HashingWriter, sha256_reader};
use crate::ui::Ui;

/// A source file in the cache.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fetched {
    pub sha256: String,
    /// Its content address in the cache.
    pub path: PathBuf,
    /// Where it came from, for messages and metadata.
    pub origin: String,
    pub size: u64,
    /// True when no download or copy was needed.
    pub cached: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("sha256 mismatch for {origin}: expected {expected}, got {actual}; nothing was cached")]
pub struct ChecksumMismatch {
    pub origin: String,
    pub expected: String,
    pub actual: String,
}

/// Download behaviour; the defaults suit real networks, tests shorten them.
#[derive(Clone, Debug)]
pub struct FetchOptions {
    /// Attempts per download, counting the first.
    pub attempts: u32,
    /// Wait before the second attempt; doubled each time.
    pub backoff: Duration,
    pub connect_timeout: Duration,
    /// Longest silence from the server before the attempt counts as failed.
    pub read_timeout: Duration,
    /// Refuse a body longer than this (a remote cache entry's size): a
    /// hostile server cannot fill the disk before the hash is checked.
    pub max_bytes: Option<u64>,
}

impl Default for FetchOptions {
    fn default() -> Self {
        FetchOptions {
            attempts: 4,
            backoff: Duration::from_secs(2),
            connect_timeout: Duration::from_secs(30),
            read_timeout: Duration::from_secs(60),
            max_bytes: None,
        }
    }
}

/// The cached blob when it is present and sound. A damaged one (its size or
/// hash is not what was stored) is removed, and the caller fetches it again.
pub fn cached_blob(cache: &Cache, sha256: &str, origin: &str, ui: &Ui) -> Result<Option<Fetched>> {
    match cache.lookup_blob(sha256)? {
        BlobLookup::Hit(path) => {
            ui.note(format!("cached: {origin} (sha256 {sha256})"));
            Ok(Some(Fetched {
                size: path.metadata()?.len(),
                sha256: sha256.to_string(),
                path,
                origin: origin.to_string(),
                cached: true,
            }))
        }
        BlobLookup::Missing => Ok(None),
        BlobLookup::Removed(damage) => {
            ui.warn(format!(
                "the cached copy of {origin} (sha256 {sha256}) was damaged: {damage}; removed it, fetching it again"
            ));
            Ok(None)
        }
    }
}

pub fn fetch_url(url: &str, sha256: &str, cache: &Cache, options: &FetchOptions, ui: &Ui) -> Result<Fetched> {
    if let Some(cached) = cached_blob(cache, sha256, url, ui)? {
        return Ok(cached);
    }
    let client = reqwest::blocking::Client::builder()
        .connect_timeout(options.connect_timeout)
        // In the blocking client this bounds each read, not the whole download.
        .timeout(options.read_timeout)
        .user_agent(concat!("imgbuild/", env!("CARGO_PKG_VERSION")))
        .build()
        .context("creating the HTTP client")?;
    let mut wait = options.backoff;
    for attempt in 1..=options.attempts.max(1) {
        match download_once(&client, url, options.max_bytes, cache, ui) {
            Ok((temp, actual, size)) => {
                if actual != sha256 {
                    // `temp` is dropped here, which deletes the partial file.
                    return Err(ChecksumMismatch {
                        origin: url.to_string(),
                        expected: sha256.to_string(),
                        actual,
                    }
                    .into());
                }
                let path = cache.store_blob(temp, sha256)?;
                ui.note(format!("downloaded {url} ({size} bytes, sha256 verified)"));
                return Ok(Fetched {
                    sha256: sha256.to_string(),
                    path,
                    origin: url.to_string(),
                    size,
                    cached: false,
                });
            }
            Err(Attempt::Permanent(e)) => return Err(e.context(format!("downloading {url}"))),
            Err(Attempt::Transient(e)) if attempt < options.attempts => {
                ui.warn(format!(
                    "download of {url} failed (attempt {attempt} of {}): {e:#}; retrying in {:.1}s",
                    options.attempts,
                    wait.as_secs_f64()
                ));
                std::thread::sleep(wait);
                wait *= 2;
            }
            Err(Attempt::Transient(e)) => {
                return Err(e.context(format!("downloading {url}: gave up after {attempt} attempts")));
            }
        }
    }
    unreachable!("the loop returns on the last attempt")
}

enum Attempt {
    /// Worth retrying: connection trouble, a timeout, a 5xx, a truncated body.
    Transient(anyhow::Error),
    /// Retrying will not help: 404, 403, a local I/O error.
    Permanent(anyhow::Error),
}

fn download_once(
    client: &reqwest::blocking::Client,
    url: &str,
    max_bytes: Option<u64>,
    cache: &Cache,
    ui: &Ui,
) -> Result<(tempfile::NamedTempFile, String, u64), Attempt> {
    let response = client
        .get(url)
        .send()
        .map_err(|e| Attempt::Transient(anyhow::Error::new(e).context("sending the request")))?;
    let status = response.status();
    if !status.is_success() {
        let error = anyhow::anyhow!("server answered {status}");
        let transient = status.is_server_error() || status.as_u16() == 408 || status.as_u16() == 429;
        return Err(if transient {
            Attempt::Transient(error)
        } else {
            Attempt::Permanent(error)
        });
    }
    let expected_len = response.content_length();
    let limit = max_bytes.unwrap_or(u64::MAX);
    if expected_len.is_some_and(|len| len > limit) {
        return Err(Attempt::Permanent(anyhow::anyhow!(
            "the server offers {} bytes, more than the {limit} expected",
            expected_len.unwrap_or_default()
        )));
    }
    let temp = cache.temp_file().map_err(Attempt::Permanent)?;
    let file = temp
        .reopen()
        .context("opening the temp file")
        .map_err(Attempt::Permanent)?;
    let bar = ui.bytes(expected_len, format!("downloading {}", short_name(url)));
    let mut writer = HashingWriter::new(BufWriter::with_capacity(1 << 20, file));
    let copied = io::copy(
        &mut bar.wrap_read(io::Read::take(response, limit.saturating_add(1))),
        &mut writer,
    );
    bar.finish_and_clear();
    copied.map_err(|e| Attempt::Transient(anyhow::Error::new(e).context("reading the response body")))?;
    let received = writer.written();
    if received > limit {
        return Err(Attempt::Permanent(anyhow::anyhow!(
            "the server sent more than the {limit} bytes expected"
        )));
    }
    let (actual, buffered) = writer.finish();
    buffered
        .into_inner()
        .map_err(|e| Attempt::Permanent(anyhow::anyhow!("writing the temp file: {}", e.error())))?;
    if let Some(len) = expected_len
        && received != len
    {
        return Err(Attempt::Transient(anyhow::anyhow!(
            "connection closed after {received} of {len} bytes"
        )));
    }
    Ok((temp, actual, received))
}

fn short_name(url: &str) -> &str {
    url.rsplit('/').find(|s| !s.is_empty()).unwrap_or(url)
}

/// Memo of a local file's hash, valid while size, mtime and inode match.
#[derive(Serialize, Deserialize)]
struct HashMemo {
    stamp: FileStamp,
    sha256: String,
}

/// Hashes a local file (using the memo when the file is unchanged) and copies
/// it into the cache unless its content is already there.
pub fn import_file(path: &Path, expected: Option<&str>, cache: &Cache, ui: &Ui) -> Result<Fetched> {
    let origin = path.display().to_string();
    let path = path
        .canonicalize()
        .with_context(|| format!("source file {origin} not found"))?;
    let memo_key = path.to_string_lossy().into_owned();
    let stamp = FileStamp::of(&path)?;
    let memo = cache
        .read_index::<HashMemo>("file-hash", &memo_key)
        .filter(|m| m.stamp == stamp);
    let sha256 = match memo {
        Some(memo) => memo.sha256,
        None => {
            let bar = ui.bytes(Some(stamp.size), format!("hashing {}", short_name(&origin)));
            let file = File::open(&path).with_context(|| format!("opening {origin}"))?;
            let (digest, _) = sha256_reader(file, Some(&bar)).with_context(|| format!("reading {origin}"))?;
            bar.finish_and_clear();
            cache.write_index(
                "file-hash",
                &memo_key,
                &HashMemo {
                    stamp: stamp.clone(),
                    sha256: digest.clone(),
                },
            )?;
            digest
        }
    };
    if let Some(expected) = expected
        && expected != sha256
    {
        return Err(ChecksumMismatch {
            origin,
            expected: expected.to_string(),
            actual: sha256,
        }
        .into());
    }
    if let Some(cached) = cached_blob(cache, &sha256, &origin, ui)? {
        return Ok(cached);
    }
    let temp = cache.temp_file()?;
    let mut writer = HashingWriter::new(BufWriter::with_capacity(1 << 20, temp.reopen()?));
    let bar = ui.bytes(Some(stamp.size), format!("importing {}", short_name(&origin)));
    io::copy(&mut bar.wrap_read(File::open(&path)?), &mut writer)
        .with_context(|| format!("copying {origin}"))?;
    bar.finish_and_clear();
    let (copied_sha, buffered) = writer.finish();
    buffered
        .into_inner()
        .map_err(|e| anyhow::anyhow!("writing the cache copy: {}", e.error()))?;
    if copied_sha != sha256 {
        bail!(
            "{origin} changed while it was being copied (sha256 {sha256} before, {copied_sha} after); run again"
        );
    }
    let blob = cache.store_blob(temp, &sha256)?;
    ui.note(format!("imported {origin} (sha256 {sha256})"));
    Ok(Fetched {
        sha256,
        path: blob,
        origin,
        size: stamp.size,
        cached: false,
    })
}
