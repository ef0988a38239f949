//! Outputs must not collide with inputs: a `live.iso` equal to the recipe's
//! own path overwrote the recipe. Two paths collide when they are equal or
//! one lies inside the other (an input inside an output dir, an output
//! inside an input dir). Outputs must not collide with each other either.

use std::path::{Path, PathBuf};

use super::{ConfigBase, Recipe, RecipeError, RootfsBase, Source, normalize};

/// A path the recipe names, with the field that names it.
struct Named {
    field: String,
    path: PathBuf,
}

fn named(field: impl Into<String>, path: &Path) -> Named {
    Named {
        field: field.into(),
        path: path.to_path_buf(),
    }
}

/// What the build writes.
fn outputs(recipe: &Recipe) -> Vec<Named> {
    let mut out = Vec::new();
    if let Some(repo) = &recipe.ostree.repo {
        out.push(named("ostree.repo", repo));
    }
    if let Some(iso) = &recipe.live.iso {
        out.push(named("live.iso", iso));
    }
    out
}

/// What the build reads.
fn inputs(recipe: &Recipe) -> Vec<Named> {
    let mut out = vec![named("the recipe itself", &normalize(&recipe.file))];
    if let Source::Path { path, .. } = &recipe.kernel.source {
        out.push(named("kernel.source.path", path));
    }
    if let ConfigBase::File(path) = &recipe.kernel.base {
        out.push(named("kernel.base", path));
    }
    for (i, path) in recipe.kernel.fragments.iter().enumerate() {
        out.push(named(format!("kernel.fragments[{i}]"), path));
    }
    if let RootfsBase::Tarball(Source::Path { path, .. }) = &recipe.rootfs.base {
        out.push(named("rootfs.base.path", path));
    }
    for (i, path) in recipe.rootfs.overlays.iter().enumerate() {
        out.push(named(format!("rootfs.overlays[{i}]"), path));
    }
    if let Some(home) = &recipe.ostree.gpg_homedir {
        out.push(named("ostree.gpg-homedir", home));
    }
    if let Some(rootfs) = &recipe.live.rootfs {
        out.push(named("live.rootfs", rootfs));
    }
    if let Some(remote) = recipe.disk.as_ref().and_then(|d| d.remote.as_ref()) {
        out.push(named("disk.remote.gpg-key", &remote.gpg_key));
    }
    out
}

fn collide(a: &Path, b: &Path) -> bool {
    a.starts_with(b) || b.starts_with(a)
}

/// The work dir, as an output the command line names.
pub(super) const WORK_DIR: &str = "the work dir";

/// Refuses the first output that collides with an input or an earlier
/// output. `view` maps each path first: identity for the lexical check,
/// [`real_path`] once the files exist. `work_dir`, when given, is checked
/// as one more output.
pub(super) fn check(
    recipe: &Recipe,
    work_dir: Option<&Path>,
    view: impl Fn(&Path) -> PathBuf,
    error: impl Fn(&str, String) -> RecipeError,
) -> Result<(), RecipeError> {
    let inputs: Vec<Named> = inputs(recipe)
        .into_iter()
        .map(|n| named(n.field, &view(&n.path)))
        .collect();
    let outputs: Vec<Named> = work_dir
        .map(|dir| named(WORK_DIR, dir))
        .into_iter()
        .chain(outputs(recipe))
        .map(|n| named(n.field, &view(&n.path)))
        .collect();
    for (i, output) in outputs.iter().enumerate() {
        let earlier = &outputs[..i];
        for other in inputs.iter().chain(earlier) {
            // The default outputs live in the work dir; an explicit one may too.
            let inside_work_dir = other.field == WORK_DIR && output.path != other.path;
            if collide(&output.path, &other.path)
                && !(inside_work_dir && output.path.starts_with(&other.path))
            {
                return Err(error(&output.field, collision_message(output, other)));
            }
        }
    }
    Ok(())
}

fn collision_message(output: &Named, other: &Named) -> String {
    let how = if output.path == other.path {
        "is the same path as"
    } else if output.path.starts_with(&other.path) {
        "lies inside"
    } else {
        "contains"
    };
    format!(
        "the output {} ({}) {how} `{}` ({}): outputs must not overwrite, contain or sit inside inputs or other outputs",
        output.field,
        output.path.display(),
        other.field,
        other.path.display()
    )
}

/// `path` with symlinks resolved as far as it exists; the rest appended.
pub(super) fn real_path(path: &Path) -> PathBuf {
    let mut missing = Vec::new();
    let mut existing = path;
    loop {
        let probe = if existing.as_os_str().is_empty() {
            Path::new(".")
        } else {
            existing
        };
        if let Ok(real) = probe.canonicalize() {
            return missing.iter().rev().fold(real, |acc, name| acc.join(name));
        }
        match (existing.parent(), existing.file_name()) {
            (Some(parent), Some(name)) => {
                missing.push(name);
                existing = parent;
            }
            _ => return path.to_path_buf(),
        }
    }
}
