//! The syntax of the `provision.yaml` values that the recipe's
//! [`syntax`](crate::syntax) has no check for. Pure checks on `&str`:
//! `Err` says what was expected.

use crate::syntax::Verdict;

/// The longest hostname (RFC 1123, 2.1; a DNS name of 253 characters).
const MAX_HOSTNAME: usize = 253;
/// The longest label of a hostname.
const MAX_LABEL: usize = 63;
/// The longest path of a file on the medium, below `emberrtos/`.
const MAX_MEDIUM_PATH: usize = 200;

/// A hostname: labels of letters, digits and `-`, 1 to 63 characters, not
/// starting or ending with `-`, separated by `.` (RFC 1123, 2.1), at most
/// 253 characters. It is written to `/etc/hostname`.
pub fn hostname(name: &str) -> Verdict {
    let label_ok = |label: &str| {
        (1..=MAX_LABEL).contains(&label.len())
            && label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            && !label.starts_with('-')
            && !label.ends_with('-')
    };
    let ok = name.len() <= MAX_HOSTNAME && name.split('.').all(label_ok);
    ok.then_some(()).ok_or_else(|| {
        format!(
            "{name:?} is not a hostname: use labels of letters, digits and `-` (not at either end), at most {MAX_LABEL} characters each, separated by `.`"
        )
    })
}

/// A file on the medium, relative to `emberrtos/`: parts of lowercase
/// letters, digits, `.`, `_` and `-`, separated by `/`; no absolute path, no
/// `.` or `..` part, no empty part, no part ending in `.`. Safe as an mtools
/// argument, and read back unchanged by the device's kernel from either
/// medium it mounts: vfat drops trailing dots, and iso9660 (without Rock
/// Ridge or Joliet) drops them too and reads names back in lowercase.
pub fn medium_path(path: &str) -> Verdict {
    if path.starts_with('/') {
        return Err(format!(
            "{path:?} is absolute: name a file on the medium relative to `emberrtos/`"
        ));
    }
    if path.split('/').any(|part| part == "..") {
        return Err(format!("{path:?} leaves `emberrtos/`: `..` is not allowed"));
    }
    if let Some(part) = path.split('/').find(|part| part.len() > 1 && part.ends_with('.')) {
        return Err(format!(
            "{path:?}: `{part}` ends in `.`, which FAT and ISO 9660 drop: the device would open another name"
        ));
    }
    let part_ok = |part: &str| {
        !part.is_empty()
            && part != "."
            && part
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
    };
    let ok = path.len() <= MAX_MEDIUM_PATH && path.split('/').all(part_ok);
    ok.then_some(()).ok_or_else(|| {
        format!(
            "{path:?}: name a file on the medium relative to `emberrtos/`, with lowercase letters, digits, `.`, `_` and `-` (ISO 9660 media read names back in lowercase), parts separated by `/` (at most {MAX_MEDIUM_PATH} characters)"
        )
    })
}

/// A medium path that is not `provision.yaml` itself, nor under it, as the
/// device's kernel compares names: without case (vfat, iso9660's default
/// `check=relaxed`) and without trailing dots and spaces, which FAT drops.
pub fn not_the_provision_file(path: &str) -> Verdict {
    let file = super::MEDIUM_FILE.rsplit('/').next().expect("has a name");
    let first = path.split('/').next().unwrap_or_default();
    if first.trim_end_matches(['.', ' ']).eq_ignore_ascii_case(file) {
        return Err(format!(
            "{path:?} is where the medium keeps `{file}`: give the key its own name"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostnames() {
        for good in [
            "cell-07",
            "a",
            "CELL7",
            "node.example.org",
            "0abc",
            &"a".repeat(63),
        ] {
            hostname(good).unwrap_or_else(|e| panic!("{e}"));
        }
        for bad in [
            "",
            "-a",
            "a-",
            "a;b",
            "a b",
            "a_b",
            "a..b",
            ".a",
            "a.",
            "a\n",
            "ä",
            &"a".repeat(64),
            &["abc"; 64].join("."),
        ] {
            assert!(hostname(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn medium_paths() {
        for good in [
            "publisher.asc",
            "keys/publisher.asc",
            "a_b-c.gpg",
            ".asc",
            "keys.d/k.asc",
        ] {
            medium_path(good).unwrap_or_else(|e| panic!("{e}"));
        }
        for bad in [
            "",
            "/etc/shadow",
            "../x.asc",
            "keys/../../x",
            "..",
            "./x",
            "a//b",
            "a/",
            "a b",
            "a*",
            "a:b",
            "a\\b",
            "a\nb",
        ] {
            assert!(medium_path(bad).is_err(), "{bad:?}");
        }
        assert!(medium_path("../x").unwrap_err().contains("`..`"));
        assert!(medium_path("/x").unwrap_err().contains("absolute"));
        for clash in ["provision.yaml", "PROVISION.YAML", "provision.yaml/k.asc"] {
            assert!(not_the_provision_file(clash).is_err(), "{clash:?}");
        }
        not_the_provision_file("keys/provision.yaml").unwrap();
    }

    /// vfat and iso9660 drop trailing dots, compare without case, and
    /// iso9660 reads plain names back in lowercase.
    #[test]
    fn names_fat_or_iso9660_would_read_back_differently_are_refused() {
        for dropped_dot in ["key.asc.", "keys./k.asc", "k.asc..", "..."] {
            let e = medium_path(dropped_dot).unwrap_err();
            assert!(e.contains("ends in `.`"), "{dropped_dot:?}: {e}");
        }
        for cased in ["Publisher.asc", "KEYS/k.asc", "k.ASC"] {
            let e = medium_path(cased).unwrap_err();
            assert!(e.contains("lowercase"), "{cased:?}: {e}");
        }
        for clash in [
            "provision.yaml",
            "PROVISION.YAML",
            "Provision.Yaml",
            "provision.yaml/k.asc",
            "provision.yaml.",
            "provision.yaml..",
            "provision.yaml ",
            "PROVISION.YAML./k.asc",
        ] {
            assert!(not_the_provision_file(clash).is_err(), "{clash:?}");
        }
        not_the_provision_file("provision.yaml.asc").unwrap();
    }
}
