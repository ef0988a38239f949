//! One SSH session per target with the real OpenSSH client. The host key is
//! scanned once (`ssh-keyscan`) and must be one the operator already trusts
//! (`--known-hosts FILE`), unless `--trust-on-first-use` takes the key the
//! target shows. Either way it is shown, recorded with how it was
//! established, and pinned for the run: every later `ssh` trusts that one key
//! only, so a key that changes mid-run aborts the target. What the target
//! sends is capped on this side and every command has a deadline: the target
//! may be hostile.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use super::target::Target;
use crate::tool;
use emberrtos_contract::error::BadInput;

/// The errors a caller tells apart, each naming the target.
#[derive(Debug, thiserror::Error)]
pub enum SshError {
    #[error("no SSH server answered on {target} (is the machine up, and the port right?){detail}")]
    Unreachable { target: String, detail: String },
    #[error(
        "{target} refused the login: -i KEY names the key, and the target's root/.ssh/authorized_keys must hold its public key{detail}"
    )]
    LoginRefused { target: String, detail: String },
    #[error("the host key of {target} changed during the run (recorded {recorded}): aborted")]
    HostKeyChanged { target: String, recorded: String },
    #[error(
        "the host key of {target} ({fingerprint}) is not in {file} (--known-hosts): add it once you have \
         checked that fingerprint on the machine itself, or pass --trust-on-first-use instead"
    )]
    NotPinned {
        target: String,
        fingerprint: String,
        file: String,
    },
    #[error("{target}: `{command}` did not finish within {seconds} s: aborted")]
    Timeout {
        target: String,
        command: String,
        seconds: u64,
    },
    #[error("{target}: `{command}` sent more than {limit} bytes: aborted")]
    TooMuchOutput {
        target: String,
        command: String,
        limit: u64,
    },
}

/// The target's host key, as scanned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostKey {
    /// `ssh-ed25519`, `ecdsa-sha2-nistp256`, `ssh-rsa`.
    pub algorithm: String,
    pub base64: String,
    /// `SHA256:…`, as `ssh-keygen -l` prints it.
    pub fingerprint: String,
}

/// The host key types tried, best first.
const KEY_PREFERENCE: [&str; 5] = [
    "ssh-ed25519",
    "ecdsa-sha2-nistp256",
    "ecdsa-sha2-nistp384",
    "ecdsa-sha2-nistp521",
    "ssh-rsa",
];

/// The host keys in `ssh-keyscan` output (pure), of the types tried, best
/// first; empty when it holds none.
pub fn parse_keyscan(output: &str) -> Vec<(String, String)> {
    let keys: Vec<(&str, &str)> = output
        .lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            let (_host, algorithm, key) = (words.next()?, words.next()?, words.next()?);
            Some((algorithm, key))
        })
        .collect();
    KEY_PREFERENCE
        .iter()
        .flat_map(|wanted| keys.iter().filter(move |(algorithm, _)| algorithm == wanted))
        .map(|(a, k)| (a.to_string(), k.to_string()))
        .collect()
}

/// The SHA256 fingerprint of a public key in OpenSSH form.
pub fn fingerprint(algorithm: &str, base64: &str) -> Result<String> {
    let key = ssh_key::PublicKey::from_openssh(&format!("{algorithm} {base64}"))
        .with_context(|| format!("the scanned {algorithm} host key does not parse"))?;
    Ok(key.fingerprint(ssh_key::HashAlg::Sha256).to_string())
}

/// `HostKeyAlgorithms` that accept exactly that key's type.
fn host_key_algorithms(algorithm: &str) -> &str {
    match algorithm {
        "ssh-rsa" => "rsa-sha2-512,rsa-sha2-256",
        other => other,
    }
}

/// Whether `ssh-keygen -F` output pins the key (pure): a plain line holds
/// it, and no `@revoked` line does; `@cert-authority` lines pin nothing.
pub fn lines_hold_key(lines: &str, key: &HostKey) -> bool {
    let holds = |line: &&str| {
        let words: Vec<&str> = line.split_whitespace().collect();
        words
            .windows(2)
            .any(|w| w[0] == key.algorithm && w[1] == key.base64)
    };
    let entries: Vec<&str> = lines.lines().filter(|line| !line.starts_with('#')).collect();
    let revoked = entries
        .iter()
        .filter(|line| line.starts_with("@revoked"))
        .any(holds);
    !revoked && entries.iter().filter(|line| !line.starts_with('@')).any(holds)
}

/// What limits one remote command.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub deadline: Duration,
    pub stdout_bytes: u64,
}

