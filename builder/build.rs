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
        .unwrap_or_else(|| {
            if Path::new(env!("CARGO_MANIFEST_DIR")).join("../.git").exists() {
                println!("cargo::warning=git cannot read this checkout (its owner?); --version will say commit unknown");
            }
            "unknown".to_string()
        });
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

/// The files a commit, checkout, reset or `git gc` rewrites: HEAD, its
/// reflog, packed-refs and the branch refs (a directory: cargo looks at
/// everything in it), at the paths git gives for them (in a linked worktree
/// the refs live in the common dir). Only existing ones: cargo reruns on a
/// missing one every time.
fn files_that_move_head() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = ["HEAD", "logs/HEAD", "packed-refs", "refs/heads"]
        .iter()
        .filter_map(|name| git(&["rev-parse", "--path-format=absolute", "--git-path", name]))
        .map(PathBuf::from)
        .collect();
    files.retain(|f| f.exists());
    files
}
