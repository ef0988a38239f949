//! The outcome of provisioning, as the device contract states it:
//! `/var/lib/emberrtos/provision.json` (written once), one
//! `EMBERRTOS-PROVISION:` line on the serial console, and on a refusal
//! `RT provisioning REFUSED: <reason>` on the console and in the login
//! banners (`/etc/motd.d` for SSH, `/etc/issue.d` for the console getty).

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use anyhow::Result;
use serde::{Deserialize, Serialize};

use super::system::System;
use emberrtos_contract::flavor::Flavor;

/// `/var/lib/emberrtos/provision.json`, relative to `/var`.
pub const RECORD: &str = "lib/emberrtos/provision.json";
/// The record's absolute path, for messages and the unit's condition.
pub const RECORD_ABSOLUTE: &str = "/var/lib/emberrtos/provision.json";
/// The message of the day shown at SSH logins (pam_motd reads `/etc/motd.d`).
pub const MOTD: &str = "etc/motd.d/50-emberrtos-provision";
/// The console login banner (agetty reads `/etc/issue.d/*.issue`).
pub const ISSUE: &str = "etc/issue.d/50-emberrtos-provision.issue";
/// The console line prefix of the outcome.
pub const CONSOLE_PREFIX: &str = "EMBERRTOS-PROVISION:";
/// The line prefix of a refused RT provisioning.
pub const REFUSED_PREFIX: &str = "RT provisioning REFUSED:";
/// The longest reason the console and the banners show (the record keeps it whole).
const MAX_SHOWN: usize = 600;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Status {
    Provisioned,
    /// RT was asked for and could not be proven: nothing was deployed.
    Refused,
    /// Anything else went wrong (a bad medium, a write that failed).
    Failed,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Provisioned => "provisioned",
            Status::Refused => "refused",
            Status::Failed => "failed",
        }
    }
}

/// `provision.json`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct Record {
    pub status: Status,
    /// The flavor the medium asked for (none when it could not be read).
    pub flavor: Option<Flavor>,
    /// What happened, in one sentence; for a refusal, the check that failed.
    pub reason: String,
    /// The commit the node boots next: the deployed one, the current one, or
    /// for a refusal the commit that was refused (when one was found).
    pub commit: Option<String>,
    /// The ref the commit came from.
    #[serde(rename = "ref")]
    pub ref_name: Option<String>,
    pub hostname: Option<String>,
}

impl Record {
    /// The one console line, e.g.
    /// `EMBERRTOS-PROVISION: provisioned flavor=rt commit=<sum>`.
    pub fn console_line(&self) -> String {
        let mut line = format!("{CONSOLE_PREFIX} {}", self.status.as_str());
        if let Some(flavor) = self.flavor {
            line.push_str(&format!(" flavor={flavor}"));
        }
        if let Some(commit) = &self.commit {
            line.push_str(&format!(" commit={commit}"));
        }
        if self.status != Status::Provisioned {
            line.push_str(&format!(" reason={}", shown(&self.reason)));
        }
        line
    }

    /// The banner line of a refusal or failure; none when provisioned.
    pub fn banner_line(&self) -> Option<String> {
        match self.status {
            Status::Provisioned => None,
            Status::Refused => Some(format!("{REFUSED_PREFIX} {}", shown(&self.reason))),
            Status::Failed => Some(format!("EmberRTOS provisioning FAILED: {}", shown(&self.reason))),
        }
    }

    /// Every line the console shows.
    pub fn console_lines(&self) -> Vec<String> {
        let mut lines = vec![self.console_line()];
        lines.extend(self.banner_line());
        lines
    }

    /// The login banner: the banner line and what it means for the node.
    pub fn banner(&self) -> Option<String> {
        let line = self.banner_line()?;
        let consequence = match self.status {
            Status::Refused => "This node stays on its current deployment and kernel; nothing was deployed.",
            _ => "This node boots as it was built.",
        };
        Some(format!("{line}\n{consequence} Details: {RECORD_ABSOLUTE}\n"))
    }
}

/// `text` on one line of printable characters, at most [`MAX_SHOWN`] of them.
pub fn shown(text: &str) -> String {
    let flat: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let words: Vec<&str> = flat.split_whitespace().collect();
    let line = words.join(" ");
    match line.char_indices().nth(MAX_SHOWN) {
        Some((cut, _)) => format!("{}…", &line[..cut]),
        None => line,
    }
}

/// An `/etc/issue` text that agetty prints as is: it expands `\x` escapes,
/// so every backslash is doubled.
pub fn issue_text(text: &str) -> String {
    text.replace('\\', "\\\\")
}

