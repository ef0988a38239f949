//! What the running system says about its own RT readiness. Every path is
//! read below a root (normally `/`), so tests can point it at a fake tree.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use rtcheck::Evidence;
use serde::{Deserialize, Serialize};

use crate::cpus::CpuSet;
pub use rtreport::report::Irq;

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SystemState {
    pub release: String,
    pub uts_version: String,
    /// PREEMPT_RT evidence from `uname -v` and `/proc/config.gz`.
    pub kernel: Evidence,
    pub cmdline: String,
    pub online: CpuSet,
    /// `/sys/devices/system/cpu/isolated`: what the kernel really isolated.
    pub isolated: CpuSet,
    pub nohz_full: CpuSet,
    pub irqs: Vec<Irq>,
    /// Governor per CPU; `None` when the CPU has no cpufreq.
    pub governors: BTreeMap<u32, Option<String>>,
    /// Why this looks like a virtual machine, if it does.
    pub hypervisor: Option<String>,
}

/// The text of `path` below `root`, `None` when it cannot be read.
pub fn read(root: &Path, path: &str) -> Option<String> {
    std::fs::read_to_string(root.join(path.trim_start_matches('/'))).ok()
}

/// The CPU list in `path` below `root`; empty when absent or unparsable.
pub fn read_list(root: &Path, path: &str) -> CpuSet {
    read(root, path)
        .and_then(|t| CpuSet::parse(&t).ok())
        .unwrap_or_default()
}

/// Reads the system below `root`.
pub fn read_system(root: &Path) -> SystemState {
    let uts_version = read(root, "/proc/sys/kernel/version")
        .unwrap_or_default()
        .trim()
        .to_string();
    let proc_config = std::fs::read(root.join("proc/config.gz"))
        .ok()
        .and_then(|gz| rtcheck::ikconfig::gunzip_text(&gz).ok());
    let kernel = rtcheck::evidence::check_running_kernel(&uts_version, proc_config.as_deref());
    let online = read_list(root, "/sys/devices/system/cpu/online");
    let irqs = read_irqs(root);
    let governors = read_governors(root, &online);
    SystemState {
        release: read(root, "/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim()
            .to_string(),
        uts_version,
        kernel,
        cmdline: read(root, "/proc/cmdline").unwrap_or_default().trim().to_string(),
        online,
        isolated: read_list(root, "/sys/devices/system/cpu/isolated"),
        nohz_full: read_list(root, "/sys/devices/system/cpu/nohz_full"),
        irqs,
        governors,
        hypervisor: hypervisor(root),
    }
}

/// Every IRQ under `/proc/irq` with the CPUs it is delivered to
/// (`effective_affinity_list`, else the requested `smp_affinity_list`).
pub fn read_irqs(root: &Path) -> Vec<Irq> {
    let mut irqs = Vec::new();
    let Ok(entries) = std::fs::read_dir(root.join("proc/irq")) else {
        return irqs;
    };
    let mut dirs: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    dirs.sort();
    for dir in dirs {
        let list = |name: &str| {
            std::fs::read_to_string(dir.join(name))
                .ok()
                .and_then(|t| CpuSet::parse(&t).ok())
        };
        let Some(effective) = list("effective_affinity_list").or_else(|| list("smp_affinity_list")) else {
            continue;
        };
        let irq = dir.file_name().unwrap_or_default().to_string_lossy().into_owned();
        irqs.push(Irq { irq, effective });
    }
    irqs
}

/// The cpufreq governor of each CPU; `None` when it has no cpufreq.
pub fn read_governors(root: &Path, cpus: &CpuSet) -> BTreeMap<u32, Option<String>> {
    cpus.iter()
        .map(|cpu| {
            let path = format!("/sys/devices/system/cpu/cpu{cpu}/cpufreq/scaling_governor");
            (cpu, read(root, &path).map(|g| g.trim().to_string()))
        })
        .collect()
}

/// Whether the kernel lets `irq` be moved: its current `smp_affinity` is
/// written back unchanged (a no-op for the routing) and the kernel's answer
/// decides. Per-CPU interrupts (local timers) and managed ones refuse with
/// EIO (or EINVAL); an IRQ with no `smp_affinity` file cannot be moved
/// either. Any other failure (not root, read-only procfs) says nothing about
/// the IRQ, so it counts as movable.
pub fn irq_can_move(root: &Path, irq: &str) -> bool {
    use std::io::Write as _;
    let path = root.join("proc/irq").join(irq).join("smp_affinity");
    let Ok(current) = std::fs::read_to_string(&path) else {
        return false;
    };
    let written = std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .and_then(|mut file| file.write_all(current.trim().as_bytes()));
    match written {
        Ok(()) => true,
        Err(e) => !matches!(e.raw_os_error(), Some(libc::EIO | libc::EINVAL)),
    }
}

/// `irqs` without those on `rt_cpus` that cannot be moved off them: nothing
/// can be tuned about those, so they are exempt from the IRQ check.
pub fn movable_irqs(root: &Path, irqs: &[Irq], rt_cpus: &CpuSet) -> Vec<Irq> {
    irqs.iter()
        .filter(|irq| irq.effective.intersection(rt_cpus).is_empty() || irq_can_move(root, &irq.irq))
        .cloned()
        .collect()
}

/// The CPUID hypervisor bit (as `/proc/cpuinfo` shows it), `/sys/hypervisor`,
/// and `systemd-detect-virt` when it is installed.
fn hypervisor(root: &Path) -> Option<String> {
    let mut signs = Vec::new();
    if read(root, "/proc/cpuinfo").is_some_and(|info| {
        info.lines()
            .filter(|l| l.starts_with("flags"))
            .any(|l| l.split_whitespace().any(|flag| flag == "hypervisor"))
    }) {
        signs.push("CPUID hypervisor bit set".to_string());
    }
    if let Some(kind) = read(root, "/sys/hypervisor/type")
        .map(|t| t.trim().to_string())
        .filter(|t| !t.is_empty())
    {
        signs.push(format!("/sys/hypervisor/type is {kind}"));
    }
    if root == Path::new("/")
        && let Ok(output) = std::process::Command::new("systemd-detect-virt").output()
    {
        let virt = String::from_utf8_lossy(&output.stdout).trim().to_string();
        if output.status.success() && !virt.is_empty() && virt != "none" {
            signs.push(format!("systemd-detect-virt says {virt}"));
        }
    }
    (!signs.is_empty()).then(|| signs.join("; "))
}
