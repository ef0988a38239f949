//! Publishing to an ostree remote served over HTTP on 127.0.0.1, and a real
//! device (the `ostree` CLI on a scratch sysroot) that pulls, verifies,
//! deploys, upgrades through a static delta, and rolls back.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{GpgKey, Sshd, StaticServer, ostree, run};
use emberrtos_contract::error::{exit, exit_code};
use imgbuild::commands::publish::{LocalDir, Phase, PublishOptions, PublishReport, Transport, publish};
use imgbuild::io::records::{self, RecordKind};
use imgbuild::ostree as ost;
use imgbuild::recipe::Flavor;
use imgbuild::stages::commit::{self, CommitFacts};
use imgbuild::stages::tag::{TagRequest, required_checks, tag};
use imgbuild::transport::ssh::SshDir;
use imgbuild::ui::Ui;

const REF: &str = "emberrtos/x86_64/rt";

/// A tree `ostree admin deploy` accepts: a kernel, os-release, /usr/etc.
/// Builds differ in one overlay file only: a 256 KiB calibration table in
/// which `revision` changes a few bytes (as a re-calibration would).
fn tree(dir: &Path, revision: u8) -> PathBuf {
    let tree = dir.join(format!("tree-{revision}"));
    if tree.exists() {
        return tree;
    }
    for d in [
        "usr/bin",
        "usr/etc/emberrtos",
        "usr/lib/modules/6.12.0",
        "var",
        "boot",
        "sysroot",
        "proc",
        "sys",
        "dev",
        "run",
        "tmp",
    ] {
        std::fs::create_dir_all(tree.join(d)).unwrap();
    }
    std::os::unix::fs::symlink("sysroot/ostree", tree.join("ostree")).unwrap();
    std::fs::write(tree.join("usr/etc/os-release"), "NAME=EmberRTOS\nID=emberrtos\n").unwrap();
    std::fs::write(tree.join("usr/etc/emberrtos/kernel-flavor"), "rt\n").unwrap();
    // Incompressible, so whole-object transfers cost their full size.
    let noise = |seed: u32, len: usize| -> Vec<u8> {
        (0..len as u32)
            .map(|i| (i.wrapping_add(seed).wrapping_mul(2654435761) >> 13) as u8)
            .collect()
    };
    let mut calibration = noise(7, 256 * 1024);
    for offset in [1000, 90_000, 200_000] {
        calibration[offset] = revision;
    }
    std::fs::write(tree.join("usr/etc/emberrtos/calibration.dat"), calibration).unwrap();
    // A synthetic RT kernel (the gate reads it out of the commit), padded with noise.
    let mut vmlinuz = rtcheck::bzimage::synthetic::kernel(&format!("6.12.0 (ci@imgbuild) {RT_UTS}"), None);
    vmlinuz.extend(noise(1, 400_000));
    std::fs::write(tree.join("usr/lib/modules/6.12.0/vmlinuz"), vmlinuz).unwrap();
    std::fs::write(tree.join("usr/lib/modules/6.12.0/initramfs.img"), b"initramfs").unwrap();
    std::fs::write(tree.join("usr/lib/modules/6.12.0/config"), RT_CONFIG).unwrap();
    std::fs::write(
        tree.join("usr/lib/modules/6.12.0/initramfs.img"),
        noise(2, 50_000),
    )
    .unwrap();
    std::fs::copy("/bin/busybox", tree.join("usr/bin/busybox")).unwrap();
    tree
}

fn calibration_revision(deployment: &Path) -> u8 {
    std::fs::read(deployment.join("usr/etc/emberrtos/calibration.dat")).unwrap()[90_000]
}

const RT_UTS: &str = "#1 SMP PREEMPT_RT Sun Nov 30 00:00:00 UTC 2025";
const RT_CONFIG: &str = "CONFIG_PREEMPT_RT=y\n";

/// The verify stage's evidence on the trees' kernel.
fn rt_evidence() -> rtcheck::Evidence {
    let dir = tempfile::tempdir().unwrap();
    let kernel = tree(dir.path(), 0).join("usr/lib/modules/6.12.0");
    let mut evidence = imgbuild::stages::verify::check_artifacts(
        &kernel.join("vmlinuz"),
        Some(&kernel.join("config")),
        None,
    )
    .unwrap();
    evidence
        .checks
        .insert(0, imgbuild::stages::verify::config_check(42, true));
    evidence
}

/// Boot evidence taken on the trees' kernel.
fn boot_evidence() -> rtcheck::Evidence {
    let mut boot = rtcheck::evidence::check_running_kernel(RT_UTS, Some(RT_CONFIG));
    boot.release = Some("6.12.0".into());
    boot.medium_sha256 = Some("0".repeat(64));
    boot
}

/// Commits `tree` as `version`, tags it through the gate and signs it.
fn build(repo: &Path, tree: &Path, version: &str, key: &GpgKey, evidence: &rtcheck::Evidence) -> String {
    let meta = commit::metadata(&CommitFacts {
        name: "emberrtos",
        version,
        flavor: Flavor::Rt,
        arch: rtcheck::Arch::X86_64,
        kernel_release: "6.12.0",
        kernel_config_sha256: &"ab".repeat(32),
        kargs: &["nohz_full=1-3".to_string()],
        recipe_sha256: &"cd".repeat(32),
        evidence,
        health: &emberrtos_contract::policy::HealthPolicy::default(),
        sbom_sha256: None,
        secure_boot: None,
    })
    .unwrap();
    // Each build is a day newer: `ostree admin upgrade` refuses to go back in time.
    static DAY: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let timestamp = 1_764_460_800 + 86_400 * DAY.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let out = commit::commit(repo, REF, tree, &meta, &format!("emberrtos {version}"), timestamp).unwrap();
    // The trees carry no modules.
    let required = required_checks(false, true);
    let boot = boot_evidence();
    tag(&TagRequest {
        repo,
        ref_name: REF,
        commit: &out.checksum,
        flavor: Flavor::Rt,
        required: &required,
        boot_evidence: Some(&boot),
        gpg_key: Some(&key.fingerprint),
        gpg_homedir: Some(key.home.path()),
    })
    .unwrap();
    out.checksum
}

fn do_publish(
    repo: &Path,
    remote: &Path,
    key: &GpgKey,
    after: &dyn Fn(Phase) -> anyhow::Result<()>,
) -> anyhow::Result<PublishReport> {
    publish(
        repo,
        &LocalDir::new(remote),
        &PublishOptions {
            refs: vec![REF.into()],
            gpg_key: Some(&key.fingerprint),
            gpg_homedir: Some(key.home.path()),
            deltas: 2,
            delta_from_empty: false,
            depth: 5,
            force: false,
            prune_unsigned_refs: false,
            secure_boot_cert: None,
            after_phase: after,
        },
        &Ui::plain(),
    )
}

fn ok(_: Phase) -> anyhow::Result<()> {
    Ok(())
}

/// A device: a scratch sysroot with the remote added, trusting `key`.
struct Device {
    sysroot: PathBuf,
}

