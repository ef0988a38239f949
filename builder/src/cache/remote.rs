//! The shared artifact cache (`--cache-remote URL`, `$IMGBUILD_CACHE_REMOTE`):
//! stage artifacts by full cache key on any static HTTP server, CDN or
//! directory, so a CI runner takes what another runner built.
//!
//! Remote layout, written by `imgbuild cache push` (archive first, then the
//! entry's signature, then the entry, then the index, each through a temp
//! name and a rename):
//! - `<area>/<key>.tar`: the artifact (a kernel's artifact dir as a tar, a
//!   rootfs base tarball as it is);
//! - `<area>/<key>.json`: its [`Entry`]: format, area, key, what the key was
//!   built from, and the archive's sha256 and size;
//! - `<area>/<key>.json.sig`: an armored detached GPG signature of exactly
//!   those bytes (`cache push --gpg-key`);
//! - `index.json`: every entry, for people and `curl` (never read back).
//!
//! Nothing authenticates a server, so an entry is: a reader asks for the
//! entry and its signature first, checks the signature with the key pinned
//! by `--cache-remote-key` alone (in a throwaway GnuPG home), and then that
//! the entry is for the area and key asked. Only then does it download the
//! archive, streamed into the local cache within a deadline and a minimum
//! rate ([`Pace`]), capped at the entry's size and sha256-checked; the
//! artifact is then checked again as a local one would be. Whatever fails,
//! the stage builds locally and says why. Without a pinned key a remote is
//! refused unless `--cache-remote-insecure`, and what it serves is marked
//! in the local cache ([`insecure_origin`]) for the commit to record.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

use super::Cache;
use super::download::{self as fetch, FetchOptions, Pace};
use crate::io::gpg::PinnedKeyring;
use crate::io::hashing::is_sha256_hex;
use crate::stage::Key;
use crate::ui::Ui;

/// The areas the remote serves: kernels (dirs) and rootfs bases (tar files).
pub const KERNELS: &str = "kernels";
pub const ROOTFS_BASE: &str = "rootfs-base";
pub const AREAS: [&str; 2] = [KERNELS, ROOTFS_BASE];

/// The variables behind `--cache-remote`, `--cache-remote-key` and
/// `--cache-remote-insecure`.
pub const URL_VAR: &str = "IMGBUILD_CACHE_REMOTE";
pub const KEY_VAR: &str = "IMGBUILD_CACHE_REMOTE_KEY";
pub const INSECURE_VAR: &str = "IMGBUILD_CACHE_REMOTE_INSECURE";

/// The most an entry's JSON or signature may hold; the most an archive may
/// claim; the largest key file read.
const ENTRY_LIMIT: u64 = 1 << 20;
const ARCHIVE_LIMIT: u64 = 16 << 30;
const KEY_FILE_LIMIT: u64 = 1 << 20;

/// One artifact on the remote. Its JSON, as served, is what is signed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct Entry {
    pub format: u32,
    pub area: String,
    pub key: String,
    /// sha256 of `<area>/<key>.tar`.
    pub sha256: String,
    pub size: u64,
    /// What it is, for `index.json` readers (a kernel release, a suite).
    #[serde(default)]
    pub describe: String,
    /// What the key was built from: the stage's cache-key inputs, which
    /// hash to `key` (empty when the local cache did not keep them).
    #[serde(default)]
    pub inputs: BTreeMap<String, String>,
}

/// 2: signed entries with their inputs.
pub const ENTRY_FORMAT: u32 = 2;

/// `index.json`: every entry the remote holds.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct Index {
    pub format: u32,
    pub entries: Vec<Entry>,
}

/// The remote's settings are not ones this cache can use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad cache remote {url:?} ({origin}): {why}")]
pub struct BadRemote {
    pub url: String,
    /// The flag or variable at fault: `--cache-remote`,
    /// `--cache-remote-key`, `IMGBUILD_CACHE_REMOTE_KEY`, ...
    pub origin: String,
    pub why: String,
}

/// Why an entry of the remote was not used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EntryRefused {
    #[error("{entry} has no signature ({entry}.sig): entries are signed by `imgbuild cache push --gpg-key`")]
    Unsigned { entry: String },
    #[error(
        "{entry}.sig is not a good signature by the key pinned with --cache-remote-key ({pinned}): {why}"
    )]
    BadSignature {
        entry: String,
        pinned: String,
        why: String,
    },
    #[error("{entry} is the entry of {found}, not of {asked}")]
    OtherEntry {
        entry: String,
        found: String,
        asked: String,
    },
}

