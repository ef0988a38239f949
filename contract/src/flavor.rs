//! The two flavors of EmberRTOS and how a ref names its flavor: the ref
//! (`<os>/<arch>/rt` or `<os>/<arch>/standard`) is the policy, whatever a
//! commit says of itself.

use std::fmt;

use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Flavor {
    /// PREEMPT_RT kernel: the RT gate applies.
    Rt,
    /// General-purpose kernel.
    Standard,
}

impl fmt::Display for Flavor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Flavor::Rt => "rt",
            Flavor::Standard => "standard",
        })
    }
}

/// A ref's flavor is policy, from its name: a ref whose last component is
/// `rt` is an rt ref, every other ref is standard. What a commit says about
/// itself does not enter into it.
pub fn flavor_of_ref(ref_name: &str) -> Flavor {
    let ref_name = ref_name.rsplit_once(':').map_or(ref_name, |(_, r)| r);
    match ref_name.rsplit('/').next() {
        Some("rt") => Flavor::Rt,
        _ => Flavor::Standard,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flavor_comes_from_the_ref_name() {
        assert_eq!(flavor_of_ref("emberrtos/x86_64/rt"), Flavor::Rt);
        assert_eq!(flavor_of_ref("emberrtos-ci/x86_64/rt"), Flavor::Rt);
        assert_eq!(flavor_of_ref("rt"), Flavor::Rt);
        assert_eq!(flavor_of_ref("origin:emberrtos/x86_64/rt"), Flavor::Rt);
        assert_eq!(flavor_of_ref("emberrtos/x86_64/standard"), Flavor::Standard);
        assert_eq!(flavor_of_ref("emberrtos/x86_64/rt-test"), Flavor::Standard);
        assert_eq!(flavor_of_ref("emberrtos/rt/x86_64"), Flavor::Standard);
        assert_eq!(flavor_of_ref(""), Flavor::Standard);
    }
}