impl Drop for Device {
    /// ostree marks deployment roots immutable; lift it so the temp dir can go.
    fn drop(&mut self) {
        let deployments = self.sysroot.join("ostree/deploy/emberrtos/deploy");
        for entry in std::fs::read_dir(deployments).into_iter().flatten().flatten() {
            if entry.path().is_dir() {
                let _ = Command::new("chattr").arg("-i").arg(entry.path()).status();
            }
        }
    }
}

impl Device {
    fn new(dir: &Path, url: &str, key: &Path) -> Device {
        let sysroot = dir.join("sysroot");
        std::fs::create_dir_all(&sysroot).unwrap();
        let s = format!("--sysroot={}", sysroot.display());
        run(&mut ostree(&["admin", "init-fs", sysroot.to_str().unwrap()]));
        run(&mut ostree(&["admin", "os-init", &s, "emberrtos"]));
        let device = Device { sysroot };
        run(&mut ostree(&[
            "remote",
            "add",
            &device.repo_arg(),
            &format!("--gpg-import={}", key.display()),
            "origin",
            url,
        ]));
        device
    }

    fn repo_arg(&self) -> String {
        format!("--repo={}", self.sysroot.join("ostree/repo").display())
    }

    fn admin(&self, args: &[&str]) -> std::process::Output {
        let mut full = vec![
            "admin".to_string(),
            args[0].to_string(),
            format!("--sysroot={}", self.sysroot.display()),
        ];
        full.extend(args[1..].iter().map(|a| a.to_string()));
        Command::new("ostree").args(&full).output().unwrap()
    }

    /// The deployments, default first, as (checksum, deploy dir).
    fn deployments(&self) -> Vec<(String, PathBuf)> {
        let out = self.admin(&["status"]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| {
                let mut words = l.trim_start_matches(['*', ' ']).split_whitespace();
                (words.next()? == "emberrtos")
                    .then(|| words.next().map(str::to_string))
                    .flatten()
            })
            .map(|id| {
                let checksum = id.split('.').next().unwrap().to_string();
                (
                    checksum,
                    self.sysroot.join("ostree/deploy/emberrtos/deploy").join(&id),
                )
            })
            .collect()
    }
}

/// A plain client repo with the remote added, trusting `key`; returns `--repo=…`.
fn client(dir: &Path, name: &str, mode: &str, url: &str, key: &Path) -> String {
    let arg = format!("--repo={}", dir.join(name).display());
    run(&mut ostree(&["init", &arg, &format!("--mode={mode}")]));
    run(&mut ostree(&[
        "remote",
        "add",
        &arg,
        &format!("--gpg-import={}", key.display()),
        "origin",
        url,
    ]));
    arg
}

/// A local repo, a remote web root and a signing key in one temp dir.
struct Fixture {
    dir: tempfile::TempDir,
    key: GpgKey,
    repo: PathBuf,
    remote: PathBuf,
}

impl Fixture {
    fn new() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let (repo, remote) = (dir.path().join("repo"), dir.path().join("www"));
        Fixture {
            dir,
            key: GpgKey::generate("publisher"),
            repo,
            remote,
        }
    }

    /// Builds revision `revision` of the tree as `version`, tagged and signed.
    fn build(&self, revision: u8, version: &str) -> String {
        build(
            &self.repo,
            &tree(self.dir.path(), revision),
            version,
            &self.key,
            &rt_evidence(),
        )
    }

    fn publish(&self, after: &dyn Fn(Phase) -> anyhow::Result<()>) -> anyhow::Result<PublishReport> {
        do_publish(&self.repo, &self.remote, &self.key, after)
    }
}

/// GPG signatures on a commit of the repo at `repo`.
fn signatures(repo: &Path, commit: &str) -> usize {
    ost::read_commit(&ost::open(repo).unwrap(), commit)
        .unwrap()
        .detached_metadata
        .get("ostree.gpgsigs")
        .and_then(|v| v.as_array())
        .map_or(0, Vec::len)
}

/// Publish's temp files and dirs under `remote`.
fn temps(remote: &Path) -> Vec<PathBuf> {
    walkdir::WalkDir::new(remote)
        .into_iter()
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with(".publish-"))
        .map(|e| e.into_path())
        .collect()
}

