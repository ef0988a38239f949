//! `emberrtos-device provision`: first-boot provisioning from the
//! configuration medium (issue 11, deliverable 3).
//!
//! Once per device (the record in `/var/lib/emberrtos/provision.json` is
//! written once and stops every later run): read `emberrtos/provision.yaml`
//! from the medium with the builder's strict parser, set the hostname and
//! root's SSH keys, configure the update remote, and for `flavor: rt`:
//!
//! 1. resolve the RT ref (the booted origin's ref with its last component
//!    `rt`) in the device's repo, else pull it from the update remote, GPG
//!    verified;
//! 2. verify it here, with the same gate `publish` uses: the commit's
//!    evidence and its own vmlinuz header, build string and config must show
//!    PREEMPT_RT; and with the firmware's Secure Boot on, its vmlinuz must be
//!    signed by a certificate in the firmware's `db`;
//! 3. deploy it as the default in one ostree transaction, the current
//!    deployment kept for rollback, then reboot.
//!
//! Fail safe: when 1 or 2 fails nothing is deployed, the status is
//! `refused` with a reason naming the check, the console and the login
//! banners say `RT provisioning REFUSED: <reason>`, and the command exits 3
//! so the unit fails visibly. Any other error is `failed` (exit 1).

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};

use super::deploy::{self, refspec_for};
use super::identity;
use super::medium::Medium;
use super::record::{self, Record, Status};
use super::secure_boot;
use super::system::{Access, System};
use crate::machine;
use emberrtos_contract::error::{Refused, exit};
use emberrtos_contract::gate::{gate_commit_as, gate_machine};
use emberrtos_contract::ostree as ost;
use emberrtos_contract::paths::REMOTE;
use emberrtos_contract::provision::{self, Flavor, LABEL, MEDIUM_FILE, Provision};

pub struct ProvisionOptions {
    pub sysroot: PathBuf,
    /// The filesystem label to look for.
    pub medium_label: String,
    /// A directory with the medium's files instead of a labelled filesystem.
    pub medium_dir: Option<PathBuf>,
    /// How long to wait for the medium to appear.
    pub wait: Duration,
    pub no_reboot: bool,
}

/// Runs provisioning; returns the exit code (0 provisioned or nothing to
/// do, 3 refused, 1 failed).
pub fn run(options: &ProvisionOptions) -> Result<u8> {
    let system = System::open(&options.sysroot, Access::Write)?;
    if record::recorded(&system)? {
        println!(
            "provisioning already ran ({}); nothing to do",
            record::RECORD_ABSOLUTE
        );
        return Ok(exit::OK);
    }
    let medium = match &options.medium_dir {
        Some(dir) => Some(Medium::dir(dir)?),
        None => Medium::find(&options.medium_label, options.wait)?,
    };
    let Some(medium) = medium else {
        println!(
            "no configuration medium (no filesystem labelled {}): the node boots as built",
            options.medium_label
        );
        return Ok(exit::OK);
    };
    let outcome = provision(&system, &medium);
    drop(medium);
    finish(&system, &outcome.record)?;
    match outcome.record.status {
        Status::Provisioned if outcome.deployed && system.live && !options.no_reboot => {
            println!("rebooting into the new deployment");
            machine::reboot()?;
            Ok(exit::OK)
        }
        Status::Provisioned => Ok(exit::OK),
        Status::Refused => Ok(exit::REFUSED),
        Status::Failed => Ok(exit::ERROR),
    }
}

/// Records the outcome (once), updates the banners and says it on the console.
fn finish(system: &System, record: &Record) -> Result<()> {
    if let Err(e) = record::write_banners(system, record) {
        eprintln!("warning: the login banners were not updated: {e:#}");
    }
    record::write_record(system, record)?;
    record::announce(system, &record.console_lines());
    Ok(())
}

struct Outcome {
    record: Record,
    /// A new deployment was made (a reboot activates it).
    deployed: bool,
}

/// What provisioning did; every error ends up in the record.
fn provision(system: &System, medium: &Medium) -> Outcome {
    let provision = match read_provision(medium) {
        Ok(provision) => provision,
        Err(e) => return failed(None, None, &e),
    };
    let hostname = Some(provision.hostname.clone());
    if let Err(e) = apply_identity(system, medium, &provision) {
        return failed(Some(provision.flavor), hostname, &e);
    }
    let record = |status, reason: String, commit, ref_name| Record {
        status,
        flavor: Some(provision.flavor),
        reason,
        commit,
        ref_name,
        hostname: hostname.clone(),
    };
    match provision.flavor {
        Flavor::Standard => Outcome {
            record: record(
                Status::Provisioned,
                "standard node: hostname, SSH keys and update remote set; it keeps the deployment it was built with".into(),
                Some(system.current.csum().to_string()),
                crate::system::origin_refspec(&system.current).ok(),
            ),
            deployed: false,
        },
        Flavor::Rt => match provision_rt(system) {
            Ok(done) => Outcome {
                record: record(
                    Status::Provisioned,
                    done.reason(),
                    Some(done.commit),
                    Some(done.ref_name),
                ),
                deployed: done.deployed,
            },
            Err(RtError::Refused { reason, commit, ref_name }) => Outcome {
                record: record(Status::Refused, reason, commit, ref_name),
                deployed: false,
            },
            Err(RtError::Failed(e)) => failed(Some(provision.flavor), hostname.clone(), &e),
        },
    }
}

