//! `emberrtos-rt-run`: a container on one isolated CPU, the way
//! `rtreport::container` defines it (pinned, SYS_NICE and IPC_LOCK only,
//! rtprio 99, memlock unlimited, no network), one per CPU.
//!
//! It refuses on a deployment that is not RT or not running its RT kernel,
//! on a CPU the kernel does not isolate, and on a CPU another container (or
//! another emberrtos-rt-run, or jitter) holds. The CPU's lock is held from
//! the check to `podman start`; attached, podman inherits it for as long as
//! it runs.
//!
//! A `--volume` mounts only a file or dir inside a site data dir (see
//! [`CONFIG_FILE`]), read-only unless `rw` is asked for: a rootful container
//! given `/`, `/etc` or a socket could rewrite the host, and no profile
//! would hold.

use std::ffi::OsString;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Component, Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, anyhow, bail};
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
    /// `SRC:DEST[:ro|rw]` bind mounts, SRC in a data dir ([`bind_mount`]).
    pub volumes: Vec<String>,
    /// From the local store only: nothing is pulled.
    pub image: String,
    pub command: Vec<OsString>,
}

pub fn run(options: &RtRunOptions) -> Result<u8> {
    validate(options)?;
    let volumes = volume_args(&options.volumes, Path::new(CONFIG_FILE))?;
    let isolated = container::rt_cpus(&read_running(Path::new("/"))?.as_running())?;
    let cpu = container::choose_cpu(&isolated, options.cpu, &list_rt_containers()?)?;
    let lock = container::lock_cpu(cpu)
        .with_context(|| format!("taking {}", container::lock_path(cpu).display()))?
        .ok_or(Refusal::Locked { cpu })?;
    // Listed again under the lock: a container started since is seen.
    container::check_free(cpu, &list_rt_containers()?)?;
    let id = podman_output(&create_args(cpu, options, &volumes)).context("creating the container")?;
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
    if options.image.is_empty() || options.image.starts_with('-') {
        bail!(bad("IMAGE", format!("{:?} is not an image name", options.image)));
    }
    Ok(())
}

/// The site's data dirs: one `data-dir=/DIR` line each; `#` starts a
/// comment. Root's file; without one (or without a `data-dir=` line),
/// [`DEFAULT_DATA_DIR`].
pub const CONFIG_FILE: &str = "/etc/emberrtos/rt-run.conf";
pub const DEFAULT_DATA_DIR: &str = "/var/lib/emberrtos/rt-data";

/// What a data dir may neither be, hold nor lie in: the system's own trees
/// and the agent's records.
const SYSTEM_PATHS: [&str; 15] = [
    "/boot",
    "/dev",
    "/etc",
    "/ostree",
    "/proc",
    "/root",
    "/run",
    "/sys",
    "/sysroot",
    "/usr",
    "/var/lib/containers",
    "/var/lib/emberrtos/health",
    "/var/lib/emberrtos/health.json",
    "/var/lib/emberrtos/provision.json",
    "/var/roothome",
];

/// Where in the container nothing is mounted over.
const KERNEL_TREES: [&str; 3] = ["/proc", "/sys", "/dev"];

/// The data dirs `config` names (pure; see [`CONFIG_FILE`]).
pub fn parse_config(config: &str) -> Result<Vec<PathBuf>, String> {
    let mut dirs = Vec::new();
    for (index, line) in config.lines().enumerate() {
        let line = line.split('#').next().unwrap_or_default().trim();
        if line.is_empty() {
            continue;
        }
        match line.split_once('=').map(|(key, dir)| (key.trim(), dir.trim())) {
            Some(("data-dir", dir)) if dir.starts_with('/') => dirs.push(PathBuf::from(dir)),
            _ => return Err(format!("line {}: {line:?} is not data-dir=/DIR", index + 1)),
        }
    }
    if dirs.is_empty() {
        dirs.push(DEFAULT_DATA_DIR.into());
    }
    Ok(dirs)
}

/// Refuses a data dir (canonical; pure) that is, holds or lies in a
/// [`SYSTEM_PATHS`] entry (`/` holds them all).
pub fn check_data_dir(dir: &Path) -> Result<(), String> {
    match SYSTEM_PATHS
        .iter()
        .find(|system| dir.starts_with(system) || Path::new(system).starts_with(dir))
    {
        Some(system) => Err(format!(
            "the data dir {} is, holds or lies in {system}",
            dir.display()
        )),
        None => Ok(()),
    }
}

