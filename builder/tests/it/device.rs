//! `emberrtos-device` against real scratch sysroots (`ostree admin init-fs`,
//! `os-init`, `deploy` of synthetic commits whose kernels are stand-ins
//! that read as PREEMPT_RT or not): first-boot provisioning refuses a
//! generic kernel on the RT ref and deploys nothing, deploys a verified RT
//! commit as the default and keeps the standard one, pulls the RT commit
//! from a GPG-verified remote over HTTP, and `emberrtos-update` upgrades,
//! refuses and rolls back.
//!
//! Needs root (libostree deploys make deployment roots immutable); skipped,
//! with a message, otherwise. The sysroots live on /dev/shm: a deploy
//! freezes and thaws the filesystem that holds /boot, a no-op on tmpfs.

use crate::common;

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::{GpgKey, Kernel, StaticServer, ostree, run, text};
use emberrtos_device::grubenv;
use imgbuild::ostree::{self as ost, CommitRequest, MetaValue};
use imgbuild::recipe::Flavor;
use imgbuild::stages::commit::{self, CommitFacts};

const STD_REF: &str = "emberrtos-ci/x86_64/standard";
const RT_REF: &str = "emberrtos-ci/x86_64/rt";
const OS: &str = "emberrtos";
const KEY: &str =
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIMb0BNNQoj3nWEsjM+9r/UoI4GBWm7F3uUbLuQGNTzYr ops@example.org";
/// What `imgbuild disk` puts on the kernel command line besides the commit's.
const DISK_KARGS: &[&str] = &[
    "root=UUID=0d1e2f30-aaaa-4bbb-8ccc-123456789abc",
    "rw",
    "console=ttyS0,115200",
];
const STD_KARGS: &[&str] = &["quiet"];
const RT_KARGS: &[&str] = &["quiet", "isolcpus=managed_irq,domain,1", "nohz_full=1"];
const DAY: u64 = 86_400;
/// GRUB's environment block on the ESP, in the sysroot.
const GRUBENV: &str = "boot/efi/EFI/BOOT/grubenv";
const EPOCH: u64 = 1_764_460_800;

fn skipped() -> bool {
    if imgbuild::tool::running_as_root() {
        return false;
    }
    eprintln!("SKIPPED: device tests need root (ostree admin deploy makes deployment roots immutable)");
    true
}

/// A deployable tree: `kernel`, `/usr/etc` with root's passwd entry and the
/// flavor file, `/root` a link into `/var` as the layout stage makes it, and
/// a release file whose content tells builds apart.
fn tree(dir: &Path, name: &str, kernel: Kernel, flavor: &str, release: &str) -> PathBuf {
    let tree = dir.join(name);
    for d in [
        "usr/bin",
        "usr/lib",
        "usr/etc/emberrtos",
        "usr/share/emberrtos",
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
    let link = |target: &str, at: &str| std::os::unix::fs::symlink(target, tree.join(at)).unwrap();
    link("sysroot/ostree", "ostree");
    link("var/roothome", "root");
    link("usr/bin", "bin");
    let write = |at: &str, text: &str| std::fs::write(tree.join(at), text).unwrap();
    write("usr/lib/os-release", "NAME=EmberRTOS\nID=emberrtos\n");
    write("usr/etc/passwd", "root:x:0:0:root:/root:/bin/sh\n");
    write("usr/etc/emberrtos/kernel-flavor", &format!("{flavor}\n"));
    write("usr/share/emberrtos/release", &format!("{release}\n"));
    kernel.install(&tree);
    tree
}

struct Build<'a> {
    kernel: Kernel,
    /// What the commit claims (`imgbuild.flavor`).
    flavor: Flavor,
    kargs: &'a [&'a str],
    release: &'a str,
    timestamp: u64,
    /// Boot evidence recorded at tag time (a booted RT kernel's).
    boot: bool,
}

