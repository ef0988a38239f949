//! The fetch stage against a real HTTP server on 127.0.0.1, and the Debian source.

use crate::common;

use std::time::Duration;

use common::{HttpServer, Reply, files_under, sha256_hex};
use imgbuild::cache::Cache;
use imgbuild::recipe::Source;
use imgbuild::stages::fetch::{ChecksumMismatch, FetchOptions, fetch};
use imgbuild::ui::Ui;

fn body() -> Vec<u8> {
    (0..300_000u32).flat_map(|i| i.to_le_bytes()).collect()
}

fn quick_retries(attempts: u32) -> FetchOptions {
    FetchOptions {
        attempts,
        backoff: Duration::from_millis(50),
        connect_timeout: Duration::from_secs(5),
        read_timeout: Duration::from_secs(5),
        max_bytes: None,
    }
}

/// Fetches the server's file pinned to `sha256`, with `attempts` quick retries.
fn fetch_from(
    server: &HttpServer,
    sha256: &str,
    cache: &Cache,
    attempts: u32,
) -> anyhow::Result<imgbuild::stages::fetch::Fetched> {
    let source = Source::Url {
        url: server.url.clone(),
        sha256: sha256.to_string(),
    };
    fetch(&source, cache, &quick_retries(attempts), &Ui::plain())
}

#[test]
fn good_download_lands_in_the_cache_by_content() {
    let dir = tempfile::tempdir().unwrap();
    let cache = Cache::open(dir.path()).unwrap();
    let body = body();
    let sha = sha256_hex(&body);
    let server = HttpServer::start("linux.tar.xz", body.clone(), vec![]);
    let fetched = fetch_from(&server, &sha, &cache, 1).unwrap();
    assert!(!fetched.cached);
    assert_eq!(fetched.path, cache.blob_path(&sha));
    assert_eq!(std::fs::read(&fetched.path).unwrap(), body);
    assert_eq!(fetched.size, body.len() as u64);
    assert_eq!(server.requests(), 1);
    assert!(files_under(&cache.root().join("tmp")).is_empty());

    // Second fetch: served from the cache, no request reaches the server.
    let again = fetch_from(&server, &sha, &cache, 1).unwrap();
    assert!(again.cached);
    assert_eq!(server.requests(), 1);
}

#[test]
fn truncated_cached_blob_is_detected_and_fetched_again() {
    let dir = tempfile::tempdir().unwrap();
    let cache = Cache::open(dir.path()).unwrap();
    let body = body();
    let sha = sha256_hex(&body);
    let server = HttpServer::start("linux.tar.xz", body.clone(), vec![]);
    let first = fetch_from(&server, &sha, &cache, 1).unwrap();
    // Damage the cached copy: it keeps its name, but lost its tail.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&first.path)
        .unwrap()
        .set_len(body.len() as u64 / 2)
        .unwrap();
    let again = fetch_from(&server, &sha, &cache, 1).unwrap();
    assert!(!again.cached, "the truncated blob was used");
    assert_eq!(server.requests(), 2);
    assert_eq!(std::fs::read(&again.path).unwrap(), body);
    assert_eq!(again.size, body.len() as u64);
    // Same size, one byte changed: the hash catches it (the blob is small).
    let mut damaged = body.clone();
    damaged[10] ^= 1;
    std::fs::write(&again.path, &damaged).unwrap();
    let third = fetch_from(&server, &sha, &cache, 1).unwrap();
    assert!(!third.cached, "the damaged blob was used");
    assert_eq!(std::fs::read(&third.path).unwrap(), body);
    assert!(files_under(&cache.root().join("tmp")).is_empty());
}

