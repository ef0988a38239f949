//! Child processes that cannot outlive jitter. cyclictest runs at SCHED_FIFO
//! 99 and the load saturates the housekeeping CPUs: left behind by a
//! `kill -9` of jitter, they would keep the machine busy until they end.

use std::os::unix::process::CommandExt;
use std::process::Command;

/// Makes the kernel send SIGKILL to the child when jitter dies, however it
/// dies. The signal follows the thread that spawns the child, so spawn from
/// a thread that lives as long as the child should.
pub fn die_with_jitter(command: &mut Command) -> &mut Command {
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: prctl and getppid are async-signal-safe and touch no memory
    // of the parent; the closure only captures a pid.
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // jitter died between the fork and the prctl: nobody would
            // send the signal any more.
            if libc::getppid() != parent {
                return Err(std::io::Error::other("jitter exited while starting a child"));
            }
            Ok(())
        })
    }
}
