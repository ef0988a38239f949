//! The command line of `emberrtos-device`, and of `emberrtos-update` (the
//! same binary under that name: `emberrtos-update X` is
//! `emberrtos-device update X`).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Result;
use clap::{Args, Parser, Subcommand};

use super::health::{self, checks::Builtin};
use super::provision::{self, ProvisionOptions};
use super::system::{Access, System};
use super::{UPDATE_NAME, rollback, status, upgrade};

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
    #[arg(long, default_value = crate::provision::LABEL)]
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

/// The arguments clap sees: under the name `emberrtos-update`, `update` is
/// inserted after the program name.
pub fn effective_args(args: Vec<OsString>) -> Vec<OsString> {
    let invoked_as_update = args
        .first()
        .and_then(|arg0| Path::new(arg0).file_name())
        .is_some_and(|name| name == UPDATE_NAME);
    if !invoked_as_update {
        return args;
    }
    let mut out = vec![OsString::from(UPDATE_NAME), OsString::from("update")];
    out.extend(args.into_iter().skip(1));
    out
}

pub fn main() -> ExitCode {
    crate::error::finish(
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
    Ok(crate::error::exit::OK)
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
    }
}
