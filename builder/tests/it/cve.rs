//! `imgbuild cve` on real commits with SBOMs, against a tracker export
//! written here in the Debian security tracker's JSON shape.

use std::path::Path;

use crate::common::GpgKey;
use crate::diff::{TwoCommits, imgbuild, two_commits};
use crate::qualify::{sig_of, vex_clearing, write_record};

/// v1 has bash 5.2.15-2 and libc6 2.36-9+deb12u10 (its own source); v2
/// has bash 5.2.15-2+b7 and adds tree 2.1.0-1.
pub(crate) const EXPORT: &str = r#"{
  "bash": {
    "CVE-2022-3715": {"description": "x", "releases": {
      "bookworm": {"status": "resolved", "fixed_version": "5.2.15-2+b7", "urgency": "high"},
      "trixie": {"status": "resolved", "fixed_version": "5.2.21-1", "urgency": "high"}}},
    "CVE-2019-18276": {"releases": {"bookworm": {"status": "open", "urgency": "low"}}},
    "CVE-2020-0001": {"releases": {"trixie": {"status": "open", "urgency": "high"}}}
  },
  "libc6": {
    "CVE-2023-4911": {"releases": {"bookworm": {"status": "resolved", "fixed_version": "2.36-9+deb12u3", "urgency": "high"}}},
    "CVE-2010-0001": {"releases": {"bookworm": {"status": "resolved", "fixed_version": "0", "urgency": "high"}}},
    "TEMP-0000000-2A3B4C": {"releases": {"bookworm": {"status": "undetermined", "urgency": "not yet assigned"}}}
  },
  "zlib": {"CVE-2022-37434": {"releases": {"bookworm": {"status": "open", "urgency": "high"}}}},
  "tree": {"CVE-2024-0100": {"releases": {"bookworm": {"status": "open", "urgency": "low"}}}}
}"#;

fn cve(c: &TwoCommits, rev: &str, db: &Path, extra: &[&str]) -> std::process::Output {
    imgbuild()
        .args(["--json", "cve", "--repo"])
        .arg(&c.repo)
        .arg(rev)
        .arg("--db")
        .arg(db)
        .args(extra)
        .output()
        .unwrap()
}

