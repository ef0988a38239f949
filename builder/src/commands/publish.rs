//! `imgbuild publish`: copies tagged commits from the local archive repo to
//! an ostree remote's web root in an order that never lets a client see a
//! ref to missing content: objects, then static deltas, then refs, then the
//! (signed) summary. Every file is written to a temp name and renamed.

use std::collections::BTreeSet;
use std::fmt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use glib::prelude::*;
use ostree::gio;
use serde::{Deserialize, Serialize};

use crate::error::Refused;
use crate::ostree as ost;
use crate::stages::commit;
use crate::stages::tag;
use crate::ui::Ui;

/// How files reach the remote. `LocalDir` serves `file://` and plain paths;
/// an rsync-over-ssh transport can implement the same operations.
pub trait Transport {
    fn describe(&self) -> String;
    /// Makes DEST an archive repo if it is not one yet.
    fn ensure_repo(&self) -> Result<()>;
    fn exists(&self, rel: &Path) -> Result<bool>;
    fn read(&self, rel: &Path) -> Result<Option<Vec<u8>>>;
    /// Writes `data` to `rel` atomically (temp name, then rename).
    fn put(&self, rel: &Path, data: &[u8]) -> Result<()>;
    /// Copies a local file to `rel` atomically.
    fn put_file(&self, rel: &Path, source: &Path) -> Result<()>;
    /// Regenerates the summary from what the remote holds, signing it when a key is given.
    fn update_summary(&self, gpg_key: Option<&str>, gpg_homedir: Option<&Path>) -> Result<()>;
}

/// A remote that is a directory on this machine (a web root).
pub struct LocalDir {
    pub root: PathBuf,
}

impl LocalDir {
    /// Accepts a path or a `file://` URL.
    pub fn parse(dest: &str) -> Result<LocalDir> {
        if let Some(path) = dest.strip_prefix("file://") {
            return Ok(LocalDir {
                root: PathBuf::from(path),
            });
        }
        if dest.contains("://") {
            bail!(
                "unsupported destination {dest:?}: use a directory path or file:// (ssh:// is not supported yet)"
            );
        }
        Ok(LocalDir {
            root: PathBuf::from(dest),
        })
    }

    fn temp_in(&self, rel: &Path) -> Result<tempfile::NamedTempFile> {
        let dir = self.root.join(rel.parent().unwrap_or(Path::new("")));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        tempfile::Builder::new()
            .prefix(".publish-")
            .tempfile_in(&dir)
            .with_context(|| format!("creating a temp file in {}", dir.display()))
    }
}

impl Transport for LocalDir {
    fn describe(&self) -> String {
        format!("file://{}", self.root.display())
    }

    fn ensure_repo(&self) -> Result<()> {
        if !self.root.join("config").is_file() {
            ost::open_or_create(&self.root)?;
        }
        Ok(())
    }

    fn exists(&self, rel: &Path) -> Result<bool> {
        Ok(self.root.join(rel).exists())
    }

    fn read(&self, rel: &Path) -> Result<Option<Vec<u8>>> {
        match std::fs::read(self.root.join(rel)) {
            Ok(data) => Ok(Some(data)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e).with_context(|| format!("reading {}", self.root.join(rel).display())),
        }
    }

    fn put(&self, rel: &Path, data: &[u8]) -> Result<()> {
        use std::io::Write;
        let mut temp = self.temp_in(rel)?;
        temp.write_all(data)?;
        temp.as_file().sync_all()?;
        temp.persist(self.root.join(rel))
            .with_context(|| format!("writing {}", rel.display()))?;
        Ok(())
    }

    fn put_file(&self, rel: &Path, source: &Path) -> Result<()> {
        let temp = self.temp_in(rel)?;
        std::fs::copy(source, temp.path()).with_context(|| format!("copying {}", source.display()))?;
        temp.as_file().sync_all()?;
        temp.persist(self.root.join(rel))
            .with_context(|| format!("writing {}", rel.display()))?;
        Ok(())
    }

    fn update_summary(&self, gpg_key: Option<&str>, gpg_homedir: Option<&Path>) -> Result<()> {
        let repo = ost::open(&self.root)?;
        ost::update_summary(&repo, gpg_key, gpg_homedir)
    }
}

/// Publishing proceeds in these phases, in this order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Phase {
    Objects,
    Deltas,
    Refs,
    Summary,
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Phase::Objects => "objects",
            Phase::Deltas => "static deltas",
            Phase::Refs => "refs",
            Phase::Summary => "summary",
        })
    }
}

