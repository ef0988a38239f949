//! `ssh://[user@]host[:port]/path`: a remote directory reached with the
//! system OpenSSH client (`ssh`, package openssh-client) and POSIX tools on
//! the server (`sh`, `tar`, `find`, `mv`, `flock`, `sha256sum`, `xargs`).
//! No server of our own.
//!
//! - Host keys are checked as ssh always does (`BatchMode=yes`: an unknown
//!   key fails instead of asking). `$IMGBUILD_SSH_CONFIG` names an
//!   `ssh_config` to use (`ssh -F`), for a known_hosts file or an identity.
//! - The server may be hostile: every remote command has a deadline
//!   (`$IMGBUILD_SSH_TIMEOUT` seconds, default 300, plus time for the bytes
//!   of a batch; `ConnectTimeout` and `ServerAlive*` for a dead link), past
//!   which ssh is killed, and every answer is capped.
//! - The root itself must not be a link (checked on the server before
//!   anything, and again once inside it). Every file lands under a temp
//!   name (`.publish-*`) in its directory and is renamed (`mv -T`, which
//!   replaces a link planted at the name instead of following it) into
//!   place. No directory on the way may be a link.
//! - A file already on the server counts as sent only when its sha256 is
//!   the local file's.
//! - Objects and delta parts are queued and sent as one tar stream per
//!   batch; a commit object or a delta superblock waits until everything
//!   queued before it has landed, and every plain write lands the queue
//!   first, so the publish order holds on the server.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, bail};

use super::bounded::{self, Limits, Overrun};
use super::{LOCK_FILE, READ_LIMIT, REPO_CONFIG, REPO_DIRS, TEMP_PREFIX, Transport};

/// Where the remote is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SshTarget {
    pub user: Option<String>,
    pub host: String,
    pub port: Option<u16>,
    /// Absolute path on the server.
    pub path: String,
}

/// An `ssh://` destination that cannot be used, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad ssh destination {dest:?}: {why}")]
pub struct BadSshDestination {
    pub dest: String,
    pub why: String,
}

/// Characters allowed in the user, host and path: nothing a shell or ssh
/// would read as syntax or an option.
fn plain(text: &str, extra: &str) -> bool {
    !text.is_empty()
        && !text.starts_with('-')
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c) || extra.contains(c))
}

impl SshTarget {
    /// Pure: parses `ssh://[user@]host[:port]/path`.
    pub fn parse(dest: &str) -> Result<SshTarget, BadSshDestination> {
        let bad = |why: &str| BadSshDestination {
            dest: dest.to_string(),
            why: why.to_string(),
        };
        // The URL parser would resolve `..` and `.` (also as %2e) away:
        // refuse them, and any escape, as typed.
        let typed_path = dest
            .strip_prefix("ssh://")
            .and_then(|rest| rest.find('/').map(|i| &rest[i..]));
        if typed_path.is_some_and(|p| p.contains('%') || p.split('/').any(|c| c == "." || c == "..")) {
            return Err(bad("the path must not hold `.` or `..` components or %-escapes"));
        }
        let url = url::Url::parse(dest).map_err(|e| bad(&e.to_string()))?;
        if url.scheme() != "ssh" {
            return Err(bad("not an ssh:// URL"));
        }
        if url.password().is_some() || url.query().is_some() || url.fragment().is_some() {
            return Err(bad(
                "no password, query or fragment: use keys (ssh-agent or IMGBUILD_SSH_CONFIG)",
            ));
        }
        let host = url.host_str().unwrap_or_default();
        let ipv6 = host.starts_with('[') && host.ends_with(']') && plain(&host[1..host.len() - 1], ":");
        if !(ipv6 || plain(host, "")) {
            return Err(bad("the host must be a name or an address"));
        }
        let user = Some(url.username()).filter(|u| !u.is_empty());
        if user.is_some_and(|u| !plain(u, "")) {
            return Err(bad("the user may hold letters, digits, '.', '_' and '-'"));
        }
        let path = url.path();
        let components_ok = path
            .split('/')
            .skip(1)
            .all(|c| !c.is_empty() && c != "." && c != "..");
        if !path.starts_with('/') || path == "/" || !components_ok || !plain(&path[1..], "/+") {
            return Err(bad(
                "the path must be absolute, not /, without `.`, `..` or empty components, of letters, digits and ._-+",
            ));
        }
        Ok(SshTarget {
            user: user.map(str::to_string),
            host: host.to_string(),
            port: url.port(),
            path: path.to_string(),
        })
    }

