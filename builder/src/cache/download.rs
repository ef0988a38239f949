//! Downloads and imports into the cache's blob store: a URL fetched with
//! retries, an overall deadline, a minimum rate ([`Pace`]) and a size cap,
//! or a local file hashed (with a memo) and copied in; either is checked
//! against its sha256 before it is kept. Below both the fetch stage and the
//! remote cache ([`super::remote`]).

use std::fs::File;
use std::io::{self, BufWriter};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

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
    /// The Debian source package and version it was built from, when it
    /// came from a Debian package (`linux-source-*`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub debian_source: Option<DebianSource>,
}

/// A Debian source package at one version.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DebianSource {
    pub name: String,
    pub version: String,
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
    /// `None`: [`DEFAULT_MAX_BYTES`].
    pub max_bytes: Option<u64>,
}

/// The most a download may hold when nothing pins its size (a recipe's
/// `{url, sha256}`): 4 GiB.
pub const DEFAULT_MAX_BYTES: u64 = 4 << 30;

/// How slow a download may be: it is abandoned when it runs past `deadline`
/// (every attempt and every wait between them counted), or when fewer than
/// `min_bytes` arrived in a `window`, so a server that trickles cannot hold
/// a build. Both are checked after every read, and a read waits at most
/// [`FetchOptions::read_timeout`]: that is how far past the deadline a
/// silent server can get.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pace {
    pub deadline: Duration,
    pub min_bytes: u64,
    pub window: Duration,
}

impl Default for Pace {
    /// An hour in all, and at least 64 KiB a minute.
    fn default() -> Self {
        Pace {
            deadline: Duration::from_secs(3600),
            min_bytes: 64 << 10,
            window: Duration::from_secs(60),
        }
    }
}

/// A download abandoned for its [`Pace`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TooSlow {
    #[error("only {bytes} bytes arrived in {window:?} (the minimum is {min}): the server is too slow")]
    Trickle { bytes: u64, min: u64, window: Duration },
    #[error("the download did not finish within its deadline of {0:?}")]
    Deadline(Duration),
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
                debian_source: None,
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

/// [`fetch_url_paced`] at the default [`Pace`].
pub fn fetch_url(url: &str, sha256: &str, cache: &Cache, options: &FetchOptions, ui: &Ui) -> Result<Fetched> {
    fetch_url_paced(url, sha256, cache, options, &Pace::default(), ui)
}

/// Downloads `url` into the cache unless blob `sha256` is there: retried,
/// within `pace`, capped at `options.max_bytes`, kept only when its sha256
/// is the one expected.
pub fn fetch_url_paced(
    url: &str,
    sha256: &str,
    cache: &Cache,
    options: &FetchOptions,
    pace: &Pace,
    ui: &Ui,
) -> Result<Fetched> {
    if let Some(cached) = cached_blob(cache, sha256, url, ui)? {
        return Ok(cached);
    }
    download(url, Some(sha256), cache, options, pace, ui).map(|downloaded| downloaded.fetched)
}

/// A download, and the date its server gave it.
#[derive(Clone, Debug)]
pub struct Dated {
    pub fetched: Fetched,
    /// The response's `Last-Modified`, when it had a valid one.
    pub last_modified: Option<SystemTime>,
}

/// An https:// URL whose content no hash pins (data that changes daily):
/// it is authenticated by TLS alone, so a plain http:// URL is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0} is not an https:// URL: without a pinned sha256, only TLS can authenticate what it serves")]
pub struct NotTls(pub String);

/// Downloads `url` into the cache with its date. With `sha256`, it is kept
/// only with that hash (any scheme); without, `url` must be https://, whose
/// certificate the system's trust store must vouch for.
pub fn fetch_url_dated(
    url: &str,
    sha256: Option<&str>,
    cache: &Cache,
    options: &FetchOptions,
    ui: &Ui,
) -> Result<Dated> {
    if sha256.is_none() && !url.starts_with("https://") {
        return Err(NotTls(url.to_string()).into());
    }
    download(url, sha256, cache, options, &Pace::default(), ui)
}

