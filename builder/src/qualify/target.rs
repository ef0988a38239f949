//! A machine to qualify: `USER@HOST`, `USER@HOST:PORT` or `USER@[V6]:PORT`.
//! Both parts are validated before they reach ssh's command line, so a
//! target can never be read as an option (`root@-oProxyCommand=…`).

use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};

/// A target that is not `USER@HOST[:PORT]` with a login name and a host
/// name or address.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{text:?}: {why} (expected USER@HOST, USER@HOST:PORT or USER@[IPV6]:PORT)")]
pub struct BadTarget {
    pub text: String,
    pub why: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Target {
    pub user: String,
    pub host: String,
    pub port: u16,
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "{}@[{}]:{}", self.user, self.host, self.port)
        } else {
            write!(f, "{}@{}:{}", self.user, self.host, self.port)
        }
    }
}

impl Target {
    /// Parses `text`; `default_port` applies when it names none.
    pub fn parse(text: &str, default_port: u16) -> Result<Target, BadTarget> {
        let bad = |why: &str| BadTarget {
            text: text.to_string(),
            why: why.to_string(),
        };
        let (user, rest) = text.split_once('@').ok_or_else(|| bad("no USER@"))?;
        if !is_login_name(user) {
            return Err(bad(
                "the user is not a login name ([A-Za-z_][A-Za-z0-9_.-]*, at most 32)",
            ));
        }
        let (host, bracketed, port) = split_host_port(rest).ok_or_else(|| bad("a bracket is not closed"))?;
        let host_ok = if bracketed {
            host.parse::<Ipv6Addr>().is_ok()
        } else {
            host.parse::<Ipv4Addr>().is_ok() || is_host_name(host)
        };
        if !host_ok {
            return Err(bad(
                "the host is neither an IP address ([IPV6] in brackets) nor a host name (RFC 1123)",
            ));
        }
        let port = port
            .map(|text| parse_port(text).ok_or_else(|| bad("the port is not a number from 1 to 65535")))
            .transpose()?;
        Ok(Target {
            user: user.to_string(),
            host: canonical_host(host),
            port: port.unwrap_or(default_port),
        })
    }

    /// The name ssh-keyscan, ssh-keygen -F and known_hosts use for it.
    pub fn known_hosts_name(&self) -> String {
        if self.port == 22 {
            self.host.clone()
        } else {
            format!("[{}]:{}", self.host, self.port)
        }
    }

    /// Whether both name one machine's SSH server (the user aside).
    pub fn same_machine(&self, other: &Target) -> bool {
        self.host == other.host && self.port == other.port
    }

    /// A file-name-safe form: `HOST-PORT`.
    pub fn file_name(&self) -> String {
        format!("{}-{}", self.host.replace(':', "_"), self.port)
    }
}

/// `(host, bracketed, port)` of `HOST`, `HOST:PORT`, `[V6]` or `[V6]:PORT`.
fn split_host_port(rest: &str) -> Option<(&str, bool, Option<&str>)> {
    if let Some(bracketed) = rest.strip_prefix('[') {
        let (host, after) = bracketed.split_once(']')?;
        let port = match after {
            "" => None,
            // `[V6]22` is not `[V6]:22`: an empty port fails as a port.
            _ => Some(after.strip_prefix(':').unwrap_or("")),
        };
        return Some((host, true, port));
    }
    match rest.split_once(':') {
        Some((host, port)) if !port.contains(':') => Some((host, false, Some(port))),
        _ => Some((rest, false, None)),
    }
}

/// Host names lowercased, IPv6 addresses in their one short form, so one
/// machine has one spelling.
fn canonical_host(host: &str) -> String {
    match host.parse::<Ipv6Addr>() {
        Ok(v6) => v6.to_string(),
        Err(_) => host.to_ascii_lowercase(),
    }
}

fn parse_port(text: &str) -> Option<u16> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse::<u16>().ok().filter(|port| *port != 0)
}

fn is_login_name(user: &str) -> bool {
    let mut chars = user.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && user.len() <= 32
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}

fn is_host_name(host: &str) -> bool {
    let label_ok = |label: &str| {
        !label.is_empty()
            && label.len() <= 63
            && !label.starts_with('-')
            && !label.ends_with('-')
            && label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
    };
    !host.is_empty() && host.len() <= 253 && host.split('.').all(label_ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(user: &str, host: &str, port: u16) -> Target {
        Target {
            user: user.into(),
            host: host.into(),
            port,
        }
    }

    #[test]
    fn accepts_users_hosts_and_ports() {
        assert_eq!(
            Target::parse("root@10.0.0.7", 22),
            Ok(target("root", "10.0.0.7", 22))
        );
        assert_eq!(
            Target::parse("root@rig-a.lab", 2222),
            Ok(target("root", "rig-a.lab", 2222))
        );
        assert_eq!(
            Target::parse("root@127.0.0.1:40022", 22),
            Ok(target("root", "127.0.0.1", 40022))
        );
        assert_eq!(
            Target::parse("root@[fe80::1]:2200", 22),
            Ok(target("root", "fe80::1", 2200))
        );
        assert_eq!(Target::parse("root@[::1]", 22), Ok(target("root", "::1", 22)));
        assert_eq!(Target::parse("_ops.x-1@h", 22), Ok(target("_ops.x-1", "h", 22)));
        assert_eq!(target("root", "::1", 2200).to_string(), "root@[::1]:2200");
        let spelled = |text: &str| Target::parse(text, 22).unwrap();
        assert_eq!(spelled("root@[0:0::1]:22"), target("root", "::1", 22));
        assert_eq!(spelled("root@Rig-A.LAB"), target("root", "rig-a.lab", 22));
        assert!(spelled("root@h").same_machine(&spelled("admin@H:22")));
        assert!(!spelled("root@h").same_machine(&spelled("root@h:2222")));
        assert_eq!(target("root", "h", 22).known_hosts_name(), "h");
        assert_eq!(target("root", "h", 2222).known_hosts_name(), "[h]:2222");
        assert_eq!(target("root", "::1", 2222).file_name(), "__1-2222");
    }

    #[test]
    fn refuses_what_could_become_an_option_or_a_shell_word() {
        for bad in [
            "root@-oProxyCommand=touch /tmp/x",
            "-oProxyCommand=x@host",
            "root@host;reboot",
            "root@host$(id)",
            "ro ot@host",
            "root@",
            "@host",
            "host",
            "root@host:0",
            "root@host:99999",
            "root@host:22x",
            "root@host:+22",
            "root@fe80::1",
            "root@[fe80::1]x",
            "root@[::1]22",
            "root@[not-v6]:22",
            "root@-host",
            "root@host..lab",
            "root@a@b",
            "1root@host",
        ] {
            let error = Target::parse(bad, 22).unwrap_err();
            assert!(error.to_string().contains("expected USER@HOST"), "{bad}: {error}");
        }
    }
}
