//! The kernel tier: the real 6.12 Kconfig (olddefconfig only, no build), and
//! the PREEMPT_RT checks on real Debian kernels and crafted images.

use crate::common;

use assert_cmd::Command;
use common::{copy_project_inputs, debian_kernel, shared_cache};
use predicates::prelude::*;
use predicates::str::contains;

fn imgbuild() -> Command {
    Command::cargo_bin("imgbuild").unwrap()
}

/// `imgbuild recipe <recipe> --until kconfig` in a fresh work dir.
fn kconfig(recipe: &std::path::Path, work: &std::path::Path) -> assert_cmd::assert::Assert {
    imgbuild()
        .arg("recipe")
        .arg(recipe)
        .args(["--until", "kconfig", "--work-dir"])
        .arg(work)
        .arg("--cache-dir")
        .arg(shared_cache())
        .assert()
}

#[test]
fn kconfig_refuses_a_fragment_that_drops_preempt_rt() {
    let dir = tempfile::tempdir().unwrap();
    copy_project_inputs(dir.path());
    std::fs::write(
        dir.path().join("kernel-configs/no-expert.config"),
        "# Turning EXPERT off makes Kconfig drop PREEMPT_RT silently.\n# CONFIG_EXPERT is not set\n",
    )
    .unwrap();
    let recipe = dir.path().join("recipes/ci-rt.yaml");
    let text = std::fs::read_to_string(&recipe).unwrap().replace(
        "    - ../kernel-configs/rt.config\n",
        "    - ../kernel-configs/rt.config\n    - ../kernel-configs/no-expert.config\n",
    );
    std::fs::write(&recipe, text).unwrap();
    let work = dir.path().join("build");
    kconfig(&recipe, &work).code(3).stderr(
        contains("refused by kconfig")
            .and(contains("DROPPED CONFIG_PREEMPT_RT"))
            .and(contains("rt.config:"))
            .and(contains("PREEMPT_RT depends on `EXPERT && ARCH_SUPPORTS_RT`"))
            .and(contains("unmet: EXPERT (is n)")),
    );
    // The refused stage left no stamp and no final config behind.
    assert!(!work.join("kconfig/stamp.json").exists());
    assert!(!work.join("kconfig/config").exists());
}

#[test]
fn repo_recipes_configure_without_dropping_anything() {
    for recipe in ["ci-rt.yaml", "rt.yaml", "standard.yaml"] {
        let path = common::repo_root().join("recipes").join(recipe);
        if !path.exists() {
            continue;
        }
        let work = tempfile::tempdir().unwrap();
        kconfig(&path, work.path())
            .code(0)
            .stderr(contains("requested symbols hold after olddefconfig"));
        let config = std::fs::read_to_string(work.path().join("kconfig/config")).unwrap();
        let config = rtcheck::kconfig::Config::parse(&config).unwrap();
        assert_eq!(config.is_preempt_rt(), recipe != "standard.yaml", "{recipe}");
        // The second run is a cache hit.
        kconfig(&path, work.path())
            .code(0)
            .stderr(contains("[kconfig] up to date"));
    }
}

#[test]
fn missing_make_names_the_debian_package() {
    let work = tempfile::tempdir().unwrap();
    imgbuild()
        .env("PATH", "/nonexistent")
        .arg("recipe")
        .arg(common::repo_root().join("recipes/ci-rt.yaml"))
        .args(["--until", "kconfig", "--work-dir"])
        .arg(work.path())
        .arg("--cache-dir")
        .arg(shared_cache())
        .assert()
        .code(1)
        .stderr(
            contains("`make` is not installed")
                .and(contains("apt-get install"))
                .and(contains(" make")),
        );
}

/// `imgbuild ARGS… <fixture>/vmlinuz --config <fixture>/config --modules
/// <fixture>` on the Debian kernel fixture `flavor`.
fn verify_fixture(flavor: &str, args: &[&str]) -> assert_cmd::assert::Assert {
    let dir = debian_kernel(flavor);
    imgbuild()
        .args(args)
        .arg(dir.join("vmlinuz"))
        .arg("--config")
        .arg(dir.join("config"))
        .arg("--modules")
        .arg(&dir)
        .assert()
}

/// The `--json` evidence of a run of [`verify_fixture`].
fn evidence_of(run: assert_cmd::assert::Assert) -> serde_json::Value {
    serde_json::from_slice(&run.get_output().stdout).unwrap()
}