/// Commits a build on `ref_name` in the archive repo `repo` (signed when a
/// key is given); returns the checksum.
fn commit_build(repo: &Path, ref_name: &str, build: &Build, key: Option<&GpgKey>) -> String {
    let dir = tempfile::tempdir().unwrap();
    let flavor_file = if build.flavor == Flavor::Rt {
        "rt"
    } else {
        "standard"
    };
    let tree = tree(dir.path(), "tree", build.kernel, flavor_file, build.release);
    // The verify stage's evidence of an RT kernel, whatever is committed:
    // the gate must read the committed files, not this claim.
    let evidence = Kernel::Rt.evidence();
    let kargs: Vec<String> = build.kargs.iter().map(|k| k.to_string()).collect();
    let meta = commit::metadata(&CommitFacts {
        name: "emberrtos-ci",
        version: build.release,
        flavor: build.flavor,
        arch: rtcheck::Arch::X86_64,
        kernel_release: common::RELEASE,
        kernel_config_sha256: &"ab".repeat(32),
        kargs: &kargs,
        recipe_sha256: &"cd".repeat(32),
        evidence: &evidence,
        health: &emberrtos_contract::policy::HealthPolicy::default(),
        sbom_sha256: None,
        secure_boot: None,
    })
    .unwrap();
    let repository = ost::open_or_create(repo).unwrap();
    let parent = ost::resolve(&repository, ref_name).unwrap();
    let out = ost::commit_tree(
        &repository,
        CommitRequest {
            tree: &tree,
            subject: build.release,
            metadata: &meta,
            timestamp: build.timestamp,
            parent: parent.as_deref(),
            force_root_owner: false,
            cancellable: None,
            on_entry: None,
            hardlinked: false,
            consume: false,
            parent_repo: None,
        },
    )
    .unwrap();
    if build.boot {
        let mut detached = ost::Metadata::new();
        let boot = rt_boot_evidence();
        detached.insert(
            commit::BOOT_EVIDENCE.into(),
            MetaValue::Str(serde_json::to_string(&boot).unwrap()),
        );
        ost::add_detached_metadata(&repository, &out.checksum, &detached).unwrap();
    }
    if let Some(key) = key {
        ost::sign_commit(
            &repository,
            &out.checksum,
            &key.fingerprint,
            Some(key.home.path()),
        )
        .unwrap();
    }
    ost::set_ref(&repository, ref_name, &out.checksum).unwrap();
    if let Some(key) = key {
        ost::update_summary(&repository, Some(&key.fingerprint), Some(key.home.path())).unwrap();
    }
    out.checksum
}

/// Boot evidence as the boot stage records it for the RT kernel.
fn rt_boot_evidence() -> rtcheck::Evidence {
    let mut boot = rtcheck::evidence::check_running_kernel(Kernel::Rt.uts(), Some(Kernel::Rt.config()));
    boot.release = Some(common::RELEASE.into());
    boot.medium_sha256 = Some("1".repeat(64));
    boot
}

fn standard(release: &str) -> Build<'_> {
    Build {
        kernel: Kernel::Generic,
        flavor: Flavor::Standard,
        kargs: STD_KARGS,
        release,
        timestamp: EPOCH,
        boot: false,
    }
}

fn rt(release: &str, day: u64) -> Build<'_> {
    Build {
        kernel: Kernel::Rt,
        flavor: Flavor::Rt,
        kargs: RT_KARGS,
        release,
        timestamp: EPOCH + day * DAY,
        boot: true,
    }
}

/// A generic kernel under an RT badge: RT evidence and boot evidence copied
/// onto it, flavor `rt` claimed.
fn forged(release: &str, day: u64) -> Build<'_> {
    Build {
        kernel: Kernel::Generic,
        ..rt(release, day)
    }
}

/// A scratch sysroot with `STD_REF` deployed the way `imgbuild disk` does.
struct Device {
    _dir: tempfile::TempDir,
    sysroot: PathBuf,
    medium: PathBuf,
}

impl Drop for Device {
    /// ostree marks deployment roots immutable; lift it so the temp dir can go.
    fn drop(&mut self) {
        let deployments = self.sysroot.join("ostree/deploy").join(OS).join("deploy");
        for entry in std::fs::read_dir(deployments).into_iter().flatten().flatten() {
            let _ = Command::new("chattr").arg("-i").arg(entry.path()).status();
        }
    }
}

