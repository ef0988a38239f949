//! The machines EmberRTOS is built for, and each name a machine goes by:
//! in a recipe, in a ref, in `uname -m`, in Debian and in Kbuild.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Arch {
    #[default]
    #[serde(rename = "x86_64")]
    X86_64,
    #[serde(rename = "arm64")]
    Arm64,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown architecture {0:?}: x86_64 or arm64")]
pub struct UnknownArch(pub String);

impl Arch {
    pub const ALL: [Arch; 2] = [Arch::X86_64, Arch::Arm64];

    /// The recipe's name (`arch:`), which is also the commit metadata's.
    pub const fn name(self) -> &'static str {
        match self {
            Arch::X86_64 => "x86_64",
            Arch::Arm64 => "arm64",
        }
    }

    /// What `uname -m` prints on it, and the path component refs use.
    pub const fn machine(self) -> &'static str {
        match self {
            Arch::X86_64 => "x86_64",
            Arch::Arm64 => "aarch64",
        }
    }

    /// Debian's name (`dpkg --print-architecture`, `mmdebstrap --architectures`).
    pub const fn debian(self) -> &'static str {
        match self {
            Arch::X86_64 => "amd64",
            Arch::Arm64 => "arm64",
        }
    }

    /// Kbuild's `ARCH=`.
    pub const fn kbuild(self) -> &'static str {
        match self {
            Arch::X86_64 => "x86",
            Arch::Arm64 => "arm64",
        }
    }

    /// Debian's multiarch tuple, the directory of its libraries under
    /// `/usr/lib` and the prefix of its cross tools (`aarch64-linux-gnu-gcc`).
    pub const fn multiarch(self) -> &'static str {
        match self {
            Arch::X86_64 => "x86_64-linux-gnu",
            Arch::Arm64 => "aarch64-linux-gnu",
        }
    }

    /// Rust's target triple (`cargo build --target`).
    pub const fn rust_target(self) -> &'static str {
        match self {
            Arch::X86_64 => "x86_64-unknown-linux-gnu",
            Arch::Arm64 => "aarch64-unknown-linux-gnu",
        }
    }

    /// The machine this program was built for: imgbuild's build host.
    pub const fn host() -> Arch {
        if cfg!(target_arch = "aarch64") {
            Arch::Arm64
        } else {
            Arch::X86_64
        }
    }

    /// The architecture `uname -m` names (`x86_64`, `aarch64`).
    pub fn from_machine(machine: &str) -> Option<Arch> {
        Arch::ALL.into_iter().find(|a| a.machine() == machine.trim())
    }
}

impl fmt::Display for Arch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Arch {
    type Err = UnknownArch;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Arch::ALL
            .into_iter()
            .find(|a| a.name() == s)
            .ok_or_else(|| UnknownArch(s.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_reads_back() {
        for arch in Arch::ALL {
            assert_eq!(arch.name().parse::<Arch>(), Ok(arch));
            assert_eq!(Arch::from_machine(arch.machine()), Some(arch));
            let json = serde_json::to_string(&arch).unwrap();
            assert_eq!(json, format!("\"{}\"", arch.name()));
        }
        assert_eq!(Arch::default(), Arch::X86_64);
        for arch in Arch::ALL {
            assert!(arch.multiarch().starts_with(arch.machine()));
            assert!(arch.rust_target().starts_with(arch.machine()));
        }
    }

    #[test]
    fn other_spellings_are_refused_naming_the_choices() {
        for bad in ["aarch64", "amd64", "ARM64", "", "x86-64"] {
            let err = bad.parse::<Arch>().unwrap_err();
            assert!(err.to_string().contains("x86_64 or arm64"), "{err}");
        }
        assert_eq!(Arch::from_machine("armv7l"), None);
    }
}