/// The data dirs of the site's `config` file that exist, canonical and
/// checked; a config that is wrong is an error naming it.
fn site_data_dirs(config: &Path) -> Result<Vec<PathBuf>> {
    let text = match std::fs::read_to_string(config) {
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => String::new(),
        read => read.with_context(|| format!("reading {}", config.display()))?,
    };
    let in_config = |message: String| anyhow!("{}: {message}", config.display());
    let mut dirs = Vec::new();
    for dir in parse_config(&text).map_err(in_config)? {
        if let Ok(dir) = dir.canonicalize() {
            check_data_dir(&dir).map_err(in_config)?;
            dirs.push(dir);
        }
    }
    Ok(dirs)
}

/// The `--volume` values for podman, each checked by [`bind_mount`] against
/// the data dirs of `config` (read only when there is a volume).
fn volume_args(volumes: &[String], config: &Path) -> Result<Vec<String>> {
    if volumes.is_empty() {
        return Ok(Vec::new());
    }
    let data_dirs = site_data_dirs(config)?;
    volumes
        .iter()
        .map(|volume| {
            bind_mount(volume, &data_dirs).map_err(|why| {
                emberrtos_contract::error::BadInput::new("--volume", format!("{volume:?}: {why}")).into()
            })
        })
        .collect()
}

/// The podman `--volume` value for `volume` (`SRC:DEST[:ro|rw]`), or why it
/// is refused: SRC resolves (links followed) to a file or dir inside one of
/// `data_dirs` (canonical), DEST is a container path off `/` and the kernel
/// trees, and the mount is read-only unless `rw` is asked for.
pub fn bind_mount(volume: &str, data_dirs: &[PathBuf]) -> Result<String, String> {
    let parts: Vec<&str> = volume.split(':').collect();
    let (source, dest, access) = match parts[..] {
        [source, dest] => (source, dest, "ro"),
        [source, dest, access @ ("ro" | "rw")] => (source, dest, access),
        [_, _, other] => return Err(format!("OPTIONS {other:?}: only `ro` (the default) or `rw`")),
        _ => return Err("not SRC:DEST[:ro|rw]".into()),
    };
    let source = data_source(source, data_dirs)?;
    let dest = container_dest(dest)?;
    Ok(format!(
        "{}:{}:{access},nosuid,nodev",
        source.display(),
        dest.display()
    ))
}

/// SRC, canonical: an existing file or dir inside a data dir.
fn data_source(source: &str, data_dirs: &[PathBuf]) -> Result<PathBuf, String> {
    if !source.starts_with('/') {
        return Err(format!(
            "SRC {source:?} is not an absolute path (named volumes are not mounted)"
        ));
    }
    let resolved = Path::new(source)
        .canonicalize()
        .map_err(|e| format!("SRC {source}: {e}"))?;
    if !data_dirs.iter().any(|dir| resolved.starts_with(dir)) {
        return Err(format!(
            "SRC {source} resolves to {}, which is in no data dir ({}; data-dir= in {CONFIG_FILE})",
            resolved.display(),
            list_dirs(data_dirs)
        ));
    }
    let kind = std::fs::symlink_metadata(&resolved)
        .map_err(|e| format!("SRC {source}: {e}"))?
        .file_type();
    if !(kind.is_dir() || kind.is_file()) {
        return Err(format!(
            "SRC {source} is a socket, device or FIFO: only files and dirs are mounted"
        ));
    }
    if resolved.to_str().is_none_or(|path| path.contains(':')) {
        return Err(format!("SRC {source} resolves to a path podman cannot take"));
    }
    Ok(resolved)
}

fn list_dirs(dirs: &[PathBuf]) -> String {
    if dirs.is_empty() {
        return format!("none exists; the default is {DEFAULT_DATA_DIR}");
    }
    let dirs: Vec<String> = dirs.iter().map(|dir| dir.display().to_string()).collect();
    dirs.join(", ")
}

