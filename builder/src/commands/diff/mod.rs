//! `imgbuild diff`: what changed between two commits, read from the
//! committed trees themselves (dpkg status, kernel config, files), their
//! metadata (kargs, RT evidence) and the repo (the bytes to download).

pub mod compare;
pub mod download;
pub mod walk;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, Result, bail};
use serde::Serialize;

use crate::cve::DataSource;
use crate::ostree as ost;
use crate::sbom::MAX_TEXT_BYTES;
use crate::stages::commit;
use compare::{FileChanges, ListChange, PackageChanges, PackageVersions, SymbolChange};
use download::Download;
use emberrtos_contract::tree::{self, TreeEntry};

/// A commit keeps `/etc` at `/usr/etc` (ostree merges it into the
/// deployment's `/etc`): its files are listed as `etc/...`.
fn as_device_path(path: String) -> String {
    match path.strip_prefix("usr/etc") {
        Some(rest) if rest.is_empty() || rest.starts_with('/') => format!("etc{rest}"),
        _ => path,
    }
}

/// Every entry of the commit's whole tree (the top-level links and
/// directories too), by the path a deployment shows it at. A commit holding
/// both `/etc` and `/usr/etc`, which ostree refuses to deploy, is refused.
fn device_tree(root: &ostree::gio::File) -> Result<BTreeMap<String, TreeEntry>> {
    let entries = walk::walk(root, walk::MAX_DEPTH)?;
    if entries.contains_key("etc") && entries.contains_key("usr/etc") {
        bail!("the commit holds both /etc and /usr/etc, which ostree refuses to deploy");
    }
    Ok(entries
        .into_iter()
        .map(|(path, entry)| (as_device_path(path), entry))
        .collect())
}

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct Side {
    pub checksum: String,
    /// The machine the commit is for (`imgbuild.arch`).
    pub arch: rtcheck::Arch,
    pub version: Option<String>,
    pub kernel_release: Option<String>,
    /// Each RT check's status (`pass`, `fail`, `skip`), boot evidence included.
    pub rt_evidence: BTreeMap<String, String>,
}

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct CommitDiff {
    pub from: Side,
    pub to: Side,
    pub packages: PackageChanges,
    pub kernel_symbols: Vec<SymbolChange>,
    pub kargs: ListChange,
    /// By group (`usr/bin`, `etc/ssh`, `lib64`, ...), over the whole tree.
    pub files: BTreeMap<String, FileChanges>,
    /// The most names listed per group and kind; 0 lists all.
    pub files_per_group: usize,
    pub download: Download,
    /// Known vulnerabilities fixed and introduced, when a tracker export was given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cve: Option<crate::cve::changes::CveChanges>,
}

/// One commit's facts, read out of it.
struct Facts {
    side: Side,
    kargs: Vec<String>,
    packages: PackageVersions,
    config: rtcheck::kconfig::Config,
    files: BTreeMap<String, TreeEntry>,
}

fn read_facts(repo: &ostree::Repo, rev: &str) -> Result<Facts> {
    let info = ost::read_commit(repo, rev)?;
    let (root, checksum) = tree::commit_root(repo, &info.checksum)?;
    let text = |key: &str| {
        info.metadata
            .get(key)
            .and_then(|v| v.as_str())
            .map(str::to_string)
    };
    let release = text(commit::key::KERNEL_RELEASE);
    let status_text = crate::sbom::dpkg::STATUS_PATHS
        .iter()
        .find_map(|path| tree::read_regular(&root, path, MAX_TEXT_BYTES).transpose())
        .transpose()?
        .with_context(|| format!("commit {checksum} has no dpkg status"))?;
    let status_text = String::from_utf8(status_text)
        .with_context(|| format!("commit {checksum}: dpkg status is not UTF-8"))?;
    let packages = crate::sbom::dpkg::parse_status(&status_text)
        .with_context(|| format!("commit {checksum}: dpkg status"))?
        .into_iter()
        .map(|p| ((p.name, p.architecture), p.version))
        .collect();
    let release_dir = format!(
        "usr/lib/modules/{}",
        release
            .as_deref()
            .with_context(|| format!("commit {checksum} records no {}", commit::key::KERNEL_RELEASE))?
    );
    let config_text = tree::read_regular(&root, &format!("{release_dir}/config"), MAX_TEXT_BYTES)?
        .with_context(|| format!("commit {checksum} has no /{release_dir}/config"))?;
    let config_text = String::from_utf8(config_text)
        .with_context(|| format!("commit {checksum}: /{release_dir}/config is not UTF-8"))?;
    let config = rtcheck::kconfig::Config::parse(&config_text)
        .with_context(|| format!("commit {checksum}: /{release_dir}/config"))?;
    let files = device_tree(&root).with_context(|| format!("commit {checksum}"))?;
    let rt_evidence = commit::full_evidence(&info)
        .map(|e| {
            e.checks
                .iter()
                .map(|c| (c.id.clone(), c.status.to_string().to_lowercase()))
                .collect()
        })
        .unwrap_or_default();
    Ok(Facts {
        kargs: commit::kargs_of(&info)?,
        side: Side {
            arch: commit::arch_of(&info)?,
            checksum,
            version: text(commit::key::VERSION),
            kernel_release: release,
            rt_evidence,
        },
        packages,
        config,
        files,
    })
}