impl Device {
    /// Installs `STD_REF` from `repo`, with `refs` also stored in the device's repo.
    fn new(repo: &Path, refs: &[&str]) -> Device {
        let dir = tempfile::Builder::new()
            .prefix("device-test")
            .tempdir_in("/dev/shm")
            .unwrap();
        let sysroot = dir.path().join("sysroot");
        std::fs::create_dir_all(&sysroot).unwrap();
        let s = format!("--sysroot={}", sysroot.display());
        run(&mut ostree(&["admin", "init-fs", sysroot.to_str().unwrap()]));
        run(&mut ostree(&["admin", "os-init", &s, OS]));
        let device_repo = format!("--repo={}", sysroot.join("ostree/repo").display());
        let mut pull = vec!["pull-local", &device_repo, repo.to_str().unwrap()];
        pull.extend(refs);
        run(&mut ostree(&pull));
        let std_kargs = commit_kargs(&sysroot.join("ostree/repo"), STD_REF);
        let mut deploy = vec![
            "admin".to_string(),
            "deploy".into(),
            s.clone(),
            format!("--os={OS}"),
        ];
        for karg in DISK_KARGS.iter().map(|k| k.to_string()).chain(std_kargs) {
            deploy.push(format!("--karg={karg}"));
        }
        deploy.push(STD_REF.into());
        run(Command::new("ostree").args(&deploy));
        // The ESP's environment block, as `imgbuild disk` makes it.
        let grub_dir = sysroot.join("boot/efi/EFI/BOOT");
        std::fs::create_dir_all(&grub_dir).unwrap();
        run(Command::new("grub-editenv")
            .arg(grub_dir.join("grubenv"))
            .arg("create"));
        let medium = dir.path().join("medium");
        Device {
            _dir: dir,
            sysroot,
            medium,
        }
    }

    fn device(&self, args: &[&str]) -> Output {
        let mut cmd = Command::new(common::device_binary());
        cmd.args(args).arg("--sysroot").arg(&self.sysroot);
        cmd.output().unwrap()
    }

    fn provision(&self) -> Output {
        let medium = self.medium.to_str().unwrap().to_string();
        let out = self.device(&["provision", "--medium-dir", &medium, "--no-reboot"]);
        eprintln!("provision: {}", text(&out));
        out
    }

    /// Writes the medium: `provision.yaml` (and the key file beside it).
    fn write_medium(&self, flavor: &str, remote: Option<(&str, &Path)>) {
        let dir = self.medium.join("emberrtos");
        std::fs::create_dir_all(&dir).unwrap();
        let mut yaml = format!("flavor: {flavor}\nhostname: cell-07\nssh-authorized-keys: [\"{KEY}\"]\n");
        if let Some((url, key)) = remote {
            std::fs::copy(key, dir.join("publisher.asc")).unwrap();
            yaml.push_str(&format!(
                "update-remote: {{url: \"{url}\", gpg-key: publisher.asc}}\n"
            ));
        }
        std::fs::write(dir.join("provision.yaml"), yaml).unwrap();
    }

    fn var(&self) -> PathBuf {
        self.sysroot.join("ostree/deploy").join(OS).join("var")
    }

    fn record(&self) -> serde_json::Value {
        let text = std::fs::read_to_string(self.var().join("lib/emberrtos/provision.json")).unwrap();
        serde_json::from_str(&text).unwrap()
    }