pub struct PublishOptions<'a> {
    pub refs: Vec<String>,
    pub gpg_key: Option<&'a str>,
    pub gpg_homedir: Option<&'a Path>,
    /// Deltas from this many previously published commits per ref (plus one from empty).
    pub deltas: usize,
    /// Publish even when the version is not newer than the remote's.
    pub force: bool,
    /// Called after each phase completes; an error stops the publish there
    /// (the tests use it to interrupt a publish between phases).
    pub after_phase: &'a dyn Fn(Phase) -> Result<()>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct PublishedRef {
    pub ref_name: String,
    pub commit: String,
    pub version: String,
    pub previous: Option<String>,
    pub deltas: Vec<String>,
    pub skipped_deltas: Vec<String>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct PublishReport {
    pub destination: String,
    pub refs: Vec<PublishedRef>,
    pub objects_copied: usize,
    pub bytes_copied: u64,
    pub delta_files_copied: usize,
    /// True when the remote already had everything.
    pub no_op: bool,
}

/// Compares dotted versions (`2026.11.2` > `2026.11.1`, `1.10` > `1.9`).
pub fn version_cmp(a: &str, b: &str) -> std::cmp::Ordering {
    let parts = |v: &str| -> Vec<String> { v.split(['.', '-', '_', '+', '~']).map(str::to_string).collect() };
    let (pa, pb) = (parts(a), parts(b));
    for (x, y) in pa.iter().zip(&pb) {
        let order = match (x.parse::<u64>(), y.parse::<u64>()) {
            (Ok(m), Ok(n)) => m.cmp(&n),
            _ => x.cmp(y),
        };
        if order != std::cmp::Ordering::Equal {
            return order;
        }
    }
    pa.len().cmp(&pb.len())
}

/// ostree's path for a loose object.
pub fn object_path(checksum: &str, kind: ostree::ObjectType) -> PathBuf {
    let ext = match kind {
        ostree::ObjectType::File => "filez",
        ostree::ObjectType::DirTree => "dirtree",
        ostree::ObjectType::DirMeta => "dirmeta",
        ostree::ObjectType::Commit => "commit",
        ostree::ObjectType::CommitMeta => "commitmeta",
        _ => "unknown",
    };
    PathBuf::from(format!("objects/{}/{}.{ext}", &checksum[..2], &checksum[2..]))
}

/// ostree's "modified base64" of a checksum: `/` becomes `_`, no padding.
pub fn checksum_b64(checksum: &str) -> Result<String> {
    let bytes = hex::decode(checksum).with_context(|| format!("{checksum} is not a hex checksum"))?;
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+_";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = (chunk[0] as u32) << 16
            | (*chunk.get(1).unwrap_or(&0) as u32) << 8
            | *chunk.get(2).unwrap_or(&0) as u32;
        for i in 0..=chunk.len() {
            out.push(ALPHABET[(n >> (18 - 6 * i) & 0x3f) as usize] as char);
        }
    }
    Ok(out)
}

/// The directory of a static delta in a repo, relative to its root.
pub fn delta_dir(from: Option<&str>, to: &str) -> Result<PathBuf> {
    let to64 = checksum_b64(to)?;
    Ok(match from {
        None => PathBuf::from(format!("deltas/{}/{}", &to64[..2], &to64[2..])),
        Some(from) => {
            let from64 = checksum_b64(from)?;
            PathBuf::from(format!("deltas/{}/{}-{to64}", &from64[..2], &from64[2..]))
        }
    })
}

/// Parses a commit object's bytes (a GVariant) into the commit variant.
fn commit_variant(data: &[u8]) -> Result<glib::Variant> {
    let ty = glib::VariantTy::new("(a{sv}aya(say)sstayay)").expect("valid type");
    let variant = glib::Variant::from_bytes_with_type(&glib::Bytes::from(data), ty).normal_form();
    ostree::validate_structureof_commit(&variant).context("the remote's commit object is malformed")?;
    Ok(variant)
}

fn version_of(metadata: &glib::Variant) -> Option<String> {
    glib::VariantDict::new(Some(metadata))
        .lookup_value(commit::key::VERSION, None)
        .and_then(|v| v.str().map(str::to_string))
}