/// Where an archive, its entry and the entry's signature live, relative to
/// the remote's root.
pub fn archive_path(area: &str, key: &str) -> PathBuf {
    PathBuf::from(area).join(format!("{key}.tar"))
}

pub fn entry_path(area: &str, key: &str) -> PathBuf {
    PathBuf::from(area).join(format!("{key}.json"))
}

pub fn signature_path(area: &str, key: &str) -> PathBuf {
    PathBuf::from(area).join(format!("{key}.json.sig"))
}

impl Entry {
    /// The bytes `cache push` signs and serves as `<area>/<key>.json`.
    pub fn signed_bytes(&self) -> Result<Vec<u8>> {
        Ok(serde_json::to_vec_pretty(self)?)
    }

    /// Parses an entry and checks it is the one asked for.
    pub fn parse(bytes: &[u8], area: &str, key: &str) -> Result<Entry> {
        let entry: Entry = serde_json::from_slice(bytes).context("parsing the entry")?;
        if entry.format != ENTRY_FORMAT {
            bail!(
                "entry format {} (this imgbuild reads {ENTRY_FORMAT})",
                entry.format
            );
        }
        if entry.area != area || entry.key != key {
            return Err(EntryRefused::OtherEntry {
                entry: entry_path(area, key).display().to_string(),
                found: format!("{}/{}", entry.area, entry.key),
                asked: format!("{area}/{key}"),
            }
            .into());
        }
        if !is_sha256_hex(&entry.sha256) {
            bail!("the entry's sha256 {:?} is not 64 hex digits", entry.sha256);
        }
        if entry.size > ARCHIVE_LIMIT {
            bail!("the entry claims {} bytes (limit {ARCHIVE_LIMIT})", entry.size);
        }
        let inputs_digest = Key {
            inputs: entry.inputs.clone(),
        }
        .digest();
        if !entry.inputs.is_empty() && inputs_digest != entry.key {
            bail!("the entry's inputs hash to {inputs_digest}, not to its key");
        }
        Ok(entry)
    }
}

/// How the remote's entries are trusted.
#[derive(Clone, Debug)]
pub enum Trust {
    /// Every entry needs a good signature by the key in `file`.
    Pinned {
        file: PathBuf,
        keyring: Arc<PinnedKeyring>,
    },
    /// `--cache-remote-insecure`: entries are used unverified, and the
    /// build records it.
    Insecure,
}

impl Trust {
    /// The OpenPGP public key in `file`, imported into a keyring of its own.
    pub fn pinned(file: &Path) -> Result<Trust, String> {
        let bytes = read_key_file(file).map_err(|e| format!("{}: {e:#}", file.display()))?;
        emberrtos_contract::ostree::gpg_public_key(&bytes).map_err(|e| format!("{}: {e}", file.display()))?;
        let keyring = PinnedKeyring::import(&bytes).map_err(|e| format!("{}: {e:#}", file.display()))?;
        Ok(Trust::Pinned {
            file: file.to_path_buf(),
            keyring: Arc::new(keyring),
        })
    }
}

