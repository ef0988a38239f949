//! Running a command whose other end may be hostile (an `ssh` to a web
//! host): what it answers is capped and every run has a deadline, past
//! which the child is killed. Nothing waits or buffers without a bound.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

/// What bounds one run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Wall-clock time from the start to the exit.
    pub deadline: Duration,
    /// Bytes of stdout kept; more kills the child.
    pub stdout_bytes: u64,
}

/// A run that passed its limits (the child was killed).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Overrun {
    #[error("no answer within {} s (the command was killed)", .0.as_secs_f64())]
    Time(Duration),
    #[error("the answer passed {0} bytes (the command was killed)")]
    Bytes(u64),
}

/// Bytes of stderr kept; the rest is read and dropped.
pub const STDERR_BYTES: u64 = 64 << 10;

/// A run that finished within its limits.
pub struct Finished {
    pub status: ExitStatus,
    pub stdout: Vec<u8>,
    /// At most [`STDERR_BYTES`].
    pub stderr: Vec<u8>,
    /// What feeding stdin returned (an early exit of the child breaks the pipe).
    pub fed: Result<()>,
}

enum Stream {
    /// `None`: past the cap.
    Out(Option<Vec<u8>>),
    Err(Vec<u8>),
}

/// Runs `cmd` with its stdin fed by `feed` (on a thread), its stdout capped
/// and the whole run bounded by `limits`; an [`Overrun`] kills the child.
pub fn run<F>(cmd: &mut Command, feed: F, limits: Limits) -> Result<Finished>
where
    F: FnOnce(ChildStdin) -> Result<()> + Send + 'static,
{
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().context("starting the command")?;
    let deadline = Instant::now() + limits.deadline;
    let stdin = child.stdin.take().expect("piped stdin");
    let feeder = std::thread::spawn(move || feed(stdin));
    let (stdout, stderr) = match collect(&mut child, limits, deadline) {
        Ok(streams) => streams,
        Err(overrun) => return Err(kill(&mut child, overrun)),
    };
    let status = wait_until(&mut child, limits.deadline, deadline)?;
    let fed = feeder
        .join()
        .unwrap_or_else(|_| Err(anyhow::anyhow!("feeding the command panicked")));
    Ok(Finished {
        status,
        stdout,
        stderr,
        fed,
    })
}

/// Reads stdout (capped) and stderr (kept to [`STDERR_BYTES`]) to their ends.
fn collect(child: &mut Child, limits: Limits, deadline: Instant) -> Result<(Vec<u8>, Vec<u8>), Overrun> {
    let (send, receive) = mpsc::channel();
    let (out, err) = (child.stdout.take(), child.stderr.take());
    let send_err = send.clone();
    std::thread::spawn(move || {
        let _ = send.send(Stream::Out(out.and_then(|o| read_capped(o, limits.stdout_bytes))));
    });
    std::thread::spawn(move || {
        let _ = send_err.send(Stream::Err(err.map(read_stderr).unwrap_or_default()));
    });
    let (mut stdout, mut stderr) = (None, None);
    while stdout.is_none() || stderr.is_none() {
        let left = deadline.saturating_duration_since(Instant::now());
        match receive.recv_timeout(left) {
            Ok(Stream::Out(Some(bytes))) => stdout = Some(bytes),
            Ok(Stream::Out(None)) => return Err(Overrun::Bytes(limits.stdout_bytes)),
            Ok(Stream::Err(bytes)) => stderr = Some(bytes),
            Err(_) => return Err(Overrun::Time(limits.deadline)),
        }
    }
    Ok((stdout.unwrap_or_default(), stderr.unwrap_or_default()))
}

/// All of `from`, or `None` past `limit` bytes.
pub fn read_capped(from: impl Read, limit: u64) -> Option<Vec<u8>> {
    let mut bytes = Vec::new();
    let _ = from.take(limit.saturating_add(1)).read_to_end(&mut bytes);
    (bytes.len() as u64 <= limit).then_some(bytes)
}

/// The first [`STDERR_BYTES`] of `from`, the rest drained.
fn read_stderr(mut from: impl Read) -> Vec<u8> {
    let mut kept = Vec::new();
    let _ = from.by_ref().take(STDERR_BYTES).read_to_end(&mut kept);
    let _ = std::io::copy(&mut from, &mut std::io::sink());
    kept
}

