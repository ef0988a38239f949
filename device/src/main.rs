//! `emberrtos-device` (and `emberrtos-update`, `emberrtos-rt-run`: the same
//! binary under those names): the device side of EmberRTOS. See the crate's
//! library, `emberrtos_device`.
use std::process::ExitCode;

fn main() -> ExitCode {
    emberrtos_device::cli::main()
}
