//! The worst-case load on the housekeeping CPUs while cyclictest measures the
//! RT CPUs: hackbench in a loop, a CPU burner per housekeeping CPU, and a
//! dd-style writer into tmpfs. Everything is pinned. Every hackbench runs in
//! one process group, which stopping kills and which a guard process kills
//! when jitter dies in any other way (even `kill -9`), so no load process
//! outlives jitter.

use std::fs::File;
use std::io::{Seek, Write};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use anyhow::{Context, Result};
use rtreport::report::LoadReport;

use crate::child::die_with_jitter;
use crate::cpus::CpuSet;

fn cpu_set(cpus: &CpuSet) -> libc::cpu_set_t {
    // SAFETY: cpu_set_t is plain data; CPU_ZERO/CPU_SET only write inside it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_ZERO(&mut set);
        for cpu in cpus.iter() {
            libc::CPU_SET(cpu as usize, &mut set);
        }
        set
    }
}

/// Pins the calling thread (pid 0 = the caller) to `cpus`.
pub fn pin_current_thread(cpus: &CpuSet) -> std::io::Result<()> {
    let set = cpu_set(cpus);
    // SAFETY: passes a valid, initialized cpu_set_t of the right size.
    let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

struct Shared {
    stop: AtomicBool,
    hackbench_runs: AtomicU64,
    hackbench_failures: AtomicU64,
    io_bytes: AtomicU64,
    /// The process group every hackbench joins: the guard's.
    group: libc::pid_t,
    last_error: Mutex<Option<String>>,
}

pub struct Load {
    shared: Arc<Shared>,
    /// Kept for its stdin: closing it (jitter exiting) fires the guard.
    _guard: Child,
    threads: Vec<JoinHandle<()>>,
    burners: u32,
    cpus: CpuSet,
}

/// A directory on tmpfs for the I/O writer.
fn tmpfs_dir() -> PathBuf {
    let shm = PathBuf::from("/dev/shm");
    if shm.is_dir() { shm } else { std::env::temp_dir() }
}

impl Load {
    /// Starts the load on `cpus`. `hackbench` must be on PATH.
    pub fn start(cpus: &CpuSet) -> Result<Load> {
        // hackbench's workers outlive a killed parent for a moment; as their
        // subreaper jitter collects them itself before it exits.
        // SAFETY: prctl with integer arguments only.
        unsafe {
            libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
        }
        let guard = start_guard()?;
        let shared = Arc::new(Shared {
            stop: AtomicBool::new(false),
            hackbench_runs: AtomicU64::new(0),
            hackbench_failures: AtomicU64::new(0),
            io_bytes: AtomicU64::new(0),
            group: guard.id() as libc::pid_t,
            last_error: Mutex::new(None),
        });
        let mut threads = Vec::new();

        let (s, pin) = (shared.clone(), cpus.clone());
        threads.push(
            std::thread::Builder::new()
                .name("hackbench".into())
                .spawn(move || hackbench_loop(&s, &pin))?,
        );

        for cpu in cpus.iter() {
            let s = shared.clone();
            let one = CpuSet([cpu].into_iter().collect());
            threads.push(
                std::thread::Builder::new()
                    .name(format!("burn{cpu}"))
                    .spawn(move || {
                        let _ = pin_current_thread(&one);
                        let mut x = 0u64;
                        while !s.stop.load(Ordering::Relaxed) {
                            for _ in 0..100_000 {
                                x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
                            }
                        }
                    })?,
            );
        }

        // Unnamed (O_TMPFILE): nothing to guess, and nothing left in RAM
        // even when jitter is killed.
        let dir = tmpfs_dir();
        let io_file = tempfile::tempfile_in(&dir)
            .with_context(|| format!("creating the I/O load's file in {}", dir.display()))?;
        let (s, pin) = (shared.clone(), cpus.clone());
        threads.push(
            std::thread::Builder::new()
                .name("io".into())
                .spawn(move || io_loop(&s, &pin, io_file))?,
        );
        Ok(Load {
            shared,
            _guard: guard,
            threads,
            burners: cpus.len() as u32,
            cpus: cpus.clone(),
        })
    }

    /// Stops every load process and thread and reports what ran.
    pub fn stop(mut self) -> LoadReport {
        self.shutdown();
        LoadReport {
            enabled: true,
            hackbench_runs: self.shared.hackbench_runs.load(Ordering::SeqCst),
            hackbench_failures: self.shared.hackbench_failures.load(Ordering::SeqCst),
            burner_threads: self.burners,
            io_bytes: self.shared.io_bytes.load(Ordering::SeqCst),
            cpus: self.cpus.clone(),
        }
    }

    pub fn last_error(&self) -> Option<String> {
        self.shared.last_error.lock().ok().and_then(|e| e.clone())
    }

    fn shutdown(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        kill_group(&self.shared);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
        // A hackbench may have started between the kill and the join.
        kill_group(&self.shared);
        reap_orphans();
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Starts the guard: a shell leading a new process group, which kills that
/// whole group once its stdin reaches end of file, that is once jitter has
/// exited, however it exited. The kernel's parent-death signal (see
/// [`die_with_jitter`]) reaches hackbench but not its workers, which wait
/// forever for a start signal when hackbench dies before sending it.
fn start_guard() -> Result<Child> {
    Command::new("sh")
        .args(["-c", "read -r line; kill -KILL 0"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .context("starting the process that stops the load if jitter dies")
}

/// Kills every hackbench and its workers, and the guard.
fn kill_group(shared: &Shared) {
    // SAFETY: sends a signal to the process group we created; no memory involved.
    unsafe {
        libc::killpg(shared.group, libc::SIGKILL);
    }
}

/// Waits for the killed hackbench workers that were reparented to us.
fn reap_orphans() {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let mut status = 0;
        // SAFETY: waitpid writes only into `status`.
        let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
        match pid {
            p if p > 0 => continue,
            0 if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(20))
            }
            _ => return, // no children left (ECHILD), or gave up
        }
    }
}

fn hackbench_loop(shared: &Shared, cpus: &CpuSet) {
    while !shared.stop.load(Ordering::SeqCst) {
        let set = cpu_set(cpus);
        let mut command = Command::new("hackbench");
        die_with_jitter(&mut command)
            .args(["-g", "4", "-l", "200", "-s", "512"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .process_group(shared.group);
        // SAFETY: sched_setaffinity is async-signal-safe; the set is a copy
        // owned by the closure.
        unsafe {
            command.pre_exec(move || {
                if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = match command.spawn() {
            Ok(child) => child,
            Err(e) => {
                shared.hackbench_failures.fetch_add(1, Ordering::SeqCst);
                *shared.last_error.lock().expect("lock") = Some(format!("starting hackbench: {e}"));
                return;
            }
        };
        let output = child.wait_with_output();
        match output {
            Ok(out) if out.status.success() => {
                shared.hackbench_runs.fetch_add(1, Ordering::SeqCst);
            }
            // Killed by us at the end: the run was under way, so it counts.
            Ok(_) if shared.stop.load(Ordering::SeqCst) => {
                shared.hackbench_runs.fetch_add(1, Ordering::SeqCst);
            }
            Ok(out) => {
                shared.hackbench_failures.fetch_add(1, Ordering::SeqCst);
                *shared.last_error.lock().expect("lock") = Some(format!(
                    "hackbench: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                ));
                std::thread::sleep(std::time::Duration::from_millis(200));
            }
            Err(e) => {
                shared.hackbench_failures.fetch_add(1, Ordering::SeqCst);
                *shared.last_error.lock().expect("lock") = Some(format!("waiting for hackbench: {e}"));
            }
        }
    }
}

fn io_loop(shared: &Shared, cpus: &CpuSet, mut file: File) {
    let _ = pin_current_thread(cpus);
    let block = vec![0x5au8; 1 << 20];
    while !shared.stop.load(Ordering::SeqCst) {
        let result = (|| -> Result<()> {
            file.set_len(0)?;
            file.rewind()?;
            for _ in 0..32 {
                if shared.stop.load(Ordering::SeqCst) {
                    break;
                }
                file.write_all(&block)?;
                shared.io_bytes.fetch_add(block.len() as u64, Ordering::SeqCst);
            }
            file.sync_all()?;
            Ok(())
        })();
        if let Err(e) = result {
            *shared.last_error.lock().expect("lock") = Some(format!("I/O writer: {e:#}"));
            std::thread::sleep(std::time::Duration::from_millis(500));
        }
    }
}
