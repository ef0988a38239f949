//! The shared artifact cache (`--cache-remote URL`, `$IMGBUILD_CACHE_REMOTE`):
//! stage artifacts by full cache key on any static HTTP server, CDN or
//! directory, so a CI runner takes what another runner built.
//!
//! Remote layout, written by `imgbuild cache push` (archive first, then its
//! entry, then the index, each through a temp name and a rename):
//! - `<area>/<key>.tar`: the artifact (a kernel's artifact dir as a tar, a
//!   rootfs base tarball as it is);
//! - `<area>/<key>.json`: its [`Entry`] (sha256 and size of the archive);
//! - `index.json`: every entry, for people and `curl`.
//!
//! A reader asks for the entry first and downloads nothing without one, so it
//! never sees half an entry. The archive streams into the local cache with
//! its sha256 checked and its size capped at the entry's; the artifact is
//! then checked again as a local one would be. Whatever fails, the stage
//! builds locally and says why.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

use super::Cache;
use super::download::{self as fetch, FetchOptions};
use crate::io::hashing::is_sha256_hex;
use crate::ui::Ui;

/// The areas the remote serves: kernels (dirs) and rootfs bases (tar files).
pub const KERNELS: &str = "kernels";
pub const ROOTFS_BASE: &str = "rootfs-base";
pub const AREAS: [&str; 2] = [KERNELS, ROOTFS_BASE];

/// The most an entry's JSON may hold; the most an archive may claim.
const ENTRY_LIMIT: u64 = 1 << 20;
const ARCHIVE_LIMIT: u64 = 16 << 30;

/// One artifact on the remote.
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
}

pub const ENTRY_FORMAT: u32 = 1;

/// `index.json`: every entry the remote holds.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct Index {
    pub format: u32,
    pub entries: Vec<Entry>,
}

/// The remote's address is not one this cache can read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad cache remote {url:?} ({origin}): {why}")]
pub struct BadRemote {
    pub url: String,
    /// `--cache-remote` or `IMGBUILD_CACHE_REMOTE`.
    pub origin: String,
    pub why: String,
}

/// Where an archive and its entry live, relative to the remote's root.
pub fn archive_path(area: &str, key: &str) -> PathBuf {
    PathBuf::from(area).join(format!("{key}.tar"))
}

pub fn entry_path(area: &str, key: &str) -> PathBuf {
    PathBuf::from(area).join(format!("{key}.json"))
}

impl Entry {
    /// Parses an entry and checks it is the one asked for.
    pub fn parse(text: &str, area: &str, key: &str) -> Result<Entry> {
        let entry: Entry = serde_json::from_str(text).context("parsing the entry")?;
        if entry.format != ENTRY_FORMAT {
            bail!(
                "entry format {} (this imgbuild reads {ENTRY_FORMAT})",
                entry.format
            );
        }
        if entry.area != area || entry.key != key {
            bail!("the entry is for {}/{}", entry.area, entry.key);
        }
        if !is_sha256_hex(&entry.sha256) {
            bail!("the entry's sha256 {:?} is not 64 hex digits", entry.sha256);
        }
        if entry.size > ARCHIVE_LIMIT {
            bail!("the entry claims {} bytes (limit {ARCHIVE_LIMIT})", entry.size);
        }
        Ok(entry)
    }
}

/// A remote cache: an `http(s)://` or `file://` base URL.
#[derive(Clone, Debug)]
pub struct RemoteCache {
    base: url::Url,
    options: FetchOptions,
}

impl RemoteCache {
    /// `url` as given by `origin` (the flag or the variable, for the error).
    pub fn parse(url: &str, origin: &str) -> Result<RemoteCache, BadRemote> {
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
        Ok(RemoteCache {
            base,
            options: FetchOptions::default(),
        })
    }

    /// Shorter waits and fewer attempts (tests).
    pub fn with_fetch_options(mut self, options: FetchOptions) -> RemoteCache {
        self.options = options;
        self
    }

    pub fn url(&self) -> &str {
        self.base.as_str()
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
        let entry_url = self.join(&entry_path(area, key))?;
        let Some(text) = self.read_small(&entry_url)? else {
            ui.note(format!("not on the cache remote: {area}/{}", &key[..16]));
            return Ok(None);
        };
        let entry = Entry::parse(&text, area, key).with_context(|| format!("reading {entry_url}"))?;
        let archive_url = self.join(&archive_path(area, key))?;
        ui.note(format!(
            "on the cache remote: {area}/{} ({} bytes)",
            &key[..16],
            entry.size
        ));
        let fetched = if archive_url.scheme() == "file" {
            let path = file_path(&archive_url)?;
            if !std::fs::symlink_metadata(&path)
                .with_context(|| format!("reading {}", path.display()))?
                .is_file()
            {
                bail!("{} is not a regular file", path.display());
            }
            fetch::import_file(&path, Some(&entry.sha256), cache, ui)?
        } else {
            let options = FetchOptions {
                max_bytes: Some(entry.size),
                ..self.options.clone()
            };
            fetch::fetch_url(archive_url.as_str(), &entry.sha256, cache, &options, ui)?
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
        Ok(Some(fetched))
    }

    /// A small file (an entry): `None` when the remote has no such file.
    fn read_small(&self, url: &url::Url) -> Result<Option<String>> {
        if url.scheme() == "file" {
            let path = file_path(url)?;
            return match crate::io::open_nofollow(&path) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(e).with_context(|| format!("opening {}", path.display())),
                Ok(file) => read_capped(file, &path.display().to_string()).map(Some),
            };
        }
        let client = reqwest::blocking::Client::builder()
            .connect_timeout(self.options.connect_timeout)
            .timeout(self.options.read_timeout)
            .user_agent(concat!("imgbuild/", env!("CARGO_PKG_VERSION")))
            .build()
            .context("creating the HTTP client")?;
        let response = client
            .get(url.as_str())
            .send()
            .with_context(|| format!("asking {url}"))?;
        if response.status() == reqwest::StatusCode::NOT_FOUND {
            return Ok(None);
        }
        if !response.status().is_success() {
            bail!("{url}: the server answered {}", response.status());
        }
        read_capped(response, url.as_str()).map(Some)
    }
}