/// A client repo whose remote demands a signed summary as well as signed commits.
fn strict_client(dir: &Path, name: &str, url: &str, key: &Path) -> String {
    let arg = format!("--repo={}", dir.join(name).display());
    run(&mut ostree(&["init", &arg, "--mode=archive"]));
    run(&mut ostree(&[
        "remote",
        "add",
        &arg,
        "--set=gpg-verify-summary=true",
        &format!("--gpg-import={}", key.display()),
        "origin",
        url,
    ]));
    arg
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn device_pulls_verifies_deploys_upgrades_by_delta_and_rolls_back() {
    let f = Fixture::new();
    let (dir, key, remote) = (&f.dir, &f.key, &f.remote);
    let v1 = f.build(1, "2026.11.1");

    let report = f.publish(&ok).unwrap();
    assert!(report.objects_copied > 0);
    assert_eq!(report.refs[0].commit, v1);
    // Publishing the same thing twice is a no-op.
    assert!(f.publish(&ok).unwrap().no_op);
    // libostree finds the tag's signature by this key: publish did not sign again.
    assert_eq!(signatures(remote, &v1), 1);
    assert!(ost::signed_by(&ost::open(&f.repo).unwrap(), &v1, &f.key.fingerprint).unwrap());
    assert!(ost::signed_by(&ost::open(&f.repo).unwrap(), &v1, &f.key.fingerprint[24..]).unwrap());
    let stranger = GpgKey::generate("not-the-signer");
    assert!(!ost::signed_by(&ost::open(&f.repo).unwrap(), &v1, &stranger.fingerprint).unwrap());
    run(&mut ostree(&["fsck", &format!("--repo={}", remote.display())]));

    let server = StaticServer::start(remote);
    let device = Device::new(dir.path(), &server.url, &key.public);
    run(&mut ostree(&["pull", &device.repo_arg(), "origin", REF]));
    let deployed = device.admin(&["deploy", "--os=emberrtos", &format!("origin:{REF}")]);
    assert!(
        deployed.status.success(),
        "{}",
        String::from_utf8_lossy(&deployed.stderr)
    );
    let deployments = device.deployments();
    assert_eq!(deployments[0].0, v1);
    assert_eq!(
        read(&deployments[0].1.join("usr/etc/emberrtos/kernel-flavor")),
        "rt\n"
    );
    assert_eq!(calibration_revision(&deployments[0].1), 1);

    // v2: one overlay file differs.
    let v2 = f.build(2, "2026.11.2");
    let report = f.publish(&ok).unwrap();
    assert_eq!(report.refs[0].previous.as_deref(), Some(v1.as_str()));
    assert!(
        report.refs[0].deltas.iter().any(|d| d.starts_with(&v1[..12])),
        "{:?}",
        report.refs[0]
    );
    // Not asked for (--delta-from-empty): no delta from empty.
    assert!(
        !report.refs[0].deltas.iter().any(|d| d.starts_with("empty-")),
        "{:?}",
        report.refs[0]
    );
    let phases: Vec<&str> = report.phase_seconds.iter().map(|p| p.phase.as_str()).collect();
    assert_eq!(
        phases,
        ["plan", "objects", "static deltas", "records", "refs", "summary"]
    );
    run(&mut ostree(&["fsck", &format!("--repo={}", remote.display())]));

    server.reset();
    let upgraded = device.admin(&["upgrade", "--os=emberrtos"]);
    assert!(
        upgraded.status.success(),
        "{}",
        String::from_utf8_lossy(&upgraded.stderr)
    );
    let delta_bytes = server.bytes_sent();
    let requests = server.requests();
    assert!(
        requests.iter().any(|(p, _)| p.starts_with("/deltas/")),
        "the upgrade did not use a delta: {requests:?}"
    );
    let deployments = device.deployments();
    assert_eq!(deployments[0].0, v2);
    assert_eq!(deployments[1].0, v1);
    assert_eq!(calibration_revision(&deployments[0].1), 2);
    assert_eq!(
        read(&deployments[0].1.join("usr/etc/emberrtos/kernel-flavor")),
        "rt\n"
    );

    // Without deltas: a full pull of v2, and (for the record) an object-by-
    // object pull from v1. The client sometimes also fetches the changed
    // object loose next to the delta, so only the full pull is a stable bound.
    let pull_bytes = |name: &str, first: Option<&str>| {
        let arg = client(dir.path(), name, "bare-user", &server.url, &key.public);
        if let Some(commit) = first {
            run(&mut ostree(&[
                "pull",
                &arg,
                "--disable-static-deltas",
                "origin",
                commit,
            ]));
        }
        server.reset();
        run(&mut ostree(&[
            "pull",
            &arg,
            "--disable-static-deltas",
            "origin",
            REF,
        ]));
        server.bytes_sent()
    };
    let full_bytes = pull_bytes("full", None);
    let object_bytes = pull_bytes("incremental", Some(&v1));
    eprintln!(
        "v1 -> v2: {delta_bytes} bytes with the static delta; without: {object_bytes} bytes \
         object by object from v1, {full_bytes} bytes for a full pull"
    );
    assert!(
        delta_bytes < full_bytes / 10,
        "delta {delta_bytes} vs full pull {full_bytes}"
    );

    // Roll back: drop the v2 deployment; v1 is the default again.
    let undeployed = device.admin(&["undeploy", "0"]);
    assert!(
        undeployed.status.success(),
        "{}",
        String::from_utf8_lossy(&undeployed.stderr)
    );
    let deployments = device.deployments();
    assert_eq!(deployments.len(), 1);
    assert_eq!(deployments[0].0, v1);
    assert_eq!(calibration_revision(&deployments[0].1), 1);
}

#[test]
fn tampered_remotes_are_refused_by_the_client() {
    let f = Fixture::new();
    let (dir, key, remote) = (&f.dir, &f.key, &f.remote);
    let stranger = GpgKey::generate("stranger");
    f.build(1, "2026.11.1");
    f.publish(&ok).unwrap();
    let server = StaticServer::start(remote);

    // A client that trusts another key.
    let arg = client(dir.path(), "wrong-key", "archive", &server.url, &stranger.public);
    let out = ostree(&["pull", &arg, "origin", REF]).output().unwrap();
    assert!(!out.status.success(), "a pull trusting another key must fail");

    // One flipped byte in a content object.
    let victim = walkdir::WalkDir::new(remote.join("objects"))
        .into_iter()
        .filter_map(Result::ok)
        .filter(|e| e.path().extension().is_some_and(|x| x == "filez"))
        .max_by_key(|e| e.metadata().unwrap().len())
        .unwrap()
        .into_path();
    let mut bytes = std::fs::read(&victim).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xff;
    std::fs::write(&victim, bytes).unwrap();
    let arg = client(dir.path(), "flipped", "archive", &server.url, &key.public);
    let out = ostree(&["pull", &arg, "--disable-static-deltas", "origin", REF])
        .output()
        .unwrap();
    assert!(!out.status.success(), "a pull of a corrupted object must fail");
}

#[test]
fn interrupted_publish_keeps_serving_v1_and_a_rerun_completes() {
    let f = Fixture::new();
    let (dir, key, remote) = (&f.dir, &f.key, &f.remote);
    let v1 = f.build(1, "2026.11.1");
    f.publish(&ok).unwrap();
    let v2 = f.build(2, "2026.11.2");

    let killed = |phase: Phase| {
        if phase == Phase::Objects {
            anyhow::bail!("killed after the objects")
        } else {
            Ok(())
        }
    };
    assert!(f.publish(&killed).is_err());
    assert_eq!(
        temps(remote),
        Vec::<PathBuf>::new(),
        "an error path left temp files"
    );
    let remote_repo = ost::open(remote).unwrap();
    assert_eq!(
        ost::resolve(&remote_repo, REF).unwrap().as_deref(),
        Some(v1.as_str())
    );
    run(&mut ostree(&["fsck", &format!("--repo={}", remote.display())]));
    let server = StaticServer::start(remote);
    let arg = client(dir.path(), "client", "archive", &server.url, &key.public);
    run(&mut ostree(&["pull", &arg, "origin", REF]));
    assert_eq!(
        run(&mut ostree(&["rev-parse", &arg, &format!("origin:{REF}")])).trim(),
        v1
    );

    // What a kill -9 mid-copy leaves: temp files beside objects, refs and
    // the summary, and a half-built scratch dir. The rerun removes them.
    let stale = [
        remote.join("objects/00/.publish-k1ll3d"),
        remote.join("refs/heads/emberrtos/x86_64/.publish-Zx81"),
        remote.join(".publish-summary"),
    ];
    for file in &stale {
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(file, b"half written").unwrap();
    }
    std::fs::create_dir_all(remote.join(".publish-scratch/tmp")).unwrap();
    std::os::unix::fs::symlink(remote.join("objects"), remote.join(".publish-scratch/objects")).unwrap();
    let report = f.publish(&ok).unwrap();
    assert!(!report.no_op);
    assert_eq!(report.stale_temps_removed, 4);
    assert_eq!(temps(remote), Vec::<PathBuf>::new());
    assert!(remote.join("objects").is_dir(), "the cleanup followed a symlink");
    assert_eq!(
        ost::resolve(&ost::open(remote).unwrap(), REF).unwrap().as_deref(),
        Some(v2.as_str())
    );
    run(&mut ostree(&["pull", &arg, "origin", REF]));
    assert_eq!(
        run(&mut ostree(&["rev-parse", &arg, &format!("origin:{REF}")])).trim(),
        v2
    );
}

#[test]
fn refuses_rt_without_evidence_and_old_versions() {
    let f = Fixture::new();
    let (dir, key, repo, remote) = (&f.dir, &f.key, &f.repo, &f.remote);
    let mut broken = rt_evidence();
    broken.record(rtcheck::Check::fail(
        "artifact.uts-version",
        "not PREEMPT_RT (PREEMPT_DYNAMIC)",
    ));
    // Commit through the library and force the ref, bypassing the tag gate,
    // as a hand-edited repo would.
    let meta = commit::metadata(&CommitFacts {
        name: "emberrtos",
        version: "2026.11.1",
        flavor: Flavor::Rt,
        arch: rtcheck::Arch::X86_64,
        kernel_release: "6.12.0",
        kernel_config_sha256: &"ab".repeat(32),
        kargs: &[],
        recipe_sha256: &"cd".repeat(32),
        evidence: &broken,
        health: &emberrtos_contract::policy::HealthPolicy::default(),
        sbom_sha256: None,
        secure_boot: None,
    })
    .unwrap();
    // ... on a tree whose kernel is generic.
    let generic = tree(dir.path(), 9);
    std::fs::write(
        generic.join("usr/lib/modules/6.12.0/vmlinuz"),
        rtcheck::bzimage::synthetic::kernel(
            "6.12.0 (ci@imgbuild) #1 SMP PREEMPT_DYNAMIC Sun Nov 30 00:00:00 UTC 2025",
            None,
        ),
    )
    .unwrap();
    let bad = commit::commit(repo, REF, &generic, &meta, "bad", 1).unwrap();
    ost::set_ref(&ost::open(repo).unwrap(), REF, &bad.checksum).unwrap();
    let err = f.publish(&ok).unwrap_err();
    assert_eq!(exit_code(&err), exit::REFUSED, "{err:#}");
    assert!(format!("{err:#}").contains("artifact.uts-version"), "{err:#}");
    assert!(!remote.join("refs/heads").join(REF).exists());

    // A good v2 published, then an older version is refused unless forced.
    let v2 = f.build(2, "2026.11.2");
    f.publish(&ok).unwrap();
    let old = f.build(3, "2026.11.1");
    let err = f.publish(&ok).unwrap_err();
    assert!(format!("{err:#}").contains("is not newer"), "{err:#}");
    assert_eq!(
        ost::resolve(&ost::open(remote).unwrap(), REF).unwrap().as_deref(),
        Some(v2.as_str())
    );
    let forced = publish(
        repo,
        &LocalDir::new(remote),
        &PublishOptions {
            refs: vec![],
            gpg_key: Some(&key.fingerprint),
            gpg_homedir: Some(key.home.path()),
            deltas: 1,
            delta_from_empty: true,
            depth: 5,
            force: true,
            prune_unsigned_refs: false,
            secure_boot_cert: None,
            after_phase: &ok,
        },
        &Ui::plain(),
    )
    .unwrap();
    assert_eq!(forced.refs[0].commit, old);
    // Asked for, the delta from empty is made (or skipped with its sizes).
    let from_empty = format!("empty-{}", &old[..12]);
    let entry = &forced.refs[0];
    assert!(
        entry.deltas.contains(&from_empty) || entry.skipped_deltas.iter().any(|s| s.starts_with(&from_empty)),
        "{entry:?}"
    );
}

#[test]
fn summary_is_never_served_unsigned_when_signing_is_interrupted() {
    let f = Fixture::new();
    let (dir, key, remote) = (&f.dir, &f.key, &f.remote);
    let v1 = f.build(1, "2026.11.1");
    f.publish(&ok).unwrap();
    let v2 = f.build(2, "2026.11.2");

    // The signing key goes away between the refs and the summary, as a kill
    // between generating and signing the summary would interrupt it.
    let secrets = key.home.path().join("private-keys-v1.d");
    let hidden = key.home.path().join("hidden-keys");
    let lose_key = |phase: Phase| {
        if phase == Phase::Refs {
            std::fs::rename(&secrets, &hidden).unwrap();
        }
        Ok(())
    };
    let err = f.publish(&lose_key).unwrap_err();
    assert!(format!("{err:#}").contains("signing the summary"), "{err:#}");
    std::fs::rename(&hidden, &secrets).unwrap();
    assert!(
        remote.join("summary.sig").is_file(),
        "the summary lost its signature"
    );
    assert_eq!(temps(remote), Vec::<PathBuf>::new());

    // The served summary and signature still match: a client that verifies
    // the summary pulls v1 through it.
    let url = format!("file://{}", remote.display());
    let arg = strict_client(dir.path(), "strict", &url, &key.public);
    run(&mut ostree(&["pull", &arg, "origin", REF]));
    assert_eq!(
        run(&mut ostree(&["rev-parse", &arg, &format!("origin:{REF}")])).trim(),
        v1
    );

    // The rerun is not a no-op: it completes the summary, signed.
    let report = f.publish(&ok).unwrap();
    assert!(!report.no_op, "the rerun left the summary stale");
    run(&mut ostree(&["pull", &arg, "origin", REF]));
    assert_eq!(
        run(&mut ostree(&["rev-parse", &arg, &format!("origin:{REF}")])).trim(),
        v2
    );
    assert!(f.publish(&ok).unwrap().no_op);
}

#[test]
fn earlier_commits_are_published_and_pulled_by_checksum_up_to_depth() {
    let f = Fixture::new();
    let (dir, key, remote) = (&f.dir, &f.key, &f.remote);
    let v1 = f.build(1, "2026.11.1");
    let v2 = f.build(2, "2026.11.2");
    let v3 = f.build(3, "2026.11.3");
    let v4 = f.build(4, "2026.11.4");

    // Only the tip and one parent go out at depth 1.
    let shallow = f.dir.path().join("shallow");
    let publish_to = |to: &Path, depth: usize| {
        publish(
            &f.repo,
            &LocalDir::new(to),
            &PublishOptions {
                refs: vec![REF.into()],
                gpg_key: Some(&key.fingerprint),
                gpg_homedir: Some(key.home.path()),
                deltas: 2,
                delta_from_empty: false,
                depth,
                force: false,
                prune_unsigned_refs: false,
                secure_boot_cert: None,
                after_phase: &ok,
            },
            &Ui::plain(),
        )
        .unwrap()
    };
    let report = publish_to(&shallow, 1);
    assert_eq!(report.refs[0].history, vec![v3.clone()]);
    let url = format!("file://{}", shallow.display());
    let arg = client(dir.path(), "shallow-client", "archive", &url, &key.public);
    run(&mut ostree(&["pull", &arg, "origin", &v3]));
    let out = ostree(&["pull", &arg, "origin", &v2]).output().unwrap();
    assert!(
        !out.status.success(),
        "v2 is beyond depth 1 and must not be served"
    );

    // The default depth carries all three parents, each with a delta to the tip.
    let report = f.publish(&ok).unwrap();
    assert_eq!(report.refs[0].history, vec![v3.clone(), v2.clone(), v1.clone()]);
    for parent in [&v1, &v2, &v3] {
        let name = format!("{}-{}", &parent[..12], &v4[..12]);
        assert!(
            report.refs[0].deltas.contains(&name)
                || report.refs[0].skipped_deltas.iter().any(|s| s.starts_with(&name)),
            "no delta decision for {name}: {:?}",
            report.refs[0]
        );
    }
    assert!(
        report.refs[0].deltas.iter().any(|d| d.starts_with(&v1[..12])),
        "{:?}",
        report.refs[0]
    );
    assert_eq!(
        signatures(remote, &v1),
        1,
        "a carried commit travels with its signature"
    );
    assert!(f.publish(&ok).unwrap().no_op);
    run(&mut ostree(&["fsck", &format!("--repo={}", remote.display())]));

    // A device pulls the oldest version by checksum, signature verified, and
    // deploys it.
    let url = format!("file://{}", remote.display());
    let device = Device::new(dir.path(), &url, &key.public);
    run(&mut ostree(&["pull", &device.repo_arg(), "origin", &v1]));
    let deployed = device.admin(&["deploy", "--os=emberrtos", &v1]);
    assert!(
        deployed.status.success(),
        "{}",
        String::from_utf8_lossy(&deployed.stderr)
    );
    let deployments = device.deployments();
    assert_eq!(deployments[0].0, v1);
    assert_eq!(calibration_revision(&deployments[0].1), 1);
    // And from there to the tip through the delta from v1.
    let arg = client(dir.path(), "delta-client", "archive", &url, &key.public);
    run(&mut ostree(&["pull", &arg, "origin", &v1]));
    let out = run(&mut ostree(&["pull", &arg, "origin", REF]));
    eprintln!("{out}");
    assert_eq!(
        run(&mut ostree(&["rev-parse", &arg, &format!("origin:{REF}")])).trim(),
        v4
    );
}

#[test]
fn versions_follow_debian_order_and_invalid_ones_are_refused() {
    let f = Fixture::new();
    let remote = &f.remote;
    f.build(1, "2.1~rc1");
    f.publish(&ok).unwrap();
    // `2.1` follows its release candidate `2.1~rc1`.
    let release = f.build(2, "2.1");
    assert_eq!(f.publish(&ok).unwrap().refs[0].commit, release);

    let served = || ost::resolve(&ost::open(remote).unwrap(), REF).unwrap();
    f.build(3, "v9");
    let err = f.publish(&ok).unwrap_err();
    let message = format!("{err:#}");
    assert!(
        message.contains("\"v9\" is not a valid Debian version") && message.contains("start with a digit"),
        "{message}"
    );
    assert_eq!(served().as_deref(), Some(release.as_str()));

    // `-rc1` is a Debian revision: `2.1-rc1` sorts after `2.1`, `2.1` after it does not.
    let revision = f.build(4, "2.1-rc1");
    assert_eq!(f.publish(&ok).unwrap().refs[0].commit, revision);
    f.build(5, "2.1");
    let err = f.publish(&ok).unwrap_err();
    assert!(format!("{err:#}").contains("is not newer"), "{err:#}");
    assert_eq!(served().as_deref(), Some(revision.as_str()));
}

/// The record files (signatures included) under `root`, as (relative path, bytes), sorted.
fn record_files(root: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut files: Vec<_> = ["qualifications", "promotions"]
        .iter()
        .flat_map(|dir| {
            walkdir::WalkDir::new(root.join(dir))
                .into_iter()
                .filter_map(Result::ok)
        })
        .filter(|e| e.file_type().is_file())
        .map(|e| {
            let rel = e.path().strip_prefix(root).unwrap().to_path_buf();
            (rel, std::fs::read(e.path()).unwrap())
        })
        .collect();
    files.sort();
    files
}

fn armored(what: &str) -> Vec<u8> {
    format!("-----BEGIN PGP SIGNATURE-----\n\n{what}\n-----END PGP SIGNATURE-----\n").into_bytes()
}

#[test]
fn signed_records_go_out_before_the_ref_and_planted_links_stop_the_publish() {
    let f = Fixture::new();
    let remote = &f.remote;
    let served = || ost::resolve(&ost::open(remote).unwrap(), REF).unwrap();
    let v1 = f.build(1, "2026.11.1");
    let qualification = br#"{"verdict":"PASS","worst-us":41}"#;
    records::store(
        &f.repo,
        RecordKind::Qualification,
        &v1,
        "lab-a.json",
        qualification,
        &armored("qa"),
    )
    .unwrap();
    let promotion = br#"{"to":"emberrtos/x86_64/rt-stable"}"#;
    records::store(
        &f.repo,
        RecordKind::Promotion,
        &v1,
        "rt-stable.json",
        promotion,
        &armored("pa"),
    )
    .unwrap();

    // When the records phase ends they are served; the ref is not there yet.
    let records_before_ref = |phase: Phase| {
        if phase == Phase::Records {
            assert_eq!(record_files(remote), record_files(&f.repo));
            assert_eq!(served(), None, "the ref moved before the records went out");
        }
        Ok(())
    };
    let report = f.publish(&records_before_ref).unwrap();
    assert_eq!(report.records_copied, 2);
    assert_eq!(serde_json::to_value(&report).unwrap()["records-copied"], 2);
    assert_eq!(served().as_deref(), Some(v1.as_str()));
    let q = Path::new("qualifications").join(&v1);
    let p = Path::new("promotions").join(&v1);
    assert_eq!(
        record_files(remote),
        vec![
            (p.join("rt-stable.json"), promotion.to_vec()),
            (p.join("rt-stable.json.sig"), armored("pa")),
            (q.join("lab-a.json"), qualification.to_vec()),
            (q.join("lab-a.json.sig"), armored("qa")),
        ]
    );
    let again = f.publish(&ok).unwrap();
    assert!(again.no_op && again.records_copied == 0, "{again:?}");

    // A record added after the commit went out: the remote serves the
    // commit already, and the record still goes (and only it).
    let late = br#"{"verdict":"PASS","worst-us":38}"#;
    records::store(
        &f.repo,
        RecordKind::Qualification,
        &v1,
        "lab-b.json",
        late,
        &armored("qb"),
    )
    .unwrap();
    let report = f.publish(&ok).unwrap();
    assert!(!report.no_op);
    assert_eq!(report.records_copied, 1);
    assert_eq!(record_files(remote), record_files(&f.repo));
    assert_eq!(record_files(remote).len(), 6);
    // A record without its signature is not sent.
    std::fs::write(f.repo.join(&q).join("unsigned.json"), b"{}").unwrap();
    let report = f.publish(&ok).unwrap();
    assert!(report.no_op && report.records_copied == 0, "{report:?}");
    assert!(!remote.join(&q).join("unsigned.json").exists());
    assert_eq!(temps(remote), Vec::<PathBuf>::new());

    // v2 whose qualifications dir is a planted link: publish fails naming
    // it, before anything reaches the remote, and before it signs: a second
    // publisher's key, which would add a signature (to a remote of its
    // own), added none.
    let v2 = f.build(2, "2026.11.2");
    let elsewhere = f.dir.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    std::fs::write(elsewhere.join("secret.json"), b"host secret").unwrap();
    std::fs::write(elsewhere.join("secret.json.sig"), armored("s")).unwrap();
    let link = f.repo.join("qualifications").join(&v2);
    std::os::unix::fs::symlink(&elsewhere, &link).unwrap();
    let second_publisher = GpgKey::generate("second publisher");
    let second_remote = f.dir.path().join("www-2");
    let err = do_publish(&f.repo, &second_remote, &second_publisher, &ok).unwrap_err();
    assert!(
        format!("{err:#}").contains(&link.display().to_string()),
        "{err:#}"
    );
    assert_eq!(signatures(&f.repo, &v2), 1, "publish signed v2 before it failed");
    assert_eq!(served().as_deref(), Some(v1.as_str()), "the ref moved");
    assert!(!remote.join("qualifications").join(&v2).exists());
    assert!(
        !remote.join(object_rel(&v2)).exists(),
        "objects went out before the refusal"
    );

    // A link planted on the remote where v2's promotions go: refused too,
    // nothing written through it, and the ref stays.
    std::fs::remove_file(&link).unwrap();
    records::store(
        &f.repo,
        RecordKind::Qualification,
        &v2,
        "lab-a.json",
        late,
        &armored("q2"),
    )
    .unwrap();
    records::store(
        &f.repo,
        RecordKind::Promotion,
        &v2,
        "rt-stable.json",
        promotion,
        &armored("p2"),
    )
    .unwrap();
    let outside = f.dir.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    let remote_link = remote.join("promotions").join(&v2);
    std::os::unix::fs::symlink(&outside, &remote_link).unwrap();
    let err = f.publish(&ok).unwrap_err();
    assert!(
        format!("{err:#}").contains(&remote_link.display().to_string()),
        "{err:#}"
    );
    assert_eq!(
        std::fs::read_dir(&outside).unwrap().count(),
        0,
        "written through the remote's link"
    );
    assert_eq!(served().as_deref(), Some(v1.as_str()), "the ref moved");
    assert_eq!(temps(remote), Vec::<PathBuf>::new());

    // Without the link the rerun completes: v2 with its records (the
    // qualification went out before the refusal: only the promotion is new).
    std::fs::remove_file(&remote_link).unwrap();
    let report = f.publish(&ok).unwrap();
    assert_eq!(report.records_copied, 1);
    assert_eq!(served().as_deref(), Some(v2.as_str()));
    let of_v2 = |files: Vec<(PathBuf, Vec<u8>)>| -> Vec<_> {
        files
            .into_iter()
            .filter(|(rel, _)| rel.parent().is_some_and(|d| d.ends_with(&v2)))
            .collect()
    };
    assert_eq!(of_v2(record_files(remote)), of_v2(record_files(&f.repo)));
    assert_eq!(of_v2(record_files(remote)).len(), 4);
    assert_eq!(
        std::fs::read(remote.join("promotions").join(&v2).join("rt-stable.json.sig")).unwrap(),
        armored("p2")
    );
}

/// A commit object's path in a repo.
fn object_rel(commit: &str) -> PathBuf {
    imgbuild::commands::publish::object_path(commit, ::ostree::ObjectType::Commit)
}

/// Publishes the fixture's ref through `transport`, signed.
fn publish_through(f: &Fixture, transport: &dyn Transport) -> anyhow::Result<PublishReport> {
    publish(
        &f.repo,
        transport,
        &PublishOptions {
            refs: vec![REF.into()],
            gpg_key: Some(&f.key.fingerprint),
            gpg_homedir: Some(f.key.home.path()),
            deltas: 2,
            delta_from_empty: false,
            depth: 5,
            force: false,
            prune_unsigned_refs: false,
            secure_boot_cert: None,
            after_phase: &ok,
        },
        &Ui::plain(),
    )
}

/// Files under `root` that are not 0644 (the web server must read them).
fn unreadable_files(root: &Path) -> Vec<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    walkdir::WalkDir::new(root)
        .into_iter()
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_file() && e.file_name() != ".publish.lock")
        .filter(|e| e.metadata().unwrap().permissions().mode() & 0o777 != 0o644)
        .map(|e| e.into_path())
        .collect()
}