/// Writes the record, once: an existing record is never replaced.
pub fn write_record(system: &System, record: &Record) -> Result<()> {
    let json = serde_json::to_string_pretty(record)? + "\n";
    system.var.write_new(Path::new(RECORD), json.as_bytes(), 0o644)
}

/// Whether provisioning already ran on this system.
pub fn recorded(system: &System) -> Result<bool> {
    Ok(system.var.symlink_metadata(Path::new(RECORD))?.is_some())
}

/// The login banners for `record`: written for a refusal or a failure,
/// removed once the node is provisioned.
pub fn write_banners(system: &System, record: &Record) -> Result<()> {
    set_banner(system, MOTD, ISSUE, record.banner().as_deref())
}

/// Writes `text` as the SSH (`motd`) and console (`issue`) login banner,
/// or removes both when there is none.
pub fn set_banner(system: &System, motd: &str, issue: &str, text: Option<&str>) -> Result<()> {
    match text {
        Some(text) => {
            system.root.write(Path::new(motd), text.as_bytes(), 0o644)?;
            system
                .root
                .write(Path::new(issue), issue_text(text).as_bytes(), 0o644)
        }
        None => {
            system.root.remove(Path::new(motd))?;
            system.root.remove(Path::new(issue))
        }
    }
}

/// Prints `lines` on stdout (the journal) and, on the device, on
/// `/dev/console` (the serial console), whatever the unit does with stdout.
pub fn announce(system: &System, lines: &[String]) {
    for line in lines {
        println!("{line}");
    }
    if system.live {
        let console = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NOCTTY)
            .open("/dev/console");
        if let Ok(mut console) = console {
            for line in lines {
                let _ = writeln!(console, "{line}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(status: Status, reason: &str) -> Record {
        Record {
            status,
            flavor: Some(Flavor::Rt),
            reason: reason.into(),
            commit: Some("c".repeat(64)),
            ref_name: Some("emberrtos-ci/x86_64/rt".into()),
            hostname: Some("cell-07".into()),
        }
    }

    #[test]
    fn the_record_is_the_contracts_json() {
        let json = serde_json::to_value(record(Status::Refused, "verify: no")).unwrap();
        assert_eq!(json["status"], "refused");
        assert_eq!(json["flavor"], "rt");
        assert_eq!(json["reason"], "verify: no");
        assert_eq!(json["commit"], "c".repeat(64));
        assert_eq!(json["ref"], "emberrtos-ci/x86_64/rt");
        let back: Record = serde_json::from_value(json).unwrap();
        assert_eq!(back, record(Status::Refused, "verify: no"));
        let failed = Record {
            flavor: None,
            commit: None,
            ..record(Status::Failed, "x")
        };
        let json = serde_json::to_value(failed).unwrap();
        assert_eq!(json["status"], "failed");
        assert!(json["flavor"].is_null() && json["commit"].is_null());
    }

    #[test]
    fn console_lines_say_the_status_once_and_a_refusal_twice() {
        let ok = record(Status::Provisioned, "deployed");
        assert_eq!(
            ok.console_lines(),
            vec![format!(
                "EMBERRTOS-PROVISION: provisioned flavor=rt commit={}",
                "c".repeat(64)
            )]
        );
        assert!(ok.banner().is_none());
        let refused = record(
            Status::Refused,
            "verify: artifact.uts-version: not PREEMPT_RT\n  - boot.uname: missing",
        );
        let lines = refused.console_lines();
        assert_eq!(lines.len(), 2);
        assert!(lines[0].starts_with("EMBERRTOS-PROVISION: refused flavor=rt commit="));
        assert!(
            lines[0].ends_with("reason=verify: artifact.uts-version: not PREEMPT_RT - boot.uname: missing")
        );
        assert_eq!(
            lines[1],
            "RT provisioning REFUSED: verify: artifact.uts-version: not PREEMPT_RT - boot.uname: missing"
        );
        let banner = refused.banner().unwrap();
        assert!(banner.starts_with("RT provisioning REFUSED: verify: artifact.uts-version"));
        assert!(banner.contains("nothing was deployed"));
        assert!(banner.contains(RECORD_ABSOLUTE));
        assert!(
            record(Status::Failed, "bad yaml")
                .banner_line()
                .unwrap()
                .contains("FAILED: bad yaml")
        );
    }

    #[test]
    fn shown_text_is_one_bounded_line() {
        assert_eq!(shown("a\n\tb\r\x1b[31mc  d"), "a b [31mc d");
        let long = shown(&"é".repeat(2 * MAX_SHOWN));
        assert_eq!(long.chars().count(), MAX_SHOWN + 1);
        assert!(long.ends_with('…'));
        assert_eq!(issue_text("a\\l b\\\\"), "a\\\\l b\\\\\\\\");
    }
}
