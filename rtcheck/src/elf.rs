//! Just enough ELF64 (little-endian) to read named sections and the dynamic
//! section: module `.modinfo`, and the libraries a binary needs.

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ElfError {
    #[error("not a 64-bit little-endian ELF object")]
    NotElf64,
    #[error("ELF section table is out of bounds")]
    BadSectionTable,
}

fn read_u16(data: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(data.get(at..at + 2)?.try_into().ok()?))
}
fn read_u32(data: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(data.get(at..at + 4)?.try_into().ok()?))
}
fn read_u64(data: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(data.get(at..at + 8)?.try_into().ok()?))
}

/// The contents of the section called `name`.
pub fn section<'a>(elf: &'a [u8], name: &str) -> Result<Option<&'a [u8]>, ElfError> {
    if elf.len() < 64 || &elf[..4] != b"\x7fELF" || elf[4] != 2 || elf[5] != 1 {
        return Err(ElfError::NotElf64);
    }
    let bad = || ElfError::BadSectionTable;
    let shoff = usize::try_from(read_u64(elf, 0x28).ok_or_else(bad)?).map_err(|_| bad())?;
    let shentsize = read_u16(elf, 0x3a).ok_or_else(bad)? as usize;
    let shnum = read_u16(elf, 0x3c).ok_or_else(bad)? as usize;
    let shstrndx = read_u16(elf, 0x3e).ok_or_else(bad)? as usize;
    if shentsize < 0x40 || shstrndx >= shnum {
        return Err(bad());
    }
    const SHT_NOBITS: u32 = 8;
    // (name offset, data); NOBITS sections (.bss) occupy no bytes in the file.
    let header = |index: usize| -> Result<(u32, &'a [u8]), ElfError> {
        let at = shoff
            .checked_add(index.checked_mul(shentsize).ok_or_else(bad)?)
            .ok_or_else(bad)?;
        let name = read_u32(elf, at).ok_or_else(bad)?;
        if read_u32(elf, at + 4).ok_or_else(bad)? == SHT_NOBITS {
            return Ok((name, &[]));
        }
        let offset = usize::try_from(read_u64(elf, at + 0x18).ok_or_else(bad)?).map_err(|_| bad())?;
        let size = usize::try_from(read_u64(elf, at + 0x20).ok_or_else(bad)?).map_err(|_| bad())?;
        let data = elf
            .get(offset..offset.checked_add(size).ok_or_else(bad)?)
            .ok_or_else(bad)?;
        Ok((name, data))
    };
    let (_, names) = header(shstrndx)?;
    for index in 0..shnum {
        let (name_offset, data) = header(index)?;
        let section_name = names
            .get(name_offset as usize..)
            .and_then(|s| s.split(|&b| b == 0).next())
            .unwrap_or_default();
        if section_name == name.as_bytes() {
            return Ok(Some(data));
        }
    }
    Ok(None)
}

/// The `DT_NEEDED` libraries and the `.interp` loader of a dynamic executable.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Dynamic {
    pub interpreter: Option<String>,
    pub needed: Vec<String>,
}

/// Reads the dynamic linking needs of `elf`; a static binary gives an empty result.
pub fn dynamic(elf: &[u8]) -> Result<Dynamic, ElfError> {
    const DT_NEEDED: u64 = 1;
    let c_string = |data: &[u8]| -> String {
        let end = data.iter().position(|&b| b == 0).unwrap_or(data.len());
        String::from_utf8_lossy(&data[..end]).into_owned()
    };
    let interpreter = section(elf, ".interp")?.map(c_string);
    let mut needed = Vec::new();
    if let (Some(table), Some(strings)) = (section(elf, ".dynamic")?, section(elf, ".dynstr")?) {
        for entry in table.chunks_exact(16) {
            let tag = u64::from_le_bytes(entry[..8].try_into().expect("8 bytes"));
            let value = u64::from_le_bytes(entry[8..].try_into().expect("8 bytes"));
            if tag == 0 {
                break;
            }
            if tag == DT_NEEDED {
                let name = strings
                    .get(value as usize..)
                    .map(c_string)
                    .ok_or(ElfError::BadSectionTable)?;
                needed.push(name);
            }
        }
    }
    Ok(Dynamic { interpreter, needed })
}

/// What an ELF file's header says of the program in it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// `e_type`: [`ET_REL`], [`ET_EXEC`], [`ET_DYN`], ...
    pub kind: u16,
    /// `e_machine`: the instruction set ([`EM_X86_64`], [`EM_AARCH64`], ...).
    pub machine: u16,
}

