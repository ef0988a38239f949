//! `jitter-docs OUT_DIR`: writes jitter's man page and shell completions from
//! its clap definitions (`ci/package` runs it before `cargo deb`).

use clap::CommandFactory;

fn main() -> std::process::ExitCode {
    cli_docs::generator_main(jitter::cli::Cli::command())
}
