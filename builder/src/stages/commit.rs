//! The `commit` stage: the composed tree becomes an ostree commit carrying
//! the build facts and the PREEMPT_RT evidence. No ref moves here.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use rtcheck::Evidence;
use serde::{Deserialize, Serialize};

use crate::ostree::{self, CommitRequest, MetaValue, Metadata, WriteStats};
use crate::recipe::Flavor;
use crate::sbom::image::WrittenSbom;
pub use emberrtos_contract::commit::{BOOT_EVIDENCE, arch_of, evidence_of, full_evidence, kargs_of, key};
use emberrtos_contract::io::root::ImageRoot;
use emberrtos_contract::policy::HealthPolicy;
use emberrtos_contract::secure_boot::{Certificate, key as sb_key};
use emberrtos_contract::verity::{self, Manifest};

/// The facts a commit records.
#[derive(Clone, Debug)]
pub struct CommitFacts<'a> {
    pub name: &'a str,
    pub version: &'a str,
    pub flavor: Flavor,
    pub arch: rtcheck::Arch,
    pub kernel_release: &'a str,
    pub kernel_config_sha256: &'a str,
    pub kargs: &'a [String],
    pub recipe_sha256: &'a str,
    pub evidence: &'a Evidence,
    /// What the commit asks of its own trial boots on a device.
    pub health: &'a HealthPolicy,
    /// The sha256 of the SBOM written into the tree.
    pub sbom_sha256: Option<&'a str>,
    /// The signed kernel's sha256 and the certificate that signed it.
    pub secure_boot: Option<(&'a str, &'a Certificate)>,
}

/// Builds the commit metadata (pure).
pub fn metadata(facts: &CommitFacts) -> Result<Metadata> {
    let mut m = Metadata::new();
    let mut put = |k: &str, v: MetaValue| {
        m.insert(k.to_string(), v);
    };
    put(key::VERSION, MetaValue::Str(facts.version.into()));
    put(key::BOOTABLE, MetaValue::Bool(true));
    put(key::LINUX, MetaValue::Str(facts.kernel_release.into()));
    put(key::NAME, MetaValue::Str(facts.name.into()));
    put(key::FLAVOR, MetaValue::Str(facts.flavor.to_string()));
    put(key::ARCH, MetaValue::Str(facts.arch.name().into()));
    put(key::KERNEL_RELEASE, MetaValue::Str(facts.kernel_release.into()));
    put(
        key::KERNEL_CONFIG_SHA256,
        MetaValue::Str(facts.kernel_config_sha256.into()),
    );
    put(key::KARGS, MetaValue::StrList(facts.kargs.to_vec()));
    put(key::RECIPE_SHA256, MetaValue::Str(facts.recipe_sha256.into()));
    put(
        key::RT_EVIDENCE,
        MetaValue::Str(serde_json::to_string(facts.evidence)?),
    );
    put(key::HEALTH, MetaValue::Str(facts.health.to_json()));
    if let Some(sbom_sha256) = facts.sbom_sha256 {
        put(key::SBOM_SHA256, MetaValue::Str(sbom_sha256.into()));
    }
    if let Some((kernel_sha256, cert)) = facts.secure_boot {
        put(sb_key::KERNEL_SHA256, MetaValue::Str(kernel_sha256.into()));
        put(sb_key::CERT_SHA256, MetaValue::Str(cert.fingerprint()));
        put(sb_key::CERTIFICATE, MetaValue::Str(cert.pem()));
    }
    for check in &facts.evidence.checks {
        put(
            &format!("{}{}", key::RT_PREFIX, check.id),
            MetaValue::Str(check.status.to_string().to_lowercase()),
        );
    }
    Ok(m)
}

