//! `imgbuild qualify` against real OpenSSH servers on 127.0.0.1 (one
//! `/usr/sbin/sshd` per target, its own host key, authorized_keys and session
//! PATH, where stand-in `jitter` and `uname` scripts play the target), and
//! `imgbuild promote` over qualification records signed with real GnuPG keys.

use crate::common;

use std::io::{BufRead, BufReader};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{
    GpgKey, Kernel, RELEASE, RT_CONFIG, RT_UTS, files_under, ostree, repo_root, run, sha256_hex, text,
};
use imgbuild::ostree as ost;
use imgbuild::recipe::Flavor;
use imgbuild::stages::commit::{self, CommitFacts};
use imgbuild::stages::tag::{TagRequest, required_checks, tag};
use serde_json::{Value, json};

const REF: &str = "emberrtos/x86_64/rt";
const STABLE: &str = "emberrtos/x86_64/rt-stable";
/// qualify's flag for taking host keys as first shown (else `--known-hosts`).
const TOFU: &str = "--trust-on-first-use";

// ---------------------------------------------------------------------------
// Running imgbuild
// ---------------------------------------------------------------------------

/// Runs imgbuild (echoing what it did when QUALIFY_TEST_ECHO is set).
fn imgbuild(args: &[&str]) -> Output {
    let out = assert_cmd::Command::cargo_bin("imgbuild")
        .unwrap()
        .args(args)
        .timeout(Duration::from_secs(180))
        .output()
        .unwrap();
    if std::env::var_os("QUALIFY_TEST_ECHO").is_some() {
        eprintln!("$ imgbuild {args:?}\n{}", text(&out));
    }
    out
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[track_caller]
fn assert_exit(out: &Output, code: i32) {
    assert_eq!(out.status.code(), Some(code), "{}", text(out));
}

fn json_of(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {}", text(out)))
}

/// The row of `target` in `qualify --json`'s output.
#[track_caller]
fn row<'a>(doc: &'a Value, target: &str) -> &'a Value {
    doc["targets"]
        .as_array()
        .unwrap_or_else(|| panic!("no targets array: {doc:#}"))
        .iter()
        .find(|r| r["target"] == target)
        .unwrap_or_else(|| panic!("no row for {target}: {doc:#}"))
}

/// `r` is an error row whose error says `needle`.
#[track_caller]
fn assert_error(r: &Value, needle: &str) {
    assert_eq!(r["status"], "error", "{r:#}");
    assert!(r["error"].as_str().unwrap_or_default().contains(needle), "{r:#}");
}

/// `r` is `sshd`'s row, refused for the kernel after a login, with the host
/// key scanned.
#[track_caller]
fn assert_refused_for_kernel(r: &Value, sshd: &Sshd) {
    assert_eq!(r["status"], "refused", "{r:#}");
    assert!(
        r["error"]
            .as_str()
            .unwrap_or_default()
            .to_lowercase()
            .contains("kernel"),
        "{r:#}"
    );
    assert_eq!(r["host-key"], sshd.fingerprint().as_str(), "{r:#}");
    assert!(sshd.logins() >= 1, "{}", sshd.log());
}

/// `r` is `sshd`'s row, measured with `verdict`.
#[track_caller]
fn assert_measured(r: &Value, sshd: &Sshd, verdict: &str) {
    assert_eq!(r["status"], "measured", "{r:#}");
    assert_eq!(r["verdict"], verdict, "{r:#}");
    assert_eq!(r["host-key"], sshd.fingerprint().as_str(), "{r:#}");
}

fn path_str(path: &Path) -> &str {
    path.to_str().unwrap()
}

// ---------------------------------------------------------------------------
// A proven PREEMPT_RT commit
// ---------------------------------------------------------------------------

/// A small tree in ostree layout carrying `kernel`.
fn small_tree(dir: &Path, kernel: Kernel) -> PathBuf {
    let tree = dir.join(match kernel {
        Kernel::Rt => "tree-rt",
        Kernel::Generic => "tree-generic",
    });
    for d in ["usr/etc/emberrtos", "usr/bin", "var", "sysroot", "tmp"] {
        std::fs::create_dir_all(tree.join(d)).unwrap();
    }
    std::fs::write(tree.join("usr/etc/emberrtos/kernel-flavor"), "rt\n").unwrap();
    kernel.install(&tree);
    std::fs::write(tree.join("usr/bin/tool"), b"#!/bin/sh\n").unwrap();
    std::os::unix::fs::symlink("usr/bin", tree.join("bin")).unwrap();
    tree
}

fn rt_metadata() -> ost::Metadata {
    commit::metadata(&CommitFacts {
        name: "emberrtos",
        version: "2026.11.1",
        flavor: Flavor::Rt,
        arch: rtcheck::Arch::X86_64,
        kernel_release: RELEASE,
        kernel_config_sha256: &"ab".repeat(32),
        kargs: &[
            "nohz_full=1".to_string(),
            "isolcpus=managed_irq,domain,1".to_string(),
        ],
        recipe_sha256: &"cd".repeat(32),
        evidence: &Kernel::Rt.evidence(),
        health: &emberrtos_contract::policy::HealthPolicy::default(),
        sbom_sha256: None,
        secure_boot: None,
    })
    .unwrap()
}

/// Commits an RT tree on [`REF`] in `dir/repo` and tags it through the RT
/// gate with boot evidence taken on that kernel (signed by `key` when
/// given). Returns (repo, commit).
fn proven_commit(dir: &Path, key: Option<&GpgKey>) -> (PathBuf, String) {
    let repo = dir.join("repo");
    let tree = small_tree(dir, Kernel::Rt);
    let out = commit::commit(
        &repo,
        REF,
        &tree,
        &rt_metadata(),
        "emberrtos 2026.11.1 (rt)",
        1_764_460_800,
    )
    .unwrap();
    prove(&repo, &out.checksum, key);
    (repo, out.checksum)
}

/// Tags `commit` on [`REF`] through the RT gate with boot evidence taken on
/// its kernel (signed by `key` when given).
fn prove(repo: &Path, commit: &str, key: Option<&GpgKey>) {
    let mut boot = rtcheck::evidence::check_running_kernel(Kernel::Rt.uts(), Some(Kernel::Rt.config()));
    boot.release = Some(RELEASE.into());
    boot.medium_sha256 = Some("1".repeat(64));
    let required = required_checks(true, true);
    tag(&TagRequest {
        repo,
        ref_name: REF,
        commit,
        flavor: Flavor::Rt,
        required: &required,
        boot_evidence: Some(&boot),
        gpg_key: key.map(|k| k.fingerprint.as_str()),
        gpg_homedir: key.map(|k| k.home.path()),
    })
    .unwrap();
    // What every RT consumer asks: the commit is a proven RT build on REF.
    imgbuild::stages::verify::gate_commit_for_ref(&ost::open(repo).unwrap(), REF, commit).unwrap();
}

/// A PREEMPT_DYNAMIC kernel under an rt ref, the ref forced past the gate
/// (as a hand-edited repo would be). Returns the commit.
fn unproven_commit(dir: &Path, repo: &Path, ref_name: &str) -> String {
    let tree = small_tree(dir, Kernel::Generic);
    let out = commit::commit(
        repo,
        ref_name,
        &tree,
        &rt_metadata(),
        "generic as rt",
        1_764_460_900,
    )
    .unwrap();
    ost::set_ref(&ost::open(repo).unwrap(), ref_name, &out.checksum).unwrap();
    out.checksum
}

fn resolve(repo: &Path, rev: &str) -> Option<String> {
    ost::resolve(&ost::open(repo).unwrap(), rev).unwrap()
}

// ---------------------------------------------------------------------------
// SSH: client keys and a real sshd per target
// ---------------------------------------------------------------------------

fn ssh_keygen(path: &Path) {
    run(Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-C", "qualify-test", "-f"])
        .arg(path));
}

/// `SHA256:…` of a public key file, as `ssh-keygen -lf` prints it.
fn fingerprint_of(public: &Path) -> String {
    let out = run(Command::new("ssh-keygen").arg("-lf").arg(public));
    let fp = out.split_whitespace().nth(1).unwrap().to_string();
    assert!(fp.starts_with("SHA256:"), "{out}");
    fp
}