#[test]
fn ssh_publish_gives_a_remote_a_gpg_verifying_client_pulls_v1_then_v2_by_delta() {
    let f = Fixture::new();
    let sshd = Sshd::start(&f.dir.path().join("sshd"));
    let www = f.dir.path().join("srv/www");
    let ssh = SshDir::parse(&sshd.url(&www)).unwrap().with_config(&sshd.config);
    let v1 = f.build(1, "2026.11.1");
    let report = publish_through(&f, &ssh).unwrap();
    assert!(report.objects_copied > 10, "{report:?}");
    assert_eq!(report.destination, sshd.url(&www));
    assert_eq!(temps(&www), Vec::<PathBuf>::new());
    assert_eq!(unreadable_files(&www), Vec::<PathBuf>::new());
    let server = StaticServer::start(&www);
    // A client that verifies the summary's signature too, and a bare one
    // (ostree uses static deltas only into bare repos).
    let strict = strict_client(f.dir.path(), "strict", &server.url, &f.key.public);
    let bare = client(f.dir.path(), "bare", "bare", &server.url, &f.key.public);
    for arg in [&strict, &bare] {
        run(&mut ostree(&["pull", arg, "origin", REF]));
        assert_eq!(
            run(&mut ostree(&["rev-parse", arg, &format!("origin:{REF}")])).trim(),
            v1
        );
    }

    let v2 = f.build(2, "2026.11.2");
    let report = publish_through(&f, &ssh).unwrap();
    assert_eq!(report.refs[0].deltas.len(), 1, "{report:?}");
    server.reset();
    run(&mut ostree(&["pull", &bare, "origin", REF]));
    assert!(
        server
            .requests()
            .iter()
            .any(|(path, _)| path.starts_with("/deltas/")),
        "the client did not use the delta: {:?}",
        server.requests()
    );
    for arg in [&strict, &bare] {
        run(&mut ostree(&["pull", arg, "origin", REF]));
        assert_eq!(
            run(&mut ostree(&["rev-parse", arg, &format!("origin:{REF}")])).trim(),
            v2
        );
    }
    // A third publish of the same commit changes nothing.
    assert!(publish_through(&f, &ssh).unwrap().no_op);
    run(&mut ostree(&["fsck", &format!("--repo={}", www.display())]));
}