impl Limits {
    /// A short command: 120 s, 64 KiB.
    pub const PROBE: Limits = Limits {
        deadline: Duration::from_secs(120),
        stdout_bytes: 64 << 10,
    };
}

const STDERR_BYTES: u64 = 1 << 20;

pub struct RemoteOutput {
    /// The remote command's exit code.
    pub code: i32,
    pub stdout: Vec<u8>,
    pub stderr: String,
}

/// Which host keys a run trusts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HostKeys {
    /// `--known-hosts FILE`: only a key in it.
    Pinned(PathBuf),
    /// `--trust-on-first-use`: the key the target shows first.
    TrustOnFirstUse,
}

impl HostKeys {
    /// From the two flags: exactly one of them, and a file that reads.
    pub fn from_flags(known_hosts: Option<PathBuf>, trust_on_first_use: bool) -> Result<HostKeys, BadInput> {
        match (known_hosts, trust_on_first_use) {
            (Some(_), true) => Err(BadInput::new(
                "--trust-on-first-use",
                "--known-hosts already names the keys to trust: give one of the two",
            )),
            (Some(file), false) => match std::fs::File::open(&file) {
                Ok(_) => Ok(HostKeys::Pinned(file)),
                Err(e) => Err(BadInput::new(
                    "--known-hosts",
                    format!("cannot read {}: {e}", file.display()),
                )),
            },
            (None, true) => Ok(HostKeys::TrustOnFirstUse),
            (None, false) => Err(BadInput::new(
                "--known-hosts",
                "qualify needs the host keys you trust: --known-hosts FILE (e.g. ~/.ssh/known_hosts), \
                 or --trust-on-first-use to take each machine's key as it is first shown (the records say so)",
            )),
        }
    }

    pub fn established(&self) -> Established {
        match self {
            HostKeys::Pinned(_) => Established::Pinned,
            HostKeys::TrustOnFirstUse => Established::TrustOnFirstUse,
        }
    }
}

/// How a target's host key came to be trusted, as its record says.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Established {
    /// It was in the operator's `--known-hosts` file before the run.
    Pinned,
    /// Taken as the target first showed it: nothing vouches for it.
    TrustOnFirstUse,
}

impl Established {
    pub fn as_str(self) -> &'static str {
        match self {
            Established::Pinned => "pinned",
            Established::TrustOnFirstUse => "trust-on-first-use",
        }
    }
}

#[derive(Clone, Debug)]
pub struct SshOptions {
    /// `-i KEY`.
    pub identity: Option<PathBuf>,
    pub host_keys: HostKeys,
}

pub struct Session {
    pub target: Target,
    pub host_key: HostKey,
    pub established: Established,
    identity: Option<PathBuf>,
    /// This run's known_hosts: the one scanned key.
    known_hosts: tempfile::NamedTempFile,
}

impl Session {
    /// Scans the host keys, takes the one `options.host_keys` trusts and
    /// pins it for the run.
    pub fn open(target: &Target, options: &SshOptions) -> Result<Session> {
        let scanned = scan_host_keys(target)?;
        let host_key = trusted_key(target, scanned, &options.host_keys)?;
        let mut known_hosts = tempfile::NamedTempFile::new().context("creating this run's known_hosts")?;
        writeln!(
            known_hosts,
            "{} {} {}",
            target.known_hosts_name(),
            host_key.algorithm,
            host_key.base64
        )?;
        known_hosts.flush()?;
        Ok(Session {
            target: target.clone(),
            host_key,
            established: options.host_keys.established(),
            identity: options.identity.clone(),
            known_hosts,
        })
    }

    fn ssh(&self, remote_command: &str) -> Result<Command> {
        let mut cmd = tool::command("ssh")?;
        cmd.args([
            "-F",
            "none",
            "-T",
            "-a",
            "-x",
            "-p",
            &self.target.port.to_string(),
        ]);
        if let Some(identity) = &self.identity {
            cmd.arg("-i").arg(identity).args(["-o", "IdentitiesOnly=yes"]);
        }
        let known_hosts = format!("UserKnownHostsFile={}", self.known_hosts.path().display());
        let algorithms = format!(
            "HostKeyAlgorithms={}",
            host_key_algorithms(&self.host_key.algorithm)
        );
        for option in [
            "BatchMode=yes",
            "StrictHostKeyChecking=yes",
            "GlobalKnownHostsFile=/dev/null",
            "CheckHostIP=no",
            "ConnectTimeout=15",
            "ServerAliveInterval=10",
            "ServerAliveCountMax=3",
            "ControlMaster=no",
            "ControlPath=none",
            "PermitLocalCommand=no",
            "UpdateHostKeys=no",
            "LogLevel=ERROR",
            &known_hosts,
            &algorithms,
        ] {
            cmd.args(["-o", option]);
        }
        cmd.arg("-l")
            .arg(&self.target.user)
            .arg("--")
            .arg(&self.target.host)
            .arg(remote_command);
        Ok(cmd)
    }