fn needs_root() -> bool {
    if imgbuild::tool::running_as_root() {
        return false;
    }
    eprintln!("SKIPPED: needs root (sshd, and root logins into it)");
    true
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A real OpenSSH server on 127.0.0.1, killed on drop. Its session PATH is
/// `<dir>/bin:/usr/bin:/bin`, so scripts put in [`Sshd::bin`] stand in for
/// programs on the target.
struct Sshd {
    child: Child,
    port: u16,
    dir: PathBuf,
    /// "Connection from" lines logged by the time it was ready.
    baseline: usize,
}

impl Sshd {
    /// Starts sshd with its own ed25519 host key in `dir`, accepting the
    /// public key text `authorized` for root.
    fn start(dir: &Path, authorized: &str) -> Sshd {
        let dir = dir.to_path_buf();
        std::fs::create_dir_all(dir.join("bin")).unwrap();
        ssh_keygen(&dir.join("hostkey"));
        std::fs::write(dir.join("authorized_keys"), authorized).unwrap();
        // sshd's privilege separation directory (made by the ssh service).
        std::fs::create_dir_all("/run/sshd").unwrap();
        let sshd = Path::new("/usr/sbin/sshd");
        assert!(
            sshd.exists(),
            "/usr/sbin/sshd is missing: apt-get install openssh-server (ci/setup)"
        );
        for _attempt in 0..5 {
            let port = free_port();
            let config = dir.join("sshd_config");
            std::fs::write(
                &config,
                format!(
                    "Port {port}\n\
                     ListenAddress 127.0.0.1\n\
                     HostKey {dir}/hostkey\n\
                     PidFile none\n\
                     StrictModes no\n\
                     UsePAM no\n\
                     PermitRootLogin prohibit-password\n\
                     PubkeyAuthentication yes\n\
                     PasswordAuthentication no\n\
                     KbdInteractiveAuthentication no\n\
                     AuthorizedKeysFile {dir}/authorized_keys\n\
                     PermitUserEnvironment no\n\
                     SetEnv PATH={dir}/bin:/usr/bin:/bin\n\
                     Subsystem sftp internal-sftp\n\
                     MaxStartups 100\n\
                     LogLevel VERBOSE\n",
                    dir = dir.display()
                ),
            )
            .unwrap();
            let log = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(dir.join("sshd.log"))
                .unwrap();
            let mut child = Command::new(sshd)
                .args(["-D", "-e", "-f"])
                .arg(&config)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .unwrap();
            let deadline = Instant::now() + Duration::from_secs(15);
            let ready = loop {
                if child.try_wait().unwrap().is_some() {
                    break false; // e.g. the port was taken meanwhile
                }
                // Our own sshd listening (not another test's that took the port first).
                let listening = std::fs::read_to_string(dir.join("sshd.log"))
                    .unwrap_or_default()
                    .contains(&format!("Server listening on 127.0.0.1 port {port}."));
                if listening && banner(port).is_some_and(|b| b.starts_with("SSH-2.0-OpenSSH")) {
                    break true;
                }
                if Instant::now() > deadline {
                    let _ = child.kill();
                    let _ = child.wait();
                    break false;
                }
                std::thread::sleep(Duration::from_millis(50));
            };
            if ready {
                let mut sshd = Sshd {
                    child,
                    port,
                    dir,
                    baseline: 0,
                };
                // The readiness probe's own connection.
                let deadline = Instant::now() + Duration::from_secs(5);
                while sshd.connections() == 0 && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(20));
                }
                sshd.baseline = sshd.connections();
                return sshd;
            }
        }
        panic!(
            "sshd did not start: {}",
            std::fs::read_to_string(dir.join("sshd.log")).unwrap_or_default()
        );
    }

    fn target(&self) -> String {
        format!("root@127.0.0.1:{}", self.port)
    }

    fn bin(&self) -> PathBuf {
        self.dir.join("bin")
    }

    fn host_key_pub(&self) -> PathBuf {
        self.dir.join("hostkey.pub")
    }

    fn fingerprint(&self) -> String {
        fingerprint_of(&self.host_key_pub())
    }

    /// The host key as a known_hosts line for this server.
    fn known_hosts_line(&self, public: &Path) -> String {
        let key = std::fs::read_to_string(public).unwrap();
        let mut words = key.split_whitespace();
        format!(
            "[127.0.0.1]:{} {} {}\n",
            self.port,
            words.next().unwrap(),
            words.next().unwrap()
        )
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("sshd.log")).unwrap_or_default()
    }

    fn connections(&self) -> usize {
        self.log().matches("Connection from").count()
    }

    /// Connections since it was ready.
    fn new_connections(&self) -> usize {
        self.connections() - self.baseline
    }

    fn logins(&self) -> usize {
        self.log().matches("Accepted publickey").count()
    }

    /// Puts an executable script on the session PATH.
    fn script(&self, name: &str, body: &str) {
        let path = self.bin().join(name);
        std::fs::write(&path, body).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    /// The jitter stand-in's invocations, one line each.
    fn jitter_calls(&self) -> Vec<String> {
        std::fs::read_to_string(self.dir.join("jitter.log"))
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// A `jitter` that logs its invocations to `jitter.log`, answers
    /// `--check-kernel` by printing `check_kernel` and exiting 0, and for
    /// anything else leaves `measured` behind and runs `measure`.
    fn jitter(&self, check_kernel: &str, measure: &str) {
        let d = self.dir.display();
        self.script(
            "jitter",
            &format!(
                "#!/bin/sh\n\
                 echo \"$*\" >> {d}/jitter.log\n\
                 if [ \"$1\" = --check-kernel ]; then\n\
                 {check_kernel}\
                 \x20 exit 0\n\
                 fi\n\
                 touch {d}/measured\n\
                 {measure}"
            ),
        );
    }

    /// A `jitter` that answers `--check-kernel` with exit 0 and leaves
    /// `measured` behind if asked for anything else.
    fn jitter_that_must_not_measure(&self) {
        self.jitter("\x20 echo ' PREEMPT_RT: yes'\n", "exit 4\n");
    }

    /// A `jitter` that "measures": it copies `<dir>/report.json` to `--json`,
    /// writes the SVG and cyclictest output, prints progress lines and
    /// exits with the code in `<dir>/exit-code`, as jitter does for the
    /// report's verdict. When `<dir>/partner` names another server's dir,
    /// it first waits (up to 30 s) for that server's jitter to be measuring
    /// too, and leaves `alone` behind if it never was.
    fn measuring_jitter(&self) {
        let d = self.dir.display();
        self.jitter(
            "\x20 echo ' boot.uname: pass'; echo ' PREEMPT_RT: yes'\n",
            &format!(
                "total=$1; json=; svg=; cyc=\n\
                 while [ $# -gt 0 ]; do\n\
                 \x20 case \"$1\" in\n\
                 \x20   --json) json=$2; shift ;;\n\
                 \x20   --svg) svg=$2; shift ;;\n\
                 \x20   --save-cyclictest) cyc=$2; shift ;;\n\
                 \x20 esac\n\
                 \x20 shift\n\
                 done\n\
                 if [ -e {d}/partner ]; then\n\
                 \x20 partner=$(cat {d}/partner); touch {d}/started; i=0\n\
                 \x20 while [ ! -e \"$partner/started\" ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done\n\
                 \x20 [ -e \"$partner/started\" ] || touch {d}/alone\n\
                 fi\n\
                 echo \"jitter: progress 1/$total s\" >&2\n\
                 echo \"jitter: progress $total/$total s, worst case 40 us\" >&2\n\
                 [ -n \"$json\" ] && cp {d}/report.json \"$json\"\n\
                 [ -n \"$svg\" ] && echo '<svg xmlns=\"http://www.w3.org/2000/svg\"><!-- stand-in plot --></svg>' > \"$svg\"\n\
                 [ -n \"$cyc\" ] && printf '# Histogram\\n000040 000001 000001\\n# Max Latencies: 00040 00040\\n# stand-in cyclictest\\n' > \"$cyc\"\n\
                 echo 'stand-in jitter: done'\n\
                 exit $(cat {d}/exit-code)\n"
            ),
        );
    }

    /// Sets the report (and exit code) the measuring stand-in returns.
    fn set_report(&self, report: &Value, exit: u8) {
        std::fs::write(
            self.dir.join("report.json"),
            serde_json::to_string_pretty(report).unwrap() + "\n",
        )
        .unwrap();
        std::fs::write(self.dir.join("exit-code"), format!("{exit}\n")).unwrap();
    }

    /// A `uname` that reports the committed kernel (`-r`, `-v`); with
    /// `swap_to`, the first call also replaces the server's host key by
    /// that key, so every later connection meets another key.
    fn uname_of_the_commit(&self, swap_to: Option<&Path>) {
        let d = self.dir.display();
        let swap = match swap_to {
            Some(key) => format!(
                "if [ ! -e {d}/swapped ]; then\n\
                 \x20 cp {k} {d}/hostkey.new && mv {d}/hostkey.new {d}/hostkey\n\
                 \x20 cp {k}.pub {d}/hostkey.pub.new && mv {d}/hostkey.pub.new {d}/hostkey.pub\n\
                 \x20 touch {d}/swapped\n\
                 fi\n",
                k = key.display()
            ),
            None => String::new(),
        };
        self.script(
            "uname",
            &format!(
                "#!/bin/sh\n\
                 {swap}\
                 case \"$*\" in\n\
                 \x20 -r) echo '{RELEASE}' ;;\n\
                 \x20 -v) echo '{RT_UTS}' ;;\n\
                 \x20 -rv|'-r -v') echo '{RELEASE} {RT_UTS}' ;;\n\
                 \x20 *) exec /bin/uname \"$@\" ;;\n\
                 esac\n"
            ),
        );
    }
}

impl Drop for Sshd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The first line a server sends on `port`, if it answers within a second.
fn banner(port: u16) -> Option<String> {
    let stream =
        TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_millis(500)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
    let mut line = String::new();
    BufReader::new(stream).read_line(&mut line).ok()?;
    Some(line)
}

/// A port nothing listens on.
fn closed_port() -> u16 {
    let port = free_port();
    assert!(TcpStream::connect(("127.0.0.1", port)).is_err());
    port
}

/// A qualification run's fixed parts: a proven commit, a signing key, and
/// an SSH client key.
struct Bench {
    dir: tempfile::TempDir,
    key: GpgKey,
    repo: PathBuf,
    commit: String,
    client_key: PathBuf,
    client_pub: String,
}

impl Bench {
    fn new() -> Bench {
        let dir = tempfile::Builder::new()
            .prefix("qualify")
            .tempdir_in("/tmp")
            .unwrap();
        let key = GpgKey::generate("qualifier");
        let (repo, commit) = proven_commit(dir.path(), Some(&key));
        let client_key = dir.path().join("client");
        ssh_keygen(&client_key);
        let client_pub = std::fs::read_to_string(dir.path().join("client.pub")).unwrap();
        Bench {
            dir,
            key,
            repo,
            commit,
            client_key,
            client_pub,
        }
    }

    /// An sshd that lets the client key in.
    fn sshd(&self, name: &str) -> Sshd {
        Sshd::start(&self.dir.path().join(name), &self.client_pub)
    }

    /// qualify's options for `ref_name`: `--repo --ref --gpg-key
    /// --gpg-homedir -i`.
    fn options<'a>(&'a self, ref_name: &'a str) -> [&'a str; 10] {
        [
            "--repo",
            path_str(&self.repo),
            "--ref",
            ref_name,
            "--gpg-key",
            &self.key.fingerprint,
            "--gpg-homedir",
            path_str(self.key.home.path()),
            "-i",
            path_str(&self.client_key),
        ]
    }

    /// `imgbuild [--json] qualify TARGETS… --repo --ref --gpg-key … -i …
    /// --duration 2 --budget 100 EXTRA…`.
    fn qualify(&self, json: bool, targets: &[&str], extra: &[&str]) -> Output {
        let mut args: Vec<&str> = Vec::new();
        if json {
            args.push("--json");
        }
        args.push("qualify");
        args.extend_from_slice(targets);
        args.extend_from_slice(&self.options(REF));
        args.extend_from_slice(&["--duration", "2", "--budget", "100"]);
        args.extend_from_slice(extra);
        imgbuild(&args)
    }

    fn records_dir(&self) -> PathBuf {
        self.repo.join("qualifications").join(&self.commit)
    }

    /// A known_hosts file `<dir>/<name>` pinning the host keys of `servers`.
    fn pin(&self, name: &str, servers: &[&Sshd]) -> PathBuf {
        let path = self.dir.path().join(name);
        let lines: String = servers
            .iter()
            .map(|sshd| sshd.known_hosts_line(&sshd.host_key_pub()))
            .collect();
        std::fs::write(&path, lines).unwrap();
        path
    }

    /// Every file under `<repo>/qualifications`.
    fn record_files(&self) -> Vec<PathBuf> {
        let dir = self.repo.join("qualifications");
        if dir.exists() {
            files_under(&dir)
        } else {
            Vec::new()
        }
    }
}

/// A [`Bench`] when running as root (sshd needs it), else `None` (skipped).
fn root_bench() -> Option<Bench> {
    (!needs_root()).then(Bench::new)
}

/// root's own known_hosts, which qualify must leave alone.
fn roots_known_hosts() -> Option<Vec<u8>> {
    std::fs::read("/root/.ssh/known_hosts").ok()
}

// ---------------------------------------------------------------------------
// Jitter reports and qualification records
// ---------------------------------------------------------------------------

