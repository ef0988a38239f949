//! Known vulnerabilities of a commit: the Debian source packages its SBOM
//! lists, matched against the Debian security tracker's data for the
//! commit's Debian release.

pub mod matching;
pub mod report;
pub mod sources;
pub mod tracker;