fn status_of(doc: &serde_json::Value, id: &str) -> serde_json::Value {
    doc["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["id"] == id)
        .unwrap()["status"]
        .clone()
}

#[test]
#[cfg_attr(
    not(feature = "fixtures"),
    ignore = "needs Debian kernel packages (ci/fetch-fixtures): --features imgbuild/fixtures"
)]
fn debian_rt_kernel_passes() {
    let doc = evidence_of(verify_fixture("rt", &["--json", "verify-kernel"]).code(0));
    assert_eq!(doc["preempt-rt"], true);
    assert_eq!(doc["arch"], "x86_64");
    assert_eq!(status_of(&doc, "artifact.uts-version"), "pass");
    assert_eq!(status_of(&doc, "artifact.build-config"), "pass");
    assert_eq!(status_of(&doc, "artifact.modules"), "pass");
    assert!(doc["uts_version"].as_str().unwrap().contains("SMP PREEMPT_RT"));
}

#[test]
#[cfg_attr(
    not(feature = "fixtures"),
    ignore = "needs Debian kernel packages (ci/fetch-fixtures): --features imgbuild/fixtures"
)]
fn debian_generic_kernel_is_refused() {
    verify_fixture("cloud", &["verify-kernel"])
        .code(3)
        .stdout(contains("PREEMPT_RT: NO"))
        .stderr(
            contains("artifact.uts-version: not PREEMPT_RT (PREEMPT_DYNAMIC)")
                .and(contains(
                    "artifact.build-config: build .config has no CONFIG_PREEMPT_RT",
                ))
                .and(contains("lacks preempt_rt")),
        );
}

#[test]
#[cfg_attr(
    not(feature = "fixtures"),
    ignore = "needs Debian kernel packages (ci/fetch-fixtures): --features imgbuild/fixtures"
)]
fn debian_arm64_rt_kernel_passes() {
    let doc =
        evidence_of(verify_fixture("rt-arm64", &["--json", "verify-kernel", "--arch", "arm64"]).code(0));
    assert_eq!(doc["preempt-rt"], true);
    assert_eq!(doc["arch"], "arm64");
    for id in [
        "artifact.header",
        "artifact.uts-version",
        "artifact.build-config",
        "artifact.modules",
    ] {
        assert_eq!(status_of(&doc, id), "pass", "{id}: {doc:#}");
    }
    assert!(doc["release"].as_str().unwrap().ends_with("-rt-arm64"), "{doc:#}");
    // The same kernel where an x86_64 one is wanted.
    verify_fixture("rt-arm64", &["verify-kernel", "--arch", "x86_64"])
        .code(3)
        .stdout(contains("architecture:   arm64"))
        .stderr(contains(
            "artifact.header: the kernel is for arm64, but x86_64 is wanted",
        ));
}

#[test]
#[cfg_attr(
    not(feature = "fixtures"),
    ignore = "needs Debian kernel packages (ci/fetch-fixtures): --features imgbuild/fixtures"
)]
fn debian_arm64_generic_kernel_is_refused() {
    verify_fixture("arm64", &["verify-kernel"])
        .code(3)
        .stdout(contains("PREEMPT_RT: NO").and(contains("architecture:   arm64")))
        .stderr(
            contains("artifact.uts-version: not PREEMPT_RT (no preemption flag)")
                .and(contains(
                    "artifact.build-config: build .config has no CONFIG_PREEMPT_RT",
                ))
                .and(contains("lacks preempt_rt")),
        );
}

/// Takes the Debian RT image and damages it in one way.
fn crafted(name: &str, edit: impl FnOnce(&mut Vec<u8>)) -> (tempfile::TempDir, std::path::PathBuf) {
    let mut image = std::fs::read(debian_kernel("rt").join("vmlinuz")).unwrap();
    edit(&mut image);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(name);
    std::fs::write(&path, image).unwrap();
    (dir, path)
}

fn refused_with(path: &std::path::Path, reason: &str) {
    imgbuild()
        .arg("verify-kernel")
        .arg(path)
        .assert()
        .code(3)
        .stderr(contains(reason).and(contains("panicked").not()));
}

