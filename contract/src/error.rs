//! Errors that callers (and the exit code) need to tell apart.

use std::fmt;

/// Exit codes of the CLI contract.
pub mod exit {
    pub const OK: u8 = 0;
    pub const ERROR: u8 = 1;
    pub const USAGE: u8 = 2;
    pub const REFUSED: u8 = 3;
}

/// The RT gate (or another fail-closed check) said no. Exit code 3.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct Refused {
    /// The stage or check that refused.
    pub stage: String,
    pub summary: String,
    /// One line per failed check or dropped symbol.
    pub reasons: Vec<String>,
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "refused by {}: {}", self.stage, self.summary)?;
        for reason in &self.reasons {
            write!(f, "\n  - {reason}")?;
        }
        Ok(())
    }
}

/// A host program the stage needs is not installed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "`{tool}` is not installed (not found on PATH): install the Debian package with `apt-get install {package}`"
)]
pub struct MissingTool {
    pub tool: String,
    pub package: String,
}

/// A command-line value that is wrong (exit code 2): named, and nothing
/// was written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{option}: {message}")]
pub struct BadInput {
    /// The option as the user typed it, e.g. `--size`.
    pub option: String,
    pub message: String,
}

impl BadInput {
    pub fn new(option: &str, message: impl Into<String>) -> BadInput {
        BadInput {
            option: option.to_string(),
            message: message.into(),
        }
    }
}

/// Maps an error chain to the process exit code.
pub fn exit_code(error: &anyhow::Error) -> u8 {
    if error
        .chain()
        .any(|e| e.is::<Refused>() || e.is::<rtreport::container::Refusal>())
    {
        exit::REFUSED
    } else if error.chain().any(|e| e.is::<BadInput>()) {
        exit::USAGE
    } else {
        exit::ERROR
    }
}

/// The end of a command-line program: a parse error is printed with exit 2
/// (help and version with 0), a run's error with the code [`exit_code`] maps.
pub fn finish<C>(
    parsed: Result<C, clap::Error>,
    run: impl FnOnce(C) -> anyhow::Result<u8>,
) -> std::process::ExitCode {
    let cli = match parsed {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return std::process::ExitCode::from(if e.use_stderr() { exit::USAGE } else { exit::OK });
        }
    };
    match run(cli) {
        Ok(code) => std::process::ExitCode::from(code),
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::from(exit_code(&e))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyhow::Context;

    #[test]
    fn refused_anywhere_in_the_chain_is_exit_3() {
        let refused = Refused {
            stage: "kconfig".into(),
            summary: "1 requested symbol dropped".into(),
            reasons: vec!["CONFIG_PREEMPT_RT".into()],
        };
        let err = Err::<(), _>(refused).context("running the pipeline").unwrap_err();
        assert_eq!(exit_code(&err), exit::REFUSED);
        assert!(format!("{err:#}").contains("CONFIG_PREEMPT_RT"));
        let bad = Err::<(), _>(BadInput::new("--size", "not a size"))
            .context("building the disk")
            .unwrap_err();
        assert_eq!(exit_code(&bad), exit::USAGE);
        let other = anyhow::anyhow!("disk full");
        assert_eq!(exit_code(&other), exit::ERROR);
    }
}