/// The remote's commits of a ref, newest first, as far as its history goes.
fn remote_history(
    transport: &dyn Transport,
    ref_name: &str,
    limit: usize,
) -> Result<Vec<(String, Option<String>)>> {
    let Some(head) = transport.read(&Path::new("refs/heads").join(ref_name))? else {
        return Ok(Vec::new());
    };
    let mut checksum = String::from_utf8_lossy(&head).trim().to_string();
    let mut history = Vec::new();
    while history.len() < limit.max(1) {
        let Some(data) = transport.read(&object_path(&checksum, ostree::ObjectType::Commit))? else {
            break;
        };
        let variant = commit_variant(&data)?;
        history.push((checksum.clone(), version_of(&variant.child_value(0))));
        match ostree::commit_get_parent(&variant) {
            Some(parent) => checksum = parent.to_string(),
            None => break,
        }
    }
    Ok(history)
}

/// Publishes the refs of the local archive repo `source` through `transport`.
pub fn publish(
    source: &Path,
    transport: &dyn Transport,
    options: &PublishOptions,
    ui: &Ui,
) -> Result<PublishReport> {
    let repo = ost::open(source)?;
    let refs: Vec<String> = if options.refs.is_empty() {
        let mut all: Vec<String> = repo
            .list_refs(None, gio::Cancellable::NONE)?
            .into_keys()
            .collect();
        all.sort();
        all
    } else {
        options.refs.clone()
    };
    if refs.is_empty() {
        bail!("{} has no refs to publish (tag a commit first)", source.display());
    }
    transport.ensure_repo()?;

    // Decide what to publish, refusing before anything is copied.
    struct Plan {
        ref_name: String,
        commit: String,
        version: String,
        history: Vec<(String, Option<String>)>,
    }
    let mut plans = Vec::new();
    for ref_name in &refs {
        let commit = ost::resolve(&repo, ref_name)?
            .with_context(|| format!("{} has no ref {ref_name}", source.display()))?;
        let info = ost::read_commit(&repo, &commit)?;
        let flavor = info
            .metadata
            .get(commit::key::FLAVOR)
            .and_then(|v| v.as_str())
            .unwrap_or("");
        if flavor == "rt" {
            let evidence = commit::full_evidence(&info).map_err(|e| Refused {
                stage: "publish".into(),
                summary: format!("{ref_name} is flavor rt but commit {commit} carries no RT evidence"),
                reasons: vec![format!("{e:#}")],
            })?;
            let with_modules = evidence
                .get(rtcheck::evidence::id::MODULES)
                .is_some_and(|c| c.status != rtcheck::Status::Skip);
            let required = tag::required_checks(with_modules, true);
            crate::stages::verify::gate("publish", &evidence, &required).map_err(|mut refused| {
                refused.summary = format!(
                    "{ref_name} ({commit}) is flavor rt without complete PREEMPT_RT evidence; not published"
                );
                refused
            })?;
        }
        let version = info
            .metadata
            .get(commit::key::VERSION)
            .and_then(|v| v.as_str())
            .unwrap_or("")
            .to_string();
        let history = remote_history(transport, ref_name, options.deltas + 1)?;
        if let Some((remote_commit, remote_version)) = history.first()
            && *remote_commit != commit
        {
            let remote_version = remote_version.clone().unwrap_or_default();
            if version_cmp(&version, &remote_version) != std::cmp::Ordering::Greater && !options.force {
                bail!(
                    "{ref_name}: version {version:?} is not newer than the remote's {remote_version:?} (commit {remote_commit}); \
                     bump the recipe's version or pass --force"
                );
            }
        }
        plans.push(Plan {
            ref_name: ref_name.clone(),
            commit,
            version,
            history,
        });
    }

    // Commits travel with their signature: sign them (once per key) first.
    if let Some(key) = options.gpg_key {
        for plan in &plans {
            if ost::sign_commit(&repo, &plan.commit, key, options.gpg_homedir)? {
                ui.note(format!("signed {} with GPG key {key}", plan.commit));
            }
        }
    }
    let mut report = PublishReport {
        destination: transport.describe(),
        ..PublishReport::default()
    };
    if plans
        .iter()
        .all(|p| p.history.first().is_some_and(|(c, _)| *c == p.commit))
    {
        // Detached metadata (signatures) may still have changed.
        let mut changed = false;
        for plan in &plans {
            changed |= sync_commitmeta(source, transport, &plan.commit, &mut report)?;
        }
        if !changed {
            ui.note(format!(
                "{} already serves these commits: nothing to publish",
                transport.describe()
            ));
            report.no_op = true;
            report.refs = plans
                .iter()
                .map(|p| PublishedRef {
                    ref_name: p.ref_name.clone(),
                    commit: p.commit.clone(),
                    version: p.version.clone(),
                    previous: Some(p.commit.clone()),
                    ..Default::default()
                })
                .collect();
            return Ok(report);
        }
    }

    // 1. Objects: content and trees first, commit objects last. Commits are
    // signed first (once per key) so they reach the remote with their signature.
    ui.step("publish", format!("objects to {}", transport.describe()));
    for plan in &plans {
        let objects = repo
            .traverse_commit(&plan.commit, 0, gio::Cancellable::NONE)
            .with_context(|| format!("listing the objects of {}", plan.commit))?;
        let mut ordered: Vec<(String, ostree::ObjectType)> = objects
            .iter()
            .map(|o| (o.checksum().to_string(), o.object_type()))
            .collect();
        ordered.sort_by_key(|(c, t)| (matches!(t, ostree::ObjectType::Commit), c.clone()));
        for (checksum, kind) in ordered {
            let rel = object_path(&checksum, kind);
            if transport.exists(&rel)? {
                continue;
            }
            let local = source.join(&rel);
            transport.put_file(&rel, &local)?;
            report.objects_copied += 1;
            report.bytes_copied += local.metadata().map(|m| m.len()).unwrap_or(0);
        }
        sync_commitmeta(source, transport, &plan.commit, &mut report)?;
    }
    ui.note(format!(
        "{} objects, {} bytes copied",
        report.objects_copied, report.bytes_copied
    ));
    (options.after_phase)(Phase::Objects)?;

    // 2. Static deltas: from each recently published commit, and from empty.
    ui.step("publish", "static deltas");
    let mut published = Vec::new();
    for plan in &plans {
        let mut entry = PublishedRef {
            ref_name: plan.ref_name.clone(),
            commit: plan.commit.clone(),
            version: plan.version.clone(),
            previous: plan.history.first().map(|(c, _)| c.clone()),
            ..Default::default()
        };
        let mut sources: Vec<Option<String>> = plan
            .history
            .iter()
            .filter(|(c, _)| *c != plan.commit)
            .take(options.deltas)
            .map(|(c, _)| Some(c.clone()))
            .collect();
        sources.push(None);
        for from in sources {
            let name = match &from {
                Some(f) => format!("{}-{}", &f[..12], &plan.commit[..12]),
                None => format!("empty-{}", &plan.commit[..12]),
            };
            let rel = delta_dir(from.as_deref(), &plan.commit)?;
            if transport.exists(&rel.join("superblock"))? {
                entry.deltas.push(name);
                continue;
            }
            if let Some(f) = &from
                && ost::resolve(&repo, f)?.is_none()
            {
                entry
                    .skipped_deltas
                    .push(format!("{name}: {f} is not in the local repo"));
                continue;
            }
            // bsdiff pays off between commits; from nothing it only costs time.
            let opt = if from.is_some() {
                ostree::StaticDeltaGenerateOpt::Major
            } else {
                ostree::StaticDeltaGenerateOpt::Lowlatency
            };
            repo.static_delta_generate(
                opt,
                from.as_deref(),
                &plan.commit,
                None,
                Some(&delta_params()),
                gio::Cancellable::NONE,
            )
            .with_context(|| format!("generating static delta {name}"))?;
            let local_dir = source.join(&rel);
            let delta_bytes = crate::io::root::tree_size(&local_dir)?.0;
            let object_bytes = objects_bytes(&repo, source, from.as_deref(), &plan.commit)?;
            if delta_bytes >= object_bytes {
                ui.note(format!("skipped delta {name}: {delta_bytes} bytes would not save over {object_bytes} bytes of objects"));
                entry.skipped_deltas.push(format!(
                    "{name}: {delta_bytes} bytes vs {object_bytes} bytes of objects"
                ));
                std::fs::remove_dir_all(&local_dir).ok();
                continue;
            }
            // Parts first, the superblock (which makes the delta visible) last.
            let mut files: Vec<PathBuf> = walkdir::WalkDir::new(&local_dir)
                .into_iter()
                .filter_map(Result::ok)
                .filter(|e| e.file_type().is_file())
                .map(|e| {
                    e.path()
                        .strip_prefix(source)
                        .expect("inside the repo")
                        .to_path_buf()
                })
                .collect();
            files.sort_by_key(|f| f.ends_with("superblock"));
            for file in files {
                transport.put_file(&file, &source.join(&file))?;
                report.delta_files_copied += 1;
            }
            ui.note(format!(
                "delta {name}: {delta_bytes} bytes (objects: {object_bytes} bytes)"
            ));
            entry.deltas.push(name);
        }
        published.push(entry);
    }
    (options.after_phase)(Phase::Deltas)?;

    // 3. Refs.
    ui.step("publish", "refs");
    for plan in &plans {
        transport.put(
            &Path::new("refs/heads").join(&plan.ref_name),
            format!("{}\n", plan.commit).as_bytes(),
        )?;
        ui.note(format!("{} -> {} ({})", plan.ref_name, plan.commit, plan.version));
    }
    (options.after_phase)(Phase::Refs)?;

    // 4. Summary, signed, last.
    ui.step("publish", "summary");
    transport.update_summary(options.gpg_key, options.gpg_homedir)?;
    (options.after_phase)(Phase::Summary)?;
    report.refs = published;
    Ok(report)
}