fn read_key_file(file: &Path) -> Result<Vec<u8>> {
    use std::os::unix::fs::OpenOptionsExt;
    // O_NONBLOCK: a FIFO named as the key does not hang the open.
    let opened = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(file)?;
    if !opened.metadata()?.is_file() {
        bail!("not a regular file");
    }
    let mut bytes = Vec::new();
    opened.take(KEY_FILE_LIMIT + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > KEY_FILE_LIMIT {
        bail!("larger than {KEY_FILE_LIMIT} bytes: not a public key");
    }
    Ok(bytes)
}

/// A remote cache: an `http(s)://` or `file://` base URL and how its
/// entries are trusted.
#[derive(Clone, Debug)]
pub struct RemoteCache {
    base: url::Url,
    trust: Trust,
    options: FetchOptions,
    pace: Pace,
}

/// `url` as given by `origin` (the flag or the variable, for the error).
fn parse_base(url: &str, origin: &str) -> Result<url::Url, BadRemote> {
    let bad = |why: &str| BadRemote {
        url: url.to_string(),
        origin: origin.to_string(),
        why: why.to_string(),
    };
    let mut base = url::Url::parse(url).map_err(|e| bad(&e.to_string()))?;
    if !matches!(base.scheme(), "http" | "https" | "file") {
        return Err(bad("use http://, https:// or file://"));
    }
    if base.query().is_some() || base.fragment().is_some() {
        return Err(bad("a query or fragment has no place in a cache remote"));
    }
    if !base.path().ends_with('/') {
        base.set_path(&format!("{}/", base.path()));
    }
    Ok(base)
}

impl RemoteCache {
    /// `url` as given by `origin`, its entries trusted as `trust` says.
    pub fn parse(url: &str, origin: &str, trust: Trust) -> Result<RemoteCache, BadRemote> {
        Ok(RemoteCache::new(parse_base(url, origin)?, trust))
    }

    fn new(base: url::Url, trust: Trust) -> RemoteCache {
        RemoteCache {
            base,
            trust,
            options: FetchOptions::default(),
            pace: Pace::default(),
        }
    }

    /// Shorter waits and fewer attempts (tests).
    pub fn with_fetch_options(mut self, options: FetchOptions) -> RemoteCache {
        self.options = options;
        self
    }

    /// How slow an archive download may be.
    pub fn with_pace(mut self, pace: Pace) -> RemoteCache {
        self.pace = pace;
        self
    }

    pub fn url(&self) -> &str {
        self.base.as_str()
    }

    /// Whether entries are used unverified (`--cache-remote-insecure`).
    pub fn is_insecure(&self) -> bool {
        matches!(self.trust, Trust::Insecure)
    }

    fn join(&self, rel: &Path) -> Result<url::Url> {
        self.base
            .join(&rel.to_string_lossy())
            .with_context(|| format!("joining {} to {}", rel.display(), self.base))
    }

    /// The archive of `area`/`key`, downloaded into the cache's blobs and
    /// verified; `None` (and a note) when the remote does not have it.
    pub fn fetch_archive(
        &self,
        cache: &Cache,
        area: &str,
        key: &str,
        ui: &Ui,
    ) -> Result<Option<fetch::Fetched>> {
        if !is_sha256_hex(key) {
            bail!("the cache key {key:?} is not 64 hex digits");
        }
        let Some(entry) = self.entry(area, key)? else {
            ui.note(format!("not on the cache remote: {area}/{}", &key[..16]));
            return Ok(None);
        };
        ui.note(format!(
            "on the cache remote: {area}/{} ({} bytes{})",
            &key[..16],
            entry.size,
            if self.is_insecure() {
                ", UNVERIFIED"
            } else {
                ", signature verified"
            }
        ));
        self.download(cache, &entry, ui).map(Some)
    }

    /// The entry of `area`/`key`: its signature checked with the pinned key
    /// (unless insecure), then that it is the entry asked for.
    fn entry(&self, area: &str, key: &str) -> Result<Option<Entry>> {
        let entry_url = self.join(&entry_path(area, key))?;
        let Some(bytes) = self.read_small(&entry_url)? else {
            return Ok(None);
        };
        if let Trust::Pinned { file, keyring } = &self.trust {
            let signature = self.read_small(&self.join(&signature_path(area, key))?)?;
            authenticate(keyring, file, &bytes, signature.as_deref(), entry_url.as_str())?;
        }
        Entry::parse(&bytes, area, key)
            .with_context(|| format!("reading {entry_url}"))
            .map(Some)
    }

    /// The archive `entry` describes, capped at its size and checked
    /// against its sha256.
    fn download(&self, cache: &Cache, entry: &Entry, ui: &Ui) -> Result<fetch::Fetched> {
        let archive_url = self.join(&archive_path(&entry.area, &entry.key))?;
        let fetched = if archive_url.scheme() == "file" {
            let path = file_path(&archive_url)?;
            let meta =
                std::fs::symlink_metadata(&path).with_context(|| format!("reading {}", path.display()))?;
            if !meta.is_file() {
                bail!("{} is not a regular file", path.display());
            }
            // Checked before a byte is hashed or copied.
            if meta.len() != entry.size {
                bail!(
                    "{} has {} bytes, its entry says {}",
                    path.display(),
                    meta.len(),
                    entry.size
                );
            }
            fetch::import_file(&path, Some(&entry.sha256), cache, ui)?
        } else {
            let options = FetchOptions {
                max_bytes: Some(entry.size),
                ..self.options.clone()
            };
            let url = archive_url.as_str();
            fetch::fetch_url_paced(url, &entry.sha256, cache, &options, &self.pace, ui)?
        };
        if fetched.size != entry.size {
            if !fetched.cached {
                let _ = std::fs::remove_file(&fetched.path);
            }
            bail!(
                "{archive_url} has {} bytes, its entry says {}",
                fetched.size,
                entry.size
            );
        }
        Ok(fetched)
    }

    /// A small file (an entry, a signature): `None` when the remote has no
    /// such file.
    fn read_small(&self, url: &url::Url) -> Result<Option<Vec<u8>>> {
        if url.scheme() == "file" {
            let path = file_path(url)?;
            return match crate::io::open_nofollow(&path) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(e).with_context(|| format!("opening {}", path.display())),
                Ok(file) => read_capped(file, &path.display().to_string()).map(Some),
            };
        }
        let response = fetch::http_client(&self.options)?
            .get(url.as_str())
            .send()
            .with_context(|| format!("asking {url}"))?;
        if response.status() == reqwest::StatusCode::NOT_FOUND {
            return Ok(None);
        }
        if !response.status().is_success() {
            bail!("{url}: the server answered {}", response.status());
        }
        read_capped(fetch::paced(response, &self.pace), url.as_str()).map(Some)
    }
}