    /// Runs `remote_command`; ssh's own failures become [`SshError`]s.
    pub fn run(&self, remote_command: &str, limits: Limits) -> Result<RemoteOutput> {
        self.run_watching(remote_command, limits, &mut |_| {})
    }

    /// [`Session::run`], calling `on_stderr_line` for each line of stderr as it comes.
    pub fn run_watching(
        &self,
        remote_command: &str,
        limits: Limits,
        on_stderr_line: &mut dyn FnMut(&str),
    ) -> Result<RemoteOutput> {
        let mut cmd = self.ssh(remote_command)?;
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let child = cmd.spawn().context("starting ssh")?;
        let (status, stdout, stderr) = capture(child, limits, on_stderr_line).map_err(|overrun| {
            let (target, command) = (self.target.to_string(), first_word(remote_command));
            match overrun {
                Overrun::Time => SshError::Timeout {
                    target,
                    command,
                    seconds: limits.deadline.as_secs(),
                },
                Overrun::Bytes(limit) => SshError::TooMuchOutput {
                    target,
                    command,
                    limit,
                },
            }
        })?;
        let code = status.code().unwrap_or(255);
        if code == 255 {
            return Err(self.classify(&stderr).into());
        }
        Ok(RemoteOutput { code, stdout, stderr })
    }

    fn classify(&self, stderr: &str) -> SshError {
        let target = self.target.to_string();
        let detail = detail(stderr);
        if stderr.contains("Host key verification failed") || stderr.contains("IDENTIFICATION HAS CHANGED") {
            SshError::HostKeyChanged {
                target,
                recorded: self.host_key.fingerprint.clone(),
            }
        } else if stderr.contains("Permission denied") {
            SshError::LoginRefused { target, detail }
        } else {
            SshError::Unreachable { target, detail }
        }
    }

    /// A remote file's bytes, at most `limit`.
    pub fn read_file(&self, path: &str, limit: u64) -> Result<Vec<u8>> {
        let output = self.run(
            &format!("cat -- {path}"),
            Limits {
                stdout_bytes: limit,
                ..Limits::PROBE
            },
        )?;
        if output.code != 0 {
            anyhow::bail!("{}: cannot read {path}:{}", self.target, detail(&output.stderr));
        }
        Ok(output.stdout)
    }
}

fn first_word(command: &str) -> String {
    command.split_whitespace().next().unwrap_or(command).to_string()
}

/// `: LAST LINES` of ssh's stderr, cleaned, or nothing.
fn detail(stderr: &str) -> String {
    let text = super::clean(&tool::tail_lines(stderr.trim(), 3));
    if text.is_empty() {
        String::new()
    } else {
        format!(": {text}")
    }
}

/// The target's host keys, best first; at least one.
fn scan_host_keys(target: &Target) -> Result<Vec<HostKey>> {
    let mut cmd = tool::command("ssh-keyscan")?;
    cmd.args([
        "-T",
        "10",
        "-t",
        "ed25519,ecdsa,rsa",
        "-p",
        &target.port.to_string(),
        "--",
    ])
    .arg(&target.host)
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let child = cmd.spawn().context("starting ssh-keyscan")?;
    // -T restarts with every byte: a target that trickles is cut off here.
    let limits = Limits {
        deadline: Duration::from_secs(60),
        stdout_bytes: 64 << 10,
    };
    let stdout = capture(child, limits, &mut |_| {}).map_or_else(|_| Vec::new(), |(_, stdout, _)| stdout);
    let scanned = parse_keyscan(&String::from_utf8_lossy(&stdout));
    if scanned.is_empty() {
        return Err(SshError::Unreachable {
            target: target.to_string(),
            detail: String::new(),
        }
        .into());
    }
    scanned
        .into_iter()
        .map(|(algorithm, base64)| {
            let fingerprint = fingerprint(&algorithm, &base64)?;
            Ok(HostKey {
                algorithm,
                base64,
                fingerprint,
            })
        })
        .collect()
}

