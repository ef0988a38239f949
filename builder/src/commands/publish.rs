//! `imgbuild publish`: copies tagged commits from the local archive repo to
//! an ostree remote's web root in an order that never lets a client see a
//! ref to missing content: objects, then static deltas, then the commits'
//! signed records (qualifications, promotions), then refs, then the
//! (signed) summary. Every file is written to a temp name and renamed.

use emberrtos_contract::gate::gate_signed_kernel;
use emberrtos_contract::secure_boot::Certificate;
use std::collections::BTreeSet;
use std::fmt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use glib::prelude::*;
use ostree::gio;
use serde::{Deserialize, Serialize};

use emberrtos_contract::error::Refused;

use crate::io::records::{self, RecordKind, StoredRecord};
use crate::ostree as ost;
use crate::sbom::dpkg::{parse_version, version_cmp};
use crate::stages::commit;
use crate::transport::trust::{Publisher, UnsignedRef};
use crate::ui::Ui;

pub use crate::transport::{LOCK_FILE, LocalDir, TEMP_PREFIX, Transport, object_path};

/// Publishing proceeds in these phases, in this order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Phase {
    Objects,
    Deltas,
    Records,
    Refs,
    Summary,
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Phase::Objects => "objects",
            Phase::Deltas => "static deltas",
            Phase::Records => "records",
            Phase::Refs => "refs",
            Phase::Summary => "summary",
        })
    }
}

/// How many parents of each ref's tip `publish` carries by default.
pub const DEFAULT_DEPTH: usize = 5;

pub struct PublishOptions<'a> {
    pub refs: Vec<String>,
    /// GPG key for commits and the summary; `None` publishes unsigned (the
    /// CLI asks for that explicitly with `--unsigned`).
    pub gpg_key: Option<&'a str>,
    pub gpg_homedir: Option<&'a Path>,
    /// Deltas from this many previously published commits per ref.
    pub deltas: usize,
    /// Also a delta from empty to each tip, for first pulls. Off by default:
    /// it costs minutes to generate and ostree clients pull the objects
    /// fine without it.
    pub delta_from_empty: bool,
    /// Parents of each ref's tip carried to the remote (commits with their
    /// trees and content), each with a delta to the tip, so devices can pull
    /// or deploy them by checksum.
    pub depth: usize,
    /// Publish even when the version is not newer than the remote's.
    pub force: bool,
    /// Remove the refs the destination serves whose commits the GPG key did
    /// not sign, instead of refusing to publish (exit 3).
    pub prune_unsigned_refs: bool,
    /// The certificate the devices' firmware trusts: every published
    /// kernel must verify against it (exit 3 otherwise). Without it, a
    /// commit that records a signed kernel must still hold that image,
    /// validly signed.
    pub secure_boot_cert: Option<&'a Certificate>,
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
    /// Parents of the tip carried along, newest first.
    pub history: Vec<String>,
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
    /// Qualification and promotion records sent (with their signatures):
    /// those the remote did not have byte-identical.
    pub records_copied: usize,
    /// Temp files a killed publish had left at the destination, removed.
    pub stale_temps_removed: usize,
    /// Refs the destination served unsigned, removed (`--prune-unsigned-refs`).
    #[serde(default)]
    pub pruned_refs: Vec<String>,
    /// True when the remote already had everything.
    pub no_op: bool,
    /// Seconds each phase took, in order (`plan` covers reading the remote,
    /// signing and reading the records).
    #[serde(default)]
    pub phase_seconds: Vec<PhaseTime>,
    /// Pages of the release site written under `site/` (`--site`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub site_pages: Option<usize>,
}

/// How long one publish phase took.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct PhaseTime {
    pub phase: String,
    pub seconds: f64,
}

/// Times the phases of a publish into its report.
struct PhaseClock(std::time::Instant);

impl PhaseClock {
    fn start() -> PhaseClock {
        PhaseClock(std::time::Instant::now())
    }

    /// Records the time since the last lap as `phase`'s.
    fn lap(&mut self, report: &mut PublishReport, phase: &str) {
        report.phase_seconds.push(PhaseTime {
            phase: phase.to_string(),
            seconds: self.0.elapsed().as_secs_f64(),
        });
        self.0 = std::time::Instant::now();
    }
}

