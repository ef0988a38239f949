//! Kernel CPU lists (`0-3,5`) and the isolation arguments of the command line.

use std::collections::BTreeSet;
use std::fmt;

#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
#[serde(into = "String", try_from = "String")]
pub struct CpuSet(pub BTreeSet<u32>);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{text:?} is not a CPU list like 0-3,5")]
pub struct CpuListError {
    pub text: String,
}

impl CpuSet {
    /// Parses `0-3,5`; an empty string (or the kernel's `(null)`) is the empty set.
    pub fn parse(text: &str) -> Result<CpuSet, CpuListError> {
        let text = text.trim();
        let error = || CpuListError {
            text: text.to_string(),
        };
        let mut set = BTreeSet::new();
        if text.is_empty() || text == "(null)" {
            return Ok(CpuSet(set));
        }
        for part in text.split(',') {
            let part = part.trim();
            let (low, high) = match part.split_once('-') {
                Some((a, b)) => (
                    a.parse::<u32>().map_err(|_| error())?,
                    b.parse::<u32>().map_err(|_| error())?,
                ),
                None => {
                    let n = part.parse::<u32>().map_err(|_| error())?;
                    (n, n)
                }
            };
            if low > high || high > 8191 {
                return Err(error());
            }
            set.extend(low..=high);
        }
        Ok(CpuSet(set))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn contains(&self, cpu: u32) -> bool {
        self.0.contains(&cpu)
    }

    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.0.iter().copied()
    }

    pub fn union(&self, other: &CpuSet) -> CpuSet {
        CpuSet(self.0.union(&other.0).copied().collect())
    }

    pub fn difference(&self, other: &CpuSet) -> CpuSet {
        CpuSet(self.0.difference(&other.0).copied().collect())
    }

    pub fn intersection(&self, other: &CpuSet) -> CpuSet {
        CpuSet(self.0.intersection(&other.0).copied().collect())
    }

    pub fn is_subset(&self, other: &CpuSet) -> bool {
        self.0.is_subset(&other.0)
    }
}

impl fmt::Display for CpuSet {
    /// The compact kernel form, `0-3,5`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let cpus: Vec<u32> = self.0.iter().copied().collect();
        let mut parts = Vec::new();
        let mut i = 0;
        while i < cpus.len() {
            let start = cpus[i];
            let mut end = start;
            while i + 1 < cpus.len() && cpus[i + 1] == end + 1 {
                i += 1;
                end = cpus[i];
            }
            parts.push(if start == end {
                start.to_string()
            } else {
                format!("{start}-{end}")
            });
            i += 1;
        }
        f.write_str(&parts.join(","))
    }
}

impl From<CpuSet> for String {
    fn from(set: CpuSet) -> String {
        set.to_string()
    }
}

impl TryFrom<String> for CpuSet {
    type Error = CpuListError;
    fn try_from(text: String) -> Result<Self, Self::Error> {
        CpuSet::parse(&text)
    }
}

/// The CPUs a kernel argument isolates: `isolcpus=[flags,]LIST` or
/// `nohz_full=LIST` (flags such as `managed_irq,domain` precede the list).
pub fn cmdline_cpus(cmdline: &str, parameter: &str) -> Option<CpuSet> {
    let value = cmdline
        .split_whitespace()
        .filter_map(|arg| arg.strip_prefix(parameter)?.strip_prefix('='))
        .next_back()?;
    let cpu_part: Vec<&str> = value
        .split(',')
        .skip_while(|p| p.chars().next().is_some_and(|c| !c.is_ascii_digit()))
        .collect();
    CpuSet::parse(&cpu_part.join(",")).ok()
}

/// RT CPUs the command line declares: `isolcpus` and `nohz_full` together.
pub fn isolated_by_cmdline(cmdline: &str) -> CpuSet {
    let isolcpus = cmdline_cpus(cmdline, "isolcpus").unwrap_or_default();
    let nohz = cmdline_cpus(cmdline, "nohz_full").unwrap_or_default();
    isolcpus.union(&nohz)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_format() {
        let set = CpuSet::parse("0-3,5,7-8").unwrap();
        assert_eq!(set.iter().collect::<Vec<_>>(), vec![0, 1, 2, 3, 5, 7, 8]);
        assert_eq!(set.to_string(), "0-3,5,7-8");
        assert!(CpuSet::parse("(null)\n").unwrap().is_empty());
        assert!(CpuSet::parse("").unwrap().is_empty());
        for bad in ["a", "3-1", "1-", "1,,2", "0-99999"] {
            assert!(CpuSet::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn cmdline_isolation() {
        let cmdline = "BOOT_IMAGE=/vmlinuz isolcpus=managed_irq,domain,1-3 nohz_full=2-4 quiet";
        assert_eq!(cmdline_cpus(cmdline, "isolcpus").unwrap().to_string(), "1-3");
        assert_eq!(cmdline_cpus(cmdline, "nohz_full").unwrap().to_string(), "2-4");
        assert_eq!(isolated_by_cmdline(cmdline).to_string(), "1-4");
        assert_eq!(isolated_by_cmdline("isolcpus=5").to_string(), "5");
        assert!(isolated_by_cmdline("quiet").is_empty());
        // The last occurrence wins, as in the kernel.
        assert_eq!(
            cmdline_cpus("isolcpus=1 isolcpus=2", "isolcpus")
                .unwrap()
                .to_string(),
            "2"
        );
    }

    proptest::proptest! {
        #[test]
        fn round_trip(cpus in proptest::collection::btree_set(0u32..64, 0..20)) {
            let set = CpuSet(cpus);
            proptest::prop_assert_eq!(CpuSet::parse(&set.to_string()).unwrap(), set);
        }

        #[test]
        fn never_panics(text in "\\PC*") {
            let _ = CpuSet::parse(&text);
            let _ = isolated_by_cmdline(&text);
        }
    }
}
