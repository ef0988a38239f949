//! The `kconfig` stage: base config, fragments merged in order, `olddefconfig`,
//! then the fail-closed diff of every requested symbol against the result.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use rtcheck::kconfig::{Config, MergedFragments, Outcome, Redefinition, SymbolDiff, diff, merge_fragments};
use serde::{Deserialize, Serialize};

use super::{MakeEnv, SourceTree, deps};
use crate::io::atomic::write_file_atomic;
use crate::io::hashing::sha256_hex;
use crate::recipe::{ConfigBase, Flavor, Recipe, syntax};
use crate::tool;
use crate::ui::Ui;
use emberrtos_contract::error::Refused;

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct KconfigOutput {
    /// The out-of-tree build dir holding this `.config`.
    pub build_dir: PathBuf,
    /// A copy of the final `.config` in the stage dir.
    pub config: PathBuf,
    pub config_sha256: String,
    pub requested: usize,
    /// Symbols dropped or changed but listed in `allow-dropped`.
    pub allowed: Vec<SymbolDiff>,
    pub redefinitions: Vec<Redefinition>,
    pub preempt_rt: bool,
}

/// Reads the fragments of a recipe as `(name as written, text)`.
pub fn read_fragments(recipe: &Recipe) -> Result<Vec<(String, String)>> {
    recipe
        .fragment_names()
        .map(|(name, path)| {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading fragment {}", path.display()))?;
            Ok((name.to_string(), text))
        })
        .collect()
}

/// The symbols whose final value is not the requested one, minus those the
/// recipe allows to drop (never PREEMPT_RT for an `rt` recipe).
pub fn split_problems(
    diffs: Vec<SymbolDiff>,
    allow_dropped: &[String],
    flavor: Flavor,
) -> (Vec<SymbolDiff>, Vec<SymbolDiff>) {
    diffs
        .into_iter()
        .filter(|d| d.outcome != Outcome::Kept)
        .partition(|d| {
            let protected = flavor == Flavor::Rt && d.request.symbol == "CONFIG_PREEMPT_RT";
            protected || !allow_dropped.contains(&d.request.symbol)
        })
}

/// `kernel.base` as a make argument: only a config target such as
/// `x86_64_defconfig`, never something make would read as an option
/// (`-Iconfig`) or a variable assignment.
fn make_config_target(target: &str) -> Result<&str> {
    if !syntax::is_make_config_target(target) {
        bail!(
            "kernel.base {target:?} is not a make config target (`[A-Za-z0-9_-]+config`, not starting with `-`)"
        );
    }
    Ok(target)
}