/// An object's path at the remote, and its file in the local repo `source`.
fn local_object(source: &Path, checksum: &str, kind: ostree::ObjectType) -> (PathBuf, PathBuf) {
    let rel = object_path(checksum, kind);
    (rel.clone(), source.join(rel))
}

/// ostree's "modified base64" of a checksum (`/` becomes `_`, no padding).
fn checksum_b64(checksum: &str) -> Result<String> {
    Ok(ostree::Checksum::from_hex(checksum)
        .with_context(|| format!("{checksum} is not a hex checksum"))?
        .to_base64())
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

/// What publishing one ref involves, decided before anything is copied.
struct Plan {
    ref_name: String,
    commit: String,
    version: String,
    /// Local parents of the tip carried along, newest first.
    parents: Vec<String>,
    /// The remote's commits of the ref, newest first.
    remote: Vec<(String, Option<String>)>,
}

impl Plan {
    /// The tip's parents first (oldest first), the tip last.
    fn commits(&self) -> impl Iterator<Item = &String> {
        self.parents.iter().rev().chain(std::iter::once(&self.commit))
    }

    fn entry(&self) -> PublishedRef {
        PublishedRef {
            ref_name: self.ref_name.clone(),
            commit: self.commit.clone(),
            version: self.version.clone(),
            previous: self.remote.first().map(|(c, _)| c.clone()),
            history: self.parents.clone(),
            ..Default::default()
        }
    }

    /// True when the remote's ref already points at the tip and holds every
    /// commit object of the plan, byte for byte.
    fn is_served_by(&self, source: &Path, transport: &dyn Transport) -> Result<bool> {
        if self.remote.first().is_none_or(|(c, _)| *c != self.commit) {
            return Ok(false);
        }
        let commits: Vec<_> = self
            .commits()
            .map(|c| local_object(source, c, ostree::ObjectType::Commit))
            .collect();
        Ok(transport.holding(&commits)?.len() == commits.len())
    }
}

/// Publishes the refs of the local archive repo `source` through `transport`.
pub fn publish(
    source: &Path,
    transport: &dyn Transport,
    options: &PublishOptions,
    ui: &Ui,
) -> Result<PublishReport> {
    let repo = ost::open(source)?;
    let refs = refs_to_publish(&repo, source, &options.refs)?;
    let publisher = options
        .gpg_key
        .map(|key| Publisher::new(key, options.gpg_homedir))
        .transpose()?;
    let remote = Remote {
        transport,
        publisher: publisher.as_ref(),
    };
    transport.ensure_repo()?;
    let _lock = transport.lock()?;
    let mut report = PublishReport {
        destination: transport.describe(),
        stale_temps_removed: transport.remove_stale_temps()?,
        ..PublishReport::default()
    };
    if report.stale_temps_removed > 0 {
        ui.note(format!(
            "removed {} temp file(s) an interrupted publish left",
            report.stale_temps_removed
        ));
    }
    report.pruned_refs = check_served_refs(&remote, options, ui)?;
    let mut clock = PhaseClock::start();
    let plans = refs
        .iter()
        .map(|ref_name| plan_ref(&repo, source, transport, ref_name, options, ui))
        .collect::<Result<Vec<_>>>()?;
    // Read before anything is signed or copied: a repo that holds a
    // planted link fails here, with the commits unsigned and the remote
    // untouched.
    let records = read_records(source, &plans)?;
    sign_commits(&repo, &plans, options, ui)?;
    clock.lap(&mut report, "plan");

    if served_already(source, transport, &plans)? {
        // Records added since the commits went out still go.
        copy_records(transport, &records, ui, &mut report)?;
        return finish_served(source, &repo, &remote, &plans, options, ui, report);
    }
    ui.step("publish", format!("objects to {}", transport.describe()));
    copy_objects(&repo, source, transport, &plans, &mut report)?;
    end_phase(transport, options, Phase::Objects, &mut clock, &mut report)?;

    ui.step("publish", "static deltas");
    report.refs = plans
        .iter()
        .map(|plan| copy_deltas(&repo, source, transport, plan, options, ui, &mut report))
        .collect::<Result<Vec<_>>>()?;
    end_phase(transport, options, Phase::Deltas, &mut clock, &mut report)?;

    ui.step("publish", "records");
    copy_records(transport, &records, ui, &mut report)?;
    end_phase(transport, options, Phase::Records, &mut clock, &mut report)?;

    ui.step("publish", "refs");
    move_refs(transport, &plans, ui)?;
    end_phase(transport, options, Phase::Refs, &mut clock, &mut report)?;

    ui.step("publish", "summary");
    publish_summary(&repo, &remote, options)?;
    end_phase(transport, options, Phase::Summary, &mut clock, &mut report)?;
    Ok(report)
}

/// Ends a phase: what it wrote is flushed to the destination, its time is
/// recorded, and the caller's hook may stop the publish there.
fn end_phase(
    transport: &dyn Transport,
    options: &PublishOptions,
    phase: Phase,
    clock: &mut PhaseClock,
    report: &mut PublishReport,
) -> Result<()> {
    transport.flush()?;
    clock.lap(report, &phase.to_string());
    (options.after_phase)(phase)
}

/// The refs named, or every ref of the repo.
fn refs_to_publish(repo: &ostree::Repo, source: &Path, named: &[String]) -> Result<Vec<String>> {
    let refs: Vec<String> = if named.is_empty() {
        let mut all: Vec<String> = repo
            .list_refs(None, gio::Cancellable::NONE)?
            .into_keys()
            .collect();
        all.sort();
        all
    } else {
        named.to_vec()
    };
    if refs.is_empty() {
        bail!("{} has no refs to publish (tag a commit first)", source.display());
    }
    Ok(refs)
}

/// Gates, versions and histories of one ref; refuses before anything is copied.
fn plan_ref(
    repo: &ostree::Repo,
    source: &Path,
    transport: &dyn Transport,
    ref_name: &str,
    options: &PublishOptions,
    ui: &Ui,
) -> Result<Plan> {
    let commit = ost::resolve(repo, ref_name)?
        .with_context(|| format!("{} has no ref {ref_name}", source.display()))?;
    let info = ost::read_commit(repo, &commit)?;
    gate_ref(repo, ref_name, &commit, options.secure_boot_cert)?;
    let version = info
        .metadata
        .get(commit::key::VERSION)
        .and_then(|v| v.as_str())
        .unwrap_or("")
        .to_string();
    parse_version(&version).with_context(|| format!("{ref_name}: commit {commit} cannot be published"))?;
    let remote = remote_history(transport, ref_name, options.deltas + 1)?;
    if let Some((remote_commit, remote_version)) = remote.first()
        && *remote_commit != commit
        && !options.force
    {
        require_newer(
            ref_name,
            &version,
            remote_commit,
            remote_version.as_deref().unwrap_or(""),
        )?;
    }
    let parents = local_parents(repo, ref_name, &info, options, ui)?;
    Ok(Plan {
        ref_name: ref_name.to_string(),
        commit,
        version,
        parents,
        remote,
    })
}

/// Refuses `version` unless it is newer, in Debian's order, than the
/// version the remote serves.
fn require_newer(ref_name: &str, version: &str, remote_commit: &str, remote_version: &str) -> Result<()> {
    let order = version_cmp(version, remote_version).with_context(|| {
        format!("{ref_name}: cannot order {version:?} after the remote's {remote_version:?} (commit {remote_commit}); pass --force to publish anyway")
    })?;
    if order != std::cmp::Ordering::Greater {
        bail!(
            "{ref_name}: version {version:?} is not newer than the remote's {remote_version:?} (commit {remote_commit}) \
             in Debian's version order; bump the recipe's version or pass --force"
        );
    }
    Ok(())
}

/// The publish gate of one commit of a ref: the RT gate (the kernel inside
/// the commit re-verified, the flavor from the ref's name), then the
/// Secure Boot signature of that kernel.
fn gate_ref(repo: &ostree::Repo, ref_name: &str, commit: &str, expected: Option<&Certificate>) -> Result<()> {
    crate::stages::verify::gate_commit_for_ref(repo, ref_name, commit)?;
    gate_signed_kernel(repo, commit, expected, "publish", "not published")
}

/// Up to `depth` parents of the tip, newest first: those the local repo holds
/// complete and that pass the gate. The walk stops at the first that does not.
fn local_parents(
    repo: &ostree::Repo,
    ref_name: &str,
    tip: &ost::CommitInfo,
    options: &PublishOptions,
    ui: &Ui,
) -> Result<Vec<String>> {
    let depth = options.depth;
    let mut parents = Vec::new();
    let mut next = tip.parent.clone();
    while let Some(parent) = next.take()
        && parents.len() < depth
    {
        match repo.load_commit(&parent) {
            Ok((_, state)) if !state.contains(ostree::RepoCommitState::PARTIAL) => {}
            _ => {
                ui.note(format!(
                    "{ref_name}: history ends at {parent}, which the local repo does not hold whole"
                ));
                break;
            }
        }
        let info = ost::read_commit(repo, &parent)?;
        if let Err(e) = gate_ref(repo, ref_name, &parent, options.secure_boot_cert) {
            ui.note(format!(
                "{ref_name}: history ends at {parent}, which the gate refuses: {e:#}"
            ));
            break;
        }
        next = info.parent.clone();
        parents.push(parent);
    }
    Ok(parents)
}

/// Commits travel with their signature: sign them (once per key) first.
fn sign_commits(repo: &ostree::Repo, plans: &[Plan], options: &PublishOptions, ui: &Ui) -> Result<()> {
    let Some(key) = options.gpg_key else {
        return Ok(());
    };
    for commit in plans.iter().flat_map(Plan::commits) {
        if ost::sign_commit(repo, commit, key, options.gpg_homedir)? {
            ui.note(format!("signed {commit} with GPG key {key}"));
        }
    }
    Ok(())
}

fn served_already(source: &Path, transport: &dyn Transport, plans: &[Plan]) -> Result<bool> {
    for plan in plans {
        if !plan.is_served_by(source, transport)? {
            return Ok(false);
        }
    }
    Ok(true)
}

/// The remote serves every commit already: bring signatures and the summary
/// up to date if they are not (an interrupted publish), else report a no-op
/// (records copied just before count as a change).
fn finish_served(
    source: &Path,
    repo: &ostree::Repo,
    remote: &Remote,
    plans: &[Plan],
    options: &PublishOptions,
    ui: &Ui,
    mut report: PublishReport,
) -> Result<PublishReport> {
    let transport = remote.transport;
    let mut changed = report.records_copied > 0;
    for commit in plans.iter().flat_map(Plan::commits) {
        changed |= sync_commitmeta(source, transport, commit, &mut report)?;
    }
    changed |= publish_summary(repo, remote, options)?;
    report.refs = plans
        .iter()
        .map(|plan| PublishedRef {
            previous: Some(plan.commit.clone()),
            ..plan.entry()
        })
        .collect();
    if !changed {
        ui.note(format!(
            "{} already serves these commits: nothing to publish",
            transport.describe()
        ));
        report.no_op = true;
    }
    Ok(report)
}

/// Objects phase: each commit's content and trees before its commit object,
/// parents before the tip, then its detached metadata (signatures).
fn copy_objects(
    repo: &ostree::Repo,
    source: &Path,
    transport: &dyn Transport,
    plans: &[Plan],
    report: &mut PublishReport,
) -> Result<()> {
    for commit in plans.iter().flat_map(Plan::commits) {
        copy_commit_objects(repo, source, transport, commit, report)?;
        sync_commitmeta(source, transport, commit, report)?;
    }
    Ok(())
}

fn copy_commit_objects(
    repo: &ostree::Repo,
    source: &Path,
    transport: &dyn Transport,
    commit: &str,
    report: &mut PublishReport,
) -> Result<()> {
    let objects = repo
        .traverse_commit(commit, 0, gio::Cancellable::NONE)
        .with_context(|| format!("listing the objects of {commit}"))?;
    let mut ordered: Vec<(String, ostree::ObjectType)> = objects
        .iter()
        .map(|o| (o.checksum().to_string(), o.object_type()))
        .collect();
    ordered.sort_by_key(|(c, t)| (matches!(t, ostree::ObjectType::Commit), c.clone()));
    let files: Vec<_> = ordered
        .iter()
        .map(|(checksum, kind)| local_object(source, checksum, *kind))
        .collect();
    let held = transport.holding(&files)?;
    for (rel, local) in files {
        if held.contains(&rel) {
            continue;
        }
        transport.put_file(&rel, &local)?;
        report.objects_copied += 1;
        report.bytes_copied += local.metadata().map(|m| m.len()).unwrap_or(0);
    }
    Ok(())
}

/// Where the deltas to a ref's tip start: the carried parents, the commits
/// the remote served recently, and empty (`None`) when asked, without repeats.
fn delta_sources(plan: &Plan, deltas: usize, from_empty: bool) -> Vec<Option<String>> {
    let remote = plan
        .remote
        .iter()
        .map(|(c, _)| c)
        .filter(|c| **c != plan.commit)
        .take(deltas);
    let mut sources: Vec<Option<String>> = Vec::new();
    for commit in plan.parents.iter().chain(remote) {
        if !sources.iter().any(|s| s.as_deref() == Some(commit.as_str())) {
            sources.push(Some(commit.clone()));
        }
    }
    if from_empty {
        sources.push(None);
    }
    sources
}

/// Deltas phase for one ref: a static delta to the tip from each source,
/// generated in parallel, then copied one by one.
fn copy_deltas(
    repo: &ostree::Repo,
    source: &Path,
    transport: &dyn Transport,
    plan: &Plan,
    options: &PublishOptions,
    ui: &Ui,
    report: &mut PublishReport,
) -> Result<PublishedRef> {
    let mut entry = plan.entry();
    let mut to_generate = Vec::new();
    for from in delta_sources(plan, options.deltas, options.delta_from_empty) {
        let delta = Delta {
            from,
            to: plan.commit.clone(),
        };
        let superblock = delta_dir(delta.from.as_deref(), &delta.to)?.join("superblock");
        let local = source.join(&superblock);
        if transport
            .holding(&[(superblock.clone(), local)])?
            .contains(&superblock)
        {
            entry.deltas.push(delta.name());
        } else if let Some(f) = &delta.from
            && ost::resolve(repo, f)?.is_none()
        {
            entry
                .skipped_deltas
                .push(format!("{}: {f} is not in the local repo", delta.name()));
        } else {
            to_generate.push(delta);
        }
    }
    generate_deltas(source, &to_generate)?;
    for delta in &to_generate {
        match copy_delta(repo, source, transport, delta, ui, report)? {
            DeltaOutcome::Published => entry.deltas.push(delta.name()),
            DeltaOutcome::Skipped(why) => entry.skipped_deltas.push(format!("{}: {why}", delta.name())),
        }
    }
    Ok(entry)
}

struct Delta {
    from: Option<String>,
    to: String,
}

impl Delta {
    fn name(&self) -> String {
        match &self.from {
            Some(f) => format!("{}-{}", &f[..12], &self.to[..12]),
            None => format!("empty-{}", &self.to[..12]),
        }
    }

    /// Generates the delta in the local repo at `source`.
    fn generate(&self, repo: &ostree::Repo) -> Result<()> {
        // bsdiff pays off between commits; from nothing it only costs time.
        let opt = if self.from.is_some() {
            ostree::StaticDeltaGenerateOpt::Major
        } else {
            ostree::StaticDeltaGenerateOpt::Lowlatency
        };
        repo.static_delta_generate(
            opt,
            self.from.as_deref(),
            &self.to,
            None,
            Some(&delta_params()),
            gio::Cancellable::NONE,
        )
        .with_context(|| format!("generating static delta {}", self.name()))
    }
}

/// At most this many deltas are generated at once: each may hold bsdiff's
/// buffers for files up to libostree's 128 MB limit.
const MAX_DELTA_WORKERS: usize = 4;

/// Generates `deltas` in the local repo, one thread per core (at most
/// [`MAX_DELTA_WORKERS`]), each with its own handle on the repo (each delta
/// is written to its own directory).
fn generate_deltas(source: &Path, deltas: &[Delta]) -> Result<()> {
    let workers = std::thread::available_parallelism()
        .map_or(1, usize::from)
        .min(MAX_DELTA_WORKERS)
        .min(deltas.len());
    if workers == 0 {
        return Ok(());
    }
    let per_worker = deltas.len().div_ceil(workers);
    std::thread::scope(|scope| {
        let handles: Vec<_> = deltas
            .chunks(per_worker)
            .map(|chunk| {
                scope.spawn(move || -> Result<()> {
                    let repo = ost::open(source)?;
                    chunk.iter().try_for_each(|delta| delta.generate(&repo))
                })
            })
            .collect();
        handles.into_iter().try_for_each(|handle| {
            handle
                .join()
                .map_err(|_| anyhow::anyhow!("a static delta worker panicked"))?
        })
    })
}

enum DeltaOutcome {
    Published,
    Skipped(String),
}

/// Copies one generated delta, parts before the superblock (which makes it
/// visible); skips it when it would not save bytes.
fn copy_delta(
    repo: &ostree::Repo,
    source: &Path,
    transport: &dyn Transport,
    delta: &Delta,
    ui: &Ui,
    report: &mut PublishReport,
) -> Result<DeltaOutcome> {
    let name = delta.name();
    let rel = delta_dir(delta.from.as_deref(), &delta.to)?;
    let local_dir = source.join(&rel);
    let delta_bytes = emberrtos_contract::io::root::tree_size(&local_dir)?.0;
    let object_bytes = objects_bytes(repo, source, delta.from.as_deref(), &delta.to)?;
    if delta_bytes >= object_bytes {
        ui.note(format!(
            "skipped delta {name}: {delta_bytes} bytes would not save over {object_bytes} bytes of objects"
        ));
        std::fs::remove_dir_all(&local_dir).ok();
        return Ok(DeltaOutcome::Skipped(format!(
            "{delta_bytes} bytes vs {object_bytes} bytes of objects"
        )));
    }
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
    Ok(DeltaOutcome::Published)
}

/// The records of one kind of one published commit, as read from the source.
struct CommitRecords {
    commit: String,
    kind: RecordKind,
    records: Vec<StoredRecord>,
}

/// Every record of the commits the plans publish (each commit once).
fn read_records(source: &Path, plans: &[Plan]) -> Result<Vec<CommitRecords>> {
    let mut seen = BTreeSet::new();
    let mut all = Vec::new();
    for commit in plans.iter().flat_map(Plan::commits) {
        if !seen.insert(commit) {
            continue;
        }
        for kind in RecordKind::ALL {
            let records = records::list(source, kind, commit)
                .with_context(|| format!("reading the {kind} records of {commit}"))?;
            if !records.is_empty() {
                all.push(CommitRecords {
                    commit: commit.clone(),
                    kind,
                    records,
                });
            }
        }
    }
    Ok(all)
}

/// Records phase: to the same paths on the remote, each directory's
/// signatures before its records, so a record is never served without its
/// signature. A record without one is not sent (a verifier refuses it).
fn copy_records(
    transport: &dyn Transport,
    all: &[CommitRecords],
    ui: &Ui,
    report: &mut PublishReport,
) -> Result<()> {
    for set in all {
        let dir = set.kind.commit_dir(&set.commit);
        let mut signed = Vec::new();
        for record in &set.records {
            match &record.signature {
                Some(signature) => signed.push((record, signature)),
                None => ui.note(format!(
                    "not published: {} has no signature",
                    dir.join(&record.name).display()
                )),
            }
        }
        let mut copied = BTreeSet::new();
        for (record, signature) in &signed {
            if put_if_changed(transport, &dir.join(record.signature_name()), signature)? {
                copied.insert(&record.name);
            }
        }
        for (record, _) in &signed {
            if put_if_changed(transport, &dir.join(&record.name), &record.json)? {
                copied.insert(&record.name);
            }
        }
        report.records_copied += copied.len();
    }
    Ok(())
}

/// Writes `data` to `rel` unless the remote has it byte-identical; returns
/// whether it wrote.
fn put_if_changed(transport: &dyn Transport, rel: &Path, data: &[u8]) -> Result<bool> {
    if transport.read(rel)?.as_deref() == Some(data) {
        return Ok(false);
    }
    transport.put(rel, data)?;
    Ok(true)
}

/// Refs phase: each ref moves to its tip.
fn move_refs(transport: &dyn Transport, plans: &[Plan], ui: &Ui) -> Result<()> {
    for plan in plans {
        transport.put(
            &Path::new("refs/heads").join(&plan.ref_name),
            format!("{}\n", plan.commit).as_bytes(),
        )?;
        ui.note(format!("{} -> {} ({})", plan.ref_name, plan.commit, plan.version));
    }
    Ok(())
}

/// The destination, and the key whose signatures publish trusts there.
struct Remote<'a> {
    transport: &'a dyn Transport,
    /// `None` when publishing unsigned.
    publisher: Option<&'a Publisher>,
}