    /// `user@host` or `host`, as ssh takes it.
    pub fn destination(&self) -> String {
        let host = self.host.trim_start_matches('[').trim_end_matches(']');
        match &self.user {
            Some(user) => format!("{user}@{host}"),
            None => host.to_string(),
        }
    }
}

impl std::fmt::Display for SshTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let user = self.user.as_ref().map(|u| format!("{u}@")).unwrap_or_default();
        let port = self.port.map(|p| format!(":{p}")).unwrap_or_default();
        write!(f, "ssh://{user}{}{port}{}", self.host, self.path)
    }
}

/// Quotes one word for the remote shell.
fn quote(word: &str) -> String {
    format!("'{}'", word.replace('\'', r"'\''"))
}

/// The exit code of a script that found the root to be a symlink.
const ROOT_IS_LINK: i32 = 9;

/// Shell functions every script may use: `enter_root ROOT` (cd into it;
/// exit 9 when it is a symlink, checked before and after the cd),
/// `cd_root ROOT` (made when missing) and `real_dirs REL` (each directory
/// of REL a real one, made when missing, never a link).
const PRELUDE: &str = r#"
root_is_link() { echo "imgbuild: $1 on the server is a symlink; refusing to use it" >&2; exit 9; }
enter_root() {
    if [ -L "$1" ]; then root_is_link "$1"; fi
    cd -- "$1" 2>/dev/null || return 1
    [ "$(cd .. && pwd -P)/${1##*/}" = "$(pwd -P)" ] || root_is_link "$1"
}
cd_root() { [ -L "$1" ] || mkdir -p -- "$1"; enter_root "$1"; }
real_dirs() {
    p=.
    old_ifs=$IFS; IFS=/; set -f
    for c in $1; do
        [ -n "$c" ] && [ "$c" != . ] || continue
        p="$p/$c"
        if [ -L "$p" ]; then echo "imgbuild: $p on the server is a symlink; refusing to write through it" >&2; exit 7; fi
        [ -d "$p" ] || mkdir -- "$p" 2>/dev/null || [ -d "$p" ] || { echo "imgbuild: cannot make $p" >&2; exit 7; }
    done
    IFS=$old_ifs; set +f
}
"#;

/// Writes stdin to `$2` through a temp file and `mv -T`.
const PUT: &str = r#"
set -e
cd_root "$1"
rel=$2
dir=$(dirname -- "$rel")
real_dirs "$dir"
if [ -d "$rel" ] && [ ! -L "$rel" ]; then echo "imgbuild: $rel on the server is a directory" >&2; exit 8; fi
t=$(mktemp -- "$dir/.publish-XXXXXXXXXX")
cat > "$t"
chmod 644 "$t"
sync -- "$t"
mv -fT -- "$t" "$rel"
"#;

/// Extracts a tar stream of files into a temp dir, then moves each file to
/// its place (directories checked first), then syncs.
const BATCH: &str = r#"
set -e
cd_root "$1"
b=$(mktemp -d -- ./.publish-batch-XXXXXXXXXX)
tar -x --no-same-owner --no-same-permissions -C "$b" -f -
# The data is on disk before any name points at it.
sync
(cd "$b" && find . -type f) > "$b.list"
sed -n 's|^\./||p' "$b.list" | while IFS= read -r f; do
    real_dirs "$(dirname -- "$f")"
    if [ -d "$f" ] && [ ! -L "$f" ]; then echo "imgbuild: $f on the server is a directory" >&2; exit 8; fi
    chmod 644 "$b/$f"
    mv -fT -- "$b/$f" "$f"
done
rm -rf -- "$b" "$b.list"
sync
"#;

