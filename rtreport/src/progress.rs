//! The progress line `jitter --progress` prints on stderr while it measures,
//! and imgbuild reads back over SSH:
//!
//! ```text
//! jitter: progress 12/300 s, worst case 42 us
//! jitter: progress 12/300 s
//! ```
//!
//! The second form is printed while the worst case is not yet known. A soak
//! (`jitter --checkpoint-dir`) adds the samples taken so far:
//!
//! ```text
//! jitter: progress 120/259200 s, worst case 42 us, 1200000 samples
//! jitter: progress 120/259200 s, 1200000 samples
//! ```

use std::fmt;

const PREFIX: &str = "jitter: progress ";
const WORST_CASE: &str = ", worst case ";
const SAMPLES: &str = " samples";

/// How far a measurement is, and its worst latency so far.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Progress {
    /// Seconds measured so far.
    pub elapsed_s: u64,
    /// Seconds the measurement lasts.
    pub total_s: u64,
    /// The highest latency any measuring thread has seen so far, in µs;
    /// `None` while none has reported yet.
    pub worst_us: Option<u64>,
    /// Samples taken so far over every core, printed by a soak only.
    pub samples: Option<u64>,
}

impl fmt::Display for Progress {
    /// The line, without a line ending.
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "{PREFIX}{}/{} s", self.elapsed_s, self.total_s)?;
        if let Some(worst) = self.worst_us {
            write!(f, "{WORST_CASE}{worst} us")?;
        }
        if let Some(samples) = self.samples {
            write!(f, ", {samples}{SAMPLES}")?;
        }
        Ok(())
    }
}

