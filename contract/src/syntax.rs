//! The syntax of every recipe value that reaches a command line, a config
//! file or a file name. Pure checks on `&str`: each returns `Ok` or a message
//! saying what was expected; [`super::Validator`] adds file, field and position.
//!
//! The rules are deliberately narrow: a value that passes can be pasted into
//! an argv, a `grub.cfg` word or an `authorized_keys` line without being read
//! as an option, a second command or a second line.

use ssh_key::{Algorithm, PublicKey};

/// A check's verdict: `Err` says what was expected.
pub type Verdict = Result<(), String>;

fn is_lower_alnum(b: u8) -> bool {
    b.is_ascii_lowercase() || b.is_ascii_digit()
}

/// `name`: `[a-z0-9][a-z0-9._-]*`, at most 64 characters. It names files,
/// the live ISO and GRUB menu entries.
pub fn image_name(name: &str) -> Verdict {
    let ok = name.len() <= 64
        && name.bytes().next().is_some_and(is_lower_alnum)
        && name.bytes().all(|b| is_lower_alnum(b) || b"-_.".contains(&b));
    ok.then_some(()).ok_or_else(|| {
        "use lowercase letters, digits, `-`, `_` and `.`, starting with a letter or digit (at most 64)"
            .to_string()
    })
}

/// `version`: `[A-Za-z0-9][A-Za-z0-9.+~_-]*`, at most 64 characters (Debian
/// upstream-version characters, without `:`).
pub fn image_version(version: &str) -> Verdict {
    let ok = version.len() <= 64
        && version.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
        && version
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b".+~_-".contains(&b));
    ok.then_some(()).ok_or_else(|| {
        format!(
            "{version:?}: use letters, digits, `.`, `+`, `~`, `_` and `-`, starting with a letter or digit (at most 64)"
        )
    })
}

/// A Debian package as apt and mmdebstrap take it: `name[:arch][=version]`
/// or `name[:arch]/release`.
///
/// - `name`: Debian policy 5.6.1, `[a-z0-9][a-z0-9+.-]+`;
/// - `arch`: `[a-z0-9-]+` (`amd64`, `all`, `i386`);
/// - `version`: a pin, Debian policy 5.6.12: `[epoch:]upstream[-revision]`,
///   starting with a digit, from `[A-Za-z0-9.+~:-]`;
/// - `release`: a suite as [`debian_suite`] takes it (`bookworm-backports`),
///   whose sources the build adds ([`release_of`]).
///
/// Nothing else: no leading `-` (an apt option), no apt
/// patterns (`?name(..)`, `~n..`), no paths to `.deb` files, no `,` (the
/// separator of `--include`).
pub fn debian_package(spec: &str) -> Verdict {
    let (spec_only, release) = match spec.split_once('/') {
        Some((rest, release)) => (rest, Some(release)),
        None => (spec, None),
    };
    let (rest, version) = match spec_only.split_once('=') {
        Some((rest, version)) => (rest, Some(version)),
        None => (spec_only, None),
    };
    let (name, arch) = match rest.split_once(':') {
        Some((name, arch)) => (name, Some(arch)),
        None => (rest, None),
    };
    let name_ok = name.len() >= 2
        && name.bytes().next().is_some_and(is_lower_alnum)
        && name.bytes().all(|b| is_lower_alnum(b) || b"+.-".contains(&b));
    let arch_ok = arch.is_none_or(|a| !a.is_empty() && a.bytes().all(|b| is_lower_alnum(b) || b == b'-'));
    let version_ok = version.is_none_or(|v| {
        v.bytes().next().is_some_and(|b| b.is_ascii_digit())
            && v.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b".+~:-".contains(&b))
    });
    let release_ok = release.is_none_or(|r| version.is_none() && debian_suite(r).is_ok());
    (name_ok && arch_ok && version_ok && release_ok).then_some(()).ok_or_else(|| {
        format!(
            "{spec:?} is not a Debian package: expected `name[:arch][=version]` or `name[:arch]/release`, the name from lowercase letters, digits, `+`, `-` and `.`, starting with a letter or digit, at least two characters"
        )
    })
}

