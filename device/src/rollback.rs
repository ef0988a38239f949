//! `emberrtos-update rollback`: makes the previous deployment the default
//! (ostree 2022.7 has no `ostree admin set-default`: the deployment list is
//! reordered and written back in one transaction), ends any trial boot and
//! reboots unless told not to.

use std::path::Path;

use anyhow::{Context, Result, bail};
use ostree::gio;

use super::system::{Access, System};
use crate::machine;
use emberrtos_contract::error::exit;

/// The new order of the deployments (indices into the current order), or
/// `None` when there is nothing to roll back to. `current` is the booted
/// deployment (the default one off the device); `same_os[i]` says whether
/// deployment `i` belongs to the default's stateroot.
///
/// - An update is pending (the default is not the booted one): the booted
///   deployment becomes the default again, the pending one is kept behind it.
/// - Otherwise the next deployment of the same stateroot becomes the
///   default; the current one becomes its rollback.
pub fn rollback_order(current: usize, same_os: &[bool]) -> Option<Vec<usize>> {
    let target = match current {
        0 => (1..same_os.len()).find(|&i| same_os[i])?,
        booted => booted,
    };
    let mut order = vec![target];
    order.extend((0..same_os.len()).filter(|&i| i != target));
    Some(order)
}

pub fn run(sysroot: &Path, no_reboot: bool) -> Result<u8> {
    let system = System::open(sysroot, Access::Write)?;
    let deployments = system.sysroot.deployments();
    let current = deployments
        .iter()
        .position(|d| d.equal(&system.current))
        .context("the current deployment is not in the sysroot's list")?;
    let osname = deployments[0].osname();
    let same_os: Vec<bool> = deployments.iter().map(|d| d.osname() == osname).collect();
    let Some(order) = rollback_order(current, &same_os) else {
        bail!("there is no previous deployment to roll back to");
    };
    // The same objects, moved: libostree finds the booted deployment in the
    // new list by identity, and `Deployment::clone` makes a copy.
    let mut slots: Vec<Option<ostree::Deployment>> = deployments.into_iter().map(Some).collect();
    let reordered: Vec<ostree::Deployment> = order
        .iter()
        .map(|&i| slots[i].take().expect("each index once"))
        .collect();
    system
        .sysroot
        .write_deployments(&reordered, gio::Cancellable::NONE)
        .context("writing the reordered deployments")?;
    machine::flush_boot(&system)?;
    super::health::trial::cancel(&system)?;
    let target = &reordered[0];
    println!(
        "rolled back: {} ({}) is the default{}",
        target.csum(),
        crate::system::origin_refspec(target).unwrap_or_else(|_| "no origin".into()),
        if system.live { "; it boots next" } else { "" }
    );
    if system.live && !no_reboot {
        println!("rebooting into it");
        machine::reboot()?;
    }
    Ok(exit::OK)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rollback_picks_the_previous_deployment() {
        // Booted default, one rollback: swap them.
        assert_eq!(rollback_order(0, &[true, true]), Some(vec![1, 0]));
        // A pending update: the booted one is the default again.
        assert_eq!(rollback_order(1, &[true, true, true]), Some(vec![1, 0, 2]));
        // Skip deployments of another stateroot.
        assert_eq!(rollback_order(0, &[true, false, true]), Some(vec![2, 0, 1]));
        // Nothing to go back to.
        assert_eq!(rollback_order(0, &[true]), None);
        assert_eq!(rollback_order(0, &[true, false]), None);
    }
}