/// DEST, normalised: absolute, no `..`, not `/`, nothing under
/// [`KERNEL_TREES`].
fn container_dest(dest: &str) -> Result<PathBuf, String> {
    let path = Path::new(dest);
    if !path.is_absolute() || path.components().any(|c| c == Component::ParentDir) {
        return Err(format!("DEST {dest:?} is not an absolute path without `..`"));
    }
    let path: PathBuf = path.components().collect();
    if path == Path::new("/") || KERNEL_TREES.iter().any(|tree| path.starts_with(tree)) {
        return Err(format!("DEST {dest} is `/` or in /proc, /sys or /dev"));
    }
    Ok(path)
}

/// `podman create` with the RT profile for `cpu`, the caller's options and
/// the checked `volumes`.
fn create_args(cpu: u32, options: &RtRunOptions, volumes: &[String]) -> Vec<OsString> {
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
    for volume in volumes {
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
        let volumes = ["/var/lib/emberrtos/rt-data/in:/in:ro,nosuid,nodev".to_string()];
        let args: Vec<String> = create_args(1, &with_name, &volumes)
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
            text.ends_with(
                "--name loop-1 --rm --env PERIOD=1ms --volume /var/lib/emberrtos/rt-data/in:/in:ro,nosuid,nodev localhost/loop loop --period 1ms"
            ),
            "{text}"
        );
    }

    #[test]
    fn bad_options_are_named() {
        type Change = fn(&mut RtRunOptions);
        let cases: [(Change, &str); 4] = [
            (|o| o.name = Some("-x".into()), "--name"),
            (|o| o.name = Some("a b".into()), "--name"),
            (|o| o.env = vec!["=v".into()], "--env"),
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

    /// A data dir (a temp dir, canonical) and `bind_mount` of `volume` in it,
    /// where `@` stands for the data dir.
    fn mount_in(data: &Path, volume: &str) -> Result<String, String> {
        bind_mount(
            &volume.replace('@', data.to_str().unwrap()),
            &[data.to_path_buf()],
        )
    }

    fn data_dir() -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().canonicalize().unwrap();
        std::fs::create_dir(data.join("logs")).unwrap();
        (dir, data)
    }

    #[test]
    fn a_data_dir_entry_is_mounted_read_only_unless_rw_is_asked_for() {
        let (_dir, data) = data_dir();
        let logs = data.join("logs").display().to_string();
        let nodev = "nosuid,nodev";
        assert_eq!(
            mount_in(&data, "@/logs:/logs"),
            Ok(format!("{logs}:/logs:ro,{nodev}"))
        );
        assert_eq!(
            mount_in(&data, "@/logs:/logs:ro"),
            Ok(format!("{logs}:/logs:ro,{nodev}"))
        );
        assert_eq!(
            mount_in(&data, "@/logs:/var/./log/:rw"),
            Ok(format!("{logs}:/var/log:rw,{nodev}"))
        );
        std::fs::write(data.join("logs/x.conf"), "x").unwrap();
        assert!(mount_in(&data, "@/logs/x.conf:/x.conf").is_ok());
        for options in ["z", "Z", "ro,rw", "rw,exec", "suid", "ro:x"] {
            let refused = mount_in(&data, &format!("@/logs:/logs:{options}")).unwrap_err();
            assert!(
                refused.contains("only `ro` (the default) or `rw`") || refused.contains("not SRC:DEST"),
                "{refused}"
            );
        }
        assert!(
            mount_in(&data, "@/logs")
                .unwrap_err()
                .contains("not SRC:DEST[:ro|rw]")
        );
    }

    #[test]
    fn sources_outside_the_data_dirs_are_refused_however_they_get_there() {
        let (_dir, data) = data_dir();
        std::os::unix::fs::symlink("/etc", data.join("etc-link")).unwrap();
        for source in [
            "/",
            "/etc",
            "/run/podman/podman.sock",
            "/run/emberrtos",
            "/sys/fs/cgroup",
            "/dev",
            "@/etc-link",
            "@/logs/../../../../etc",
            "@/..",
        ] {
            let refused = mount_in(&data, &format!("{source}:/x")).unwrap_err();
            assert!(
                refused.contains("no data dir") || refused.contains("No such file"),
                "{source}: {refused}"
            );
        }
        let named = mount_in(&data, "logs:/x").unwrap_err();
        assert!(named.contains("not an absolute path (named volumes"), "{named}");
        assert!(
            mount_in(&data, "@/missing:/x")
                .unwrap_err()
                .contains("No such file")
        );
        assert!(
            bind_mount("/etc:/x", &[])
                .unwrap_err()
                .contains("none exists; the default is /var/lib/emberrtos/rt-data")
        );
    }

    #[test]
    fn sockets_and_fifos_are_never_mounted_even_in_a_data_dir() {
        let (_dir, data) = data_dir();
        let _listener = std::os::unix::net::UnixListener::bind(data.join("api.sock")).unwrap();
        let fifo = std::ffi::CString::new(data.join("pipe").to_str().unwrap()).unwrap();
        // SAFETY: a NUL-terminated path this test owns.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        std::os::unix::fs::symlink(data.join("api.sock"), data.join("logs/sock-link")).unwrap();
        for source in ["@/api.sock", "@/pipe", "@/logs/sock-link"] {
            let refused = mount_in(&data, &format!("{source}:/x")).unwrap_err();
            assert!(
                refused.contains("is a socket, device or FIFO"),
                "{source}: {refused}"
            );
        }
    }

    #[test]
    fn destinations_are_absolute_and_off_root_and_the_kernel_trees() {
        let (_dir, data) = data_dir();
        for dest in [
            "/proc/x",
            "/proc",
            "/sys/fs/cgroup",
            "/dev/shm",
            "/",
            "//",
            "/./",
            "relative",
            "/x/../proc",
            "",
        ] {
            let refused = mount_in(&data, &format!("@/logs:{dest}")).unwrap_err();
            assert!(refused.starts_with("DEST "), "{dest}: {refused}");
        }
        assert!(mount_in(&data, "@/logs:/procs").is_ok(), "only /proc and below");
    }

    #[test]
    fn the_site_config_names_the_data_dirs_and_never_a_system_path() {
        assert_eq!(parse_config(""), Ok(vec![PathBuf::from(DEFAULT_DATA_DIR)]));
        assert_eq!(
            parse_config("# data\ndata-dir=/srv/rt\n data-dir = /data/rt # logs\n\n"),
            Ok(vec![PathBuf::from("/srv/rt"), PathBuf::from("/data/rt")])
        );
        for bad in ["data-dir=relative", "datadir=/x", "/x", "data-dir="] {
            assert!(parse_config(bad).unwrap_err().starts_with("line 1: "), "{bad}");
        }
        for system in [
            "/",
            "/etc",
            "/etc/emberrtos",
            "/var",
            "/var/lib",
            "/var/lib/emberrtos",
            "/run/emberrtos",
            "/sys/fs/cgroup",
            "/dev",
            "/usr/share",
        ] {
            assert!(check_data_dir(Path::new(system)).is_err(), "{system}");
        }
        for data in [DEFAULT_DATA_DIR, "/srv/rt", "/var/lib/rt-data", "/home/loop"] {
            assert_eq!(check_data_dir(Path::new(data)), Ok(()), "{data}");
        }
    }

    #[test]
    fn a_volume_is_checked_against_the_sites_config_and_refused_as_bad_input() {
        let (_dir, data) = data_dir();
        let config = data.join("rt-run.conf");
        std::fs::write(&config, format!("data-dir={}\n", data.display())).unwrap();
        let logs = format!("{}/logs:/logs", data.display());
        assert_eq!(
            volume_args(std::slice::from_ref(&logs), &config).unwrap().len(),
            1
        );
        let err = volume_args(&[logs, "/etc:/x".into()], &config).unwrap_err();
        assert!(
            err.to_string().starts_with("--volume: \"/etc:/x\": SRC /etc"),
            "{err}"
        );
        assert_eq!(emberrtos_contract::error::exit_code(&err), exit::USAGE);
        std::fs::write(&config, "data-dir=/\n").unwrap();
        let err = volume_args(&["/etc:/x".into()], &config).unwrap_err();
        assert!(
            err.to_string()
                .contains("rt-run.conf: the data dir / is, holds or lies in"),
            "{err}"
        );
        assert!(volume_args(&[], Path::new("/nonexistent")).unwrap().is_empty());
    }
}
