//! What a release cost: which of its parts the build reused, and what a
//! device on the previous commit of the ref downloads to take it.
//!
//! Read from this run's stage reports (a stage the cache skipped reports
//! its stamp's output; its outcome says it was reused) and from the repo:
//! the download is worked out from the commits themselves.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context as _, Result};
use serde::{Deserialize, Serialize};

use crate::commands::diff::{download, walk};
use crate::ostree as ost;
use crate::stage::{Outcome, Stage, StageReport};
use emberrtos_contract::tree;
use ostree::gio::prelude::*;

/// One part of a release and whether this build reused it.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub struct Part {
    pub name: &'static str,
    pub reused: bool,
    pub detail: String,
}

/// What a device on the previous commit downloads.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub struct DeviceDownload {
    pub from: String,
    pub from_version: Option<String>,
    pub to: String,
    #[serde(flatten)]
    pub download: download::Download,
    /// The kernel files (`vmlinuz`, `initramfs.img`) are the previous
    /// commit's objects: the device keeps them and fetches no kernel.
    pub kernel_unchanged: bool,
}

#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub struct Economics {
    pub parts: Vec<Part>,
    pub kernel_builds: u32,
    /// The commit this run made, if it ran that far.
    pub commit: Option<String>,
    /// `None` when the run made no commit or the commit has no parent here.
    pub device_download: Option<DeviceDownload>,
    /// Why the download could not be worked out, when it could not: the
    /// build itself has succeeded by then, so this is said, not fatal.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub download_unknown: Option<String>,
}

/// The fields of the stage outputs read here.
#[derive(Deserialize, Default)]
#[serde(default, rename_all = "kebab-case")]
struct Output {
    cached: bool,
    build_seconds: Option<f64>,
    base_reused: bool,
    live_base_reused: bool,
    repo: Option<std::path::PathBuf>,
    checksum: Option<String>,
}

fn output_of(report: &StageReport) -> Output {
    serde_json::from_value(report.output.clone()).unwrap_or_default()
}

/// The parts this run reused or made, from its stage reports.
pub fn parts(stages: &[StageReport]) -> (Vec<Part>, u32) {
    let mut parts = Vec::new();
    let mut kernel_builds = 0;
    for report in stages {
        let out = output_of(report);
        let cached = report.outcome == Outcome::Cached;
        match report.stage {
            Stage::Kernel => {
                let reused = cached || out.cached;
                kernel_builds += u32::from(!reused);
                parts.push(Part {
                    name: "kernel",
                    reused,
                    detail: match (cached, out.cached, out.build_seconds) {
                        (true, _, _) => "up to date (its inputs did not change): 0 kernel builds".into(),
                        (false, true, _) => "from the artifact cache: 0 kernel builds".into(),
                        (false, false, Some(s)) => format!("built in {s:.0} s"),
                        (false, false, None) => "built".into(),
                    },
                });
            }
            Stage::Rootfs => parts.push(reuse("base rootfs", cached || out.base_reused)),
            Stage::Iso => parts.push(reuse("live ISO base", cached || out.live_base_reused)),
            Stage::Boot => parts.push(Part {
                name: "boot check",
                reused: cached,
                detail: if cached {
                    "the same ISO was booted before".into()
                } else {
                    "ran on this build's ISO".into()
                },
            }),
            _ => {}
        }
    }
    (parts, kernel_builds)
}

fn reuse(name: &'static str, reused: bool) -> Part {
    Part {
        name,
        reused,
        detail: if reused { "from the cache" } else { "built" }.into(),
    }
}

/// The commit this run made, from its commit stage's report.
fn committed(stages: &[StageReport]) -> Option<(std::path::PathBuf, String)> {
    let report = stages.iter().find(|r| r.stage == Stage::Commit)?;
    let out = output_of(report);
    Some((out.repo?, out.checksum?))
}