/// Checks that `signature` is a good signature of the entry's bytes by the
/// pinned key, with that key's keyring alone.
fn authenticate(
    keyring: &PinnedKeyring,
    pinned: &Path,
    entry: &[u8],
    signature: Option<&[u8]>,
    entry_name: &str,
) -> Result<()> {
    let Some(signature) = signature else {
        return Err(EntryRefused::Unsigned {
            entry: entry_name.to_string(),
        }
        .into());
    };
    let verification = keyring.verify(entry, signature)?;
    if keyring.good(&verification) {
        return Ok(());
    }
    Err(EntryRefused::BadSignature {
        entry: entry_name.to_string(),
        pinned: pinned.display().to_string(),
        why: verification
            .problem
            .unwrap_or_else(|| "it is not by the pinned key".into()),
    }
    .into())
}

fn file_path(url: &url::Url) -> Result<PathBuf> {
    url.to_file_path()
        .map_err(|()| anyhow::anyhow!("{url} is not a local path"))
}

fn read_capped(reader: impl Read, what: &str) -> Result<Vec<u8>> {
    let mut bytes = Vec::new();
    reader
        .take(ENTRY_LIMIT + 1)
        .read_to_end(&mut bytes)
        .with_context(|| format!("reading {what}"))?;
    if bytes.len() as u64 > ENTRY_LIMIT {
        bail!("{what} is larger than {ENTRY_LIMIT} bytes");
    }
    Ok(bytes)
}

/// The remote's settings from the command line; each one unset there comes
/// from its variable ([`URL_VAR`], [`KEY_VAR`], [`INSECURE_VAR`]).
#[derive(Clone, Debug, Default)]
pub struct RemoteFlags {
    /// `--cache-remote`.
    pub url: Option<String>,
    /// `--cache-remote-key`.
    pub key: Option<PathBuf>,
    /// `--cache-remote-insecure`.
    pub insecure: bool,
}

/// The remote `flags` and the environment (`env`) name, if any. A remote
/// needs a pinned key, or `--cache-remote-insecure`.
pub fn from_flags(
    flags: &RemoteFlags,
    env: impl Fn(&str) -> Option<String>,
) -> Result<Option<RemoteCache>, BadRemote> {
    let var = |name: &str| env(name).filter(|v| !v.is_empty());
    let (url, origin) = match (&flags.url, var(URL_VAR)) {
        (Some(url), _) => (url.clone(), "--cache-remote"),
        (None, Some(url)) => (url, URL_VAR),
        (None, None) => return Ok(None),
    };
    let base = parse_base(&url, origin)?;
    let bad = |origin: &str, why: String| BadRemote {
        url: url.clone(),
        origin: origin.to_string(),
        why,
    };
    let key = match (&flags.key, var(KEY_VAR)) {
        (Some(file), _) => Some((file.clone(), "--cache-remote-key")),
        (None, Some(file)) => Some((PathBuf::from(file), KEY_VAR)),
        (None, None) => None,
    };
    let insecure = match var(INSECURE_VAR).as_deref() {
        None | Some("0") => flags.insecure,
        Some("1") => true,
        Some(other) => return Err(bad(INSECURE_VAR, format!("{other:?}: use 1 or 0"))),
    };
    let trust = match key {
        Some((file, origin)) => Trust::pinned(&file).map_err(|why| bad(origin, why))?,
        None if insecure => Trust::Insecure,
        None => return Err(bad("--cache-remote-key", unpinned_why(&base))),
    };
    Ok(Some(RemoteCache::new(base, trust)))
}

fn unpinned_why(base: &url::Url) -> String {
    let http = if base.scheme() == "http" {
        " (over http:// anyone on the way can answer for it)"
    } else {
        ""
    };
    format!(
        "nothing would authenticate its entries{http}: pin the key that signs them (`imgbuild cache push --gpg-key`) with --cache-remote-key FILE (or ${KEY_VAR}), or pass --cache-remote-insecure (${INSECURE_VAR}=1) to use them unverified: the commit then records it and the tag stage refuses an rt ref"
    )
}

/// The marker of an artifact in the local cache that came from an
/// unverified remote entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
struct InsecureMarker {
    remote: String,
}

const INSECURE_INDEX: &str = "insecure-remote";