fn findings(output: &std::process::Output) -> Vec<(String, String)> {
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let list = report["findings"].as_array().unwrap();
    list.iter()
        .map(|f| {
            (
                f["id"].as_str().unwrap().to_string(),
                f["state"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[test]
fn a_commit_has_the_issues_its_release_and_versions_have() {
    let c = two_commits();
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("tracker.json");
    std::fs::write(&db, EXPORT).unwrap();
    let pair = |id: &str, state: &str| (id.to_string(), state.to_string());
    let v1 = cve(&c, &c.v1, &db, &[]);
    assert_eq!(
        findings(&v1),
        [
            pair("TEMP-0000000-2A3B4C", "undetermined"),
            pair("CVE-2022-3715", "affected"),
            pair("CVE-2019-18276", "affected"),
        ]
    );
    let report: serde_json::Value = serde_json::from_slice(&v1.stdout).unwrap();
    assert_eq!(report["release"], "bookworm", "the commit's os-release names it");
    assert_eq!(report["commit"], c.v1.as_str());
    let sha256 = imgbuild::io::hashing::sha256_file(&db, None).unwrap();
    assert_eq!(report["database"]["sha256"], sha256.as_str());
    assert_eq!(report["database"]["bytes"], EXPORT.len());
    // v2's bash 5.2.15-2+b7 has the fix.
    let v2 = findings(&cve(&c, &c.v2, &db, &[]));
    assert!(!v2.contains(&pair("CVE-2022-3715", "affected")), "{v2:?}");
    assert!(v2.contains(&pair("CVE-2019-18276", "affected")), "{v2:?}");
    // Another release, named: trixie's issues instead.
    let trixie = findings(&cve(&c, &c.v1, &db, &["--release", "trixie"]));
    assert_eq!(
        trixie,
        [
            pair("CVE-2020-0001", "affected"),
            pair("CVE-2022-3715", "affected")
        ]
    );
    let text = imgbuild()
        .args(["cve", "--repo"])
        .arg(&c.repo)
        .arg(&c.v1)
        .arg("--db")
        .arg(&db)
        .output()
        .unwrap();
    let text = String::from_utf8(text.stdout).unwrap();
    assert!(text.contains("2 affected, 1 undetermined"), "{text}");
    assert!(
        text.lines()
            .any(|l| l.starts_with("CVE-2022-3715") && l.ends_with("fixed in 5.2.15-2+b7")),
        "{text}"
    );
}

#[test]
fn a_broken_database_or_release_is_refused_by_option() {
    let c = two_commits();
    let dir = tempfile::tempdir().unwrap();
    let cut = dir.path().join("cut.json");
    std::fs::write(&cut, &EXPORT[..EXPORT.len() / 2]).unwrap();
    let missing = dir.path().join("missing.json");
    let good = dir.path().join("good.json");
    std::fs::write(&good, EXPORT).unwrap();
    let empty = dir.path().join("empty.json");
    std::fs::write(&empty, "{}").unwrap();
    let typed = dir.path().join("typed.json");
    std::fs::write(
        &typed,
        r#"{"bash": {"CVE-2022-3715": {"releases": {"bookworm": {"status": 3}}}}}"#,
    )
    .unwrap();
    for (db, extra, option, says) in [
        (&cut, &[][..], "--db", "line "),
        (&empty, &[][..], "--db", "has no issue for Debian bookworm"),
        (
            &good,
            &["--release", "sid"][..],
            "--db",
            "has no issue for Debian sid",
        ),
        (&typed, &[][..], "--db", "line 1, column"),
        (&missing, &[][..], "--db", "missing.json"),
        (
            &good,
            &["--release", "../x"][..],
            "--release",
            "not a Debian code name",
        ),
    ] {
        let output = cve(&c, &c.v1, db, extra);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains(option) && stderr.contains(says), "{stderr}");
        assert!(output.stdout.is_empty(), "no report on a refusal");
    }
}

#[test]
fn signed_vex_clears_a_finding_and_an_unsigned_one_is_said_ignored() {
    let c = two_commits();
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("tracker.json");
    std::fs::write(&db, EXPORT).unwrap();
    let key = GpgKey::generate("vex");
    let (home, me) = (key.home.path(), key.fingerprint.as_str());
    let vex_dir = dir.path().join("vex");
    let signed = write_record(&vex_dir, "signed", &vex_clearing("TEMP-0000000-2A3B4C"), home, me);
    let unsigned = write_record(
        &vex_dir,
        "unsigned",
        &vex_clearing("TEMP-0000000-2A3B4C"),
        home,
        me,
    );
    std::fs::remove_file(sig_of(&unsigned)).unwrap();
    let with_vex = |vex: &Path| {
        let args = [
            "--gpg-key",
            me,
            "--gpg-homedir",
            home.to_str().unwrap(),
            "--vex",
            vex.to_str().unwrap(),
        ];
        cve(&c, &c.v1, &db, &args)
    };
    let pair = |id: &str, state: &str| (id.to_string(), state.to_string());
    let out = with_vex(&unsigned);
    assert_eq!(findings(&out).len(), 3, "an unsigned document clears nothing");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let ignored = report["vex"][0]["ignored"].as_str().unwrap();
    assert!(ignored.starts_with("no signature"), "{ignored}");
    let out = with_vex(&signed);
    assert_eq!(
        findings(&out),
        [
            pair("CVE-2022-3715", "affected"),
            pair("CVE-2019-18276", "affected")
        ]
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["cleared"][0]["id"], "TEMP-0000000-2A3B4C");
    assert_eq!(report["cleared"][0]["status"], "not_affected");
    assert_eq!(report["vex"][0]["ignored"], serde_json::Value::Null);
    // --vex without the key it must be signed by is a usage error.
    let out = cve(&c, &c.v1, &db, &["--vex", signed.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn old_data_is_a_warning_or_with_max_age_an_error() {
    let c = two_commits();
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("tracker.json");
    std::fs::write(&db, EXPORT).unwrap();
    let fresh = cve(&c, &c.v1, &db, &["--max-age", "1"]);
    assert!(
        fresh.status.success(),
        "{}",
        String::from_utf8_lossy(&fresh.stderr)
    );
    let touched = std::process::Command::new("touch")
        .args(["-d", "2020-01-01T00:00:00Z"])
        .arg(&db)
        .status()
        .unwrap();
    assert!(touched.success());
    let warned = cve(&c, &c.v1, &db, &[]);
    assert!(warned.status.success());
    let stderr = String::from_utf8_lossy(&warned.stderr);
    assert!(
        stderr.contains("2020-01-01T00:00:00Z") && stderr.contains("may miss newer issues"),
        "{stderr}"
    );
    let report: serde_json::Value = serde_json::from_slice(&warned.stdout).unwrap();
    assert_eq!(report["database"]["modified"], "2020-01-01T00:00:00Z");
    let refused = cve(&c, &c.v1, &db, &["--max-age", "30"]);
    assert_eq!(refused.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("more than 30 days ago"), "{stderr}");
    assert!(refused.stdout.is_empty());
}

#[test]
fn diff_names_the_issues_a_release_fixes_and_introduces() {
    let c = two_commits();
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("tracker.json");
    std::fs::write(&db, EXPORT).unwrap();
    let diff = |json: bool| {
        let mut cmd = imgbuild();
        if json {
            cmd.arg("--json");
        }
        let out = cmd
            .args(["diff", "--repo"])
            .arg(&c.repo)
            .args([&c.v1, &c.v2])
            .arg("--cve-db")
            .arg(&db)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        out.stdout
    };
    let json: serde_json::Value = serde_json::from_slice(&diff(true)).unwrap();
    let ids = |list: &serde_json::Value| -> Vec<String> {
        list.as_array()
            .unwrap()
            .iter()
            .map(|f| format!("{} {}", f["id"].as_str().unwrap(), f["source"].as_str().unwrap()))
            .collect()
    };
    assert_eq!(
        ids(&json["cve"]["fixed"]),
        ["CVE-2022-3715 bash"],
        "the bash upgrade fixes it"
    );
    assert_eq!(
        ids(&json["cve"]["introduced"]),
        ["CVE-2024-0100 tree"],
        "the added package brings it"
    );
    let text = String::from_utf8(diff(false)).unwrap();
    assert!(text.contains("cve: 1 fixed, 1 introduced"), "{text}");
    assert!(
        text.contains("  fixed      CVE-2022-3715 (high) in bash 5.2.15-2\n"),
        "{text}"
    );
    // Without the export, no cve section at all.
    let plain = imgbuild()
        .args(["--json", "diff", "--repo"])
        .arg(&c.repo)
        .args([&c.v1, &c.v2])
        .output()
        .unwrap();
    let plain: serde_json::Value = serde_json::from_slice(&plain.stdout).unwrap();
    assert!(plain.get("cve").is_none());
}

/// EXPORT's bookworm issues as osv.dev's DEBIAN-CVE records (OSV has no
/// TEMP ids and no "undetermined"), with a DSA advisory and a record of
/// another release beside them.
fn osv_zip() -> Vec<u8> {
    use std::io::Write;
    let record = |id: &str, package: &str, ecosystem: &str, fixed: Option<&str>, urgency: &str| {
        let fixed = fixed
            .map(|v| format!(r#", {{"fixed": "{v}"}}"#))
            .unwrap_or_default();
        format!(
            r#"{{"id": "DEBIAN-{id}", "upstream": ["{id}"], "modified": "2026-12-01T00:00:00Z",
              "affected": [{{"package": {{"ecosystem": "{ecosystem}", "name": "{package}"}},
                "ranges": [{{"type": "ECOSYSTEM", "events": [{{"introduced": "0"}}{fixed}]}}],
                "ecosystem_specific": {{"urgency": "{urgency}"}}}}]}}"#
        )
    };
    let records = [
        record("CVE-2022-3715", "bash", "Debian:12", Some("5.2.15-2+b7"), "high"),
        record("CVE-2019-18276", "bash", "Debian:12", None, "low"),
        record(
            "CVE-2023-4911",
            "libc6",
            "Debian:12",
            Some("2.36-9+deb12u3"),
            "high",
        ),
        record("CVE-2020-0001", "bash", "Debian:13", None, "high"),
        record("CVE-2022-37434", "zlib", "Debian:12", None, "high"),
        record("CVE-2024-0100", "tree", "Debian:12", None, "low"),
        r#"{"id": "DSA-5300-1", "upstream": ["CVE-2022-3715"], "affected": []}"#.to_string(),
    ];
    let mut writer = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    for (n, text) in records.iter().enumerate() {
        writer
            .start_file(
                format!("record-{n}.json"),
                zip::write::SimpleFileOptions::default(),
            )
            .unwrap();
        writer.write_all(text.as_bytes()).unwrap();
    }
    writer.finish().unwrap().into_inner()
}

fn cve_db(cache: &Path, args: &[&str]) -> std::process::Output {
    imgbuild()
        .args(["--json", "cve-db", "--cache-dir"])
        .arg(cache)
        .args(args)
        .output()
        .unwrap()
}

fn shown(output: &std::process::Output) -> serde_json::Value {
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

fn cve_cached(c: &TwoCommits, rev: &str, cache: &Path) -> std::process::Output {
    imgbuild()
        .args(["--json", "cve", "--repo"])
        .arg(&c.repo)
        .arg(rev)
        .arg("--cache-dir")
        .arg(cache)
        .output()
        .unwrap()
}

fn blobs(cache: &Path) -> usize {
    std::fs::read_dir(cache.join("blobs/sha256")).map_or(0, |dir| dir.count())
}

#[test]
fn cve_db_update_keeps_checked_data_that_reports_then_read() {
    let c = two_commits();
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let tracker = dir.path().join("tracker.json");
    std::fs::write(&tracker, EXPORT).unwrap();
    let none = cve_cached(&c, &c.v1, &cache);
    assert_eq!(none.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&none.stderr).contains("holds no vulnerability data"));

    let kept = shown(&cve_db(&cache, &["update", "--from", tracker.to_str().unwrap()]));
    let sha256 = crate::common::sha256_hex(EXPORT.as_bytes());
    assert_eq!(kept["format"], "debian-security-tracker-json");
    assert_eq!(kept["source"], tracker.to_str().unwrap());
    assert_eq!(kept["sha256"], sha256.as_str());
    assert_eq!(kept["summary"], "4 source packages");
    assert_eq!(shown(&cve_db(&cache, &["show"])), kept);
    let from_cache = cve_cached(&c, &c.v1, &cache);
    assert_eq!(findings(&from_cache), findings(&cve(&c, &c.v1, &tracker, &[])));
    let report: serde_json::Value = serde_json::from_slice(&from_cache.stdout).unwrap();
    assert_eq!(report["database"]["source"], tracker.to_str().unwrap());
    assert_eq!(report["database"]["sha256"], sha256.as_str());

    // A broken file is refused by name, and the data kept before stays.
    let cut = dir.path().join("cut.json");
    std::fs::write(&cut, &EXPORT[..EXPORT.len() - 3]).unwrap();
    let before = blobs(&cache);
    let refused = cve_db(&cache, &["update", "--from", cut.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("--from")
            && stderr.contains("cut.json: not the Debian security tracker's JSON: line "),
        "{stderr}"
    );
    assert_eq!(shown(&cve_db(&cache, &["show"]))["sha256"], sha256.as_str());
    assert_eq!(blobs(&cache), before, "the refused file was left in the cache");
    let device = cve_db(&cache, &["update", "--from", "/dev/zero"]);
    assert_eq!(device.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&device.stderr).contains("/dev/zero: not a regular file"));
    // A date ahead of the clock is taken as now: the data ages from here.
    let future = dir.path().join("future.json");
    std::fs::write(&future, EXPORT).unwrap();
    let touched = std::process::Command::new("touch")
        .args(["-d", "2099-01-01T00:00:00Z"])
        .arg(&future)
        .status()
        .unwrap();
    assert!(touched.success());
    let kept = shown(&cve_db(&cache, &["update", "--from", future.to_str().unwrap()]));
    assert!(kept["date"].as_str().unwrap() < "2099", "{kept}");

    // osv.dev's zip says the same of the same packages.
    let osv = dir.path().join("all.zip");
    std::fs::write(&osv, osv_zip()).unwrap();
    let kept = shown(&cve_db(&cache, &["update", "--from", osv.to_str().unwrap()]));
    assert_eq!(kept["format"], "osv-debian-zip");
    assert_eq!(
        kept["summary"],
        "6 DEBIAN-CVE records; 1 advisories and 0 withdrawn records skipped"
    );
    let tracker_findings: Vec<_> = findings(&cve(&c, &c.v1, &tracker, &[]))
        .into_iter()
        .filter(|(id, _)| !id.starts_with("TEMP-"))
        .collect();
    assert_eq!(findings(&cve_cached(&c, &c.v1, &cache)), tracker_findings);
    assert_eq!(
        findings(&cve(&c, &c.v1, &osv, &[])),
        tracker_findings,
        "--db reads a zip too"
    );
    let diff = imgbuild()
        .args(["--json", "diff", "--cve", "--cache-dir"])
        .arg(&cache)
        .arg("--repo")
        .arg(&c.repo)
        .args([&c.v1, &c.v2])
        .output()
        .unwrap();
    let diff = shown(&diff);
    assert_eq!(diff["cve"]["fixed"][0]["id"], "CVE-2022-3715", "{diff}");
    assert_eq!(diff["cve"]["introduced"][0]["id"], "CVE-2024-0100", "{diff}");

    // A cache copy changed behind the note is refused, never read.
    let blob = cache.join("blobs/sha256").join(kept["sha256"].as_str().unwrap());
    let mut bytes = std::fs::read(&blob).unwrap();
    let last = bytes.len() - 30;
    bytes[last] ^= 1;
    std::fs::write(&blob, bytes).unwrap();
    let damaged = cve_cached(&c, &c.v1, &cache);
    let stderr = String::from_utf8_lossy(&damaged.stderr);
    assert!(!damaged.status.success() && damaged.stdout.is_empty());
    assert!(
        stderr.contains("the cached data from") && stderr.contains(osv.to_str().unwrap()),
        "{stderr}"
    );
}

#[test]
fn cve_db_fetches_over_tls_it_trusts_or_a_pinned_hash() {
    use crate::common::{HttpServer, HttpsServer, TestPki};
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let pki = TestPki::generate();
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, &pki.ca_pem).unwrap();
    let server = HttpsServer::start(
        &pki,
        "200 OK",
        EXPORT.as_bytes().to_vec(),
        &["Last-Modified: Wed, 01 Jan 2020 00:00:00 GMT"],
    );
    let url = format!("{}/tracker/data/json", server.url);
    let update = |trust: Option<&Path>, args: &[&str]| {
        let mut cmd = imgbuild();
        cmd.env_remove("SSL_CERT_FILE").env_remove("SSL_CERT_DIR");
        if let Some(ca) = trust {
            cmd.env("SSL_CERT_FILE", ca);
        }
        cmd.args(["--json", "cve-db", "--cache-dir"])
            .arg(&cache)
            .arg("update")
            .args(args)
            .output()
            .unwrap()
    };
    let untrusted = update(None, &["--from", &url]);
    let stderr = String::from_utf8_lossy(&untrusted.stderr);
    assert_eq!(untrusted.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("certificate is not trusted"), "{stderr}");
    assert!(
        !cve_db(&cache, &["show"]).status.success(),
        "untrusted data was kept"
    );

    let kept = shown(&update(Some(&ca), &["--from", &url]));
    assert_eq!(kept["source"], url.as_str());
    assert_eq!(kept["date"], "2020-01-01T00:00:00Z", "the server's Last-Modified");

    // Plain http:// only with a pinned hash, and only with that hash.
    let http = HttpServer::start("json", EXPORT.as_bytes().to_vec(), vec![]);
    let unpinned = update(None, &["--from", &http.url]);
    assert_eq!(unpinned.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&unpinned.stderr).contains("needs --sha256"));
    let wrong = update(None, &["--from", &http.url, "--sha256", &"0".repeat(64)]);
    assert!(String::from_utf8_lossy(&wrong.stderr).contains("sha256 mismatch"));
    let sha256 = crate::common::sha256_hex(EXPORT.as_bytes());
    let pinned = shown(&update(None, &["--from", &http.url, "--sha256", &sha256]));
    assert_eq!(pinned["source"], http.url.as_str());
    assert_eq!(http.requests(), 2, "the refused unpinned URL was never asked");

    // An https:// URL that redirects to http:// is not followed.
    let location = format!("Location: {}", http.url);
    let redirect = HttpsServer::start(&pki, "302 Found", Vec::new(), &[&location]);
    let refused = update(Some(&ca), &["--from", &format!("{}/json", redirect.url)]);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success() && stderr.contains("is not an https:// URL"),
        "{stderr}"
    );
    assert_eq!(http.requests(), 2, "the redirect to http:// was followed");
    assert_eq!(shown(&cve_db(&cache, &["show"]))["source"], http.url.as_str());
}
