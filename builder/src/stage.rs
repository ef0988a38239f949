//! The stage protocol: every pipeline stage has a cache key (the sha256 of
//! every input that can change its output, built from serialisable values)
//! and a stamp in `<work>/<stage>/stamp.json`. A stage whose key is unchanged
//! is skipped and says so; one whose key changed names the inputs that
//! changed. Stages that must always run (fetch asks the cache itself, tag is
//! a gate) report through [`record`] so every stage reports the same way.
//!
//! This module is a leaf: stages import it, it imports no stage.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context as _, Result};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::io::atomic::write_file_atomic;
use crate::io::hashing::sha256_hex;
use crate::ui::Ui;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Stage {
    Fetch,
    Kconfig,
    Kernel,
    Verify,
    Rootfs,
    Commit,
    Iso,
    Boot,
    Tag,
    Disk,
}

impl Stage {
    pub const ALL: [Stage; 10] = [
        Stage::Fetch,
        Stage::Kconfig,
        Stage::Kernel,
        Stage::Verify,
        Stage::Rootfs,
        Stage::Commit,
        Stage::Iso,
        Stage::Boot,
        Stage::Tag,
        Stage::Disk,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Stage::Fetch => "fetch",
            Stage::Kconfig => "kconfig",
            Stage::Kernel => "kernel",
            Stage::Verify => "verify",
            Stage::Rootfs => "rootfs",
            Stage::Commit => "commit",
            Stage::Iso => "iso",
            Stage::Boot => "boot",
            Stage::Tag => "tag",
            Stage::Disk => "disk",
        }
    }
}

impl fmt::Display for Stage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The named inputs of a stage; its digest is the cache key.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Key {
    pub inputs: BTreeMap<String, String>,
}

impl Key {
    pub fn new() -> Self {
        Key::default()
    }

    /// Adds a text input; long values are recorded by their hash.
    pub fn with(mut self, name: &str, value: impl AsRef<str>) -> Self {
        let value = value.as_ref();
        let recorded = if value.len() > 200 {
            format!("sha256:{}", sha256_hex(value))
        } else {
            value.to_string()
        };
        self.inputs.insert(name.to_string(), recorded);
        self
    }

    /// Adds a structured input by its canonical JSON form (never `Debug`
    /// text, which is not a stable format).
    pub fn with_value(self, name: &str, value: &impl Serialize) -> Self {
        let json = serde_json::to_string(value).expect("key inputs serialise to JSON");
        self.with(name, json)
    }

    pub fn digest(&self) -> String {
        let json = serde_json::to_string(&self.inputs).expect("a string map serialises");
        sha256_hex(json)
    }

    /// Names of the inputs that differ from `old` (added, removed or changed).
    pub fn changed_since(&self, old: &Key) -> Vec<String> {
        let mut names: Vec<String> = self
            .inputs
            .iter()
            .filter(|(k, v)| old.inputs.get(*k) != Some(v))
            .map(|(k, _)| k.clone())
            .collect();
        names.extend(
            old.inputs
                .keys()
                .filter(|k| !self.inputs.contains_key(*k))
                .cloned(),
        );
        names
    }
}

#[derive(Serialize, Deserialize)]
pub struct Stamp<T> {
    pub digest: String,
    pub key: Key,
    pub output: T,
}

pub enum Freshness<T> {
    /// The stamp matches the key: reuse its output.
    UpToDate(T),
    /// A previous run used other inputs; these changed.
    Changed(Vec<String>),
    /// No previous run (or an unreadable stamp).
    Missing,
}

fn stamp_path(stage_dir: &Path) -> PathBuf {
    stage_dir.join("stamp.json")
}

pub fn check_stamp<T: DeserializeOwned>(stage_dir: &Path, key: &Key) -> Freshness<T> {
    let Ok(text) = std::fs::read_to_string(stamp_path(stage_dir)) else {
        return Freshness::Missing;
    };
    match serde_json::from_str::<Stamp<T>>(&text) {
        Ok(stamp) if stamp.digest == key.digest() => Freshness::UpToDate(stamp.output),
        Ok(stamp) => Freshness::Changed(key.changed_since(&stamp.key)),
        Err(_) => Freshness::Missing,
    }
}

/// Writes the stamp last, after the stage's outputs are complete.
pub fn write_stamp<T: Serialize>(stage_dir: &Path, key: &Key, output: &T) -> Result<()> {
    let stamp = Stamp {
        digest: key.digest(),
        key: key.clone(),
        output,
    };
    write_file_atomic(
        &stamp_path(stage_dir),
        serde_json::to_string_pretty(&stamp)?.as_bytes(),
    )
}

