//! The one way EmberRTOS runs an RT container: one rootful podman container
//! per isolated CPU, pinned to it, with only the privileges a control loop
//! needs (issue 19). `emberrtos-rt-run` on the device and `jitter
//! --container` both start containers with [`profile_args`], so what jitter
//! measures is what a workload gets.
//!
//! The checks are pure functions over what the caller read from the running
//! system; [`lock_cpu`] is the one piece of I/O, so that both tools take the
//! same per-CPU lock.

use std::collections::BTreeMap;
use std::fmt;
use std::fs::File;
use std::path::PathBuf;

use serde::Deserialize;

use crate::report::CpuSet;
use rtcheck::uts;

/// The label that says which RT CPU a container holds.
pub const CPU_LABEL: &str = "org.emberrtos.rt-cpu";
/// The capabilities an RT container keeps (every other one is dropped).
pub const CAPABILITIES: [&str; 2] = ["SYS_NICE", "IPC_LOCK"];
/// Its effective capability set as `/proc/self/status` shows it (`CapEff`):
/// CAP_IPC_LOCK (14) and CAP_SYS_NICE (23), nothing else.
pub const CAP_EFF: u64 = (1 << 14) | (1 << 23);
/// Where the per-CPU locks live (a tmpfs: no lock outlives a boot).
pub const LOCK_DIR: &str = "/run/emberrtos";
/// The flavor file an RT deployment carries.
pub const FLAVOR_FILE: &str = "/etc/emberrtos/kernel-flavor";
/// The CPUs the kernel isolates from the scheduler's domains (`isolcpus=`).
pub const ISOLATED_FILE: &str = "/sys/devices/system/cpu/isolated";

/// podman's options for a container on `cpu`: pinned there, every
/// capability dropped but [`CAPABILITIES`], RT priority up to 99 and
/// unlimited locked memory, no new privileges, no network (no I/O on the RT
/// path), and the [`CPU_LABEL`] that marks the CPU as held.
pub fn profile_args(cpu: u32) -> Vec<String> {
    [
        "--cpuset-cpus",
        &cpu.to_string(),
        "--cap-drop",
        "ALL",
        "--cap-add",
        &CAPABILITIES.join(","),
        "--ulimit",
        "rtprio=99:99",
        "--ulimit",
        "memlock=-1:-1",
        "--security-opt",
        "no-new-privileges",
        "--network",
        "none",
        "--label",
        &format!("{CPU_LABEL}={cpu}"),
    ]
    .map(String::from)
    .to_vec()
}

/// `podman ps` arguments that list every container labelled with
/// [`CPU_LABEL`], as the JSON [`parse_listing`] reads (its `State` is
/// podman's state word; the template `{{.State}}` says "Up 2 seconds ago").
pub fn list_args() -> Vec<String> {
    [
        "ps",
        "--all",
        "--filter",
        &format!("label={CPU_LABEL}"),
        "--format",
        "json",
    ]
    .map(String::from)
    .to_vec()
}

/// A container labelled for an RT CPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Container {
    pub id: String,
    /// podman's state, in lower case.
    pub state: String,
    pub name: String,
    /// The CPU its label names.
    pub cpu: u32,
}

impl Container {
    /// Whether it occupies its CPU: running, paused, or being stopped. A
    /// created or exited one runs nothing there (podman also shows every
    /// container that outlived a reboot as created).
    pub fn holds_cpu(&self) -> bool {
        matches!(self.state.as_str(), "running" | "paused" | "stopping")
    }
}

