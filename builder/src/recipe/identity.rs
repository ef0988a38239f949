//! What defines an image, as a hash: `imgbuild.recipe-sha256` in the commit.
//!
//! Hashes a canonical serde serialization of the parts of the recipe that
//! define the image, not the recipe text. Left out: where outputs go
//! (`ostree.repo`, `live.iso`), how the commit is signed (`gpg-key`,
//! `gpg-homedir`), comments and formatting. Input paths count as written in
//! the recipe (relative to it), so the same checkout anywhere on disk gives
//! the same value; their contents are pinned by the stages' own cache keys.

use std::path::{Path, PathBuf};

use serde::Serialize;

use super::{ConfigBase, Flavor, Kernel, RawRecipe, Recipe, Rootfs, RootfsBase, Source, normalize};
use crate::io::hashing::sha256_hex;
use emberrtos_contract::policy::HealthPolicy;

/// Bumped whenever the serialization below changes meaning.
const SCHEMA: u32 = 2;

#[derive(Serialize)]
#[serde(rename_all = "kebab-case")]
struct ImageDefinition<'a> {
    schema: u32,
    name: &'a str,
    version: &'a str,
    flavor: Flavor,
    /// Left out for x86_64, so the images from before `arch:` keep their hash.
    #[serde(skip_serializing_if = "Option::is_none")]
    arch: Option<rtcheck::Arch>,
    source_date_epoch: Option<u64>,
    kernel: Kernel,
    rootfs: Rootfs,
    ostree_ref: &'a str,
    /// What the commits ask of their trial boots (`device:`, `rt:`).
    health: HealthPolicy,
    live: LiveDefinition<'a>,
}

#[derive(Serialize)]
#[serde(rename_all = "kebab-case")]
struct LiveDefinition<'a> {
    ssh_authorized_keys: &'a [String],
    packages: &'a [String],
    rootfs: Option<PathBuf>,
}

/// A path as the recipe wrote it, `.` and `..` folded.
fn written(path: &str) -> PathBuf {
    normalize(Path::new(path))
}

fn written_source(source: &Source, raw_path: Option<&str>) -> Source {
    match (source, raw_path) {
        (Source::Path { sha256, .. }, Some(path)) => Source::Path {
            path: written(path),
            sha256: sha256.clone(),
        },
        _ => source.clone(),
    }
}

fn kernel_as_written(kernel: &Kernel, raw: &RawRecipe) -> Kernel {
    Kernel {
        source: written_source(&kernel.source, raw.kernel.source.path.as_deref()),
        base: match &kernel.base {
            ConfigBase::File(_) => ConfigBase::File(written(&raw.kernel.base)),
            target => target.clone(),
        },
        fragments: raw.kernel.fragments.iter().map(|f| written(f)).collect(),
        ..kernel.clone()
    }
}

fn rootfs_as_written(rootfs: &Rootfs, raw: &RawRecipe) -> Rootfs {
    Rootfs {
        base: match &rootfs.base {
            RootfsBase::Tarball(source) => {
                RootfsBase::Tarball(written_source(source, raw.rootfs.base.path.as_deref()))
            }
            debian => debian.clone(),
        },
        overlays: raw.rootfs.overlays.iter().map(|o| written(o)).collect(),
    }
}

/// The image hash of a validated recipe.
pub(super) fn image_sha256(recipe: &Recipe) -> String {
    let raw = &recipe.raw;
    let definition = ImageDefinition {
        schema: SCHEMA,
        name: &recipe.name,
        version: &recipe.version,
        flavor: recipe.flavor,
        arch: (recipe.arch != rtcheck::Arch::X86_64).then_some(recipe.arch),
        source_date_epoch: recipe.source_date_epoch,
        kernel: kernel_as_written(&recipe.kernel, raw),
        rootfs: rootfs_as_written(&recipe.rootfs, raw),
        ostree_ref: &recipe.ostree.ref_name,
        health: recipe.health,
        live: LiveDefinition {
            ssh_authorized_keys: &recipe.live.ssh_authorized_keys,
            packages: &recipe.live.packages,
            rootfs: raw.live.as_ref().and_then(|l| l.rootfs.as_deref()).map(written),
        },
    };
    let canonical = serde_json::to_vec(&definition).expect("the image definition serializes");
    sha256_hex(canonical)
}