/// Refused (exit 3): the destination serves refs the publisher did not sign.
fn unsigned_refs_refused(transport: &dyn Transport, unsigned: &[UnsignedRef], hint: &str) -> anyhow::Error {
    Refused {
        stage: "publish".into(),
        summary: format!(
            "{} serves {} ref(s) whose commits the GPG key did not sign; nothing was signed or published{hint}",
            transport.describe(),
            unsigned.len()
        ),
        reasons: unsigned.iter().map(UnsignedRef::to_string).collect(),
    }
    .into()
}

/// Before anything is signed or copied: the refs the destination serves
/// must be the publisher's. Others are refused, or removed with
/// `--prune-unsigned-refs` (returned). Unsigned publishing checks nothing.
fn check_served_refs(remote: &Remote, options: &PublishOptions, ui: &Ui) -> Result<Vec<String>> {
    let (transport, Some(publisher)) = (remote.transport, remote.publisher) else {
        return Ok(Vec::new());
    };
    let unsigned = publisher.unsigned_refs(transport, &transport.generate_summary()?)?;
    if unsigned.is_empty() {
        return Ok(Vec::new());
    }
    if !options.prune_unsigned_refs {
        let hint = " (--prune-unsigned-refs removes them)";
        return Err(unsigned_refs_refused(transport, &unsigned, hint));
    }
    for planted in &unsigned {
        transport.remove(&Path::new("refs/heads").join(&planted.name))?;
        ui.note(format!("removed the unsigned ref {planted}"));
    }
    Ok(unsigned.into_iter().map(|r| r.name).collect())
}

