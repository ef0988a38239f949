//! The integration tests of jitter: one test binary, one module per area.

mod check;
mod cli;