/// The release a package names with `name/release`, if any.
pub fn release_of(spec: &str) -> Option<&str> {
    spec.split_once('/').map(|(_, release)| release)
}

/// A Debian suite or codename: `[a-z0-9-]+`, starting alphanumeric.
pub fn debian_suite(suite: &str) -> Verdict {
    let ok = suite.bytes().next().is_some_and(is_lower_alnum)
        && suite.bytes().all(|b| is_lower_alnum(b) || b == b'-');
    ok.then_some(())
        .ok_or_else(|| format!("expected a Debian suite like `bookworm`, got {suite:?}"))
}

/// A Debian kernel source package: `linux-source-<major>.<minor>`.
pub fn linux_source_package(name: &str) -> Verdict {
    let digits = |p: Option<&str>| p.is_some_and(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
    let ok = name.strip_prefix("linux-source-").is_some_and(|v| {
        let mut parts = v.split('.');
        digits(parts.next()) && digits(parts.next()) && parts.next().is_none()
    });
    ok.then_some(()).ok_or_else(|| {
        format!("expected a Debian kernel source package like `linux-source-6.12`, got {name:?}")
    })
}

/// Whether `kernel.base` names a make config target (`x86_64_defconfig`,
/// `tinyconfig`): `[A-Za-z0-9_-]+config`, not starting with `-` (which make
/// would read as an option). Anything else is a path to a `.config` file;
/// a name with a `.` or `/` is always a path.
pub fn is_make_config_target(base: &str) -> bool {
    base.len() > "config".len()
        && base.ends_with("config")
        && !base.starts_with('-')
        && base
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// A kernel command-line argument: `key[=value]`, one word, safe to put in
/// `grub.cfg` and `/proc/cmdline`.
///
/// - `key`: `[A-Za-z0-9_.-]+`, starting with a letter, digit or `_`
///   (`nohz_full`, `processor.max_cstate`);
/// - `value`: printable ASCII without whitespace, quotes, `\`, `` ` ``, `;`,
///   `$`, `&`, `|`, `<`, `>`, `{`, `}` and `#`
///   (`managed_irq,domain,1-3`, `ttyS0,115200`, `UUID=ab-12`).
pub fn kernel_argument(arg: &str) -> Verdict {
    let (key, value) = match arg.split_once('=') {
        Some((key, value)) => (key, Some(value)),
        None => (arg, None),
    };
    let key_ok = key
        .bytes()
        .next()
        .is_some_and(|b| b.is_ascii_alphanumeric() || b == b'_')
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b));
    let value_ok = value.is_none_or(|v| {
        v.bytes()
            .all(|b| b.is_ascii_graphic() && !b"\"'\\`;$&|<>{}#".contains(&b))
    });
    if key_ok && value_ok {
        return Ok(());
    }
    if arg.chars().any(char::is_whitespace) || arg.is_empty() {
        return Err(format!(
            "{arg:?}: each kernel argument is one word; put separate arguments in separate items"
        ));
    }
    Err(format!(
        "{arg:?} is not a kernel argument: expected `key[=value]`, the key from letters, digits, `_`, `.` and `-`, the value printable without quotes, `\\`, `;`, `$`, `&`, `|`, `<`, `>`, `{{`, `}}`, `#` or backquotes"
    ))
}

/// The Debian mirror: an `http://` or `https://` URL with a host and no
/// credentials, query or fragment. Returns the URL as `url` serializes it.
pub fn mirror_url(text: &str) -> Result<String, String> {
    let refuse = |why: &str| Err(format!("{text:?} is not a mirror URL: {why}"));
    if text.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return refuse(
            "it must be one `http://` or `https://` URL, without spaces or apt options like `[trusted=yes]`",
        );
    }
    let url = match url::Url::parse(text) {
        Ok(url) => url,
        Err(e) => return refuse(&e.to_string()),
    };
    if !matches!(url.scheme(), "http" | "https") {
        return refuse("the scheme must be http or https");
    }
    if url.host_str().is_none_or(str::is_empty) {
        return refuse("it has no host");
    }
    if !url.username().is_empty() || url.password().is_some() {
        return refuse("credentials do not belong in a recipe");
    }
    if url.query().is_some() || url.fragment().is_some() {
        return refuse("a mirror has no query or fragment");
    }
    Ok(url.as_str().to_string())
}

