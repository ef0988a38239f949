//! The `boot` stage and `imgbuild boot`: boots the live ISO in QEMU with the
//! serial console captured, reads the booted kernel's `uname -v` and config
//! from it, optionally runs jitter, and turns that into boot evidence.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use rtcheck::Evidence;
use rtreport::report::Report as JitterReport;
use serde::{Deserialize, Serialize};

pub use crate::io::qemu::Accel;
use crate::io::qemu::{self, Board, Guest};
use crate::tool;
use crate::ui::Ui;

pub const KERNEL_BEGIN: &str = "===IMGBUILD-KERNEL-BEGIN===";
pub const KERNEL_END: &str = "===IMGBUILD-KERNEL-END===";
pub const JITTER_BEGIN: &str = "===JITTER-REPORT-BEGIN===";
pub const JITTER_END: &str = "===JITTER-REPORT-END===";
pub const CHECK_DONE: &str = "===IMGBUILD-CHECK-DONE===";
/// The first line of the live image's banner.
pub const BANNER: &str = "EmberRTOS live validation image";

#[derive(Clone, Debug)]
pub struct BootOptions {
    pub accel: Accel,
    pub timeout: Duration,
    /// Run jitter for this many seconds.
    pub jitter: Option<u64>,
    pub uefi: bool,
    /// The guest's vCPUs: see [`cpus_for_kargs`].
    pub cpus: u32,
}

/// The vCPUs a boot check needs for these kernel arguments: one more than
/// the highest CPU `isolcpus`, `nohz_full` or `rcu_nocbs` names, so jitter
/// measures on the recipe's RT CPUs as on the target machine; at least 2.
pub fn cpus_for_kargs(kargs: &[String]) -> u32 {
    let highest = kargs
        .iter()
        .filter_map(|karg| karg.split_once('='))
        .filter(|(name, _)| matches!(*name, "isolcpus" | "nohz_full" | "rcu_nocbs"))
        .flat_map(|(_, list)| list.split([',', '-', ':', '/']))
        .filter_map(|word| word.parse::<u32>().ok())
        .max();
    highest.map_or(2, |cpu| cpu.saturating_add(1).clamp(2, 64))
}

/// The jitter report as printed between the markers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "state")]
pub enum JitterOutcome {
    Complete {
        exit: Option<i32>,
        report: Box<JitterReport>,
    },
    /// The markers or the JSON are incomplete (the guest died or timed out).
    Truncated { reason: String },
    /// Complete JSON that is not a `jitter-report/1` or `/2` (another schema, or
    /// fields this build does not know).
    Unreadable { reason: String },
}

/// What the console showed.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct ConsoleReport {
    pub release: Option<String>,
    pub uname_v: Option<String>,
    /// `CONFIG_*` lines from `/proc/config.gz`, or `None` when it is absent.
    pub config: Option<Vec<String>>,
    pub banner: bool,
    pub check_done: bool,
    pub jitter: Option<JitterOutcome>,
    /// jitter's own error line on the console (`jitter: error: …`), when
    /// it failed: the cause of a missing or truncated report.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jitter_error: Option<String>,
}

/// Parses the serial console log (pure). Kernel messages may interleave, so
/// only lines inside the markers are read.
pub fn parse_console(text: &str) -> ConsoleReport {
    let text = text.replace('\r', "");
    let mut report = ConsoleReport {
        banner: text.contains(BANNER),
        check_done: text.contains(CHECK_DONE),
        ..ConsoleReport::default()
    };
    if let Some(section) = between(&text, KERNEL_BEGIN, KERNEL_END) {
        let mut config = Vec::new();
        let mut absent = false;
        for line in section.lines() {
            if let Some(v) = line.strip_prefix("release: ") {
                report.release = Some(v.trim().to_string());
            } else if let Some(v) = line.strip_prefix("uname-v: ") {
                report.uname_v = Some(v.trim().to_string());
            } else if let Some(v) = line.strip_prefix("config: ") {
                if v.trim() == "absent" {
                    absent = true;
                } else {
                    config.push(v.trim().to_string());
                }
            }
        }
        report.config = (!absent).then_some(config);
    }
    report.jitter_error = text
        .lines()
        .find(|line| line.trim_start().starts_with("jitter: error:"))
        .map(|line| crate::io::clean(line.trim()));
    if let Some(start) = text.find(JITTER_BEGIN) {
        let after = &text[start + JITTER_BEGIN.len()..];
        report.jitter = Some(match after.find(JITTER_END) {
            None => JitterOutcome::Truncated {
                reason: "the report's end marker never came".into(),
            },
            Some(end) => {
                let body = &after[..end];
                let exit = after[end + JITTER_END.len()..]
                    .lines()
                    .next()
                    .and_then(|l| l.trim().strip_prefix("exit="))
                    .and_then(|n| n.trim().parse().ok());
                let json = body.find('{').map(|open| &body[open..]).unwrap_or_default();
                jitter_outcome(json.trim(), exit)
            }
        });
    }
    report
}

