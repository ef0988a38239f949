//! `emberrtos-rt-run`: a container on one isolated CPU, the way
//! `rtreport::container` defines it (pinned, SYS_NICE and IPC_LOCK only,
//! rtprio 99, memlock unlimited, no network), one per CPU.
//!
//! It refuses on a deployment that is not RT or not running its RT kernel,
//! on a CPU the kernel does not isolate, and on a CPU another container (or
//! another emberrtos-rt-run, or jitter) holds. The CPU's lock is held from
//! the check to `podman start`; attached, podman inherits it for as long as
//! it runs.

use std::ffi::OsString;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};
use rtreport::container::{self, Container, ListFailure, Refusal, Running};

use emberrtos_contract::error::exit;

/// How to run the container.
#[derive(Clone, Debug, Default)]
pub struct RtRunOptions {
    /// The isolated CPU; `None` for the first one no RT container holds.
    pub cpu: Option<u32>,
    pub name: Option<String>,
    /// Remove the container when it exits.
    pub remove: bool,
    /// Start it and print its ID instead of attaching.
    pub detach: bool,
    /// `KEY=VALUE` for the container's environment.
    pub env: Vec<String>,
    /// `SRC:DEST[:OPTIONS]` bind mounts.
    pub volumes: Vec<String>,
    /// From the local store only: nothing is pulled.
    pub image: String,
    pub command: Vec<OsString>,
}

pub fn run(options: &RtRunOptions) -> Result<u8> {
    validate(options)?;
    let isolated = container::rt_cpus(&read_running(Path::new("/"))?.as_running())?;
    let cpu = container::choose_cpu(&isolated, options.cpu, &list_rt_containers()?)?;
    let lock = container::lock_cpu(cpu)
        .with_context(|| format!("taking {}", container::lock_path(cpu).display()))?
        .ok_or(Refusal::Locked { cpu })?;
    // Listed again under the lock: a container started since is seen.
    container::check_free(cpu, &list_rt_containers()?)?;
    let id = podman_output(&create_args(cpu, options)).context("creating the container")?;
    eprintln!("emberrtos-rt-run: container {} on CPU {cpu}", short(&id));
    if options.detach {
        podman_output(&["start".into(), id.clone().into()]).context("starting the container")?;
        println!("{id}");
        return Ok(exit::OK);
    }
    Err(exec_attached(&id, lock))
}

/// The system facts [`container::rt_cpus`] judges, read from `root`.
struct RunningText {
    uname_v: String,
    flavor: Option<String>,
    isolated: String,
}

impl RunningText {
    fn as_running(&self) -> Running<'_> {
        Running {
            uname_v: &self.uname_v,
            flavor: self.flavor.as_deref(),
            isolated: &self.isolated,
        }
    }
}

fn read_running(root: &Path) -> Result<RunningText> {
    let read = |path: &str| std::fs::read_to_string(root.join(path.trim_start_matches('/')));
    Ok(RunningText {
        uname_v: read("/proc/sys/kernel/version").context("reading the running kernel's version")?,
        flavor: read(container::FLAVOR_FILE).ok(),
        isolated: read(container::ISOLATED_FILE).unwrap_or_default(),
    })
}

/// Refuses what podman would read as an option or a second argument.
fn validate(options: &RtRunOptions) -> Result<()> {
    let bad = |option: &str, message: String| emberrtos_contract::error::BadInput::new(option, message);
    if let Some(name) = &options.name {
        let valid = name.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c));
        if !valid {
            bail!(bad(
                "--name",
                format!("{name:?} is not a container name ([a-zA-Z0-9][a-zA-Z0-9_.-]*)")
            ));
        }
    }
    for env in &options.env {
        if env.split_once('=').is_none_or(|(key, _)| key.is_empty()) {
            bail!(bad("--env", format!("{env:?} is not KEY=VALUE")));
        }
    }
    for volume in &options.volumes {
        if volume.starts_with('-') || !volume.contains(':') {
            bail!(bad("--volume", format!("{volume:?} is not SRC:DEST[:OPTIONS]")));
        }
    }
    if options.image.is_empty() || options.image.starts_with('-') {
        bail!(bad("IMAGE", format!("{:?} is not an image name", options.image)));
    }
    Ok(())
}

/// `podman create` with the RT profile for `cpu` and the caller's options.
fn create_args(cpu: u32, options: &RtRunOptions) -> Vec<OsString> {
    let mut args: Vec<OsString> = vec!["create".into(), "--pull".into(), "never".into()];
    args.extend(container::profile_args(cpu).into_iter().map(OsString::from));
    if let Some(name) = &options.name {
        args.extend(["--name".into(), name.into()]);
    }
    if options.remove {
        args.push("--rm".into());
    }
    for env in &options.env {
        args.extend(["--env".into(), env.into()]);
    }
    for volume in &options.volumes {
        args.extend(["--volume".into(), volume.into()]);
    }
    args.push(options.image.clone().into());
    args.extend(options.command.iter().cloned());
    args
}

