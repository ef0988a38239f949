//! `emberrtos-update status`: the deployments, default first, each with its
//! role (booted, pending, rollback), origin, version and flavor, and whether
//! the firmware has Secure Boot on.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::Result;
use serde::Serialize;

use super::health::record::{Entry, HealthRecord, State};
use super::health::trial::deployment_id;
use super::secure_boot;
use super::system::{Access, System};
use emberrtos_contract::commit::key;
use emberrtos_contract::flavor::Flavor;
use emberrtos_contract::flavor::flavor_of_ref;
use emberrtos_contract::ostree as ost;

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct DeploymentStatus {
    pub index: usize,
    pub osname: String,
    pub checksum: String,
    pub serial: i32,
    /// `booted`, `pending` (the default, booted at the next boot), `rollback`
    /// (booted if the default is rolled back) or empty.
    pub role: String,
    pub default: bool,
    pub origin: Option<String>,
    pub version: Option<String>,
    /// The flavor of the ref it tracks (policy, from the ref's name).
    pub flavor: Option<Flavor>,
    pub kernel: Option<String>,
    /// Its entry in `/var/lib/emberrtos/health.json`, if any.
    pub health: Option<Entry>,
    /// The firmware's Secure Boot state (the same on every deployment: the
    /// JSON stays one array of deployments).
    pub secure_boot: secure_boot::Status,
}

/// The role of deployment `index` given where the current (booted) one is.
pub fn role(index: usize, current: Option<usize>, live: bool) -> &'static str {
    match current {
        Some(c) if index == c => match live {
            true => "booted",
            false => "current",
        },
        Some(c) if index == 0 && c > 0 => "pending",
        Some(c) if index == c + 1 => "rollback",
        _ => "",
    }
}

pub fn collect(system: &System, secure_boot: &secure_boot::Status) -> Vec<DeploymentStatus> {
    let repo = system.repo();
    let deployments = system.sysroot.deployments();
    let current = deployments.iter().position(|d| d.equal(&system.current));
    let health = HealthRecord::load_readonly(&system.var);
    deployments
        .iter()
        .enumerate()
        .map(|(index, d)| {
            let checksum = d.csum().to_string();
            let info = ost::read_commit(&repo, &checksum).ok();
            let meta = |k: &str| {
                info.as_ref()
                    .and_then(|i| i.metadata.get(k))
                    .and_then(|v| v.as_str())
                    .map(str::to_string)
            };
            let origin = crate::system::origin_refspec(d).ok();
            DeploymentStatus {
                index,
                osname: d.osname().to_string(),
                serial: d.deployserial(),
                role: role(index, current, system.live).to_string(),
                default: index == 0,
                flavor: origin.as_deref().map(flavor_of_ref),
                origin,
                version: meta(key::VERSION),
                kernel: meta(key::KERNEL_RELEASE),
                health: health.deployments.get(&deployment_id(d)).cloned(),
                secure_boot: secure_boot.clone(),
                checksum,
            }
        })
        .collect()
}

pub fn render(statuses: &[DeploymentStatus]) -> String {
    let mut out = String::new();
    for s in statuses {
        let marker = if s.default { "*" } else { " " };
        let role = if s.role.is_empty() {
            String::new()
        } else {
            format!(" ({})", s.role)
        };
        let _ = writeln!(out, "{marker} {} {}.{}{role}", s.osname, s.checksum, s.serial);
        let or_dash = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
        let _ = writeln!(out, "    origin:  {}", or_dash(&s.origin));
        let _ = writeln!(
            out,
            "    version: {}  flavor: {}  kernel: {}",
            or_dash(&s.version),
            s.flavor.map_or("-".into(), |f| f.to_string()),
            or_dash(&s.kernel)
        );
        if let Some(h) = &s.health {
            let _ = writeln!(
                out,
                "    health:  {} (tries {}/{}): {}",
                h.state.as_str(),
                h.tries_checked,
                h.tries,
                h.reason
            );
        }
    }
    out
}

/// The firmware's Secure Boot line: `secure boot: on`, `secure boot: off (why)`.
pub fn render_secure_boot(status: &secure_boot::Status) -> String {
    format!("secure boot: {status}\n")
}

/// The deployments this device rolled back by itself, one line each.
pub fn render_rolled_back(record: &HealthRecord) -> String {
    record
        .deployments
        .iter()
        .filter(|(_, e)| e.state == State::RolledBack)
        .map(|(id, e)| format!("rolled back: {id}: {}\n", e.reason))
        .collect()
}

pub fn run(sysroot: &Path, json: bool) -> Result<u8> {
    let system = System::open(sysroot, Access::Read)?;
    let secure_boot = secure_boot::Status::of(secure_boot::firmware_state(&system));
    let statuses = collect(&system, &secure_boot);
    if json {
        println!("{}", serde_json::to_string_pretty(&statuses)?);
    } else {
        print!("{}", render(&statuses));
        print!("{}", render_secure_boot(&secure_boot));
        print!(
            "{}",
            render_rolled_back(&HealthRecord::load_readonly(&system.var))
        );
    }
    Ok(emberrtos_contract::error::exit::OK)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_follow_the_booted_deployment() {
        // Booted is the default: the next one is the rollback.
        assert_eq!(
            (0..3).map(|i| role(i, Some(0), true)).collect::<Vec<_>>(),
            ["booted", "rollback", ""]
        );
        // An update is pending: the default boots next, the booted one stays.
        assert_eq!(
            (0..3).map(|i| role(i, Some(1), true)).collect::<Vec<_>>(),
            ["pending", "booted", "rollback"]
        );
        assert_eq!(role(0, Some(0), false), "current");
        assert_eq!(role(0, None, true), "");
    }

    #[test]
    fn the_secure_boot_line_says_on_or_why_off() {
        let on = secure_boot::Status::of(Ok(secure_boot::State::On));
        assert_eq!(render_secure_boot(&on), "secure boot: on\n");
        let off = secure_boot::Status::of(Ok(secure_boot::State::Off("no SecureBoot variable in /x".into())));
        assert_eq!(
            render_secure_boot(&off),
            "secure boot: off (no SecureBoot variable in /x)\n"
        );
        assert_eq!(
            serde_json::to_value(&off).unwrap(),
            serde_json::json!({"state": "off", "detail": "no SecureBoot variable in /x"})
        );
    }
}