/// The programs under the tree's `usr/` (executables and shared objects)
/// and those among them built for another of EmberRTOS's machines than
/// `arch`: an image must not carry the build host's binaries. Firmware for
/// other processors (`usr/lib/firmware/`) is not the machine's to run.
pub fn programs_for_other_machines(
    tree: &Path,
    arch: rtcheck::Arch,
) -> Result<(usize, Vec<(String, rtcheck::Arch)>)> {
    let (mut programs, mut foreign) = (0, Vec::new());
    for name in verity::usr_files(tree)? {
        if name.starts_with("usr/lib/firmware/") {
            continue;
        }
        let Some(header) = crate::io::elf_header(&tree.join(&name))? else {
            continue;
        };
        if !header.runs() {
            continue;
        }
        programs += 1;
        match header.arch() {
            Some(other) if other != arch => foreign.push((name, other)),
            _ => {}
        }
    }
    Ok((programs, foreign))
}

/// Refuses (exit 3) a tree holding programs for another machine than
/// `arch`, naming them; else the number of programs checked.
pub fn check_programs_machine(tree: &Path, arch: rtcheck::Arch) -> Result<usize> {
    let (programs, foreign) = programs_for_other_machines(tree, arch)?;
    if foreign.is_empty() {
        return Ok(programs);
    }
    const NAMED: usize = 10;
    let mut reasons: Vec<String> = foreign
        .iter()
        .take(NAMED)
        .map(|(name, other)| format!("/{name} is for {}", other.machine()))
        .collect();
    if foreign.len() > NAMED {
        reasons.push(format!("and {} more", foreign.len() - NAMED));
    }
    Err(emberrtos_contract::error::Refused {
        stage: "commit".into(),
        summary: format!(
            "{} of {programs} programs in the tree are not for {} (the recipe's arch: {arch})",
            foreign.len(),
            arch.machine()
        ),
        reasons,
    }
    .into())
}

/// Writes the fs-verity manifest of the tree's `usr/` into the tree (a new
/// file: a hardlinked checkout's objects are never written through) and
/// records its digest in `metadata`; the count of files it lists.
pub fn seal_tree(tree: &Path, metadata: &mut Metadata) -> Result<usize> {
    let manifest = Manifest::of_tree(tree).context("computing the fs-verity digests of usr/")?;
    let text = manifest.render();
    ImageRoot::open(tree)?.write(Path::new(verity::MANIFEST_PATH), text.as_bytes(), 0o644)?;
    let digest = verity::digest_of(text.as_bytes())?;
    metadata.insert(
        verity::key::MANIFEST_DIGEST.to_string(),
        MetaValue::Str(hex::encode(digest)),
    );
    Ok(manifest.files.len())
}

pub fn mark_insecure_cache(metadata: &mut Metadata, artifacts: &[String]) {
    if artifacts.is_empty() {
        return;
    }
    metadata.insert(key::CACHE_INSECURE.into(), MetaValue::Bool(true));
    metadata.insert(
        key::CACHE_INSECURE_ARTIFACTS.into(),
        MetaValue::StrList(artifacts.to_vec()),
    );
}

