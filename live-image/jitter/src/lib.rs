//! jitter: qualifies RT hardware by measuring worst-case wake-up latency with
//! cyclictest on the RT CPUs while the housekeeping CPUs are saturated, then
//! gives a verdict: PASS, FAIL, or INVALID with the reasons the measurement
//! cannot be trusted.

pub mod checkpoint;
pub mod child;
pub mod cli;
pub mod conformance;
pub mod container;
pub mod cpus;
pub mod cyclictest;
pub mod load;
pub mod output;
pub mod plot;
pub mod process;
pub mod progress;
pub mod report;
pub mod rtla;
pub mod run;
pub mod session;
pub mod system;
pub mod timerlat;
pub mod verdict;