    /// The deployments, default first, as `emberrtos-update status --json` says.
    fn status(&self) -> Vec<serde_json::Value> {
        let out = self.device(&["update", "status", "--json"]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap()
    }

    fn checksums(&self) -> Vec<String> {
        self.status()
            .iter()
            .map(|d| d["checksum"].as_str().unwrap().to_string())
            .collect()
    }

    /// libostree's own view: (checksum, kernel arguments), default first.
    fn deployments(&self) -> Vec<(String, String)> {
        let sysroot = ostree::Sysroot::new(Some(&ostree::gio::File::for_path(&self.sysroot)));
        sysroot.load(ostree::gio::Cancellable::NONE).unwrap();
        sysroot
            .deployments()
            .iter()
            .map(|d| {
                let options = d.bootconfig().and_then(|b| b.get("options")).unwrap_or_default();
                (d.csum().to_string(), options.to_string())
            })
            .collect()
    }

    /// The variables of GRUB's environment block on the ESP.
    fn grubenv(&self) -> BTreeMap<String, String> {
        let block = std::fs::read(self.sysroot.join(GRUBENV)).unwrap();
        grubenv::parse(&block).unwrap()
    }

    /// Ends a trial as a healthy boot does: an empty environment block.
    fn end_trial(&self) {
        let block = grubenv::render(&BTreeMap::new()).unwrap();
        std::fs::write(self.sysroot.join(GRUBENV), block).unwrap();
    }

    /// Asserts that `checksum` is on trial with `tries`, in GRUB's variables
    /// and in health.json.
    fn assert_on_trial(&self, checksum: &str, tries: u8) {
        let env = self.grubenv();
        assert_eq!(
            env.get("emberrtos_trial").map(String::as_str),
            Some("1"),
            "{env:?}"
        );
        assert_eq!(env.get("emberrtos_tries"), Some(&tries.to_string()), "{env:?}");
        let id = env.get("emberrtos_trial_id").unwrap();
        assert!(id.starts_with(&format!("{checksum}.")), "{env:?}");
        let health = std::fs::read_to_string(self.var().join("lib/emberrtos/health.json")).unwrap();
        let health: serde_json::Value = serde_json::from_str(&health).unwrap();
        assert_eq!(health["deployments"][id]["state"], "trial", "{health}");
        assert_eq!(health["deployments"][id]["tries"], tries, "{health}");
    }

    /// The checkout of the default deployment.
    fn default_root(&self) -> PathBuf {
        let sysroot = ostree::Sysroot::new(Some(&ostree::gio::File::for_path(&self.sysroot)));
        sysroot.load(ostree::gio::Cancellable::NONE).unwrap();
        let default = sysroot.deployments().into_iter().next().unwrap();
        self.sysroot.join(sysroot.deployment_dirpath(&default).as_str())
    }
}

fn commit_kargs(repo: &Path, rev: &str) -> Vec<String> {
    let info = ost::read_commit(&ost::open(repo).unwrap(), rev).unwrap();
    commit::kargs_of(&info).unwrap()
}

fn expected_kargs(commit_kargs: &[&str]) -> String {
    DISK_KARGS
        .iter()
        .chain(commit_kargs)
        .copied()
        .collect::<Vec<_>>()
        .join(" ")
}

#[test]
fn rt_provisioning_refuses_a_generic_kernel_and_deploys_nothing() {
    if skipped() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let repo = dir.path().join("repo");
    let std_commit = commit_build(&repo, STD_REF, &standard("1"), None);
    let forged = commit_build(&repo, RT_REF, &forged("1", 1), None);
    let device = Device::new(&repo, &[STD_REF, RT_REF]);
    device.write_medium("rt", None);

    let out = device.provision();
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    let record = device.record();
    assert_eq!(record["status"], "refused", "{record}");
    assert_eq!(record["flavor"], "rt");
    assert_eq!(record["commit"], forged.as_str());
    assert_eq!(record["ref"], RT_REF);
    let reason = record["reason"].as_str().unwrap();
    assert!(
        reason.starts_with("verify: the kernel is not proven PREEMPT_RT: artifact.uts-version: not PREEMPT_RT (PREEMPT_DYNAMIC)"),
        "{reason}"
    );
    assert!(reason.contains("boot evidence is from build"), "{reason}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("EMBERRTOS-PROVISION: refused flavor=rt"),
        "{stdout}"
    );
    assert!(stdout.contains("RT provisioning REFUSED: verify: "), "{stdout}");

    // Nothing was deployed: the node stays standard.
    assert_eq!(device.checksums(), vec![std_commit.clone()]);
    assert_eq!(device.deployments().len(), 1);
    let root = device.default_root();
    assert_eq!(
        std::fs::read_to_string(root.join("etc/emberrtos/kernel-flavor")).unwrap(),
        "standard\n"
    );
    // The banners say why; the identity from the medium is in place.
    let motd = std::fs::read_to_string(root.join("etc/motd.d/50-emberrtos-provision")).unwrap();
    assert!(motd.starts_with("RT provisioning REFUSED: verify: "), "{motd}");
    let issue = std::fs::read_to_string(root.join("etc/issue.d/50-emberrtos-provision.issue")).unwrap();
    assert!(issue.contains("RT provisioning REFUSED"), "{issue}");
    assert_eq!(
        std::fs::read_to_string(root.join("etc/hostname")).unwrap(),
        "cell-07\n"
    );
    let ssh = device.var().join("roothome/.ssh");
    assert_eq!(std::fs::metadata(&ssh).unwrap().mode() & 0o777, 0o700);
    let keys = ssh.join("authorized_keys");
    assert_eq!(std::fs::metadata(&keys).unwrap().mode() & 0o777, 0o600);
    assert_eq!(std::fs::read_to_string(&keys).unwrap(), format!("{KEY}\n"));

    // It never runs twice: the record stays as written.
    let again = device.provision();
    assert_eq!(again.status.code(), Some(0), "{}", text(&again));
    assert!(String::from_utf8_lossy(&again.stdout).contains("already ran"));
    assert_eq!(device.record(), record);
    assert_eq!(device.checksums(), vec![std_commit]);
}

#[test]
fn rt_provisioning_deploys_the_verified_commit_and_keeps_the_standard_one() {
    if skipped() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let repo = dir.path().join("repo");
    let std_commit = commit_build(&repo, STD_REF, &standard("1"), None);
    let rt_commit = commit_build(&repo, RT_REF, &rt("1", 1), None);
    let device = Device::new(&repo, &[STD_REF, RT_REF]);
    device.write_medium("rt", None);

    let out = device.provision();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(&format!(
            "EMBERRTOS-PROVISION: provisioned flavor=rt commit={rt_commit}"
        )),
        "{}",
        text(&out)
    );
    let record = device.record();
    assert_eq!(record["status"], "provisioned", "{record}");
    assert_eq!(record["commit"], rt_commit.as_str());
    assert_eq!(record["hostname"], "cell-07");