/// Prints `$2` (at most `$3` bytes): exit 4 when missing, 3 for a link, 5
/// when it is not a regular file.
const READ: &str = r#"
enter_root "$1" || exit 4
f=$2
if [ -L "$f" ]; then exit 3; fi
if [ ! -e "$f" ]; then exit 4; fi
if [ ! -f "$f" ]; then exit 5; fi
head -c "$3" -- "$f"
"#;

/// `sha256  path` of each path on stdin that is a regular file (not a link).
const HASHES: &str = r#"
command -v sha256sum >/dev/null || { echo "imgbuild: sha256sum is not installed on the server" >&2; exit 6; }
enter_root "$1" || exit 0
while IFS= read -r f; do
    if [ -f "$f" ] && [ ! -L "$f" ]; then printf '%s\n' "$f"; fi
done | tr '\n' '\0' | xargs -0 -r sha256sum -- 2>/dev/null || true
"#;

/// Creates an archive repo's skeleton (the directories in `$3`) and its
/// config (`$2`) unless one is there. A link at any path publish writes
/// (`$4`…), or a config that is not a regular file, is refused before
/// anything is made.
const ENSURE_REPO: &str = r#"
set -e
cd_root "$1"
config=$2; dirs=$3; shift 3
for p in "$@"; do
    if [ -L "$p" ]; then echo "imgbuild: $p on the server is a symlink; refusing to write through it" >&2; exit 7; fi
done
if [ -e config ] && [ ! -f config ]; then echo "imgbuild: config on the server is not a regular file" >&2; exit 7; fi
for d in $dirs; do real_dirs "$d"; done
[ -f config ] && exit 0
t=$(mktemp -- ./.publish-config-XXXXXXXXXX)
printf '%s' "$config" > "$t"
chmod 644 "$t"
mv -fT -- "$t" config
"#;

/// Holds the lock while stdin stays open; says `locked` once held.
const LOCK: &str = r#"
cd_root "$1" || exit 1
if [ -L "$2" ] || { [ -e "$2" ] && [ ! -f "$2" ]; }; then echo "imgbuild: $2 on the server is not a regular file" >&2; exit 3; fi
exec flock -x "$2" sh -c 'echo locked; exec cat > /dev/null'
"#;

/// Removes and prints what a killed run left (`.publish-*`), links not followed.
const STALE: &str = r#"
enter_root "$1" || exit 0
find . -name "$2*" -prune -print -exec rm -rf -- {} +
"#;

