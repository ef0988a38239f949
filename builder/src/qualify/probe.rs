//! What the target says about itself: its hardware identity, its kernel and
//! whether it has `jitter`, from one short shell command. Parsed here, on
//! this side, as untrusted text.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::clean;

/// The shell command whose output [`parse`] reads: `key=value` lines.
pub const PROBE_COMMAND: &str = "for f in sys_vendor product_name board_name bios_version; do \
printf 'dmi.%s=' \"$f\"; head -c 256 \"/sys/class/dmi/id/$f\" 2>/dev/null | tr -d '\\n'; echo; done; \
printf 'uname.r=%s\\n' \"$(uname -r)\"; printf 'uname.v=%s\\n' \"$(uname -v)\"; printf 'uname.m=%s\\n' \"$(uname -m)\"; \
printf 'jitter=%s\\n' \"$(command -v jitter)\"; \
if [ -c /dev/tpmrm0 ] && [ -x /usr/libexec/emberrtos/attest ]; then echo tpm=yes; fi; \
grep -E '^(processor|model name|microcode)[[:space:]]*:' /proc/cpuinfo | head -n 4096 | sed 's/^/cpu./'; \
grep '^MemTotal:' /proc/meminfo | sed 's/^/mem./'";

/// The hardware a record is about. `id` hashes what makes the platform
/// (vendor, product, board, CPU model, cores, memory in GiB); the firmware
/// and microcode versions are recorded but not hashed, so a firmware update
/// keeps the platform's id.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct Hardware {
    pub id: String,
    pub sys_vendor: String,
    pub product_name: String,
    pub board_name: String,
    pub bios_version: String,
    pub cpu_model: String,
    pub microcode: String,
    pub cores: u32,
    pub memory_kib: u64,
}

impl Hardware {
    /// `VENDOR PRODUCT`, for tables.
    pub fn platform(&self) -> String {
        let name = format!("{} {}", self.sys_vendor, self.product_name);
        match name.trim() {
            "" => "(no DMI identity)".to_string(),
            name => name.to_string(),
        }
    }

    fn derive_id(&mut self) {
        let gib = (self.memory_kib + (1 << 19)) >> 20;
        let identity = [
            self.sys_vendor.as_str(),
            &self.product_name,
            &self.board_name,
            &self.cpu_model,
            &self.cores.to_string(),
            &gib.to_string(),
        ]
        .join("\n");
        let digest = hex::encode(Sha256::digest(identity.as_bytes()));
        self.id = format!("hw-{}", &digest[..16]);
    }
}

/// Everything the probe found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Probe {
    pub hardware: Hardware,
    pub release: String,
    pub uts_version: String,
    /// `uname -m`: the machine (`x86_64`, `aarch64`).
    pub machine: String,
    /// Where `jitter` is on the target's PATH; empty when it is not.
    pub jitter: String,
    /// The target has a TPM and the live ISO's `attest`.
    pub tpm: bool,
}

/// Parses [`PROBE_COMMAND`]'s output (pure). Values are cleaned of control
/// characters and capped.
pub fn parse(output: &str) -> Probe {
    let mut probe = Probe::default();
    let hw = &mut probe.hardware;
    for line in output.lines() {
        let split = if line.starts_with("cpu.") || line.starts_with("mem.") {
            line.split_once(':')
        } else {
            line.split_once('=')
        };
        let Some((key, value)) = split else {
            continue;
        };
        let value = clean(value);
        match key.trim() {
            "dmi.sys_vendor" => hw.sys_vendor = value,
            "dmi.product_name" => hw.product_name = value,
            "dmi.board_name" => hw.board_name = value,
            "dmi.bios_version" => hw.bios_version = value,
            "uname.r" => probe.release = value,
            "uname.v" => probe.uts_version = value,
            "uname.m" => probe.machine = value,
            "jitter" => probe.jitter = value,
            "tpm" => probe.tpm = value == "yes",
            "cpu.processor" => hw.cores += 1,
            "cpu.model name" if hw.cpu_model.is_empty() => hw.cpu_model = value,
            "cpu.microcode" if hw.microcode.is_empty() => hw.microcode = value,
            "mem.MemTotal" => hw.memory_kib = value.trim_end_matches("kB").trim().parse().unwrap_or(0),
            _ => {}
        }
    }
    hw.derive_id();
    probe
}