/// Waits for the child's exit until `deadline`, else kills it.
fn wait_until(child: &mut Child, allowed: Duration, deadline: Instant) -> Result<ExitStatus> {
    loop {
        if let Some(status) = child.try_wait().context("waiting for the command")? {
            return Ok(status);
        }
        if Instant::now() >= deadline {
            return Err(kill(child, Overrun::Time(allowed)));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn kill(child: &mut Child, overrun: Overrun) -> anyhow::Error {
    let _ = child.kill();
    let _ = child.wait();
    overrun.into()
}

/// The first line `child` prints (at most `limit` bytes), within `allowed`;
/// past either the child is killed. Its stdout is not read further.
pub fn first_line(child: &mut Child, limit: u64, allowed: Duration) -> Result<String> {
    let out = child.stdout.take().expect("piped stdout");
    let (send, receive) = mpsc::channel();
    std::thread::spawn(move || {
        let mut line = Vec::new();
        let _ = BufReader::new(out.take(limit)).read_until(b'\n', &mut line);
        let _ = send.send(line);
    });
    match receive.recv_timeout(allowed) {
        Ok(line) => Ok(String::from_utf8_lossy(&line).into_owned()),
        Err(_) => Err(kill(child, Overrun::Time(allowed))),
    }
}

/// Waits at most `allowed` for the child to exit, then kills it.
pub fn finish_within(child: &mut Child, allowed: Duration) -> Result<ExitStatus> {
    wait_until(child, allowed, Instant::now() + allowed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str) -> Command {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", script]);
        cmd
    }

    fn limits(deadline_ms: u64, stdout_bytes: u64) -> Limits {
        Limits {
            deadline: Duration::from_millis(deadline_ms),
            stdout_bytes,
        }
    }

    fn feed(data: &'static [u8]) -> impl FnOnce(ChildStdin) -> Result<()> + Send + 'static {
        move |mut stdin| Ok(std::io::Write::write_all(&mut stdin, data)?)
    }

    #[test]
    fn a_run_within_its_limits_gives_its_output_and_status() {
        let done = run(
            &mut sh("cat; echo oops >&2; exit 3"),
            feed(b"hello"),
            limits(20_000, 5),
        )
        .unwrap();
        assert_eq!(done.status.code(), Some(3));
        assert_eq!(done.stdout, b"hello");
        assert_eq!(done.stderr, b"oops\n");
        done.fed.unwrap();
    }

    #[test]
    fn a_huge_answer_is_cut_at_the_cap_and_the_command_killed() {
        let started = Instant::now();
        let err = run(&mut sh("yes"), feed(b""), limits(60_000, 1 << 20))
            .err()
            .expect("past the cap");
        assert_eq!(err.downcast_ref::<Overrun>(), Some(&Overrun::Bytes(1 << 20)));
        assert!(err.to_string().contains("passed 1048576 bytes"), "{err}");
        assert!(started.elapsed() < Duration::from_secs(30));
        assert_eq!(read_capped(&b"12345"[..], 5).as_deref(), Some(&b"12345"[..]));
        assert_eq!(read_capped(&b"123456"[..], 5), None);
    }

    #[test]
    fn a_command_that_never_answers_is_killed_at_the_deadline() {
        let started = Instant::now();
        let err = run(&mut sh("sleep 60"), feed(b""), limits(300, 10))
            .err()
            .expect("past the deadline");
        assert!(
            matches!(err.downcast_ref::<Overrun>(), Some(Overrun::Time(_))),
            "{err}"
        );
        assert!(err.to_string().contains("no answer within 0.3 s"), "{err}");
        assert!(started.elapsed() < Duration::from_secs(10));
        // A child that closes its pipes but does not exit is killed too.
        let err = run(&mut sh("exec >&- 2>&-; sleep 60"), feed(b""), limits(300, 10))
            .err()
            .expect("past the deadline");
        assert!(
            matches!(err.downcast_ref::<Overrun>(), Some(Overrun::Time(_))),
            "{err}"
        );
    }

    #[test]
    fn waiting_for_a_first_line_that_never_comes_ends_at_the_deadline() {
        let spawn = |script: &str| sh(script).stdout(Stdio::piped()).spawn().unwrap();
        let mut child = spawn("echo locked; sleep 60");
        assert_eq!(
            first_line(&mut child, 64, Duration::from_secs(20)).unwrap(),
            "locked\n"
        );
        let _ = child.kill();
        let _ = child.wait();
        let started = Instant::now();
        let mut silent = spawn("sleep 60");
        let err = first_line(&mut silent, 64, Duration::from_millis(300)).unwrap_err();
        assert!(err.to_string().contains("no answer within"), "{err}");
        assert!(silent.try_wait().unwrap().is_some(), "the child was not killed");
        assert!(started.elapsed() < Duration::from_secs(10));
        let mut stuck = spawn("sleep 60");
        assert!(finish_within(&mut stuck, Duration::from_millis(200)).is_err());
        assert!(stuck.try_wait().unwrap().is_some());
    }
}