impl Progress {
    /// The inverse of `Display`: `None` for any other line. One line ending
    /// (`\n`, `\r\n` or `\r`, as a terminal over SSH may add) is accepted.
    pub fn parse(line: &str) -> Option<Progress> {
        let line = line.strip_suffix('\n').unwrap_or(line);
        let line = line.strip_suffix('\r').unwrap_or(line);
        let rest = line.strip_prefix(PREFIX)?;
        let (rest, samples) = match rest.strip_suffix(SAMPLES) {
            Some(head) => {
                let (rest, samples) = head.rsplit_once(", ")?;
                (rest, Some(samples.parse().ok()?))
            }
            None => (rest, None),
        };
        let (seconds, worst_us) = match rest.split_once(WORST_CASE) {
            Some((seconds, worst)) => (seconds, Some(worst.strip_suffix(" us")?.parse().ok()?)),
            None => (rest, None),
        };
        let (elapsed, total) = seconds.strip_suffix(" s")?.split_once('/')?;
        let progress = Progress {
            elapsed_s: elapsed.parse().ok()?,
            total_s: total.parse().ok()?,
            worst_us,
            samples,
        };
        // Only what Display prints: no `+12`, `012` or extra spaces.
        (progress.to_string() == line).then_some(progress)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exact_lines() {
        let known = Progress {
            elapsed_s: 12,
            total_s: 300,
            worst_us: Some(42),
            samples: None,
        };
        assert_eq!(known.to_string(), "jitter: progress 12/300 s, worst case 42 us");
        let unknown = Progress {
            worst_us: None,
            ..known
        };
        assert_eq!(unknown.to_string(), "jitter: progress 12/300 s");
        assert_eq!(
            Progress::parse("jitter: progress 12/300 s, worst case 42 us"),
            Some(known)
        );
        assert_eq!(Progress::parse("jitter: progress 12/300 s"), Some(unknown));
    }

    #[test]
    fn soak_lines_carry_the_samples() {
        let soak = Progress {
            elapsed_s: 120,
            total_s: 259_200,
            worst_us: Some(42),
            samples: Some(1_200_000),
        };
        let line = "jitter: progress 120/259200 s, worst case 42 us, 1200000 samples";
        assert_eq!(soak.to_string(), line);
        assert_eq!(Progress::parse(line), Some(soak));
        let early = Progress {
            worst_us: None,
            ..soak
        };
        assert_eq!(
            early.to_string(),
            "jitter: progress 120/259200 s, 1200000 samples"
        );
        assert_eq!(Progress::parse(&early.to_string()), Some(early));
        assert_eq!(Progress::parse(&format!("{line}\r\n")), Some(soak));
        for broken in [
            "jitter: progress 120/259200 s, worst case 42 us, samples",
            "jitter: progress 120/259200 s, worst case 42 us,  1200000 samples",
            "jitter: progress 120/259200 s, worst case 42 us, 1200000",
            "jitter: progress 120/259200 s, worst case 42 us 1200000 samples",
            "jitter: progress 120/259200 s, worst case 42 us, -1 samples",
            "jitter: progress 120/259200 s, worst case 42 us, 01 samples",
            "jitter: progress 120/259200 s, 1 samples, worst case 42 us",
            "jitter: progress 1200000 samples",
        ] {
            assert_eq!(Progress::parse(broken), None, "{broken:?}");
        }
    }

    #[test]
    fn line_endings_are_tolerated() {
        let expected = Some(Progress {
            elapsed_s: 2,
            total_s: 8,
            worst_us: Some(7),
            samples: None,
        });
        for line in [
            "jitter: progress 2/8 s, worst case 7 us\r",
            "jitter: progress 2/8 s, worst case 7 us\r\n",
            "jitter: progress 2/8 s, worst case 7 us\n",
        ] {
            assert_eq!(Progress::parse(line), expected, "{line:?}");
        }
    }

    #[test]
    fn other_lines_are_rejected() {
        for line in [
            "",
            "jitter: progress",
            "jitter: progress ",
            "jitter: progress 12/300",
            "jitter: progress 12/300 s,",
            "jitter: progress 12/300 s, worst case",
            "jitter: progress 12/300 s, worst case  us",
            "jitter: progress 12/300 s, worst case 42",
            "jitter: progress 12/300 s, worst case 42 ms",
            "jitter: progress 12/300 s, worst case -1 us",
            "jitter: progress 12/300 s, worst case 42 us extra",
            "jitter: progress +12/300 s",
            "jitter: progress 012/300 s",
            "jitter: progress 12 /300 s",
            "jitter: progress 12/300 s ",
            " jitter: progress 12/300 s",
            "jitter: progress 12/300/4 s",
            "jitter: progress 18446744073709551616/300 s",
            "jitter: progress 12/300 s\r\r",
            "jitter: progress 12/300 s\n\n",
            "jitter: measuring CPUs 1 for 300 s (load on CPUs 0): cyclictest -m -q",
            "T: 0 ( 1234) P:99 I:200 C:   1000 Min:      3 Act:    5 Avg:    4 Max:      42",
        ] {
            assert_eq!(Progress::parse(line), None, "{line:?}");
        }
    }

    proptest::proptest! {
        #[test]
        fn round_trip(elapsed_s: u64, total_s: u64, worst_us: Option<u64>, samples: Option<u64>) {
            let progress = Progress { elapsed_s, total_s, worst_us, samples };
            proptest::prop_assert_eq!(Progress::parse(&progress.to_string()), Some(progress));
        }

        #[test]
        fn never_panics(line in "\\PC*") {
            let _ = Progress::parse(&line);
        }

        /// Lines close to the format parse only when they are exactly what
        /// Display prints.
        #[test]
        fn only_its_own_lines_parse(
            line in "jitter: progress [0-9+ ]{0,3}/[0-9 ]{0,3} s(, worst case [0-9 ]{0,3} us)?(,? ?[0-9+ ]{0,3} samples)?"
        ) {
            if let Some(progress) = Progress::parse(&line) {
                proptest::prop_assert_eq!(progress.to_string(), line);
            }
        }
    }
}
