//! The SBOMs the pipeline writes: a commit's, into its tree, and a live
//! ISO's, beside it. Everything is hashed from the image itself, not taken
//! from an earlier stage's notes.

use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result};

use super::{Binary, HashedFile, KernelFacts, PATH_IN_TREE, SbomInputs};
use crate::cache::download::DebianSource;
use emberrtos_contract::io::root::ImageRoot;

/// What the recipe and the fetch stage say of a build.
pub struct BuildFacts<'a> {
    pub name: &'a str,
    pub version: &'a str,
    pub flavor: &'a str,
    pub arch: rtcheck::Arch,
    pub kernel_release: &'a str,
    pub kernel_source_sha256: &'a str,
    pub kernel_source_origin: &'a str,
    /// The Debian source package the kernel source came from, if any.
    pub kernel_debian_source: Option<&'a DebianSource>,
    /// What the kernel stage built (as the verify stage signed it, when the
    /// build has a Secure Boot key): the image's copies must hash the same.
    pub bzimage_sha256: &'a str,
    pub config_sha256: &'a str,
    /// `(the recipe's path, the tree's sha256)` of each overlay.
    pub overlays: Vec<(String, String)>,
    pub epoch: u64,
}

/// An SBOM as written.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct WrittenSbom {
    pub sha256: String,
    pub bytes: u64,
    pub packages: usize,
    pub seconds: f64,
}

impl WrittenSbom {
    pub fn describe(&self, path: &str) -> String {
        format!(
            "SBOM {path}: {} packages, {} bytes, sha256 {}, made in {:.2} s",
            self.packages, self.bytes, self.sha256, self.seconds
        )
    }
}

fn kernel_facts(
    facts: &BuildFacts,
    config_text: &str,
    files: Vec<HashedFile>,
    bzimage_sha256: String,
) -> Result<KernelFacts> {
    let config_sha256 = crate::io::hashing::sha256_hex(config_text);
    for (what, found, built) in [
        ("bzImage", &bzimage_sha256, facts.bzimage_sha256),
        ("config", &config_sha256, facts.config_sha256),
    ] {
        if found != built {
            anyhow::bail!("the image's kernel {what} has sha256 {found}, the kernel stage built {built}");
        }
    }
    let config = rtcheck::kconfig::Config::parse(config_text).context("parsing the kernel config")?;
    Ok(KernelFacts {
        release: facts.kernel_release.to_string(),
        source_sha256: facts.kernel_source_sha256.to_string(),
        source_origin: facts.kernel_source_origin.to_string(),
        debian_source: facts.kernel_debian_source.cloned(),
        config_sha256,
        bzimage_sha256,
        preempt_rt: config.is_preempt_rt(),
        files,
    })
}

/// Makes the commit's SBOM from the composed tree and writes it at
/// [`PATH_IN_TREE`], and as CycloneDX beside it, replacing any file there.
pub fn write_into_tree(tree: &Path, facts: &BuildFacts) -> Result<WrittenSbom> {
    let started = Instant::now();
    let root = ImageRoot::open(tree)?;
    let modules = format!("usr/lib/modules/{}", facts.kernel_release);
    let vmlinuz = HashedFile::in_tree(&root, &format!("{modules}/vmlinuz"))?;
    let config = HashedFile::in_tree(&root, &format!("{modules}/config"))?;
    let config_text =
        super::read_text(&root, &config.path).with_context(|| format!("/{} is not UTF-8", config.path))?;
    let bzimage_sha256 = vmlinuz.sha256.clone();
    let binaries = vec![
        Binary {
            name: "emberrtos-device",
            crate_name: "emberrtos-device",
            file: HashedFile::in_tree(&root, emberrtos_contract::paths::INSTALL_PATH)?,
        },
        Binary {
            name: "jitter",
            crate_name: "jitter",
            file: HashedFile::in_tree(&root, emberrtos_contract::paths::JITTER_INSTALL_PATH)?,
        },
    ];
    let inputs = SbomInputs {
        name: facts.name,
        version: facts.version,
        flavor: facts.flavor,
        arch: facts.arch,
        subject: "ostree commit",
        root: &root,
        kernel: kernel_facts(facts, &config_text, vec![vmlinuz, config], bzimage_sha256)?,
        binaries,
        overlays: facts.overlays.clone(),
        epoch: facts.epoch,
    };
    let document = super::build(&inputs)?;
    let bytes = super::render(&document)?;
    root.write(Path::new(PATH_IN_TREE), &bytes, 0o644)
        .with_context(|| format!("writing /{PATH_IN_TREE}"))?;
    let cyclonedx = super::cyclonedx::render(&super::cyclonedx::from_spdx(&document));
    let cyclonedx_path = super::cyclonedx::PATH_IN_TREE;
    root.write(Path::new(cyclonedx_path), &cyclonedx, 0o644)
        .with_context(|| format!("writing /{cyclonedx_path}"))?;
    Ok(WrittenSbom {
        sha256: crate::io::hashing::sha256_hex(&bytes),
        bytes: bytes.len() as u64,
        packages: document.packages.len(),
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// `<iso>.spdx.json`.
pub fn beside_iso(iso: &Path) -> std::path::PathBuf {
    let mut name = iso.as_os_str().to_owned();
    name.push(".spdx.json");
    name.into()
}

/// The live image's files the ISO SBOM hashes from the host: they are the
/// ones copied into the ISO.
pub struct LiveFiles<'a> {
    pub bzimage: &'a Path,
    pub config: &'a Path,
    pub jitter: &'a Path,
}

/// Makes the live ISO's SBOM from its root (before documentation is
/// trimmed: the copyright files state the licenses) and the files copied
/// into it; returns the document's bytes, written once the ISO is.
pub fn for_live_iso(root: &ImageRoot, facts: &BuildFacts, files: &LiveFiles) -> Result<Vec<u8>> {
    let open = |path: &Path| std::fs::File::open(path).with_context(|| format!("opening {}", path.display()));
    let vmlinuz = HashedFile::read("boot/vmlinuz", open(files.bzimage)?)?;
    let config_text = std::fs::read_to_string(files.config)
        .with_context(|| format!("reading {}", files.config.display()))?;
    let bzimage_sha256 = vmlinuz.sha256.clone();
    let inputs = SbomInputs {
        name: facts.name,
        version: facts.version,
        flavor: facts.flavor,
        arch: facts.arch,
        subject: "live ISO",
        root,
        kernel: kernel_facts(facts, &config_text, vec![vmlinuz], bzimage_sha256)?,
        binaries: vec![Binary {
            name: "jitter",
            crate_name: "jitter",
            file: HashedFile::read("usr/bin/jitter", open(files.jitter)?)?,
        }],
        overlays: facts.overlays.clone(),
        epoch: facts.epoch,
    };
    super::render(&super::build(&inputs)?)
}