/// A download URL (`kernel.source.url`, `rootfs.base.url`): http(s) with a host.
pub fn download_url(text: &str) -> Verdict {
    let parsed = url::Url::parse(text).map_err(|e| format!("{text:?} is not a URL: {e}"))?;
    if !matches!(parsed.scheme(), "http" | "https") || parsed.host_str().is_none_or(str::is_empty) {
        return Err(format!("url must be http:// or https://, got {text:?}"));
    }
    Ok(())
}

/// An ostree remote's URL (the device's update remote): one http(s) URL
/// with a host, without whitespace, credentials, query or fragment. It is
/// stored on devices, so it carries no secret.
pub fn remote_url(text: &str) -> Verdict {
    if text.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!("{text:?}: a URL has no spaces, tabs or newlines"));
    }
    download_url(text)?;
    let url = url::Url::parse(text).map_err(|e| e.to_string())?;
    if !url.username().is_empty() || url.password().is_some() {
        return Err(format!(
            "{text:?}: credentials do not belong in an ostree remote's URL, which devices store"
        ));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(format!("{text:?}: an ostree remote has no query or fragment"));
    }
    Ok(())
}

/// A disk size (`disk.size`, `--size`): a byte count, or a number with a
/// unit where `K`, `M`, `G`, `T` (and `KiB`…) are powers of 1024 (`8G`,
/// `1536MiB`); at least 1 MiB.
pub fn disk_size(text: &str) -> Result<u64, String> {
    let config = parse_size::Config::new().with_binary();
    let size = config
        .parse_size(text.trim())
        .map_err(|e| format!("{text:?} is not a size (`8G`, `1536M`, bytes): {e}"))?;
    if size < 1024 * 1024 {
        return Err(format!("{text:?} is less than 1 MiB"));
    }
    Ok(size)
}

/// An ostree ref: parts of `[A-Za-z0-9._-]` separated by `/`, no `.`/`..` parts.
pub fn ostree_ref(name: &str) -> Verdict {
    let ok = !name.is_empty()
        && name.split('/').all(|part| {
            !part.is_empty()
                && part != "."
                && part != ".."
                && part
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
        });
    ok.then_some(()).ok_or_else(|| {
        format!("{name:?} is not a valid ostree ref (letters, digits, `._-`, parts separated by `/`)")
    })
}

/// The smallest RSA modulus accepted for an authorized key.
const MIN_RSA_BITS: usize = 2048;

