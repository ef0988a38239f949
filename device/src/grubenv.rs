//! GRUB's environment block (`grubenv`): exactly 1024 bytes, a header line,
//! `name=value` lines, `#` padding. GRUB's `save_env` rewrites it in place,
//! so the device does the same ([`emberrtos_contract::io::root::overwrite_in_place`]):
//! the file keeps its blocks on the FAT ESP. Parsing and rendering are pure.

use std::collections::BTreeMap;

/// The block's size; GRUB refuses any other.
pub const SIZE: usize = 1024;
const HEADER: &str = "# GRUB Environment Block\n";

/// The variables of a block. A block that is not one (wrong size or header)
/// is an error; lines without `=` are skipped as GRUB skips them.
pub fn parse(block: &[u8]) -> Result<BTreeMap<String, String>, String> {
    if block.len() != SIZE {
        return Err(format!(
            "an environment block is {SIZE} bytes, this one {}",
            block.len()
        ));
    }
    let text = std::str::from_utf8(block).map_err(|_| "the environment block is not UTF-8".to_string())?;
    let body = text
        .strip_prefix(HEADER)
        .ok_or("the environment block lacks GRUB's header line")?;
    Ok(body
        .lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| line.split_once('='))
        .map(|(name, value)| (name.to_string(), value.to_string()))
        .collect())
}

/// A variable name GRUB accepts and a value without line breaks or `\`
/// (GRUB escapes those; the device never needs them).
fn check(name: &str, value: &str) -> Result<(), String> {
    let name_ok = !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if !name_ok {
        return Err(format!("{name:?} is not a GRUB variable name"));
    }
    if value.contains(['\n', '\r', '\\']) {
        return Err(format!("the value of {name} holds a line break or a backslash"));
    }
    Ok(())
}

/// The 1024-byte block holding `vars`; an error if they do not fit.
pub fn render(vars: &BTreeMap<String, String>) -> Result<Vec<u8>, String> {
    let mut text = HEADER.to_string();
    for (name, value) in vars {
        check(name, value)?;
        text.push_str(&format!("{name}={value}\n"));
    }
    if text.len() > SIZE {
        return Err(format!(
            "the variables need {} bytes, the block holds {SIZE}",
            text.len()
        ));
    }
    let mut block = text.into_bytes();
    block.resize(SIZE, b'#');
    Ok(block)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn a_block_round_trips_at_grubs_size() {
        let v = vars(&[
            ("emberrtos_trial", "1"),
            ("emberrtos_tries", "2"),
            ("saved_entry", ""),
        ]);
        let block = render(&v).unwrap();
        assert_eq!(block.len(), SIZE);
        assert!(block.starts_with(b"# GRUB Environment Block\nemberrtos_trial=1\n"));
        assert!(block.ends_with(b"###"));
        assert_eq!(parse(&block).unwrap(), v);
        assert_eq!(
            parse(&render(&BTreeMap::new()).unwrap()).unwrap(),
            BTreeMap::new()
        );
    }

    #[test]
    fn what_grub_would_misread_is_refused() {
        assert!(render(&vars(&[("a b", "1")])).is_err());
        assert!(render(&vars(&[("x", "1\nemberrtos_trial=1")])).is_err());
        assert!(render(&vars(&[("x", &"y".repeat(SIZE))])).is_err());
        assert!(parse(b"# GRUB Environment Block\n").is_err());
        let mut foreign = render(&BTreeMap::new()).unwrap();
        foreign[0] = b'x';
        assert!(parse(&foreign).is_err());
    }
}
