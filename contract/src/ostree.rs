//! The libostree calls both sides make: opening a repo, resolving and
//! reading commits with their metadata, configuring a GPG-verified remote,
//! pulling from it, and reading who signed a commit. The builder's own
//! writes (commits, refs, summaries) stay in the builder.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result, bail};
use glib::prelude::*;
use glib::translate::IntoGlib;
use ostree::gio;
use serde::{Deserialize, Serialize};

/// Opens an existing repo.
pub fn open(path: &Path) -> Result<ostree::Repo> {
    if !path.join("config").is_file() {
        bail!("{} is not an ostree repo (no config file)", path.display());
    }
    let repo = ostree::Repo::new_for_path(path);
    repo.open(gio::Cancellable::NONE)
        .with_context(|| format!("opening ostree repo {}", path.display()))?;
    Ok(repo)
}

/// Resolves a ref or checksum; `None` when the ref does not exist.
pub fn resolve(repo: &ostree::Repo, rev: &str) -> Result<Option<String>> {
    Ok(repo
        .resolve_rev(rev, true)
        .with_context(|| format!("resolving {rev}"))?
        .map(|s| s.to_string()))
}

/// Configures remote `name` of `repo` at `url` with GPG verification of
/// commits and of the summary on. With `gpg_key` (an OpenPGP public key),
/// the remote is made afresh and trusts that key alone; without one the URL
/// is replaced and the keys it already trusts are kept. libostree decides
/// where the remote lives (`/etc/ostree/remotes.d` on a booted system).
pub fn configure_remote(repo: &ostree::Repo, name: &str, url: &str, gpg_key: Option<&[u8]>) -> Result<()> {
    let options = glib::VariantDict::new(None);
    options.insert_value("gpg-verify", &true.to_variant());
    options.insert_value("gpg-verify-summary", &true.to_variant());
    let options = options.end();
    let change = |op: ostree::RepoRemoteChange, url: Option<&str>, options: Option<&glib::Variant>| {
        repo.remote_change(gio::File::NONE, op, name, url, options, gio::Cancellable::NONE)
            .with_context(|| format!("configuring ostree remote {name}"))
    };
    let Some(key) = gpg_key else {
        return change(ostree::RepoRemoteChange::Replace, Some(url), Some(&options));
    };
    gpg_public_key(key).map_err(anyhow::Error::msg)?;
    change(ostree::RepoRemoteChange::DeleteIfExists, None, None)?;
    change(ostree::RepoRemoteChange::Add, Some(url), Some(&options))?;
    let imported = import_every_key(repo, name, key)
        .with_context(|| format!("importing the GPG key of remote {name}"))?;
    if imported == 0 {
        bail!("the GPG key file of remote {name} holds no key libostree could import");
    }
    Ok(())
}

/// `ostree_repo_remote_gpg_import` of every key in `key`. The binding's
/// `key_ids: &[&str]` cannot pass NULL ("all keys"), and an empty list
/// imports none, so the call is made directly.
fn import_every_key(repo: &ostree::Repo, name: &str, key: &[u8]) -> Result<u32, glib::Error> {
    use glib::translate::{FromGlibPtrFull, ToGlibPtr};
    let stream = gio::MemoryInputStream::from_bytes(&glib::Bytes::from(key));
    let stream: &gio::InputStream = stream.upcast_ref();
    let repo_ptr: *mut ostree::ffi::OstreeRepo = repo.to_glib_none().0;
    let name_c = name.to_glib_none();
    let stream_ptr: *mut gio::ffi::GInputStream = stream.to_glib_none().0;
    let mut imported = 0;
    let mut error = std::ptr::null_mut();
    // SAFETY: every pointer comes from a live object or stash held for the
    // call; NULL key ids and cancellable are allowed by the API.
    unsafe {
        ostree::ffi::ostree_repo_remote_gpg_import(
            repo_ptr,
            name_c.0,
            stream_ptr,
            std::ptr::null(),
            &mut imported,
            std::ptr::null_mut(),
            &mut error,
        );
        if error.is_null() {
            Ok(imported)
        } else {
            Err(glib::Error::from_glib_full(error))
        }
    }
}

/// What a pull transferred, from libostree's progress accounting.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct PullReport {
    /// The commit the ref points to after the pull.
    pub checksum: String,
    pub bytes_transferred: u64,
    /// Objects fetched one by one (metadata and content).
    pub objects_fetched: u32,
    /// Static delta parts fetched, of those the delta has.
    pub delta_parts_fetched: u32,
    pub delta_parts_total: u32,
    /// libostree's own summary line.
    pub status: String,
}

