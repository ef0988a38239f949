//! `--progress`: every 2 s while cyclictest measures, one
//! [`Progress`] line on stderr with the worst latency so far.
//!
//! The worst case comes from cyclictest itself: on SIGUSR1 it prints every
//! thread's status (with its `Max:`) on stderr, which the thread reading
//! that pipe passes to a [`LiveWorst`]. SIGUSR1 kills cyclictest until it
//! has installed its handler, so it is sent only once `/proc/PID/status`
//! shows the signal caught.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rtreport::report::Progress;

/// Time between two progress lines.
const INTERVAL: Duration = Duration::from_secs(2);
/// How long before a line cyclictest is asked for its status, so that the
/// line shows a fresh worst case.
const ASK_AHEAD: Duration = Duration::from_millis(300);

/// The worst latency cyclictest has reported so far, shared between the
/// thread reading its stderr and the one printing progress.
#[derive(Clone, Debug, Default)]
pub struct LiveWorst(Arc<Mutex<Option<u64>>>);

impl LiveWorst {
    pub fn record(&self, latency_us: u64) {
        let mut worst = self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        *worst = Some(worst.map_or(latency_us, |worst| worst.max(latency_us)));
    }

    pub fn get(&self) -> Option<u64> {
        *self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Whether the process whose `/proc/PID/status` is `status` catches
/// `signal` (has a handler for it): bit `signal - 1` of its `SigCgt` mask.
pub fn catches_signal(status: &str, signal: i32) -> bool {
    let Some(bit) = signal.checked_sub(1).and_then(|bit| u32::try_from(bit).ok()) else {
        return false;
    };
    status
        .lines()
        .find_map(|line| line.strip_prefix("SigCgt:"))
        .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
        .is_some_and(|mask| mask.checked_shr(bit).is_some_and(|m| m & 1 == 1))
}

/// What to do at one moment of the measurement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    Wait,
    AskStatus,
    PrintLine { elapsed_s: u64 },
}

/// When to ask for cyclictest's status and when to print: a line every
/// [`INTERVAL`], each [`ASK_AHEAD`] after its request, none once the
/// measurement is over.
#[derive(Clone, Debug)]
struct Schedule {
    total_s: u64,
    next_line: Duration,
    asked: bool,
}

impl Schedule {
    fn new(total_s: u64) -> Schedule {
        Schedule {
            total_s,
            next_line: INTERVAL,
            asked: false,
        }
    }

    fn step(&mut self, elapsed: Duration) -> Step {
        if self.next_line >= Duration::from_secs(self.total_s) {
            Step::Wait
        } else if !self.asked && elapsed + ASK_AHEAD >= self.next_line {
            self.asked = true;
            Step::AskStatus
        } else if self.asked && elapsed >= self.next_line {
            self.asked = false;
            // The next multiple of INTERVAL: lines missed by a late call
            // are skipped, not printed in a burst.
            let intervals = elapsed.as_nanos() / INTERVAL.as_nanos() + 1;
            self.next_line = INTERVAL * u32::try_from(intervals).unwrap_or(u32::MAX);
            Step::PrintLine {
                elapsed_s: elapsed.as_secs().min(self.total_s),
            }
        } else {
            Step::Wait
        }
    }
}

/// Where a soak stood when the current cyclictest run started: its progress
/// lines count over the whole soak.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SoakSoFar {
    pub elapsed_s: u64,
    pub total_s: u64,
    pub samples: u64,
    pub worst_us: Option<u64>,
}

impl SoakSoFar {
    /// The line `elapsed_s` into the current run, whose worst case so far
    /// is `live_worst_us`.
    fn line(&self, elapsed_s: u64, live_worst_us: Option<u64>) -> Progress {
        Progress {
            elapsed_s: self.elapsed_s + elapsed_s,
            total_s: self.total_s,
            worst_us: self.worst_us.max(live_worst_us),
            samples: Some(self.samples),
        }
    }
}

/// Prints the progress of one cyclictest run; [`Reporter::tick`] is called
/// every 100 ms or so while it runs.
pub struct Reporter {
    cyclictest: libc::pid_t,
    started: Instant,
    schedule: Schedule,
    worst: LiveWorst,
    handler_installed: bool,
    soak: Option<SoakSoFar>,
}

impl Reporter {
    /// For the cyclictest just started as `pid`, measuring for `total_s`,
    /// within `soak` if it is one run of a soak.
    pub fn new(pid: u32, total_s: u64, worst: LiveWorst, soak: Option<SoakSoFar>) -> Reporter {
        Reporter {
            cyclictest: pid as libc::pid_t,
            started: Instant::now(),
            schedule: Schedule::new(total_s),
            worst,
            handler_installed: false,
            soak,
        }
    }

    pub fn tick(&mut self) {
        match self.schedule.step(self.started.elapsed()) {
            Step::Wait => {}
            Step::AskStatus => self.ask_status(),
            Step::PrintLine { elapsed_s } => {
                let line = match &self.soak {
                    Some(soak) => soak.line(elapsed_s, self.worst.get()),
                    None => Progress {
                        elapsed_s,
                        total_s: self.schedule.total_s,
                        worst_us: self.worst.get(),
                        samples: None,
                    },
                };
                eprintln!("{line}");
            }
        }
    }