impl fmt::Display for Container {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let short = &self.id[..self.id.len().min(12)];
        write!(f, "{} ({short}, {})", self.name, self.state)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`podman ps --format json`: {message}")]
pub struct ListError {
    pub message: String,
}

/// One entry of `podman ps --format json`, the fields read.
#[derive(Deserialize)]
struct Listed {
    #[serde(rename = "Id")]
    id: String,
    #[serde(rename = "State")]
    state: String,
    #[serde(rename = "Names", default)]
    names: Vec<String>,
    #[serde(rename = "Labels", default)]
    labels: Option<BTreeMap<String, String>>,
}

/// Reads the output of `podman` with [`list_args`]; a container whose
/// label is not a CPU number is an error that names it.
pub fn parse_listing(json: &str) -> Result<Vec<Container>, ListError> {
    let listed: Vec<Listed> = serde_json::from_str(json).map_err(|e| ListError {
        message: e.to_string(),
    })?;
    listed
        .into_iter()
        .map(|entry| {
            let label = entry.labels.as_ref().and_then(|l| l.get(CPU_LABEL));
            let name = entry.names.first().cloned().unwrap_or_else(|| entry.id.clone());
            let cpu = label
                .and_then(|value| value.parse().ok())
                .ok_or_else(|| ListError {
                    message: format!("container {name}: label {CPU_LABEL}={label:?} is not a CPU number"),
                })?;
            Ok(Container {
                id: entry.id,
                state: entry.state.to_ascii_lowercase(),
                name,
                cpu,
            })
        })
        .collect()
}

/// Why [`list_rt_containers`] has no listing.
#[derive(Debug, thiserror::Error)]
pub enum ListFailure {
    /// podman could not be run (`NotFound`: it is not installed).
    #[error("running podman")]
    Spawn(#[source] std::io::Error),
    #[error("podman ps failed ({status}): {stderr}")]
    Failed {
        status: std::process::ExitStatus,
        stderr: String,
    },
    #[error(transparent)]
    Parse(#[from] ListError),
}

/// Every container labelled for an RT CPU, as podman lists them now.
pub fn list_rt_containers() -> Result<Vec<Container>, ListFailure> {
    let output = std::process::Command::new("podman")
        .args(list_args())
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(ListFailure::Spawn)?;
    if !output.status.success() {
        return Err(ListFailure::Failed {
            status: output.status,
            stderr: String::from_utf8_lossy(&output.stderr).trim().to_string(),
        });
    }
    Ok(parse_listing(&String::from_utf8_lossy(&output.stdout))?)
}

/// The containers of `listed` that hold `cpu`.
pub fn holders(listed: &[Container], cpu: u32) -> Vec<Container> {
    listed
        .iter()
        .filter(|c| c.cpu == cpu && c.holds_cpu())
        .cloned()
        .collect()
}

/// Why an RT container may not start. Each names what to do about it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("the running kernel is not PREEMPT_RT ({uname_v:?}): RT containers run only on an RT deployment")]
    NotRtKernel { uname_v: String },
    #[error(
        "this deployment's flavor is {flavor:?} ({FLAVOR_FILE}), not rt: RT containers run only on an RT deployment"
    )]
    NotRtFlavor { flavor: String },
    #[error(
        "CPU {cpu} is not isolated (isolated: {}): an RT container runs only on a CPU the kernel isolates (isolcpus=)",
        shown(isolated)
    )]
    NotIsolated { cpu: u32, isolated: CpuSet },
    #[error(
        "no isolated CPU is free (isolated: {}): each holds an RT container, or the kernel isolates none (isolcpus=)",
        shown(isolated)
    )]
    NoFreeCpu { isolated: CpuSet },
    #[error(
        "CPU {cpu} is held by {}: one RT container per CPU (stop it, or choose another isolated CPU)",
        list(holders)
    )]
    Held { cpu: u32, holders: Vec<Container> },
    #[error("CPU {cpu} is being claimed by another emberrtos-rt-run or jitter (its lock {} is taken)", lock_path(*cpu).display())]
    Locked { cpu: u32 },
}

fn shown(set: &CpuSet) -> String {
    if set.is_empty() {
        "none".into()
    } else {
        set.to_string()
    }
}

