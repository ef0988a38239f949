//! The kernel stage through real distccd daemons on 127.0.0.1 and a real
//! ccache, on a stand-in kernel tree (a Makefile with the targets imgbuild
//! runs, compiling real C with `$(CC)`). The real CI kernel through distcc
//! is the e2e tier's.

use crate::common;

use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use assert_cmd::Command as BinCommand;

const MAKEFILE: &str = r#"# Stand-in kernel tree: the targets imgbuild runs; C compiled with $(CC).
ifeq ($(origin CC),default)
CC := gcc
endif
SRCS := $(sort $(wildcard $(CURDIR)/src/*.c))
OBJS := $(patsubst $(CURDIR)/src/%.c,$(O)/obj/%.o,$(SRCS))
.PHONY: tinyconfig olddefconfig bzImage
tinyconfig:
	printf 'CONFIG_STANDIN=y\n' > $(O)/.config
olddefconfig:
	@true
$(O)/obj/%.o: $(CURDIR)/src/%.c
	@mkdir -p $(O)/obj
	@echo "  CC      $@"
	$(CC) -O2 -c $< -o $@
	objcopy -O binary -j .text $@ $@.text
bzImage: $(OBJS)
	@mkdir -p $(O)/arch/x86/boot $(O)/include/config
	cat $(addsuffix .text,$(OBJS)) > $(O)/arch/x86/boot/bzImage
	echo 6.12.0-standin > $(O)/include/config/kernel.release
	touch $(O)/System.map
"#;

/// `linux-standin.tar.xz` with its Makefile and 12 C files; its sha256.
fn standin_tarball(dir: &Path) -> (PathBuf, String) {
    let tree = dir.join("linux-standin");
    std::fs::create_dir_all(tree.join("src")).unwrap();
    std::fs::write(tree.join("Makefile"), MAKEFILE).unwrap();
    for i in 0..12 {
        let body = format!(
            "unsigned long f{i}(unsigned long x) {{ unsigned long a = {i}; for (int k = 0; k < 64; k++) a = a * 6364136223846793005UL + x + k; return a; }}\n"
        );
        std::fs::write(tree.join(format!("src/f{i}.c")), body).unwrap();
    }
    let tarball = dir.join("linux-standin.tar.xz");
    let status = Command::new("tar")
        .arg("-C")
        .arg(dir)
        // Dated as a real source is: the kernel's date is its newest file's.
        .args([
            "--sort=name",
            "--mtime=@1764460800",
            "--owner=0",
            "--group=0",
            "-cJf",
        ])
        .arg(&tarball)
        .arg("linux-standin")
        .status()
        .unwrap();
    assert!(status.success());
    let sha = common::sha256_hex(&std::fs::read(&tarball).unwrap());
    (tarball, sha)
}

fn recipe(dir: &Path) -> PathBuf {
    let (_, sha) = standin_tarball(dir);
    std::fs::write(dir.join("standin.config"), "CONFIG_STANDIN=y\n").unwrap();
    let text = format!(
        "name: farm\nversion: \"1\"\nflavor: standard\nkernel:\n  source: {{ path: linux-standin.tar.xz, sha256: {sha} }}\n  base: tinyconfig\n  fragments: [standin.config]\nrootfs:\n  base: {{ debian: bookworm }}\nostree: {{ ref: farm/x86_64/standard }}\n"
    );
    let path = dir.join("farm.yaml");
    std::fs::write(&path, text).unwrap();
    path
}

/// A real distccd on 127.0.0.1, killed when dropped.
struct Distccd {
    child: Child,
    port: u16,
    log: PathBuf,
}

impl Drop for Distccd {
    /// The whole process group: distccd's workers (forked, as user
    /// distccd) would outlive their parent.
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", "--", &format!("-{}", self.child.id())])
            .status();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn distccd(dir: &Path, name: &str) -> Distccd {
    let port = free_port();
    let log = dir.join(format!("{name}.log"));
    // To stderr, into a file opened here: started as root, distccd runs as
    // nobody, who cannot open a file in this test's directory.
    let child = Command::new("distccd")
        .args([
            "--daemon",
            "--no-detach",
            "--allow",
            "127.0.0.1",
            "--listen",
            "127.0.0.1",
        ])
        .args(["--jobs", "2", "--log-level", "info", "--log-stderr", "--port"])
        .arg(port.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .process_group(0)
        .spawn()
        .expect("distccd (Debian package distcc, installed by ci/setup)");
    let started = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "distccd did not listen on {port}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    Distccd { child, port, log }
}

/// `imgbuild --json recipe --until kernel` in fresh work and cache dirs:
/// the kernel stage's output and stderr.
fn build_kernel(recipe: &Path, run: &Path, args: &[&str]) -> (serde_json::Value, String) {
    build_kernel_in(recipe, &run.join("work"), &run.join("cache"), args)
}

fn build_kernel_in(recipe: &Path, work: &Path, cache: &Path, args: &[&str]) -> (serde_json::Value, String) {
    // distcc's host backoff state, apart from other runs; distcc makes its
    // subdirectories but not $DISTCC_DIR itself.
    let distcc_dir = work.with_extension("distcc");
    std::fs::create_dir_all(&distcc_dir).unwrap();
    let output = BinCommand::cargo_bin("imgbuild")
        .unwrap()
        .args(["--json", "recipe"])
        .arg(recipe)
        .args(["--until", "kernel", "--work-dir"])
        .arg(work)
        .arg("--cache-dir")
        .arg(cache)
        .args(args)
        .env_remove("DISTCC_HOSTS")
        .env_remove("IMGBUILD_CCACHE")
        .env_remove("IMGBUILD_JOBS")
        .env_remove("IMGBUILD_CACHE_REMOTE")
        .env("DISTCC_DIR", &distcc_dir)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(output.status.success(), "{stderr}");
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let kernel = report["stages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["stage"] == "kernel")
        .unwrap()["output"]
        .clone();
    (kernel, stderr)
}

fn compile_jobs(log: &Path) -> usize {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .matches("COMPILE_OK")
        .count()
}

#[test]
fn two_distccd_daemons_build_the_same_kernel_under_the_same_key() {
    let dir = tempfile::tempdir().unwrap();
    let recipe = recipe(dir.path());
    let (plain, _) = build_kernel(&recipe, &dir.path().join("plain"), &[]);
    let (a, b) = (distccd(dir.path(), "a"), distccd(dir.path(), "b"));
    let hosts = format!("127.0.0.1:{}/2 127.0.0.1:{}/2", a.port, b.port);
    let (farm, stderr) = build_kernel(&recipe, &dir.path().join("farm"), &["--distcc", &hosts]);
    assert!(stderr.contains("compiling with -j4, distcc on"), "{stderr}");
    assert!(stderr.contains("CC=distcc gcc"), "{stderr}");
    assert!(!stderr.contains("fell back"), "{stderr}");
    let jobs = (compile_jobs(&a.log), compile_jobs(&b.log));
    assert!(jobs.0 > 0 && jobs.1 > 0, "both daemons compile: {jobs:?}");
    assert_eq!(farm["key"], plain["key"], "distcc changes no cache key");
    assert_eq!(farm["bzimage-sha256"], plain["bzimage-sha256"]);
}

#[test]
fn a_stopped_daemon_is_named_and_the_build_completes_on_the_other() {
    let dir = tempfile::tempdir().unwrap();
    let recipe = recipe(dir.path());
    let (plain, _) = build_kernel(&recipe, &dir.path().join("plain"), &[]);
    let up = distccd(dir.path(), "up");
    let down = free_port();
    // First in the list, so distcc tries it before the host that is up.
    let hosts = format!("127.0.0.1:{down}/2 127.0.0.1:{}/2", up.port);
    let (farm, stderr) = build_kernel(&recipe, &dir.path().join("farm"), &["--distcc", &hosts]);
    let log = std::fs::read_to_string(dir.path().join("farm/work/kernel/build.log")).unwrap();
    assert!(
        stderr.contains(&format!("distcc could not reach 127.0.0.1:{down}")),
        "{stderr}\n{log}"
    );
    assert!(compile_jobs(&up.log) > 0, "the daemon that is up compiled");
    assert_eq!(farm["bzimage-sha256"], plain["bzimage-sha256"]);
}

#[test]
fn with_no_host_up_every_compile_runs_here_and_the_log_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let recipe = recipe(dir.path());
    let (plain, _) = build_kernel(&recipe, &dir.path().join("plain"), &[]);
    let down = free_port();
    let hosts = format!("127.0.0.1:{down}/2");
    let (farm, stderr) = build_kernel(&recipe, &dir.path().join("farm"), &["--distcc", &hosts]);
    assert!(
        stderr.contains(&format!("distcc could not use 127.0.0.1:{down}/2"))
            && stderr.contains("fell back to this machine"),
        "{stderr}"
    );
    assert_eq!(farm["bzimage-sha256"], plain["bzimage-sha256"]);
}

fn ccache_hits(dir: &Path) -> u64 {
    let output = Command::new("ccache")
        .arg("--print-stats")
        .env("CCACHE_DIR", dir)
        .output()
        .expect("ccache (Debian package ccache, installed by ci/setup)");
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|l| l.split_once('\t'))
        .filter(|(k, _)| matches!(*k, "direct_cache_hit" | "preprocessed_cache_hit"))
        .filter_map(|(_, v)| v.trim().parse::<u64>().ok())
        .sum()
}

/// A fresh work dir, the same cache (ccache's hits need the same source tree
/// path) without its kernel artifact, so the kernel is compiled again.
#[test]
fn a_warm_ccache_serves_a_build_in_a_fresh_work_dir() {
    let dir = tempfile::tempdir().unwrap();
    let recipe = recipe(dir.path());
    let cache = dir.path().join("cache");
    let ccache = dir.path().join("ccache");
    let ccache_arg = ccache.to_str().unwrap();
    let (cold, _) = build_kernel_in(
        &recipe,
        &dir.path().join("cold"),
        &cache,
        &["--ccache", ccache_arg],
    );
    assert_eq!(ccache_hits(&ccache), 0);
    std::fs::remove_dir_all(cache.join("kernels")).unwrap();
    let (warm, stderr) = build_kernel_in(
        &recipe,
        &dir.path().join("warm"),
        &cache,
        &["--ccache", ccache_arg, "-j", "3"],
    );
    assert!(!stderr.contains("cache hit: kernel"), "{stderr}");
    assert!(stderr.contains("compiling with -j3, ccache in"), "{stderr}");
    assert!(
        ccache_hits(&ccache) >= 12,
        "every file a hit: {}",
        ccache_hits(&ccache)
    );
    assert_eq!(warm["key"], cold["key"]);
    assert_eq!(warm["bzimage-sha256"], cold["bzimage-sha256"]);
}

#[test]
fn a_bad_host_list_is_refused_naming_where_it_came_from() {
    let dir = tempfile::tempdir().unwrap();
    let recipe = recipe(dir.path());
    let output = BinCommand::cargo_bin("imgbuild")
        .unwrap()
        .arg("recipe")
        .arg(&recipe)
        .args(["--until", "kernel", "--work-dir"])
        .arg(dir.path().join("work"))
        .arg("--cache-dir")
        .arg(dir.path().join("cache"))
        .env("DISTCC_HOSTS", "host/0")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("DISTCC_HOSTS") && stderr.contains("host/0"),
        "{stderr}"
    );
    assert!(!dir.path().join("work/kernel").exists(), "nothing ran");
}

/// `imgbuild [--json] cache ARGS --cache-dir CACHE`: its output.
fn cache_cmd(cache: &Path, args: &[&str]) -> std::process::Output {
    BinCommand::cargo_bin("imgbuild")
        .unwrap()
        .args(args)
        .arg("--cache-dir")
        .arg(cache)
        .output()
        .unwrap()
}

fn cache_ok(cache: &Path, args: &[&str]) -> String {
    let out = cache_cmd(cache, args);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Object files anywhere under `dir`: what `make bzImage` leaves.
fn objects_under(dir: &Path) -> usize {
    common::files_under(dir)
        .iter()
        .filter(|p| p.extension().is_some_and(|e| e == "o"))
        .count()
}

#[test]
fn runner_b_takes_the_kernel_from_the_remote_without_make_and_refuses_a_truncated_one() {
    let dir = tempfile::tempdir().unwrap();
    let recipe = recipe(dir.path());
    let (a, _) = build_kernel(&recipe, &dir.path().join("a"), &[]);
    let remote = dir.path().join("remote");
    let pushed = cache_ok(
        &dir.path().join("a/cache"),
        &["cache", "push", "--unsigned", remote.to_str().unwrap()],
    );
    assert!(pushed.contains("pushed 1 entry"), "{pushed}");
    let key = a["key"].as_str().unwrap();
    let archive = remote.join(format!("kernels/{key}.tar"));
    assert!(archive.is_file() && remote.join(format!("kernels/{key}.json")).is_file());
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(remote.join("index.json")).unwrap()).unwrap();
    assert_eq!(index["entries"][0]["key"], key);
    // A second push finds it there.
    let again = cache_ok(
        &dir.path().join("a/cache"),
        &["cache", "push", "--unsigned", remote.to_str().unwrap()],
    );
    assert!(
        again.contains("pushed 0 entries") && again.contains("1 already there"),
        "{again}"
    );

    let server = common::StaticServer::start(&remote);
    let (b, stderr) = build_kernel(
        &recipe,
        &dir.path().join("b"),
        &["--cache-remote", &server.url, "--cache-remote-insecure"],
    );
    assert!(
        stderr.contains("from the cache remote (sha256 verified; make not run)"),
        "{stderr}"
    );
    assert_eq!(b["key"], a["key"]);
    assert_eq!(b["bzimage-sha256"], a["bzimage-sha256"]);
    assert_eq!(b["cached"], true);
    assert_eq!(objects_under(&dir.path().join("b")), 0, "runner B compiled");
    assert!(
        server
            .requests()
            .iter()
            .any(|(path, n)| path.ends_with(".tar") && *n > 0),
        "{:?}",
        server.requests()
    );

    // Cut short on the remote: refused, and runner C builds.
    let full = std::fs::read(&archive).unwrap();
    std::fs::write(&archive, &full[..full.len() / 2]).unwrap();
    let (c, stderr) = build_kernel(
        &recipe,
        &dir.path().join("c"),
        &["--cache-remote", &server.url, "--cache-remote-insecure"],
    );
    assert!(stderr.contains("was not used"), "{stderr}");
    assert!(stderr.contains("cache miss: building kernel"), "{stderr}");
    assert!(objects_under(&dir.path().join("c")) > 0, "runner C did not build");
    assert_eq!(c["bzimage-sha256"], a["bzimage-sha256"]);
    let entry: serde_json::Value =
        serde_json::from_slice(&std::fs::read(remote.join(format!("kernels/{key}.json"))).unwrap()).unwrap();
    let blob = dir
        .path()
        .join("c/cache/blobs/sha256")
        .join(entry["sha256"].as_str().unwrap());
    assert!(!blob.exists(), "the bad download stayed in the cache");
    assert_eq!(
        common::files_under(&dir.path().join("c/cache/tmp")),
        Vec::<PathBuf>::new(),
        "a partial download stayed in the cache"
    );

    // A remote without the entry: a note, and a build.
    let empty = tempfile::tempdir().unwrap();
    let (_, stderr) = build_kernel(
        &recipe,
        &dir.path().join("d"),
        &[
            "--cache-remote",
            &format!("file://{}", empty.path().display()),
            "--cache-remote-insecure",
        ],
    );
    assert!(stderr.contains("not on the cache remote: kernels/"), "{stderr}");
}

#[test]
fn cache_push_over_ssh_then_ls_and_gc_by_age_and_size() {
    let dir = tempfile::tempdir().unwrap();
    let recipe = recipe(dir.path());
    let (a, _) = build_kernel(&recipe, &dir.path().join("a"), &[]);
    let cache = dir.path().join("a/cache");
    let key = a["key"].as_str().unwrap();

    let sshd = common::Sshd::start(&dir.path().join("sshd"));
    let remote = dir.path().join("srv/cache");
    let out = BinCommand::cargo_bin("imgbuild")
        .unwrap()
        .args(["cache", "push", "--unsigned", &sshd.url(&remote), "--cache-dir"])
        .arg(&cache)
        .env("IMGBUILD_SSH_CONFIG", &sshd.config)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let served: serde_json::Value =
        serde_json::from_slice(&std::fs::read(remote.join(format!("kernels/{key}.json"))).unwrap()).unwrap();
    let tar = std::fs::read(remote.join(format!("kernels/{key}.tar"))).unwrap();
    assert_eq!(served["sha256"], common::sha256_hex(&tar));
    assert!(remote.join("index.json").is_file());

    let listed: serde_json::Value =
        serde_json::from_str(&cache_ok(&cache, &["--json", "cache", "ls"])).unwrap();
    let kernels: Vec<_> = listed["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["area"] == "kernels")
        .collect();
    assert_eq!(kernels.len(), 1, "{listed}");
    assert_eq!(kernels[0]["name"], key);

    let refused = cache_cmd(&cache, &["cache", "gc"]);
    assert_eq!(refused.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("--older-than"));
    let dry = cache_ok(&cache, &["cache", "gc", "--max-size", "0", "--dry-run"]);
    assert!(dry.contains("would remove"), "{dry}");
    assert!(cache.join("kernels").join(key).is_dir(), "a dry run removed");

    // Only the kernel is two days old: --older-than 1d takes it alone.
    let status = Command::new("touch")
        .args(["-d", "2 days ago"])
        .arg(cache.join("kernels").join(key))
        .status()
        .unwrap();
    assert!(status.success());
    let gc = cache_ok(&cache, &["cache", "gc", "--older-than", "1d"]);
    assert!(gc.contains("removed 1 entries"), "{gc}");
    assert!(!cache.join("kernels").join(key).exists());
    assert!(!cache_ok(&cache, &["cache", "ls"]).contains(key));
    let bad = cache_cmd(&cache, &["cache", "gc", "--older-than", "soon"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("30d"), "{bad:?}");
}