#[test]
fn ssh_publish_checks_the_host_key_and_refuses_planted_links() {
    let f = Fixture::new();
    let sshd = Sshd::start(&f.dir.path().join("sshd"));
    f.build(1, "2026.11.1");
    let www = f.dir.path().join("srv/www");

    // A server whose host key is not the known one.
    let real = std::fs::read_to_string(&sshd.known_hosts).unwrap();
    std::fs::write(&sshd.known_hosts, "").unwrap();
    let ssh = SshDir::parse(&sshd.url(&www)).unwrap().with_config(&sshd.config);
    let err = format!("{:#}", publish_through(&f, &ssh).unwrap_err());
    assert!(err.contains("Host key verification failed"), "{err}");
    assert!(err.contains("known_hosts"), "{err}");
    assert!(!www.exists(), "a refused host key still wrote");
    std::fs::write(&sshd.known_hosts, real).unwrap();

    // objects/ planted as a link out of the web root: nothing lands there.
    let outside = f.dir.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::create_dir_all(&www).unwrap();
    run(&mut ostree(&[
        "init",
        &format!("--repo={}", www.display()),
        "--mode=archive",
    ]));
    std::fs::remove_dir_all(www.join("objects")).unwrap();
    std::os::unix::fs::symlink(&outside, www.join("objects")).unwrap();
    let err = format!("{:#}", publish_through(&f, &ssh).unwrap_err());
    assert!(err.contains("symlink"), "{err}");
    assert_eq!(
        std::fs::read_dir(&outside).unwrap().count(),
        0,
        "a write followed the link"
    );
    assert!(!www.join("refs/heads").join(REF).exists());
}