/// Pulls `ref_name` from `remote` (static deltas used when the remote has
/// one) and returns what it cost. Refuses a remote that does not verify
/// GPG signatures: libostree then checks every commit it fetches.
pub fn pull_ref(repo: &ostree::Repo, remote: &str, ref_name: &str) -> Result<PullReport> {
    let verifies = repo
        .remote_get_gpg_verify(remote)
        .with_context(|| format!("reading the configuration of remote {remote}"))?;
    if !verifies {
        bail!("remote {remote} does not verify GPG signatures (gpg-verify=false); nothing is pulled from it");
    }
    let options = glib::VariantDict::new(None);
    options.insert_value("refs", &vec![ref_name.to_string()].to_variant());
    let progress = ostree::AsyncProgress::new();
    repo.pull_with_options(remote, &options.end(), Some(&progress), gio::Cancellable::NONE)
        .with_context(|| format!("pulling {ref_name} from remote {remote}"))?;
    progress.finish();
    let refspec = format!("{remote}:{ref_name}");
    let checksum =
        resolve(repo, &refspec)?.with_context(|| format!("{refspec} is missing after the pull"))?;
    Ok(PullReport {
        checksum,
        bytes_transferred: progress.uint64("bytes-transferred"),
        objects_fetched: progress.uint("fetched"),
        delta_parts_fetched: progress.uint("fetched-delta-parts"),
        delta_parts_total: progress.uint("total-delta-parts"),
        status: progress.status().map(|s| s.to_string()).unwrap_or_default(),
    })
}

/// Whether the commit's detached metadata holds a signature by `key_id`
/// (a fingerprint or key ID, matched on its trailing hex digits). libostree
/// reads the signatures; the issuer is known even without the public key.
pub fn signed_by(repo: &ostree::Repo, checksum: &str, key_id: &str) -> Result<bool> {
    if !has_gpg_signatures(repo, checksum)? {
        return Ok(false);
    }
    let result = repo
        .verify_commit_ext(checksum, gio::File::NONE, gio::File::NONE, gio::Cancellable::NONE)
        .with_context(|| format!("reading the signatures of commit {checksum}"))?;
    Ok((0..result.count_all()).any(|index| {
        let signature = result.all(index);
        [
            ostree::GpgSignatureAttr::Fingerprint,
            ostree::GpgSignatureAttr::FingerprintPrimary,
        ]
        .iter()
        .filter_map(|attr| signature.try_child_value(attr.into_glib() as usize))
        .filter_map(|value| value.str().map(str::to_string))
        .any(|issuer| same_key(&issuer, key_id))
    }))
}

fn has_gpg_signatures(repo: &ostree::Repo, checksum: &str) -> Result<bool> {
    let detached = repo
        .read_commit_detached_metadata(checksum, gio::Cancellable::NONE)
        .with_context(|| format!("reading detached metadata of {checksum}"))?;
    Ok(detached.is_some_and(|d| {
        glib::VariantDict::new(Some(&d))
            .lookup_value("ostree.gpgsigs", None)
            .is_some_and(|sigs| sigs.n_children() > 0)
    }))
}

/// Whether two key designations (fingerprints or key IDs, any case, with or
/// without `0x` and spaces) name the same key: one ends with the other.
pub fn same_key(a: &str, b: &str) -> bool {
    let normal = |k: &str| -> String {
        k.trim_start_matches("0x")
            .chars()
            .filter(|c| !c.is_whitespace())
            .collect::<String>()
            .to_uppercase()
    };
    let (a, b) = (normal(a), normal(b));
    !a.is_empty() && !b.is_empty() && (a.ends_with(&b) || b.ends_with(&a))
}

/// A commit as `inspect` shows it.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct CommitInfo {
    pub checksum: String,
    pub parent: Option<String>,
    pub subject: String,
    pub timestamp: u64,
    pub metadata: BTreeMap<String, serde_json::Value>,
    pub detached_metadata: BTreeMap<String, serde_json::Value>,
}

fn dict_to_json(dict: &glib::Variant) -> BTreeMap<String, serde_json::Value> {
    let mut out = BTreeMap::new();
    for entry in dict.iter() {
        let key = entry.child_value(0).str().unwrap_or_default().to_string();
        let value = entry.child_value(1);
        let value = value.as_variant().unwrap_or(value);
        out.insert(key, variant_to_json(&value));
    }
    out
}

