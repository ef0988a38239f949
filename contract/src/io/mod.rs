//! File helpers both sides need: the confined root every write into an
//! image tree or a sysroot goes through, and sha256.

pub mod root;

use sha2::{Digest, Sha256};

/// The sha256 of `data`, as lowercase hex.
pub fn sha256_hex(data: impl AsRef<[u8]>) -> String {
    hex::encode(Sha256::digest(data.as_ref()))
}