/// Objects under the remote's objects/.
fn object_count(remote: &Path) -> usize {
    walkdir::WalkDir::new(remote.join("objects"))
        .into_iter()
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_file())
        .count()
}

#[test]
fn kill_9_of_an_ssh_publish_mid_objects_keeps_v1_pulling_and_a_rerun_completes() {
    let f = Fixture::new();
    let sshd = Sshd::start(&f.dir.path().join("sshd"));
    let www = f.dir.path().join("srv/www");
    let url = sshd.url(&www);
    let v1 = f.build(1, "2026.11.1");
    publish_through(&f, &SshDir::parse(&url).unwrap().with_config(&sshd.config)).unwrap();
    // v2 brings 40 new files: 40 objects, each its own batch below.
    let extra = tree(f.dir.path(), 2).join("usr/share/extra");
    std::fs::create_dir_all(&extra).unwrap();
    for i in 0..40 {
        std::fs::write(extra.join(format!("f{i}")), format!("file {i}\n").repeat(100)).unwrap();
    }
    let v2 = f.build(2, "2026.11.2");
    let before = object_count(&www);

    let cli = || {
        let mut cmd = Command::new(assert_cmd::cargo::cargo_bin("imgbuild"));
        cmd.args(["publish", "--repo"])
            .arg(&f.repo)
            .args([
                "--to",
                &url,
                "--ref",
                REF,
                "--gpg-key",
                &f.key.fingerprint,
                "--gpg-homedir",
            ])
            .arg(f.key.home.path())
            .env("IMGBUILD_SSH_CONFIG", &sshd.config)
            .env("IMGBUILD_SSH_BATCH_BYTES", "1");
        cmd
    };
    let mut child = cli()
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    while object_count(&www) == before {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the publish ended before any v2 object landed"
        );
        assert!(started.elapsed().as_secs() < 120, "no v2 object landed in 120 s");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let landed = object_count(&www) - before;
    assert!(landed < 40, "the kill came after the objects ({landed} landed)");

    let remote_repo = ost::open(&www).unwrap();
    assert_eq!(
        ost::resolve(&remote_repo, REF).unwrap().as_deref(),
        Some(v1.as_str())
    );
    let server = StaticServer::start(&www);
    let arg = strict_client(f.dir.path(), "client", &server.url, &f.key.public);
    run(&mut ostree(&["pull", &arg, "origin", REF]));
    assert_eq!(
        run(&mut ostree(&["rev-parse", &arg, &format!("origin:{REF}")])).trim(),
        v1
    );

    let out = cli().output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(temps(&www), Vec::<PathBuf>::new());
    run(&mut ostree(&["pull", &arg, "origin", REF]));
    assert_eq!(
        run(&mut ostree(&["rev-parse", &arg, &format!("origin:{REF}")])).trim(),
        v2
    );
}