/// Converts the variant types found in commit metadata to JSON.
pub fn variant_to_json(v: &glib::Variant) -> serde_json::Value {
    use serde_json::Value;
    match v.type_().as_str() {
        "s" | "o" | "g" => Value::String(v.str().unwrap_or_default().to_string()),
        "b" => Value::Bool(v.get::<bool>().unwrap_or_default()),
        "t" => v.get::<u64>().map_or(Value::Null, Into::into),
        "x" => v.get::<i64>().map_or(Value::Null, Into::into),
        "u" => v.get::<u32>().map_or(Value::Null, Into::into),
        "i" => v.get::<i32>().map_or(Value::Null, Into::into),
        "y" => v.get::<u8>().map_or(Value::Null, Into::into),
        "v" => v
            .as_variant()
            .map_or(Value::Null, |inner| variant_to_json(&inner)),
        "ay" => Value::String(format!("<{} bytes>", v.n_children())),
        "a{sv}" => Value::Object(dict_to_json(v).into_iter().collect()),
        t if t.starts_with('a') => Value::Array(v.iter().map(|c| variant_to_json(&c)).collect()),
        _ => Value::String(v.print(true).to_string()),
    }
}

/// Loads a commit by ref or checksum.
pub fn read_commit(repo: &ostree::Repo, rev: &str) -> Result<CommitInfo> {
    let checksum = resolve(repo, rev)?.with_context(|| format!("no ref or commit named {rev}"))?;
    let commit = repo
        .load_variant(ostree::ObjectType::Commit, &checksum)
        .with_context(|| format!("loading commit {checksum}"))?;
    let detached = repo
        .read_commit_detached_metadata(&checksum, gio::Cancellable::NONE)
        .with_context(|| format!("reading detached metadata of {checksum}"))?;
    Ok(CommitInfo {
        parent: ostree::commit_get_parent(&commit).map(|p| p.to_string()),
        subject: commit.child_value(3).str().unwrap_or_default().to_string(),
        timestamp: ostree::commit_get_timestamp(&commit),
        metadata: dict_to_json(&commit.child_value(0)),
        detached_metadata: detached.as_ref().map(dict_to_json).unwrap_or_default(),
        checksum,
    })
}

/// Packet tags of a transferable public key (RFC 9580, 10.1): signature (2),
/// public key (6), marker (10), trust (12), user ID (13), public subkey (14),
/// user attribute (17).
const PUBLIC_KEY_TAGS: [u8; 7] = [2, 6, 10, 12, 13, 14, 17];
const PUBLIC_KEY_TAG: u8 = 6;
const PUBLIC_BLOCK: &str = "PGP PUBLIC KEY BLOCK";
const NOT_A_PUBLIC_KEY: &str = "the key file is not an OpenPGP public key (`gpg --export --armor KEYID`)";

/// An OpenPGP public key, ASCII-armored or binary; never a private key.
/// Every packet is read (armored blocks decoded first): a secret key or
/// subkey packet anywhere, or a packet no public key holds, is refused.
pub fn gpg_public_key(data: &[u8]) -> Result<(), String> {
    if let Some(label) = crate::secrets::private_key_label(data) {
        return Err(format!(
            "the key file holds a private key (`{label}`): only the publisher's public key belongs here"
        ));
    }
    for stream in packet_streams(data)? {
        public_key_packets(&stream)?;
    }
    Ok(())
}

/// The packet streams of a key file: each armored public key block
/// decoded (the file then ASCII text with no other kind of block), else the
/// file itself when it starts with a packet header.
fn packet_streams(data: &[u8]) -> Result<Vec<Vec<u8>>, String> {
    let blocks = crate::secrets::openpgp_armored(data, PUBLIC_BLOCK)?;
    if blocks.is_empty() {
        let binary = data.first().is_some_and(|&b| b & 0x80 != 0);
        return binary
            .then(|| vec![data.to_vec()])
            .ok_or_else(|| NOT_A_PUBLIC_KEY.into());
    }
    let begin = format!("-----BEGIN {PUBLIC_BLOCK}-----");
    let other_block = data
        .split(|&b| b == b'\n')
        .map(<[u8]>::trim_ascii)
        .any(|line| line.starts_with(b"-----BEGIN ") && line != begin.as_bytes());
    if other_block || !data.is_ascii() {
        return Err(format!(
            "the key file holds more than `{PUBLIC_BLOCK}` armor (another block, or bytes that are not ASCII text): only the publisher's public key belongs here"
        ));
    }
    Ok(blocks)
}