/// The release's economics: [`parts`], and the download from the commit's
/// parent (the ref's previous commit) when the repo holds it. Never fails:
/// the build has succeeded when this runs, so a parent that cannot be read
/// (another builder's, an older format) is said in `download_unknown`.
pub fn of_run(stages: &[StageReport]) -> Economics {
    let (parts, kernel_builds) = parts(stages);
    let commit = committed(stages);
    let (device_download, download_unknown) = match &commit {
        Some((repo, checksum)) => match device_download(repo, checksum) {
            Ok(download) => (download, None),
            Err(e) => (None, Some(format!("{e:#}"))),
        },
        None => (None, None),
    };
    Economics {
        parts,
        kernel_builds,
        commit: commit.map(|(_, checksum)| checksum),
        device_download,
        download_unknown,
    }
}

/// What a device on `to`'s parent downloads to get `to`.
pub fn device_download(path: &Path, to: &str) -> Result<Option<DeviceDownload>> {
    let repo = ost::open(path)?;
    let info = ost::read_commit(&repo, to)?;
    let Some(from) = info.parent else {
        return Ok(None);
    };
    if ost::resolve(&repo, &from)?.is_none() {
        return Ok(None);
    }
    let previous = ost::read_commit(&repo, &from)?;
    Ok(Some(DeviceDownload {
        download: download::download(&repo, path, &from, to)?,
        kernel_unchanged: same_kernel(&kernel_objects(&repo, &from)?, &kernel_objects(&repo, to)?),
        from_version: previous
            .metadata
            .get(crate::stages::commit::key::VERSION)
            .and_then(|v| v.as_str())
            .map(str::to_string),
        from,
        to: to.to_string(),
    }))
}

/// Both commits hold every kernel file, as the same objects. A file
/// missing on both sides is not "unchanged".
fn same_kernel(from: &[Option<String>], to: &[Option<String>]) -> bool {
    from.iter().all(Option::is_some) && from == to
}

/// The object checksums of a commit's `vmlinuz` and `initramfs.img`.
fn kernel_objects(repo: &ostree::Repo, rev: &str) -> Result<Vec<Option<String>>> {
    let info = ost::read_commit(repo, rev)?;
    let key = crate::stages::commit::key::KERNEL_RELEASE;
    let release = info
        .metadata
        .get(key)
        .and_then(|v| v.as_str())
        .with_context(|| format!("commit {rev} records no {key}"))?;
    let (root, _) = tree::commit_root(repo, rev)?;
    ["vmlinuz", "initramfs.img"]
        .iter()
        .map(|name| {
            let path = format!("usr/lib/modules/{release}/{name}");
            let file = root.resolve_relative_path(&path);
            match tree::entry_type(&file)? {
                Some(ostree::gio::FileType::Regular) => walk::object_checksum(&file, &path).map(Some),
                _ => Ok(None),
            }
        })
        .collect()
}

/// The economics as `imgbuild recipe` prints them at the end.
pub fn render(economics: &Economics) -> String {
    let mut out = String::new();
    for part in &economics.parts {
        let verdict = if part.reused { "reused" } else { "made" };
        let _ = writeln!(out, "{:<14} {verdict}: {}", part.name, part.detail);
    }
    match &economics.device_download {
        _ if economics.commit.is_none() => {}
        _ if economics.download_unknown.is_some() => {
            let why = economics.download_unknown.as_deref().unwrap_or_default();
            let _ = writeln!(out, "device download: not worked out: {}", why.escape_debug());
        }
        Some(d) => {
            let _ = writeln!(
                out,
                "device download from the previous commit {} ({}): {} bytes by {} ({:.1} % of a full pull of {} bytes); kernel files {}",
                short(&d.from),
                // The parent's metadata is not this build's: shown escaped.
                d.from_version
                    .as_deref()
                    .unwrap_or("version unknown")
                    .escape_debug(),
                d.download.bytes,
                d.download.by,
                percent(d.download.bytes, d.download.full_pull_bytes),
                d.download.full_pull_bytes,
                if d.kernel_unchanged {
                    "unchanged: no kernel download"
                } else {
                    "changed: devices download the new kernel"
                }
            );
        }
        None => {
            let _ = writeln!(
                out,
                "device download: the commit has no previous commit in this repo to compare with"
            );
        }
    }
    out
}

