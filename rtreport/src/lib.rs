//! What a latency measurement is, shared by the tool that measures (`jitter`)
//! and those that read its results (the device's latency check of trial
//! boots, `imgbuild qualify`): the JSON report ([`report`], `jitter-report/2`)
//! and its `--progress` line ([`Progress`]), the statistics of its tail
//! ([`tail`]), the one profile RT containers run under ([`container`]), and
//! the UTC timestamps reports and records carry ([`utc`]).
//!
//! Pure functions over what callers read, but for [`container::lock_cpu`],
//! the per-CPU lock `emberrtos-rt-run` and `jitter --container` share.

pub mod container;
mod progress;
pub mod report;
pub mod tail;
pub mod utc;

pub use progress::Progress;