fn marker_name(area: &str, key: &str) -> String {
    format!("{area}/{key}")
}

/// The remote an artifact of the local cache was taken from unverified
/// (`--cache-remote-insecure`), if it was. A marker that cannot be read
/// still counts.
pub fn insecure_origin(cache: &Cache, area: &str, key: &str) -> Option<String> {
    let name = marker_name(area, key);
    std::fs::symlink_metadata(cache.index_path(INSECURE_INDEX, &name)).ok()?;
    Some(
        cache
            .read_index::<InsecureMarker>(INSECURE_INDEX, &name)
            .map_or_else(|| "an unverified cache remote".into(), |m| m.remote),
    )
}

fn mark_insecure(cache: &Cache, area: &str, key: &str, remote: &str) -> Result<()> {
    let marker = InsecureMarker {
        remote: remote.to_string(),
    };
    cache.write_index(INSECURE_INDEX, &marker_name(area, key), &marker)
}

/// Forgets the marker once the artifact was built here or taken verified.
pub fn forget_insecure(cache: &Cache, area: &str, key: &str) {
    let _ = std::fs::remove_file(cache.index_path(INSECURE_INDEX, &marker_name(area, key)));
}

/// Takes a remote artifact into the cache: `place(blob)` turns the verified
/// archive into the local entry and checks it. A failure is a warning: the
/// caller builds instead. The downloaded blob is removed afterwards unless it
/// was in the cache before. An unverified artifact is marked before it is
/// placed, so a kill in between leaves a marker, never an unmarked artifact.
pub fn take<T>(
    cache: &Cache,
    area: &str,
    key: &str,
    ui: &Ui,
    place: impl FnOnce(&Path) -> Result<T>,
) -> Option<T> {
    let remote = cache.remote()?;
    let attempt = || -> Result<Option<T>> {
        let Some(fetched) = remote.fetch_archive(cache, area, key, ui)? else {
            return Ok(None);
        };
        if remote.is_insecure() {
            mark_insecure(cache, area, key, remote.url())?;
            ui.warn(format!(
                "{area}/{}: taken UNVERIFIED from {} (--cache-remote-insecure); the commit records it",
                &key[..16],
                remote.url()
            ));
        }
        let placed = place(&fetched.path);
        if !fetched.cached {
            let _ = std::fs::remove_file(&fetched.path);
        }
        let placed = placed?;
        if !remote.is_insecure() {
            forget_insecure(cache, area, key);
        }
        Ok(Some(placed))
    };
    match attempt() {
        Ok(found) => found,
        Err(e) => {
            ui.warn(format!(
                "the cache remote's {area}/{} was not used: {e:#}; building it here",
                &key[..key.len().min(16)]
            ));
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::gpg::test_keys::TestKey;
    use crate::io::hashing::sha256_hex;

    const KEY: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    fn entry(area: &str, key: &str, archive: &[u8]) -> Entry {
        Entry {
            format: ENTRY_FORMAT,
            area: area.into(),
            key: key.into(),
            sha256: sha256_hex(archive),
            size: archive.len() as u64,
            describe: "kernel 6.12.0".into(),
            inputs: BTreeMap::new(),
        }
    }

    fn bytes(entry: &Entry) -> Vec<u8> {
        entry.signed_bytes().unwrap()
    }

    fn refusal(err: &anyhow::Error) -> &EntryRefused {
        err.downcast_ref::<EntryRefused>()
            .unwrap_or_else(|| panic!("not an EntryRefused: {err:#}"))
    }

    #[test]
    fn the_signed_payload_binds_every_field_of_the_entry() {
        let inputs = Key::new().with("source", "abc").with("config", "def");
        let mut signed = entry(KERNELS, &inputs.digest(), b"archive");
        signed.inputs = inputs.inputs.clone();
        let payload = bytes(&signed);
        let json: serde_json::Value = serde_json::from_slice(&payload).unwrap();
        for field in ["format", "area", "key", "sha256", "size", "describe", "inputs"] {
            assert!(json.get(field).is_some(), "{field} is not signed: {json}");
        }
        assert_eq!(json["inputs"]["source"], "abc");
        assert_eq!(Entry::parse(&payload, KERNELS, &signed.key).unwrap(), signed);
        // Any change to any field is a change to the signed bytes.
        let changes: [fn(&mut Entry); 6] = [
            |e| e.format += 1,
            |e| e.area = ROOTFS_BASE.into(),
            |e| e.sha256 = KEY.into(),
            |e| e.size += 1,
            |e| e.describe.push('!'),
            |e| {
                e.inputs.insert("make".into(), "x".into());
            },
        ];
        for change in changes {
            let mut other = signed.clone();
            change(&mut other);
            assert_ne!(bytes(&other), payload, "{other:?}");
        }
    }

    #[test]
    fn an_entry_must_be_the_one_asked_for() {
        let good = bytes(&entry(KERNELS, KEY, b"x"));
        assert_eq!(Entry::parse(&good, KERNELS, KEY).unwrap().size, 1);
        let other_key = KEY.replace('0', "1");
        let err = Entry::parse(&good, KERNELS, &other_key).unwrap_err();
        assert!(
            matches!(refusal(&err), EntryRefused::OtherEntry { .. }),
            "{err:#}"
        );
        let err = Entry::parse(&good, ROOTFS_BASE, KEY).unwrap_err();
        assert!(
            matches!(refusal(&err), EntryRefused::OtherEntry { .. }),
            "{err:#}"
        );
        let mut bad_sha = entry(KERNELS, KEY, b"x");
        bad_sha.sha256 = "../../etc/passwd".into();
        let err = Entry::parse(&bytes(&bad_sha), KERNELS, KEY).unwrap_err();
        assert!(err.to_string().contains("sha256"), "{err:#}");
        let mut huge = entry(KERNELS, KEY, b"x");
        huge.size = u64::MAX;
        let err = Entry::parse(&bytes(&huge), KERNELS, KEY).unwrap_err();
        assert!(err.to_string().contains("claims"), "{err:#}");
        let text = String::from_utf8(good.clone()).unwrap();
        let extra = text.replace("\"size\"", "\"archive\": \"/etc/shadow\", \"size\"");
        assert!(Entry::parse(extra.as_bytes(), KERNELS, KEY).is_err());
        let old = text.replace("\"format\": 2", "\"format\": 1");
        let err = Entry::parse(old.as_bytes(), KERNELS, KEY).unwrap_err();
        assert!(err.to_string().contains("entry format 1"), "{err:#}");
    }

    #[test]
    fn an_entrys_inputs_must_hash_to_its_key() {
        let inputs = Key::new().with("source", "abc");
        let mut named = entry(KERNELS, &inputs.digest(), b"x");
        named.inputs = inputs.inputs.clone();
        Entry::parse(&bytes(&named), KERNELS, &named.key).unwrap();
        named.inputs.insert("source".into(), "abd".into());
        let err = Entry::parse(&bytes(&named), KERNELS, &named.key).unwrap_err();
        assert!(err.to_string().contains("inputs hash to"), "{err:#}");
    }

    /// A pinned key, another key, and a file:// remote whose `kernels/KEY`
    /// holds a self-consistent archive (its entry's sha256 and size match).
    struct Fixture {
        pinned: TestKey,
        other: TestKey,
        dir: tempfile::TempDir,
        cache: Cache,
        archive: Vec<u8>,
    }

    fn fixture() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("remote/kernels")).unwrap();
        let archive = b"a tar that must never be used".to_vec();
        std::fs::write(
            dir.path().join("remote").join(archive_path(KERNELS, KEY)),
            &archive,
        )
        .unwrap();
        let cache = Cache::open(&dir.path().join("cache")).unwrap();
        let (pinned, other) = (TestKey::generate("pinned"), TestKey::generate("other"));
        Fixture {
            pinned,
            other,
            dir,
            cache,
            archive,
        }
    }

    impl Fixture {
        /// Serves `entry` and `signature` as kernels/KEY's, read with the
        /// pinned key (or insecurely).
        fn serve(&self, entry: &[u8], signature: Option<Vec<u8>>, insecure: bool) -> Cache {
            let root = self.dir.path().join("remote");
            std::fs::write(root.join(entry_path(KERNELS, KEY)), entry).unwrap();
            let sig = root.join(signature_path(KERNELS, KEY));
            match signature {
                Some(signature) => std::fs::write(&sig, signature).unwrap(),
                None => {
                    let _ = std::fs::remove_file(&sig);
                }
            }
            let key_file = self.dir.path().join("pinned.asc");
            std::fs::write(&key_file, &self.pinned.public).unwrap();
            let trust = if insecure {
                Trust::Insecure
            } else {
                Trust::pinned(&key_file).unwrap()
            };
            let url = format!("file://{}", root.display());
            let remote = RemoteCache::parse(&url, "--cache-remote", trust).unwrap();
            self.cache.clone().with_remote(Some(remote))
        }

        /// `take` of kernels/KEY: the refusal (or `None` when used) and
        /// whether `place` ran.
        fn take(&self, cache: &Cache) -> (Option<anyhow::Error>, bool) {
            let remote = cache.remote().unwrap();
            let refused = remote.fetch_archive(cache, KERNELS, KEY, &Ui::plain()).err();
            let mut placed = false;
            take(cache, KERNELS, KEY, &Ui::plain(), |_| {
                placed = true;
                Ok(())
            });
            (refused, placed)
        }

        fn blobs(&self) -> usize {
            std::fs::read_dir(self.cache.root().join("blobs/sha256"))
                .unwrap()
                .count()
        }
    }

    #[test]
    fn entries_not_signed_by_the_pinned_key_for_this_key_are_refused_and_never_used() {
        let f = fixture();
        let asked = entry(KERNELS, KEY, &f.archive);
        let other_key = entry(KERNELS, &KEY.replace('0', "2"), &f.archive);
        let other_area = entry(ROOTFS_BASE, KEY, &f.archive);
        let mut tampered = asked.clone();
        tampered.describe = "kernel 6.12.0, trust me".into();
        let by = |key: &TestKey, e: &Entry| Some(key.sign(&bytes(e)));
        let cases = [
            (
                "signed by another key",
                bytes(&asked),
                by(&f.other, &asked),
                "BadSignature",
            ),
            (
                "a signature over another entry",
                bytes(&asked),
                by(&f.pinned, &other_key),
                "BadSignature",
            ),
            (
                "another key's entry, signed",
                bytes(&other_key),
                by(&f.pinned, &other_key),
                "OtherEntry",
            ),
            (
                "another area's entry, signed",
                bytes(&other_area),
                by(&f.pinned, &other_area),
                "OtherEntry",
            ),
            ("no signature", bytes(&asked), None, "Unsigned"),
            (
                "tampered after signing",
                bytes(&tampered),
                by(&f.pinned, &asked),
                "BadSignature",
            ),
        ];
        for (case, served, signature, expected) in cases {
            let cache = f.serve(&served, signature, false);
            let (refused, placed) = f.take(&cache);
            let err = refused.unwrap_or_else(|| panic!("{case}: accepted"));
            let kind = match refusal(&err) {
                EntryRefused::Unsigned { .. } => "Unsigned",
                EntryRefused::BadSignature { .. } => "BadSignature",
                EntryRefused::OtherEntry { .. } => "OtherEntry",
            };
            assert_eq!(kind, expected, "{case}: {err:#}");
            assert!(!placed, "{case}: the archive was used");
            assert_eq!(f.blobs(), 0, "{case}: the archive was read into the cache");
        }
        let err = f
            .take(&f.serve(&bytes(&asked), by(&f.other, &asked), false))
            .0
            .unwrap();
        let text = format!("{err:#}");
        assert!(
            text.contains("--cache-remote-key") && text.contains("pinned.asc"),
            "{text}"
        );
    }

    #[test]
    fn an_entry_signed_by_the_pinned_key_is_used_and_unmarked() {
        let f = fixture();
        let asked = entry(KERNELS, KEY, &f.archive);
        let cache = f.serve(&bytes(&asked), Some(f.pinned.sign(&bytes(&asked))), false);
        let (refused, placed) = f.take(&cache);
        assert!(refused.is_none(), "{refused:?}");
        assert!(placed);
        assert_eq!(insecure_origin(&cache, KERNELS, KEY), None);
    }

    #[test]
    fn an_insecure_remote_is_used_unverified_and_the_artifact_marked() {
        let f = fixture();
        let asked = entry(KERNELS, KEY, &f.archive);
        let cache = f.serve(&bytes(&asked), None, true);
        let (refused, placed) = f.take(&cache);
        assert!(refused.is_none() && placed, "{refused:?}");
        let origin = insecure_origin(&cache, KERNELS, KEY).unwrap();
        assert!(origin.starts_with("file://"), "{origin}");
        assert_eq!(insecure_origin(&cache, ROOTFS_BASE, KEY), None);
        // Taken again verified, the mark goes.
        let cache = f.serve(&bytes(&asked), Some(f.pinned.sign(&bytes(&asked))), false);
        assert!(f.take(&cache).1);
        assert_eq!(insecure_origin(&cache, KERNELS, KEY), None);
    }

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        |name| vars.iter().find(|(k, _)| *k == name).map(|(_, v)| v.to_string())
    }

    fn insecure_flags(url: &str) -> RemoteFlags {
        RemoteFlags {
            url: Some(url.into()),
            insecure: true,
            ..RemoteFlags::default()
        }
    }

    #[test]
    fn remote_urls_name_what_is_wrong_and_where_it_came_from() {
        let remote =
            RemoteCache::parse("http://127.0.0.1:8080/cache", "--cache-remote", Trust::Insecure).unwrap();
        assert_eq!(remote.url(), "http://127.0.0.1:8080/cache/");
        assert_eq!(
            remote.join(&archive_path(KERNELS, KEY)).unwrap().as_str(),
            format!("http://127.0.0.1:8080/cache/kernels/{KEY}.tar")
        );
        let flags = RemoteFlags::default();
        let err = from_flags(&flags, env(&[(URL_VAR, "ssh://host/cache")])).unwrap_err();
        assert_eq!(err.origin, URL_VAR);
        assert!(err.to_string().contains("use http://"), "{err}");
        assert!(from_flags(&insecure_flags("not a url"), env(&[])).is_err());
        assert!(from_flags(&insecure_flags("http://h/c?x=1"), env(&[])).is_err());
    }

    #[test]
    fn the_flag_wins_over_the_environment_and_empty_means_none() {
        let vars = [(URL_VAR, "http://b/"), (INSECURE_VAR, "1")];
        let flags = RemoteFlags {
            url: Some("http://a/".into()),
            ..RemoteFlags::default()
        };
        assert_eq!(
            from_flags(&flags, env(&vars)).unwrap().unwrap().url(),
            "http://a/"
        );
        let flags = RemoteFlags::default();
        let from_env = from_flags(&flags, env(&[(URL_VAR, "file:///srv/c"), (INSECURE_VAR, "1")]));
        assert_eq!(from_env.unwrap().unwrap().url(), "file:///srv/c/");
        assert!(from_flags(&flags, env(&[(URL_VAR, "")])).unwrap().is_none());
        let err = from_flags(&flags, env(&[(URL_VAR, "gopher://x")])).unwrap_err();
        assert_eq!(err.origin, URL_VAR);
    }

    #[test]
    fn a_remote_without_a_pinned_key_is_refused_unless_insecure() {
        for url in [
            "http://cache.example/",
            "https://cache.example/",
            "file:///srv/cache",
        ] {
            let flags = RemoteFlags {
                url: Some(url.into()),
                ..RemoteFlags::default()
            };
            let err = from_flags(&flags, env(&[])).unwrap_err();
            assert_eq!(err.origin, "--cache-remote-key", "{err}");
            let text = err.to_string();
            assert!(
                text.contains("--cache-remote-insecure") && text.contains(KEY_VAR),
                "{text}"
            );
            assert_eq!(text.contains("http://"), url.starts_with("http:"), "{text}");
            let err = from_flags(&flags, env(&[(INSECURE_VAR, "yes")])).unwrap_err();
            assert_eq!(err.origin, INSECURE_VAR);
            assert!(from_flags(&flags, env(&[(INSECURE_VAR, "0")])).is_err());
            let insecure = from_flags(&flags, env(&[(INSECURE_VAR, "1")])).unwrap().unwrap();
            assert!(insecure.is_insecure());
            assert!(
                from_flags(&insecure_flags(url), env(&[]))
                    .unwrap()
                    .unwrap()
                    .is_insecure()
            );
        }
    }

    #[test]
    fn a_pinned_key_must_be_an_openpgp_public_key() {
        let dir = tempfile::tempdir().unwrap();
        let key = TestKey::generate("pinned");
        let public = dir.path().join("public.asc");
        std::fs::write(&public, &key.public).unwrap();
        let flags = RemoteFlags {
            url: Some("http://cache.example/".into()),
            key: Some(public.clone()),
            insecure: true,
        };
        let remote = from_flags(&flags, env(&[])).unwrap().unwrap();
        assert!(
            !remote.is_insecure(),
            "a pinned key wins over --cache-remote-insecure"
        );
        let private = dir.path().join("private.asc");
        std::fs::write(&private, b"-----BEGIN PGP PRIVATE KEY BLOCK-----\n\nlQ\n").unwrap();
        let garbage = dir.path().join("garbage");
        std::fs::write(&garbage, b"hello").unwrap();
        let missing = dir.path().join("missing.asc");
        for (file, why) in [
            (&private, "private key"),
            (&garbage, "not an OpenPGP public key"),
            (&missing, "No such file"),
        ] {
            let flags = RemoteFlags {
                key: Some(file.clone()),
                ..insecure_flags("http://cache.example/")
            };
            let err = from_flags(&flags, env(&[])).unwrap_err();
            assert_eq!(err.origin, "--cache-remote-key");
            assert!(
                err.why.contains(&file.display().to_string()) && err.why.contains(why),
                "{err}"
            );
        }
        let from_env = from_flags(
            &RemoteFlags::default(),
            env(&[(URL_VAR, "http://c/"), (KEY_VAR, garbage.to_str().unwrap())]),
        );
        assert_eq!(from_env.unwrap_err().origin, KEY_VAR);
    }
}