/// A jitter report of the committed kernel (from the schema fixture), with
/// `verdict` and `worst` µs, measured for `duration` s against `budget`.
fn jitter_report(verdict: &str, worst: u64, budget: u64, duration: u64) -> Value {
    use rtreport::report::{Reason, ReasonCode, Report, Verdict};
    let fixture = repo_root().join("live-image/jitter/tests/fixtures/jitter-report-1.json");
    let mut report: Report = serde_json::from_str(&std::fs::read_to_string(fixture).unwrap()).unwrap();
    report.kernel.release = RELEASE.into();
    report.kernel.uts_version = RT_UTS.into();
    report.kernel.preempt_rt = true;
    report.kernel.evidence = rtcheck::evidence::check_running_kernel(RT_UTS, Some(RT_CONFIG));
    report.tuning.hypervisor = None;
    report.tuning.irqs_on_rt_cpus.clear();
    for governor in report.tuning.governors.values_mut() {
        *governor = Some("performance".into());
    }
    report.run.duration_s = duration;
    report.run.budget_us = budget;
    report.run.functional_only = false;
    for core in &mut report.cores {
        core.max_us = worst;
        core.overflows = 0;
        core.histogram.retain(|&(us, _)| us <= worst);
        core.p99_us = Some(core.p99_us.unwrap_or(worst).min(worst));
        core.p99_9_us = Some(core.p99_9_us.unwrap_or(worst).min(worst));
    }
    report.assessment.worst_us = worst;
    report.assessment.worst_cpu = Some(1);
    let (verdict, reasons) = match verdict {
        "PASS" => (Verdict::Pass, vec![]),
        "FAIL" => (Verdict::Fail, vec![]),
        "INVALID" => (
            Verdict::Invalid,
            vec![Reason {
                code: ReasonCode::GovernorNotPerformance,
                detail: "cpufreq governor is not performance: cpu1=powersave".into(),
            }],
        ),
        other => panic!("{other}"),
    };
    report.assessment.verdict = verdict;
    report.assessment.reasons = reasons;
    serde_json::to_value(&report).unwrap()
}

/// A qualification record (schema qualification/1) of `hw` for `commit`.
pub(crate) fn record(commit: &str, hw: &str, verdict: &str, worst: u64) -> Value {
    json!({
        "schema": "qualification/2",
        "commit": commit,
        "ref": REF,
        "kernel": {
            "release": RELEASE,
            "uts-version": RT_UTS,
            "bzimage-sha256": sha256_hex(&Kernel::Rt.image()),
        },
        "hardware": {
            "id": hw,
            "sys-vendor": "Acme",
            "product-name": format!("Rig {hw}"),
            "board-name": "B-1",
            "bios-version": "1.0.3",
            "cpu-model": "Test CPU @ 2.00GHz",
            "microcode": "0x2c",
            "cores": 2,
            "memory-kib": 4_028_416u64,
        },
        "target": {
            "address": "root@192.0.2.10:22",
            "host-key": {
                "algorithm": "ssh-ed25519",
                "fingerprint": format!("SHA256:host-key-of-{hw}"),
                "established": "pinned",
            },
        },
        "provenance": {
            "attestation": "none",
            "identity-source": "dmi-cpuinfo-meminfo-reported-by-target",
            "kernel-source": "uname-and-check-kernel-reported-by-target",
            "measurement-source": "jitter-report-from-target",
        },
        "verdict": verdict,
        "reasons": [],
        "worst-us": worst,
        "budget-us": 100,
        "duration-s": 300,
        "started": "2026-01-05T10:00:00Z",
        "finished": "2026-01-05T10:05:02Z",
        "operator-host": "bench-1",
        "imgbuild-version": env!("CARGO_PKG_VERSION"),
        "report": jitter_report(verdict, worst, 100, 300),
    })
}

fn gpg(home: &Path, args: &[&str]) -> Output {
    Command::new("gpg")
        .arg("--homedir")
        .arg(home)
        .args(["--batch", "--yes"])
        .args(args)
        .output()
        .unwrap()
}

/// Writes `<dir>/<name>.json` and, signed by `signer` in `home`, its
/// armored detached `.sig`. Returns the record's path.
pub(crate) fn write_record(dir: &Path, name: &str, record: &Value, home: &Path, signer: &str) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let path = dir.join(format!("{name}.json"));
    std::fs::write(&path, serde_json::to_string_pretty(record).unwrap() + "\n").unwrap();
    let sig = dir.join(format!("{name}.json.sig"));
    let out = gpg(
        home,
        &[
            "--local-user",
            signer,
            "--armor",
            "--detach-sign",
            "--output",
            path_str(&sig),
            path_str(&path),
        ],
    );
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        std::fs::read_to_string(&sig)
            .unwrap()
            .contains("BEGIN PGP SIGNATURE"),
        "not armored"
    );
    path
}

fn gpg_verifies(home: &Path, sig: &Path, data: &Path) -> Result<String, String> {
    let out = gpg(home, &["--verify", path_str(sig), path_str(data)]);
    if out.status.success() {
        Ok(stderr(&out))
    } else {
        Err(text(&out))
    }
}

/// `<path>.sig`.
pub(crate) fn sig_of(path: &Path) -> PathBuf {
    PathBuf::from(format!("{}.sig", path.display()))
}

/// Asserts that `<path>.sig` is a good signature of `path` in `home`.
#[track_caller]
fn assert_signed(home: &Path, path: &Path) {
    let verified = gpg_verifies(home, &sig_of(path), path).unwrap();
    assert!(verified.contains("Good signature"), "{verified}");
}

/// The `.json` files among `paths`.
fn json_files(paths: &[PathBuf]) -> Vec<&PathBuf> {
    paths
        .iter()
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect()
}

// ---------------------------------------------------------------------------
// qualify: what it must refuse or report without measuring
// ---------------------------------------------------------------------------