/// Publishes the fixture's ref to its local remote, signed, removing the
/// refs it serves unsigned when `prune`.
fn publish_pruning(
    f: &Fixture,
    prune: bool,
    after: &dyn Fn(Phase) -> anyhow::Result<()>,
) -> anyhow::Result<PublishReport> {
    publish(
        &f.repo,
        &LocalDir::new(&f.remote),
        &PublishOptions {
            refs: vec![REF.into()],
            gpg_key: Some(&f.key.fingerprint),
            gpg_homedir: Some(f.key.home.path()),
            deltas: 2,
            delta_from_empty: false,
            depth: 5,
            force: false,
            prune_unsigned_refs: prune,
            secure_boot_cert: None,
            after_phase: after,
        },
        &Ui::plain(),
    )
}

/// The names in `dir`, sorted.
fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// The regular files under `root` whose bytes hold `needle`.
fn files_holding(root: &Path, needle: &[u8]) -> Vec<PathBuf> {
    walkdir::WalkDir::new(root)
        .into_iter()
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_file())
        .filter(|e| {
            std::fs::read(e.path())
                .unwrap()
                .windows(needle.len())
                .any(|w| w == needle)
        })
        .map(|e| e.into_path())
        .collect()
}

#[test]
fn planted_links_at_a_local_destination_are_refused_before_anything_is_made() {
    let f = Fixture::new();
    let remote = &f.remote;
    let v1 = f.build(1, "2026.11.1");
    let outside = f.dir.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    let refused = |path: &Path| {
        let err = format!("{:#}", f.publish(&ok).unwrap_err());
        assert!(err.contains(&format!("{} is a symlink", path.display())), "{err}");
        err
    };

    // The destination itself a link.
    std::os::unix::fs::symlink(&outside, remote).unwrap();
    refused(remote);
    assert_eq!(
        names(&outside),
        Vec::<String>::new(),
        "made through the root link"
    );

    // `refs` a link in a fresh destination: no repo creation runs through it.
    std::fs::remove_file(remote).unwrap();
    std::fs::create_dir(remote).unwrap();
    std::os::unix::fs::symlink(&outside, remote.join("refs")).unwrap();
    refused(&remote.join("refs"));
    assert_eq!(names(&outside), Vec::<String>::new(), "made through refs");
    assert_eq!(names(remote), ["refs"], "made before the link check");

    // `config` a link to a host file: refused by its name, never copied or shown.
    std::fs::remove_file(remote.join("refs")).unwrap();
    f.publish(&ok).unwrap();
    let secret = outside.join("shadow");
    std::fs::write(&secret, "root:SECRET-FIRST-LINE:19000::::::\n").unwrap();
    std::fs::remove_file(remote.join("config")).unwrap();
    std::os::unix::fs::symlink(&secret, remote.join("config")).unwrap();
    f.build(2, "2026.11.2");
    let err = refused(&remote.join("config"));
    assert!(
        !err.contains("SECRET"),
        "a planted file's content was shown: {err}"
    );
    assert_eq!(files_holding(remote, b"SECRET"), Vec::<PathBuf>::new());
    assert_eq!(read(&remote.join("refs/heads").join(REF)).trim(), v1);
}

