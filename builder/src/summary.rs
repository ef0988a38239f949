//! The closing summary of `imgbuild recipe`: what each stage built or
//! reused and how long it took, the artifacts with their paths and sizes,
//! the ref and commit, and the commands a user runs next. Pure, from the
//! run's [`PipelineReport`]; the same in `--json` (`summary`).

use std::fmt::Write as _;

use serde::Serialize;
use serde_json::Value;

use crate::pipeline::PipelineReport;

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct Summary {
    pub stages: Vec<StageLine>,
    pub artifacts: Vec<Artifact>,
    #[serde(rename = "ref", skip_serializing_if = "Option::is_none")]
    pub ref_name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
    /// What a user runs next, in order.
    pub next: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct StageLine {
    pub stage: String,
    /// `ran`, `cached`, …, as the stage reported.
    pub outcome: String,
    pub seconds: f64,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct Artifact {
    pub kind: String,
    pub path: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
}

/// The summary of `report`'s run (pure).
pub fn of(report: &PipelineReport) -> Summary {
    let mut summary = Summary::default();
    for stage in &report.stages {
        summary.stages.push(StageLine {
            stage: stage.stage.to_string(),
            outcome: text(&serde_json::to_value(stage.outcome).unwrap_or_default()),
            seconds: stage.seconds,
        });
        collect(&stage.stage.to_string(), &stage.output, &mut summary);
    }
    summary.next = next_commands(&summary);
    summary
}

fn text(value: &Value) -> String {
    value.as_str().map_or_else(|| value.to_string(), str::to_string)
}

fn artifact(kind: &str, path: &Value, bytes: &Value) -> Option<Artifact> {
    Some(Artifact {
        kind: kind.into(),
        path: path.as_str()?.to_string(),
        bytes: bytes.as_u64(),
    })
}

/// The artifacts, ref and commit one stage's output names.
fn collect(stage: &str, output: &Value, summary: &mut Summary) {
    let found: Vec<Option<Artifact>> = match stage {
        "kernel" => vec![artifact("kernel", &output["bzimage"], &Value::Null)],
        "commit" => {
            summary.commit = output["checksum"].as_str().map(str::to_string);
            vec![artifact("ostree repo", &output["repo"], &Value::Null)]
        }
        "iso" => vec![
            artifact("live ISO", &output["iso"], &output["iso-bytes"]),
            artifact("live ISO SBOM", &output["sbom"], &Value::Null),
        ],
        "tag" => {
            summary.ref_name = output["ref-name"].as_str().map(str::to_string);
            summary.commit = output["commit"]
                .as_str()
                .map(str::to_string)
                .or(summary.commit.take());
            vec![]
        }
        "disk" => output["images"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|image| {
                artifact(
                    &format!("disk image ({})", text(&image["format"])),
                    &image["path"],
                    &image["bytes"],
                )
            })
            .collect(),
        _ => vec![],
    };
    summary.artifacts.extend(found.into_iter().flatten());
}

fn path_of<'a>(summary: &'a Summary, kind: &str) -> Option<&'a str> {
    summary
        .artifacts
        .iter()
        .find(|a| a.kind.starts_with(kind))
        .map(|a| a.path.as_str())
}

/// The next commands, with this run's paths filled in.
fn next_commands(summary: &Summary) -> Vec<String> {
    let mut next = Vec::new();
    if let Some(disk) = path_of(summary, "disk image") {
        next.push(format!(
            "imgbuild vm {disk} --uefi   # boot the installed OS in QEMU"
        ));
        if disk.ends_with(".img") || disk.ends_with(".raw") {
            next.push(format!(
                "dd if={disk} of=/dev/sdX bs=4M conv=fsync   # install a machine"
            ));
        }
    }
    if let Some(iso) = path_of(summary, "live ISO") {
        next.push(format!(
            "dd if={iso} of=/dev/sdX bs=4M conv=fsync   # boot a candidate machine from the live ISO"
        ));
    }
    if let (Some(repo), Some(ref_name)) = (path_of(summary, "ostree repo"), &summary.ref_name) {
        let iso = path_of(summary, "live ISO").map_or(String::new(), |iso| format!(" --live-iso {iso}"));
        next.push(format!(
            "imgbuild qualify root@MACHINE --known-hosts FILE -i KEY --repo {repo} --ref {ref_name} --gpg-key KEYID{iso}"
        ));
        next.push(format!(
            "imgbuild publish --repo {repo} --to file:///srv/ostree --ref {ref_name} --gpg-key KEYID"
        ));
    }
    next
}