#[test]
#[cfg_attr(
    not(feature = "fixtures"),
    ignore = "needs Debian kernel packages (ci/fetch-fixtures): --features imgbuild/fixtures"
)]
fn crafted_images_are_refused_with_a_reason() {
    let (_d, bad_magic) = crafted("bad-magic", |img| img[0x202..0x206].copy_from_slice(b"NOPE"));
    refused_with(&bad_magic, "no `HdrS` magic at 0x202");

    let (_d, past_setup) = crafted("past-setup", |img| {
        let setup_end = (img[0x1f1] as usize + 1) * 512;
        let pointer = (setup_end + 16 - 0x200) as u16;
        img[0x20e..0x210].copy_from_slice(&pointer.to_le_bytes());
    });
    refused_with(&past_setup, "outside the setup sectors");

    let (_d, truncated) = crafted("truncated", |img| img.truncate(0x400));
    refused_with(&truncated, "truncated");

    // A generic kernel whose timestamp was set to contain the token.
    let (_d, spoofed) = crafted("spoofed", |img| {
        let pointer = u16::from_le_bytes([img[0x20e], img[0x20f]]) as usize + 0x200;
        let fake = b"6.1.0 (me@host) #1 SMP PREEMPT_DYNAMIC Mon Nov 30 PREEMPT_RT 2026\0";
        img[pointer..pointer + fake.len()].copy_from_slice(fake);
    });
    refused_with(&spoofed, "not PREEMPT_RT (PREEMPT_DYNAMIC)");

    let (_d, empty) = crafted("empty", Vec::clear);
    refused_with(&empty, "too short");
}

mod cache_and_lock {
    use std::path::{Path, PathBuf};
    use std::sync::{Arc, Barrier};
    use std::time::{Duration, Instant};

    use super::common::{copy_project_inputs, files_under};
    use super::imgbuild;
    use imgbuild::cache::Cache;
    use imgbuild::io::hashing::{sha256_file, sha256_hex};
    use imgbuild::stage::Key;
    use imgbuild::stages::fetch::{Fetched, import_file};
    use imgbuild::stages::kernel::build::{KernelOutput, cache_artifact, read_artifact};
    use imgbuild::stages::kernel::prepare_source;
    use imgbuild::ui::Ui;
    use predicates::prelude::*;
    use predicates::str::contains;

    /// A plain tarball holding a toy kernel tree (`linux-9.9/Makefile`, ...).
    fn toy_source(dir: &Path) -> PathBuf {
        let path = dir.join("linux-9.9.tar");
        let mut builder = tar::Builder::new(std::fs::File::create(&path).unwrap());
        for (name, data) in [
            ("linux-9.9/Makefile", &b"VERSION = 9\n"[..]),
            ("linux-9.9/kernel/fork.c", &[b'x'; 5000][..]),
            ("linux-9.9/README", &b"toy\n"[..]),
        ] {
            let mut header = tar::Header::new_gnu();
            header.set_size(data.len() as u64);
            header.set_mode(0o644);
            header.set_cksum();
            builder.append_data(&mut header, name, data).unwrap();
        }
        builder.finish().unwrap();
        path
    }

    fn fetched_toy(dir: &Path, cache: &Cache) -> Fetched {
        import_file(&toy_source(dir), None, cache, &Ui::plain()).unwrap()
    }

