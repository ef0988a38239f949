//! The measuring tools (cyclictest, rtla, podman) as child processes of
//! jitter: whether they are installed, the interrupt of jitter that reaches
//! them, running one to its end from the housekeeping CPUs while reading
//! what it prints, and the hint when it lacks privileges.

use std::io::Read;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Result, bail};

use crate::child::die_with_jitter;
use crate::cpus::CpuSet;
use crate::load::pin_current_thread;
use crate::progress::{LiveWorst, Reporter, SoakSoFar};

/// A program jitter needs that is not installed, and its Debian package.
#[derive(Clone, Debug, thiserror::Error)]
#[error(
    "`{program}` is not installed: install the Debian package {package} (apt-get install {package}){note}"
)]
pub struct MissingTool {
    pub program: String,
    pub package: String,
    /// What else to know, e.g. which version is needed.
    pub note: String,
}

impl MissingTool {
    pub fn rt_tests(program: &str) -> MissingTool {
        MissingTool {
            program: program.into(),
            package: "rt-tests".into(),
            note: String::new(),
        }
    }
}

pub(crate) static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

pub(crate) fn install_signal_handlers() {
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe {
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
    }
}

pub(crate) fn on_path(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join(program).is_file()))
}

/// What a measuring tool printed, read to its end.
pub(crate) struct ToolOutput {
    pub stdout: String,
    pub stderr: String,
}

/// How a measuring tool's stderr is read: to its end, into a string.
pub(crate) type StderrReader = Box<dyn FnOnce(std::process::ChildStderr) -> String + Send>;

/// Runs a measuring tool (cyclictest, rtla) to its end from the housekeeping
/// CPUs. An interrupt of jitter reaches it as SIGINT, on which both tools
/// print what they measured. With `progress`, prints the progress line over
/// that many seconds (within a soak, over the whole soak); `worst` is the
/// live worst case it shows.
pub(crate) fn run_tool(
    command: &mut Command,
    missing: MissingTool,
    housekeeping: &CpuSet,
    progress: Option<(u64, Option<SoakSoFar>)>,
    (worst, read_stderr): (LiveWorst, StderrReader),
) -> Result<ToolOutput> {
    // Pin ourselves (and so the tool's start-up) to the housekeeping CPUs.
    let _ = pin_current_thread(housekeeping);
    let mut child = die_with_jitter(command)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => anyhow::Error::new(missing.clone()),
            _ => anyhow::Error::new(e).context(format!("starting {}", missing.program)),
        })?;
    let mut stdout_pipe = child.stdout.take().expect("piped");
    let stderr_pipe = child.stderr.take().expect("piped");
    let out_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stdout_pipe.read_to_string(&mut s);
        s
    });
    let err_reader = std::thread::spawn(move || read_stderr(stderr_pipe));
    let mut progress = progress.map(|(total_s, soak)| Reporter::new(child.id(), total_s, worst, soak));
    let mut forwarded = false;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if INTERRUPTED.load(Ordering::SeqCst) && !forwarded {
            // SAFETY: signals our own child.
            unsafe {
                libc::kill(child.id() as i32, libc::SIGINT);
            }
            forwarded = true;
        }
        if !forwarded && let Some(progress) = progress.as_mut() {
            progress.tick();
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let stdout = out_reader.join().unwrap_or_default();
    let stderr = err_reader.join().unwrap_or_default();
    if !status.success() && !forwarded {
        bail!("{} failed ({status}): {}", missing.program, stderr.trim());
    }
    Ok(ToolOutput { stdout, stderr })
}

/// Adds the hint for a tool that could not lock memory or get RT priority.
pub(crate) fn hint_privileges(error: anyhow::Error) -> anyhow::Error {
    let text = format!("{error:#}").to_lowercase();
    if text.contains("mlockall") || text.contains("scheduling policy") || text.contains("permission denied") {
        anyhow::anyhow!(
            "{error:#}\nhint: run as root on the target (not in an unprivileged container), with RLIMIT_RTPRIO and RLIMIT_MEMLOCK unlimited"
        )
    } else {
        error
    }
}
