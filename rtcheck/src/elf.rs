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

#[cfg(test)]
mod tests {
    use super::*;

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