/// The artifacts a commit says came from unverified cache remote entries;
/// `None` when it says none did. Any value but `false` counts as insecure.
pub fn insecure_cache_of(info: &ostree::CommitInfo) -> Option<Vec<String>> {
    let flag = info.metadata.get(key::CACHE_INSECURE)?;
    if flag == &serde_json::Value::Bool(false) {
        return None;
    }
    let listed = info
        .metadata
        .get(key::CACHE_INSECURE_ARTIFACTS)
        .and_then(|v| v.as_array());
    let artifacts = listed
        .map(|list| {
            list.iter()
                .map(|v| v.as_str().unwrap_or("?").to_string())
                .collect()
        })
        .unwrap_or_default();
    Some(artifacts)
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct CommitOutput {
    pub repo: PathBuf,
    pub checksum: String,
    pub parent: Option<String>,
    pub reused_parent: bool,
    pub stats: WriteStats,
    /// The SBOM the tree carries (absent in stamps of older builds).
    #[serde(default)]
    pub sbom: Option<WrittenSbom>,
}

/// Commits `tree` to the archive repo at `repo_path`, with the ref's current
/// target as parent.
pub fn commit(
    repo_path: &Path,
    ref_name: &str,
    tree: &Path,
    metadata: &Metadata,
    subject: &str,
    timestamp: u64,
) -> Result<CommitOutput> {
    commit_with(repo_path, None, ref_name, tree, metadata, subject, timestamp)
}

/// [`commit`], and with `build_repo` (the repo `tree` is a hardlink
/// checkout of, see [`crate::stages::rootfs::base_commit`]) the commit is
/// written there, files still linked to an object taken without being read
/// (where libostree's inode lookup is exact, see
/// [`ostree::inode_lookup_is_exact`]; elsewhere straight into the archive),
/// and then copied into the archive repo, whose existing objects are not
/// read again: the same checksum as a commit of the tree straight into the
/// archive, for a fraction of the reads.
pub fn commit_with(
    repo_path: &Path,
    build_repo: Option<&Path>,
    ref_name: &str,
    tree: &Path,
    metadata: &Metadata,
    subject: &str,
    timestamp: u64,
) -> Result<CommitOutput> {
    let repo = ostree::open_or_create(repo_path)?;
    let parent = ostree::resolve(&repo, ref_name)?;
    let build = match build_repo {
        Some(path) if ostree::inode_lookup_is_exact(path)? => Some((path, ostree::open(path)?)),
        _ => None,
    };
    let request = CommitRequest {
        tree,
        subject,
        metadata,
        timestamp,
        parent: parent.as_deref(),
        // Unprivileged builds cannot own files as root; record root anyway.
        force_root_owner: !crate::tool::running_as_root(),
        cancellable: None,
        on_entry: None,
        hardlinked: build.is_some(),
        consume: false,
        parent_repo: Some(&repo),
    };
    let result = ostree::commit_tree(build.as_ref().map_or(&repo, |(_, build)| build), request)?;
    if let Some((build_path, build)) = &build
        && !result.reused_parent
    {
        ostree::pull_local(&repo, build_path, &result.checksum)?;
        forget_composed_commits(build)?;
    }
    Ok(CommitOutput {
        repo: repo_path.to_path_buf(),
        checksum: result.checksum,
        parent,
        reused_parent: result.reused_parent,
        stats: result.stats,
        sbom: None,
    })
}

/// Removes from the build repo what no ref holds (the commit just copied
/// into the archive repo and its new files), so it keeps only the bases.
fn forget_composed_commits(build: &::ostree::Repo) -> Result<()> {
    build
        .prune(
            ::ostree::RepoPruneFlags::REFS_ONLY,
            -1,
            ::ostree::gio::Cancellable::NONE,
        )
        .context("pruning the build repo")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use emberrtos_contract::policy::OnInvalid;

    fn info(metadata: &[(&str, serde_json::Value)]) -> ostree::CommitInfo {
        ostree::CommitInfo {
            checksum: "ab".repeat(32),
            parent: None,
            subject: String::new(),
            timestamp: 0,
            metadata: metadata.iter().map(|(k, v)| (k.to_string(), v.clone())).collect(),
            detached_metadata: Default::default(),
        }
    }

    #[test]
    fn programs_for_another_machine_are_refused_by_name() {
        let tree = tempfile::tempdir().unwrap();
        let put = |name: &str, bytes: &[u8]| {
            let path = tree.path().join(name);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, bytes).unwrap();
        };
        let elf = |kind: u8, machine: u16| {
            let mut bytes = b"\x7fELF\x02\x01\x01".to_vec();
            bytes.resize(16, 0);
            bytes.extend([kind, 0]);
            bytes.extend(machine.to_le_bytes());
            bytes.resize(64, 0);
            bytes
        };
        put("usr/bin/sh", &std::fs::read("/bin/sh").unwrap());
        put(
            "usr/lib/x86_64-linux-gnu/libz.so.1",
            &elf(3, rtcheck::elf::EM_X86_64),
        );
        put(
            "usr/lib/grub/arm64-efi/normal.mod",
            &elf(1, rtcheck::elf::EM_AARCH64),
        );
        put("usr/lib/firmware/soc/m4.elf", &elf(2, rtcheck::elf::EM_AARCH64));
        put("usr/share/doc/readme", b"\x7fEL");
        std::os::unix::fs::symlink("/bin/true", tree.path().join("usr/bin/true")).unwrap();
        let x86 = rtcheck::Arch::X86_64;
        assert_eq!(check_programs_machine(tree.path(), x86).unwrap(), 2);

        put(
            "usr/libexec/imgbuild/emberrtos-device",
            &elf(3, rtcheck::elf::EM_AARCH64),
        );
        let error = check_programs_machine(tree.path(), x86).unwrap_err();
        let refused = error
            .downcast_ref::<emberrtos_contract::error::Refused>()
            .unwrap();
        assert!(refused.summary.contains("1 of 3 programs"), "{}", refused.summary);
        assert_eq!(
            refused.reasons,
            ["/usr/libexec/imgbuild/emberrtos-device is for aarch64"]
        );
        // For arm64, it is the two x86_64 programs that are named.
        let (programs, foreign) = programs_for_other_machines(tree.path(), rtcheck::Arch::Arm64).unwrap();
        assert_eq!(programs, 3);
        let names: Vec<&str> = foreign.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["usr/bin/sh", "usr/lib/x86_64-linux-gnu/libz.so.1"]);
    }

    #[test]
    fn insecure_cache_artifacts_are_recorded_and_read_back() {
        let mut metadata = Metadata::new();
        mark_insecure_cache(&mut metadata, &[]);
        assert!(metadata.is_empty(), "a clean build records nothing");
        let artifacts = vec![format!("kernels/{}", "cd".repeat(32))];
        mark_insecure_cache(&mut metadata, &artifacts);
        assert_eq!(metadata.get(key::CACHE_INSECURE), Some(&MetaValue::Bool(true)));
        let json = |v: &MetaValue| match v {
            MetaValue::Bool(b) => serde_json::json!(b),
            MetaValue::StrList(l) => serde_json::json!(l),
            other => panic!("{other:?}"),
        };
        let read: Vec<_> = metadata.iter().map(|(k, v)| (k.as_str(), json(v))).collect();
        assert_eq!(insecure_cache_of(&info(&read)), Some(artifacts));
        assert_eq!(insecure_cache_of(&info(&[])), None);
        let off = [(key::CACHE_INSECURE, serde_json::json!(false))];
        assert_eq!(insecure_cache_of(&info(&off)), None);
        // Anything else fails closed.
        let odd = [(key::CACHE_INSECURE, serde_json::json!("no"))];
        assert_eq!(insecure_cache_of(&info(&odd)), Some(vec![]));
    }

    #[test]
    fn metadata_carries_the_health_policy_for_the_device_to_read_back() {
        let health = HealthPolicy {
            boot_tries: 2,
            latency_seconds: 10,
            on_invalid: OnInvalid::Fail,
            budget_us: 150,
        };
        let kargs = ["nohz_full=1".to_string()];
        let evidence = Evidence::default();
        let sbom = "ef".repeat(32);
        let facts = CommitFacts {
            name: "emberrtos",
            version: "2026.11.1",
            flavor: Flavor::Rt,
            arch: rtcheck::Arch::X86_64,
            kernel_release: "6.12.0",
            kernel_config_sha256: &"ab".repeat(32),
            kargs: &kargs,
            recipe_sha256: &"cd".repeat(32),
            evidence: &evidence,
            health: &health,
            sbom_sha256: Some(&sbom),
            secure_boot: None,
        };
        let metadata = metadata(&facts).unwrap();
        assert_eq!(key::HEALTH, "imgbuild.health");
        let Some(MetaValue::Str(json)) = metadata.get(key::HEALTH) else {
            panic!("no {} string in {metadata:?}", key::HEALTH);
        };
        assert_eq!(HealthPolicy::parse(json), Ok(health));
        let Some(MetaValue::Str(recorded)) = metadata.get(key::SBOM_SHA256) else {
            panic!("no {} in {metadata:?}", key::SBOM_SHA256);
        };
        assert_eq!(recorded, &sbom);
    }
}
