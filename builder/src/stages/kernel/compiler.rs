//! How the kernel's C files are compiled: here, on distcc hosts, and/or
//! through ccache. The output is the same either way, so none of this is in
//! the kernel's cache key ([`super::build::kernel_key`] does not take it).

use std::path::PathBuf;
use std::process::Command;

use anyhow::Result;

use crate::tool;

pub use crate::recipe::distcc::{DistccHost, DistccHosts, HostsError};

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

    /// The `CC` make variable for the compiler `gcc` (`gcc`, or a cross
    /// compiler such as `aarch64-linux-gnu-gcc`): itself, `distcc gcc` or
    /// `ccache gcc` (ccache hands misses to distcc through `CCACHE_PREFIX`).
    pub fn cc(&self, gcc: &str) -> String {
        match (&self.ccache, &self.distcc) {
            (Some(_), _) => format!("ccache {gcc}"),
            (None, Some(_)) => format!("distcc {gcc}"),
            (None, None) => gcc.into(),
        }
    }

    /// Sets `CC` (for the compiler `gcc`) and the tools' environment on a
    /// `make` of the kernel.
    pub fn apply(&self, make: &mut Command, gcc: &str) {
        if self.distcc.is_none() && self.ccache.is_none() {
            return;
        }
        make.arg(format!("CC={}", self.cc(gcc)));
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

/// What the command line asks (each overrides the environment and the recipe).
#[derive(Clone, Debug, Default)]
pub struct CompilerFlags {
    /// `--distcc [HOSTS]`: `Some(None)` takes `$DISTCC_HOSTS`.
    pub distcc: Option<Option<String>>,
    /// `--ccache [DIR]`.
    pub ccache: Option<Option<PathBuf>>,
    /// `-j N`.
    pub jobs: Option<usize>,
}

/// A compile setting that does not hold, named by where it came from.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{source_name}: {message}")]
pub struct BadSetting {
    /// `--distcc`, `DISTCC_HOSTS`, `kernel.build.jobs`...
    pub source_name: String,
    pub message: String,
}

fn bad(source_name: &str, message: impl std::fmt::Display) -> BadSetting {
    BadSetting {
        source_name: source_name.to_string(),
        message: message.to_string(),
    }
}

/// The options in force: the command line, else the environment
/// (`DISTCC_HOSTS`, `IMGBUILD_CCACHE` as `1`/`0` or a directory,
/// `IMGBUILD_JOBS`), else the recipe's `kernel.build`. `default_ccache` is
/// where ccache keeps its cache when no directory is named.
pub fn resolve(
    recipe: &crate::recipe::KernelBuild,
    flags: &CompilerFlags,
    env: impl Fn(&str) -> Option<String>,
    default_ccache: PathBuf,
) -> Result<CompilerOptions, BadSetting> {
    let env_hosts = env("DISTCC_HOSTS").filter(|h| !h.trim().is_empty());
    let hosts = |text: &str, from: &str| DistccHosts::parse(text).map_err(|e| bad(from, e));
    let distcc = match (&flags.distcc, &env_hosts, &recipe.distcc) {
        (Some(Some(text)), _, _) => Some(hosts(text, "--distcc")?),
        (Some(None), Some(text), _) | (None, Some(text), _) => Some(hosts(text, "DISTCC_HOSTS")?),
        (Some(None), None, _) => return Err(bad("--distcc", "names no hosts and DISTCC_HOSTS is not set")),
        (None, None, Some(Some(text))) => Some(hosts(text, "kernel.build.distcc.hosts")?),
        (None, None, Some(None)) => {
            return Err(bad(
                "kernel.build.distcc",
                "names no hosts and DISTCC_HOSTS is not set",
            ));
        }
        (None, None, None) => None,
    };
    let env_ccache = match env("IMGBUILD_CCACHE").as_deref().map(str::trim) {
        None | Some("") | Some("0") | Some("false") => None,
        Some("1") | Some("true") => Some(None),
        Some(dir) => Some(Some(PathBuf::from(dir))),
    };
    let ccache = flags
        .ccache
        .clone()
        .or(env_ccache)
        .or_else(|| recipe.ccache.clone())
        .map(|dir| dir.unwrap_or(default_ccache));
    let env_jobs = match env("IMGBUILD_JOBS") {
        None => None,
        Some(text) => Some(
            text.trim()
                .parse::<usize>()
                .ok()
                .filter(|n| (1..=4096).contains(n))
                .ok_or_else(|| {
                    bad(
                        "IMGBUILD_JOBS",
                        format!("{text:?} is not a number from 1 to 4096"),
                    )
                })?,
        ),
    };
    Ok(CompilerOptions {
        distcc,
        ccache,
        jobs: flags.jobs.or(env_jobs).or(recipe.jobs),
    })
}

/// What distcc says when a host lets a compile down.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum DistccEvent {
    /// It could not connect; distcc tries another host, else compiles here.
    Unreachable(String),
    /// The compile ran on this machine instead (`running locally instead`),
    /// sent to the host named, or to none when distcc could not pick one
    /// (its lock or state directory unusable, every host backed off).
    RanHere(Option<String>),
}

