//! `imgbuild-docs OUT_DIR`: writes imgbuild's man pages and shell completions
//! from its clap definitions (`ci/package` runs it before `cargo deb`).

use clap::CommandFactory;

fn main() -> std::process::ExitCode {
    cli_docs::generator_main(imgbuild::cli::Cli::command())
}
