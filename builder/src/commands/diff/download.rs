//! The bytes a device downloads to go from one commit to another: the
//! static delta's size when the repo has one, else the objects it lacks.

use std::path::Path;

use anyhow::{Context, Result, bail};
use serde::Serialize;

use crate::commands::publish::{delta_dir, objects_bytes};

#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub struct Download {
    /// What a device fetches: the delta's parts and fallback objects (what
    /// `ostree static-delta show` calls Total Size), else the new objects.
    pub bytes: u64,
    /// `static-delta` or `new-objects`.
    pub by: &'static str,
    /// The delta's superblock, fetched besides (0 without a delta).
    pub superblock_bytes: u64,
    /// Every object of the new commit: a pull from nothing.
    pub full_pull_bytes: u64,
}

const SUPERBLOCK_TYPE: &str = "(a{sv}tayay(a{sv}aya(say)sstayay)aya(uayttay)a(yaytt))";

/// Total Size of the delta superblock from `from` to `to`: its parts'
/// compressed sizes plus its fallback objects', in the delta's byte order.
pub fn delta_total_size(superblock: &[u8], from: &str, to: &str) -> Result<u64> {
    let ty = glib::VariantTy::new(SUPERBLOCK_TYPE).expect("valid type");
    let variant = glib::Variant::from_bytes_with_type(&glib::Bytes::from(superblock), ty);
    if !variant.is_normal_form() {
        bail!("not a static delta superblock");
    }
    let checksum_at = |i: usize| hex::encode(variant.child_value(i).data());
    if checksum_at(2) != from || checksum_at(3) != to {
        bail!(
            "the delta goes from {} to {}, not from {from} to {to}",
            checksum_at(2),
            checksum_at(3)
        );
    }
    let metadata = glib::VariantDict::new(Some(&variant.child_value(0)));
    let swap = match metadata
        .lookup_value("ostree.endianness", None)
        .and_then(|v| v.get::<u8>())
    {
        Some(b'B') => cfg!(target_endian = "little"),
        Some(b'l') => cfg!(target_endian = "big"),
        None => false,
        Some(other) => bail!("the delta's endianness {other:?} is neither 'l' nor 'B'"),
    };
    let order = |n: u64| if swap { n.swap_bytes() } else { n };
    let mut total = 0u64;
    for list in [variant.child_value(6), variant.child_value(7)] {
        for entry in list.iter() {
            let size = order(entry.child_value(2).get::<u64>().unwrap_or(0));
            total = total.checked_add(size).context("the delta's sizes overflow")?;
        }
    }
    Ok(total)
}

/// What a device with `from` downloads to get `to` from the archive repo at `path`.
pub fn download(repo: &ostree::Repo, path: &Path, from: &str, to: &str) -> Result<Download> {
    let full_pull_bytes = objects_bytes(repo, path, None, to)?;
    let superblock = path.join(delta_dir(Some(from), to)?).join("superblock");
    // A link in a repo's deltas is not followed.
    if std::fs::symlink_metadata(&superblock).is_ok_and(|m| m.is_file()) {
        let bytes =
            std::fs::read(&superblock).with_context(|| format!("reading {}", superblock.display()))?;
        return Ok(Download {
            bytes: delta_total_size(&bytes, from, to).with_context(|| superblock.display().to_string())?,
            by: "static-delta",
            superblock_bytes: bytes.len() as u64,
            full_pull_bytes,
        });
    }
    Ok(Download {
        bytes: objects_bytes(repo, path, Some(from), to)?,
        by: "new-objects",
        superblock_bytes: 0,
        full_pull_bytes,
    })
}