fn file_path(url: &url::Url) -> Result<PathBuf> {
    url.to_file_path()
        .map_err(|()| anyhow::anyhow!("{url} is not a local path"))
}

fn read_capped(reader: impl std::io::Read, what: &str) -> Result<String> {
    use std::io::Read;
    let mut text = String::new();
    reader
        .take(ENTRY_LIMIT + 1)
        .read_to_string(&mut text)
        .with_context(|| format!("reading {what}"))?;
    if text.len() as u64 > ENTRY_LIMIT {
        bail!("{what} is larger than {ENTRY_LIMIT} bytes");
    }
    Ok(text)
}

/// The remote from `--cache-remote` or else `$IMGBUILD_CACHE_REMOTE`.
pub fn from_flag_or_env(flag: Option<&str>, env: Option<&str>) -> Result<Option<RemoteCache>, BadRemote> {
    match (flag, env.filter(|v| !v.is_empty())) {
        (Some(url), _) => RemoteCache::parse(url, "--cache-remote").map(Some),
        (None, Some(url)) => RemoteCache::parse(url, "IMGBUILD_CACHE_REMOTE").map(Some),
        (None, None) => Ok(None),
    }
}

/// Takes a remote artifact into the cache: `place(blob)` turns the verified
/// archive into the local entry and checks it. A failure is a warning: the
/// caller builds instead. The downloaded blob is removed afterwards unless it
/// was in the cache before.
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
        let placed = place(&fetched.path);
        if !fetched.cached {
            let _ = std::fs::remove_file(&fetched.path);
        }
        placed.map(Some)
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

    const KEY: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    fn entry_text(area: &str, key: &str, sha: &str, size: u64) -> String {
        format!(r#"{{"format": 1, "area": "{area}", "key": "{key}", "sha256": "{sha}", "size": {size}}}"#)
    }

    #[test]
    fn an_entry_must_be_the_one_asked_for() {
        let good = entry_text(KERNELS, KEY, KEY, 10);
        assert_eq!(Entry::parse(&good, KERNELS, KEY).unwrap().size, 10);
        let other_key = KEY.replace('0', "1");
        let err = Entry::parse(&good, KERNELS, &other_key).unwrap_err().to_string();
        assert!(err.contains("the entry is for kernels/"), "{err}");
        assert!(Entry::parse(&good, ROOTFS_BASE, KEY).is_err());
        let bad_sha = entry_text(KERNELS, KEY, "../../etc/passwd", 10);
        assert!(
            Entry::parse(&bad_sha, KERNELS, KEY)
                .unwrap_err()
                .to_string()
                .contains("sha256")
        );
        let huge = entry_text(KERNELS, KEY, KEY, u64::MAX);
        assert!(
            Entry::parse(&huge, KERNELS, KEY)
                .unwrap_err()
                .to_string()
                .contains("claims")
        );
        let extra = good.replace("\"size\"", "\"archive\": \"/etc/shadow\", \"size\"");
        assert!(Entry::parse(&extra, KERNELS, KEY).is_err());
    }

    #[test]
    fn remote_urls_name_what_is_wrong_and_where_it_came_from() {
        let remote = RemoteCache::parse("http://127.0.0.1:8080/cache", "--cache-remote").unwrap();
        assert_eq!(remote.url(), "http://127.0.0.1:8080/cache/");
        assert_eq!(
            remote.join(&archive_path(KERNELS, KEY)).unwrap().as_str(),
            format!("http://127.0.0.1:8080/cache/kernels/{KEY}.tar")
        );
        let err = RemoteCache::parse("ssh://host/cache", "IMGBUILD_CACHE_REMOTE").unwrap_err();
        assert_eq!(err.origin, "IMGBUILD_CACHE_REMOTE");
        assert!(err.to_string().contains("use http://"), "{err}");
        assert!(RemoteCache::parse("not a url", "--cache-remote").is_err());
        assert!(RemoteCache::parse("http://h/c?x=1", "--cache-remote").is_err());
    }

    #[test]
    fn the_flag_wins_over_the_environment_and_empty_means_none() {
        let chosen = from_flag_or_env(Some("http://a/"), Some("http://b/"))
            .unwrap()
            .unwrap();
        assert_eq!(chosen.url(), "http://a/");
        assert_eq!(
            from_flag_or_env(None, Some("file:///srv/c"))
                .unwrap()
                .unwrap()
                .url(),
            "file:///srv/c/"
        );
        assert!(from_flag_or_env(None, Some("")).unwrap().is_none());
        let err = from_flag_or_env(None, Some("gopher://x")).unwrap_err();
        assert_eq!(err.origin, "IMGBUILD_CACHE_REMOTE");
    }
}