/// Whether the served `summary.sig` goes with `served`: a good signature
/// by the publisher, or none when publishing unsigned.
fn signature_current(remote: &Remote, served: &[u8]) -> Result<bool> {
    match remote.publisher {
        Some(publisher) => publisher.signed_summary(remote.transport, served),
        None => Ok(remote.transport.read(Path::new("summary.sig"))?.is_none()),
    }
}

/// Summary phase: generates the new summary, refuses it when it lists a
/// ref the publisher did not sign, and signs it before either served file
/// changes, then replaces them in [`ost::summary_files_in_order`].
/// Returns false when the served summary was already current.
fn publish_summary(repo: &ostree::Repo, remote: &Remote, options: &PublishOptions) -> Result<bool> {
    let transport = remote.transport;
    let summary = transport.generate_summary()?;
    if let Some(publisher) = remote.publisher {
        let unsigned = publisher.unsigned_refs(transport, &summary)?;
        if !unsigned.is_empty() {
            return Err(unsigned_refs_refused(transport, &unsigned, ""));
        }
    }
    if let Some(served) = transport.read(Path::new("summary"))?
        && ost::same_summary(&served, &summary)
        && signature_current(remote, &served)?
    {
        return Ok(false);
    }
    let signature = match options.gpg_key {
        Some(key) => Some(ost::sign_summary(repo, &summary, key, options.gpg_homedir)?),
        None => None,
    };
    for (name, data) in ost::summary_files_in_order(&summary, signature.as_deref()) {
        match data {
            Some(data) => transport.put(Path::new(name), data)?,
            None => transport.remove(Path::new(name))?,
        }
    }
    Ok(true)
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
    if !put_if_changed(transport, &rel, &data)? {
        return Ok(false);
    }
    report.objects_copied += 1;
    report.bytes_copied += data.len() as u64;
    Ok(true)
}

