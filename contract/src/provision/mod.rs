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
//! [`syntax`] checks and [`yaml`](crate::yaml) helpers (the
//! [`check_bounds`](crate::yaml::check_bounds) guard, [`locate`]): nothing
//! that touches files, runs tools or needs ostree.

mod checks;

use std::collections::HashSet;
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
/// The most keys `ssh-authorized-keys` may list.
pub const MAX_AUTHORIZED_KEYS: usize = 64;
/// The largest `authorized_keys` file provisioning writes.
pub const MAX_AUTHORIZED_KEYS_BYTES: usize = 256 * 1024;

const KEYS_FIELD: &str = "ssh-authorized-keys";
const GPG_KEY_FIELD: &str = "update-remote.gpg-key";

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
    /// Normalised OpenSSH public keys, `type base64 [comment]`, each key
    /// once, within [`MAX_AUTHORIZED_KEYS`] and [`MAX_AUTHORIZED_KEYS_BYTES`]:
    /// private, so only [`parse`] makes the list.
    ssh_authorized_keys: Vec<String>,
    pub update_remote: Option<UpdateRemote>,
    #[serde(skip)]
    file: String,
    #[serde(skip)]
    locations: Locations,
}

impl Provision {
    /// The validated keys, each once.
    pub fn ssh_authorized_keys(&self) -> &[String] {
        &self.ssh_authorized_keys
    }

    /// The `authorized_keys` file: one validated key per line, each key once,
    /// at most [`MAX_AUTHORIZED_KEYS_BYTES`].
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
    let ssh_authorized_keys = authorized_keys(&raw.ssh_authorized_keys, &error)?;
    let update_remote = raw
        .update_remote
        .map(|remote| -> Result<UpdateRemote, ProvisionError> {
            syntax::remote_url(&remote.url).map_err(|e| error("update-remote.url", e))?;
            if let Some(key) = &remote.gpg_key {
                // The clash first: `PROVISION.YAML` is named as what it is.
                checks::not_the_provision_file(key).map_err(|e| error(GPG_KEY_FIELD, e))?;
                checks::medium_path(key).map_err(|e| error(GPG_KEY_FIELD, e))?;
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

/// `ssh-authorized-keys` validated and normalised, each key once (the
/// first of its duplicates kept, comments aside), within
/// [`MAX_AUTHORIZED_KEYS`] and [`MAX_AUTHORIZED_KEYS_BYTES`].
fn authorized_keys(
    raw: &[String],
    error: &impl Fn(&str, String) -> ProvisionError,
) -> Result<Vec<String>, ProvisionError> {
    if raw.is_empty() {
        return Err(error(
            KEYS_FIELD,
            "list at least one key: provisioning installs them for root, who logs in with keys only".into(),
        ));
    }
    if raw.len() > MAX_AUTHORIZED_KEYS {
        return Err(error(
            KEYS_FIELD,
            format!(
                "lists {} keys: at most {MAX_AUTHORIZED_KEYS} are allowed",
                raw.len()
            ),
        ));
    }
    let mut seen = HashSet::new();
    let mut keys = Vec::new();
    for (i, key) in raw.iter().enumerate() {
        let key = syntax::ssh_public_key(key).map_err(|e| error(&format!("{KEYS_FIELD}[{i}]"), e))?;
        if seen.insert(key_material(&key).to_string()) {
            keys.push(key);
        }
    }
    let bytes: usize = keys.iter().map(|key| key.len() + 1).sum();
    if bytes > MAX_AUTHORIZED_KEYS_BYTES {
        return Err(error(
            KEYS_FIELD,
            format!(
                "the keys make an authorized_keys file of {bytes} bytes: at most {MAX_AUTHORIZED_KEYS_BYTES} are allowed (shorten the comments)"
            ),
        ));
    }
    Ok(keys)
}

/// `type base64` of a normalised key line: the key without its comment.
fn key_material(key: &str) -> &str {
    key.match_indices(' ').nth(1).map_or(key, |(end, _)| &key[..end])
}

/// The schema form, or the first error with its field and position: the
/// size and depth guard ([`check_bounds`](crate::yaml::check_bounds)) runs
/// before the deserializer sees the text.
fn deserialize(text: &str, file: &str) -> Result<RawProvision, ProvisionError> {
    crate::yaml::check_bounds(text, crate::yaml::LIMITS).map_err(|e| ProvisionError {
        file: file.to_string(),
        field: String::new(),
        position: Some(e.position()),
        message: e.to_string(),
    })?;
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