/// The event a line of distcc's stderr reports, if any (pure).
pub fn distcc_event(line: &str) -> Option<DistccEvent> {
    if !line.starts_with("distcc[") {
        return None;
    }
    if let Some(rest) = line.split_once("failed to distribute").map(|(_, r)| r) {
        let before = rest
            .strip_suffix("running locally instead")?
            .trim_end()
            .strip_suffix(',')?;
        let host = before.rsplit_once(" to ").map(|(_, host)| host.to_string());
        return (host.is_some() || before.is_empty()).then_some(DistccEvent::RanHere(host));
    }
    let host = line
        .split_once("connect to ")
        .map(|(_, rest)| rest.split_whitespace().next().unwrap_or_default())
        .or_else(|| {
            line.split_once("timeout while connecting to ")
                .map(|(_, rest)| rest.trim())
        })?;
    let host = host.trim_end_matches([':', ',']);
    (line.contains("failed") || line.contains("timeout")).then(|| DistccEvent::Unreachable(host.to_string()))
}

/// What the log says of the events of one build.
pub fn describe_events(events: &std::collections::BTreeMap<DistccEvent, u64>) -> Vec<String> {
    events
        .iter()
        .map(|(event, count)| match event {
            DistccEvent::Unreachable(host) => format!(
                "distcc could not reach {host} ({count} times): its compiles went to the other hosts or, failing those, ran on this machine"
            ),
            DistccEvent::RanHere(Some(host)) => {
                format!("distcc could not use {host}: {count} compiles fell back to this machine (distcc's own behaviour)")
            }
            DistccEvent::RanHere(None) => format!(
                "distcc could not pick a host: {count} compiles fell back to this machine (the build log has distcc's reason)"
            ),
        })
        .collect()
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
            o.apply(&mut cmd, "gcc");
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
        assert_eq!(distcc.cc("aarch64-linux-gnu-gcc"), "distcc aarch64-linux-gnu-gcc");
    }

    #[test]
    fn the_command_line_beats_the_environment_which_beats_the_recipe() {
        use crate::recipe::KernelBuild;
        let recipe = KernelBuild {
            distcc: Some(Some("recipe/4".into())),
            ccache: Some(None),
            jobs: Some(7),
        };
        let none = |_: &str| None;
        let resolved = resolve(&recipe, &CompilerFlags::default(), none, "/cache/ccache".into()).unwrap();
        assert_eq!(resolved.distcc.unwrap().text, "recipe/4");
        assert_eq!(
            resolved.ccache.as_deref(),
            Some(std::path::Path::new("/cache/ccache"))
        );
        assert_eq!(resolved.jobs, Some(7));
        let env = |name: &str| match name {
            "DISTCC_HOSTS" => Some("env/3".to_string()),
            "IMGBUILD_CCACHE" => Some("0".to_string()),
            "IMGBUILD_JOBS" => Some("5".to_string()),
            _ => None,
        };
        let resolved = resolve(&recipe, &CompilerFlags::default(), env, "/c".into()).unwrap();
        assert_eq!(resolved.distcc.unwrap().text, "env/3");
        assert_eq!(resolved.jobs, Some(5));
        assert_eq!(
            resolved.ccache.as_deref(),
            Some(std::path::Path::new("/c")),
            "IMGBUILD_CCACHE=0 does not undo the recipe"
        );
        let flags = CompilerFlags {
            distcc: Some(Some("cli/2".into())),
            ccache: Some(Some("/mine".into())),
            jobs: Some(1),
        };
        let resolved = resolve(&recipe, &flags, env, "/c".into()).unwrap();
        assert_eq!(resolved.distcc.unwrap().text, "cli/2");
        assert_eq!(resolved.ccache.as_deref(), Some(std::path::Path::new("/mine")));
        assert_eq!(resolved.jobs, Some(1));
        let plain = resolve(
            &KernelBuild::default(),
            &CompilerFlags::default(),
            none,
            "/c".into(),
        )
        .unwrap();
        assert_eq!(plain, CompilerOptions::default());
    }

    #[test]
    fn settings_that_do_not_hold_name_their_source() {
        use crate::recipe::KernelBuild;
        let none = |_: &str| None;
        let wants_env = KernelBuild {
            distcc: Some(None),
            ..Default::default()
        };
        let err = resolve(&wants_env, &CompilerFlags::default(), none, "/c".into()).unwrap_err();
        assert_eq!(err.source_name, "kernel.build.distcc");
        let flags = CompilerFlags {
            distcc: Some(None),
            ..Default::default()
        };
        assert_eq!(
            resolve(&KernelBuild::default(), &flags, none, "/c".into())
                .unwrap_err()
                .source_name,
            "--distcc"
        );
        let env = |name: &str| (name == "IMGBUILD_JOBS").then(|| "many".to_string());
        let err = resolve(
            &KernelBuild::default(),
            &CompilerFlags::default(),
            env,
            "/c".into(),
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "IMGBUILD_JOBS: \"many\" is not a number from 1 to 4096"
        );
        let env = |name: &str| (name == "DISTCC_HOSTS").then(|| "a;b".to_string());
        let err = resolve(
            &KernelBuild::default(),
            &CompilerFlags::default(),
            env,
            "/c".into(),
        )
        .unwrap_err();
        assert_eq!(err.source_name, "DISTCC_HOSTS");
    }

    #[test]
    fn distcc_events_name_their_host() {
        let ran_here = "distcc[4242] Warning: failed to distribute kernel/fork.c to 127.0.0.1:3633/2, running locally instead";
        assert_eq!(
            distcc_event(ran_here),
            Some(DistccEvent::RanHere(Some("127.0.0.1:3633/2".into())))
        );
        let no_host =
            "distcc[9476] (dcc_build_somewhere) Warning: failed to distribute, running locally instead";
        assert_eq!(distcc_event(no_host), Some(DistccEvent::RanHere(None)));
        let refused =
            "distcc[25743] ERROR: nonblocking connect to 127.0.0.1:44049 failed: Connection refused";
        assert_eq!(
            distcc_event(refused),
            Some(DistccEvent::Unreachable("127.0.0.1:44049".into()))
        );
        let timeout = "distcc[7] (dcc_connect_timeout) ERROR: timeout while connecting to 10.0.0.9:3632";
        assert_eq!(
            distcc_event(timeout),
            Some(DistccEvent::Unreachable("10.0.0.9:3632".into()))
        );
        assert_eq!(distcc_event("  CC      kernel/fork.o"), None);
        assert_eq!(
            distcc_event("kernel/fork.c: warning: failed to distribute the load"),
            None
        );
        let events = std::collections::BTreeMap::from([
            (DistccEvent::RanHere(Some("h/2".into())), 3),
            (DistccEvent::RanHere(None), 1),
        ]);
        assert_eq!(
            describe_events(&events),
            [
                "distcc could not pick a host: 1 compiles fell back to this machine (the build log has distcc's reason)",
                "distcc could not use h/2: 3 compiles fell back to this machine (distcc's own behaviour)",
            ]
        );
    }
}