    /// Names directly under `dir`, sorted.
    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn truncated_source_blob_never_becomes_a_source_tree() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Cache::open(&dir.path().join("cache")).unwrap();
        let fetched = fetched_toy(dir.path(), &cache);
        // Cut the cached blob at an entry boundary, losing the last entry
        // (header and data) and the end marker: a tar reader that takes EOF
        // for the end would extract a partial tree.
        let cut = std::fs::metadata(&fetched.path).unwrap().len() - 4 * 512;
        std::fs::OpenOptions::new()
            .write(true)
            .open(&fetched.path)
            .unwrap()
            .set_len(cut)
            .unwrap();
        let err = prepare_source(&fetched, &cache, &Ui::plain()).unwrap_err();
        let text = format!("{err:#}");
        assert!(text.contains("damaged") && text.contains("run again"), "{text}");
        assert!(!cache.root().join("sources").join(&fetched.sha256).exists());
        assert!(!fetched.path.exists(), "the damaged blob was kept");
        assert!(files_under(&cache.root().join("tmp")).is_empty());
    }

    #[test]
    fn concurrent_source_preparation_shares_one_tree() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Cache::open(&dir.path().join("cache")).unwrap();
        let fetched = fetched_toy(dir.path(), &cache);
        let barrier = Arc::new(Barrier::new(2));
        let runs: Vec<_> = (0..2)
            .map(|_| {
                let (cache, fetched, barrier) = (cache.clone(), fetched.clone(), barrier.clone());
                std::thread::spawn(move || {
                    barrier.wait();
                    prepare_source(&fetched, &cache, &Ui::plain()).map(|tree| tree.root)
                })
            })
            .collect();
        let roots: Vec<PathBuf> = runs.into_iter().map(|r| r.join().unwrap().unwrap()).collect();
        assert_eq!(roots[0], roots[1]);
        assert_eq!(
            std::fs::read(roots[0].join("kernel/fork.c")).unwrap(),
            vec![b'x'; 5000]
        );
        let sources = cache.root().join("sources");
        assert_eq!(
            names(&sources),
            [fetched.sha256.clone(), format!("{}.lock", fetched.sha256)]
        );
        assert!(files_under(&cache.root().join("tmp")).is_empty());
    }

    /// A staged kernel artifact, as the kernel stage leaves it before caching.
    fn staged_kernel(cache: &Cache, key: &Key, bzimage: &[u8]) -> (tempfile::TempDir, KernelOutput) {
        let staging = cache.temp_dir("kernel-").unwrap();
        let config = "CONFIG_PREEMPT_RT=y\n";
        std::fs::write(staging.path().join("bzImage"), bzimage).unwrap();
        std::fs::write(staging.path().join("config"), config).unwrap();
        let digest = key.digest();
        let artifact_dir = cache.area("kernels").unwrap().join(&digest);
        let output = KernelOutput {
            key: digest,
            image_file: "bzImage".into(),
            bzimage: artifact_dir.join("bzImage"),
            bzimage_sha256: sha256_file(&staging.path().join("bzImage"), None).unwrap(),
            config: artifact_dir.join("config"),
            config_sha256: sha256_hex(config),
            artifact_dir,
            modules: None,
            release: "9.9.0-rt1".into(),
            cached: false,
            build_seconds: Some(1.0),
        };
        (staging, output)
    }

    #[test]
    fn concurrent_kernel_inserts_both_succeed_without_leaks() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Cache::open(&dir.path().join("cache")).unwrap();
        let key = Key::new().with("source", "toy");
        let barrier = Arc::new(Barrier::new(2));
        let runs: Vec<_> = (0..2)
            .map(|_| {
                let (cache, key, barrier) = (cache.clone(), key.clone(), barrier.clone());
                std::thread::spawn(move || {
                    let (staging, output) = staged_kernel(&cache, &key, b"bzImage bytes");
                    barrier.wait();
                    cache_artifact(staging, &output, &key, &Ui::plain())
                })
            })
            .collect();
        let outputs: Vec<KernelOutput> = runs
            .into_iter()
            .map(|r| r.join().unwrap().unwrap_or_else(|e| panic!("{e:#}")))
            .collect();
        assert_eq!(outputs[0].bzimage, outputs[1].bzimage);
        assert_eq!(outputs[0].bzimage_sha256, outputs[1].bzimage_sha256);
        assert_eq!(names(&cache.root().join("kernels")), [key.digest()]);
        assert!(files_under(&cache.root().join("tmp")).is_empty());
        read_artifact(&outputs[0].artifact_dir, &key.digest()).unwrap();

        // A later run with the same key (the old failure: `Directory not empty`).
        let (staging, output) = staged_kernel(&cache, &key, b"bzImage bytes");
        cache_artifact(staging, &output, &key, &Ui::plain()).unwrap();
        assert!(files_under(&cache.root().join("tmp")).is_empty());
    }

    /// A toy kernel in a new cache: the dir holding it, the cache, its key
    /// and its output.
    fn cached_toy_kernel() -> (tempfile::TempDir, Cache, Key, KernelOutput) {
        let dir = tempfile::tempdir().unwrap();
        let cache = Cache::open(&dir.path().join("cache")).unwrap();
        let key = Key::new().with("source", "toy");
        let (staging, output) = staged_kernel(&cache, &key, b"bzImage bytes");
        cache_artifact(staging, &output, &key, &Ui::plain()).unwrap();
        (dir, cache, key, output)
    }

    #[test]
    fn damaged_kernel_artifact_is_refused_and_replaced() {
        let (_dir, cache, key, output) = cached_toy_kernel();
        std::fs::write(&output.bzimage, b"bzImage").unwrap();
        let err = read_artifact(&output.artifact_dir, &key.digest()).unwrap_err();
        assert!(format!("{err:#}").contains("hashes to"), "{err:#}");
        // Caching the rebuilt kernel replaces the damaged entry.
        let (staging, output) = staged_kernel(&cache, &key, b"bzImage bytes");
        cache_artifact(staging, &output, &key, &Ui::plain()).unwrap();
        read_artifact(&output.artifact_dir, &key.digest()).unwrap();
        assert_eq!(names(&cache.root().join("kernels")), [key.digest()]);
        assert!(files_under(&cache.root().join("tmp")).is_empty());
    }

    #[test]
    fn a_cached_kernel_naming_an_image_outside_its_dir_is_refused() {
        let (_dir, _cache, key, output) = cached_toy_kernel();
        let build_json = output.artifact_dir.join("build.json");
        let text = std::fs::read_to_string(&build_json).unwrap();
        for name in ["../../../etc/passwd", "config", "vmlinux"] {
            let forged = text.replace(
                "\"image-file\": \"bzImage\"",
                &format!("\"image-file\": {name:?}"),
            );
            assert_ne!(forged, text);
            std::fs::write(&build_json, forged).unwrap();
            let err = read_artifact(&output.artifact_dir, &key.digest()).unwrap_err();
            assert!(format!("{err:#}").contains("not bzImage or Image"), "{err:#}");
        }
        // A build.json from before the field reads as a bzImage.
        let old = text.replace("\"image-file\": \"bzImage\",", "");
        assert_ne!(old, text);
        std::fs::write(&build_json, old).unwrap();
        assert_eq!(
            read_artifact(&output.artifact_dir, &key.digest())
                .unwrap()
                .bzimage,
            output.bzimage
        );
    }

    /// A recipe whose kernel source is a local toy tarball, so `--until
    /// fetch` needs no network.
    fn local_recipe(dir: &Path) -> PathBuf {
        copy_project_inputs(dir);
        toy_source(dir);
        let recipe = dir.join("recipes/ci-rt.yaml");
        let text = std::fs::read_to_string(&recipe).unwrap().replace(
            "source: { debian: linux-source-6.12 }",
            "source: { path: ../linux-9.9.tar }",
        );
        assert!(text.contains("../linux-9.9.tar"));
        std::fs::write(&recipe, text).unwrap();
        recipe
    }

    #[test]
    fn second_run_on_a_work_dir_fails_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let recipe = local_recipe(dir.path());
        let work = dir.path().join("build");
        std::fs::create_dir(&work).unwrap();
        let fetch = || {
            let mut cmd = imgbuild();
            cmd.arg("recipe")
                .arg(&recipe)
                .args(["--until", "fetch", "--work-dir"])
                .arg(&work)
                .arg("--cache-dir")
                .arg(dir.path().join("cache"));
            cmd
        };
        let held = imgbuild::cache::lock_work_dir(&work).unwrap();
        let started = Instant::now();
        fetch().assert().code(1).stderr(
            contains(work.canonicalize().unwrap().display().to_string())
                .and(contains("in use by another imgbuild run"))
                .and(contains(format!("pid {}", std::process::id()))),
        );
        assert!(started.elapsed() < Duration::from_secs(30));
        assert!(
            files_under(&dir.path().join("cache/blobs")).is_empty(),
            "fetch ran without the lock"
        );
        drop(held);
        fetch().assert().code(0);
    }
}