fn list(holders: &[Container]) -> String {
    holders
        .iter()
        .map(Container::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// What the running system says, as read by the caller.
pub struct Running<'a> {
    /// `uname -v` (`/proc/sys/kernel/version`).
    pub uname_v: &'a str,
    /// [`FLAVOR_FILE`]'s text, `None` if it is missing.
    pub flavor: Option<&'a str>,
    /// [`ISOLATED_FILE`]'s text.
    pub isolated: &'a str,
}

/// The isolated CPUs of an RT deployment running its RT kernel; refuses
/// anything else.
pub fn rt_cpus(running: &Running) -> Result<CpuSet, Refusal> {
    let rt = uts::parse_uts_version(running.uname_v.trim()).is_ok_and(|v| v.is_preempt_rt());
    if !rt {
        return Err(Refusal::NotRtKernel {
            uname_v: running.uname_v.trim().into(),
        });
    }
    let flavor = running.flavor.map(str::trim).unwrap_or("");
    if flavor != "rt" {
        return Err(Refusal::NotRtFlavor {
            flavor: running.flavor.map_or("(missing)".into(), |f| f.trim().into()),
        });
    }
    // An unreadable list isolates nothing.
    Ok(CpuSet::parse(running.isolated).unwrap_or_default())
}

/// The CPU to use: `wanted`, which must be isolated, or else the first
/// isolated CPU no container in `listed` holds.
pub fn choose_cpu(isolated: &CpuSet, wanted: Option<u32>, listed: &[Container]) -> Result<u32, Refusal> {
    match wanted {
        Some(cpu) if isolated.contains(cpu) => Ok(cpu),
        Some(cpu) => Err(Refusal::NotIsolated {
            cpu,
            isolated: isolated.clone(),
        }),
        None if isolated.is_empty() => Err(Refusal::NoFreeCpu {
            isolated: isolated.clone(),
        }),
        None => isolated
            .iter()
            .find(|&cpu| holders(listed, cpu).is_empty())
            .ok_or_else(|| Refusal::NoFreeCpu {
                isolated: isolated.clone(),
            }),
    }
}

/// Refuses `cpu` if a container in `listed` holds it.
pub fn check_free(cpu: u32, listed: &[Container]) -> Result<(), Refusal> {
    let holders = holders(listed, cpu);
    if holders.is_empty() {
        Ok(())
    } else {
        Err(Refusal::Held { cpu, holders })
    }
}

/// The lock file of `cpu`.
pub fn lock_path(cpu: u32) -> PathBuf {
    PathBuf::from(LOCK_DIR).join(format!("rt-cpu{cpu}.lock"))
}

/// Takes `cpu`'s lock without waiting: `Ok(None)` if another process holds
/// it. The lock lasts as long as the file (and any process it is passed to).
pub fn lock_cpu(cpu: u32) -> std::io::Result<Option<File>> {
    std::fs::create_dir_all(LOCK_DIR)?;
    let file = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(lock_path(cpu))?;
    match file.try_lock() {
        Ok(()) => Ok(Some(file)),
        Err(std::fs::TryLockError::WouldBlock) => Ok(None),
        Err(std::fs::TryLockError::Error(e)) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RT: &str = "#1 SMP PREEMPT_RT Sun Nov 30 00:00:00 UTC 2025";

    fn running<'a>(uname_v: &'a str, flavor: Option<&'a str>, isolated: &'a str) -> Running<'a> {
        Running {
            uname_v,
            flavor,
            isolated,
        }
    }

    #[test]
    fn the_profile_pins_and_keeps_two_capabilities() {
        let args = profile_args(3).join(" ");
        assert_eq!(
            args,
            "--cpuset-cpus 3 --cap-drop ALL --cap-add SYS_NICE,IPC_LOCK --ulimit rtprio=99:99 \
             --ulimit memlock=-1:-1 --security-opt no-new-privileges --network none \
             --label org.emberrtos.rt-cpu=3"
        );
        assert!(!args.contains("privileged"));
        assert_eq!(format!("{CAP_EFF:016x}"), "0000000000804000");
    }

    /// `podman ps --all --format json` as podman 4.3 prints it, cut to a
    /// few fields per container.
    fn listing(entries: &[(&str, &str, &str, &str)]) -> String {
        let entries: Vec<String> = entries
            .iter()
            .map(|(id, state, name, cpu)| {
                format!(
                    r#"{{"Id": "{id}", "Labels": {{"{CPU_LABEL}": "{cpu}"}}, "Names": ["{name}"], "State": "{state}", "Status": "Up 2 seconds ago"}}"#
                )
            })
            .collect();
        format!("[\n{}\n]\n", entries.join(",\n"))
    }

    #[test]
    fn the_listing_is_read_and_only_live_containers_hold() {
        let text = listing(&[
            ("0123abcd", "running", "loop", "1"),
            ("feed", "exited", "old", "1"),
            ("beef", "Created", "stale", "1"),
            ("abcd", "running", "other", "2"),
        ]);
        let listed = parse_listing(&text).unwrap();
        assert_eq!(listed.len(), 4);
        assert_eq!(listed[2].state, "created");
        assert!(check_free(1, &listed[1..]).is_ok());
        assert!(check_free(3, &listed).is_ok());
        let refusal = check_free(1, &listed).unwrap_err();
        assert_eq!(
            refusal.to_string(),
            "CPU 1 is held by loop (0123abcd, running): one RT container per CPU (stop it, or choose another isolated CPU)"
        );
        assert_eq!(parse_listing("[]\n").unwrap(), vec![]);
        assert_eq!(
            list_args().join(" "),
            "ps --all --filter label=org.emberrtos.rt-cpu --format json"
        );
    }

    #[test]
    fn a_garbled_listing_or_label_is_an_error() {
        let err = parse_listing(&listing(&[("ab", "running", "loop", "one")])).unwrap_err();
        assert!(
            err.to_string()
                .contains("container loop: label org.emberrtos.rt-cpu=Some(\"one\")"),
            "{err}"
        );
        assert!(parse_listing(r#"[{"Id": "ab", "State": "running", "Labels": null}]"#).is_err());
        for bad in ["", "ab running loop 1", "[{\"State\": \"running\"}]"] {
            assert!(parse_listing(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn only_an_rt_deployment_on_its_rt_kernel_has_rt_cpus() {
        assert_eq!(
            rt_cpus(&running(RT, Some("rt\n"), "1-2\n")).unwrap().to_string(),
            "1-2"
        );
        let generic = "#1 SMP PREEMPT_DYNAMIC Debian 6.1.192-3 (2026-11-26)";
        let err = rt_cpus(&running(generic, Some("rt"), "1")).unwrap_err();
        assert!(matches!(err, Refusal::NotRtKernel { .. }), "{err}");
        assert!(err.to_string().contains("PREEMPT_DYNAMIC"), "{err}");
        // The timestamp is not searched: PREEMPT_RT there proves nothing.
        let sneaky = "#1 SMP Sun Nov 30 PREEMPT_RT 2025";
        assert!(matches!(
            rt_cpus(&running(sneaky, Some("rt"), "1")),
            Err(Refusal::NotRtKernel { .. })
        ));
        let err = rt_cpus(&running(RT, Some("standard\n"), "1")).unwrap_err();
        assert_eq!(
            err.to_string(),
            "this deployment's flavor is \"standard\" (/etc/emberrtos/kernel-flavor), not rt: RT containers run only on an RT deployment"
        );
        assert!(err.to_string().contains("standard"));
        assert!(matches!(
            rt_cpus(&running(RT, None, "1")),
            Err(Refusal::NotRtFlavor { .. })
        ));
    }

    #[test]
    fn the_cpu_must_be_isolated_and_a_free_one_is_chosen() {
        let isolated = CpuSet::parse("1-3").unwrap();
        assert_eq!(choose_cpu(&isolated, Some(2), &[]), Ok(2));
        let err = choose_cpu(&isolated, Some(0), &[]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "CPU 0 is not isolated (isolated: 1-3): an RT container runs only on a CPU the kernel isolates (isolcpus=)"
        );
        let err = choose_cpu(&CpuSet::default(), None, &[]).unwrap_err();
        assert!(err.to_string().contains("isolated: none"), "{err}");
        let running_on = |busy: &[u32]| -> Vec<Container> {
            (1..=3)
                .map(|cpu| Container {
                    id: "ab".into(),
                    state: if busy.contains(&cpu) { "running" } else { "exited" }.into(),
                    name: format!("c{cpu}"),
                    cpu,
                })
                .collect()
        };
        assert_eq!(choose_cpu(&isolated, None, &running_on(&[1])), Ok(2));
        assert!(matches!(
            choose_cpu(&isolated, None, &running_on(&[1, 2, 3])),
            Err(Refusal::NoFreeCpu { .. })
        ));
    }
}