/// Compares commit `from` with commit `to` (refs or checksums) in the repo
/// at `path`, naming at most `files_per_group` files of each kind per group
/// (0: all).
/// The diff of `from` and `to` in the repo at `path`; with `cve`, also
/// the known vulnerabilities it fixes and introduces, by that data.
pub fn diff(
    path: &Path,
    from: &str,
    to: &str,
    files_per_group: usize,
    cve: Option<&DataSource>,
) -> Result<CommitDiff> {
    let repo = ost::open(path)?;
    let a = read_facts(&repo, from).with_context(|| format!("reading {from}"))?;
    let b = read_facts(&repo, to).with_context(|| format!("reading {to}"))?;
    let mut files = compare::files(&a.files, &b.files);
    compare::limit_names(&mut files, files_per_group);
    let cve = match cve {
        Some(data) => Some(cve_changes(&repo, data, &a.side.checksum, &b.side.checksum)?),
        None => None,
    };
    Ok(CommitDiff {
        cve,
        packages: compare::packages(&a.packages, &b.packages),
        kernel_symbols: compare::config_symbols(&a.config, &b.config),
        kargs: compare::kargs(&a.kargs, &b.kargs),
        files,
        files_per_group,
        download: download::download(&repo, path, &a.side.checksum, &b.side.checksum)?,
        from: a.side,
        to: b.side,
    })
}

fn cve_changes(
    repo: &ostree::Repo,
    data: &DataSource,
    from: &str,
    to: &str,
) -> Result<crate::cve::changes::CveChanges> {
    let reports = crate::cve::reports_of_commits(repo, &[from, to], data, None)?;
    let [before, after] = reports.as_slice() else {
        unreachable!("two commits give two reports")
    };
    if before.database.sha256 != after.database.sha256 {
        anyhow::bail!(
            "{} changed while it was read (sha256 {} then {}): run again",
            before.database.source,
            before.database.sha256,
            after.database.sha256
        );
    }
    Ok(crate::cve::changes::changes(before, after))
}

fn render_side(out: &mut String, label: &str, side: &Side) {
    let failed: Vec<&str> = side
        .rt_evidence
        .iter()
        .filter(|(_, status)| status.as_str() == "fail")
        .map(|(id, _)| id.as_str())
        .collect();
    let passed = side.rt_evidence.values().filter(|s| s.as_str() == "pass").count();
    let _ = writeln!(
        out,
        "{label:<5} {} {} version {} kernel {}; RT evidence: {passed} of {} checks pass{}",
        side.checksum,
        side.arch,
        side.version.as_deref().unwrap_or("?"),
        side.kernel_release.as_deref().unwrap_or("?"),
        side.rt_evidence.len(),
        if failed.is_empty() {
            String::new()
        } else {
            format!(", failed: {}", failed.join(", "))
        }
    );
}

fn render_packages(out: &mut String, changes: &PackageChanges) {
    for p in &changes.added {
        let _ = writeln!(out, "  + {} {} ({})", p.name, p.version, p.architecture);
    }
    for p in &changes.removed {
        let _ = writeln!(out, "  - {} {} ({})", p.name, p.version, p.architecture);
    }
    for (label, list) in [("up", &changes.upgraded), ("down", &changes.downgraded)] {
        for c in list {
            let _ = writeln!(
                out,
                "  {label} {} {} -> {} ({})",
                c.name, c.from, c.to, c.architecture
            );
        }
    }
}

