//! Human progress on stderr. Progress bars and spinners are drawn only when
//! stderr is a terminal and `--json` is off; plain lines are always printed.

use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

#[derive(Clone, Debug)]
pub struct Ui {
    animate: bool,
}

impl Ui {
    pub fn new(json: bool) -> Self {
        Ui {
            animate: !json && std::io::stderr().is_terminal(),
        }
    }

    /// A Ui that never draws bars (tests, background use).
    pub fn plain() -> Self {
        Ui { animate: false }
    }

    /// A progress line: `==> [stage] message`.
    pub fn step(&self, stage: &str, message: impl AsRef<str>) {
        eprintln!("==> [{stage}] {}", message.as_ref());
    }

    pub fn note(&self, message: impl AsRef<str>) {
        eprintln!("    {}", message.as_ref());
    }

    pub fn warn(&self, message: impl AsRef<str>) {
        eprintln!("warning: {}", message.as_ref());
    }

    /// Whether bars are drawn (a terminal, no `--json`).
    pub fn is_animated(&self) -> bool {
        self.animate
    }

    /// Bars drawn together, one line each (hidden when not animated).
    pub fn multi(&self) -> MultiProgress {
        MultiProgress::with_draw_target(self.target())
    }

    fn target(&self) -> ProgressDrawTarget {
        if self.animate {
            ProgressDrawTarget::stderr()
        } else {
            ProgressDrawTarget::hidden()
        }
    }

    /// A byte counter with rate and ETA (when the total is known).
    pub fn bytes(&self, total: Option<u64>, message: impl Into<String>) -> ProgressBar {
        let bar = ProgressBar::with_draw_target(total, self.target());
        let template = if total.is_some() {
            "{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} ETA {eta}"
        } else {
            "{msg} {bytes} {bytes_per_sec}"
        };
        bar.set_style(
            ProgressStyle::with_template(template)
                .expect("valid template")
                .progress_chars("=> "),
        );
        bar.set_message(message.into());
        bar
    }

    /// A spinner whose message shows the current activity.
    pub fn spinner(&self, message: impl Into<String>) -> ProgressBar {
        let bar = ProgressBar::with_draw_target(None, self.target());
        bar.set_style(
            ProgressStyle::with_template("{spinner} {elapsed_precise} {msg}").expect("valid template"),
        );
        bar.set_message(message.into());
        if self.animate {
            bar.enable_steady_tick(Duration::from_millis(120));
        }
        bar
    }
}
