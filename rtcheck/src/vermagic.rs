//! Module vermagic (`.modinfo` section of a `.ko`), e.g.
//! `6.12.117 SMP preempt_rt mod_unload modversions`.

use serde::{Deserialize, Serialize};

use crate::elf::ElfError;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Vermagic {
    pub raw: String,
    pub release: String,
}

impl Vermagic {
    /// Kbuild puts `preempt_rt` in vermagic for PREEMPT_RT kernels
    /// (include/linux/vermagic.h), so a module records what it was built for.
    pub fn is_preempt_rt(&self) -> bool {
        self.raw.split_whitespace().skip(1).any(|t| t == "preempt_rt")
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VermagicError {
    #[error("not a 64-bit little-endian ELF object")]
    NotElf64,
    #[error("ELF section table is out of bounds")]
    BadSectionTable,
    #[error("module has no .modinfo section")]
    NoModinfo,
    #[error("module .modinfo has no vermagic")]
    NoVermagic,
}

/// Reads the vermagic of an uncompressed module.
pub fn read_vermagic(module: &[u8]) -> Result<Vermagic, VermagicError> {
    let modinfo = crate::elf::section(module, ".modinfo")
        .map_err(|e| match e {
            ElfError::NotElf64 => VermagicError::NotElf64,
            ElfError::BadSectionTable => VermagicError::BadSectionTable,
        })?
        .ok_or(VermagicError::NoModinfo)?;
    let raw = modinfo
        .split(|&b| b == 0)
        .find_map(|entry| entry.strip_prefix(b"vermagic="))
        .ok_or(VermagicError::NoVermagic)?;
    let raw = String::from_utf8_lossy(raw).trim().to_string();
    let release = raw.split_whitespace().next().unwrap_or_default().to_string();
    Ok(Vermagic { raw, release })
}

/// Minimal modules for tests, here and in the crates that gate on them.
pub mod synthetic {
    /// A minimal ELF64 with a section-name table and a `.modinfo` section.
    pub fn module(modinfo: &[u8]) -> Vec<u8> {
        let names = b"\0.shstrtab\0.modinfo\0";
        let mut elf = vec![0u8; 64];
        elf[..4].copy_from_slice(b"\x7fELF");
        elf[4] = 2;
        elf[5] = 1;
        let names_at = elf.len();
        elf.extend_from_slice(names);
        let modinfo_at = elf.len();
        elf.extend_from_slice(modinfo);
        while !elf.len().is_multiple_of(8) {
            elf.push(0);
        }
        let shoff = elf.len();
        let mut sh = |name: u32, offset: usize, size: usize| {
            let mut h = vec![0u8; 64];
            h[..4].copy_from_slice(&name.to_le_bytes());
            h[0x18..0x20].copy_from_slice(&(offset as u64).to_le_bytes());
            h[0x20..0x28].copy_from_slice(&(size as u64).to_le_bytes());
            elf.extend(h);
        };
        sh(0, 0, 0);
        sh(1, names_at, names.len());
        sh(11, modinfo_at, modinfo.len());
        elf[0x28..0x30].copy_from_slice(&(shoff as u64).to_le_bytes());
        elf[0x3a..0x3c].copy_from_slice(&64u16.to_le_bytes());
        elf[0x3c..0x3e].copy_from_slice(&3u16.to_le_bytes());
        elf[0x3e..0x40].copy_from_slice(&1u16.to_le_bytes());
        elf
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::synthetic::module as synthetic_module;
    use super::*;

    #[test]
    fn reads_rt_vermagic() {
        let module = synthetic_module(
            b"license=GPL\0vermagic=6.12.117 SMP preempt_rt mod_unload modversions \0name=dummy\0",
        );
        let v = read_vermagic(&module).unwrap();
        assert_eq!(v.release, "6.12.117");
        assert!(v.is_preempt_rt());
    }

    #[test]
    fn generic_vermagic_is_not_rt() {
        let module = synthetic_module(b"vermagic=6.1.0-40-cloud-amd64 SMP mod_unload modversions \0");
        assert!(!read_vermagic(&module).unwrap().is_preempt_rt());
        // The release itself may contain "preempt_rt" (a LOCALVERSION); only flags count.
        let module = synthetic_module(b"vermagic=6.12-preempt_rt SMP mod_unload\0");
        assert!(!read_vermagic(&module).unwrap().is_preempt_rt());
    }

    #[test]
    fn errors() {
        assert_eq!(read_vermagic(b"not elf"), Err(VermagicError::NotElf64));
        let module = synthetic_module(b"license=GPL\0");
        assert_eq!(read_vermagic(&module), Err(VermagicError::NoVermagic));
        let mut truncated = synthetic_module(b"vermagic=x\0");
        truncated.truncate(100);
        assert_eq!(read_vermagic(&truncated), Err(VermagicError::BadSectionTable));
    }

    proptest::proptest! {
        #[test]
        fn never_panics(data in proptest::collection::vec(proptest::num::u8::ANY, 0..512), flip in 0usize..400, byte in proptest::num::u8::ANY) {
            let _ = read_vermagic(&data);
            let mut module = synthetic_module(b"vermagic=6.12 SMP preempt_rt\0");
            let i = flip % module.len();
            module[i] = byte;
            let _ = read_vermagic(&module);
        }
    }
}
