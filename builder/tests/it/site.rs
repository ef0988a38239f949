//! `imgbuild site` on a real repo: two commits with SBOMs, one signed by
//! the trusted key, records signed by it, by another key and by none, and
//! one whose fields carry markup.

use std::path::{Path, PathBuf};

use crate::common::GpgKey;
use crate::cve::EXPORT;
use crate::diff::{REF, STATUS_V1, STATUS_V2, commit_with_sbom, imgbuild, tree};
use crate::qualify::{record, write_record};

const HOSTILE: &str = r#"<script>document.title="PWNED"</script>"#;
const ATTRIBUTE: &str = r#""onload="document.title='PWNED'"#;

/// v1 and its child v2 on [`REF`], in `repo`.
struct History {
    repo: PathBuf,
    v1: String,
    v2: String,
}

fn history(dir: &Path) -> History {
    let repo = dir.join("repo");
    let set_ref = |checksum: &str| {
        let repository = imgbuild::ostree::open(&repo).unwrap();
        imgbuild::ostree::set_ref(&repository, REF, checksum).unwrap();
    };
    let one = tree(dir, "v1", STATUS_V1, "kernel.a = 1\n", "");
    let v1 = commit_with_sbom(&repo, &one, &["quiet".to_string()]);
    set_ref(&v1);
    let two = tree(dir, "v2", STATUS_V2, "kernel.a = 2\n", "CONFIG_PRINTK_TIME=y\n");
    let v2 = commit_with_sbom(&repo, &two, &["quiet".to_string()]);
    set_ref(&v2);
    History { repo, v1, v2 }
}

struct Fixture {
    commits: History,
    key: GpgKey,
    dir: tempfile::TempDir,
}

/// v2 signed by the key, v1 by another; v2's records: board-a PASS and a hostile board-b
/// (both signed by the key), board-c signed by another key; v1's board-a
/// record unsigned.
fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let commits = history(dir.path());
    let key = GpgKey::generate("site");
    let other = key.add_key("other");
    let home = key.home.path();
    let sign = |commit: &str, signer: &str| {
        let signed = std::process::Command::new("ostree")
            .args(["gpg-sign", "--repo"])
            .arg(&commits.repo)
            .args([commit, signer])
            .arg("--gpg-homedir")
            .arg(home)
            .output()
            .unwrap();
        assert!(
            signed.status.success(),
            "{}",
            String::from_utf8_lossy(&signed.stderr)
        );
    };
    sign(&commits.v2, &key.fingerprint);
    sign(&commits.v1, &other);
    let dir_of = |commit: &str| commits.repo.join("qualifications").join(commit);
    let v2 = dir_of(&commits.v2);
    write_record(
        &v2,
        "board-a-1",
        &record(&commits.v2, "board-a", "PASS", 40),
        home,
        &key.fingerprint,
    );
    let mut hostile = record(&commits.v2, HOSTILE, "PASS", 41);
    hostile["hardware"]["product-name"] = ATTRIBUTE.into();
    hostile["operator-host"] = HOSTILE.into();
    write_record(&v2, "board-b-1", &hostile, home, &key.fingerprint);
    write_record(
        &v2,
        "board-c-1",
        &record(&commits.v2, "board-c", "PASS", 42),
        home,
        &other,
    );
    let v1 = dir_of(&commits.v1);
    std::fs::create_dir_all(&v1).unwrap();
    let unsigned = serde_json::to_vec(&record(&commits.v1, "board-a", "FAIL", 140)).unwrap();
    std::fs::write(v1.join("board-a-0.json"), unsigned).unwrap();
    Fixture { commits, key, dir }
}

fn site(f: &Fixture, out: &Path, extra: &[&str]) -> std::process::Output {
    imgbuild()
        .args(["--json", "site", "--repo"])
        .arg(&f.commits.repo)
        .arg("--out")
        .arg(out)
        .arg("--trust-key")
        .arg(&f.key.public)
        .args(extra)
        .output()
        .unwrap()
}

