//! Kernel CPU lists (`0-3,5`, the shared [`CpuSet`]) and the isolation
//! arguments of the command line.

pub use rtreport::report::{CpuListError, CpuSet};

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
        fn never_panics(text in "\\PC*") {
            let _ = isolated_by_cmdline(&text);
        }
    }
}