/// Runs the stage. Refuses (exit 3) when Kconfig dropped or changed any
/// requested symbol, naming its fragment:line, final value and, when the
/// Kconfig files tell, the unmet dependency.
pub fn configure(
    recipe: &Recipe,
    source: &SourceTree,
    build_dir: &Path,
    make_env: &MakeEnv,
    stage_dir: &Path,
    ui: &Ui,
) -> Result<KconfigOutput> {
    std::fs::create_dir_all(build_dir).with_context(|| format!("creating {}", build_dir.display()))?;
    let log = stage_dir.join("kconfig.log");
    let _ = std::fs::remove_file(&log);
    let dot_config = build_dir.join(".config");
    match &recipe.kernel.base {
        ConfigBase::Target(target) => {
            let target = make_config_target(target)?;
            ui.note(format!("make {target}"));
            tool::run_logged(make_env.make(source, build_dir)?.arg(target), &log, |_| {})
                .with_context(|| format!("generating the base config with `make {target}`"))?;
        }
        ConfigBase::File(path) => {
            std::fs::copy(path, &dot_config).with_context(|| {
                format!(
                    "copying base config {} to {}",
                    path.display(),
                    dot_config.display()
                )
            })?;
        }
    }
    let fragments = read_fragments(recipe)?;
    let merged: MergedFragments = merge_fragments(fragments.iter().map(|(n, t)| (n.as_str(), t.as_str())))?;
    for r in &merged.redefinitions {
        ui.note(format!(
            "note: {} set at {} is redefined at {} (later wins: {})",
            r.symbol,
            r.earlier.origin,
            r.later.origin,
            r.later.value.config_line(&r.symbol)
        ));
    }
    let base_text =
        std::fs::read_to_string(&dot_config).with_context(|| format!("reading {}", dot_config.display()))?;
    write_file_atomic(&dot_config, merged.apply_to(&base_text).as_bytes())?;
    ui.note(format!(
        "merged {} fragments ({} symbols), make olddefconfig",
        fragments.len(),
        merged.requests.len()
    ));
    tool::run_logged(
        make_env.make(source, build_dir)?.arg("olddefconfig"),
        &log,
        |_| {},
    )
    .context("resolving the config with `make olddefconfig`")?;

    let final_text = std::fs::read_to_string(&dot_config)?;
    let final_config = Config::parse(&final_text).context("parsing the final .config")?;
    let diffs = diff(&merged, &final_config);
    let requested = diffs.len();
    let (problems, allowed) = split_problems(diffs, &recipe.kernel.allow_dropped, recipe.flavor);
    for d in &allowed {
        ui.warn(format!("allowed by kernel.allow-dropped: {d}"));
    }
    let report = serde_json::json!({ "problems": problems, "allowed": allowed, "redefinitions": merged.redefinitions });
    write_file_atomic(
        &stage_dir.join("report.json"),
        serde_json::to_string_pretty(&report)?.as_bytes(),
    )?;

    let mut reasons: Vec<String> = problems.iter().map(ToString::to_string).collect();
    if recipe.flavor == Flavor::Rt
        && !final_config.is_preempt_rt()
        && !problems.iter().any(|p| p.request.symbol == "CONFIG_PREEMPT_RT")
    {
        reasons.push("CONFIG_PREEMPT_RT=y is missing from the final .config".into());
    }
    if !reasons.is_empty() {
        let read = |p: &Path| std::fs::read_to_string(p).ok();
        for (reason, problem) in reasons.iter_mut().zip(&problems) {
            let symbol = problem.request.symbol.trim_start_matches("CONFIG_");
            let definitions = deps::find_definitions(&source.root, recipe.arch.kbuild(), symbol, &read);
            if definitions.is_empty() {
                reason.push_str(&format!("; {symbol} is not defined in this kernel's Kconfig"));
            } else if let Some(why) = deps::explain(&definitions, symbol, &final_config) {
                reason.push_str(&format!("; {why}"));
            }
        }
        return Err(Refused {
            stage: "kconfig".into(),
            summary: format!(
                "Kconfig dropped or changed {} of {requested} requested symbols (final config: {})",
                problems.len().max(1),
                dot_config.display()
            ),
            reasons,
        }
        .into());
    }

    let config = stage_dir.join("config");
    write_file_atomic(&config, final_text.as_bytes())?;
    ui.note(format!(
        "all {requested} requested symbols hold after olddefconfig"
    ));
    Ok(KconfigOutput {
        build_dir: build_dir.to_path_buf(),
        config,
        config_sha256: sha256_hex(&final_text),
        requested,
        allowed,
        redefinitions: merged.redefinitions,
        preempt_rt: final_config.is_preempt_rt(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_config_targets_reach_make() {
        assert_eq!(
            make_config_target("x86_64_defconfig").unwrap(),
            "x86_64_defconfig"
        );
        assert_eq!(make_config_target("tinyconfig").unwrap(), "tinyconfig");
        for bad in [
            "-Iconfig",
            "--eval=x config",
            "O=/tmp/config",
            "my.config",
            "config",
        ] {
            assert!(make_config_target(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn preempt_rt_cannot_be_allowed_to_drop_in_rt() {
        let merged = merge_fragments([("rt.config", "CONFIG_PREEMPT_RT=y\nCONFIG_E1000E=y\n")]).unwrap();
        let final_config = Config::parse("# CONFIG_PREEMPT_RT is not set\n").unwrap();
        let allow = vec!["CONFIG_PREEMPT_RT".to_string(), "CONFIG_E1000E".to_string()];
        let (problems, allowed) = split_problems(diff(&merged, &final_config), &allow, Flavor::Rt);
        assert_eq!(problems.len(), 1);
        assert_eq!(problems[0].request.symbol, "CONFIG_PREEMPT_RT");
        assert_eq!(allowed[0].request.symbol, "CONFIG_E1000E");
        let (problems, _) = split_problems(diff(&merged, &final_config), &allow, Flavor::Standard);
        assert!(problems.is_empty());
    }
}