/// Parameters for `static_delta_generate`: libostree 2022.7 looks keys up in
/// `params` without a NULL check, so it must be a dict even when empty.
fn delta_params() -> glib::Variant {
    let params = glib::VariantDict::new(None);
    params.insert_value("verbose", &false.to_variant());
    params.end()
}

/// Copies the commit's detached metadata (signatures) when the remote's differs.
fn sync_commitmeta(
    source: &Path,
    transport: &dyn Transport,
    commit: &str,
    report: &mut PublishReport,
) -> Result<bool> {
    let rel = object_path(commit, ostree::ObjectType::CommitMeta);
    let local = source.join(&rel);
    if !local.is_file() {
        return Ok(false);
    }
    let data = std::fs::read(&local)?;
    if transport.read(&rel)?.as_deref() == Some(&data[..]) {
        return Ok(false);
    }
    transport.put(&rel, &data)?;
    report.objects_copied += 1;
    report.bytes_copied += data.len() as u64;
    Ok(true)
}

/// Bytes of the objects a client without a delta would fetch to go from
/// `from` (or nothing) to `to`.
fn objects_bytes(repo: &ostree::Repo, source: &Path, from: Option<&str>, to: &str) -> Result<u64> {
    let wanted = repo.traverse_commit(to, 0, gio::Cancellable::NONE)?;
    let have: BTreeSet<PathBuf> = match from {
        Some(f) => repo
            .traverse_commit(f, 0, gio::Cancellable::NONE)?
            .iter()
            .map(|o| object_path(o.checksum(), o.object_type()))
            .collect(),
        None => BTreeSet::new(),
    };
    Ok(wanted
        .iter()
        .map(|o| object_path(o.checksum(), o.object_type()))
        .filter(|path| !have.contains(path))
        .map(|path| source.join(path).metadata().map(|m| m.len()).unwrap_or(0))
        .sum())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cmp::Ordering;

    #[test]
    fn versions() {
        assert_eq!(version_cmp("2026.11.2", "2026.11.1"), Ordering::Greater);
        assert_eq!(version_cmp("1.10", "1.9"), Ordering::Greater);
        assert_eq!(version_cmp("1.0", "1.0"), Ordering::Equal);
        assert_eq!(version_cmp("1.0", "1.0.1"), Ordering::Less);
        assert_eq!(version_cmp("2026.11.1-rc1", "2026.11.1-rc2"), Ordering::Less);
    }

    #[test]
    fn paths_match_ostree() {
        let c = "2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae";
        assert_eq!(
            object_path(c, ostree::ObjectType::Commit),
            PathBuf::from(format!("objects/2c/{}.commit", &c[2..]))
        );
        // base64 of 0x2c26b4... with `/` as `_` and no padding: 43 characters.
        let b64 = checksum_b64(c).unwrap();
        assert_eq!(b64.len(), 43);
        assert_eq!(b64, "LCa0a2j_xo_5m0U8HTBBNBNCLXBkg7+g+YpeiGJm564");
        assert_eq!(
            delta_dir(None, c).unwrap(),
            PathBuf::from(format!("deltas/LC/{}", &b64[2..]))
        );
        assert!(
            delta_dir(Some(c), c)
                .unwrap()
                .to_string_lossy()
                .ends_with(&format!("-{b64}"))
        );
        assert!(LocalDir::parse("ssh://host/x").is_err());
        assert_eq!(
            LocalDir::parse("file:///srv/repo").unwrap().root,
            PathBuf::from("/srv/repo")
        );
    }
}