/// The summary as the run's last lines.
pub fn render(summary: &Summary) -> String {
    let mut out = String::from("summary:\n");
    for line in &summary.stages {
        let _ = writeln!(
            out,
            "  {:<8} {:<10} {:>8.1} s",
            line.stage, line.outcome, line.seconds
        );
    }
    if let (Some(ref_name), Some(commit)) = (&summary.ref_name, &summary.commit) {
        let _ = writeln!(out, "  {ref_name} -> {commit}");
    } else if let Some(commit) = &summary.commit {
        let _ = writeln!(out, "  commit {commit} (no ref moved)");
    }
    for artifact in &summary.artifacts {
        let size = artifact
            .bytes
            .map_or(String::new(), |b| format!(" ({} MiB)", b >> 20));
        let _ = writeln!(out, "  {}: {}{size}", artifact.kind, artifact.path);
    }
    if !summary.next.is_empty() {
        out.push_str("next:\n");
        for command in &summary.next {
            let _ = writeln!(out, "  {command}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stage::{Outcome, Stage, StageReport};

    fn stage(stage: Stage, output: Value) -> StageReport {
        StageReport {
            stage,
            outcome: Outcome::Ran,
            key: String::new(),
            seconds: 1.5,
            output,
        }
    }

    #[test]
    fn the_summary_names_each_artifact_the_ref_and_what_to_run_next() {
        let report = PipelineReport {
            stages: vec![
                stage(
                    Stage::Commit,
                    serde_json::json!({"checksum": "c0ffee", "repo": "/w/repo"}),
                ),
                stage(
                    Stage::Iso,
                    serde_json::json!({"iso": "/w/live.iso", "iso-bytes": 62_836_736u64}),
                ),
                stage(
                    Stage::Tag,
                    serde_json::json!({"ref-name": "emberrtos/x86_64/rt", "commit": "c0ffee"}),
                ),
                stage(
                    Stage::Disk,
                    serde_json::json!({"images": [{"format": "raw", "path": "/w/disk.img", "bytes": 8u64 << 30}]}),
                ),
            ],
            ..PipelineReport::default()
        };
        let summary = of(&report);
        assert_eq!(summary.ref_name.as_deref(), Some("emberrtos/x86_64/rt"));
        assert_eq!(summary.commit.as_deref(), Some("c0ffee"));
        assert_eq!(summary.stages.len(), 4);
        let kinds: Vec<&str> = summary.artifacts.iter().map(|a| a.kind.as_str()).collect();
        assert_eq!(kinds, ["ostree repo", "live ISO", "disk image (raw)"]);
        let text = render(&summary);
        assert!(text.contains("emberrtos/x86_64/rt -> c0ffee"), "{text}");
        assert!(text.contains("live ISO: /w/live.iso (59 MiB)"), "{text}");
        assert!(text.contains("imgbuild vm /w/disk.img --uefi"), "{text}");
        assert!(text.contains("dd if=/w/disk.img of=/dev/sdX"), "{text}");
        assert!(
            text.contains("--repo /w/repo --ref emberrtos/x86_64/rt --gpg-key KEYID --live-iso /w/live.iso"),
            "{text}"
        );
        let json = serde_json::to_value(&summary).unwrap();
        assert_eq!(json["ref"], "emberrtos/x86_64/rt");
        assert_eq!(json["artifacts"][2]["bytes"], 8u64 << 30);
    }

    #[test]
    fn a_run_stopped_early_suggests_nothing_it_did_not_make() {
        let report = PipelineReport {
            stages: vec![stage(Stage::Kernel, serde_json::json!({"bzimage": "/c/bzImage"}))],
            ..PipelineReport::default()
        };
        let summary = of(&report);
        assert_eq!(summary.ref_name, None);
        assert!(summary.next.is_empty(), "{:?}", summary.next);
        assert_eq!(summary.artifacts[0].kind, "kernel");
    }
}