fn failed(flavor: Option<Flavor>, hostname: Option<String>, error: &anyhow::Error) -> Outcome {
    Outcome {
        record: Record {
            status: Status::Failed,
            flavor,
            reason: format!("{error:#}"),
            commit: None,
            ref_name: None,
            hostname,
        },
        deployed: false,
    }
}

/// `emberrtos/provision.yaml`, parsed strictly (errors name field, line, column).
fn read_provision(medium: &Medium) -> Result<Provision> {
    let bytes = medium.read(MEDIUM_FILE)?;
    let text =
        String::from_utf8(bytes).with_context(|| format!("{LABEL}:{MEDIUM_FILE} is not UTF-8 text"))?;
    Ok(provision::parse(&text, &format!("{LABEL}:{MEDIUM_FILE}"))?)
}

/// Hostname, root's keys and the update remote.
fn apply_identity(system: &System, medium: &Medium, provision: &Provision) -> Result<()> {
    identity::set_hostname(system, &provision.hostname)?;
    let home = identity::install_root_keys(system, provision)?;
    println!(
        "hostname {}; {} SSH key(s) for root in {}/.ssh/authorized_keys",
        provision.hostname,
        provision.ssh_authorized_keys().len(),
        home.display()
    );
    let Some(remote) = &provision.update_remote else {
        return Ok(());
    };
    let field = "update-remote.gpg-key";
    let key = match provision.gpg_key_on_medium() {
        Some(path) => {
            let key = medium
                .read(&path)
                .map_err(|e| provision.error(field, format!("{e:#}")))?;
            ost::gpg_public_key(&key).map_err(|e| provision.error(field, e))?;
            Some(key)
        }
        None => None,
    };
    ost::configure_remote(&system.repo(), REMOTE, &remote.url, key.as_deref())?;
    println!(
        "update remote {REMOTE}: {} (GPG verification on; {})",
        remote.url,
        match key {
            Some(_) => "trusting the key from the medium only",
            None => "keys already trusted kept",
        }
    );
    track_remote(system)
}

/// Makes the current deployment track its ref through [`REMOTE`] when it
/// tracked a local ref only (a disk built without a remote), so that
/// `emberrtos-update upgrade` pulls from the remote the medium configured.
fn track_remote(system: &System) -> Result<()> {
    let refspec = crate::system::origin_refspec(&system.current)?;
    let (None, ref_name) = crate::system::split_refspec(&refspec)? else {
        return Ok(());
    };
    let tracked = refspec_for(Some(REMOTE), &ref_name);
    let origin = system.sysroot.origin_new_from_refspec(&tracked);
    system
        .sysroot
        .write_origin_file(&system.current, Some(&origin), ostree::gio::Cancellable::NONE)
        .with_context(|| format!("making the deployment track {tracked}"))?;
    println!("the deployment now tracks {tracked}");
    Ok(())
}

enum RtError {
    /// The RT commit could not be resolved or proven: nothing was deployed.
    Refused {
        reason: String,
        commit: Option<String>,
        ref_name: Option<String>,
    },
    Failed(anyhow::Error),
}

struct RtDone {
    commit: String,
    ref_name: String,
    deployed: bool,
}

impl RtDone {
    fn reason(&self) -> String {
        match self.deployed {
            true => "verified PREEMPT_RT commit deployed as the default; the previous deployment is kept for rollback".into(),
            false => "the booted deployment already is the verified PREEMPT_RT commit".into(),
        }
    }
}

/// Resolves, verifies and deploys the RT commit.
fn provision_rt(system: &System) -> Result<RtDone, RtError> {
    let booted = crate::system::origin_refspec(&system.current).map_err(RtError::Failed)?;
    let (booted_remote, rt_ref) = deploy::rt_ref_of(&booted).map_err(RtError::Failed)?;
    let repo = system.repo();
    let remote = update_remote(&repo, booted_remote.as_deref());
    let refuse = |reason: String, commit: Option<&str>| RtError::Refused {
        reason,
        commit: commit.map(str::to_string),
        ref_name: Some(rt_ref.clone()),
    };
    let (checksum, pulled) =
        resolve_rt(&repo, &rt_ref, remote.as_deref(), system.live).map_err(|r| refuse(r, None))?;
    if let Err(reason) = verify(system, &repo, &rt_ref, &checksum) {
        if pulled && let Some(remote) = &remote {
            // The refused commit does not stay behind as the remote's current RT ref.
            let _ = repo.set_ref_immediate(Some(remote), &rt_ref, None, ostree::gio::Cancellable::NONE);
        }
        return Err(refuse(reason, Some(&checksum)));
    }
    let done = |deployed| RtDone {
        commit: checksum.clone(),
        ref_name: rt_ref.clone(),
        deployed,
    };
    if checksum == system.current.csum().as_str() {
        return Ok(done(false));
    }
    let refspec = refspec_for(remote.as_deref(), &rt_ref);
    deploy::deploy_commit(system, &checksum, &refspec).map_err(RtError::Failed)?;
    println!("deployed {checksum} ({refspec}) as the default; a reboot activates it");
    Ok(done(true))
}