#[test]
fn wrong_sha256_caches_nothing_and_names_both_hashes() {
    let dir = tempfile::tempdir().unwrap();
    let cache = Cache::open(dir.path()).unwrap();
    let body = body();
    let server = HttpServer::start("x.tar.xz", body.clone(), vec![]);
    let wrong = "ab".repeat(32);
    let err = fetch_from(&server, &wrong, &cache, 3).unwrap_err();
    let mismatch = err
        .downcast_ref::<ChecksumMismatch>()
        .expect("a checksum mismatch");
    assert_eq!(mismatch.expected, wrong);
    assert_eq!(mismatch.actual, sha256_hex(&body));
    let text = err.to_string();
    assert!(
        text.contains(&wrong) && text.contains(&sha256_hex(&body)),
        "{text}"
    );
    // A mismatch is not transient: one request, and nothing in the cache.
    assert_eq!(server.requests(), 1);
    assert!(files_under(&cache.root().join("blobs")).is_empty());
    assert!(files_under(&cache.root().join("tmp")).is_empty());
}

#[test]
fn server_dying_mid_transfer_is_retried() {
    let dir = tempfile::tempdir().unwrap();
    let cache = Cache::open(dir.path()).unwrap();
    let body = body();
    let sha = sha256_hex(&body);
    let server = HttpServer::start(
        "x.tar.xz",
        body.clone(),
        vec![Reply::DieAfter(100_000), Reply::Status(503)],
    );
    let fetched = fetch_from(&server, &sha, &cache, 3).unwrap();
    assert_eq!(server.requests(), 3);
    assert_eq!(std::fs::read(fetched.path).unwrap(), body);
    assert!(files_under(&cache.root().join("tmp")).is_empty());
}

#[test]
fn server_dying_every_time_caches_nothing_then_a_rerun_succeeds() {
    let dir = tempfile::tempdir().unwrap();
    let cache = Cache::open(dir.path()).unwrap();
    let body = body();
    let sha = sha256_hex(&body);
    let server = HttpServer::start("x.tar.xz", body.clone(), vec![Reply::DieAfter(5000); 2]);
    let err = fetch_from(&server, &sha, &cache, 2).unwrap_err();
    assert!(format!("{err:#}").contains("gave up after 2 attempts"), "{err:#}");
    assert!(files_under(&cache.root().join("blobs")).is_empty());
    assert!(files_under(&cache.root().join("tmp")).is_empty());
    // The server recovers; the next run downloads it whole.
    let fetched = fetch_from(&server, &sha, &cache, 1).unwrap();
    assert_eq!(std::fs::read(fetched.path).unwrap(), body);
}

#[test]
fn not_found_is_not_retried() {
    let dir = tempfile::tempdir().unwrap();
    let cache = Cache::open(dir.path()).unwrap();
    let server = HttpServer::start("x", vec![1], vec![Reply::Status(404)]);
    let err = fetch_from(&server, &"00".repeat(32), &cache, 4).unwrap_err();
    assert!(format!("{err:#}").contains("404"), "{err:#}");
    assert_eq!(server.requests(), 1);
}

/// The real Debian kernel source: a tarball whose top Makefile is 6.12.
#[test]
fn debian_linux_source_is_6_12() {
    use std::io::Read;
    let dir = tempfile::tempdir().unwrap();
    let cache = Cache::open(dir.path()).unwrap();
    let source = Source::Debian {
        package: "linux-source-6.12".into(),
    };
    let fetched = fetch(&source, &cache, &FetchOptions::default(), &Ui::plain()).unwrap();
    let mut archive = tar::Archive::new(imgbuild::io::extract::open_archive(&fetched.path).unwrap());
    let mut makefile = None;
    for entry in archive.entries().unwrap() {
        let mut entry = entry.unwrap();
        let path = entry.path().unwrap().into_owned();
        if path.components().count() == 2 && path.ends_with("Makefile") {
            let mut text = String::new();
            entry.read_to_string(&mut text).unwrap();
            makefile = Some(text);
            break;
        }
    }
    let makefile = makefile.expect("a top-level Makefile in the tarball");
    assert!(makefile.lines().any(|l| l.trim() == "VERSION = 6"), "VERSION");
    assert!(
        makefile.lines().any(|l| l.trim() == "PATCHLEVEL = 12"),
        "PATCHLEVEL"
    );
}
