//! The kernel tier: the real 6.12 Kconfig (olddefconfig only, no build), and
//! the PREEMPT_RT checks on real Debian kernels and crafted images.

mod common;

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

#[test]
fn debian_rt_kernel_passes() {
    let rt = debian_kernel("rt");
    let out = imgbuild()
        .args(["--json", "verify-kernel"])
        .arg(rt.join("vmlinuz"))
        .arg("--config")
        .arg(rt.join("config"))
        .arg("--modules")
        .arg(&rt)
        .assert()
        .code(0);
    let doc: serde_json::Value = serde_json::from_slice(&out.get_output().stdout).unwrap();
    assert_eq!(doc["preempt-rt"], true);
    let status = |id: &str| {
        doc["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["id"] == id)
            .unwrap()["status"]
            .clone()
    };
    assert_eq!(status("artifact.uts-version"), "pass");
    assert_eq!(status("artifact.build-config"), "pass");
    assert_eq!(status("artifact.modules"), "pass");
    assert!(doc["uts_version"].as_str().unwrap().contains("SMP PREEMPT_RT"));
}

#[test]
fn debian_generic_kernel_is_refused() {
    let cloud = debian_kernel("cloud");
    imgbuild()
        .arg("verify-kernel")
        .arg(cloud.join("vmlinuz"))
        .arg("--config")
        .arg(cloud.join("config"))
        .arg("--modules")
        .arg(&cloud)
        .assert()
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
