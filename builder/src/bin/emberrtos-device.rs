//! `emberrtos-device` (and `emberrtos-update`, the same binary under that
//! name): the device side of EmberRTOS. See `imgbuild::device`.
use std::process::ExitCode;

fn main() -> ExitCode {
    imgbuild::device::cli::main()
}
