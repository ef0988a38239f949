//! How the kernel's C files are compiled: here, on distcc hosts, and/or
//! through ccache. The output is the same either way, so none of this is in
//! the kernel's cache key ([`super::build::kernel_key`] does not take it).

use std::path::PathBuf;
use std::process::Command;

use anyhow::Result;

use crate::tool;

/// distcc's own limit for a host given without `/N`.
const DEFAULT_SLOTS: usize = 2;

/// One distcc host: `HOST[:PORT][/LIMIT][,OPTIONS]`, `@HOST` (over ssh) or `localhost`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DistccHost {
    pub spec: String,
    pub slots: usize,
}

/// A distcc host list as `DISTCC_HOSTS` takes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DistccHosts {
    pub hosts: Vec<DistccHost>,
    /// The list as given, passed to distcc unchanged.
    pub text: String,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum HostsError {
    #[error("the distcc host list is empty")]
    Empty,
    #[error("distcc host {host:?}: {why}")]
    BadHost { host: String, why: &'static str },
}

impl DistccHosts {
    /// Parses a host list (pure). Options (`--randomize`, `--localslots=N`)
    /// are kept for distcc and take no job slots.
    pub fn parse(text: &str) -> Result<DistccHosts, HostsError> {
        let mut hosts = Vec::new();
        for word in text.split_whitespace().filter(|w| !w.starts_with("--")) {
            let bad = |why| HostsError::BadHost {
                host: word.to_string(),
                why,
            };
            let allowed = |c: char| c.is_ascii_alphanumeric() || ".:/,@_[]-+=".contains(c);
            if !word.chars().all(allowed) {
                return Err(bad("holds a character no host specification does"));
            }
            let name = word
                .trim_start_matches('@')
                .split([':', '/', ','])
                .next()
                .unwrap_or_default();
            if name.is_empty() && !word.starts_with('[') {
                return Err(bad("names no host"));
            }
            let slots = match word.split_once('/') {
                None => DEFAULT_SLOTS,
                Some((_, rest)) => rest
                    .split(',')
                    .next()
                    .and_then(|n| n.parse::<usize>().ok())
                    .filter(|n| (1..=1024).contains(n))
                    .ok_or_else(|| bad("the limit after `/` is not a number from 1 to 1024"))?,
            };
            hosts.push(DistccHost {
                spec: word.to_string(),
                slots,
            });
        }
        if hosts.is_empty() {
            return Err(HostsError::Empty);
        }
        Ok(DistccHosts {
            hosts,
            text: text.split_whitespace().collect::<Vec<_>>().join(" "),
        })
    }

    pub fn slots(&self) -> usize {
        self.hosts.iter().map(|h| h.slots).sum()
    }
}

/// How to compile: the recipe's `kernel.build`, overridden by the
/// environment, overridden by the command line.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CompilerOptions {
    pub distcc: Option<DistccHosts>,
    /// The ccache directory.
    pub ccache: Option<PathBuf>,
    pub jobs: Option<usize>,
}

impl CompilerOptions {
    /// `-j`: as given, else what distcc's hosts take, else this machine's CPUs.
    pub fn jobs(&self) -> usize {
        self.jobs
            .or_else(|| self.distcc.as_ref().map(DistccHosts::slots))
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
    }

    /// The programs this needs, each named with its Debian package when missing.
    pub fn require_tools(&self) -> Result<()> {
        let mut tools = vec!["gcc"];
        if self.distcc.is_some() {
            tools.push("distcc");
        }
        if self.ccache.is_some() {
            tools.push("ccache");
        }
        tool::require_all(&tools)
    }

    /// The `CC` make variable: `gcc`, `distcc gcc`, `ccache gcc` (ccache
    /// hands misses to distcc through `CCACHE_PREFIX`).
    pub fn cc(&self) -> String {
        match (&self.ccache, &self.distcc) {
            (Some(_), _) => "ccache gcc".into(),
            (None, Some(_)) => "distcc gcc".into(),
            (None, None) => "gcc".into(),
        }
    }

    /// Sets `CC` and the tools' environment on a `make` of the kernel.
    pub fn apply(&self, make: &mut Command) {
        if self.distcc.is_none() && self.ccache.is_none() {
            return;
        }
        make.arg(format!("CC={}", self.cc()));
        if let Some(hosts) = &self.distcc {
            make.env("DISTCC_HOSTS", &hosts.text);
        }
        if let Some(dir) = &self.ccache {
            make.env("CCACHE_DIR", dir);
            // Absolute paths stay absolute: rewriting them relative to a
            // base dir defeats Kbuild's -fmacro-prefix-map, and __FILE__ in
            // every WARN would then name the build dir.
            make.env("CCACHE_BASEDIR", "");
            if self.distcc.is_some() {
                make.env("CCACHE_PREFIX", "distcc");
            }
        }
    }