/// Bytes of the objects a client without a delta would fetch to go from
/// `from` (or nothing) to `to`.
pub fn objects_bytes(repo: &ostree::Repo, source: &Path, from: Option<&str>, to: &str) -> Result<u64> {
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

    #[test]
    fn paths_match_ostree() {
        let c = "2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae";
        assert_eq!(
            object_path(c, ostree::ObjectType::Commit),
            PathBuf::from(format!("objects/2c/{}.commit", &c[2..]))
        );
        // base64 of 0x2c26b4... with `/` as `_` and no padding: 43 characters.
        let b64 = checksum_b64(c).unwrap();
        assert_eq!(b64, "LCa0a2j_xo_5m0U8HTBBNBNCLXBkg7+g+YpeiGJm564");
        assert!(checksum_b64("2c26").is_err());
        assert!(checksum_b64(&"zz".repeat(32)).is_err());
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

    #[test]
    fn delta_sources_cover_history_remote_and_empty_when_asked_once() {
        let c = |n: u8| format!("{n:02x}").repeat(32);
        let plan = Plan {
            ref_name: "r".into(),
            commit: c(9),
            version: "2".into(),
            parents: vec![c(8), c(7)],
            remote: vec![(c(8), None), (c(5), None), (c(4), None)],
        };
        assert_eq!(
            delta_sources(&plan, 2, true),
            vec![Some(c(8)), Some(c(7)), Some(c(5)), None]
        );
        assert_eq!(
            delta_sources(&plan, 2, false),
            vec![Some(c(8)), Some(c(7)), Some(c(5))]
        );
        assert_eq!(
            plan.commits().cloned().collect::<Vec<_>>(),
            vec![c(7), c(8), c(9)]
        );
    }

    #[test]
    fn stale_temps_are_removed_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let remote = LocalDir::new(dir.path());
        remote.ensure_repo().unwrap();
        let objects = dir.path().join("objects/ab");
        std::fs::create_dir_all(&objects).unwrap();
        std::fs::write(objects.join(".publish-x1y2"), b"half").unwrap();
        std::fs::write(objects.join("cdef.filez"), b"object").unwrap();
        std::fs::create_dir_all(dir.path().join(".publish-scratch/objects")).unwrap();
        std::fs::write(dir.path().join(".publish-9"), b"summary").unwrap();
        // What a kill inside the confined root's write leaves.
        std::fs::write(objects.join(".imgbuild-77-0"), b"half").unwrap();
        let _lock = remote.lock().unwrap();
        assert_eq!(remote.remove_stale_temps().unwrap(), 4);
        assert!(objects.join("cdef.filez").is_file());
        assert!(dir.path().join("config").is_file());
        assert!(dir.path().join(LOCK_FILE).is_file());
        assert_eq!(remote.remove_stale_temps().unwrap(), 0);
    }

    #[test]
    fn a_second_publish_waits_for_the_lock() {
        let dir = tempfile::tempdir().unwrap();
        let remote = LocalDir::new(dir.path());
        let held = remote.lock().unwrap();
        let file = std::fs::File::open(dir.path().join(LOCK_FILE)).unwrap();
        assert!(matches!(file.try_lock(), Err(std::fs::TryLockError::WouldBlock)));
        drop(held);
        file.try_lock().unwrap();
    }

    #[test]
    fn summary_signature_goes_in_before_the_summary() {
        let order = ost::summary_files_in_order(b"s", Some(b"sig"));
        assert_eq!(order.map(|(name, _)| name), ["summary.sig", "summary"]);
        // Unsigned: the old signature goes before the new summary appears.
        assert_eq!(ost::summary_files_in_order(b"s", None)[0], ("summary.sig", None));
    }
}