/// The best of the `scanned` keys (best first, at least one) that `trust`
/// accepts; [`SshError::NotPinned`] when `--known-hosts` holds none of them.
fn trusted_key(target: &Target, scanned: Vec<HostKey>, trust: &HostKeys) -> Result<HostKey> {
    let file = match trust {
        HostKeys::TrustOnFirstUse => return Ok(scanned[0].clone()),
        HostKeys::Pinned(file) => file,
    };
    let mut cmd = tool::command("ssh-keygen")?;
    cmd.arg("-F").arg(target.known_hosts_name()).arg("-f").arg(file);
    let output = cmd.output().context("running ssh-keygen -F on --known-hosts")?;
    let lines = String::from_utf8_lossy(&output.stdout);
    if let Some(key) = scanned.iter().find(|key| lines_hold_key(&lines, key)) {
        return Ok(key.clone());
    }
    Err(SshError::NotPinned {
        target: target.to_string(),
        fingerprint: scanned[0].fingerprint.clone(),
        file: file.display().to_string(),
    }
    .into())
}

enum Overrun {
    Time,
    Bytes(u64),
}

enum Event {
    Line(String),
    TooMuch(u64),
}

/// Reads the child's stdout (to `limits.stdout_bytes`) and stderr (line by
/// line, to 1 MiB) until it exits; kills it past a limit or the deadline.
fn capture(
    mut child: Child,
    limits: Limits,
    on_stderr_line: &mut dyn FnMut(&str),
) -> Result<(ExitStatus, Vec<u8>, String), Overrun> {
    let (events, received) = mpsc::channel();
    let stdout = child.stdout.take().expect("piped stdout");
    let stderr = child.stderr.take().expect("piped stderr");
    let stdout_events = events.clone();
    let stdout_reader = std::thread::spawn(move || read_capped(stdout, limits.stdout_bytes, &stdout_events));
    std::thread::spawn(move || read_lines_capped(stderr, STDERR_BYTES, &events));
    let started = Instant::now();
    let mut stderr_text = String::new();
    let mut handle = |event: Event, text: &mut String| match event {
        Event::Line(line) => {
            on_stderr_line(&line);
            text.push_str(&line);
            text.push('\n');
            Ok(())
        }
        Event::TooMuch(limit) => Err(Overrun::Bytes(limit)),
    };
    let outcome = loop {
        match received.recv_timeout(Duration::from_millis(100)) {
            Ok(event) => {
                if let Err(overrun) = handle(event, &mut stderr_text) {
                    break Err(overrun);
                }
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break Ok(()),
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
        if started.elapsed() > limits.deadline {
            break Err(Overrun::Time);
        }
    };
    if let Err(overrun) = outcome {
        let _ = child.kill();
        let _ = child.wait();
        return Err(overrun);
    }
    let status = child.wait().map_err(|_| Overrun::Time)?;
    let stdout = stdout_reader.join().unwrap_or_default();
    Ok((status, stdout, stderr_text))
}

fn read_capped(mut from: impl Read, limit: u64, events: &mpsc::Sender<Event>) -> Vec<u8> {
    let mut bytes = Vec::new();
    let _ = from.by_ref().take(limit + 1).read_to_end(&mut bytes);
    if bytes.len() as u64 > limit {
        let _ = events.send(Event::TooMuch(limit));
    }
    bytes
}

fn read_lines_capped(from: impl Read, limit: u64, events: &mpsc::Sender<Event>) {
    let mut reader = BufReader::new(from.take(limit + 1));
    let mut total = 0u64;
    let mut line = Vec::new();
    while let Ok(n) = reader.read_until(b'\n', &mut line) {
        if n == 0 {
            break;
        }
        total += n as u64;
        if total > limit {
            let _ = events.send(Event::TooMuch(limit));
            return;
        }
        let text = String::from_utf8_lossy(&line)
            .trim_end_matches(['\n', '\r'])
            .to_string();
        let _ = events.send(Event::Line(text));
        line.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ED25519: &str = "AAAAC3NzaC1lZDI1NTE5AAAAIGNvdz2R5cVNiWg29FQVE3nnx3I5sV3vVNe4zYFvuiDf";

    #[test]
    fn keyscan_prefers_ed25519_and_skips_comments() {
        let output = format!(
            "# 127.0.0.1:2222 SSH-2.0-dropbear\n[127.0.0.1]:2222 ssh-rsa AAAArsa\n[127.0.0.1]:2222 ssh-ed25519 {ED25519}\n"
        );
        assert_eq!(
            parse_keyscan(&output),
            [
                ("ssh-ed25519".to_string(), ED25519.to_string()),
                ("ssh-rsa".into(), "AAAArsa".into())
            ]
        );
        assert_eq!(
            parse_keyscan("h ssh-rsa AAAArsa\nh ssh-dss AAAAdss\n"),
            [("ssh-rsa".to_string(), "AAAArsa".to_string())]
        );
        assert!(parse_keyscan("# only a banner\n").is_empty());
        assert!(parse_keyscan("").is_empty());
    }

    #[test]
    fn host_keys_need_exactly_one_of_the_two_flags() {
        let file = tempfile::NamedTempFile::new().unwrap();
        let path = file.path().to_path_buf();
        assert_eq!(
            HostKeys::from_flags(Some(path.clone()), false),
            Ok(HostKeys::Pinned(path.clone()))
        );
        assert_eq!(HostKeys::from_flags(None, true), Ok(HostKeys::TrustOnFirstUse));
        let neither = HostKeys::from_flags(None, false).unwrap_err().to_string();
        assert!(
            neither.contains("--known-hosts") && neither.contains("--trust-on-first-use"),
            "{neither}"
        );
        let both = HostKeys::from_flags(Some(path), true).unwrap_err();
        assert_eq!(both.option, "--trust-on-first-use");
        let missing = HostKeys::from_flags(Some("/nonexistent/known_hosts".into()), false).unwrap_err();
        assert!(
            missing.to_string().contains("/nonexistent/known_hosts"),
            "{missing}"
        );
        assert_eq!(
            HostKeys::TrustOnFirstUse.established().as_str(),
            "trust-on-first-use"
        );
        assert_eq!(
            serde_json::to_value(Established::TrustOnFirstUse).unwrap(),
            "trust-on-first-use"
        );
    }

    #[test]
    fn fingerprint_is_ssh_keygen_s() {
        // `ssh-keygen -lf` of this key printed the same.
        let key = "AAAAC3NzaC1lZDI1NTE5AAAAIFhL4mWxDcyom2BOPP4r4A4HDrIoi2Cnf9B4OsRgk9ic";
        assert_eq!(
            fingerprint("ssh-ed25519", key).unwrap(),
            "SHA256:JOE/wafwnBJaqNgBeRN2Tp4E7DFtXywboE1VEnzO7TQ"
        );
        assert!(fingerprint("ssh-ed25519", "AAAAnotakey").is_err());
    }

    #[test]
    fn known_hosts_lines_must_hold_the_same_key() {
        let key = HostKey {
            algorithm: "ssh-ed25519".into(),
            base64: ED25519.into(),
            fingerprint: String::new(),
        };
        assert!(lines_hold_key(
            &format!("# Host h found: line 3\n[h]:2222 ssh-ed25519 {ED25519}\n"),
            &key
        ));
        assert!(lines_hold_key(
            &format!("|1|salt|hash ssh-ed25519 {ED25519}\n"),
            &key
        ));
        assert!(!lines_hold_key("[h]:2222 ssh-ed25519 AAAAother\n", &key));
        assert!(!lines_hold_key(&format!("[h]:2222 ssh-rsa {ED25519}\n"), &key));
        assert!(!lines_hold_key("", &key));
        assert!(!lines_hold_key(
            &format!("@revoked [h]:2222 ssh-ed25519 {ED25519}\n"),
            &key
        ));
        assert!(!lines_hold_key(
            &format!("[h]:2222 ssh-ed25519 {ED25519}\n@revoked * ssh-ed25519 {ED25519}\n"),
            &key
        ));
        assert!(!lines_hold_key(
            &format!("@cert-authority * ssh-ed25519 {ED25519}\n"),
            &key
        ));
    }

    #[test]
    fn capture_caps_output_and_keeps_deadlines() {
        let spawn = |script: &str| {
            Command::new("sh")
                .args(["-c", script])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        };
        let limits = Limits {
            deadline: Duration::from_secs(20),
            stdout_bytes: 10,
        };
        let mut lines = Vec::new();
        let (status, stdout, stderr) = capture(
            spawn("printf 'a\\nb\\377\\n' >&2; printf 0123456789"),
            limits,
            &mut |l| lines.push(l.to_string()),
        )
        .ok()
        .unwrap();
        assert!(status.success());
        assert_eq!(stdout, b"0123456789");
        assert_eq!(lines, ["a", "b\u{fffd}"]);
        assert_eq!(stderr, "a\nb\u{fffd}\n");
        assert!(matches!(
            capture(spawn("yes"), limits, &mut |_| {}),
            Err(Overrun::Bytes(10))
        ));
        let short = Limits {
            deadline: Duration::from_millis(300),
            ..limits
        };
        let started = Instant::now();
        assert!(matches!(
            capture(spawn("sleep 30"), short, &mut |_| {}),
            Err(Overrun::Time)
        ));
        assert!(started.elapsed() < Duration::from_secs(10));
    }
}