    pub fn describe(&self) -> String {
        let mut parts = vec![format!("-j{}", self.jobs())];
        if let Some(hosts) = &self.distcc {
            parts.push(format!("distcc on {} ({} slots)", hosts.text, hosts.slots()));
        }
        if let Some(dir) = &self.ccache {
            parts.push(format!("ccache in {}", dir.display()));
        }
        parts.join(", ")
    }
}

/// The host of distcc's warning that a compile ran on this machine instead
/// (`failed to distribute X to HOST, running locally instead`).
pub fn fallback_host(line: &str) -> Option<String> {
    let rest = line.split_once("failed to distribute ")?.1;
    let before = rest
        .strip_suffix("running locally instead")?
        .trim_end()
        .strip_suffix(',')?;
    Some(before.rsplit_once(" to ")?.1.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_lists_give_their_slots() {
        let hosts = DistccHosts::parse("build1.example.org/8,lzo  build2.example.org/8,lzo").unwrap();
        assert_eq!(hosts.slots(), 16);
        assert_eq!(hosts.text, "build1.example.org/8,lzo build2.example.org/8,lzo");
        let hosts =
            DistccHosts::parse("--randomize 127.0.0.1:3632/3 127.0.0.1:3633 @builder localhost/1").unwrap();
        assert_eq!(
            hosts.hosts.iter().map(|h| h.slots).collect::<Vec<_>>(),
            [3, 2, 2, 1]
        );
        assert_eq!(DistccHosts::parse("  ").unwrap_err(), HostsError::Empty);
        assert_eq!(DistccHosts::parse("--randomize").unwrap_err(), HostsError::Empty);
        for bad in ["host/0", "host/x", "host/99999", "a;rm", "$(id)", "/8"] {
            assert!(
                matches!(DistccHosts::parse(bad), Err(HostsError::BadHost { .. })),
                "{bad}"
            );
        }
    }

    #[test]
    fn jobs_follow_the_hosts_unless_given() {
        let distcc = DistccHosts::parse("a/4 b/4").ok();
        let options = CompilerOptions {
            distcc: distcc.clone(),
            ..Default::default()
        };
        assert_eq!(options.jobs(), 8);
        assert_eq!(
            CompilerOptions {
                distcc,
                jobs: Some(3),
                ..Default::default()
            }
            .jobs(),
            3
        );
    }

    #[test]
    fn cc_and_environment() {
        let env = |o: &CompilerOptions| {
            let mut cmd = Command::new("make");
            o.apply(&mut cmd);
            let args: Vec<String> = cmd.get_args().map(|a| a.to_string_lossy().into_owned()).collect();
            let vars: Vec<(String, String)> = cmd
                .get_envs()
                .map(|(k, v)| {
                    (
                        k.to_string_lossy().into_owned(),
                        v.unwrap().to_string_lossy().into_owned(),
                    )
                })
                .collect();
            (args, vars)
        };
        assert_eq!(env(&CompilerOptions::default()), (vec![], vec![]));
        let both = CompilerOptions {
            distcc: DistccHosts::parse("127.0.0.1:3632/2").ok(),
            ccache: Some("/c".into()),
            jobs: None,
        };
        let (args, vars) = env(&both);
        assert_eq!(args, ["CC=ccache gcc"]);
        for pair in [
            ("DISTCC_HOSTS", "127.0.0.1:3632/2"),
            ("CCACHE_DIR", "/c"),
            ("CCACHE_BASEDIR", ""),
            ("CCACHE_PREFIX", "distcc"),
        ] {
            assert!(
                vars.contains(&(pair.0.into(), pair.1.into())),
                "{pair:?} in {vars:?}"
            );
        }
        let distcc = CompilerOptions { ccache: None, ..both };
        assert_eq!(env(&distcc).0, ["CC=distcc gcc"]);
    }

    #[test]
    fn the_fallback_warning_names_its_host() {
        let line = "distcc[4242] (dcc_build_somewhere) Warning: failed to distribute kernel/fork.c to 127.0.0.1:3633/2, running locally instead";
        assert_eq!(fallback_host(line).as_deref(), Some("127.0.0.1:3633/2"));
        assert_eq!(fallback_host("  CC      kernel/fork.o"), None);
    }
}
