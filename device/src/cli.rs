//! The command line of `emberrtos-device`, and of its links
//! `emberrtos-update` and `emberrtos-rt-run` (the same binary under those
//! names: `emberrtos-update X` is `emberrtos-device update X`).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Result;
use clap::{Args, Parser, Subcommand};

use super::health::{self, checks::Builtin};
use super::provision::{self, ProvisionOptions};
use super::rt_run::{self, RtRunOptions};
use super::system::{Access, System};
use super::{rollback, status, upgrade};
use emberrtos_contract::paths::{RT_RUN_NAME, UPDATE_NAME};

#[derive(Parser, Debug)]
#[command(
    name = "emberrtos-device",
    version,
    about = "EmberRTOS on the device: first-boot provisioning, updates and rollback"
)]
pub struct DeviceCli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Provision this node from its configuration medium, once (run by
    /// emberrtos-provision.service before SSH starts).
    Provision(ProvisionArgs),
    /// Deployments: status, upgrade from the update remote, rollback (also
    /// installed as `emberrtos-update`).
    Update(UpdateArgs),
    /// Judge this boot (run by emberrtos-health.service): the health checks,
    /// on an rt trial boot the latency check; bless, reboot for the next
    /// try, or finish a rollback GRUB started.
    Health(HealthArgs),
    /// Run a container on one isolated CPU of an RT deployment: pinned to
    /// it, every capability dropped but SYS_NICE and IPC_LOCK, rtprio 99,
    /// memlock unlimited, no new privileges, no network; one container per
    /// CPU (also installed as `emberrtos-rt-run`).
    RtRun(RtRunArgs),
}

#[derive(Args, Debug)]
struct RtRunArgs {
    /// The isolated CPU (default: the first one no RT container holds).
    #[arg(long)]
    cpu: Option<u32>,
    /// The container's name.
    #[arg(long)]
    name: Option<String>,
    /// Remove the container when it exits.
    #[arg(long)]
    rm: bool,
    /// Start it in the background and print its ID.
    #[arg(long, short = 'd')]
    detach: bool,
    /// KEY=VALUE in the container's environment (repeatable).
    #[arg(long = "env", short = 'e', value_name = "KEY=VALUE")]
    env: Vec<String>,
    /// A bind mount, SRC:DEST[:ro|rw] (repeatable): SRC is a file or dir
    /// in a data dir (`data-dir=` lines of /etc/emberrtos/rt-run.conf,
    /// default /var/lib/emberrtos/rt-data), read-only unless `rw` is given;
    /// keep its I/O off the RT path.
    #[arg(long = "volume", short = 'v', value_name = "SRC:DEST[:ro|rw]")]
    volumes: Vec<String>,
    /// The image, from the local store (`podman import` or `podman load`
    /// it): nothing is pulled.
    image: String,
    /// The command to run and its arguments.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    command: Vec<OsString>,
}

#[derive(Args, Debug)]
struct HealthArgs {
    #[command(flatten)]
    sysroot: SysrootArg,
    /// Do not reboot after a failed trial boot.
    #[arg(long)]
    no_reboot: bool,
    #[command(subcommand)]
    check: Option<HealthCheck>,
}

#[derive(Subcommand, Debug)]
enum HealthCheck {
    /// Run one built-in check on the booted system (the image's required
    /// checks in /usr/lib/emberrtos/health.d/required call these).
    Check {
        #[arg(value_enum)]
        name: Builtin,
    },
}

#[derive(Args, Debug)]
struct SysrootArg {
    /// The ostree sysroot: `/` on the device, or a scratch sysroot whose
    /// default deployment stands for the booted one.
    #[arg(long, default_value = "/", global = true)]
    sysroot: PathBuf,
}

#[derive(Args, Debug)]
struct ProvisionArgs {
    #[command(flatten)]
    sysroot: SysrootArg,
    /// The filesystem label of the configuration medium.
    #[arg(long, default_value = emberrtos_contract::provision::LABEL)]
    medium_label: String,
    /// Read the medium's files from this directory instead of mounting a
    /// labelled filesystem.
    #[arg(long)]
    medium_dir: Option<PathBuf>,
    /// Seconds to wait for the medium to appear.
    #[arg(long, default_value_t = 5)]
    wait: u64,
    /// Do not reboot after deploying the RT kernel.
    #[arg(long)]
    no_reboot: bool,
}

#[derive(Args, Debug)]
struct UpdateArgs {
    #[command(flatten)]
    sysroot: SysrootArg,
    #[command(subcommand)]
    action: UpdateAction,
}