    /// Sends SIGUSR1 to cyclictest's main thread, once its handler is in
    /// place. The main thread runs on the housekeeping CPUs: a signal to the
    /// process could be handled, and the status printed, by a measuring
    /// thread on an RT CPU.
    fn ask_status(&mut self) {
        self.handler_installed = self.handler_installed || self.catches_sigusr1();
        if self.handler_installed {
            // SAFETY: tgkill only sends a signal; the child is not reaped
            // before the caller stops ticking, so the PID is still ours.
            unsafe {
                libc::syscall(libc::SYS_tgkill, self.cyclictest, self.cyclictest, libc::SIGUSR1);
            }
        }
    }

    fn catches_sigusr1(&self) -> bool {
        std::fs::read_to_string(format!("/proc/{}/status", self.cyclictest))
            .is_ok_and(|status| catches_signal(&status, libc::SIGUSR1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `/proc/PID/status` of cyclictest 2.4 with its handlers installed:
    /// SIGINT, SIGUSR1, SIGUSR2, SIGTERM and glibc's signal 33.
    const CYCLICTEST_STATUS: &str = "Name:\tcyclictest\nState:\tS (sleeping)\nPid:\t5949\n\
        SigQ:\t0/63478\nSigPnd:\t0000000000000000\nShdPnd:\t0000000000000000\n\
        SigBlk:\t0000000000002000\nSigIgn:\t0000000000000000\nSigCgt:\t0000000100004a02\n\
        CapInh:\t0000000000000000\n";

    #[test]
    fn sigcgt_says_which_signals_are_caught() {
        for caught in [libc::SIGINT, libc::SIGUSR1, libc::SIGUSR2, libc::SIGTERM, 33] {
            assert!(catches_signal(CYCLICTEST_STATUS, caught), "{caught}");
        }
        for default in [libc::SIGHUP, libc::SIGPIPE, 32, 64] {
            assert!(!catches_signal(CYCLICTEST_STATUS, default), "{default}");
        }
        // Blocked (SigBlk) is not caught.
        assert!(!catches_signal(CYCLICTEST_STATUS, libc::SIGALRM));
    }

    #[test]
    fn before_its_handler_nothing_is_caught() {
        let starting = CYCLICTEST_STATUS.replace("0000000100004a02", "0000000000000000");
        assert!(!catches_signal(&starting, libc::SIGUSR1));
        assert!(catches_signal("SigCgt:\t8000000000000000\n", 64));
        for broken in ["", "SigCgt:\n", "SigCgt:\tzz\n", "SigCgt:\t10000000000000000\n"] {
            assert!(!catches_signal(broken, libc::SIGUSR1), "{broken:?}");
        }
        for impossible in [0, -1, 65, i32::MAX, i32::MIN] {
            assert!(
                !catches_signal("SigCgt:\tffffffffffffffff\n", impossible),
                "{impossible}"
            );
        }
    }

    #[test]
    fn worst_case_is_the_maximum_so_far() {
        let worst = LiveWorst::default();
        assert_eq!(worst.get(), None);
        let reader = worst.clone();
        for latency in [12, 407, 87] {
            worst.record(latency);
        }
        assert_eq!(reader.get(), Some(407));
    }

    fn steps(total_s: u64, every_ms: u64, until_ms: u64) -> Vec<(u64, Step)> {
        let mut schedule = Schedule::new(total_s);
        (0..=until_ms)
            .step_by(every_ms as usize)
            .map(|ms| (ms, schedule.step(Duration::from_millis(ms))))
            .filter(|(_, step)| *step != Step::Wait)
            .collect()
    }

    #[test]
    fn a_line_every_two_seconds_after_a_request() {
        assert_eq!(
            steps(7, 100, 10_000),
            [
                (1700, Step::AskStatus),
                (2000, Step::PrintLine { elapsed_s: 2 }),
                (3700, Step::AskStatus),
                (4000, Step::PrintLine { elapsed_s: 4 }),
                (5700, Step::AskStatus),
                (6000, Step::PrintLine { elapsed_s: 6 }),
            ]
        );
    }

    #[test]
    fn no_line_at_or_after_the_end() {
        assert_eq!(steps(2, 100, 5000), []);
        assert_eq!(steps(1, 100, 5000), []);
        assert_eq!(steps(3, 100, 5000).len(), 2);
    }

    #[test]
    fn soak_lines_count_over_the_whole_soak() {
        let soak = SoakSoFar {
            elapsed_s: 120,
            total_s: 259_200,
            samples: 1_200_000,
            worst_us: Some(42),
        };
        assert_eq!(
            soak.line(4, Some(17)).to_string(),
            "jitter: progress 124/259200 s, worst case 42 us, 1200000 samples"
        );
        assert_eq!(soak.line(4, Some(50)).worst_us, Some(50));
        let first = SoakSoFar {
            worst_us: None,
            ..SoakSoFar::default()
        };
        assert_eq!(
            first.line(2, None).to_string(),
            "jitter: progress 2/0 s, 0 samples"
        );
    }

    #[test]
    fn late_calls_skip_lines_instead_of_bursting() {
        let mut schedule = Schedule::new(300);
        assert_eq!(schedule.step(Duration::from_millis(5100)), Step::AskStatus);
        assert_eq!(
            schedule.step(Duration::from_millis(5200)),
            Step::PrintLine { elapsed_s: 5 }
        );
        assert_eq!(schedule.step(Duration::from_millis(5300)), Step::Wait);
        assert_eq!(schedule.step(Duration::from_millis(5700)), Step::AskStatus);
        assert_eq!(
            schedule.step(Duration::from_millis(6000)),
            Step::PrintLine { elapsed_s: 6 }
        );
    }
}