/// Why the target does not run the expected kernel (empty when it does):
/// first of all, when it is another machine than the commit's.
pub fn kernel_mismatch(
    probe: &Probe,
    arch: Option<rtcheck::Arch>,
    release: &str,
    uts_version: &str,
) -> Vec<String> {
    let mut reasons = Vec::new();
    if let Some(arch) = arch
        && probe.machine != arch.machine()
    {
        reasons.push(format!(
            "the target's `uname -m` is {:?}, the commit is for {arch} ({})",
            probe.machine,
            arch.machine()
        ));
    }
    if probe.release != release {
        reasons.push(format!(
            "the target runs kernel {:?}, the commit holds {release:?}",
            probe.release
        ));
    }
    if probe.uts_version != uts_version {
        reasons.push(format!(
            "the target's `uname -v` is {:?}, the commit's kernel says {uts_version:?}",
            probe.uts_version
        ));
    }
    reasons
}

#[cfg(test)]
mod tests {
    use super::*;

    fn output(vendor: &str, bios: &str, microcode: &str) -> String {
        format!(
            "dmi.sys_vendor={vendor}\ndmi.product_name=Rig-A\ndmi.board_name=RA-1\ndmi.bios_version={bios}\n\
uname.r=6.12.117\nuname.v=#1 SMP PREEMPT_RT Sun Nov 30 00:00:00 UTC 2025\nuname.m=x86_64\njitter=/usr/bin/jitter\n\
cpu.processor\t: 0\ncpu.model name\t: QEMU Virtual CPU version 2.5+\ncpu.microcode\t: {microcode}\n\
cpu.processor\t: 1\ncpu.model name\t: QEMU Virtual CPU version 2.5+\nmem.MemTotal:        1988876 kB\n"
        )
    }

    #[test]
    fn reads_identity_kernel_and_jitter() {
        let probe = parse(&output("Acme", "1.0", "0x1"));
        let hw = &probe.hardware;
        assert_eq!(hw.sys_vendor, "Acme");
        assert_eq!(hw.platform(), "Acme Rig-A");
        assert_eq!(hw.board_name, "RA-1");
        assert_eq!(hw.cpu_model, "QEMU Virtual CPU version 2.5+");
        assert_eq!(hw.microcode, "0x1");
        assert_eq!(hw.cores, 2);
        assert_eq!(hw.memory_kib, 1_988_876);
        assert!(hw.id.starts_with("hw-") && hw.id.len() == 19, "{}", hw.id);
        assert_eq!(probe.release, "6.12.117");
        assert_eq!(probe.jitter, "/usr/bin/jitter");
        let uts = "#1 SMP PREEMPT_RT Sun Nov 30 00:00:00 UTC 2025";
        assert_eq!(probe.machine, "x86_64");
        assert!(kernel_mismatch(&probe, Some(rtcheck::Arch::X86_64), "6.12.117", uts).is_empty());
        assert_eq!(kernel_mismatch(&probe, None, "6.12.118", "#2").len(), 2);
        let arm64 = kernel_mismatch(&probe, Some(rtcheck::Arch::Arm64), "6.12.117", uts);
        assert_eq!(
            arm64,
            ["the target's `uname -m` is \"x86_64\", the commit is for arm64 (aarch64)"]
        );
    }

    #[test]
    fn firmware_updates_keep_the_id_other_platforms_change_it() {
        let id = |text: String| parse(&text).hardware.id;
        let base = id(output("Acme", "1.0", "0x1"));
        assert_eq!(id(output("Acme", "2.3", "0x2f")), base);
        assert_ne!(id(output("Other", "1.0", "0x1")), base);
        assert_ne!(id(output("Acme", "1.0", "0x1").replace("Rig-A", "Rig-B")), base);
        assert_ne!(
            id(output("Acme", "1.0", "0x1").replace("1988876", "3988876")),
            base
        );
    }

    #[test]
    fn hostile_values_are_cleaned() {
        let probe = parse("dmi.sys_vendor=Ev\u{1b}[2Jil\r\njitter=\nuname.r=\u{7}x\n");
        assert_eq!(probe.hardware.sys_vendor, "Ev[2Jil");
        assert_eq!(probe.release, "x");
        assert!(probe.jitter.is_empty());
        assert_eq!(parse("").hardware.platform(), "(no DMI identity)");
    }
}