/// An OpenSSH public key line, `type base64 [comment]`, returned in
/// normalised form (one space between fields, no trailing space).
///
/// Refused: `authorized_keys` options (`command="…" ssh-ed25519 …`), control
/// characters anywhere (a newline would start a second line), DSA and
/// algorithms this parser does not know, RSA below 2048 bits, a type word
/// that disagrees with the key blob.
pub fn ssh_public_key(line: &str) -> Result<String, String> {
    if line.chars().any(char::is_control) {
        return Err("an SSH key is one line: no newlines, tabs or other control characters".into());
    }
    let line = line.trim();
    let kind = line.split(' ').next().unwrap_or_default();
    let algorithm = Algorithm::new(kind)
        .ok()
        .filter(|a| !matches!(a, Algorithm::Other(_) | Algorithm::Dsa));
    let Some(algorithm) = algorithm else {
        return Err(format!(
            "{kind:?} is not a supported SSH public key type (ssh-ed25519, ecdsa-sha2-nistp*, ssh-rsa, sk-*); `authorized_keys` options are not allowed"
        ));
    };
    let key = PublicKey::from_openssh(line)
        .map_err(|e| format!("not an OpenSSH public key line (`{algorithm} AAAA… comment`): {e}"))?;
    if let Some(rsa) = key.key_data().rsa() {
        let bits = rsa.n.as_positive_bytes().map_or(0, |n| n.len() * 8);
        if bits < MIN_RSA_BITS {
            return Err(format!(
                "an RSA key needs at least {MIN_RSA_BITS} bits, this one has {bits}"
            ));
        }
    }
    key.to_openssh()
        .map_err(|e| format!("cannot re-encode the SSH key: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debian_packages() {
        for good in [
            "g++",
            "libc6",
            "libc6:amd64",
            "rt-tests=2.5-1",
            "a0=1:2.3~rc1+dfsg-1",
            "xz-utils:all=5.4.1-1",
            "rtla/bookworm-backports",
            "rtla:amd64/bookworm-backports",
        ] {
            debian_package(good).unwrap_or_else(|e| panic!("{e}"));
        }
        for bad in [
            "",
            "a",
            "-o",
            "-oAPT::x=y",
            "A",
            "+x",
            ".x",
            "x y",
            "x,y",
            "x/",
            "x/Stable",
            "x/a b",
            "x/-t",
            "x=1/bookworm-backports",
            "x/a/b",
            "x:",
            ":amd64",
            "x=",
            "x=a1",
            "x=1 2",
            "x:AMD64",
            "x\n",
            "?garbage",
            "/tmp/x.deb",
        ] {
            assert!(debian_package(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn kernel_arguments() {
        for good in [
            "quiet",
            "nohz_full=1-3",
            "isolcpus=managed_irq,domain,1",
            "console=ttyS0,115200n8",
            "a.b-c_d=",
            "x=a=b",
        ] {
            kernel_argument(good).unwrap_or_else(|e| panic!("{e}"));
        }
        for bad in [
            "", "=x", "-x", ".x", "a b", "a;b", "a=b;c", "a=\"b\"", "a='b'", "a=$b", "a=`b`", "a=\\b",
            "a=b\n", "a=é",
        ] {
            assert!(kernel_argument(bad).is_err(), "{bad:?}");
        }
        assert!(kernel_argument("a b").unwrap_err().contains("one word"));
    }

    #[test]
    fn mirrors() {
        assert_eq!(
            mirror_url("http://deb.debian.org/debian").unwrap(),
            "http://deb.debian.org/debian"
        );
        assert_eq!(mirror_url("https://M.example/").unwrap(), "https://m.example/");
        for bad in [
            "[trusted=yes] http://x/",
            "http://x/ y",
            "ftp://x/",
            "http://u:p@x/",
            "x",
            "http://x/#f",
        ] {
            assert!(mirror_url(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn make_targets() {
        assert!(is_make_config_target("x86_64_defconfig"));
        assert!(is_make_config_target("tinyconfig"));
        for not_target in [
            "-Iconfig",
            "--config",
            "config",
            "a.config",
            "a/config",
            "CC=x config",
        ] {
            assert!(!is_make_config_target(not_target), "{not_target:?}");
        }
    }

    #[test]
    fn remote_urls() {
        for good in [
            "https://updates.example.org/emberrtos/",
            "http://10.0.2.2:8080/repo",
        ] {
            remote_url(good).unwrap_or_else(|e| panic!("{e}"));
        }
        for bad in [
            "",
            "updates.example.org",
            "ftp://x/",
            "file:///srv/repo",
            "https://u:p@x/",
            "https://x/?a=b",
            "https://x/#f",
            "https://x/ y",
            "https://x/\nurl=https://evil/",
            " https://x/",
        ] {
            assert!(remote_url(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn sizes_parse_in_powers_of_1024() {
        assert_eq!(disk_size("8G").unwrap(), 8 << 30);
        assert_eq!(disk_size("1536M").unwrap(), 1536 * (1 << 20));
        assert_eq!(disk_size("2GiB").unwrap(), 2 << 30);
        assert_eq!(disk_size("1048576").unwrap(), (1 << 20));
        for bad in ["", "x", "-1G", "1 potato", "12"] {
            assert!(disk_size(bad).is_err(), "{bad:?}");
        }
    }
}
