//! The `verify` stage and `imgbuild verify-kernel`: every PREEMPT_RT check on
//! the built artifact, each able to fail.

use std::io::Read;
use std::path::Path;

use anyhow::{Context, Result};
use rtcheck::evidence::{Check, Evidence, check_image, id, modules_check};
use rtcheck::vermagic::{Vermagic, read_vermagic};

use crate::error::Refused;

pub mod committed;

pub use committed::{
    CommittedKernel, boot_binding_problems, flavor_of_ref, gate_commit_as, gate_commit_for_ref,
    verify_committed_kernel,
};

/// Whether a file name is a kernel module (`.ko`, `.ko.xz`, `.ko.gz`).
pub fn is_module_name(name: &str) -> bool {
    name.ends_with(".ko") || name.ends_with(".ko.xz") || name.ends_with(".ko.gz")
}

/// A module's ELF bytes from its file bytes, decompressing `.ko.xz` and `.ko.gz`.
pub fn decode_module(name: &str, raw: Vec<u8>) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    if name.ends_with(".xz") {
        liblzma::read::XzDecoder::new(&raw[..])
            .read_to_end(&mut out)
            .with_context(|| format!("decompressing {name}"))?;
    } else if name.ends_with(".gz") {
        flate2::read::GzDecoder::new(&raw[..])
            .read_to_end(&mut out)
            .with_context(|| format!("decompressing {name}"))?;
    } else {
        out = raw;
    }
    Ok(out)
}

/// Reads a module, decompressing `.ko.xz` and `.ko.gz`.
fn read_module(path: &Path) -> Result<Vec<u8>> {
    let raw = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    decode_module(&path.to_string_lossy(), raw)
}

/// The vermagic of every module under `dir`, by path relative to it.
pub fn module_vermagics(dir: &Path) -> Result<Vec<(String, Result<Vermagic, String>)>> {
    let mut modules = Vec::new();
    for entry in walkdir::WalkDir::new(dir).sort_by_file_name() {
        let entry = entry.with_context(|| format!("walking {}", dir.display()))?;
        let name = entry.file_name().to_string_lossy();
        if !entry.file_type().is_file() || !is_module_name(&name) {
            continue;
        }
        let rel = entry
            .path()
            .strip_prefix(dir)
            .unwrap_or(entry.path())
            .display()
            .to_string();
        let vermagic = read_module(entry.path())
            .map_err(|e| e.to_string())
            .and_then(|bytes| read_vermagic(&bytes).map_err(|e| e.to_string()));
        modules.push((rel, vermagic));
    }
    Ok(modules)
}

/// Runs every artifact check on an image, its build config and its modules.
pub fn check_artifacts(image: &Path, config: Option<&Path>, modules: Option<&Path>) -> Result<Evidence> {
    let bytes = std::fs::read(image).with_context(|| format!("reading kernel image {}", image.display()))?;
    let config_text = config
        .map(|c| std::fs::read_to_string(c).with_context(|| format!("reading config {}", c.display())))
        .transpose()?;
    let mut evidence = check_image(&bytes, config_text.as_deref());
    if let Some(dir) = modules {
        let vermagics = module_vermagics(dir)?;
        evidence.record(modules_check(evidence.release.as_deref(), &vermagics));
    }
    Ok(evidence)
}

/// The config check from the kconfig stage's result.
pub fn config_check(requested: usize, preempt_rt: bool) -> Check {
    if preempt_rt {
        Check::pass(
            id::CONFIG,
            format!("all {requested} requested symbols hold; CONFIG_PREEMPT_RT=y"),
        )
    } else {
        Check::fail(id::CONFIG, "CONFIG_PREEMPT_RT=y is not in the final .config")
    }
}

/// Human-readable evidence.
pub fn render(evidence: &Evidence) -> String {
    let mut out = String::new();
    if let Some(release) = &evidence.release {
        out.push_str(&format!("kernel release: {release}\n"));
    }
    if let Some(uts) = &evidence.uts_version {
        out.push_str(&format!("UTS_VERSION:    {uts}\n"));
    }
    for check in &evidence.checks {
        out.push_str(&format!("{check}\n"));
    }
    let verdict = if evidence.failures().next().is_none() {
        "PREEMPT_RT: yes"
    } else {
        "PREEMPT_RT: NO"
    };
    out.push_str(verdict);
    out.push('\n');
    out
}

/// Refuses unless every check in `required` passed and none failed.
pub fn gate<I: AsRef<str>>(stage: &str, evidence: &Evidence, required: &[I]) -> Result<(), Refused> {
    if evidence.all_passed(required) {
        return Ok(());
    }
    let mut reasons: Vec<String> = evidence
        .failures()
        .map(|c| format!("{}: {}", c.id, c.detail))
        .collect();
    for id in required.iter().map(AsRef::as_ref) {
        match evidence.get(id) {
            None => reasons.push(format!("{id}: check did not run")),
            Some(c) if c.status == rtcheck::Status::Skip => {
                reasons.push(format!("{id}: skipped ({})", c.detail))
            }
            _ => {}
        }
    }
    Err(Refused {
        stage: stage.to_string(),
        summary: "the kernel is not proven PREEMPT_RT".into(),
        reasons,
    })
}