fn short(checksum: &str) -> &str {
    &checksum[..checksum.len().min(12)]
}

fn percent(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        100.0 * part as f64 / whole as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(stage: Stage, outcome: Outcome, output: serde_json::Value) -> StageReport {
        StageReport {
            stage,
            outcome,
            key: String::new(),
            seconds: 0.0,
            output,
        }
    }

    #[test]
    fn a_kernel_from_the_artifact_cache_is_no_build() {
        let stages = [
            report(Stage::Kernel, Outcome::Ran, serde_json::json!({"cached": true})),
            report(
                Stage::Rootfs,
                Outcome::Ran,
                serde_json::json!({"base-reused": false}),
            ),
            report(
                Stage::Iso,
                Outcome::Ran,
                serde_json::json!({"live-base-reused": true}),
            ),
            report(Stage::Boot, Outcome::Ran, serde_json::json!({})),
        ];
        let (parts, builds) = parts(&stages);
        assert_eq!(builds, 0);
        let reused: Vec<(&str, bool)> = parts.iter().map(|p| (p.name, p.reused)).collect();
        assert_eq!(
            reused,
            [
                ("kernel", true),
                ("base rootfs", false),
                ("live ISO base", true),
                ("boot check", false)
            ]
        );
        assert!(parts[0].detail.contains("0 kernel builds"), "{}", parts[0].detail);
    }

    #[test]
    fn kernel_files_missing_on_both_sides_are_not_unchanged() {
        let some = |s: &str| Some(s.to_string());
        assert!(same_kernel(&[some("a"), some("b")], &[some("a"), some("b")]));
        assert!(!same_kernel(&[some("a"), some("b")], &[some("a"), some("c")]));
        assert!(!same_kernel(&[None, None], &[None, None]));
        assert!(!same_kernel(&[some("a"), None], &[some("a"), None]));
    }

    #[test]
    fn what_the_summary_shows_of_a_parent_is_escaped() {
        let economics = Economics {
            commit: Some("c".repeat(64)),
            device_download: Some(DeviceDownload {
                from: "a".repeat(64),
                from_version: Some("1.0\u{1b}]0;pwned\u{7}".into()),
                to: "c".repeat(64),
                download: download::Download {
                    bytes: 10,
                    by: "new-objects",
                    superblock_bytes: 0,
                    full_pull_bytes: 1000,
                },
                kernel_unchanged: true,
            }),
            ..Economics::default()
        };
        let text = render(&economics);
        assert!(!text.contains('\u{1b}'), "{text}");
        assert!(text.contains("(1.0\\u{1b}]0;pwned\\u{7})"), "{text}");
        assert!(
            text.contains("10 bytes by new-objects (1.0 % of a full pull of 1000 bytes)"),
            "{text}"
        );
        let unknown = Economics {
            commit: Some("c".repeat(64)),
            download_unknown: Some("commit x records no imgbuild.kernel.release".into()),
            ..Economics::default()
        };
        assert!(render(&unknown).contains("device download: not worked out: commit x"));
    }

    #[test]
    fn a_built_kernel_counts_and_says_how_long() {
        let stages = [report(
            Stage::Kernel,
            Outcome::Ran,
            serde_json::json!({"cached": false, "build-seconds": 402.4}),
        )];
        let (parts, builds) = parts(&stages);
        assert_eq!(builds, 1);
        assert_eq!(parts[0].detail, "built in 402 s");
        assert!(!parts[0].reused);
    }

    #[test]
    fn a_cached_stage_is_reused_whatever_its_output_says() {
        let stages = [
            report(
                Stage::Kernel,
                Outcome::Cached,
                serde_json::json!({"cached": false}),
            ),
            report(Stage::Rootfs, Outcome::Cached, serde_json::json!({})),
        ];
        let (parts, builds) = parts(&stages);
        assert_eq!(builds, 0);
        assert!(parts.iter().all(|p| p.reused));
        assert!(parts[0].detail.contains("0 kernel builds"), "{}", parts[0].detail);
    }
}
