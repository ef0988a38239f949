//! `/var/lib/emberrtos/health.json`: per deployment (`<checksum>.<serial>`),
//! its state, tries and every check's last result, with the reason. Written
//! whole and durably on every change; a record that cannot be read is moved
//! aside (`health.json.unreadable`), never fatal: the device must still
//! judge its boot.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Result;
use serde::{Deserialize, Serialize};

use emberrtos_contract::io::root::ImageRoot;

/// The record, relative to `/var`.
pub const RECORD: &str = "lib/emberrtos/health.json";
/// Where an unreadable record is moved, relative to `/var`.
pub const UNREADABLE: &str = "lib/emberrtos/health.json.unreadable";

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum State {
    /// Booting on trial: not yet proven healthy.
    Trial,
    /// Reached healthy (on trial, or the disk's first deployment).
    Blessed,
    /// Used up its tries; GRUB booted the previous deployment and this one
    /// was removed. Never deployed again by `upgrade`.
    RolledBack,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::Trial => "trial",
            State::Blessed => "blessed",
            State::RolledBack => "rolled-back",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Outcome {
    Pass,
    Fail,
    /// Not run (not a trial boot, not an RT deployment).
    Skip,
    /// Ran and found a problem that does not fail the boot.
    Warn,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Pass => "pass",
            Outcome::Fail => "fail",
            Outcome::Skip => "skip",
            Outcome::Warn => "warn",
        }
    }
}

/// One check's result.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckResult {
    pub name: String,
    pub outcome: Outcome,
    /// Whether a failure fails the boot (required) or only warns (wanted).
    pub required: bool,
    pub detail: String,
}

/// One deployment's health.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct Entry {
    pub checksum: String,
    pub state: State,
    /// The tries the trial was given.
    pub tries: u8,
    /// Trial boots that reached the health checks.
    pub tries_checked: u8,
    /// The last boot's checks.
    pub checks: Vec<CheckResult>,
    /// Where the last latency report is kept, if one ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_report: Option<String>,
    /// Why it is in its state, in one sentence.
    pub reason: String,
    /// The kernel boot id of the boot that started the trial: until the
    /// machine reboots, the trial is pending, not a try GRUB failed to count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub begun_on_boot: Option<String>,
}

impl Entry {
    /// An entry with no tries and no checks yet.
    pub fn new(checksum: &str, state: State, reason: String) -> Entry {
        Entry {
            checksum: checksum.to_string(),
            state,
            tries: 0,
            tries_checked: 0,
            checks: Vec::new(),
            latency_report: None,
            reason,
            begun_on_boot: None,
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HealthRecord {
    /// Keyed by `<checksum>.<deploy serial>`.
    pub deployments: BTreeMap<String, Entry>,
}

impl HealthRecord {
    /// The record in `var`; an absent one is empty, a damaged one is moved
    /// to [`UNREADABLE`] (the note says so) and read as empty.
    pub fn load(var: &ImageRoot) -> Result<(HealthRecord, Option<String>)> {
        if !var.is_file(Path::new(RECORD)) {
            return Ok((HealthRecord::default(), None));
        }
        let bytes = var.read(Path::new(RECORD))?;
        match serde_json::from_slice(&bytes) {
            Ok(record) => Ok((record, None)),
            Err(e) => {
                var.rename(Path::new(RECORD), Path::new(UNREADABLE))?;
                let note = format!("/var/{RECORD} was unreadable ({e}): moved to /var/{UNREADABLE}");
                Ok((HealthRecord::default(), Some(note)))
            }
        }
    }

    /// The record for display: absent or unreadable reads as empty, and
    /// nothing is moved.
    pub fn load_readonly(var: &ImageRoot) -> HealthRecord {
        var.read(Path::new(RECORD))
            .ok()
            .and_then(|bytes| serde_json::from_slice(&bytes).ok())
            .unwrap_or_default()
    }

    pub fn store(&self, var: &ImageRoot) -> Result<()> {
        let text = serde_json::to_string_pretty(self)? + "\n";
        var.write_durable(Path::new(RECORD), text.as_bytes(), 0o644)
    }

    /// Whether `checksum` was ever rolled back on this device.
    pub fn rolled_back(&self, checksum: &str) -> Option<&Entry> {
        self.deployments
            .values()
            .find(|e| e.checksum == checksum && e.state == State::RolledBack)
    }
}

/// The failed checks of a list, as `name (detail)` joined by `; `.
pub fn failures(checks: &[CheckResult]) -> String {
    checks
        .iter()
        .filter(|c| c.outcome == Outcome::Fail && c.required)
        .map(|c| format!("{} ({})", c.name, c.detail))
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(checksum: &str, state: State) -> Entry {
        Entry {
            checksum: checksum.into(),
            state,
            tries: 2,
            tries_checked: 2,
            checks: vec![CheckResult {
                name: "40-failed-units".into(),
                outcome: Outcome::Fail,
                required: true,
                detail: "failed units: x.service".into(),
            }],
            latency_report: None,
            reason: "r".into(),
            begun_on_boot: None,
        }
    }

    #[test]
    fn the_record_round_trips_and_a_damaged_one_is_moved_aside() {
        let dir = tempfile::tempdir().unwrap();
        let var = ImageRoot::open(dir.path()).unwrap();
        assert_eq!(HealthRecord::load(&var).unwrap(), (HealthRecord::default(), None));
        let mut record = HealthRecord::default();
        record
            .deployments
            .insert("a.0".into(), entry("a", State::RolledBack));
        record
            .deployments
            .insert("b.0".into(), entry("b", State::Blessed));
        record.store(&var).unwrap();
        assert_eq!(HealthRecord::load(&var).unwrap().0, record);
        assert!(record.rolled_back("a").is_some());
        assert!(record.rolled_back("b").is_none());
        assert_eq!(
            failures(&record.deployments["a.0"].checks),
            "40-failed-units (failed units: x.service)"
        );

        std::fs::write(dir.path().join(RECORD), "{ not json").unwrap();
        let (empty, note) = HealthRecord::load(&var).unwrap();
        assert_eq!(empty, HealthRecord::default());
        assert!(note.unwrap().contains("unreadable"));
        assert_eq!(
            std::fs::read_to_string(dir.path().join(UNREADABLE)).unwrap(),
            "{ not json"
        );
        assert!(!dir.path().join(RECORD).exists());
    }
}