#[test]
fn refs_planted_in_the_web_root_are_refused_or_pruned_and_never_signed() {
    let f = Fixture::new();
    let remote = &f.remote;
    let v1 = f.build(1, "2026.11.1");
    f.publish(&ok).unwrap();
    // Unsigned commits made in the web root with their refs; one carries
    // v1's signatures copied over (the right issuer, not a good signature).
    let planted = f.dir.path().join("planted");
    std::fs::create_dir(&planted).unwrap();
    std::fs::write(planted.join("payload"), b"not from the publisher").unwrap();
    let commit = |branch: &str| {
        run(&mut ostree(&[
            "commit",
            &format!("--repo={}", remote.display()),
            &format!("--branch={branch}"),
            &format!("--tree=dir={}", planted.display()),
        ]))
        .trim()
        .to_string()
    };
    let evil = commit("evil");
    let copied = commit("copied-signature");
    let meta = |c: &str| {
        remote.join(imgbuild::commands::publish::object_path(
            c,
            ::ostree::ObjectType::CommitMeta,
        ))
    };
    std::fs::copy(meta(&v1), meta(&copied)).unwrap();
    let served = || {
        (
            std::fs::read(remote.join("summary")).unwrap(),
            std::fs::read(remote.join("summary.sig")).unwrap(),
        )
    };
    let before = served();

    let v2 = f.build(2, "2026.11.2");
    let err = f.publish(&ok).unwrap_err();
    assert_eq!(exit_code(&err), exit::REFUSED, "{err:#}");
    let message = format!("{err:#}");
    for name in ["evil", "copied-signature", "--prune-unsigned-refs"] {
        assert!(message.contains(name), "{name} not named: {message}");
    }
    assert!(served() == before, "the summary changed");
    assert_eq!(read(&remote.join("refs/heads").join(REF)).trim(), v1);
    assert!(
        !remote.join(object_rel(&v2)).exists(),
        "objects went out before the refusal"
    );
    assert_eq!(signatures(&f.repo, &v2), 1, "signed before the refusal");

    // Asked to, publish removes them; the summary lists the publisher's ref only.
    let report = publish_pruning(&f, true, &ok).unwrap();
    let mut pruned = report.pruned_refs.clone();
    pruned.sort();
    assert_eq!(pruned, ["copied-signature", "evil"]);
    assert!(!remote.join("refs/heads/evil").exists());
    let summary = std::fs::read(remote.join("summary")).unwrap();
    assert_eq!(
        imgbuild::transport::trust::summary_refs(&summary).unwrap(),
        vec![(REF.to_string(), v2.clone())]
    );
    let url = format!("file://{}", remote.display());
    let arg = strict_client(f.dir.path(), "strict", &url, &f.key.public);
    run(&mut ostree(&["pull", &arg, "origin", REF]));

    // A ref planted while a publish runs: the summary that would list it is
    // refused, and the signed one stays served.
    let before = served();
    f.build(3, "2026.11.3");
    let plant = |phase: Phase| {
        if phase == Phase::Refs {
            std::fs::write(remote.join("refs/heads/late"), format!("{evil}\n")).unwrap();
        }
        Ok(())
    };
    let err = publish_pruning(&f, true, &plant).unwrap_err();
    assert_eq!(exit_code(&err), exit::REFUSED, "{err:#}");
    assert!(format!("{err:#}").contains("late"), "{err:#}");
    assert!(served() == before, "a summary listing the planted ref was served");
}

#[test]
fn objects_planted_at_the_destination_are_sent_again_not_trusted() {
    let f = Fixture::new();
    let sshd = Sshd::start(&f.dir.path().join("sshd"));
    f.build(1, "2026.11.1");
    let largest = walkdir::WalkDir::new(f.repo.join("objects"))
        .into_iter()
        .filter_map(Result::ok)
        .filter(|e| e.path().extension().is_some_and(|x| x == "filez"))
        .max_by_key(|e| e.metadata().unwrap().len())
        .unwrap();
    let rel = largest.path().strip_prefix(&f.repo).unwrap().to_path_buf();
    let genuine = std::fs::read(largest.path()).unwrap();
    let www = f.dir.path().join("srv/www");
    let ssh = SshDir::parse(&sshd.url(&www)).unwrap().with_config(&sshd.config);
    let local = LocalDir::new(&f.remote);
    for (root, transport) in [(&www, &ssh as &dyn Transport), (&f.remote, &local)] {
        std::fs::create_dir_all(root).unwrap();
        run(&mut ostree(&[
            "init",
            &format!("--repo={}", root.display()),
            "--mode=archive",
        ]));
        // Same name and size, other bytes.
        std::fs::create_dir_all(root.join(&rel).parent().unwrap()).unwrap();
        std::fs::write(root.join(&rel), vec![0u8; genuine.len()]).unwrap();
        publish_through(&f, transport).unwrap();
        assert!(
            std::fs::read(root.join(&rel)).unwrap() == genuine,
            "{}: the planted object stayed",
            root.display()
        );
        run(&mut ostree(&["fsck", &format!("--repo={}", root.display())]));
    }
}

#[test]
fn an_ssh_destination_that_is_a_symlink_is_refused_before_anything_is_made() {
    let f = Fixture::new();
    let sshd = Sshd::start(&f.dir.path().join("sshd"));
    f.build(1, "2026.11.1");
    let www = f.dir.path().join("srv/www");
    let outside = f.dir.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::create_dir_all(www.parent().unwrap()).unwrap();
    std::os::unix::fs::symlink(&outside, &www).unwrap();
    let ssh = SshDir::parse(&sshd.url(&www)).unwrap().with_config(&sshd.config);
    let err = format!("{:#}", publish_through(&f, &ssh).unwrap_err());
    assert!(
        err.contains(&format!("{} on root@127.0.0.1 is a symlink", www.display())),
        "{err}"
    );
    assert_eq!(names(&outside), Vec::<String>::new(), "written through the link");
}

#[test]
fn an_ssh_lock_that_never_comes_fails_at_the_deadline_naming_it() {
    let f = Fixture::new();
    let sshd = Sshd::start(&f.dir.path().join("sshd"));
    let v1 = f.build(1, "2026.11.1");
    let www = f.dir.path().join("srv/www");
    std::fs::create_dir_all(&www).unwrap();
    // Another holder of the lock that never lets go.
    let holder = std::fs::File::create(www.join(".publish.lock")).unwrap();
    holder.lock().unwrap();
    let deadline = std::time::Duration::from_secs(5);
    let ssh = SshDir::parse(&sshd.url(&www))
        .unwrap()
        .with_config(&sshd.config)
        .with_deadline(deadline);
    let started = std::time::Instant::now();
    let err = format!("{:#}", publish_through(&f, &ssh).unwrap_err());
    assert!(
        err.contains("waiting for the lock .publish.lock")
            && err.contains("no answer within 5 s")
            && err.contains("IMGBUILD_SSH_TIMEOUT"),
        "{err}"
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(60));
    assert!(!www.join("refs/heads").join(REF).exists());
    drop(holder);
    assert_eq!(publish_through(&f, &ssh).unwrap().refs[0].commit, v1);
}