/// The shared cache (`cache push --gpg-key`, `--cache-remote` with
/// `--cache-remote-key`) on a stand-in kernel tree, served by real HTTP
/// servers on 127.0.0.1.
mod shared_cache {
    use std::path::Path;
    use std::time::{Duration, Instant};

    use super::common::{GpgKey, StaticServer, TricklingServer, files_under, standin_kernel_recipe, text};
    use super::imgbuild;
    use imgbuild::cache::Cache;
    use imgbuild::cache::download::{FetchOptions, Pace, TooSlow};
    use imgbuild::cache::remote::{self, RemoteCache, Trust};
    use imgbuild::ui::Ui;

    /// `imgbuild --json recipe RECIPE --until kernel` in `run/work` and
    /// `run/cache` with `args`: the output, the kernel stage's output and stderr.
    fn build_kernel(
        recipe: &Path,
        run: &Path,
        args: &[&str],
    ) -> (std::process::Output, serde_json::Value, String) {
        let mut cmd = imgbuild();
        cmd.args(["--json", "recipe"])
            .arg(recipe)
            .args(["--until", "kernel", "--work-dir"])
            .arg(run.join("work"))
            .arg("--cache-dir")
            .arg(run.join("cache"))
            .args(args);
        for var in [
            remote::URL_VAR,
            remote::KEY_VAR,
            remote::INSECURE_VAR,
            "DISTCC_HOSTS",
            "IMGBUILD_CCACHE",
            "IMGBUILD_JOBS",
        ] {
            cmd.env_remove(var);
        }
        let output = cmd.output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        let kernel = serde_json::from_slice::<serde_json::Value>(&output.stdout)
            .ok()
            .and_then(|report| {
                let stages = report["stages"].as_array()?.clone();
                stages.into_iter().find(|s| s["stage"] == "kernel")
            })
            .map(|stage| stage["output"].clone())
            .unwrap_or_default();
        (output, kernel, stderr)
    }