/// Downloads `url`: retried, within `pace`, capped at `options.max_bytes`,
/// kept only when its sha256 is `expected` (when given).
fn download(
    url: &str,
    expected: Option<&str>,
    cache: &Cache,
    options: &FetchOptions,
    pace: &Pace,
    ui: &Ui,
) -> Result<Dated> {
    let limits = Limits {
        max_bytes: options.max_bytes.unwrap_or(DEFAULT_MAX_BYTES),
        pace: pace.clone(),
        deadline_at: Instant::now() + pace.deadline,
    };
    let client = match expected {
        Some(_) => http_client(options)?,
        None => tls_only_client(options)?,
    };
    let mut wait = options.backoff;
    for attempt in 1..=options.attempts.max(1) {
        let error = match download_once(&client, url, &limits, cache, ui) {
            Ok(body) => return keep(body, url, expected, cache, ui),
            Err(Attempt::Permanent(e)) => return Err(e.context(format!("downloading {url}"))),
            Err(Attempt::Transient(e)) => e,
        };
        if attempt >= options.attempts || limits.past_deadline_after(wait) {
            return Err(error.context(format!("downloading {url}: gave up after {attempt} attempts")));
        }
        ui.warn(format!(
            "download of {url} failed (attempt {attempt} of {}): {error:#}; retrying in {:.1}s",
            options.attempts,
            wait.as_secs_f64()
        ));
        std::thread::sleep(wait);
        wait *= 2;
    }
    unreachable!("the loop returns on the last attempt")
}

/// The HTTP client of `options`' timeouts.
pub(super) fn http_client(options: &FetchOptions) -> Result<reqwest::blocking::Client> {
    client_builder(options)
        .build()
        .context("creating the HTTP client")
}

fn client_builder(options: &FetchOptions) -> reqwest::blocking::ClientBuilder {
    reqwest::blocking::Client::builder()
        .connect_timeout(options.connect_timeout)
        // In the blocking client this bounds each read, not the whole download.
        .timeout(options.read_timeout)
        .user_agent(concat!("imgbuild/", env!("CARGO_PKG_VERSION")))
}

/// A client for downloads TLS alone authenticates: a redirect that leaves
/// https:// is refused.
fn tls_only_client(options: &FetchOptions) -> Result<reqwest::blocking::Client> {
    let policy = reqwest::redirect::Policy::custom(|attempt| {
        if attempt.url().scheme() != "https" {
            let error = NotTls(attempt.url().to_string());
            attempt.error(error)
        } else if attempt.previous().len() >= 10 {
            attempt.error("more than 10 redirects")
        } else {
            attempt.follow()
        }
    });
    client_builder(options)
        .redirect(policy)
        .build()
        .context("creating the HTTP client")
}

/// Stores a downloaded body as its blob if it hashed to `expected` (or
/// nothing was expected); otherwise it is dropped, which deletes it.
fn keep(body: Body, url: &str, expected: Option<&str>, cache: &Cache, ui: &Ui) -> Result<Dated> {
    if let Some(expected) = expected.filter(|expected| *expected != body.sha256) {
        return Err(ChecksumMismatch {
            origin: url.to_string(),
            expected: expected.to_string(),
            actual: body.sha256,
        }
        .into());
    }
    let path = cache.store_blob(body.temp, &body.sha256)?;
    let checked = if expected.is_some() {
        "sha256 verified"
    } else {
        "over TLS"
    };
    ui.note(format!("downloaded {url} ({} bytes, {checked})", body.size));
    Ok(Dated {
        fetched: Fetched {
            sha256: body.sha256,
            path,
            origin: url.to_string(),
            size: body.size,
            cached: false,
            debian_source: None,
        },
        last_modified: body.last_modified,
    })
}

/// A response body in a temp file of the cache.
struct Body {
    temp: tempfile::NamedTempFile,
    sha256: String,
    size: u64,
    last_modified: Option<SystemTime>,
}

