//! `imgbuild site`: a static release site from an ostree repo and the
//! records beside its commits. Every page works from `file://` and from
//! any web server, loads nothing from anywhere, and runs no script.
//!
//! The site is written whole into a new directory beside `--out` and then
//! put in its place; an existing `--out` is replaced only when it holds a
//! site imgbuild wrote (its `.imgbuild-site` mark).

pub mod html;
pub mod model;
pub mod pages;
pub mod plot;

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use emberrtos_contract::error::BadInput;

use crate::cache::remote::Trust;
use crate::cve::DataSource;
use crate::transport::Transport;
use crate::ui::Ui;

/// The file that marks a directory as a site imgbuild wrote.
pub const MARK: &str = ".imgbuild-site";

pub struct SiteRequest {
    pub repo: PathBuf,
    pub out: PathBuf,
    /// The OpenPGP public key commits and records must be signed by.
    pub trust_key: PathBuf,
    /// Vulnerability data for the changes, when asked for.
    pub cve: Option<DataSource>,
}

/// What was written.
#[derive(Clone, Debug, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct SiteReport {
    pub out: String,
    pub pages: usize,
    pub bytes: u64,
    pub refs: usize,
    pub commits: usize,
    pub records: usize,
    /// Commits, records and promotions whose signature was not good by the key.
    pub not_authentic: usize,
    pub seconds: f64,
}

/// Builds the site of `request.repo` into `request.out`.
pub fn build(request: &SiteRequest, ui: &Ui) -> Result<SiteReport> {
    let started = Instant::now();
    let trust = Trust::pinned(&request.trust_key).map_err(|e| BadInput::new("--trust-key", e))?;
    check_out(&request.out)?;
    let site = model::gather(&request.repo, &trust, request.cve.as_ref(), ui)?;
    let files = pages::render(&site);
    pages::check_unique(&files)?;
    let bytes = files.iter().map(|(_, text)| text.len() as u64).sum();
    write_site(&request.out, &files)?;
    Ok(SiteReport {
        out: request.out.display().to_string(),
        pages: files.len(),
        bytes,
        refs: site.refs.len(),
        commits: site.commits.len(),
        records: site.commits.values().map(|c| c.records.len()).sum(),
        not_authentic: not_authentic(&site),
        seconds: started.elapsed().as_secs_f64(),
    })
}

fn not_authentic(site: &model::Site) -> usize {
    use model::Authenticity::Authentic;
    site.commits
        .values()
        .map(|c| {
            usize::from(c.signature != Authentic)
                + c.records.iter().filter(|r| r.authenticity != Authentic).count()
                + c.promotions
                    .iter()
                    .filter(|p| p.authenticity != Authentic)
                    .count()
        })
        .sum()
}

/// Refuses an `--out` that is something other than a site imgbuild wrote.
fn check_out(out: &Path) -> Result<()> {
    let bad = |message: &str| BadInput::new("--out", format!("{}: {message}", out.display()));
    match std::fs::symlink_metadata(out) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(bad(&e.to_string()).into()),
        Ok(meta) if !meta.is_dir() => Err(bad("exists and is not a directory").into()),
        Ok(_) if !out.join(MARK).is_file() => Err(bad(
            "exists and is not a site imgbuild wrote (no .imgbuild-site in it); nothing was written",
        )
        .into()),
        Ok(_) => Ok(()),
    }
}

/// Writes `files` into a new directory beside `out`, then puts it in
/// `out`'s place; the old site goes only once the new one is whole, and
/// only when it is still a site imgbuild wrote.
fn write_site(out: &Path, files: &[pages::SiteFile]) -> Result<()> {
    let parent = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&parent).with_context(|| format!("creating {}", parent.display()))?;
    let name = out
        .file_name()
        .context("--out names no directory")?
        .to_string_lossy();
    let staging = tempfile::Builder::new()
        .prefix(&format!(".{name}.new-"))
        .tempdir_in(&parent)
        .with_context(|| format!("creating a directory in {}", parent.display()))?;
    for (rel, text) in files {
        write_synced(&staging.path().join(rel), text.as_bytes())?;
    }
    write_synced(&staging.path().join(MARK), b"written by imgbuild site\n")?;
    // Checked again: something may have taken --out's place meanwhile.
    check_out(out)?;
    let aside = tempfile::Builder::new()
        .prefix(&format!(".{name}.old-"))
        .tempdir_in(&parent)
        .with_context(|| format!("creating a directory in {}", parent.display()))?;
    let moved = out.exists();
    if moved {
        // A rename onto the empty directory `aside` replaces it.
        std::fs::rename(out, aside.path())
            .with_context(|| format!("moving the old {} aside", out.display()))?;
    }
    if let Err(e) = std::fs::rename(staging.path(), out) {
        if moved {
            let _ = std::fs::rename(aside.path(), out);
        }
        bail!("putting the new site in {}: {e}", out.display());
    }
    let _ = staging.keep();
    aside.close().context("removing the old site")?;
    Ok(())
}

/// Writes `data` to `path` (making its directory) and syncs it: a power
/// cut cannot leave a marked site of empty pages.
fn write_synced(path: &Path, data: &[u8]) -> Result<()> {
    use std::io::Write;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let mut file = std::fs::File::create(path).with_context(|| format!("writing {}", path.display()))?;
    file.write_all(data)
        .and_then(|()| file.sync_all())
        .with_context(|| format!("writing {}", path.display()))
}

/// The publisher's own key as the site's trust (`publish --site`): what
/// signs the commits is what the pages check them against.
pub fn publisher_trust(key: &str, homedir: Option<&Path>) -> Result<Trust> {
    let public = crate::io::gpg::export_public(key, homedir)?;
    let file = tempfile::NamedTempFile::new().context("creating a temp file")?;
    std::fs::write(file.path(), public).context("writing the publisher's public key")?;
    Trust::pinned(file.path()).map_err(|e| anyhow::anyhow!(e))
}

/// `publish --site`: the site of `repo`, its signatures checked against
/// `trust`, under `site/` at the destination. The pages that link to the
/// others go last, so a reader never follows a link to a page not there.
pub fn publish_site(repo: &Path, transport: &dyn Transport, trust: &Trust, ui: &Ui) -> Result<usize> {
    let site = model::gather(repo, trust, None, ui)?;
    let mut files = pages::render(&site);
    pages::check_unique(&files)?;
    // Records, then the commits that link to them, then the two that link
    // to commits.
    files.sort_by_key(|(rel, _)| match rel.split('/').next() {
        Some("record") => 0,
        Some("commit") => 1,
        _ => 2,
    });
    transport.ensure_root()?;
    let _lock = transport.lock()?;
    let site_dir = Path::new("site");
    if transport.read(&site_dir.join(MARK))?.is_none()
        && transport.read(&site_dir.join("index.html"))?.is_some()
    {
        bail!(
            "{} serves a site/ that imgbuild did not write (no {MARK}): nothing was written there",
            transport.describe()
        );
    }
    for (rel, text) in &files {
        transport.put(&Path::new("site").join(rel), text.as_bytes())?;
    }
    transport.put(
        &Path::new("site").join(MARK),
        b"written by imgbuild publish --site\n",
    )?;
    transport.flush()?;
    Ok(files.len())
}

/// The report as text.
pub fn render(report: &SiteReport) -> String {
    format!(
        "site     {}\npages    {} ({} bytes)\nrefs     {}, {} commits, {} qualification records\nsigned   {} not authentic\ntook     {:.1} s\n",
        report.out,
        report.pages,
        report.bytes,
        report.refs,
        report.commits,
        report.records,
        report.not_authentic,
        report.seconds
    )
}