    // The RT deployment is the default, the standard one its rollback.
    let deployments = device.deployments();
    assert_eq!(
        deployments.iter().map(|(c, _)| c.clone()).collect::<Vec<_>>(),
        vec![rt_commit.clone(), std_commit.clone()]
    );
    let without_ostree = |options: &str| {
        options
            .split_whitespace()
            .filter(|a| !a.starts_with("ostree="))
            .collect::<Vec<_>>()
            .join(" ")
    };
    assert_eq!(without_ostree(&deployments[0].1), expected_kargs(RT_KARGS));
    assert_eq!(without_ostree(&deployments[1].1), expected_kargs(STD_KARGS));
    let status = device.status();
    assert_eq!(status[0]["origin"], RT_REF);
    assert_eq!(status[0]["flavor"], "rt");
    assert_eq!(status[1]["role"], "rollback");
    // /etc merged: the hostname set on the standard deployment carries over,
    // and the flavor file is the RT commit's.
    let root = device.default_root();
    assert_eq!(
        std::fs::read_to_string(root.join("etc/hostname")).unwrap(),
        "cell-07\n"
    );
    assert_eq!(
        std::fs::read_to_string(root.join("etc/emberrtos/kernel-flavor")).unwrap(),
        "rt\n"
    );
    assert!(!root.join("etc/motd.d/50-emberrtos-provision").exists());
    // The RT deployment boots on trial (the commit carries no policy: 3 tries).
    device.assert_on_trial(&rt_commit, 3);

    // emberrtos-update rollback goes back to standard, ending the trial,
    // and forth again.
    let back = device.device(&["update", "rollback", "--no-reboot"]);
    assert_eq!(back.status.code(), Some(0), "{}", text(&back));
    assert_eq!(device.checksums(), vec![std_commit.clone(), rt_commit.clone()]);
    assert!(device.grubenv().is_empty(), "{:?}", device.grubenv());
    let forth = device.device(&["update", "rollback", "--no-reboot"]);
    assert_eq!(forth.status.code(), Some(0), "{}", text(&forth));
    assert_eq!(device.checksums(), vec![rt_commit, std_commit]);
}

