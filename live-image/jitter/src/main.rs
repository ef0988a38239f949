use std::process::ExitCode;

fn main() -> ExitCode {
    jitter::cli::main()
}
