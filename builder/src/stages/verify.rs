//! The `verify` stage and `imgbuild verify-kernel`: every PREEMPT_RT check on
//! the built artifact, each able to fail.

use std::path::Path;

use anyhow::{Context, Result};
use rtcheck::evidence::{Check, Evidence, check_image, id, modules_check};
use rtcheck::vermagic::{Vermagic, read_vermagic};

pub use emberrtos_contract::flavor::flavor_of_ref;
pub use emberrtos_contract::gate::{
    CommittedKernel, boot_binding_problems, decode_module, gate, gate_commit_as, gate_commit_for_ref,
    is_module_name, verify_committed_kernel,
};

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
    if let Some(arch) = evidence.arch {
        out.push_str(&format!("architecture:   {arch}\n"));
    }
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