fn pages(dir: &Path) -> Vec<(PathBuf, String)> {
    walkdir::WalkDir::new(dir)
        .into_iter()
        .map(Result::unwrap)
        .filter(|e| e.path().extension().is_some_and(|x| x == "html"))
        .map(|e| (e.path().to_path_buf(), std::fs::read_to_string(e.path()).unwrap()))
        .collect()
}

#[test]
fn the_site_shows_every_commit_and_marks_what_the_key_did_not_sign() {
    let f = fixture();
    let (c, out) = (&f.commits, f.dir.path().join("site"));
    let tracker = f.dir.path().join("tracker.json");
    std::fs::write(&tracker, EXPORT).unwrap();
    let built = site(&f, &out, &["--cve-db", tracker.to_str().unwrap()]);
    assert!(
        built.status.success(),
        "{}",
        String::from_utf8_lossy(&built.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&built.stdout).unwrap();
    assert_eq!(
        (report["commits"].as_u64(), report["records"].as_u64()),
        (Some(2), Some(4)),
        "{report} {}",
        String::from_utf8_lossy(&built.stderr)
    );
    // v1 and board-c by another key, v1's record unsigned.
    assert_eq!(report["not-authentic"], 3, "{report}");

    let read = |rel: &str| std::fs::read_to_string(out.join(rel)).unwrap();
    let index = read("index.html");
    for commit in [&c.v1, &c.v2] {
        assert!(index.contains(&format!("commit/{commit}.html")), "{index}");
    }
    let v2 = read(&format!("commit/{}.html", c.v2));
    assert!(
        v2.contains("<span class=\"authentic\">authentic</span>"),
        "v2 is signed by the key"
    );
    assert!(v2.contains("CVE-2022-3715"), "v2's bash upgrade fixes it: {v2}");
    assert!(
        v2.contains("upgraded") && v2.contains("5.2.15-2+b7"),
        "the package change"
    );
    let v1 = read(&format!("commit/{}.html", c.v1));
    assert!(
        v1.contains("NOT authentic</span> (no good signature by the trusted key"),
        "{v1}"
    );
    let v1_record = read(&format!("record/{}/board-a-0.html", c.v1));
    assert!(v1_record.contains("<span class=\"unsigned\">unsigned</span>"));
    let board_c = read(&format!("record/{}/board-c-1.html", c.v2));
    assert!(board_c.contains("NOT authentic"), "{board_c}");
    let matrix = read("matrix.html");
    assert!(
        matrix.contains("board-a") && matrix.contains("PASS 40/100 µs"),
        "{matrix}"
    );
    assert!(
        !matrix.contains("FAIL 140/100 µs") && !matrix.contains("board-c"),
        "records that are not authentic count in the matrix: {matrix}"
    );

    // Markup from a record is text, on every page, and no page has script.
    for (path, html) in pages(&out) {
        assert!(!html.contains("<script"), "{}: {html}", path.display());
        assert!(!html.contains(r#""onload="#), "{}", path.display());
        assert!(html.contains("Content-Security-Policy"), "{}", path.display());
    }
    assert!(
        matrix.contains("&lt;script&gt;document.title=&quot;PWNED&quot;&lt;/script&gt;"),
        "{matrix}"
    );
}

#[test]
fn an_out_that_is_not_a_site_or_a_bad_key_changes_nothing() {
    let f = fixture();
    let mine = f.dir.path().join("mine");
    std::fs::create_dir(&mine).unwrap();
    std::fs::write(mine.join("notes.txt"), "keep").unwrap();
    let refused = site(&f, &mine, &[]);
    assert_eq!(refused.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("is not a site imgbuild wrote"));
    assert_eq!(std::fs::read_to_string(mine.join("notes.txt")).unwrap(), "keep");

    let out = f.dir.path().join("site");
    assert!(site(&f, &out, &[]).status.success());
    let stale = out.join("commit/stale.html");
    std::fs::write(&stale, "old").unwrap();
    assert!(
        site(&f, &out, &[]).status.success(),
        "a site imgbuild wrote is replaced"
    );
    assert!(!stale.exists(), "the old site's files went with it");

    let not_a_key = f.dir.path().join("key.asc");
    std::fs::write(&not_a_key, "not a key").unwrap();
    let bad = imgbuild()
        .args(["site", "--repo"])
        .arg(&f.commits.repo)
        .arg("--out")
        .arg(&out)
        .arg("--trust-key")
        .arg(&not_a_key)
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--trust-key"));
    assert!(out.join("index.html").is_file(), "the site was kept");
}

/// The figure for the note: `cargo test --release -p imgbuild --test it --
/// --ignored --nocapture site::a_site_of_100_commits`.
#[test]
#[ignore = "a measurement (100 commits × 20 boards, 2000 signed records), not a check: run it by name"]
fn a_site_of_100_commits_and_20_boards() {
    let dir = tempfile::tempdir().unwrap();
    let repo = dir.path().join("repo");
    let key = GpgKey::generate("measure");
    let mut commits = Vec::new();
    for n in 0..100 {
        let status = format!(
            "{STATUS_V1}\nPackage: extra{n}\nStatus: install ok installed\nArchitecture: all\nVersion: 1.{n}\n"
        );
        let tree = tree(
            dir.path(),
            &format!("t{n}"),
            &status,
            &format!("kernel.a = {n}\n"),
            "",
        );
        let commit = commit_with_sbom(&repo, &tree, &["quiet".to_string()]);
        let repository = imgbuild::ostree::open(&repo).unwrap();
        imgbuild::ostree::set_ref(&repository, REF, &commit).unwrap();
        std::fs::remove_dir_all(&tree).unwrap();
        commits.push(commit);
    }
    let started = std::time::Instant::now();
    for commit in &commits {
        let records = repo.join("qualifications").join(commit);
        for board in 0..20 {
            let hw = format!("board-{board:02}");
            let worst = 30 + (board * 3) as u64;
            write_record(
                &records,
                &hw,
                &record(commit, &hw, "PASS", worst),
                key.home.path(),
                &key.fingerprint,
            );
        }
    }
    eprintln!("signed 2000 records in {:.1} s", started.elapsed().as_secs_f64());
    let out = dir.path().join("site");
    let started = std::time::Instant::now();
    let built = imgbuild()
        .args(["--json", "site", "--repo"])
        .arg(&repo)
        .arg("--out")
        .arg(&out)
        .arg("--trust-key")
        .arg(&key.public)
        .output()
        .unwrap();
    assert!(
        built.status.success(),
        "{}",
        String::from_utf8_lossy(&built.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&built.stdout).unwrap();
    let page = std::fs::metadata(out.join(format!("commit/{}.html", commits[99])))
        .unwrap()
        .len();
    let matrix = std::fs::metadata(out.join("matrix.html")).unwrap().len();
    eprintln!(
        "site of {} commits and {} records: {:.1} s wall; {} pages, {} bytes; a commit page {page} bytes, the matrix {matrix} bytes",
        report["commits"],
        report["records"],
        started.elapsed().as_secs_f64(),
        report["pages"],
        report["bytes"]
    );
    assert_eq!(
        report["not-authentic"], 100,
        "the commits are unsigned, the records all authentic"
    );
}

#[test]
fn publish_site_writes_the_pages_under_site_with_the_publishers_key() {
    let f = fixture();
    let dest = f.dir.path().join("www");
    let transport = imgbuild::transport::LocalDir::new(&dest);
    let trust = imgbuild::site::publisher_trust(&f.key.fingerprint, Some(f.key.home.path())).unwrap();
    let ui = imgbuild::ui::Ui::plain();
    let pages = imgbuild::site::publish_site(&f.commits.repo, &transport, &trust, &ui).unwrap();
    assert_eq!(pages, 8, "index, matrix, 2 commits, 4 records");
    let index = std::fs::read_to_string(dest.join("site/index.html")).unwrap();
    assert!(index.contains(&format!("commit/{}.html", f.commits.v2)));
    let v2 = std::fs::read_to_string(dest.join(format!("site/commit/{}.html", f.commits.v2))).unwrap();
    assert!(v2.contains("<span class=\"authentic\">authentic</span>"), "{v2}");
    assert!(dest.join("site/.imgbuild-site").is_file());
}
