//! Deploying a commit on the device: the RT ref a deployment's origin leads
//! to, the kernel arguments a new deployment boots with, and the one ostree
//! transaction that makes it the default while the current deployment stays
//! as the rollback target.

use anyhow::{Context, Result};
use ostree::gio;

use super::system::{System, split_refspec};
use crate::machine::flush_boot;
use emberrtos_contract::commit;
use emberrtos_contract::ostree as ost;

/// The RT sibling of the ref a deployment tracks: the same path with its
/// last component `rt` (`emberrtos-ci/x86_64/standard` ->
/// `emberrtos-ci/x86_64/rt`). The remote, if any, is returned apart.
pub fn rt_ref_of(refspec: &str) -> Result<(Option<String>, String)> {
    let (remote, ref_name) = split_refspec(refspec)?;
    let rt = match ref_name.rsplit_once('/') {
        Some((parent, _)) => format!("{parent}/rt"),
        None => "rt".to_string(),
    };
    Ok((remote, rt))
}

/// The refspec a new deployment of `ref_name` tracks: through `remote` when
/// one is configured (so `emberrtos-update upgrade` pulls from it), else the
/// local ref.
pub fn refspec_for(remote: Option<&str>, ref_name: &str) -> String {
    match remote {
        Some(remote) => format!("{remote}:{ref_name}"),
        None => ref_name.to_string(),
    }
}

/// The kernel arguments of a new deployment: the current deployment's,
/// without ostree's own `ostree=` (libostree sets it per deployment) and
/// without the current commit's `imgbuild.kargs` (one occurrence each, the
/// last, as deploying appended them), then the new commit's. What the disk
/// or an operator added (`root=`, consoles, a `karg` edited on the device)
/// stays.
pub fn recompute_kargs(current: &[String], current_commit: &[String], new_commit: &[String]) -> Vec<String> {
    let mut kargs: Vec<String> = current
        .iter()
        .filter(|arg| !arg.starts_with("ostree="))
        .cloned()
        .collect();
    for arg in current_commit {
        if let Some(at) = kargs.iter().rposition(|a| a == arg) {
            kargs.remove(at);
        }
    }
    kargs.extend(new_commit.iter().cloned());
    kargs
}

/// The kernel arguments a deployment boots with (its boot entry's `options`).
pub fn deployment_kargs(deployment: &ostree::Deployment) -> Vec<String> {
    let options = deployment
        .bootconfig()
        .and_then(|config| config.get("options"))
        .map(|o| o.to_string())
        .unwrap_or_default();
    ostree::KernelArgs::from_string(&options)
        .to_strv()
        .into_iter()
        .map(|arg| arg.to_string())
        .collect()
}

/// The `imgbuild.kargs` of a commit in the system's repo.
fn commit_kargs(system: &System, checksum: &str) -> Result<Vec<String>> {
    commit::kargs_of(&ost::read_commit(&system.repo(), checksum)?)
}

