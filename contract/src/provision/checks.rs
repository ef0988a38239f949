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

/// A file on the medium, relative to `emberrtos/`: parts of letters, digits,
/// `.`, `_` and `-`, separated by `/`; no absolute path, no `.` or `..` part,
/// no empty part. Safe as a FAT long name and as an mtools argument.
pub fn medium_path(path: &str) -> Verdict {
    if path.starts_with('/') {
        return Err(format!(
            "{path:?} is absolute: name a file on the medium relative to `emberrtos/`"
        ));
    }
    if path.split('/').any(|part| part == "..") {
        return Err(format!("{path:?} leaves `emberrtos/`: `..` is not allowed"));
    }
    let part_ok = |part: &str| {
        !part.is_empty()
            && part != "."
            && part
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
    };
    let ok = path.len() <= MAX_MEDIUM_PATH && path.split('/').all(part_ok);
    ok.then_some(()).ok_or_else(|| {
        format!(
            "{path:?}: name a file on the medium relative to `emberrtos/`, with letters, digits, `.`, `_` and `-`, parts separated by `/` (at most {MAX_MEDIUM_PATH} characters)"
        )
    })
}

/// A medium path that is not `provision.yaml` itself, nor under it. FAT
/// compares names without case, so neither does this.
pub fn not_the_provision_file(path: &str) -> Verdict {
    let file = super::MEDIUM_FILE.rsplit('/').next().expect("has a name");
    let first = path.split('/').next().unwrap_or_default();
    if first.eq_ignore_ascii_case(file) {
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
        for good in ["publisher.asc", "keys/publisher.asc", "a_b-c.gpg", ".asc"] {
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
}