/// A tar of what the summary is made from: config, the refs, each ref's
/// commit object, each delta's superblock (none of them a link).
const SUMMARY_INPUTS: &str = r#"
enter_root "$1" || exit 1
if [ -L config ] || [ ! -f config ]; then echo "imgbuild: config on the server is not a regular file" >&2; exit 7; fi
list=config
# Refs are 65 bytes, commit objects and superblocks small: a planted huge
# file is left out, not streamed back.
for r in $(find refs/heads -type f -size -2k 2>/dev/null); do
    c=$(head -c 65 -- "$r" | tr -d '\n')
    case $c in *[!0-9a-f]*|'') continue ;; esac
    [ ${#c} = 64 ] || continue
    o="objects/$(printf %.2s "$c")/${c#??}.commit"
    [ -f "$o" ] && [ ! -L "$o" ] && [ "$(wc -c < "$o")" -lt 16777216 ] || continue
    list="$list
$r
$o"
done
for s in $(find deltas -name superblock -type f -size -16M 2>/dev/null); do list="$list
$s"; done
printf '%s\n' "$list" | tar -c --no-recursion -T - -f -
"#;

/// The most a short answer (a status, the stale list) may hold.
const SHORT_ANSWER: u64 = 1 << 20;

/// The most the summary's inputs may hold.
const SUMMARY_ANSWER: u64 = 64 << 20;

/// The default bytes queued before a batch goes out.
const BATCH_BYTES: u64 = 64 << 20;

/// The default deadline of one remote command.
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(300);

/// A batch may take its deadline plus the time for its bytes at this rate.
const SLOWEST_BYTES_PER_SECOND: u64 = 64 << 10;

pub struct SshDir {
    target: SshTarget,
    /// Files this transport sent (queued included) or found identical.
    known: RefCell<HashSet<PathBuf>>,
    queue: RefCell<Vec<(PathBuf, PathBuf)>>,
    queued_bytes: Cell<u64>,
    batch_bytes: u64,
    /// An ssh_config for `ssh -F` (default: $IMGBUILD_SSH_CONFIG).
    config: Option<PathBuf>,
    /// How long one remote command may take (default: $IMGBUILD_SSH_TIMEOUT s).
    deadline: Duration,
}

/// A positive number from the environment variable `name`.
fn env_number(name: &str) -> Option<u64> {
    std::env::var(name).ok()?.parse().ok().filter(|n| *n > 0)
}

impl SshDir {
    pub fn parse(dest: &str) -> Result<SshDir> {
        let target = SshTarget::parse(dest)?;
        Ok(SshDir {
            target,
            known: RefCell::new(HashSet::new()),
            queue: RefCell::new(Vec::new()),
            queued_bytes: Cell::new(0),
            batch_bytes: env_number("IMGBUILD_SSH_BATCH_BYTES").unwrap_or(BATCH_BYTES),
            config: std::env::var_os("IMGBUILD_SSH_CONFIG")
                .filter(|c| !c.is_empty())
                .map(PathBuf::from),
            deadline: env_number("IMGBUILD_SSH_TIMEOUT").map_or(DEFAULT_DEADLINE, Duration::from_secs),
        })
    }

    /// Uses `config` (an ssh_config) instead of $IMGBUILD_SSH_CONFIG.
    pub fn with_config(mut self, config: &Path) -> SshDir {
        self.config = Some(config.to_path_buf());
        self
    }

    /// Sends a batch once this many bytes are queued.
    pub fn with_batch_bytes(mut self, bytes: u64) -> SshDir {
        self.batch_bytes = bytes.max(1);
        self
    }

    /// Gives each remote command `deadline` instead of $IMGBUILD_SSH_TIMEOUT.
    pub fn with_deadline(mut self, deadline: Duration) -> SshDir {
        self.deadline = deadline;
        self
    }

    /// `ssh [-F $IMGBUILD_SSH_CONFIG] -o BatchMode=yes … -- DEST sh -c SCRIPT sh ROOT ARGS…`.
    fn command(&self, script: &str, args: &[&str]) -> Result<Command> {
        let mut ssh = crate::tool::command("ssh")?;
        if let Some(config) = &self.config {
            ssh.arg("-F").arg(config);
        }
        ssh.args([
            "-o",
            "BatchMode=yes",
            "-o",
            "ConnectTimeout=30",
            "-o",
            "ServerAliveInterval=15",
            "-o",
            "ServerAliveCountMax=4",
        ]);
        if let Some(port) = self.target.port {
            ssh.arg("-p").arg(port.to_string());
        }
        let mut remote = format!(
            "sh -c {} sh {}",
            quote(&format!("{PRELUDE}{script}")),
            quote(&self.target.path)
        );
        for arg in args {
            remote.push(' ');
            remote.push_str(&quote(arg));
        }
        ssh.arg("--").arg(self.target.destination()).arg(remote);
        Ok(ssh)
    }

    /// Runs a script with `stdin`, its answer capped at `answer` bytes and
    /// the run at the deadline; its exit code and output.
    fn run(
        &self,
        what: &str,
        script: &str,
        args: &[&str],
        stdin: &[u8],
        answer: u64,
    ) -> Result<bounded::Finished> {
        let mut ssh = self.command(script, args)?;
        let data = stdin.to_vec();
        let limits = Limits {
            deadline: self.deadline,
            stdout_bytes: answer,
        };
        let done = bounded::run(&mut ssh, move |mut input| Ok(input.write_all(&data)?), limits)
            .map_err(|e| self.overrun(what, e))?;
        self.check_exit(what, done.status, &done.stderr)?;
        Ok(done)
    }

    /// Runs a script that must succeed; its stdout.
    fn run_ok(&self, what: &str, script: &str, args: &[&str], stdin: &[u8], answer: u64) -> Result<Vec<u8>> {
        let done = self.run(what, script, args, stdin, answer)?;
        if !done.status.success() {
            bail!(
                "{what} on {}: {} ({})",
                self.target,
                String::from_utf8_lossy(&done.stderr).trim(),
                done.status
            );
        }
        Ok(done.stdout)
    }

    /// An error of a bounded run, naming the command, the destination and,
    /// past the deadline, how to change it.
    fn overrun(&self, what: &str, error: anyhow::Error) -> anyhow::Error {
        let hint = match error.downcast_ref::<Overrun>() {
            Some(Overrun::Time(_)) => "; IMGBUILD_SSH_TIMEOUT sets the deadline in seconds",
            _ => "",
        };
        anyhow::anyhow!("{what} on {}: {error:#}{hint}", self.target)
    }

    /// ssh's own failure (255), or a root that is a link.
    fn check_exit(&self, what: &str, status: std::process::ExitStatus, stderr: &[u8]) -> Result<()> {
        match status.code() {
            Some(255) => bail!("{what}: {}", self.connection_error(stderr)),
            Some(ROOT_IS_LINK) => bail!(
                "{what}: {} on {} is a symlink; publish never writes through a link",
                self.target.path,
                self.target.destination()
            ),
            _ => Ok(()),
        }
    }

    fn connection_error(&self, stderr: &[u8]) -> String {
        let text = String::from_utf8_lossy(stderr).trim().to_string();
        let hint = if text.contains("Host key verification failed") {
            "; the server's host key must be in known_hosts (ssh checks it; IMGBUILD_SSH_CONFIG may name an ssh_config with UserKnownHostsFile)"
        } else {
            ""
        };
        format!("ssh to {} failed: {text}{hint}", self.target.destination())
    }

    fn rel_text(rel: &Path) -> Result<String> {
        let text = rel.to_str().context("a path that is not UTF-8")?;
        if rel.is_absolute()
            || text.contains('\n')
            || rel
                .components()
                .any(|c| !matches!(c, std::path::Component::Normal(_)))
        {
            bail!("refusing the remote path {text:?}");
        }
        Ok(text.to_string())
    }

    /// The sha256 of each of `rels` that is a regular file on the server.
    fn hashes(&self, rels: &[&Path]) -> Result<HashMap<PathBuf, String>> {
        let mut list = String::new();
        for rel in rels {
            list.push_str(&Self::rel_text(rel)?);
            list.push('\n');
        }
        // A line per path: 64 hex digits, two spaces, the path.
        let answer = list.len() as u64 + 67 * rels.len() as u64;
        let out = self.run_ok("hashing files", HASHES, &[], list.as_bytes(), answer)?;
        Ok(String::from_utf8_lossy(&out)
            .lines()
            .filter_map(|line| line.split_once("  "))
            .filter(|(hash, _)| crate::io::hashing::is_sha256_hex(hash))
            .map(|(hash, path)| (PathBuf::from(path), hash.to_string()))
            .collect())
    }

    /// Sends the queued files as one tar stream, within the deadline plus
    /// the time for `bytes` at the slowest rate allowed.
    fn send_batch(&self, files: Vec<(PathBuf, PathBuf)>, bytes: u64) -> Result<()> {
        let what = format!("sending {} file(s)", files.len());
        let mut ssh = self.command(BATCH, &[])?;
        let limits = Limits {
            deadline: self.deadline + Duration::from_secs(bytes / SLOWEST_BYTES_PER_SECOND),
            stdout_bytes: SHORT_ANSWER,
        };
        let done = bounded::run(&mut ssh, move |stdin| write_tar(stdin, &files), limits)
            .map_err(|e| self.overrun(&what, e))?;
        self.check_exit(&what, done.status, &done.stderr)?;
        if !done.status.success() {
            bail!(
                "{what} to {}: {} ({})",
                self.target,
                String::from_utf8_lossy(&done.stderr).trim(),
                done.status
            );
        }
        done.fed.context("writing the tar stream to ssh")
    }
}

/// Streams `files` (remote path, local path) as a tar archive into `sink`.
fn write_tar(sink: ChildStdin, files: &[(PathBuf, PathBuf)]) -> Result<()> {
    let mut tar = tar::Builder::new(std::io::BufWriter::with_capacity(1 << 20, sink));
    tar.follow_symlinks(false);
    for (rel, local) in files {
        let mut file = std::fs::File::open(local).with_context(|| format!("opening {}", local.display()))?;
        tar.append_file(rel, &mut file)
            .with_context(|| format!("adding {} to the stream", local.display()))?;
    }
    tar.into_inner()?.flush()?;
    Ok(())
}

/// The remote lock: held while the ssh session's stdin stays open.
struct RemoteLock {
    child: Child,
    stdin: Option<ChildStdin>,
    deadline: Duration,
}

impl Drop for RemoteLock {
    /// Closing stdin ends the session; a server that does not end it is cut.
    fn drop(&mut self) {
        drop(self.stdin.take());
        let _ = bounded::finish_within(&mut self.child, self.deadline);
    }
}

impl Transport for SshDir {
    fn describe(&self) -> String {
        self.target.to_string()
    }

    fn ensure_repo(&self) -> Result<()> {
        let dirs = REPO_DIRS.join(" ");
        let mut args = vec![REPO_CONFIG, dirs.as_str()];
        for path in super::written_paths() {
            args.push(path);
        }
        self.run_ok("making the remote repo", ENSURE_REPO, &args, b"", SHORT_ANSWER)?;
        Ok(())
    }

    fn ensure_root(&self) -> Result<()> {
        self.run_ok(
            "making the remote directory",
            "cd_root \"$1\"",
            &[],
            b"",
            SHORT_ANSWER,
        )?;
        Ok(())
    }

    fn lock(&self) -> Result<Box<dyn std::any::Any>> {
        let mut ssh = self.command(LOCK, &[LOCK_FILE])?;
        ssh.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut child = ssh.spawn().context("starting ssh")?;
        let stdin = child.stdin.take();
        let what = format!("waiting for the lock {LOCK_FILE}");
        let line = bounded::first_line(&mut child, 64, self.deadline).map_err(|e| self.overrun(&what, e))?;
        if line.trim() != "locked" {
            drop(stdin);
            let status = bounded::finish_within(&mut child, self.deadline)?;
            self.check_exit(&what, status, b"(ssh's message is above)")?;
            bail!(
                "could not lock {} on {} ({status}; ssh's message is above)",
                LOCK_FILE,
                self.target
            );
        }
        Ok(Box::new(RemoteLock {
            child,
            stdin,
            deadline: self.deadline,
        }))
    }

    fn remove_stale_temps(&self) -> Result<usize> {
        let out = self.run_ok(
            "removing stale temp files",
            STALE,
            &[TEMP_PREFIX],
            b"",
            SHORT_ANSWER,
        )?;
        Ok(String::from_utf8_lossy(&out)
            .lines()
            .filter(|l| !l.is_empty())
            .count())
    }

    fn holding(&self, files: &[(PathBuf, PathBuf)]) -> Result<HashSet<PathBuf>> {
        super::held(files, &self.known, |rels| self.hashes(rels))
    }

    fn read(&self, rel: &Path) -> Result<Option<Vec<u8>>> {
        let text = Self::rel_text(rel)?;
        let limit = (READ_LIMIT + 1).to_string();
        let output = self.run(
            &format!("reading {text}"),
            READ,
            &[&text, &limit],
            b"",
            READ_LIMIT + 1,
        )?;
        match output.status.code() {
            Some(0) if output.stdout.len() as u64 > READ_LIMIT => {
                bail!("{text} on {} is larger than {READ_LIMIT} bytes", self.target)
            }
            Some(0) => Ok(Some(output.stdout)),
            Some(4) => Ok(None),
            Some(3) => bail!(
                "{text} on {} is a symlink; refusing to read through it",
                self.target
            ),
            Some(5) => bail!("{text} on {} is not a regular file", self.target),
            _ => bail!(
                "reading {text} on {}: {} ({})",
                self.target,
                String::from_utf8_lossy(&output.stderr).trim(),
                output.status
            ),
        }
    }

    fn put(&self, rel: &Path, data: &[u8]) -> Result<()> {
        self.flush()?;
        let text = Self::rel_text(rel)?;
        self.run_ok(&format!("writing {text}"), PUT, &[&text], data, SHORT_ANSWER)?;
        self.known.borrow_mut().insert(rel.to_path_buf());
        Ok(())
    }

    fn put_file(&self, rel: &Path, source: &Path) -> Result<()> {
        Self::rel_text(rel)?;
        let last = rel.extension().is_some_and(|e| e == "commit") || rel.ends_with("superblock");
        if last {
            self.flush()?;
        }
        let size = std::fs::metadata(source)
            .with_context(|| format!("reading {}", source.display()))?
            .len();
        self.queue
            .borrow_mut()
            .push((rel.to_path_buf(), source.to_path_buf()));
        self.queued_bytes.set(self.queued_bytes.get() + size);
        self.known.borrow_mut().insert(rel.to_path_buf());
        if self.queued_bytes.get() >= self.batch_bytes {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&self) -> Result<()> {
        let files = std::mem::take(&mut *self.queue.borrow_mut());
        let bytes = self.queued_bytes.replace(0);
        if files.is_empty() {
            return Ok(());
        }
        self.send_batch(files, bytes).inspect_err(|_| {
            // What is on the server is no longer known.
            self.known.borrow_mut().clear();
        })
    }

    fn remove(&self, rel: &Path) -> Result<()> {
        self.flush()?;
        let text = Self::rel_text(rel)?;
        self.run_ok(
            &format!("removing {text}"),
            "enter_root \"$1\" && rm -f -- \"$2\"",
            &[&text],
            b"",
            SHORT_ANSWER,
        )?;
        self.known.borrow_mut().remove(rel);
        Ok(())
    }

    /// From the server's config, refs, ref commits and delta superblocks,
    /// copied into a scratch repo here (no ostree needed on the server).
    fn generate_summary(&self) -> Result<Vec<u8>> {
        self.flush()?;
        let tar = self.run_ok(
            "reading the summary's inputs",
            SUMMARY_INPUTS,
            &[],
            b"",
            SUMMARY_ANSWER,
        )?;
        let scratch = tempfile::Builder::new()
            .prefix("imgbuild-summary-")
            .tempdir()
            .context("creating a scratch dir")?;
        let repo = scratch.path().join("repo");
        crate::io::extract::extract_reader(&tar[..], &repo, Default::default())
            .context("unpacking the summary's inputs")?;
        super::summary_of_inputs(&repo, &self.describe())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn destinations_parse_into_user_host_port_and_path() {
        let t = SshTarget::parse("ssh://publisher@updates.example.org:2222/srv/ostree/repo").unwrap();
        assert_eq!(t.user.as_deref(), Some("publisher"));
        assert_eq!(t.host, "updates.example.org");
        assert_eq!(t.port, Some(2222));
        assert_eq!(t.path, "/srv/ostree/repo");
        assert_eq!(t.destination(), "publisher@updates.example.org");
        assert_eq!(
            t.to_string(),
            "ssh://publisher@updates.example.org:2222/srv/ostree/repo"
        );
        let bare = SshTarget::parse("ssh://127.0.0.1/www").unwrap();
        assert_eq!((bare.user, bare.port), (None, None));
        assert_eq!(SshTarget::parse("ssh://[::1]:22/r").unwrap().destination(), "::1");
    }

    #[test]
    fn hostile_destinations_are_refused_naming_the_part() {
        for (dest, part) in [
            ("ssh://-oProxyCommand=x/r", "host"),
            ("ssh://h/", "path"),
            ("ssh://h/a/../etc", "path"),
            ("ssh://h/srv/%2e%2e/etc", "path"),
            ("ssh://h/a//b", "path"),
            ("ssh://h/a;rm -rf ~", "path"),
            ("ssh://h/a$(id)", "path"),
            ("ssh://-x@h/r", "user"),
            ("ssh://u:secret@h/r", "password"),
            ("ssh://h/r?x=1", "query"),
            ("http://h/r", "ssh://"),
        ] {
            let err = SshTarget::parse(dest).unwrap_err().to_string();
            assert!(err.contains(part), "{dest}: {err}");
        }
    }

    #[test]
    fn quoting_survives_single_quotes() {
        assert_eq!(quote("a b"), "'a b'");
        assert_eq!(quote("it's"), r"'it'\''s'");
    }
}