    /// `imgbuild cache push DEST --cache-dir CACHE`, signed by `key` when
    /// given, else `--unsigned`.
    fn push(cache: &Path, dest: &Path, key: Option<&GpgKey>) -> String {
        let mut cmd = imgbuild();
        cmd.args(["cache", "push"])
            .arg(dest)
            .arg("--cache-dir")
            .arg(cache);
        match key {
            Some(key) => cmd
                .args(["--gpg-key", &key.fingerprint, "--gpg-homedir"])
                .arg(key.home.path()),
            None => cmd.arg("--unsigned"),
        };
        let output = cmd.output().unwrap();
        assert!(output.status.success(), "{}", text(&output));
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// Runner A: the stand-in kernel built with make; its kernel output.
    fn runner_a(dir: &Path) -> (std::path::PathBuf, serde_json::Value) {
        let recipe = standin_kernel_recipe(dir);
        let (output, kernel, _) = build_kernel(&recipe, &dir.join("a"), &[]);
        assert!(output.status.success(), "{}", text(&output));
        assert!(dir.join("a/work/kernel/build.log").is_file(), "make did not run");
        (recipe, kernel)
    }

    fn tar_requests(server: &StaticServer) -> Vec<(String, u64)> {
        server
            .requests()
            .into_iter()
            .filter(|(path, _)| path.ends_with(".tar"))
            .collect()
    }

    #[test]
    fn forged_kernel_entries_signed_by_another_key_or_unsigned_are_refused_and_make_builds() {
        let dir = tempfile::tempdir().unwrap();
        let (recipe, a) = runner_a(dir.path());
        let key = a["key"].as_str().unwrap();
        let (publisher, attacker) = (GpgKey::generate("publisher"), GpgKey::generate("attacker"));

        // The attacker's cache: A's kernel with its own bzImage, made
        // self-consistent (build.json names the new hash), pushed and signed
        // with the attacker's key: entry, archive and sha256 all agree.
        let forged_cache = dir.path().join("forged-cache");
        let copied = std::process::Command::new("cp")
            .arg("-a")
            .arg(dir.path().join("a/cache"))
            .arg(&forged_cache)
            .status()
            .unwrap();
        assert!(copied.success());
        let artifact = forged_cache.join("kernels").join(key);
        let evil = b"attacker's vmlinuz".to_vec();
        std::fs::write(artifact.join("bzImage"), &evil).unwrap();
        let build_json = artifact.join("build.json");
        let mut build: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&build_json).unwrap()).unwrap();
        build["bzimage-sha256"] = imgbuild::io::hashing::sha256_hex(&evil).into();
        std::fs::write(&build_json, serde_json::to_vec(&build).unwrap()).unwrap();
        let forged = dir.path().join("forged");
        assert!(push(&forged_cache, &forged, Some(&attacker)).contains("pushed 1 entry"));
        let entry = forged.join(format!("kernels/{key}.json"));
        assert!(std::path::PathBuf::from(format!("{}.sig", entry.display())).is_file());