/// A relocatable object (a kernel module, a GRUB module).
pub const ET_REL: u16 = 1;
/// An executable.
pub const ET_EXEC: u16 = 2;
/// A shared object or position-independent executable.
pub const ET_DYN: u16 = 3;
pub const EM_X86_64: u16 = 62;
pub const EM_AARCH64: u16 = 183;

/// Bytes of the file [`header`] needs: `e_ident`, `e_type`, `e_machine`.
pub const HEADER_LEN: usize = 20;

/// Reads the ELF header at the start of `bytes`, of either class and byte
/// order; `None` when they are not an ELF file (pure).
pub fn header(bytes: &[u8]) -> Option<Header> {
    let ident = bytes.get(..HEADER_LEN)?;
    if &ident[..4] != b"\x7fELF" || !matches!(ident[4], 1 | 2) {
        return None;
    }
    let word = |at: usize| -> Option<u16> {
        let pair = [ident[at], ident[at + 1]];
        match ident[5] {
            1 => Some(u16::from_le_bytes(pair)),
            2 => Some(u16::from_be_bytes(pair)),
            _ => None,
        }
    };
    Some(Header {
        kind: word(0x10)?,
        machine: word(0x12)?,
    })
}

impl Header {
    /// The EmberRTOS machine the program runs on, when it is one of them.
    pub fn arch(self) -> Option<crate::Arch> {
        match self.machine {
            EM_X86_64 => Some(crate::Arch::X86_64),
            EM_AARCH64 => Some(crate::Arch::Arm64),
            _ => None,
        }
    }

    /// A program that runs (an executable or a shared object), as opposed
    /// to an object file that is only linked or loaded by another program.
    pub fn runs(self) -> bool {
        matches!(self.kind, ET_EXEC | ET_DYN)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first bytes of an ELF file of that class, byte order, type and machine.
    fn elf_start(class: u8, data: u8, kind: u16, machine: u16) -> Vec<u8> {
        let mut bytes = b"\x7fELF".to_vec();
        bytes.extend([class, data, 1, 0]);
        bytes.resize(16, 0);
        let words = [kind, machine];
        for word in words {
            bytes.extend(match data {
                2 => word.to_be_bytes(),
                _ => word.to_le_bytes(),
            });
        }
        bytes
    }

    #[test]
    fn headers_name_their_machine() {
        let sh = std::fs::read("/bin/sh").expect("/bin/sh");
        let host = header(&sh).unwrap();
        assert!(host.runs());
        assert_eq!(host.arch(), Some(crate::Arch::X86_64));
        let arm = header(&elf_start(2, 1, ET_DYN, EM_AARCH64)).unwrap();
        assert_eq!(arm.arch(), Some(crate::Arch::Arm64));
        let big = header(&elf_start(2, 2, ET_EXEC, EM_AARCH64)).unwrap();
        assert_eq!((big.kind, big.machine), (ET_EXEC, EM_AARCH64));
        let module = header(&elf_start(2, 1, ET_REL, EM_AARCH64)).unwrap();
        assert!(!module.runs());
        let i386 = header(&elf_start(1, 1, ET_EXEC, 3)).unwrap();
        assert_eq!(i386.arch(), None);
        for not_elf in [
            &b"#!/bin/sh\n.................."[..],
            &elf_start(2, 1, 2, 62)[..19],
            &elf_start(3, 1, 2, 62),
            &elf_start(2, 3, 2, 62),
        ] {
            assert_eq!(header(not_elf), None, "{not_elf:?}");
        }
    }

    #[test]
    fn reads_a_real_dynamic_binary() {
        let bytes = std::fs::read("/bin/sh").expect("/bin/sh");
        let dynamic = dynamic(&bytes).unwrap();
        assert!(
            dynamic
                .interpreter
                .as_deref()
                .is_some_and(|i| i.contains("ld-linux")),
            "{dynamic:?}"
        );
        assert!(
            dynamic.needed.iter().any(|n| n.starts_with("libc.so")),
            "{dynamic:?}"
        );
    }

    #[test]
    fn static_binaries_have_no_dynamic_needs() {
        let bytes = std::fs::read("/bin/busybox").expect("busybox-static");
        assert_eq!(dynamic(&bytes).unwrap(), Dynamic::default());
    }

    #[test]
    fn rejects_non_elf() {
        assert_eq!(dynamic(b"#!/bin/sh\n"), Err(ElfError::NotElf64));
    }
}
