use std::process::ExitCode;

fn main() -> ExitCode {
    imgbuild::cli::main()
}