#[test]
fn rt_provisioning_pulls_from_the_remote_then_updates_refuse_and_roll_back() {
    if skipped() {
        return;
    }
    let key = GpgKey::generate("publisher");
    let dir = tempfile::tempdir().unwrap();
    let served = dir.path().join("served");
    let std_commit = commit_build(&served, STD_REF, &standard("1"), Some(&key));
    let v1 = commit_build(&served, RT_REF, &rt("1", 1), Some(&key));
    let server = StaticServer::start(&served);
    // The device holds only the standard ref: RT comes from the remote.
    let device = Device::new(&served, &[STD_REF]);
    device.write_medium("rt", Some((&server.url, &key.public)));

    let out = device.provision();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("bytes transferred"),
        "{}",
        text(&out)
    );
    assert_eq!(device.checksums(), vec![v1.clone(), std_commit.clone()]);
    let status = device.status();
    assert_eq!(status[0]["origin"], format!("emberrtos:{RT_REF}"));
    // The standard deployment tracked a local ref; now it tracks the remote.
    assert_eq!(status[1]["origin"], format!("emberrtos:{STD_REF}"));
    let remote_conf = std::fs::read_to_string(device.sysroot.join("ostree/repo/config")).unwrap();
    assert!(remote_conf.contains("gpg-verify=true"), "{remote_conf}");
    // The provisioned RT deployment boots on trial (the commits carry no
    // policy: the default 3 tries).
    device.assert_on_trial(&v1, 3);
    device.end_trial();

    // v2: one file changed, a day newer, with a static delta from v1.
    let v2 = commit_build(&served, RT_REF, &rt("2", 2), Some(&key));
    run(&mut ostree(&[
        "static-delta",
        "generate",
        &format!("--repo={}", served.display()),
        &format!("--from={v1}"),
        &format!("--to={v2}"),
    ]));
    ost::update_summary(
        &ost::open(&served).unwrap(),
        Some(&key.fingerprint),
        Some(key.home.path()),
    )
    .unwrap();
    let up = device.device(&["update", "upgrade", "--no-reboot"]);
    eprintln!("upgrade: {}", text(&up));
    assert_eq!(up.status.code(), Some(0), "{}", text(&up));
    let said = String::from_utf8_lossy(&up.stdout);
    assert!(
        said.contains("bytes transferred") && said.contains("static delta parts 1/1"),
        "{said}"
    );
    assert_eq!(device.checksums(), vec![v2.clone(), v1.clone()]);
    assert_eq!(
        std::fs::read_to_string(device.default_root().join("usr/share/emberrtos/release")).unwrap(),
        "2\n"
    );
    device.assert_on_trial(&v2, 3);
    assert!(said.contains("boots on trial: 3 tries"), "{said}");
    // No update while v2's trial is undecided.
    let during = device.device(&["update", "upgrade", "--no-reboot"]);
    assert_eq!(during.status.code(), Some(3), "{}", text(&during));
    assert!(text(&during).contains("on trial"), "{}", text(&during));
    device.end_trial();

    // v3 puts a generic kernel on the RT ref, signed by the publisher: refused.
    let v3 = commit_build(&served, RT_REF, &forged("3", 3), Some(&key));
    let refused = device.device(&["update", "upgrade", "--no-reboot"]);
    eprintln!("refused upgrade: {}", text(&refused));
    assert_eq!(refused.status.code(), Some(3), "{}", text(&refused));
    assert!(
        text(&refused).contains("artifact.uts-version"),
        "{}",
        text(&refused)
    );
    assert!(!device.checksums().contains(&v3));

    // Rollback: v1 is the default again.
    let back = device.device(&["update", "rollback", "--no-reboot"]);
    assert_eq!(back.status.code(), Some(0), "{}", text(&back));
    assert_eq!(device.checksums(), vec![v1, v2]);
}