#[derive(Subcommand, Debug)]
enum UpdateAction {
    /// Show the deployments: booted, pending, rollback, origin, version, flavor.
    Status {
        /// One JSON document on stdout.
        #[arg(long)]
        json: bool,
    },
    /// Pull the tracked ref from its remote (GPG verified, static deltas),
    /// verify it, deploy it as the default and reboot.
    Upgrade {
        #[arg(long)]
        no_reboot: bool,
    },
    /// Make the previous deployment the default and reboot.
    Rollback {
        #[arg(long)]
        no_reboot: bool,
    },
}

/// The subcommand each link name stands for.
const LINKS: [(&str, &str); 2] = [(UPDATE_NAME, "update"), (RT_RUN_NAME, "rt-run")];

/// The arguments clap sees: under a link's name (`emberrtos-update`,
/// `emberrtos-rt-run`), its subcommand is inserted after the program name.
pub fn effective_args(args: Vec<OsString>) -> Vec<OsString> {
    let invoked_as = args.first().and_then(|arg0| Path::new(arg0).file_name());
    let Some((name, subcommand)) = LINKS
        .iter()
        .find(|(name, _)| invoked_as.is_some_and(|invoked| invoked == *name))
    else {
        return args;
    };
    let mut out = vec![OsString::from(name), OsString::from(subcommand)];
    out.extend(args.into_iter().skip(1));
    out
}

pub fn main() -> ExitCode {
    emberrtos_contract::error::finish(
        DeviceCli::try_parse_from(effective_args(std::env::args_os().collect())),
        run,
    )
}

fn run(cli: DeviceCli) -> Result<u8> {
    match cli.command {
        Command::Provision(args) => provision::run(&ProvisionOptions {
            sysroot: args.sysroot.sysroot,
            medium_label: args.medium_label,
            medium_dir: args.medium_dir,
            wait: Duration::from_secs(args.wait),
            no_reboot: args.no_reboot,
        }),
        Command::Health(args) => match args.check {
            None => health::run(&args.sysroot.sysroot, args.no_reboot),
            Some(HealthCheck::Check { name }) => run_builtin(&args.sysroot.sysroot, name),
        },
        Command::RtRun(args) => rt_run::run(&RtRunOptions {
            cpu: args.cpu,
            name: args.name,
            remove: args.rm,
            detach: args.detach,
            env: args.env,
            volumes: args.volumes,
            image: args.image,
            command: args.command,
        }),
        Command::Update(args) => {
            let sysroot = &args.sysroot.sysroot;
            match args.action {
                UpdateAction::Status { json } => status::run(sysroot, json),
                UpdateAction::Upgrade { no_reboot } => upgrade::run(sysroot, no_reboot),
                UpdateAction::Rollback { no_reboot } => rollback::run(sysroot, no_reboot),
            }
        }
    }
}

/// One built-in check: its finding on stdout, exit 0; or the error, exit 1.
fn run_builtin(sysroot: &Path, check: Builtin) -> Result<u8> {
    let system = System::open(sysroot, Access::Read)?;
    println!("{}", health::checks::builtin(&system, check)?);
    Ok(emberrtos_contract::error::exit::OK)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(words: &[&str]) -> Vec<OsString> {
        words.iter().map(OsString::from).collect()
    }

    #[test]
    fn the_update_name_dispatches_to_update() {
        assert_eq!(
            effective_args(args(&["/usr/bin/emberrtos-update", "rollback", "--no-reboot"])),
            args(&["emberrtos-update", "update", "rollback", "--no-reboot"])
        );
        let direct = args(&["emberrtos-device", "provision"]);
        assert_eq!(effective_args(direct.clone()), direct);
        let parsed =
            DeviceCli::try_parse_from(effective_args(args(&["emberrtos-update", "status", "--json"])));
        assert!(matches!(
            parsed.unwrap().command,
            Command::Update(UpdateArgs {
                action: UpdateAction::Status { json: true },
                ..
            })
        ));
        assert!(DeviceCli::try_parse_from(args(&["emberrtos-device", "update", "frobnicate"])).is_err());
        let rt_run = effective_args(args(&[
            "/usr/bin/emberrtos-rt-run",
            "--cpu",
            "1",
            "img",
            "loop",
            "-x",
        ]));
        assert_eq!(
            rt_run,
            args(&["emberrtos-rt-run", "rt-run", "--cpu", "1", "img", "loop", "-x"])
        );
        match DeviceCli::try_parse_from(rt_run).unwrap().command {
            Command::RtRun(parsed) => {
                assert_eq!((parsed.cpu, parsed.image.as_str()), (Some(1), "img"));
                assert_eq!(parsed.command, args(&["loop", "-x"]));
            }
            other => panic!("{other:?}"),
        }
    }
}
