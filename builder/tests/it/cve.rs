//! `imgbuild cve` on real commits with SBOMs, against a tracker export
//! written here in the Debian security tracker's JSON shape.

use std::path::Path;

use crate::common::GpgKey;
use crate::diff::{TwoCommits, imgbuild, two_commits};
use crate::qualify::{sig_of, vex_clearing, write_record};

/// v1 has bash 5.2.15-2 and libc6 2.36-9+deb12u10 (its own source); v2
/// has bash 5.2.15-2+b7 and adds tree 2.1.0-1.
const EXPORT: &str = r#"{
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
