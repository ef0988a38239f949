//! What a remote serves that the publisher signed. Anything in a web root
//! may have been planted: a ref counts as the publisher's only when its
//! commit object hashes to the ref's checksum and carries a signature that
//! `gpg --verify` finds good and made by the publisher's key (an issuer
//! fingerprint alone could be copied from another commit's signatures).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use super::{Transport, object_path};
use crate::io::gpg;

/// The key that signs what is published.
pub struct Publisher {
    /// The primary fingerprint of the key.
    fingerprint: String,
    homedir: Option<PathBuf>,
}

/// A ref a remote serves and the publisher did not sign.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnsignedRef {
    pub name: String,
    pub commit: String,
    pub why: String,
}

impl std::fmt::Display for UnsignedRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} -> {}: {}", self.name, self.commit, self.why)
    }
}

impl Publisher {
    /// The one key `key` names in the keyring at `homedir` (default ~/.gnupg).
    pub fn new(key: &str, homedir: Option<&Path>) -> Result<Publisher> {
        Ok(Publisher {
            fingerprint: gpg::primary_fingerprint(key, homedir)?,
            homedir: homedir.map(Path::to_path_buf),
        })
    }

    /// Why the remote's commit `checksum` is not the publisher's, or `None`
    /// when it is: present, hashing to `checksum`, signed by the key.
    pub fn commit_problem(&self, transport: &dyn Transport, checksum: &str) -> Result<Option<String>> {
        let kind = ostree::ObjectType::Commit;
        let Some(commit) = transport.read(&object_path(checksum, kind))? else {
            return Ok(Some("its commit object is missing".into()));
        };
        if emberrtos_contract::io::sha256_hex(&commit) != checksum {
            return Ok(Some("its commit object does not hash to the checksum".into()));
        }
        let detached = transport.read(&object_path(checksum, ostree::ObjectType::CommitMeta))?;
        Ok(match detached {
            Some(meta) if self.signs(&commit, &meta)? => None,
            _ => Some(format!("no good signature by {}", self.fingerprint)),
        })
    }

    /// Whether `summary.sig` on the remote holds a good signature of
    /// `summary` by the key.
    pub fn signed_summary(&self, transport: &dyn Transport, summary: &[u8]) -> Result<bool> {
        match transport.read(Path::new("summary.sig"))? {
            Some(sig) => self.signs(summary, &sig),
            None => Ok(false),
        }
    }

    /// Whether `detached` (ostree's `a{sv}` with `ostree.gpgsigs`) holds a
    /// good signature of `data` by the key.
    fn signs(&self, data: &[u8], detached: &[u8]) -> Result<bool> {
        for signature in gpg_signatures(detached) {
            let verification = gpg::verify_detached(data, &signature, self.homedir.as_deref())?;
            if verification.good_by(&self.fingerprint) {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// The refs `summary` lists whose commits the publisher did not sign.
    pub fn unsigned_refs(&self, transport: &dyn Transport, summary: &[u8]) -> Result<Vec<UnsignedRef>> {
        let mut unsigned = Vec::new();
        for (name, commit) in summary_refs(summary)? {
            if let Some(why) = self.commit_problem(transport, &commit)? {
                unsigned.push(UnsignedRef { name, commit, why });
            }
        }
        Ok(unsigned)
    }
}

/// The signatures in ostree detached metadata (`a{sv}`, key
/// `ostree.gpgsigs` of type `aay`); none when it is malformed.
fn gpg_signatures(detached: &[u8]) -> Vec<Vec<u8>> {
    let ty = glib::VariantTy::new("a{sv}").expect("valid type");
    let meta = glib::Variant::from_bytes_with_type(&glib::Bytes::from(detached), ty).normal_form();
    let aay = glib::VariantTy::new("aay").expect("valid type");
    glib::VariantDict::new(Some(&meta))
        .lookup_value("ostree.gpgsigs", Some(aay))
        .map(|sigs| sigs.iter().map(|s| s.data().to_vec()).collect())
        .unwrap_or_default()
}

/// The refs a summary lists, with their commits, collection refs included.
pub fn summary_refs(summary: &[u8]) -> Result<Vec<(String, String)>> {
    let ty = glib::VariantTy::new("(a(s(taya{sv}))a{sv})").expect("valid type");
    let summary = glib::Variant::from_bytes_with_type(&glib::Bytes::from(summary), ty).normal_form();
    let mut refs = ref_list(&summary.child_value(0))?;
    let map_ty = glib::VariantTy::new("a{sa(s(taya{sv}))}").expect("valid type");
    let collections = glib::VariantDict::new(Some(&summary.child_value(1)))
        .lookup_value("ostree.summary.collection-map", Some(map_ty));
    for collection in collections.iter().flat_map(|map| map.iter()) {
        refs.extend(ref_list(&collection.child_value(1))?);
    }
    Ok(refs)
}

/// `a(s(taya{sv}))` as (name, checksum) pairs.
fn ref_list(list: &glib::Variant) -> Result<Vec<(String, String)>> {
    list.iter()
        .map(|entry| {
            let name = entry.child_value(0).str().unwrap_or_default().to_string();
            let checksum = entry.child_value(1).child_value(1);
            let bytes = checksum
                .fixed_array::<u8>()
                .context("a summary ref without a checksum")?;
            Ok((name, hex::encode(bytes)))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use glib::prelude::*;

    #[test]
    fn signatures_are_read_from_detached_metadata_and_garbage_holds_none() {
        let dict = glib::VariantDict::new(None);
        let sigs = vec![b"sig-one".to_vec(), b"sig-two".to_vec()];
        dict.insert_value("ostree.gpgsigs", &sigs.to_variant());
        assert_eq!(gpg_signatures(&dict.end().data_as_bytes()), sigs);
        assert_eq!(gpg_signatures(b"planted, not a variant"), Vec::<Vec<u8>>::new());
        assert_eq!(gpg_signatures(b""), Vec::<Vec<u8>>::new());
    }
}