#[test]
fn rt_provisioning_refuses_a_commit_signed_by_another_key() {
    if skipped() {
        return;
    }
    let publisher = GpgKey::generate("publisher");
    let intruder = GpgKey::generate("intruder");
    let dir = tempfile::tempdir().unwrap();
    let served = dir.path().join("served");
    let std_commit = commit_build(&served, STD_REF, &standard("1"), Some(&intruder));
    commit_build(&served, RT_REF, &rt("1", 1), Some(&intruder));
    let server = StaticServer::start(&served);
    let device = Device::new(&served, &[STD_REF]);
    device.write_medium("rt", Some((&server.url, &publisher.public)));

    let out = device.provision();
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    let record = device.record();
    assert_eq!(record["status"], "refused");
    let reason = record["reason"].as_str().unwrap();
    assert!(reason.starts_with("pull: ") && reason.contains("GPG"), "{reason}");
    assert!(record["commit"].is_null());
    assert_eq!(device.checksums(), vec![std_commit]);
}

#[test]
fn standard_provisioning_and_bad_media() {
    if skipped() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let repo = dir.path().join("repo");
    let std_commit = commit_build(&repo, STD_REF, &standard("1"), None);

    let device = Device::new(&repo, &[STD_REF]);
    device.write_medium("standard", None);
    let out = device.provision();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let record = device.record();
    assert_eq!(record["status"], "provisioned");
    assert_eq!(record["flavor"], "standard");
    assert_eq!(record["commit"], std_commit.as_str());
    assert_eq!(device.checksums(), vec![std_commit.clone()]);

    // A file that breaks the schema: failed, the field and line named.
    let bad = Device::new(&repo, &[STD_REF]);
    bad.write_medium("rt", None);
    let yaml = bad.medium.join("emberrtos/provision.yaml");
    let mut text_ = std::fs::read_to_string(&yaml).unwrap();
    text_.push_str("colour: blue\n");
    std::fs::write(&yaml, text_).unwrap();
    let out = bad.provision();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let record = bad.record();
    assert_eq!(record["status"], "failed");
    let reason = record["reason"].as_str().unwrap();
    assert!(
        reason.contains("EMBERCFG:emberrtos/provision.yaml:4") && reason.contains("colour"),
        "{reason}"
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("EMBERRTOS-PROVISION: failed"));

    // No medium at all: nothing recorded, the node boots as built.
    let none = Device::new(&repo, &[STD_REF]);
    let out = none.device(&["provision", "--medium-label", "NO-SUCH-LABEL-9", "--wait", "0"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("no configuration medium"));
    assert!(!none.var().join("lib/emberrtos/provision.json").exists());
}

/// A disk built with an update remote stores the RT ref as the remote's
/// (`emberrtos:REF`): provisioning uses that embedded commit, offline,
/// instead of pulling from a remote that does not answer.
#[test]
fn rt_provisioning_uses_the_commit_embedded_under_the_remote_name() {
    if skipped() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let repo = dir.path().join("repo");
    commit_build(&repo, STD_REF, &standard("1"), None);
    let rt_commit = commit_build(&repo, RT_REF, &rt("1", 1), None);
    let device = Device::new(&repo, &[STD_REF]);
    let device_repo = format!("--repo={}", device.sysroot.join("ostree/repo").display());
    run(&mut ostree(&[
        "pull-local",
        &device_repo,
        repo.to_str().unwrap(),
        &rt_commit,
    ]));
    run(&mut ostree(&[
        "refs",
        &device_repo,
        &format!("--create=emberrtos:{RT_REF}"),
        &rt_commit,
    ]));
    // Nothing listens on port 9 of loopback: a pull would fail.
    run(&mut ostree(&[
        "remote",
        "add",
        &device_repo,
        "--set=gpg-verify=true",
        "emberrtos",
        "http://127.0.0.1:9/",
    ]));
    device.write_medium("rt", None);

    let out = device.provision();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let record = device.record();
    assert_eq!(record["status"], "provisioned", "{record}");
    assert_eq!(record["commit"], rt_commit.as_str());
    assert_eq!(device.checksums()[0], rt_commit);
}