/// What one download may take.
struct Limits {
    max_bytes: u64,
    pace: Pace,
    deadline_at: Instant,
}

impl Limits {
    /// Whether waiting `wait` would run past the deadline.
    fn past_deadline_after(&self, wait: Duration) -> bool {
        Instant::now() + wait >= self.deadline_at
    }
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
    limits: &Limits,
    cache: &Cache,
    ui: &Ui,
) -> Result<Body, Attempt> {
    let response = client.get(url).send().map_err(send_failure)?;
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
    let last_modified = response
        .headers()
        .get(reqwest::header::LAST_MODIFIED)
        .and_then(|value| value.to_str().ok())
        .and_then(|text| httpdate::parse_http_date(text).ok());
    let limit = limits.max_bytes;
    if expected_len.is_some_and(|len| len > limit) {
        return Err(Attempt::Permanent(anyhow::anyhow!(
            "the server offers {} bytes, more than the {limit} allowed",
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
    let body = Paced::new(io::Read::take(response, limit.saturating_add(1)), limits);
    let copied = io::copy(&mut bar.wrap_read(body), &mut writer);
    bar.finish_and_clear();
    copied.map_err(read_failure)?;
    let received = writer.written();
    if received > limit {
        return Err(Attempt::Permanent(anyhow::anyhow!(
            "the server sent more than the {limit} bytes allowed"
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
    Ok(Body {
        temp,
        sha256: actual,
        size: received,
        last_modified,
    })
}

/// A request that could not be sent: an untrusted TLS certificate or a
/// refused redirect is final, anything else (a refused or reset connection) is worth another
/// attempt.
fn send_failure(e: reqwest::Error) -> Attempt {
    let refused_redirect = e.is_redirect();
    let error = anyhow::Error::new(e).context("sending the request");
    if refused_redirect {
        Attempt::Permanent(error)
    } else if format!("{error:#}").contains("certificate verify failed") {
        Attempt::Permanent(error.context("the server's TLS certificate is not trusted here"))
    } else {
        Attempt::Transient(error)
    }
}

/// A failed body read: past the deadline is final, anything else (a
/// trickle, a timeout, a reset) is worth another attempt.
fn read_failure(e: io::Error) -> Attempt {
    let slow = e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<TooSlow>())
        .cloned();
    match slow {
        Some(deadline @ TooSlow::Deadline(_)) => Attempt::Permanent(deadline.into()),
        Some(trickle) => Attempt::Transient(trickle.into()),
        None => Attempt::Transient(anyhow::Error::new(e).context("reading the response body")),
    }
}

/// A body reader that fails with [`TooSlow`] past the deadline, or when a
/// window ends with fewer than the minimum bytes in it.
struct Paced<R> {
    inner: R,
    pace: Pace,
    deadline_at: Instant,
    window_start: Instant,
    window_bytes: u64,
}

/// `inner` read within `pace`, from now: reads fail with [`TooSlow`].
pub(super) fn paced<R: io::Read>(inner: R, pace: &Pace) -> impl io::Read {
    let limits = Limits {
        max_bytes: DEFAULT_MAX_BYTES,
        pace: pace.clone(),
        deadline_at: Instant::now() + pace.deadline,
    };
    Paced::new(inner, &limits)
}

impl<R> Paced<R> {
    fn new(inner: R, limits: &Limits) -> Paced<R> {
        Paced {
            inner,
            pace: limits.pace.clone(),
            deadline_at: limits.deadline_at,
            window_start: Instant::now(),
            window_bytes: 0,
        }
    }

    fn check(&mut self, now: Instant) -> Result<(), TooSlow> {
        if now >= self.deadline_at {
            return Err(TooSlow::Deadline(self.pace.deadline));
        }
        if now.duration_since(self.window_start) >= self.pace.window {
            if self.window_bytes < self.pace.min_bytes {
                return Err(TooSlow::Trickle {
                    bytes: self.window_bytes,
                    min: self.pace.min_bytes,
                    window: self.pace.window,
                });
            }
            (self.window_start, self.window_bytes) = (now, 0);
        }
        Ok(())
    }
}

impl<R: io::Read> io::Read for Paced<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.check(Instant::now()).map_err(io::Error::other)?;
        let n = self.inner.read(buf)?;
        self.window_bytes += n as u64;
        if n > 0 {
            self.check(Instant::now()).map_err(io::Error::other)?;
        }
        Ok(n)
    }
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
        debian_source: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    /// One byte every `every`, for ever.
    struct Drip(Duration);

    impl Read for Drip {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            std::thread::sleep(self.0);
            buf[0] = b'x';
            Ok(1)
        }
    }

    fn limits(pace: Pace) -> Limits {
        Limits {
            max_bytes: DEFAULT_MAX_BYTES,
            deadline_at: Instant::now() + pace.deadline,
            pace,
        }
    }

    /// Copies `reader` within `pace`: the error, and how long it took.
    fn copy(reader: impl Read, pace: Pace) -> (Option<TooSlow>, Duration) {
        let started = Instant::now();
        let result = io::copy(&mut Paced::new(reader, &limits(pace)), &mut io::sink());
        let slow = result.err().map(|e| {
            e.into_inner()
                .and_then(|inner| inner.downcast::<TooSlow>().ok())
                .map(|slow| *slow)
                .expect("a TooSlow error")
        });
        (slow, started.elapsed())
    }

    #[test]
    fn a_body_below_the_minimum_rate_fails_after_one_window() {
        let pace = Pace {
            deadline: Duration::from_secs(60),
            min_bytes: 100,
            window: Duration::from_millis(200),
        };
        let (slow, took) = copy(Drip(Duration::from_millis(20)), pace);
        assert!(
            matches!(slow, Some(TooSlow::Trickle { min: 100, .. })),
            "{slow:?}"
        );
        assert!(took < Duration::from_secs(2), "{took:?}");
    }

    #[test]
    fn a_body_past_the_deadline_fails_whatever_its_rate() {
        let pace = Pace {
            deadline: Duration::from_millis(300),
            min_bytes: 1,
            window: Duration::from_millis(50),
        };
        let (slow, took) = copy(Drip(Duration::from_millis(5)), pace);
        assert_eq!(slow, Some(TooSlow::Deadline(Duration::from_millis(300))));
        assert!(took < Duration::from_secs(2), "{took:?}");
        let Attempt::Permanent(_) = read_failure(io::Error::other(slow.unwrap())) else {
            panic!("a deadline was retried");
        };
    }

    #[test]
    fn a_body_at_a_good_rate_passes() {
        let body = vec![1u8; 1 << 20];
        let (slow, _) = copy(&body[..], Pace::default());
        assert_eq!(slow, None);
    }

    #[test]
    fn a_url_with_no_pinned_size_is_capped_at_the_default() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/linux.tar.xz", listener.local_addr().unwrap());
        std::thread::spawn(move || {
            let (mut stream, _) = listener.accept().unwrap();
            let mut head = [0u8; 1024];
            let _ = stream.read(&mut head);
            let len = DEFAULT_MAX_BYTES + 1;
            let _ = write!(stream, "HTTP/1.1 200 OK\r\nContent-Length: {len}\r\n\r\nabc");
        });
        let dir = tempfile::tempdir().unwrap();
        let cache = Cache::open(dir.path()).unwrap();
        let options = FetchOptions {
            attempts: 1,
            ..FetchOptions::default()
        };
        let err = fetch_url(&url, &"0".repeat(64), &cache, &options, &Ui::plain()).unwrap_err();
        assert!(
            format!("{err:#}").contains("more than the 4294967296 allowed"),
            "{err:#}"
        );
        assert_eq!(std::fs::read_dir(cache.root().join("tmp")).unwrap().count(), 0);
    }
}
