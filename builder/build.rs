//! Records the git commit imgbuild is built from (`imgbuild --version`):
//! `$IMGBUILD_GIT_COMMIT` when set (a build from a source tarball), else
//! `git rev-parse HEAD` of the checkout, else `unknown`.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    println!("cargo::rerun-if-env-changed=IMGBUILD_GIT_COMMIT");
    let commit = std::env::var("IMGBUILD_GIT_COMMIT")
        .ok()
        .filter(|c| !c.is_empty())
        .or_else(|| git(&["rev-parse", "HEAD"]))
        .unwrap_or_else(|| "unknown".to_string());
    for path in files_that_move_head() {
        println!("cargo::rerun-if-changed={}", path.display());
    }
    println!("cargo::rustc-env=IMGBUILD_GIT_COMMIT={commit}");
}

/// `git ARGS` in this crate's directory, its stdout trimmed, or None.
fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    (out.status.success() && !text.trim().is_empty()).then(|| text.trim().to_string())
}

/// HEAD, the branch file it names and packed-refs: the files a commit or a
/// checkout rewrites. Only existing ones (cargo reruns on a missing one
/// every time).
fn files_that_move_head() -> Vec<PathBuf> {
    let Some(git_dir) = git(&["rev-parse", "--absolute-git-dir"]) else {
        return Vec::new();
    };
    let git_dir = Path::new(&git_dir);
    let mut files = vec![git_dir.join("HEAD"), git_dir.join("packed-refs")];
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
        files.push(git_dir.join(branch));
    }
    files.retain(|f| f.is_file());
    files
}
