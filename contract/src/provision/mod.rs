//! `provision.yaml`, the file on the configuration medium (docs/ARCHITECTURE.md,
//! "The device contract"): what a node becomes at first boot.
//!
//! ```yaml
//! flavor: rt                      # or standard
//! hostname: cell-07
//! ssh-authorized-keys: ["ssh-ed25519 AAAA... ops@example.org"]
//! update-remote: {url: https://updates.example.org/emberrtos/, gpg-key: publisher.asc}
//! ```
//!
//! [`parse`] is pure (text in, validated [`Provision`] or a [`ProvisionError`]
//! naming file, field, line and column out). The builder runs it before it
//! writes a medium, and the device runs the same parser before it trusts one,
//! so this module depends only on serde, `yaml_serde` and the recipe's pure
//! [`syntax`] checks and [`locate`](crate::yaml::locate) helper: nothing
//! that touches files, runs tools or needs ostree.

mod checks;

use std::fmt;

use serde::{Deserialize, Serialize};

pub use crate::flavor::Flavor;
use crate::syntax;
pub use crate::yaml::{Locations, Position, locate};

/// The filesystem label of a configuration medium.
pub const LABEL: &str = "EMBERCFG";
/// The directory on the medium that holds everything imgbuild reads.
pub const MEDIUM_DIR: &str = "emberrtos";
/// The provisioning file, relative to the medium's root.
pub const MEDIUM_FILE: &str = "emberrtos/provision.yaml";
/// The largest `provision.yaml` or key file accepted, by the builder and the device.
pub const MAX_INPUT_BYTES: u64 = 1024 * 1024;

/// A `provision.yaml` error that points at the offending field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ProvisionError {
    /// The file as named to [`parse`].
    pub file: String,
    /// Dotted field path, e.g. `update-remote.gpg-key`; empty for a YAML
    /// syntax error outside any field.
    pub field: String,
    /// 1-based line and column, when known.
    pub position: Option<Position>,
    pub message: String,
}

impl ProvisionError {
    pub fn line(&self) -> Option<usize> {
        self.position.map(|p| p.line)
    }

    pub fn column(&self) -> Option<usize> {
        self.position.map(|p| p.column)
    }
}

impl fmt::Display for ProvisionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        crate::yaml::fmt_field_error(f, &self.file, self.position, &self.field, &self.message)
    }
}

// ---- The schema, exactly as written. ----

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawProvision {
    flavor: Flavor,
    hostname: String,
    ssh_authorized_keys: Vec<String>,
    #[serde(default)]
    update_remote: Option<RawUpdateRemote>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawUpdateRemote {
    url: String,
    #[serde(default)]
    gpg_key: Option<String>,
}

// ---- The validated form. ----

/// Where the device pulls updates from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct UpdateRemote {
    /// An http(s) URL without credentials, query, fragment or whitespace.
    pub url: String,
    /// The publisher's GPG key: a file on the medium, relative to
    /// [`MEDIUM_DIR`] (`publisher.asc`, `keys/publisher.asc`).
    pub gpg_key: Option<String>,
}

/// A validated `provision.yaml`.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct Provision {
    pub flavor: Flavor,
    /// One or more RFC 1123 labels separated by `.`.
    pub hostname: String,
    /// Normalised OpenSSH public keys, `type base64 [comment]`, one line each.
    pub ssh_authorized_keys: Vec<String>,
    pub update_remote: Option<UpdateRemote>,
    #[serde(skip)]
    file: String,
    #[serde(skip)]
    locations: Locations,
}

impl Provision {
    /// The `authorized_keys` file: one validated key per line.
    pub fn authorized_keys(&self) -> String {
        self.ssh_authorized_keys
            .iter()
            .map(|key| format!("{key}\n"))
            .collect()
    }

    /// The GPG key's path on the medium (`emberrtos/<gpg-key>`), if any.
    pub fn gpg_key_on_medium(&self) -> Option<String> {
        let key = self.update_remote.as_ref()?.gpg_key.as_ref()?;
        Some(format!("{MEDIUM_DIR}/{key}"))
    }

    /// An error at `field` of this file, for checks made after parsing
    /// (a key file that is missing or is not a public key).
    pub fn error(&self, field: &str, message: impl Into<String>) -> ProvisionError {
        field_error(&self.file, &self.locations, field, message)
    }
}

fn field_error(file: &str, locations: &Locations, field: &str, message: impl Into<String>) -> ProvisionError {
    ProvisionError {
        file: file.to_string(),
        field: field.to_string(),
        position: locations.find(field),
        message: message.into(),
    }
}

/// Parses and validates `provision.yaml` text. Pure: touches no files.
/// `file` names the text in errors.
pub fn parse(text: &str, file: &str) -> Result<Provision, ProvisionError> {
    let raw = deserialize(text, file)?;
    let locations = locate(text);
    let error = |field: &str, message: String| field_error(file, &locations, field, message);

    checks::hostname(&raw.hostname).map_err(|e| error("hostname", e))?;
    if raw.ssh_authorized_keys.is_empty() {
        return Err(error(
            "ssh-authorized-keys",
            "list at least one key: provisioning installs them for root, who logs in with keys only".into(),
        ));
    }
    let ssh_authorized_keys = raw
        .ssh_authorized_keys
        .iter()
        .enumerate()
        .map(|(i, key)| {
            syntax::ssh_public_key(key).map_err(|e| error(&format!("ssh-authorized-keys[{i}]"), e))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let update_remote = raw
        .update_remote
        .map(|remote| -> Result<UpdateRemote, ProvisionError> {
            syntax::remote_url(&remote.url).map_err(|e| error("update-remote.url", e))?;
            if let Some(key) = &remote.gpg_key {
                checks::medium_path(key).map_err(|e| error("update-remote.gpg-key", e))?;
                checks::not_the_provision_file(key).map_err(|e| error("update-remote.gpg-key", e))?;
            }
            Ok(UpdateRemote {
                url: remote.url,
                gpg_key: remote.gpg_key,
            })
        })
        .transpose()?;
    Ok(Provision {
        flavor: raw.flavor,
        hostname: raw.hostname,
        ssh_authorized_keys,
        update_remote,
        file: file.to_string(),
        locations,
    })
}

/// The schema form, or the deserializer's error with its field and position.
fn deserialize(text: &str, file: &str) -> Result<RawProvision, ProvisionError> {
    yaml_serde::from_str(text).map_err(|e| {
        let (field, message) = crate::yaml::split_yaml_error(&e.to_string());
        ProvisionError {
            file: file.to_string(),
            field,
            position: e.location().map(|l| Position {
                line: l.line(),
                column: l.column(),
            }),
            message,
        }
    })
}

#[cfg(test)]
mod tests;