/// One group's counts, then its names: `+` added, `-` removed, `~` changed,
/// and what the limit left out.
fn render_group(out: &mut String, group: &str, f: &FileChanges) {
    let _ = writeln!(
        out,
        "  /{}: {} added, {} removed, {} changed",
        group.escape_debug(),
        f.added.len() + f.omitted.added,
        f.removed.len() + f.omitted.removed,
        f.changed.len() + f.omitted.changed
    );
    for (mark, names, omitted, kind) in [
        ('+', &f.added, f.omitted.added, "added"),
        ('-', &f.removed, f.omitted.removed, "removed"),
        ('~', &f.changed, f.omitted.changed, "changed"),
    ] {
        // A commit's names reach the terminal: control characters and
        // bidirectional overrides are shown escaped, never interpreted.
        for path in names {
            let _ = writeln!(out, "    {mark} /{}", path.escape_debug());
        }
        if omitted > 0 {
            let _ = writeln!(
                out,
                "    {mark} ... and {omitted} more {kind} (--files-per-group 0 lists them all)"
            );
        }
    }
}

/// The diff as `imgbuild diff` prints it.
pub fn render(diff: &CommitDiff) -> String {
    let mut out = String::new();
    render_side(&mut out, "from", &diff.from);
    render_side(&mut out, "to", &diff.to);
    let p = &diff.packages;
    let _ = writeln!(
        out,
        "packages: {} added, {} removed, {} upgraded, {} downgraded",
        p.added.len(),
        p.removed.len(),
        p.upgraded.len(),
        p.downgraded.len()
    );
    render_packages(&mut out, p);
    let _ = writeln!(
        out,
        "kernel config: {} symbols changed",
        diff.kernel_symbols.len()
    );
    for s in &diff.kernel_symbols {
        let value = |v: &Option<String>| v.clone().unwrap_or_else(|| "(absent)".into());
        let _ = writeln!(out, "  {}: {} -> {}", s.symbol, value(&s.from), value(&s.to));
    }
    let _ = writeln!(
        out,
        "kargs: added {:?}, removed {:?}",
        diff.kargs.added, diff.kargs.removed
    );
    let _ = writeln!(out, "files in the whole tree (/usr/etc as /etc):");
    for (group, f) in &diff.files {
        render_group(&mut out, group, f);
    }
    let d = &diff.download;
    let percent = if d.full_pull_bytes == 0 {
        0.0
    } else {
        100.0 * d.bytes as f64 / d.full_pull_bytes as f64
    };
    let _ = writeln!(
        out,
        "download: {} bytes by {} ({percent:.1} % of a full pull of {} bytes)",
        d.bytes, d.by, d.full_pull_bytes
    );
    if let Some(cve) = &diff.cve {
        out.push_str(&crate::cve::changes::render(cve));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use compare::Omitted;

    #[test]
    fn a_group_names_its_files_counts_the_rest_and_escapes_what_a_terminal_would_run() {
        let group = FileChanges {
            added: vec![
                "etc/emberrtos/site.conf".into(),
                "etc/emberrtos/\u{1b}[2Jx".into(),
            ],
            removed: vec!["etc/emberrtos/old".into()],
            changed: vec!["etc/emberrtos/\u{202e}fdp.exe".into()],
            omitted: Omitted {
                added: 7,
                removed: 0,
                changed: 0,
            },
        };
        let mut out = String::new();
        render_group(&mut out, "etc/emberrtos", &group);
        assert_eq!(
            out,
            "  /etc/emberrtos: 9 added, 1 removed, 1 changed\n\
             \x20   + /etc/emberrtos/site.conf\n\
             \x20   + /etc/emberrtos/\\u{1b}[2Jx\n\
             \x20   + ... and 7 more added (--files-per-group 0 lists them all)\n\
             \x20   - /etc/emberrtos/old\n\
             \x20   ~ /etc/emberrtos/\\u{202e}fdp.exe\n"
        );
    }
}