/// Every container labelled for an RT CPU.
fn list_rt_containers() -> Result<Vec<Container>> {
    container::list_rt_containers().map_err(|failure| match failure {
        ListFailure::Spawn(error) => podman_missing(error),
        failure => anyhow::Error::new(failure).context("listing the RT containers"),
    })
}

fn podman() -> Command {
    Command::new("podman")
}

/// Runs podman; its trimmed stdout, or an error with its stderr.
fn podman_output(args: &[OsString]) -> Result<String> {
    let output = podman()
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(podman_missing)?;
    if !output.status.success() {
        bail!(
            "podman {} failed ({}): {}",
            args.first().map(|a| a.to_string_lossy()).unwrap_or_default(),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_string())
}

fn podman_missing(error: std::io::Error) -> anyhow::Error {
    if error.kind() == std::io::ErrorKind::NotFound {
        anyhow::anyhow!("podman is not installed in this image: add `podman` to the recipe's rootfs packages")
    } else {
        anyhow::Error::new(error).context("running podman")
    }
}

/// Becomes `podman start --attach ID`, which keeps the CPU's lock (and
/// proxies signals to the container). Returns only on failure.
fn exec_attached(id: &str, lock: File) -> anyhow::Error {
    let fd = lock.as_raw_fd();
    // SAFETY: clears FD_CLOEXEC on a descriptor this process owns, so
    // podman inherits the lock; no memory is touched.
    if unsafe { libc::fcntl(fd, libc::F_SETFD, 0) } != 0 {
        return anyhow::Error::new(std::io::Error::last_os_error()).context("passing the CPU lock to podman");
    }
    let error = podman().args(["start", "--attach", id]).exec();
    podman_missing(error)
}

fn short(id: &str) -> &str {
    &id[..id.len().min(12)]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options() -> RtRunOptions {
        RtRunOptions {
            image: "localhost/loop".into(),
            command: vec!["loop".into(), "--period".into(), "1ms".into()],
            ..RtRunOptions::default()
        }
    }

    #[test]
    fn create_has_the_profile_then_the_image_and_its_command() {
        let mut with_name = options();
        with_name.name = Some("loop-1".into());
        with_name.remove = true;
        with_name.env = vec!["PERIOD=1ms".into()];
        let args: Vec<String> = create_args(1, &with_name)
            .into_iter()
            .map(|a| a.into_string().unwrap())
            .collect();
        let text = args.join(" ");
        assert!(
            text.starts_with(
                "create --pull never --cpuset-cpus 1 --cap-drop ALL --cap-add SYS_NICE,IPC_LOCK"
            ),
            "{text}"
        );
        assert!(
            text.ends_with("--name loop-1 --rm --env PERIOD=1ms localhost/loop loop --period 1ms"),
            "{text}"
        );
    }

    #[test]
    fn bad_options_are_named() {
        type Change = fn(&mut RtRunOptions);
        let cases: [(Change, &str); 5] = [
            (|o| o.name = Some("-x".into()), "--name"),
            (|o| o.name = Some("a b".into()), "--name"),
            (|o| o.env = vec!["=v".into()], "--env"),
            (|o| o.volumes = vec!["/data".into()], "--volume"),
            (|o| o.image = "--privileged".into(), "IMAGE"),
        ];
        for (change, option) in cases {
            let mut bad = options();
            change(&mut bad);
            let err = validate(&bad).unwrap_err();
            assert!(err.to_string().starts_with(&format!("{option}: ")), "{err}");
            assert_eq!(emberrtos_contract::error::exit_code(&err), exit::USAGE);
        }
        assert!(validate(&options()).is_ok());
    }

    #[test]
    fn the_running_system_is_read_below_a_root() {
        let root = tempfile::tempdir().unwrap();
        let write = |path: &str, text: &str| {
            let path = root.path().join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        };
        write(
            "proc/sys/kernel/version",
            "#1 SMP PREEMPT_RT Sun Nov 30 00:00:00 UTC 2025\n",
        );
        write("etc/emberrtos/kernel-flavor", "rt\n");
        write("sys/devices/system/cpu/isolated", "1\n");
        let running = read_running(root.path()).unwrap();
        assert_eq!(
            container::rt_cpus(&running.as_running()).unwrap().to_string(),
            "1"
        );
        write("etc/emberrtos/kernel-flavor", "standard\n");
        let refusal = container::rt_cpus(&read_running(root.path()).unwrap().as_running()).unwrap_err();
        let err = anyhow::Error::new(refusal);
        assert_eq!(emberrtos_contract::error::exit_code(&err), exit::REFUSED);
    }
}