#[test]
fn four_bad_targets_at_once_each_get_their_own_row_and_nothing_is_measured() {
    let started = Instant::now();
    let Some(bench) = root_bench() else { return };
    let dir = bench.dir.path();

    let unreachable = format!("root@127.0.0.1:{}", closed_port());

    // The server holds another client key: the login is refused.
    let stranger = dir.join("stranger");
    ssh_keygen(&stranger);
    let wrong_key = Sshd::start(
        &dir.join("wrong-key"),
        &std::fs::read_to_string(dir.join("stranger.pub")).unwrap(),
    );
    wrong_key.jitter_that_must_not_measure();

    // No jitter anywhere on the session PATH.
    let no_jitter = bench.sshd("no-jitter");
    let probe = Command::new("ssh")
        .args(["-i", path_str(&bench.client_key)])
        .args(["-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no"])
        .args([
            "-o",
            "UserKnownHostsFile=/dev/null",
            "-o",
            "GlobalKnownHostsFile=/dev/null",
        ])
        .args([
            "-p",
            &no_jitter.port.to_string(),
            "root@127.0.0.1",
            "command -v jitter || echo NONE; echo PATH=$PATH",
        ])
        .output()
        .unwrap();
    let seen = stdout(&probe);
    assert!(
        seen.contains("NONE") && seen.contains(path_str(&no_jitter.bin())),
        "the fixture's session PATH is not what the test needs: {}",
        text(&probe)
    );

    // A jitter, but the machine runs this host's kernel, not the commit's.
    let other_kernel = bench.sshd("other-kernel");
    other_kernel.jitter_that_must_not_measure();

    let known_hosts_before = roots_known_hosts();
    let targets = [
        unreachable.clone(),
        wrong_key.target(),
        no_jitter.target(),
        other_kernel.target(),
    ];
    let targets: Vec<&str> = targets.iter().map(String::as_str).collect();
    let qualify_started = Instant::now();
    let out = bench.qualify(true, &targets, &[TOFU]);
    let took = qualify_started.elapsed();
    assert_exit(&out, 1);
    let doc = json_of(&out);
    assert_eq!(doc["ref"], REF, "{doc:#}");
    assert_eq!(doc["commit"], bench.commit.as_str(), "{doc:#}");
    assert_eq!(doc["targets"].as_array().unwrap().len(), 4, "{doc:#}");

    assert_error(row(&doc, &unreachable), "no SSH server answered");

    let r = row(&doc, &wrong_key.target());
    assert_error(r, "refused the login");
    // ssh-keyscan saw the server before the login was refused.
    assert_eq!(r["host-key"], wrong_key.fingerprint().as_str(), "{r:#}");
    assert_eq!(wrong_key.logins(), 0, "{}", wrong_key.log());

    let r = row(&doc, &no_jitter.target());
    assert_error(r, "jitter");
    assert!(
        !r["error"]
            .as_str()
            .unwrap_or_default()
            .contains("refused the login"),
        "{r:#}"
    );
    assert_eq!(r["host-key"], no_jitter.fingerprint().as_str(), "{r:#}");
    // (The fixture check above logged in once.)
    assert!(
        no_jitter.logins() >= 2,
        "qualify never logged in: {}",
        no_jitter.log()
    );

    assert_refused_for_kernel(row(&doc, &other_kernel.target()), &other_kernel);
    // No verdict for a target that was not measured.
    for r in doc["targets"].as_array().unwrap() {
        assert!(
            r.get("verdict").is_none_or(Value::is_null),
            "a verdict without a measurement: {r:#}"
        );
        assert!(r.get("record").is_none_or(Value::is_null), "{r:#}");
    }

    // Not even `jitter --check-kernel` ran on the wrong kernel; nothing measured.
    assert_eq!(other_kernel.jitter_calls(), Vec::<String>::new());
    assert!(!other_kernel.dir.join("measured").exists());
    assert_eq!(wrong_key.jitter_calls(), Vec::<String>::new());
    assert!(!wrong_key.dir.join("measured").exists());
    assert_eq!(
        bench.record_files(),
        Vec::<PathBuf>::new(),
        "records without a measurement"
    );
    // Host keys are printed as they are scanned.
    let err = stderr(&out);
    for sshd in [&wrong_key, &no_jitter, &other_kernel] {
        assert!(err.contains(&sshd.fingerprint()), "{}", text(&out));
    }
    assert_eq!(
        roots_known_hosts(),
        known_hosts_before,
        "qualify wrote to root's own known_hosts"
    );

    // The refused target alone: exit 3, with its host key as ssh-keygen sees it.
    let alone = bench.qualify(false, &[&other_kernel.target()], &[TOFU]);
    assert_exit(&alone, 3);
    let table = stdout(&alone);
    assert!(table.contains(&other_kernel.target()), "{}", text(&alone));
    assert!(table.to_lowercase().contains("refused"), "{}", text(&alone));
    assert!(
        stderr(&alone).contains(&fingerprint_of(&other_kernel.host_key_pub())),
        "{}",
        text(&alone)
    );
    assert_eq!(other_kernel.jitter_calls(), Vec::<String>::new());
    assert_eq!(bench.record_files(), Vec::<PathBuf>::new());
    eprintln!(
        "four bad targets: qualify took {:.1} s; whole test {:.1} s",
        took.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
}

#[test]
fn pinned_host_keys_are_checked_before_login() {
    let Some(bench) = root_bench() else { return };
    let dir = bench.dir.path();
    let sshd = bench.sshd("pinned");
    sshd.jitter_that_must_not_measure();
    let other = dir.join("other-hostkey");
    ssh_keygen(&other);

    // known_hosts holding another key for this very address.
    let wrong = dir.join("known_hosts.wrong");
    std::fs::write(&wrong, sshd.known_hosts_line(&other.with_extension("pub"))).unwrap();
    let out = bench.qualify(true, &[&sshd.target()], &["--known-hosts", path_str(&wrong)]);
    assert_exit(&out, 3);
    let doc = json_of(&out);
    let r = row(&doc, &sshd.target());
    assert_eq!(r["status"], "refused", "{r:#}");
    let error = r["error"].as_str().unwrap_or_default();
    assert!(
        error.contains(path_str(&wrong)) && error.contains("--known-hosts"),
        "{r:#}"
    );
    assert_eq!(sshd.logins(), 0, "logged in past a pin: {}", sshd.log());
    assert_eq!(sshd.jitter_calls(), Vec::<String>::new());

    // An empty pin file pins nothing.
    let empty = dir.join("known_hosts.empty");
    std::fs::write(&empty, "").unwrap();
    let out = bench.qualify(true, &[&sshd.target()], &["--known-hosts", path_str(&empty)]);
    assert_exit(&out, 3);
    assert_eq!(sshd.logins(), 0, "{}", sshd.log());

    // The right key: past the pin, logged in, refused for the kernel.
    let right = dir.join("known_hosts.right");
    std::fs::write(
        &right,
        sshd.known_hosts_line(&other.with_extension("pub")) + &sshd.known_hosts_line(&sshd.host_key_pub()),
    )
    .unwrap();
    let out = bench.qualify(true, &[&sshd.target()], &["--known-hosts", path_str(&right)]);
    assert_exit(&out, 3);
    assert_refused_for_kernel(row(&json_of(&out), &sshd.target()), &sshd);
    assert_eq!(sshd.jitter_calls(), Vec::<String>::new());
    assert_eq!(bench.record_files(), Vec::<PathBuf>::new());

    // The same pin, hashed as Debian's ssh writes known_hosts (HashKnownHosts).
    let hashed = dir.join("known_hosts.hashed");
    std::fs::copy(&right, &hashed).unwrap();
    run(Command::new("ssh-keygen").arg("-H").arg("-f").arg(&hashed));
    assert!(!std::fs::read_to_string(&hashed).unwrap().contains("127.0.0.1"));
    let out = bench.qualify(true, &[&sshd.target()], &["--known-hosts", path_str(&hashed)]);
    assert_exit(&out, 3);
    assert_eq!(row(&json_of(&out), &sshd.target())["status"], "refused");

    // --port is the default port; a target's own :PORT overrides it.
    let port = sshd.port.to_string();
    let logins = sshd.logins();
    let right = path_str(&right);
    let out = bench.qualify(
        true,
        &["root@127.0.0.1"],
        &["--known-hosts", right, "--port", &port],
    );
    assert_exit(&out, 3);
    assert!(sshd.logins() > logins, "--port was not used: {}", text(&out));
    let logins = sshd.logins();
    let closed = closed_port().to_string();
    let out = bench.qualify(
        true,
        &[&sshd.target()],
        &["--known-hosts", right, "--port", &closed],
    );
    assert_exit(&out, 3);
    assert!(
        sshd.logins() > logins,
        "--port overrode the target's own port: {}",
        text(&out)
    );
    let out = bench.qualify(
        true,
        &["root@127.0.0.1"],
        &["--known-hosts", right, "--port", &closed],
    );
    assert_exit(&out, 1);
    assert!(stdout(&out).contains("no SSH server answered"), "{}", text(&out));
}

#[test]
fn a_host_key_that_changes_mid_run_aborts_the_target() {
    let Some(bench) = root_bench() else { return };
    let dir = bench.dir.path();
    let sshd = bench.sshd("swapping");
    // The first `uname` (during the probe) gives the server a new host key:
    // the next connection meets it. The kernel matches, so qualify would
    // go on to run jitter over a new connection.
    let new_key = dir.join("new-hostkey");
    ssh_keygen(&new_key);
    let before = sshd.fingerprint();
    sshd.uname_of_the_commit(Some(&new_key));
    sshd.jitter_that_must_not_measure();
    // A second, honest target in the same run is unaffected by the first.
    let honest = bench.sshd("honest");
    honest.jitter_that_must_not_measure();

    let pins = bench.pin("known_hosts", &[&sshd, &honest]);
    let out = bench.qualify(
        true,
        &[&sshd.target(), &honest.target()],
        &["--known-hosts", path_str(&pins)],
    );
    assert!(
        sshd.dir.join("swapped").exists(),
        "the probe never ran `uname` from the session PATH: {}",
        text(&out)
    );
    assert_exit(&out, 1);
    let doc = json_of(&out);
    let r = row(&doc, &sshd.target());
    assert_eq!(r["status"], "error", "{r:#}");
    let error = r["error"].as_str().unwrap_or_default().to_lowercase();
    assert!(error.contains("host key") && error.contains("chang"), "{r:#}");
    // The key recorded is the one scanned first, not the new one.
    assert_eq!(r["host-key"], before.as_str(), "{r:#}");
    assert_ne!(before, fingerprint_of(&new_key.with_extension("pub")));
    assert_eq!(
        sshd.jitter_calls(),
        Vec::<String>::new(),
        "ran jitter on a host with a new key"
    );
    assert!(!sshd.dir.join("measured").exists());
    assert_eq!(bench.record_files(), Vec::<PathBuf>::new());
    // The other target got its own row: refused for its kernel.
    assert_eq!(row(&doc, &honest.target())["status"], "refused", "{doc:#}");
}

#[test]
fn hostile_and_duplicate_targets_exit_2_before_anything_runs() {
    let bench = Bench::new();
    let repo = &bench.repo;
    let marker = bench.dir.path().join("MARKER");
    // A real server beside each bad target: it must not even be scanned.
    let sshd = imgbuild::tool::running_as_root().then(|| bench.sshd("bystander"));
    let bystander = sshd
        .as_ref()
        .map_or_else(|| format!("root@127.0.0.1:{}", closed_port()), Sshd::target);
    let m = marker.display();
    let hostile = [
        format!("root@-oProxyCommand=touch {m}"),
        format!("root@-oProxyCommand=touch${{IFS}}{m}"),
        format!("-oProxyCommand=touch {m}@127.0.0.1"),
        format!("root@127.0.0.1 -oProxyCommand=touch {m}"),
        "root@127.0.0.1:99999".to_string(),
        "root@127.0.0.1:0".to_string(),
        "root@127.0.0.1:22x".to_string(),
        "ro ot@127.0.0.1".to_string(),
        "root@host$(id)".to_string(),
        format!("root@host$(touch {m})"),
        "root@host;rm".to_string(),
        "root@host`id`".to_string(),
        "root@-host".to_string(),
        "root@host..example".to_string(),
        "root@[::1".to_string(),
        "root@".to_string(),
        "@127.0.0.1".to_string(),
        "127.0.0.1".to_string(),
        "root@127.0.0.1\n".to_string(),
    ];
    // Options first and the targets after `--`, so that the targets reach
    // qualify's own checks (not the option parser's) even when they look
    // like options.
    let qualify = |targets: &[&str]| {
        let mut args = vec!["qualify", TOFU];
        args.extend_from_slice(&bench.options(REF));
        args.push("--");
        args.extend_from_slice(targets);
        imgbuild(&args)
    };
    for target in &hostile {
        let out = qualify(&[&bystander, target]);
        assert_exit(&out, 2);
        let err = stderr(&out);
        assert!(
            err.contains(target.as_str()) || err.contains(&format!("{target:?}")),
            "the error does not name {target:?}: {}",
            text(&out)
        );
        assert!(!marker.exists(), "{target:?} ran a command");
    }
    // As typed, without `--`: targets before the options.
    for target in [
        format!("root@-oProxyCommand=touch {m}"),
        format!("-oProxyCommand=touch {m}@127.0.0.1"),
        "root@127.0.0.1:99999".to_string(),
    ] {
        let mut args = vec!["qualify", &target, &bystander, TOFU];
        args.extend_from_slice(&bench.options(REF));
        let out = imgbuild(&args);
        assert_exit(&out, 2);
        assert!(!marker.exists(), "{target:?} ran a command");
    }
    // The same target twice.
    let out = qualify(&[&bystander, &bystander]);
    assert_exit(&out, 2);
    assert!(stderr(&out).contains(&bystander), "{}", text(&out));
    if let Some(sshd) = &sshd {
        assert_eq!(
            sshd.new_connections(),
            0,
            "a refused command line contacted a target: {}",
            sshd.log()
        );
    }
    assert!(!repo.join("qualifications").exists());
    // Well-formed targets are not usage errors: IPv6 and a name, on closed ports.
    let port = closed_port();
    let v6 = format!("root@[::1]:{port}");
    let named = format!("root@localhost:{port}");
    let out = qualify(&[&v6, &named]);
    assert_exit(&out, 1);
    assert!(stdout(&out).contains(&v6), "{}", text(&out));
}

#[test]
fn an_out_dir_that_cannot_be_opened_stops_qualify_before_it_measures() {
    let Some(bench) = root_bench() else { return };
    let sshd = bench.sshd("out-is-a-file");
    sshd.uname_of_the_commit(None);
    sshd.measuring_jitter();
    sshd.set_report(&jitter_report("PASS", 40, 100, 2), 0);
    let pins = bench.pin("pins", &[&sshd]);
    let not_a_dir = bench.dir.path().join("out");
    std::fs::write(&not_a_dir, "a file").unwrap();
    let options = ["--out", path_str(&not_a_dir), "--known-hosts", path_str(&pins)];
    let out = bench.qualify(false, &[&sshd.target()], &options);
    assert_exit(&out, 1);
    assert!(stderr(&out).contains("--out"), "{}", text(&out));
    assert_eq!(sshd.logins(), 0, "logged in: {}", sshd.log());
    assert_eq!(sshd.jitter_calls(), Vec::<String>::new());
    assert_eq!(bench.record_files(), Vec::<PathBuf>::new());
}

#[test]
fn an_unknown_host_key_is_refused_by_default_and_nothing_is_written() {
    let Some(bench) = root_bench() else { return };
    let dir = bench.dir.path();
    // A target that would PASS if it got that far.
    let sshd = bench.sshd("unknown");
    sshd.uname_of_the_commit(None);
    sshd.measuring_jitter();
    sshd.set_report(&jitter_report("PASS", 40, 100, 2), 0);
    let target = sshd.target();
    let out_dir = dir.join("out");
    let qualify = |extra: &[&str]| {
        let mut options = vec!["--out", path_str(&out_dir)];
        options.extend_from_slice(extra);
        bench.qualify(true, &[&target], &options)
    };
    let nothing_written = |out: &Output, case: &str| {
        assert_eq!(sshd.logins(), 0, "{case}: logged in: {}", sshd.log());
        assert_eq!(sshd.jitter_calls(), Vec::<String>::new(), "{case}");
        assert_eq!(
            bench.record_files(),
            Vec::<PathBuf>::new(),
            "{case}: {}",
            text(out)
        );
        assert!(!out_dir.exists(), "{case}: --out was written: {}", text(out));
    };

    // No flag: no key is trusted, so nothing is even contacted (usage error).
    let out = qualify(&[]);
    assert_exit(&out, 2);
    let err = stderr(&out);
    assert!(
        err.contains("--known-hosts") && err.contains(TOFU),
        "{}",
        text(&out)
    );
    assert_eq!(sshd.new_connections(), 0, "{}", sshd.log());
    nothing_written(&out, "no flag");

    // A known_hosts that holds this very key, but for another machine.
    let key = std::fs::read_to_string(sshd.host_key_pub()).unwrap();
    let words: Vec<&str> = key.split_whitespace().take(2).collect();
    let elsewhere = dir.join("known_hosts.elsewhere");
    std::fs::write(&elsewhere, format!("[192.0.2.7]:22 {}\n", words.join(" "))).unwrap();
    let out = qualify(&["--known-hosts", path_str(&elsewhere)]);
    assert_exit(&out, 3);
    let r = row(&json_of(&out), &target).clone();
    assert_eq!(r["status"], "refused", "{r:#}");
    let error = r["error"].as_str().unwrap_or_default();
    let fingerprint = sshd.fingerprint();
    for needle in [path_str(&elsewhere), fingerprint.as_str(), TOFU] {
        assert!(error.contains(needle), "the error does not say {needle}: {r:#}");
    }
    assert!(r.get("record").is_none_or(Value::is_null), "{r:#}");
    nothing_written(&out, "unknown key");

    // A --known-hosts that does not read, or both flags: usage errors.
    let connections = sshd.connections();
    let missing = dir.join("known_hosts.missing");
    let out = qualify(&["--known-hosts", path_str(&missing)]);
    assert_exit(&out, 2);
    assert!(stderr(&out).contains(path_str(&missing)), "{}", text(&out));
    let out = qualify(&["--known-hosts", path_str(&elsewhere), TOFU]);
    assert_exit(&out, 2);
    assert_eq!(sshd.connections(), connections, "{}", sshd.log());
    nothing_written(&out, "usage errors");

    // The control: pinned, the same target is measured and recorded.
    let pins = bench.pin("known_hosts.right", &[&sshd]);
    let out = qualify(&["--known-hosts", path_str(&pins)]);
    assert_exit(&out, 0);
    assert_eq!(json_files(&bench.record_files()).len(), 1, "{}", text(&out));
}

#[test]
fn with_trust_on_first_use_the_record_says_so_and_promote_needs_allow_tofu() {
    let Some(bench) = root_bench() else { return };
    let sshd = bench.sshd("tofu");
    sshd.uname_of_the_commit(None);
    sshd.measuring_jitter();
    sshd.set_report(&jitter_report("PASS", 40, 100, 2), 0);
    let out = bench.qualify(true, &[&sshd.target()], &[TOFU]);
    assert_exit(&out, 0);
    let r = row(&json_of(&out), &sshd.target()).clone();
    assert_measured(&r, &sshd, "PASS");
    assert_eq!(r["host-key-established"], "trust-on-first-use", "{r:#}");
    assert!(stderr(&out).contains("trusted on first use"), "{}", text(&out));

    let path = PathBuf::from(r["record"].as_str().unwrap());
    assert_signed(bench.key.home.path(), &path);
    let rec: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    assert_eq!(rec["schema"], "qualification/2", "{rec:#}");
    let host_key = &rec["target"]["host-key"];
    assert_eq!(host_key["established"], "trust-on-first-use", "{rec:#}");
    assert_eq!(host_key["fingerprint"], sshd.fingerprint().as_str(), "{rec:#}");
    // Identity, kernel and figures: the target's own word, and said to be.
    let provenance = &rec["provenance"];
    assert_eq!(provenance["attestation"], "none", "{rec:#}");
    assert!(
        rec.get("attestation").is_none(),
        "a target without a TPM has no attestation: {rec:#}"
    );
    for (field, source) in [
        ("identity-source", "dmi-cpuinfo-meminfo-reported-by-target"),
        ("kernel-source", "uname-and-check-kernel-reported-by-target"),
        ("measurement-source", "jitter-report-from-target"),
    ] {
        assert_eq!(provenance[field], source, "{rec:#}");
    }
    let out = imgbuild(&["inspect", "--repo", path_str(&bench.repo), REF]);
    assert!(
        stdout(&out).contains("host key trust-on-first-use"),
        "{}",
        text(&out)
    );

    // One platform asked for: the TOFU PASS counts only with --allow-tofu.
    let one = ["--min-duration", "2", "--min-platforms", "1", "--allow-tofu"];
    let out = promote(&bench.repo, &bench.key, &one[..4]);
    assert_exit(&out, 3);
    assert!(stdout(&out).contains("--allow-tofu"), "{}", text(&out));
    assert_eq!(resolve(&bench.repo, STABLE), None);
    let out = promote(&bench.repo, &bench.key, &one);
    assert_exit(&out, 0);
    assert_eq!(
        resolve(&bench.repo, STABLE).as_deref(),
        Some(bench.commit.as_str())
    );
}

#[test]
fn an_unproven_ref_is_refused_before_any_target_is_contacted() {
    let Some(bench) = root_bench() else { return };
    let sshd = bench.sshd("never");
    sshd.uname_of_the_commit(None);
    sshd.measuring_jitter();
    sshd.set_report(&jitter_report("PASS", 40, 100, 2), 0);
    let bad = unproven_commit(bench.dir.path(), &bench.repo, "emberrtos/x86_64/other/rt");
    let target = sshd.target();
    let mut args = vec!["--json", "qualify", &target, TOFU];
    args.extend_from_slice(&bench.options("emberrtos/x86_64/other/rt"));
    let out = imgbuild(&args);
    assert_exit(&out, 3);
    assert!(stderr(&out).contains("PREEMPT_RT"), "{}", text(&out));
    assert_eq!(sshd.new_connections(), 0, "{}", sshd.log());
    assert!(!bench.repo.join("qualifications").join(&bad).exists());
    // A ref that does not exist is no proof either.
    let mut args = vec!["qualify", &target, TOFU];
    args.extend_from_slice(&bench.options("emberrtos/x86_64/nothing/rt"));
    let out = imgbuild(&args);
    assert_ne!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(sshd.new_connections(), 0, "{}", sshd.log());
    assert_eq!(bench.record_files(), Vec::<PathBuf>::new());
}

// ---------------------------------------------------------------------------
// qualify: a measured target, its signed record, and promote over it
// ---------------------------------------------------------------------------

#[test]
fn a_measured_target_gets_a_signed_record_that_promote_accepts() {
    let started = Instant::now();
    let Some(bench) = root_bench() else { return };
    let dir = bench.dir.path();
    let sshd = bench.sshd("rig");
    sshd.uname_of_the_commit(None);
    sshd.measuring_jitter();
    let out_dir = dir.join("out");
    let target = sshd.target();
    let pins = bench.pin("known_hosts", &[&sshd]);
    let qualify = |report: &Value, exit: u8| {
        sshd.set_report(report, exit);
        let options = ["--out", path_str(&out_dir), "--known-hosts", path_str(&pins)];
        bench.qualify(true, &[&target], &options)
    };

    // FAIL: worst case over budget. A record is written (and signed).
    let out = qualify(&jitter_report("FAIL", 250, 100, 2), 3);
    assert_exit(&out, 3);
    let r = row(&json_of(&out), &target).clone();
    assert_measured(&r, &sshd, "FAIL");
    assert_eq!(r["worst-us"], 250, "{r:#}");
    let fail_record = PathBuf::from(r["record"].as_str().unwrap());
    assert!(fail_record.is_absolute() && fail_record.is_file(), "{r:#}");

    // promote refuses on a FAIL alone.
    let out = promote(&bench.repo, &bench.key, &["--min-duration", "2"]);
    assert_exit(&out, 3);
    let hw = r["hardware-id"].as_str().unwrap().to_string();
    assert!(
        stdout(&out).contains(&hw) && stdout(&out).contains("FAIL"),
        "{}",
        text(&out)
    );
    assert_eq!(resolve(&bench.repo, STABLE), None);

    // INVALID: exit 4.
    let out = qualify(&jitter_report("INVALID", 30, 100, 2), 4);
    assert_exit(&out, 4);
    let r = row(&json_of(&out), &target).clone();
    assert_eq!(r["verdict"], "INVALID", "{r:#}");

    // PASS: exit 0.
    let qualify_started = Instant::now();
    let out = qualify(&jitter_report("PASS", 40, 100, 2), 0);
    let took = qualify_started.elapsed();
    assert_exit(&out, 0);
    let doc = json_of(&out);
    assert_eq!(doc["commit"], bench.commit.as_str());
    let r = row(&doc, &target).clone();
    assert_measured(&r, &sshd, "PASS");
    assert!(r.get("error").is_none_or(Value::is_null), "{r:#}");
    assert_eq!(r["worst-us"], 40, "{r:#}");
    assert_eq!(r["budget-us"], 100, "{r:#}");
    assert_eq!(
        r["hardware-id"],
        hw.as_str(),
        "the same machine, another id: {r:#}"
    );
    assert!(hw.starts_with("hw-"), "{r:#}");
    assert!(r["platform"].is_string(), "{r:#}");

    // jitter ran: --check-kernel first, then the measurement as specified.
    // (Three runs so far, two calls each.)
    let calls = sshd.jitter_calls();
    assert_eq!(calls.len(), 6, "{calls:?}");
    assert_eq!(calls[4], "--check-kernel", "{calls:?}");
    let words: Vec<&str> = calls[5].split_whitespace().collect();
    assert_eq!(words.first(), Some(&"2"), "{calls:?}");
    assert!(words.windows(2).any(|w| w == ["--budget", "100"]), "{calls:?}");
    for flag in ["--progress", "--json", "--svg", "--save-cyclictest"] {
        assert!(words.contains(&flag), "{flag} missing: {calls:?}");
    }

    // The record: where it says, signed, and what it says.
    let path = PathBuf::from(r["record"].as_str().unwrap());
    assert!(path.is_absolute(), "{r:#}");
    assert_eq!(
        path.parent().unwrap().canonicalize().unwrap(),
        bench.records_dir().canonicalize().unwrap()
    );
    assert_eq!(path.extension().unwrap(), "json");
    assert_signed(bench.key.home.path(), &path);
    let records: Vec<PathBuf> = std::fs::read_dir(bench.records_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(
        json_files(&records).len(),
        3,
        "three runs, three records (none overwritten): {records:?}"
    );
    assert_eq!(records.len(), 6, "{records:?}");
    for json in json_files(&records) {
        assert_signed(bench.key.home.path(), json);
    }

    let rec: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let keys: std::collections::BTreeSet<&str> =
        rec.as_object().unwrap().keys().map(String::as_str).collect();
    let spec = record(&bench.commit, &hw, "PASS", 40);
    let expected: std::collections::BTreeSet<&str> =
        spec.as_object().unwrap().keys().map(String::as_str).collect();
    assert_eq!(keys, expected, "{rec:#}");
    assert_eq!(rec["schema"], "qualification/2");
    assert_eq!(rec["commit"], bench.commit.as_str());
    assert_eq!(rec["ref"], REF);
    assert_eq!(rec["kernel"]["release"], RELEASE);
    assert_eq!(rec["kernel"]["uts-version"], RT_UTS);
    assert_eq!(
        rec["kernel"]["bzimage-sha256"],
        sha256_hex(&Kernel::Rt.image()).as_str()
    );
    assert_eq!(rec["hardware"]["id"], hw.as_str());
    for field in [
        "sys-vendor",
        "product-name",
        "board-name",
        "bios-version",
        "cpu-model",
        "microcode",
        "cores",
        "memory-kib",
    ] {
        assert!(rec["hardware"].get(field).is_some(), "hardware.{field}: {rec:#}");
    }
    let cpus = std::fs::read_to_string("/proc/cpuinfo")
        .unwrap()
        .lines()
        .filter(|l| l.starts_with("processor"))
        .count();
    let cores = rec["hardware"]["cores"].as_u64().unwrap_or(0);
    assert!(cores >= 1 && cores as usize <= cpus, "{rec:#}");
    assert!(rec["hardware"]["memory-kib"].as_u64().unwrap_or(0) > 0, "{rec:#}");
    assert!(
        rec["target"]["address"]
            .as_str()
            .unwrap_or_default()
            .contains("127.0.0.1"),
        "{rec:#}"
    );
    assert_eq!(
        rec["target"]["host-key"]["fingerprint"],
        sshd.fingerprint().as_str()
    );
    assert_eq!(rec["target"]["host-key"]["algorithm"], "ssh-ed25519", "{rec:#}");
    // How each fact was established: the key pinned, the rest the target's word.
    assert_eq!(rec["target"]["host-key"]["established"], "pinned", "{rec:#}");
    assert_eq!(r["host-key-established"], "pinned", "{r:#}");
    assert_eq!(rec["provenance"], spec["provenance"], "{rec:#}");
    assert_eq!(rec["verdict"], "PASS");
    assert_eq!(rec["worst-us"], 40);
    assert_eq!(rec["budget-us"], 100);
    assert_eq!(rec["duration-s"], 2);
    assert!(
        rec["started"].is_string() && rec["finished"].is_string(),
        "{rec:#}"
    );
    assert_eq!(rec["imgbuild-version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(
        rec["report"],
        jitter_report("PASS", 40, 100, 2),
        "the report is not jitter's"
    );

    // What jitter wrote was fetched into --out.
    let fetched = files_under(&out_dir);
    let has = |needle: &str| {
        fetched
            .iter()
            .any(|f| std::fs::read_to_string(f).unwrap_or_default().contains(needle))
    };
    assert!(
        has("# stand-in cyclictest"),
        "cyclictest.txt not fetched: {fetched:?}"
    );
    assert!(has("stand-in plot"), "plot.svg not fetched: {fetched:?}");

    // A 2 s PASS is not a qualification by default (--min-duration 300).
    let out = promote(&bench.repo, &bench.key, &[]);
    assert_exit(&out, 3);
    assert!(stdout(&out).contains("--min-duration 300"), "{}", text(&out));
    assert_eq!(resolve(&bench.repo, STABLE), None);

    // One platform is not enough by default (--min-platforms 2).
    let out = promote(&bench.repo, &bench.key, &["--min-duration", "2"]);
    assert_exit(&out, 3);
    assert!(stderr(&out).contains("at least 2 needed"), "{}", text(&out));
    assert_eq!(resolve(&bench.repo, STABLE), None);

    // promote: the pinned PASS counts for one platform, the stable ref moves.
    let out = promote(
        &bench.repo,
        &bench.key,
        &["--min-duration", "2", "--min-platforms", "1"],
    );
    assert_exit(&out, 0);
    assert_eq!(
        resolve(&bench.repo, STABLE).as_deref(),
        Some(bench.commit.as_str())
    );
    // Tagged signed by the same key already: not signed twice.
    let signatures = ost::read_commit(&ost::open(&bench.repo).unwrap(), &bench.commit)
        .unwrap()
        .detached_metadata
        .get("ostree.gpgsigs")
        .and_then(|v| v.as_array())
        .map_or(0, Vec::len);
    assert_eq!(signatures, 1);
    eprintln!(
        "measured target: a PASS qualify run took {:.1} s; whole test {:.1} s",
        took.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
}

#[test]
fn targets_are_measured_at_the_same_time_and_one_failing_stops_none() {
    let Some(bench) = root_bench() else { return };
    let a = bench.sshd("rig-a");
    let b = bench.sshd("rig-b");
    for (me, partner) in [(&a, &b), (&b, &a)] {
        me.uname_of_the_commit(None);
        me.measuring_jitter();
        me.set_report(&jitter_report("PASS", 40, 100, 2), 0);
        std::fs::write(me.dir.join("partner"), partner.dir.display().to_string()).unwrap();
    }
    let unreachable = format!("root@127.0.0.1:{}", closed_port());
    let started = Instant::now();
    let pins = bench.pin("known_hosts", &[&a, &b]);
    let out = bench.qualify(
        true,
        &[&a.target(), &unreachable, &b.target()],
        &["--known-hosts", path_str(&pins)],
    );
    let took = started.elapsed();
    assert_exit(&out, 1);
    for sshd in [&a, &b] {
        assert!(
            !sshd.dir.join("alone").exists(),
            "{} was measured while the other target was not (not in parallel): {}",
            sshd.target(),
            text(&out)
        );
    }
    let doc = json_of(&out);
    assert_eq!(row(&doc, &unreachable)["status"], "error", "{doc:#}");
    let mut records = Vec::new();
    for sshd in [&a, &b] {
        let r = row(&doc, &sshd.target());
        assert_measured(r, sshd, "PASS");
        records.push(PathBuf::from(r["record"].as_str().unwrap()));
    }
    assert_ne!(records[0], records[1], "two targets, one record");
    for path in &records {
        assert_signed(bench.key.home.path(), path);
    }
    assert_eq!(bench.record_files().len(), 4, "{:?}", bench.record_files());
    eprintln!(
        "two measured targets and an unreachable one: {:.1} s",
        took.as_secs_f64()
    );
}

// ---------------------------------------------------------------------------
// promote
// ---------------------------------------------------------------------------

/// A scratch dir, a signing key, and a proven commit on [`REF`] tagged
/// unsigned (promote signs it itself): (dir, key, repo, commit).
fn promote_bench() -> (tempfile::TempDir, GpgKey, PathBuf, String) {
    let dir = tempfile::Builder::new()
        .prefix("promote")
        .tempdir_in("/tmp")
        .unwrap();
    let key = GpgKey::generate("qualifier");
    let (repo, commit) = proven_commit(dir.path(), None);
    (dir, key, repo, commit)
}

/// [`record`] of `hw`, PASS, measured through a host key `established`
/// (`None`: a `qualification/1` record, which does not say).
fn pass_through(commit: &str, hw: &str, established: Option<&str>) -> Value {
    let mut rec = record(commit, hw, "PASS", 40);
    match established {
        Some(how) => rec["target"]["host-key"]["established"] = how.into(),
        None => {
            rec["schema"] = "qualification/1".into();
            rec["target"]["host-key"]
                .as_object_mut()
                .unwrap()
                .remove("established");
            rec.as_object_mut().unwrap().remove("provenance");
        }
    }
    rec
}

/// Promote with `--allow-unattested`: these records come from stand-in
/// targets without a TPM.
fn promote(repo: &Path, key: &GpgKey, extra: &[&str]) -> Output {
    promote_to(repo, key, STABLE, extra)
}

fn promote_to(repo: &Path, key: &GpgKey, to: &str, extra: &[&str]) -> Output {
    let mut args = vec!["--allow-unattested"];
    args.extend_from_slice(extra);
    promote_strictly(repo, key, to, &args)
}

/// Promote as an operator does by default: only attested records count.
fn promote_strictly(repo: &Path, key: &GpgKey, to: &str, extra: &[&str]) -> Output {
    let mut args = vec![
        "promote",
        "--repo",
        path_str(repo),
        "--from",
        REF,
        "--to",
        to,
        "--gpg-key",
        &key.fingerprint,
        "--gpg-homedir",
        path_str(key.home.path()),
    ];
    args.extend_from_slice(extra);
    imgbuild(&args)
}

#[test]
fn promote_counts_only_signed_passing_records_of_this_commit() {
    let started = Instant::now();
    let (dir, key, repo, commit) = promote_bench();
    let other_fpr = key.add_key("intruder");
    assert!(!repo.join("summary.sig").exists());
    let records = repo.join("qualifications").join(&commit);
    let home = key.home.path();
    let me = key.fingerprint.as_str();
    let clear = || {
        let _ = std::fs::remove_dir_all(&records);
    };

    let refused = |out: &Output, case: &str| {
        assert_exit(out, 3);
        assert!(
            stderr(out).contains("refused by promote"),
            "{case}: {}",
            text(out)
        );
        assert_eq!(resolve(&repo, STABLE), None, "{case}: the ref moved");
        assert!(
            !repo.join("promotions").exists() || files_under(&repo.join("promotions")).is_empty(),
            "{case}: a promotion record was written"
        );
    };
    let table_names = |out: &Output, case: &str, words: &[&str]| {
        let table = stdout(out);
        for header in ["PLATFORM", "NAME", "VERDICT", "WORST-US", "BUDGET-US", "WHY"] {
            assert!(
                table.contains(header),
                "{case}: no {header} column: {}",
                text(out)
            );
        }
        for word in words {
            assert!(
                table.contains(word),
                "{case}: the table does not say {word:?}: {}",
                text(out)
            );
        }
    };

    // promote with `extra`: refused, its table saying `words`.
    let refused_saying = |extra: &[&str], case: &str, words: &[&str]| {
        let out = promote(&repo, &key, extra);
        refused(&out, case);
        table_names(&out, case, words);
        out
    };
    let signed =
        |name: &str, record: &Value, signer: &str| write_record(&records, name, record, home, signer);

    // No record at all.
    let out = promote(&repo, &key, &[]);
    refused(&out, "no record");

    // A FAIL record.
    signed("hw-a-fail", &record(&commit, "hw-a", "FAIL", 250), me);
    refused_saying(&[], "FAIL", &["hw-a", "Rig hw-a", "FAIL"]);
    clear();

    // An INVALID record.
    signed("hw-a-invalid", &record(&commit, "hw-a", "INVALID", 30), me);
    refused_saying(&[], "INVALID", &["hw-a", "INVALID"]);
    clear();

    // A PASS of another commit, filed under this one.
    signed("hw-a-elsewhere", &record(&"e".repeat(64), "hw-a", "PASS", 40), me);
    refused_saying(&[], "another commit", &["hw-a", "another commit"]);
    clear();

    // A PASS edited after it was signed.
    let path = signed("hw-a-tampered", &record(&commit, "hw-a", "FAIL", 250), me);
    let edited = std::fs::read_to_string(&path)
        .unwrap()
        .replace("\"verdict\": \"FAIL\"", "\"verdict\": \"PASS\"")
        .replace("\"worst-us\": 250", "\"worst-us\": 40");
    assert!(edited.contains("\"verdict\": \"PASS\""));
    std::fs::write(&path, edited).unwrap();
    refused_saying(&[], "tampered", &["hw-a", "Rig hw-a", "bad signature"]);
    clear();

    // A PASS without any signature.
    std::fs::create_dir_all(&records).unwrap();
    std::fs::write(
        records.join("hw-a-unsigned.json"),
        serde_json::to_string_pretty(&record(&commit, "hw-a", "PASS", 40)).unwrap(),
    )
    .unwrap();
    refused_saying(&[], "unsigned", &["hw-a", "Rig hw-a"]);
    clear();

    // A PASS signed by the other key in the same keyring.
    let intruder = signed("hw-a-intruder", &record(&commit, "hw-a", "PASS", 40), &other_fpr);
    assert!(gpg_verifies(home, &sig_of(&intruder), &intruder).is_ok());
    let out = refused_saying(&[], "signed by another key", &["hw-a", "Rig hw-a"]);
    let why = stdout(&out).to_lowercase();
    assert!(
        why.contains("signature") || why.contains("signed"),
        "{}",
        text(&out)
    );
    clear();

    // One good PASS (hw-a), amid every bad kind.
    signed("hw-a-pass", &record(&commit, "hw-a", "PASS", 40), me);
    signed("hw-b-fail", &record(&commit, "hw-b", "FAIL", 250), me);
    signed("hw-c-elsewhere", &record(&"e".repeat(64), "hw-c", "PASS", 40), me);
    signed("hw-d-intruder", &record(&commit, "hw-d", "PASS", 40), &other_fpr);
    let tampered = signed("hw-e-tampered", &record(&commit, "hw-e", "PASS", 40), me);
    let bytes = std::fs::read_to_string(&tampered)
        .unwrap()
        .replace("\"worst-us\": 40", "\"worst-us\": 41");
    std::fs::write(&tampered, bytes).unwrap();

    // Two platforms asked for, one has a PASS.
    refused_saying(
        &["--min-platforms", "2"],
        "--min-platforms 2",
        &[
            "hw-a",
            "Rig hw-a",
            "hw-b",
            "FAIL",
            "hw-c",
            "another commit",
            "hw-d",
            "hw-e",
            "bad signature",
        ],
    );

    // A required platform without a record.
    refused_saying(
        &["--require", "hw-other"],
        "--require hw-other",
        &["hw-other", "missing"],
    );
    // A required platform whose only record fails.
    refused_saying(
        &["--require", "hw-a", "--require", "hw-b"],
        "--require hw-b",
        &["hw-b", "FAIL"],
    );

    // Usage errors.
    for to in [
        "a..b",
        "emberrtos/x86_64/rt stable",
        "/rt-stable",
        "rt-stable/",
        "rt~1",
        "",
    ] {
        let out = promote_to(&repo, &key, to, &[]);
        assert_eq!(
            out.status.code(),
            Some(2),
            "--to {to:?} is not a valid ref name (`..` as in git's check-ref-format), \
             and a PASS was there to promote: {}",
            text(&out)
        );
        assert!(
            to.is_empty() || !repo.join("refs/heads").join(to.trim_start_matches('/')).exists(),
            "a ref {to:?} was made"
        );
    }
    let out = promote(&repo, &key, &["--min-platforms", "0"]);
    assert_exit(&out, 2);
    assert_eq!(resolve(&repo, STABLE), None);

    // An unproven commit is refused whatever its records say.
    let unproven = unproven_commit(dir.path(), &repo, "emberrtos/x86_64/forced/rt");
    write_record(
        &repo.join("qualifications").join(&unproven),
        "hw-a-pass",
        &record(&unproven, "hw-a", "PASS", 40),
        home,
        me,
    );
    let args = [
        "promote",
        "--repo",
        path_str(&repo),
        "--from",
        "emberrtos/x86_64/forced/rt",
        "--to",
        "emberrtos/x86_64/forced/rt-stable",
        "--gpg-key",
        me,
        "--gpg-homedir",
        path_str(home),
    ];
    let out = imgbuild(&args);
    assert_exit(&out, 3);
    assert_eq!(resolve(&repo, "emberrtos/x86_64/forced/rt-stable"), None);

    // Required by name, hw-a's PASS is still one platform of the default two.
    refused_saying(
        &["--require", "hw-a"],
        "--require hw-a alone",
        &["hw-a", "counts"],
    );
    // By default only a TPM-attested PASS counts: hw-a's is not one.
    let out = promote_strictly(
        &repo,
        &key,
        STABLE,
        &["--require", "hw-a", "--min-platforms", "1"],
    );
    assert_exit(&out, 3);
    assert!(
        stdout(&out)
            .contains("PASS without a TPM attestation (the target's own word): --allow-unattested counts it"),
        "{}",
        text(&out)
    );
    assert_eq!(resolve(&repo, STABLE), None);
    // Promoted: hw-a's PASS counts (one platform asked for, required by name).
    let out = promote(&repo, &key, &["--require", "hw-a", "--min-platforms", "1"]);
    assert_exit(&out, 0);
    assert_eq!(resolve(&repo, STABLE).as_deref(), Some(commit.as_str()));
    let repo_arg = format!("--repo={}", repo.display());
    assert_eq!(run(&mut ostree(&["rev-parse", &repo_arg, STABLE])).trim(), commit);
    assert_eq!(
        resolve(&repo, REF).as_deref(),
        Some(commit.as_str()),
        "--from moved"
    );
    assert!(
        ost::signed_by(&ost::open(&repo).unwrap(), &commit, me).unwrap(),
        "promote did not sign the commit"
    );
    assert!(repo.join("summary.sig").is_file(), "the summary is not signed");
    // The summary lists the new ref.
    let summary = run(&mut ostree(&["summary", &repo_arg, "--view"]));
    assert!(summary.contains(STABLE), "{summary}");

    // The promotion record: signed, naming the one record that allowed it.
    let promotions = repo.join("promotions").join(&commit);
    let files: Vec<PathBuf> = files_under(&promotions);
    let promotions_json = json_files(&files);
    assert_eq!(promotions_json.len(), 1, "{files:?}");
    let promotion = promotions_json[0];
    let name = promotion.file_name().unwrap().to_string_lossy().into_owned();
    assert!(name.contains("rt-stable"), "{name}");
    assert!(sig_of(promotion).is_file(), "{files:?}");
    assert_signed(home, promotion);
    let doc: Value = serde_json::from_slice(&std::fs::read(promotion).unwrap()).unwrap();
    let pass_sha = sha256_hex(&std::fs::read(records.join("hw-a-pass.json")).unwrap());
    assert_eq!(doc["commit"], commit.as_str(), "{doc:#}");
    assert_eq!(doc["to"], STABLE, "{doc:#}");
    assert_eq!(doc["min-platforms"], 1, "{doc:#}");
    assert_eq!(doc["allow-tofu"], false, "{doc:#}");
    // `records`: the ones that allowed it (the others may be listed as judged).
    let allowed = doc["records"]
        .as_array()
        .unwrap_or_else(|| panic!("no records list: {doc:#}"));
    assert_eq!(allowed.len(), 1, "{doc:#}");
    let allowed = allowed[0].to_string();
    assert!(allowed.contains("hw-a-pass"), "{doc:#}");
    assert!(allowed.contains(&pass_sha), "{doc:#}");

    // inspect lists both kinds of records.
    let out = imgbuild(&["inspect", "--repo", path_str(&repo), STABLE]);
    assert_exit(&out, 0);
    let listing = stdout(&out);
    assert!(listing.contains("hw-a-pass"), "{listing}");
    assert!(
        listing.contains(&name) || listing.contains(name.trim_end_matches(".json")),
        "{listing}"
    );
    let out = imgbuild(&["--json", "inspect", "--repo", path_str(&repo), REF]);
    assert_exit(&out, 0);
    let doc = json_of(&out);
    let qualifications = doc["qualifications"].to_string();
    let promotions_listed = doc["promotions"].to_string();
    for listed in [
        "hw-a-pass",
        "hw-b-fail",
        "hw-c-elsewhere",
        "hw-d-intruder",
        "hw-e-tampered",
    ] {
        assert!(qualifications.contains(listed), "{listed}: {doc:#}");
    }
    assert!(
        promotions_listed.contains(name.trim_end_matches(".json")),
        "{doc:#}"
    );

    // Two platforms: a second PASS (hw-b) meets the default --min-platforms 2.
    signed("hw-b-pass", &record(&commit, "hw-b", "PASS", 45), me);
    let out = promote_to(&repo, &key, "emberrtos/x86_64/rt-certified", &[]);
    assert_exit(&out, 0);
    assert_eq!(
        resolve(&repo, "emberrtos/x86_64/rt-certified").as_deref(),
        Some(commit.as_str())
    );
    eprintln!("promote test: {:.1} s", started.elapsed().as_secs_f64());
}

/// [`promote_bench`] with one signed PASS of `hw-a` (hw-a-pass.json).
fn bench_with_one_pass() -> (tempfile::TempDir, GpgKey, PathBuf, String) {
    let (dir, key, repo, commit) = promote_bench();
    let records = repo.join("qualifications").join(&commit);
    let (home, me) = (key.home.path(), key.fingerprint.as_str());
    write_record(
        &records,
        "hw-a-pass",
        &record(&commit, "hw-a", "PASS", 40),
        home,
        me,
    );
    (dir, key, repo, commit)
}

#[test]
fn a_repo_given_through_the_users_own_symlink_is_followed_by_inspect_and_promote() {
    let (dir, key, repo, commit) = bench_with_one_pass();
    // `./repo -> work/repo`, as a user links theirs.
    let link = dir.path().join("link");
    std::os::unix::fs::symlink(&repo, &link).unwrap();
    let out = imgbuild(&["inspect", "--repo", path_str(&link), REF]);
    assert_exit(&out, 0);
    assert!(stdout(&out).contains("qualifications: 1"), "{}", text(&out));
    let out = promote(&link, &key, &["--require", "hw-a", "--min-platforms", "1"]);
    assert_exit(&out, 0);
    assert_eq!(resolve(&repo, STABLE).as_deref(), Some(commit.as_str()));
    assert_eq!(
        files_under(&repo.join("promotions").join(&commit)).len(),
        2,
        "the promotion record and its signature"
    );
    assert!(
        std::fs::symlink_metadata(&link).unwrap().is_symlink(),
        "the user's link was replaced"
    );
}

#[test]
fn promote_with_one_pass_is_refused_by_default_two_platforms_are_needed() {
    let (_dir, key, repo, commit) = bench_with_one_pass();
    let records = repo.join("qualifications").join(&commit);
    let (home, me) = (key.home.path(), key.fingerprint.as_str());
    let out = promote(&repo, &key, &[]);
    assert_exit(&out, 3);
    assert!(stderr(&out).contains("1 platform(s) passed"), "{}", text(&out));
    assert!(stderr(&out).contains("at least 2 needed"), "{}", text(&out));
    assert_eq!(resolve(&repo, STABLE), None);

    // A second id measured through the same host key is the same machine.
    let mut same_machine = record(&commit, "hw-b", "PASS", 40);
    same_machine["target"]["host-key"]["fingerprint"] = "SHA256:host-key-of-hw-a".into();
    let twin = write_record(&records, "hw-b-twin", &same_machine, home, me);
    let out = promote(&repo, &key, &[]);
    assert_exit(&out, 3);
    assert!(stderr(&out).contains("at least 2 needed"), "{}", text(&out));
    assert_eq!(resolve(&repo, STABLE), None);

    // A second platform on its own machine: the default is met.
    std::fs::remove_file(sig_of(&twin)).unwrap();
    std::fs::remove_file(&twin).unwrap();
    write_record(
        &records,
        "hw-b-pass",
        &record(&commit, "hw-b", "PASS", 45),
        home,
        me,
    );
    let out = promote(&repo, &key, &[]);
    assert_exit(&out, 0);
    assert_eq!(resolve(&repo, STABLE).as_deref(), Some(commit.as_str()));
}

#[test]
fn promote_refuses_to_count_a_tofu_record_without_allow_tofu() {
    let (_dir, key, repo, commit) = promote_bench();
    let records = repo.join("qualifications").join(&commit);
    let (home, me) = (key.home.path(), key.fingerprint.as_str());
    let pinned = pass_through(&commit, "hw-a", Some("pinned"));
    write_record(&records, "hw-a-pinned", &pinned, home, me);
    let tofu = pass_through(&commit, "hw-b", Some("trust-on-first-use"));
    write_record(&records, "hw-b-tofu", &tofu, home, me);
    // A qualification/1 record still reads, but does not say its key was pinned.
    write_record(
        &records,
        "hw-c-first",
        &pass_through(&commit, "hw-c", None),
        home,
        me,
    );

    let out = promote(&repo, &key, &[]);
    assert_exit(&out, 3);
    let table = stdout(&out);
    let line = |hw: &str| {
        table
            .lines()
            .find(|l| l.starts_with(hw))
            .unwrap_or_default()
            .to_string()
    };
    assert!(line("hw-a").contains("counts"), "{}", text(&out));
    assert!(
        line("hw-b").contains("trust-on-first-use") && line("hw-b").contains("--allow-tofu"),
        "{table}"
    );
    assert!(
        line("hw-c").contains("not stated") && line("hw-c").contains("--allow-tofu"),
        "{table}"
    );
    assert!(stderr(&out).contains("1 platform(s) passed"), "{}", text(&out));
    assert_eq!(resolve(&repo, STABLE), None);
    // Required by name, a TOFU platform still does not count.
    let out = promote(&repo, &key, &["--require", "hw-b", "--min-platforms", "1"]);
    assert_exit(&out, 3);
    assert!(stderr(&out).contains("hw-b"), "{}", text(&out));
    assert_eq!(resolve(&repo, STABLE), None);

    // Told to, promote counts all three, and its record says it was told.
    let out = promote(&repo, &key, &["--allow-tofu", "--min-platforms", "3"]);
    assert_exit(&out, 0);
    assert_eq!(resolve(&repo, STABLE).as_deref(), Some(commit.as_str()));
    let promotions = files_under(&repo.join("promotions").join(&commit));
    let promotion = json_files(&promotions)[0];
    let doc: Value = serde_json::from_slice(&std::fs::read(promotion).unwrap()).unwrap();
    assert_eq!(doc["allow-tofu"], true, "{doc:#}");
    let established: Vec<&str> = doc["records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["host-key-established"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(established.len(), 3, "{doc:#}");
    for how in ["pinned", "trust-on-first-use", "not stated"] {
        assert!(established.contains(&how), "{how}: {doc:#}");
    }
}

// ---------------------------------------------------------------------------
// The known-vulnerability gate: --max-severity, the tracker export, signed VEX
// ---------------------------------------------------------------------------

/// The commit has bash 5.2.15-2 and libc6 2.36-9+deb12u10 (its own source).
const TRACKER: &str = r#"{
  "bash": {"CVE-2019-18276": {"releases": {"bookworm": {"status": "open", "urgency": "medium"}}}},
  "libc6": {
    "CVE-2023-4911": {"releases": {"bookworm": {"status": "resolved", "fixed_version": "2.36-9+deb12u11", "urgency": "high"}}},
    "TEMP-0000000-AAAAAA": {"releases": {"bookworm": {"status": "undetermined", "urgency": "not yet assigned"}}}
  },
  "gone": {"CVE-2020-0002": {"releases": {"bookworm": {"status": "open", "urgency": "low"}}}}
}"#;

/// An OpenVEX document saying libc6 is not affected by `id`.
pub(crate) fn vex_clearing(id: &str) -> Value {
    json!({
        "@context": "https://openvex.dev/ns/v0.2.0",
        "@id": format!("https://emberrtos.example/vex/{id}"),
        "author": "EmberRTOS security",
        "timestamp": "2026-12-01T00:00:00Z",
        "version": 1,
        "statements": [{
            "vulnerability": {"name": id},
            "products": [{"@id": "pkg:deb/debian/libc6@2.36-9%2Bdeb12u10?arch=source"}],
            "status": "not_affected",
            "justification": "vulnerable_code_not_in_execute_path"
        }]
    })
}

#[test]
fn promote_refuses_known_vulnerabilities_at_the_limit_until_signed_vex_clears_them() {
    let dir = tempfile::Builder::new()
        .prefix("promote-cve")
        .tempdir_in("/tmp")
        .unwrap();
    let key = GpgKey::generate("qualifier");
    let intruder = key.add_key("intruder");
    let repo = dir.path().join("repo");
    let tree = crate::diff::tree(dir.path(), "tree", crate::diff::STATUS_V1, "kernel.a = 1\n", "");
    let commit = crate::diff::commit_with_sbom(&repo, &tree, &[]);
    prove(&repo, &commit, None);
    let records = repo.join("qualifications").join(&commit);
    let (home, me) = (key.home.path(), key.fingerprint.as_str());
    for hw in ["hw-a", "hw-b"] {
        write_record(
            &records,
            &format!("{hw}-pass"),
            &record(&commit, hw, "PASS", 40),
            home,
            me,
        );
    }
    let db = dir.path().join("tracker.json");
    std::fs::write(&db, TRACKER).unwrap();
    let vex_dir = dir.path().join("vex");
    let db_args = ["--max-severity", "high", "--cve-db", path_str(&db)];
    let gated = |vex: &[&Path]| {
        let mut extra: Vec<&str> = db_args.to_vec();
        for path in vex {
            extra.extend(["--vex", path_str(path)]);
        }
        promote(&repo, &key, &extra)
    };
    let refused_for = |out: &Output, ids: &[&str]| {
        assert_exit(out, 3);
        let said = stderr(out);
        for id in ["CVE-2023-4911", "TEMP-0000000-AAAAAA"] {
            assert_eq!(said.contains(id), ids.contains(&id), "{id}: {}", text(out));
        }
        assert!(
            !said.contains("CVE-2019-18276"),
            "medium is below the limit: {said}"
        );
        assert_eq!(resolve(&repo, STABLE), None, "the ref moved");
    };

    // The limit needs data (by default, the cache's), and a level it knows.
    let empty = dir.path().join("empty-cache");
    let no_data = promote(
        &repo,
        &key,
        &["--max-severity", "high", "--cache-dir", path_str(&empty)],
    );
    assert_exit(&no_data, 1);
    assert!(
        stderr(&no_data).contains("holds no vulnerability data"),
        "{}",
        text(&no_data)
    );
    assert_eq!(resolve(&repo, STABLE), None, "the ref moved");
    let severe = promote(
        &repo,
        &key,
        &["--max-severity", "severe", "--cve-db", path_str(&db)],
    );
    assert_exit(&severe, 2);
    assert!(stderr(&severe).contains("unassigned"), "{}", text(&severe));

    // Two PASS platforms, but a high and an unassigned issue.
    let out = gated(&[]);
    refused_for(&out, &["CVE-2023-4911", "TEMP-0000000-AAAAAA"]);
    assert!(
        stderr(&out).contains(
            "CVE-2023-4911 (high, at or above --max-severity high) in libc6 2.36-9+deb12u10: affected, fixed in 2.36-9+deb12u11"
        ),
        "{}",
        text(&out)
    );

    // Unsigned, and signed by another key: listed as ignored, clearing nothing.
    let unsigned = write_record(&vex_dir, "unsigned", &vex_clearing("CVE-2023-4911"), home, me);
    std::fs::remove_file(sig_of(&unsigned)).unwrap();
    let foreign = write_record(
        &vex_dir,
        "foreign",
        &vex_clearing("CVE-2023-4911"),
        home,
        &intruder,
    );
    let out = gated(&[&unsigned, &foreign]);
    refused_for(&out, &["CVE-2023-4911", "TEMP-0000000-AAAAAA"]);
    assert!(
        stdout(&out).contains("unsigned.json: no signature"),
        "{}",
        text(&out)
    );
    assert!(
        stdout(&out).contains("foreign.json: not signed by the key"),
        "{}",
        text(&out)
    );

    // Signed by the key: it clears its issue only.
    let high = write_record(&vex_dir, "high", &vex_clearing("CVE-2023-4911"), home, me);
    let out = gated(&[&high]);
    refused_for(&out, &["TEMP-0000000-AAAAAA"]);
    assert!(
        stdout(&out).contains("cleared  CVE-2023-4911 in libc6"),
        "{}",
        text(&out)
    );

    let temp = write_record(&vex_dir, "temp", &vex_clearing("TEMP-0000000-AAAAAA"), home, me);
    let out = promote(
        &repo,
        &key,
        &[
            "--json",
            "--max-severity",
            "high",
            "--cve-db",
            path_str(&db),
            "--vex",
            path_str(&high),
            "--vex",
            path_str(&temp),
        ],
    );
    assert_exit(&out, 0);
    assert_eq!(resolve(&repo, STABLE).as_deref(), Some(commit.as_str()));
    let promotions = files_under(&repo.join("promotions"));
    let promotion = json_files(&promotions)[0];
    let promotion: Value = serde_json::from_slice(&std::fs::read(promotion).unwrap()).unwrap();
    let cve = &promotion["cve"];
    assert_eq!(cve["max-severity"], "high");
    assert_eq!(cve["blocking"], json!([]));
    assert_eq!(cve["cleared"].as_array().unwrap().len(), 2, "{cve}");
    assert_eq!(cve["database"]["sha256"], sha256_hex(TRACKER.as_bytes()));
    assert_eq!(
        cve["vex"][0]["sha256"],
        sha256_hex(&std::fs::read(&high).unwrap())
    );
}