/// Removes a stage's stamp so a failed rerun never leaves the old one looking current.
pub fn invalidate(stage_dir: &Path) -> Result<()> {
    match std::fs::remove_file(stamp_path(stage_dir)) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(e).with_context(|| format!("removing {}", stamp_path(stage_dir).display()))
        }
        _ => Ok(()),
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Outcome {
    Ran,
    Cached,
}

#[derive(Clone, Debug, Serialize)]
pub struct StageReport {
    pub stage: Stage,
    pub outcome: Outcome,
    pub key: String,
    pub seconds: f64,
    pub output: serde_json::Value,
}

/// Where a stage runs and reports: its directory, the progress UI, and the
/// list its report joins.
pub struct StageRun<'a> {
    pub stage: Stage,
    pub dir: PathBuf,
    pub ui: &'a Ui,
    pub reports: &'a mut Vec<StageReport>,
}

impl StageRun<'_> {
    /// Runs `body` unless the stamp is current and `present` confirms the
    /// outputs still exist; records the report either way.
    pub fn cached<T: Serialize + DeserializeOwned>(
        self,
        key: &Key,
        present: impl Fn(&T) -> bool,
        body: impl FnOnce(&Path) -> Result<T>,
    ) -> Result<T> {
        let started = Instant::now();
        let name = self.stage.name();
        let freshness = match check_stamp::<T>(&self.dir, key) {
            Freshness::UpToDate(output) if !present(&output) => {
                Freshness::Changed(vec!["outputs missing".into()])
            }
            other => other,
        };
        let (output, outcome) = match freshness {
            Freshness::UpToDate(output) => {
                self.ui.step(name, "up to date (cache key unchanged), skipped");
                (output, Outcome::Cached)
            }
            Freshness::Changed(names) => {
                self.ui
                    .step(name, format!("inputs changed: {}", names.join(", ")));
                (self.run_body(key, body)?, Outcome::Ran)
            }
            Freshness::Missing => {
                self.ui.step(name, "no previous result, running");
                (self.run_body(key, body)?, Outcome::Ran)
            }
        };
        record(self.reports, self.stage, outcome, key.digest(), started, &output)?;
        Ok(output)
    }

    fn run_body<T: Serialize>(&self, key: &Key, body: impl FnOnce(&Path) -> Result<T>) -> Result<T> {
        invalidate(&self.dir)?;
        let output = body(&self.dir).with_context(|| format!("stage `{}` failed", self.stage))?;
        write_stamp(&self.dir, key, &output)?;
        Ok(output)
    }
}

/// Records the report of a stage that runs every time (no stamp).
pub fn record<T: Serialize>(
    reports: &mut Vec<StageReport>,
    stage: Stage,
    outcome: Outcome,
    key: String,
    started: Instant,
    output: &T,
) -> Result<()> {
    reports.push(StageReport {
        stage,
        outcome,
        key,
        seconds: started.elapsed().as_secs_f64(),
        output: serde_json::to_value(output)?,
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_digest_and_changes() {
        let a = Key::new().with("source", "x").with("config", "y");
        let b = Key::new()
            .with("source", "x")
            .with("config", "z")
            .with("gcc", "12");
        assert_ne!(a.digest(), b.digest());
        assert_eq!(
            a.digest(),
            Key::new().with("config", "y").with("source", "x").digest()
        );
        assert_eq!(b.changed_since(&a), vec!["config".to_string(), "gcc".to_string()]);
        let long = Key::new().with("config", "c".repeat(300));
        assert!(long.inputs["config"].starts_with("sha256:"));
    }

    #[test]
    fn key_inputs_cannot_be_confused_by_separators() {
        // With a `name=value\n` text form these two keys had one digest.
        let a = Key::new().with("a", "1\nb=2");
        let b = Key::new().with("a", "1").with("b", "2");
        assert_ne!(a.digest(), b.digest());
    }

    #[test]
    fn structured_inputs_use_json() {
        let key = Key::new().with_value("list", &vec!["a b", "c"]);
        assert_eq!(key.inputs["list"], r#"["a b","c"]"#);
    }

    #[test]
    fn stamps() {
        let dir = tempfile::tempdir().unwrap();
        let key = Key::new().with("a", "1");
        assert!(matches!(check_stamp::<u32>(dir.path(), &key), Freshness::Missing));
        write_stamp(dir.path(), &key, &7u32).unwrap();
        assert!(matches!(
            check_stamp::<u32>(dir.path(), &key),
            Freshness::UpToDate(7)
        ));
        let changed = Key::new().with("a", "2");
        match check_stamp::<u32>(dir.path(), &changed) {
            Freshness::Changed(names) => assert_eq!(names, vec!["a".to_string()]),
            _ => panic!("expected a change"),
        }
        invalidate(dir.path()).unwrap();
        assert!(matches!(check_stamp::<u32>(dir.path(), &key), Freshness::Missing));
    }
}