/// The report between the markers, read through the shared jitter types.
fn jitter_outcome(json: &str, exit: Option<i32>) -> JitterOutcome {
    match serde_json::from_str::<JitterReport>(json) {
        Ok(report) => JitterOutcome::Complete {
            exit,
            report: Box::new(report),
        },
        Err(e) if e.is_data() => JitterOutcome::Unreadable {
            reason: format!("the jitter report is not one this build reads: {e}"),
        },
        Err(e) => JitterOutcome::Truncated {
            reason: format!("the JSON report does not parse: {e}"),
        },
    }
}

fn between<'a>(text: &'a str, begin: &str, end: &str) -> Option<&'a str> {
    let start = text.find(begin)? + begin.len();
    let stop = text[start..].find(end)? + start;
    Some(&text[start..stop])
}

/// Boot evidence from the console: the booted kernel's UTS_VERSION and config.
pub fn evidence(console: &ConsoleReport) -> Evidence {
    match &console.uname_v {
        Some(uname) => {
            let config = console.config.as_ref().map(|lines| lines.join("\n") + "\n");
            let mut evidence = rtcheck::evidence::check_running_kernel(uname, config.as_deref());
            evidence.release = console.release.clone();
            evidence
        }
        None => {
            let mut evidence = Evidence::default();
            let missing = "the guest never printed the kernel evidence on the console";
            evidence.record(rtcheck::Check::fail(rtcheck::evidence::id::BOOT_UNAME, missing));
            evidence.record(rtcheck::Check::fail(rtcheck::evidence::id::BOOT_CONFIG, missing));
            evidence
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct BootOutput {
    pub iso_sha256: String,
    pub accel: Accel,
    pub firmware: String,
    pub console_log: PathBuf,
    pub evidence: Evidence,
    pub seconds_to_banner: Option<f64>,
    pub seconds_total: f64,
    pub console: ConsoleReport,
    /// Latency figures are functional only under emulation.
    pub functional_only: bool,
}

/// The QEMU command line (pure). `vars`: UEFI with this copy of the
/// firmware's variables, else the board's BIOS.
pub fn qemu_args(
    iso: &Path,
    console_log: &Path,
    board: &Board,
    options: &BootOptions,
    vars: Option<&Path>,
) -> Result<Vec<String>> {
    let mut args = board.accel_args(options.accel)?;
    if let Some(vars) = vars {
        args.extend(board.machine_args(false));
        args.extend(board.pflash_args(vars));
    }
    args.extend([
        "-m".into(),
        "1536".into(),
        "-smp".into(),
        options.cpus.to_string(),
        "-display".into(),
        "none".into(),
        "-monitor".into(),
        "none".into(),
        "-no-reboot".into(),
        "-serial".into(),
        format!(
            "file:{}",
            std::path::absolute(console_log)
                .unwrap_or_else(|_| console_log.to_path_buf())
                .display()
        ),
    ]);
    args.extend(cdrom_args(iso, board));
    args.extend([
        "-netdev".into(),
        // The guest needs DHCP only: it reaches neither the outside nor the host.
        "user,id=n0,restrict=on".into(),
        "-device".into(),
        "virtio-net-pci,netdev=n0".into(),
    ]);
    let extra = match options.jitter {
        Some(seconds) => format!("jitter.auto={seconds}"),
        None => "imgbuild.check".to_string(),
    };
    args.extend(["-smbios".into(), format!("type=11,value=imgbuild:{extra}")]);
    Ok(args)
}

/// The ISO as a CD: the PC's IDE drive, or a SCSI CD on virtio on boards
/// without IDE (the firmware reads it; the kernel needs no driver for it,
/// the live system being in its initramfs).
fn cdrom_args(iso: &Path, board: &Board) -> Vec<String> {
    if board.has_bios {
        // Absolute: a name like `nbd:…` is never read as a protocol. A
        // plain value, not an option list: commas stay as they are.
        let iso = std::path::absolute(iso).unwrap_or_else(|_| iso.to_path_buf());
        return vec!["-cdrom".into(), iso.display().to_string()];
    }
    vec![
        "-drive".into(),
        format!(
            "if=none,id=cd,format=raw,media=cdrom,readonly=on,file={}",
            qemu::escape(iso)
        ),
        "-device".into(),
        "virtio-scsi-pci".into(),
        "-device".into(),
        "scsi-cd,drive=cd".into(),
    ]
}

fn tail(text: &str, lines: usize) -> String {
    tool::tail_lines(&text.replace('\r', ""), lines)
}

/// Boots `iso` and returns the evidence; the console goes to `console_log`.
pub fn boot(
    iso: &Path,
    iso_sha256: &str,
    board: &Board,
    options: &BootOptions,
    console_log: &Path,
    ui: &Ui,
) -> Result<BootOutput> {
    tool::require(board.qemu)?;
    let workdir = tempfile::tempdir().context("creating a temp dir for the firmware variables")?;
    let uefi = board.uses_uefi(options.uefi);
    let vars = uefi.then(|| board.copy_vars(workdir.path())).transpose()?;
    let _ = std::fs::remove_file(console_log);
    std::fs::write(console_log, b"")?;
    let args = qemu_args(iso, console_log, board, options, vars.as_deref())?;
    let qemu_log = console_log.with_extension("qemu.log");
    let started = Instant::now();
    let mut guest = Guest::spawn(board, &args, &qemu_log, &qemu_log.with_extension("stderr"))?;
    ui.note(format!(
        "{} {} (console: {})",
        board.qemu,
        args.join(" "),
        console_log.display()
    ));
    let spinner = ui.spinner("booting");
    let mut seconds_to_banner = None;
    let mut seen_lines = 0;
    let status = loop {
        let text = std::fs::read_to_string(console_log).unwrap_or_default();
        let lines = text.lines().count();
        if lines != seen_lines {
            seen_lines = lines;
            if let Some(last) = text.lines().rev().find(|l| !l.trim().is_empty()) {
                spinner.set_message(last.chars().take(70).collect::<String>());
            }
        }
        if seconds_to_banner.is_none() && text.contains(BANNER) {
            seconds_to_banner = Some(started.elapsed().as_secs_f64());
        }
        if let Some(status) = guest.try_wait()? {
            break status;
        }
        if started.elapsed() > options.timeout {
            spinner.finish_and_clear();
            bail!(
                "the guest did not finish within {} s; last console lines ({}):\n{}",
                options.timeout.as_secs(),
                console_log.display(),
                tail(&text, 25)
            );
        }
        std::thread::sleep(Duration::from_millis(250));
    };
    spinner.finish_and_clear();
    drop(guest);
    let text = std::fs::read_to_string(console_log).unwrap_or_default();
    let console = parse_console(&text);
    if !status.success() {
        let stderr = std::fs::read_to_string(qemu_log.with_extension("stderr")).unwrap_or_default();
        bail!(
            "QEMU exited with {status}: {}\nlast console lines ({}):\n{}",
            stderr.trim(),
            console_log.display(),
            tail(&text, 25)
        );
    }
    let finished = if options.jitter.is_some() {
        console.jitter.is_some()
    } else {
        console.check_done
    };
    if console.uname_v.is_none() || !finished {
        bail!(
            "the guest powered off before reporting; last console lines ({}):\n{}",
            console_log.display(),
            tail(&text, 25)
        );
    }
    let mut evidence = evidence(&console);
    // The gate checks that this evidence belongs to the build's own ISO.
    evidence.medium_sha256 = Some(iso_sha256.to_string());
    Ok(BootOutput {
        iso_sha256: iso_sha256.to_string(),
        accel: options.accel,
        firmware: if uefi { "uefi".into() } else { "bios".into() },
        console_log: console_log.to_path_buf(),
        evidence,
        seconds_to_banner,
        seconds_total: started.elapsed().as_secs_f64(),
        console,
        functional_only: options.accel == Accel::Tcg,
    })
}

/// Human summary of a boot.
pub fn render(output: &BootOutput) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "booted {} ({}, {:?})",
        output.console.release.as_deref().unwrap_or("?"),
        output.firmware,
        output.accel
    );
    let _ = writeln!(
        out,
        "uname -v: {}",
        output.console.uname_v.as_deref().unwrap_or("?")
    );
    for check in &output.evidence.checks {
        let _ = writeln!(out, "{check}");
    }
    if let Some(s) = output.seconds_to_banner {
        let _ = writeln!(
            out,
            "banner after {s:.1} s; guest done after {:.1} s",
            output.seconds_total
        );
    }
    match &output.console.jitter {
        Some(JitterOutcome::Complete { exit, report }) => {
            let assessment = &report.assessment;
            let _ = writeln!(
                out,
                "jitter: {} (exit {}), worst case {} us",
                assessment.verdict,
                exit.map_or("?".into(), |e| e.to_string()),
                assessment.worst_us
            );
            for reason in &assessment.reasons {
                let _ = writeln!(out, "  - {}: {}", reason.code, reason.detail);
            }
            if output.functional_only {
                let _ = writeln!(
                    out,
                    "note: under TCG emulation latency figures are functional only; INVALID (hypervisor) is expected"
                );
            }
        }
        Some(JitterOutcome::Truncated { reason }) => match &output.console.jitter_error {
            Some(error) => {
                let _ = writeln!(out, "jitter failed on the guest: {error}");
            }
            None => {
                let _ = writeln!(out, "jitter: report truncated ({reason})");
            }
        },
        Some(JitterOutcome::Unreadable { reason }) => {
            let _ = writeln!(out, "jitter: report unreadable ({reason})");
        }
        None => {}
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONSOLE: &str = "SeaBIOS\r\n[    0.000000] Linux version 6.12.117\r\n===IMGBUILD-KERNEL-BEGIN===\r\nrelease: 6.12.117\r\nuname-v: #1 SMP PREEMPT_RT Sun Nov 30 00:00:00 UTC 2025\r\ncmdline: console=ttyS0\r\n[    3.1] random: crng init done\r\nconfig: CONFIG_PREEMPT_RT=y\r\nconfig: CONFIG_IKCONFIG_PROC=y\r\n===IMGBUILD-KERNEL-END===\r\n EmberRTOS live validation image (x)\r\n";

    #[test]
    fn reads_kernel_evidence_between_markers() {
        let console = parse_console(CONSOLE);
        assert_eq!(console.release.as_deref(), Some("6.12.117"));
        assert_eq!(
            console.uname_v.as_deref(),
            Some("#1 SMP PREEMPT_RT Sun Nov 30 00:00:00 UTC 2025")
        );
        assert_eq!(console.config.as_ref().unwrap().len(), 2);
        assert!(console.banner);
        let evidence = evidence(&console);
        assert!(evidence.all_passed(&[
            rtcheck::evidence::id::BOOT_UNAME,
            rtcheck::evidence::id::BOOT_CONFIG
        ]));
    }

    #[test]
    fn generic_kernel_and_missing_config_fail() {
        let generic = CONSOLE
            .replace("PREEMPT_RT Sun", "PREEMPT_DYNAMIC Sun")
            .replace("CONFIG_PREEMPT_RT=y", "# CONFIG_PREEMPT_RT is not set");
        let generic_evidence = evidence(&parse_console(&generic));
        assert_eq!(generic_evidence.failures().count(), 2);
        let no_config = CONSOLE.replace(
            "config: CONFIG_PREEMPT_RT=y\r\nconfig: CONFIG_IKCONFIG_PROC=y",
            "config: absent",
        );
        let console = parse_console(&no_config);
        assert_eq!(console.config, None);
        let without_config = evidence(&console);
        assert!(!without_config.all_passed(&[rtcheck::evidence::id::BOOT_CONFIG]));
        let nothing = evidence_of_nothing();
        assert_eq!(nothing.failures().count(), 2);
    }

    fn evidence_of_nothing() -> Evidence {
        evidence(&parse_console("[    0.0] Kernel panic - not syncing"))
    }

    /// What `jitter --json` writes (jitter's golden test keeps it current).
    const JITTER_REPORT: &str =
        include_str!("../../../live-image/jitter/tests/fixtures/jitter-report-1.json");

    /// The console of a guest that ran jitter and printed `report`.
    fn console_with_report(report: &str) -> String {
        format!(
            "{CONSOLE}===JITTER-REPORT-BEGIN===\r\n{}\r\n===JITTER-REPORT-END=== exit=4\r\n",
            report.trim_end().replace('\n', "\r\n")
        )
    }

    #[test]
    fn jitter_report_reads_into_the_shared_types() {
        let console = parse_console(&console_with_report(JITTER_REPORT));
        let Some(JitterOutcome::Complete { exit, report }) = &console.jitter else {
            panic!("{:?}", console.jitter);
        };
        assert_eq!(*exit, Some(4));
        assert_eq!(report.verdict(), rtreport::report::Verdict::Invalid);
        assert_eq!(report.assessment.worst_us, 1431);
        assert_eq!(report.tuning.rt_cpus.to_string(), "1");
        let codes: Vec<_> = report.assessment.reasons.iter().map(|r| r.code).collect();
        assert!(
            codes.contains(&rtreport::report::ReasonCode::Hypervisor),
            "{codes:?}"
        );

        let output = BootOutput {
            iso_sha256: "0".repeat(64),
            accel: Accel::Tcg,
            firmware: "bios".into(),
            console_log: PathBuf::from("/c.log"),
            evidence: evidence(&console),
            seconds_to_banner: Some(1.0),
            seconds_total: 2.0,
            console: console.clone(),
            functional_only: true,
        };
        let text = render(&output);
        assert!(
            text.contains("jitter: INVALID (exit 4), worst case 1431 us"),
            "{text}"
        );
        assert!(
            text.contains("  - hypervisor: running under a hypervisor"),
            "{text}"
        );
    }

    /// ci/e2e reads `console.jitter.report.assessment.verdict` from the
    /// pipeline JSON: the report must come out exactly as jitter wrote it.
    #[test]
    fn jitter_report_serializes_back_unchanged() {
        let console = parse_console(&console_with_report(JITTER_REPORT));
        let json = serde_json::to_value(&console).unwrap();
        assert_eq!(json["jitter"]["state"], "complete");
        assert_eq!(json["jitter"]["report"]["assessment"]["verdict"], "INVALID");
        let written: serde_json::Value = serde_json::from_str(JITTER_REPORT).unwrap();
        assert_eq!(json["jitter"]["report"], written);
        // Stage stamps keep it as text and read it back.
        let stamp = serde_json::to_string_pretty(&console).unwrap();
        let back: ConsoleReport = serde_json::from_str(&stamp).unwrap();
        assert_eq!(back, console);
    }

    #[test]
    fn jitter_report_of_another_schema_is_refused() {
        let other = JITTER_REPORT.replace("\"jitter-report/1\"", "\"jitter-report/3\"");
        match parse_console(&console_with_report(&other)).jitter {
            Some(JitterOutcome::Unreadable { reason }) => assert!(
                reason.contains(
                    r#"unknown jitter report schema "jitter-report/3": this build reads jitter-report/1 and jitter-report/2"#
                ),
                "{reason}"
            ),
            other => panic!("{other:?}"),
        }
        // Valid JSON that is not a whole report is no report either.
        match parse_console(&console_with_report(r#"{"assessment": {"verdict": "INVALID"}}"#)).jitter {
            Some(JitterOutcome::Unreadable { reason }) => {
                assert!(reason.contains("missing field"), "{reason}")
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn jitter_report_truncated_or_garbled() {
        let cut = format!("{CONSOLE}===JITTER-REPORT-BEGIN===\r\n{{\"assessment\": {{\"verd");
        assert!(matches!(
            parse_console(&cut).jitter,
            Some(JitterOutcome::Truncated { .. })
        ));
        let garbled = format!(
            "{CONSOLE}===JITTER-REPORT-BEGIN===\r\n{{\"a\": [1, 2\r\n===JITTER-REPORT-END=== exit=4\r\n"
        );
        match parse_console(&garbled).jitter {
            Some(JitterOutcome::Truncated { reason }) => assert!(reason.contains("does not parse")),
            other => panic!("{other:?}"),
        }
        assert!(parse_console(CONSOLE).jitter.is_none());
    }

    #[test]
    fn the_guest_gets_the_cpus_the_recipes_rt_arguments_name() {
        let kargs = |words: &[&str]| words.iter().map(|w| w.to_string()).collect::<Vec<_>>();
        assert_eq!(cpus_for_kargs(&kargs(&["quiet"])), 2);
        assert_eq!(cpus_for_kargs(&kargs(&["isolcpus=managed_irq,domain,1"])), 2);
        assert_eq!(
            cpus_for_kargs(&kargs(&[
                "isolcpus=managed_irq,domain,1-3",
                "nohz_full=1-3",
                "rcu_nocbs=1-3"
            ])),
            4
        );
        assert_eq!(cpus_for_kargs(&kargs(&["nohz_full=2,5", "isolcpus=1"])), 6);
        assert_eq!(cpus_for_kargs(&kargs(&["rcu_nocbs=0-15:2/4"])), 16);
        assert_eq!(cpus_for_kargs(&kargs(&["isolcpus=4096"])), 64, "capped");
    }

    #[test]
    fn jitters_own_error_on_the_console_is_the_reported_cause() {
        let console = format!(
            "boot\njitter: error: --rt-cpus: CPUs 2-3 are not online (online: 0-1)\n{JITTER_BEGIN}\n{JITTER_END}\nexit=2\n"
        );
        let report = parse_console(&console);
        assert_eq!(
            report.jitter_error.as_deref(),
            Some("jitter: error: --rt-cpus: CPUs 2-3 are not online (online: 0-1)")
        );
        assert!(matches!(report.jitter, Some(JitterOutcome::Truncated { .. })));
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(
            json["jitter-error"],
            "jitter: error: --rt-cpus: CPUs 2-3 are not online (online: 0-1)"
        );
        assert_eq!(parse_console("boot\n").jitter_error, None);
    }

    #[test]
    fn qemu_command() {
        let options = BootOptions {
            accel: Accel::Tcg,
            timeout: Duration::from_secs(1),
            jitter: Some(5),
            uefi: false,
            cpus: 4,
        };
        let args = qemu_args(
            Path::new("/x.iso"),
            Path::new("/c.log"),
            &qemu::X86_64,
            &options,
            None,
        )
        .unwrap();
        let joined = args.join(" ");
        assert!(joined.contains("-accel tcg"));
        assert!(joined.contains("-cdrom /x.iso"));
        assert!(joined.contains("-serial file:/c.log"));
        assert!(joined.contains("-smbios type=11,value=imgbuild:jitter.auto=5"));
        assert!(joined.contains("-smp 4 "), "{joined}");
        assert!(!joined.contains("pflash"));
        let uefi = BootOptions {
            uefi: true,
            jitter: None,
            accel: Accel::Kvm,
            ..options
        };
        let joined = qemu_args(
            Path::new("/x.iso"),
            Path::new("/c.log"),
            &qemu::X86_64,
            &uefi,
            Some(Path::new("/v.fd")),
        )
        .unwrap()
        .join(" ");
        assert!(joined.contains("-machine q35"));
        assert!(joined.contains("file=/usr/share/OVMF/OVMF_CODE_4M.fd"));
        assert!(joined.contains("if=pflash,format=raw,file=/v.fd"));
        assert!(joined.contains("imgbuild:imgbuild.check"));
        assert!(joined.contains("-cpu host"));
    }

    #[test]
    fn an_arm64_iso_boots_on_virt_with_aavmf_from_a_scsi_cd() {
        let options = BootOptions {
            accel: Accel::Tcg,
            timeout: Duration::from_secs(1),
            jitter: None,
            uefi: true,
            cpus: 2,
        };
        let vars = Some(Path::new("/v.fd"));
        let args = qemu_args(
            Path::new("/a,b.iso"),
            Path::new("/c.log"),
            &qemu::ARM64,
            &options,
            vars,
        );
        let joined = args.unwrap().join(" ");
        assert!(
            joined.starts_with("-accel tcg -cpu cortex-a57 -machine virt,acpi=off"),
            "{joined}"
        );
        assert!(joined.contains("file=/usr/share/AAVMF/AAVMF_CODE.fd"), "{joined}");
        assert!(
            joined.contains(
                "media=cdrom,readonly=on,file=/a,,b.iso -device virtio-scsi-pci -device scsi-cd,drive=cd"
            ),
            "{joined}"
        );
        assert!(!joined.contains("-cdrom"), "{joined}");
    }
}