        let server = StaticServer::start(&forged);
        let pinned = publisher.public.to_str().unwrap();
        let args = ["--cache-remote", &server.url, "--cache-remote-key", pinned];
        let (output, b, stderr) = build_kernel(&recipe, &dir.path().join("b"), &args);
        assert!(output.status.success(), "{}", text(&output));
        assert!(
            stderr.contains("was not used")
                && stderr.contains("is not a good signature by the key pinned with --cache-remote-key"),
            "{stderr}"
        );
        assert!(stderr.contains("cache miss: building kernel"), "{stderr}");
        assert!(
            dir.path().join("b/work/kernel/build.log").is_file(),
            "make did not run"
        );
        assert_eq!(
            b["bzimage-sha256"], a["bzimage-sha256"],
            "the forged kernel was used"
        );
        assert_eq!(tar_requests(&server), vec![], "the forged archive was downloaded");

        // Unsigned: refused the same way.
        std::fs::remove_file(format!("{}.sig", entry.display())).unwrap();
        let (output, c, stderr) = build_kernel(&recipe, &dir.path().join("c"), &args);
        assert!(output.status.success(), "{}", text(&output));
        assert!(stderr.contains("has no signature"), "{stderr}");
        assert!(
            dir.path().join("c/work/kernel/build.log").is_file(),
            "make did not run"
        );
        assert_eq!(c["bzimage-sha256"], a["bzimage-sha256"]);
        assert_eq!(tar_requests(&server), vec![]);
    }

    #[test]
    fn runner_b_takes_a_kernel_signed_by_the_pinned_key_without_make() {
        let dir = tempfile::tempdir().unwrap();
        let (recipe, a) = runner_a(dir.path());
        let key = a["key"].as_str().unwrap();
        let publisher = GpgKey::generate("publisher");
        let remote_dir = dir.path().join("remote");
        let pushed = push(&dir.path().join("a/cache"), &remote_dir, Some(&publisher));
        assert!(pushed.contains("pushed 1 entry"), "{pushed}");
        let entry: serde_json::Value =
            serde_json::from_slice(&std::fs::read(remote_dir.join(format!("kernels/{key}.json"))).unwrap())
                .unwrap();
        assert_eq!(
            (entry["format"].as_u64(), entry["area"].as_str()),
            (Some(2), Some("kernels"))
        );
        let inputs = serde_json::from_value(entry["inputs"].clone()).unwrap();
        assert_eq!(
            imgbuild::stage::Key { inputs }.digest(),
            key,
            "the inputs are the key's"
        );
        let again = push(&dir.path().join("a/cache"), &remote_dir, Some(&publisher));
        assert!(again.contains("1 already there"), "{again}");

        let server = StaticServer::start(&remote_dir);
        let pinned = publisher.public.to_str().unwrap();
        // No pinned key: refused at once, naming the flag.
        let (output, _, stderr) = build_kernel(
            &recipe,
            &dir.path().join("none"),
            &["--cache-remote", &server.url],
        );
        assert_eq!(output.status.code(), Some(2), "{}", text(&output));
        assert!(
            stderr.contains("--cache-remote-key") && stderr.contains("http://"),
            "{stderr}"
        );
        assert!(!dir.path().join("none/work/kernel").exists(), "something ran");

        let args = ["--cache-remote", &server.url, "--cache-remote-key", pinned];
        let (output, b, stderr) = build_kernel(&recipe, &dir.path().join("b"), &args);
        assert!(output.status.success(), "{}", text(&output));
        assert!(
            stderr.contains("signature verified")
                && stderr.contains("from the cache remote (sha256 verified; make not run)"),
            "{stderr}"
        );
        assert_eq!(
            (&b["key"], &b["bzimage-sha256"]),
            (&a["key"], &a["bzimage-sha256"])
        );
        assert!(
            !dir.path().join("b/work/kernel/build.log").exists(),
            "runner B ran make"
        );
        assert_eq!(tar_requests(&server).len(), 1);

        // Cut short on the remote: refused after the download, and make builds.
        let archive = remote_dir.join(format!("kernels/{key}.tar"));
        let full = std::fs::read(&archive).unwrap();
        std::fs::write(&archive, &full[..full.len() / 2]).unwrap();
        let (output, c, stderr) = build_kernel(&recipe, &dir.path().join("c"), &args);
        assert!(output.status.success(), "{}", text(&output));
        assert!(
            stderr.contains("was not used") && stderr.contains("cache miss: building kernel"),
            "{stderr}"
        );
        assert_eq!(c["bzimage-sha256"], a["bzimage-sha256"]);
        assert!(
            files_under(&dir.path().join("c/cache/tmp")).is_empty(),
            "a partial download stayed"
        );

        // A remote without the entry: a note, and a build.
        let empty = tempfile::tempdir().unwrap();
        let url = format!("file://{}", empty.path().display());
        let args = ["--cache-remote", &url, "--cache-remote-key", pinned];
        let (output, _, stderr) = build_kernel(&recipe, &dir.path().join("d"), &args);
        assert!(output.status.success(), "{}", text(&output));
        assert!(stderr.contains("not on the cache remote: kernels/"), "{stderr}");
    }

    #[test]
    fn a_trickling_remote_is_abandoned_within_the_deadline() {
        let dir = tempfile::tempdir().unwrap();
        let publisher = GpgKey::generate("publisher");
        let key = "ab".repeat(32);
        let archive = vec![7u8; 4096];
        let root = dir.path().join("remote");
        std::fs::create_dir_all(root.join("kernels")).unwrap();
        std::fs::write(root.join(remote::archive_path(remote::KERNELS, &key)), &archive).unwrap();
        let entry = remote::Entry {
            format: remote::ENTRY_FORMAT,
            area: remote::KERNELS.into(),
            key: key.clone(),
            sha256: imgbuild::io::hashing::sha256_hex(&archive),
            size: archive.len() as u64,
            describe: "a kernel that trickles".into(),
            inputs: Default::default(),
        };
        let entry_file = root.join(remote::entry_path(remote::KERNELS, &key));
        std::fs::write(&entry_file, entry.signed_bytes().unwrap()).unwrap();
        publisher.sign_file(&entry_file);
        // One byte every 100 ms, for ever (4096 bytes: 7 minutes).
        let server = TricklingServer::start(&root, Duration::from_millis(100));
        let options = FetchOptions {
            attempts: 3,
            backoff: Duration::from_millis(100),
            connect_timeout: Duration::from_secs(5),
            read_timeout: Duration::from_secs(5),
            max_bytes: None,
        };
        let trickle = Pace {
            deadline: Duration::from_secs(20),
            min_bytes: 100,
            window: Duration::from_secs(1),
        };
        // Fast enough for the rate, never done within the deadline.
        let slow = Pace {
            deadline: Duration::from_secs(2),
            min_bytes: 1,
            window: Duration::from_millis(500),
        };
        for (pace, limit) in [(trickle, Duration::from_secs(8)), (slow, Duration::from_secs(4))] {
            let trust = Trust::pinned(&publisher.public).unwrap();
            let remote = RemoteCache::parse(&server.url, "--cache-remote", trust)
                .unwrap()
                .with_fetch_options(options.clone())
                .with_pace(pace.clone());
            let cache = Cache::open(&dir.path().join("cache"))
                .unwrap()
                .with_remote(Some(remote));
            let started = Instant::now();
            let err = cache
                .remote()
                .unwrap()
                .fetch_archive(&cache, remote::KERNELS, &key, &Ui::plain())
                .unwrap_err();
            let took = started.elapsed();
            let slow = err.chain().find_map(|e| e.downcast_ref::<TooSlow>()).cloned();
            match slow {
                Some(TooSlow::Trickle { .. }) => assert_eq!(pace.min_bytes, 100, "{err:#}"),
                Some(TooSlow::Deadline(_)) => assert_eq!(pace.min_bytes, 1, "{err:#}"),
                None => panic!("not abandoned for its pace: {err:#}"),
            }
            assert!(took < limit, "{pace:?}: abandoned after {took:?}");
            assert!(
                took >= pace.window.min(pace.deadline),
                "{pace:?}: gave up at once ({took:?})"
            );
            // Through `take`, as the kernel stage asks: nothing used, nothing kept.
            let used = remote::take(&cache, remote::KERNELS, &key, &Ui::plain(), |_| Ok(()));
            assert!(used.is_none());
            assert!(files_under(&cache.root().join("blobs")).is_empty());
            assert!(files_under(&cache.root().join("tmp")).is_empty());
        }
    }
}