/// The remote updates come from: the booted origin's, else [`REMOTE`], if configured.
fn update_remote(repo: &ostree::Repo, booted_remote: Option<&str>) -> Option<String> {
    let remotes: Vec<String> = repo.remote_list().iter().map(|r| r.to_string()).collect();
    [booted_remote, Some(REMOTE)]
        .into_iter()
        .flatten()
        .find(|r| remotes.iter().any(|known| known == r))
        .map(str::to_string)
}

/// The RT commit: from the device's repo, else pulled from `remote` (GPG
/// verified; on the device once the network is up). The error is the
/// refusal's reason; the flag says it was pulled.
fn resolve_rt(
    repo: &ostree::Repo,
    rt_ref: &str,
    remote: Option<&str>,
    live: bool,
) -> Result<(String, bool), String> {
    // Embedded by `imgbuild disk`: a local ref, or the remote's ref when the
    // disk was built with an update remote.
    let embedded = std::iter::once(rt_ref.to_string()).chain(remote.map(|r| format!("{r}:{rt_ref}")));
    for refspec in embedded {
        match ost::resolve(repo, &refspec) {
            Ok(Some(checksum)) => {
                println!("{refspec}: commit {checksum} in the device's repo");
                return Ok((checksum, false));
            }
            Ok(None) => {}
            Err(e) => return Err(format!("resolve: {refspec} in the device's repo: {e:#}")),
        }
    }
    let Some(remote) = remote else {
        return Err(format!(
            "resolve: {rt_ref} is not in the device's repo and no update remote is configured to pull it from"
        ));
    };
    if live {
        wait_for_network();
    }
    let pulled = ost::pull_ref(repo, remote, rt_ref).map_err(|e| {
        format!(
            "pull: {rt_ref} from remote {remote} (GPG verified) failed: {}",
            e.root_cause()
        )
    })?;
    println!(
        "{rt_ref}: pulled commit {} from {remote}, {} bytes transferred ({})",
        pulled.checksum, pulled.bytes_transferred, pulled.status
    );
    Ok((pulled.checksum, true))
}

/// systemd-networkd's own wait for a configured link, bounded. The unit is
/// not ordered after `network-online.target`: that would hold SSH and the
/// console login back on every boot of an offline node; only a pull waits.
/// On a timeout the pull runs anyway and its error names the cause.
fn wait_for_network() {
    const WAIT_ONLINE: &str = "/usr/lib/systemd/systemd-networkd-wait-online";
    const SECONDS: u32 = 90;
    if Path::new(WAIT_ONLINE).is_file() {
        println!("waiting up to {SECONDS}s for the network");
        let _ = std::process::Command::new(WAIT_ONLINE)
            .args(["--any", &format!("--timeout={SECONDS}")])
            .status();
    }
}

/// The checks a commit passes on this device before it is deployed: the RT
/// gate, then the firmware's Secure Boot `db`. The error is the refusal's reason.
fn verify(system: &System, repo: &ostree::Repo, rt_ref: &str, checksum: &str) -> Result<(), String> {
    gate_machine(repo, checksum, "provision", "not deployed").map_err(|e| refusal_reason("machine", &e))?;
    gate_commit_as(repo, rt_ref, checksum, "provision", "not deployed").map_err(|e| verify_reason(&e))?;
    println!("{rt_ref}: commit {checksum} verified on this device: PREEMPT_RT");
    secure_boot::require_trusted_kernel(system, repo, checksum, "provision", "not deployed")
        .map_err(|e| refusal_reason("secure-boot", &e))
}

/// The reason of a refusal by a gate other than the RT one (`machine`,
/// `secure-boot`): `<what>: <summary> (<reasons>)`.
fn refusal_reason(what: &str, error: &anyhow::Error) -> String {
    match error.downcast_ref::<Refused>() {
        Some(refused) => format!("{what}: {} ({})", refused.summary, refused.reasons.join("; ")),
        None => format!("{what}: {error:#}"),
    }
}

/// The reason of a gate refusal: the checks that failed, by name, first
/// (`artifact.uts-version: not PREEMPT_RT ...`), then the other problems.
/// The commit and ref are in the record beside it.
fn verify_reason(error: &anyhow::Error) -> String {
    let Some(refused) = error.downcast_ref::<Refused>() else {
        return format!("verify: {error:#}");
    };
    let names_a_check = |reason: &String| {
        let id = reason.split(':').next().unwrap_or_default();
        !id.is_empty() && !id.contains(' ') && (id.contains('.') || id == "config")
    };
    let mut reasons = refused.reasons.clone();
    reasons.sort_by_key(|reason| !names_a_check(reason));
    format!(
        "verify: the kernel is not proven PREEMPT_RT: {}",
        reasons.join("; ")
    )
}