/// Deploys `checksum` as the new default deployment tracking `refspec`, with
/// [`recompute_kargs`], `/etc` merged from the current deployment, and the
/// current deployment kept (it becomes the rollback target). One ostree
/// transaction: the bootloader configuration switches atomically. The new
/// deployment boots on trial ([`super::health::trial::begin`]).
pub fn deploy_commit(system: &System, checksum: &str, refspec: &str) -> Result<ostree::Deployment> {
    let current = &system.current;
    let kargs = recompute_kargs(
        &deployment_kargs(current),
        &commit_kargs(system, &current.csum())?,
        &commit_kargs(system, checksum)?,
    );
    let kargs: Vec<&str> = kargs.iter().map(String::as_str).collect();
    let origin = system.sysroot.origin_new_from_refspec(refspec);
    let options = ostree::SysrootDeployTreeOpts {
        override_kernel_argv: Some(&kargs),
        ..Default::default()
    };
    let osname = system.osname();
    let deployment = system
        .sysroot
        .deploy_tree_with_options(
            Some(&osname),
            checksum,
            Some(&origin),
            Some(current),
            Some(&options),
            gio::Cancellable::NONE,
        )
        .with_context(|| format!("deploying commit {checksum}"))?;
    let policy = emberrtos_contract::commit::policy_of(&ost::read_commit(&system.repo(), checksum)?);
    super::health::trial::begin(system, &deployment, &policy)?;
    println!(
        "{}.{} boots on trial: {} {} to reach healthy, else GRUB starts {}.{} again",
        deployment.csum(),
        deployment.deployserial(),
        policy.boot_tries,
        if policy.boot_tries == 1 { "try" } else { "tries" },
        current.csum(),
        current.deployserial()
    );
    system
        .sysroot
        .simple_write_deployment(
            Some(&osname),
            &deployment,
            Some(current),
            ostree::SysrootSimpleWriteDeploymentFlags::NONE,
            gio::Cancellable::NONE,
        )
        .with_context(|| format!("making the deployment of {checksum} the default"))?;
    flush_boot(system)?;
    Ok(deployment)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(text: &str) -> Vec<String> {
        text.split_whitespace().map(str::to_string).collect()
    }

    #[test]
    fn kargs_keep_the_disks_and_swap_the_commits() {
        let current = words(
            "root=UUID=ab rw console=tty0 console=ttyS0,115200 quiet ostree=/ostree/boot.1/emberrtos/x/0",
        );
        let new = recompute_kargs(
            &current,
            &words("quiet"),
            &words("quiet isolcpus=managed_irq,domain,1-3 nohz_full=1-3"),
        );
        assert_eq!(
            new,
            words(
                "root=UUID=ab rw console=tty0 console=ttyS0,115200 quiet isolcpus=managed_irq,domain,1-3 nohz_full=1-3"
            )
        );
        // Back again: the RT arguments go, an operator's own argument stays.
        let mut on_rt = new.clone();
        on_rt.push("mitigations=off".into());
        assert_eq!(
            recompute_kargs(
                &on_rt,
                &words("quiet isolcpus=managed_irq,domain,1-3 nohz_full=1-3"),
                &words("quiet")
            ),
            words("root=UUID=ab rw console=tty0 console=ttyS0,115200 mitigations=off quiet")
        );
    }

    #[test]
    fn kargs_remove_one_occurrence_per_commit_argument() {
        // The disk set `console=ttyS0,115200` and the commit asked for it too.
        let current = words("console=ttyS0,115200 rw console=ttyS0,115200");
        assert_eq!(
            recompute_kargs(&current, &words("console=ttyS0,115200"), &[]),
            words("console=ttyS0,115200 rw")
        );
        // An argument the current commit lists but the deployment lacks is no error.
        assert_eq!(
            recompute_kargs(&words("rw"), &words("quiet"), &words("quiet")),
            words("rw quiet")
        );
    }

    #[test]
    fn rt_ref_replaces_the_last_component_and_keeps_the_remote() {
        let rt = |spec: &str| rt_ref_of(spec).unwrap();
        assert_eq!(
            rt("emberrtos-ci/x86_64/standard"),
            (None, "emberrtos-ci/x86_64/rt".to_string())
        );
        assert_eq!(
            rt("emberrtos:emberrtos/x86_64/standard"),
            (Some("emberrtos".to_string()), "emberrtos/x86_64/rt".to_string())
        );
        assert_eq!(
            rt("emberrtos/x86_64/rt"),
            (None, "emberrtos/x86_64/rt".to_string())
        );
        assert_eq!(rt("standard"), (None, "rt".to_string()));
        for bad in ["", "a b/standard", "remote:", "x/../y"] {
            assert!(rt_ref_of(bad).is_err(), "{bad:?}");
        }
        assert_eq!(refspec_for(Some("emberrtos"), "a/rt"), "emberrtos:a/rt");
        assert_eq!(refspec_for(None, "a/rt"), "a/rt");
    }
}