/// Refuses a packet stream that is not a public key: a secret key or
/// subkey packet anywhere is named as private key material.
fn public_key_packets(stream: &[u8]) -> Result<(), String> {
    use crate::secrets::{OPENPGP_SECRET_TAGS, openpgp_packets};
    let read = openpgp_packets(stream);
    let packets = read.packets;
    if let Some(secret) = packets.iter().find(|p| OPENPGP_SECRET_TAGS.contains(&p.tag)) {
        return Err(format!(
            "the key file holds a private key (an OpenPGP secret key packet, tag {}, at byte {}): only the publisher's public key belongs here",
            secret.tag, secret.offset
        ));
    }
    if let Some(at) = read.unreadable {
        return Err(format!("{NOT_A_PUBLIC_KEY}: byte {at} starts no OpenPGP packet"));
    }
    if packets.first().map(|p| p.tag) != Some(PUBLIC_KEY_TAG) {
        return Err(NOT_A_PUBLIC_KEY.into());
    }
    match packets.iter().find(|p| !PUBLIC_KEY_TAGS.contains(&p.tag)) {
        Some(other) => Err(format!(
            "{NOT_A_PUBLIC_KEY}: the packet at byte {} (tag {}) is no part of a public key",
            other.offset, other.tag
        )),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_public_openpgp_keys() {
        gpg_public_key(
            b"-----BEGIN PGP PUBLIC KEY BLOCK-----\n\nmQINBF\n-----END PGP PUBLIC KEY BLOCK-----\n",
        )
        .unwrap();
        gpg_public_key(&[0x99, 0x01, 0x0d, 0x04]).unwrap();
        gpg_public_key(&[0xc6, 0x33, 0x04]).unwrap();
        let private = gpg_public_key(b"-----BEGIN PGP PRIVATE KEY BLOCK-----\n\nlQ\n").unwrap_err();
        assert!(private.contains("private key"), "{private}");
        for bad in [&b""[..], b"hello", b"ssh-ed25519 AAAA", &[0x95, 0x01]] {
            assert!(gpg_public_key(bad).is_err(), "{bad:?}");
        }
    }

    /// A public key packet (tag 6, old format, one-octet length) with a
    /// version-4 body stub.
    const PUBLIC: [u8; 4] = [0x98, 2, 4, 0];
    const USER_ID: [u8; 4] = [0xb4, 2, b'i', b'd'];

    fn private(data: &[u8]) -> String {
        let e = gpg_public_key(data).expect_err("a private key must be refused");
        assert!(e.contains("private key"), "{data:02x?}: {e}");
        e
    }

    #[test]
    fn binary_secret_key_packets_are_refused_as_private_keys() {
        // Secret key (5) and secret subkey (7), old format (each length type) and new.
        for first in [0x94, 0x95, 0x96, 0x97, 0xc5, 0x9c, 0x9d, 0x9e, 0x9f, 0xc7] {
            private(&[first, 0, 0, 0, 0, 0]);
        }
        assert!(private(&[0xc5, 1, 4]).contains("tag 5, at byte 0"));
    }

    #[test]
    fn a_public_key_followed_by_a_secret_subkey_is_refused() {
        let with = |tail: &[u8]| [&PUBLIC[..], &USER_ID, tail].concat();
        gpg_public_key(&with(&[0xce, 1, 4])).unwrap();
        assert!(private(&with(&[0x9c, 1, 4])).contains("tag 7, at byte 8"));
        assert!(private(&with(&[0xc7, 1, 4])).contains("tag 7, at byte 8"));
        // Behind a two-octet, a five-octet and a partial length.
        private(&[&PUBLIC[..], &[0xcd, 192, 0], &[b'u'; 192], &[0xc7, 0]].concat());
        private(&[&PUBLIC[..], &[0xcd, 255, 0, 0, 0, 1, b'u', 0xc7, 0]].concat());
        private(&[&PUBLIC[..], &[0xcd, 0xe0, b'u', 1, b'v', 0x9d, 0, 0]].concat());
    }

    #[test]
    fn an_armored_public_block_is_read_down_to_its_packets() {
        let armor = |body: &str| {
            format!("-----BEGIN PGP PUBLIC KEY BLOCK-----\n\n{body}\n-----END PGP PUBLIC KEY BLOCK-----\n")
        };
        // `mAIEAA==`: [`PUBLIC`]; `mAIEAJwBBA==`: it and a secret subkey packet.
        gpg_public_key(armor("mAIEAA==").as_bytes()).unwrap();
        assert!(private(armor("mAIEAJwBBA==").as_bytes()).contains("tag 7, at byte 4"));
        // Binary packets or another armor beside the public block are refused.
        let mut beside = armor("mAIEAA==").into_bytes();
        beside.extend([0x95, 1, 4]);
        assert!(gpg_public_key(&beside).is_err());
        let message = format!("{}-----BEGIN PGP MESSAGE-----\nowE=\n", armor("mAIEAA=="));
        assert!(
            gpg_public_key(message.as_bytes())
                .unwrap_err()
                .contains("more than")
        );
        // A compressed packet could carry anything: only key packets pass.
        let compressed = gpg_public_key(&[&PUBLIC[..], &[0xc8, 1, 0]].concat()).unwrap_err();
        assert!(compressed.contains("tag 8"), "{compressed}");
    }
}
