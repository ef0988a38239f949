//! The SPDX 2.3 software bill of materials of an image: its Debian packages
//! (from dpkg's status, licenses from DEP-5 copyright files), its kernel,
//! the workspace's binaries with their crates (from `Cargo.lock`) and the
//! overlays. The same inputs give the same bytes: no clock, no random id.

pub mod crates;
pub mod cyclonedx;
pub mod document;
pub mod dpkg;
pub mod image;
pub mod license;
pub mod summary;

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::path::Path;

use anyhow::{Context, Result};
use sha2::Digest;

use document::{Checksum, Document, ExtractedLicense, File, Package, Relationship, element_id};
use dpkg::InstalledPackage;
use emberrtos_contract::io::root::ImageRoot;

/// Where a commit's SBOM is in its tree.
pub const PATH_IN_TREE: &str = "usr/share/emberrtos/sbom.spdx.json";
/// The commit metadata key holding the SBOM's sha256.
pub const METADATA_KEY: &str = emberrtos_contract::commit::key::SBOM_SHA256;

const CARGO_LOCK: &str = include_str!("../../../Cargo.lock");
/// The workspace members' manifests, for their dev-only dependencies.
const MANIFESTS: &[(&str, &str)] = &[
    ("imgbuild", include_str!("../../Cargo.toml")),
    ("emberrtos-contract", include_str!("../../../contract/Cargo.toml")),
    ("emberrtos-device", include_str!("../../../device/Cargo.toml")),
    ("jitter", include_str!("../../../live-image/jitter/Cargo.toml")),
    ("rtcheck", include_str!("../../../rtcheck/Cargo.toml")),
    ("rtreport", include_str!("../../../rtreport/Cargo.toml")),
    ("cli-docs", include_str!("../../../cli-docs/Cargo.toml")),
];
const OS_ID: &str = "SPDXRef-OS";
/// The kernel's element in every SBOM.
pub const KERNEL_ID: &str = "SPDXRef-kernel-linux";

/// A file of the image, hashed, and the package it belongs to.
#[derive(Clone, Debug)]
pub struct HashedFile {
    /// Its path in the image, relative (`usr/lib/modules/6.12.0/vmlinuz`).
    pub path: String,
    pub sha1: String,
    pub sha256: String,
}

impl HashedFile {
    pub fn read(path: &str, reader: impl Read) -> Result<HashedFile> {
        let mut sha1 = sha1::Sha1::new();
        let mut sha256 = sha2::Sha256::new();
        let mut reader = reader;
        let mut buffer = vec![0u8; 1 << 16];
        loop {
            let n = reader
                .read(&mut buffer)
                .with_context(|| format!("reading {path}"))?;
            if n == 0 {
                break;
            }
            sha1.update(&buffer[..n]);
            sha256.update(&buffer[..n]);
        }
        Ok(HashedFile {
            path: path.to_string(),
            sha1: hex::encode(sha1.finalize()),
            sha256: hex::encode(sha256.finalize()),
        })
    }

    /// A regular file of an image tree, read without leaving it; a symlink
    /// anywhere on its path is refused (ostree would resolve it on the
    /// device, not inside this tree).
    pub fn in_tree(root: &ImageRoot, rel: &str) -> Result<HashedFile> {
        let path = Path::new(rel);
        let regular = root.symlink_metadata(path)?.is_some_and(|m| m.is_file());
        if !regular || root.resolved(path)? != path {
            anyhow::bail!("/{rel} in the image is not a regular file reached without symlinks");
        }
        HashedFile::read(rel, root.open_file(path)?)
    }
}

/// The kernel as the SBOM states it.
#[derive(Clone, Debug)]
pub struct KernelFacts {
    pub release: String,
    pub source_sha256: String,
    /// Where the source came from (a URL becomes the download location).
    pub source_origin: String,
    /// The Debian source package it is, when it came from one
    /// (`linux-source-*`): what vulnerability data knows it by.
    pub debian_source: Option<crate::cache::download::DebianSource>,
    pub config_sha256: String,
    pub bzimage_sha256: String,
    pub preempt_rt: bool,
    /// The kernel's files in the image (the bzImage, the config).
    pub files: Vec<HashedFile>,
}

/// A binary of this workspace shipped in the image.
#[derive(Clone, Debug)]
pub struct Binary {
    pub name: &'static str,
    /// The workspace crate it is built from.
    pub crate_name: &'static str,
    pub file: HashedFile,
}

/// What an SBOM is made from.
pub struct SbomInputs<'a> {
    pub name: &'a str,
    pub version: &'a str,
    pub flavor: &'a str,
    /// The machine the image is for.
    pub arch: rtcheck::Arch,
    /// What the document describes: `ostree commit`, `live ISO`.
    pub subject: &'a str,
    /// The root whose dpkg status and copyright files are read.
    pub root: &'a ImageRoot,
    pub kernel: KernelFacts,
    pub binaries: Vec<Binary>,
    /// `(the recipe's path, the tree's sha256)` of each overlay.
    pub overlays: Vec<(String, String)>,
    pub epoch: u64,
}

/// The most of one text file (a dpkg status, a copyright file, a kernel
/// config, an SBOM) read out of an image: a hostile one cannot fill memory.
pub const MAX_TEXT_BYTES: u64 = 64 << 20;

/// The text of `rel` in the tree, refused above [`MAX_TEXT_BYTES`].
pub fn read_text(root: &ImageRoot, rel: &str) -> Result<String> {
    let file = root.open_file(Path::new(rel))?;
    let size = file.metadata().with_context(|| format!("reading /{rel}"))?.len();
    if size > MAX_TEXT_BYTES {
        anyhow::bail!("/{rel} holds {size} bytes, more than the {MAX_TEXT_BYTES} an image's text file may");
    }
    let mut bytes = Vec::new();
    file.take(MAX_TEXT_BYTES)
        .read_to_end(&mut bytes)
        .with_context(|| format!("reading /{rel}"))?;
    String::from_utf8(bytes).with_context(|| format!("/{rel} is not UTF-8"))
}

/// The installed packages of `root`, from the first dpkg status found.
pub fn installed_packages(root: &ImageRoot) -> Result<Vec<InstalledPackage>> {
    let status = dpkg::STATUS_PATHS
        .iter()
        .find(|path| root.is_file(Path::new(path)))
        .with_context(|| {
            format!(
                "{}: no dpkg status at {:?}",
                root.path().display(),
                dpkg::STATUS_PATHS
            )
        })?;
    let text = read_text(root, status)?;
    dpkg::parse_status(&text).with_context(|| format!("parsing /{status}"))
}

/// A commit's SBOM, read back and checked against the commit's metadata.
#[derive(Clone, Debug, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct CommittedSbom {
    pub path: String,
    pub sha256: String,
    pub bytes: u64,
    pub summary: summary::Summary,
}

/// Reads the SBOM out of commit `info`; its sha256 must be the one the
/// commit's metadata records.
pub fn read_from_commit(repo: &ostree::Repo, info: &crate::ostree::CommitInfo) -> Result<CommittedSbom> {
    let (document, sha256, bytes) = document_of_commit(repo, info)?;
    Ok(CommittedSbom {
        path: format!("/{PATH_IN_TREE}"),
        sha256,
        bytes,
        summary: summary::summarize(&document),
    })
}

/// Commit `info`'s SBOM, its sha256 (checked against the metadata) and size.
pub fn document_of_commit(
    repo: &ostree::Repo,
    info: &crate::ostree::CommitInfo,
) -> Result<(Document, String, u64)> {
    let checksum = &info.checksum;
    let recorded = info
        .metadata
        .get(METADATA_KEY)
        .and_then(|v| v.as_str())
        .with_context(|| {
            format!("commit {checksum} records no SBOM ({METADATA_KEY}): built before SBOMs were made")
        })?;
    let (root, _) = emberrtos_contract::tree::commit_root(repo, checksum)?;
    let bytes = emberrtos_contract::tree::read_regular(&root, PATH_IN_TREE, MAX_TEXT_BYTES)?
        .with_context(|| format!("commit {checksum} has no /{PATH_IN_TREE}"))?;
    let sha256 = crate::io::hashing::sha256_hex(&bytes);
    if sha256 != recorded {
        anyhow::bail!(
            "commit {checksum}: /{PATH_IN_TREE} has sha256 {sha256}, the metadata records {recorded}"
        );
    }
    let document: Document = serde_json::from_slice(&bytes)
        .with_context(|| format!("commit {checksum}: /{PATH_IN_TREE} is not SPDX JSON"))?;
    Ok((document, sha256, bytes.len() as u64))
}

/// Builds the document, namespace included.
pub fn build(inputs: &SbomInputs) -> Result<Document> {
    let debs = installed_packages(inputs.root)?;
    let mut builder = Builder::default();
    builder.packages.push(os_package(inputs));
    builder.relate("SPDXRef-DOCUMENT", "DESCRIBES", OS_ID);
    builder.add_debs(inputs.root, &debs)?;
    builder.add_kernel(&inputs.kernel);
    builder.add_binaries(&inputs.binaries)?;
    builder.add_overlays(&inputs.overlays);
    let mut document = builder.finish(inputs);
    let mut ids = BTreeSet::new();
    let elements = document
        .packages
        .iter()
        .map(|p| &p.spdx_id)
        .chain(document.files.iter().map(|f| &f.spdx_id));
    if let Some(twice) = elements.into_iter().find(|id| !ids.insert(*id)) {
        anyhow::bail!("two elements of the SBOM would share the id {twice}");
    }
    document.document_namespace = namespace(inputs, &document)?;
    Ok(document)
}

/// The document as written: pretty JSON ending in a newline.
pub fn render(document: &Document) -> Result<Vec<u8>> {
    let mut bytes = serde_json::to_vec_pretty(document)?;
    bytes.push(b'\n');
    Ok(bytes)
}

/// A unique, reproducible namespace: the subject and the sha256 of the
/// document's own content. (The commit checksum cannot be used: the commit
/// holds the document.)
fn namespace(inputs: &SbomInputs, document: &Document) -> Result<String> {
    let digest = crate::io::hashing::sha256_hex(render(document)?);
    let slug = |s: &str| document::id_string(s);
    Ok(format!(
        "https://emberrtos.example/spdx/{}/{}/{}/{}-{digest}",
        slug(inputs.name),
        slug(inputs.version),
        slug(inputs.flavor),
        slug(inputs.subject)
    ))
}

fn os_package(inputs: &SbomInputs) -> Package {
    let mut os = Package::new(OS_ID.into(), inputs.name);
    os.version_info = Some(inputs.version.to_string());
    os.primary_package_purpose = Some("OPERATING-SYSTEM".into());
    os.comment = Some(format!(
        "{} flavor for {} ({}); this document describes its {}",
        inputs.flavor,
        inputs.arch,
        inputs.arch.machine(),
        inputs.subject
    ));
    os
}

/// A purl component, percent-encoded outside purl's unreserved set.
fn purl_part(text: &str) -> String {
    let mut out = String::new();
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b".-_~".contains(&byte) {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

const DEBIAN_SOURCE_INFO: &str = "built from the Debian source package ";

/// A Debian package's `sourceInfo`: its source package and version.
pub fn debian_source_info(source: &str, version: &str) -> String {
    format!("{DEBIAN_SOURCE_INFO}{source} {version}")
}

/// The source package and version a [`debian_source_info`] names.
pub fn parse_debian_source_info(text: &str) -> Option<(&str, &str)> {
    let (source, version) = text.strip_prefix(DEBIAN_SOURCE_INFO)?.split_once(' ')?;
    let valid = dpkg::valid_name("Source", source) && !version.is_empty() && !version.contains(' ');
    valid.then_some((source, version))
}

pub fn deb_purl(package: &InstalledPackage) -> String {
    format!(
        "pkg:deb/debian/{}@{}?arch={}",
        purl_part(&package.name),
        purl_part(&package.version),
        purl_part(&package.architecture)
    )
}

#[derive(Default)]
struct Builder {
    packages: Vec<Package>,
    files: Vec<File>,
    relationships: BTreeSet<Relationship>,
    licenses: BTreeMap<String, String>,
}

impl Builder {
    fn relate(&mut self, from: &str, kind: &str, to: &str) {
        self.relationships.insert(Relationship::new(from, kind, to));
    }

    fn add_debs(&mut self, root: &ImageRoot, debs: &[InstalledPackage]) -> Result<()> {
        // `.`: an architecture holds none, so `<name>.<arch>` is one package's alone.
        let id = |p: &InstalledPackage| element_id("deb", &format!("{}.{}", p.name, p.architecture));
        let mut by_name: BTreeMap<&str, String> = BTreeMap::new();
        for deb in debs {
            by_name.entry(&deb.name).or_insert_with(|| id(deb));
        }
        for deb in debs {
            for provided in &deb.provides {
                by_name.entry(provided).or_insert_with(|| id(deb));
            }
        }
        for deb in debs {
            let package_id = id(deb);
            let mut package = Package::new(package_id.clone(), &deb.name).with_purl(deb_purl(deb));
            package.version_info = Some(deb.version.clone());
            package.supplier = "Organization: Debian".into();
            package.source_info = Some(debian_source_info(&deb.source, &deb.source_version));
            package.license_declared = self.stated_license(root, &deb.name)?;
            self.packages.push(package);
            self.relate(OS_ID, "CONTAINS", &package_id);
            for alternatives in &deb.depends {
                let target = alternatives.iter().find_map(|name| by_name.get(name.as_str()));
                if let Some(target) = target.filter(|t| **t != package_id) {
                    self.relate(&package_id, "DEPENDS_ON", target);
                }
            }
        }
        Ok(())
    }

    /// The license `/usr/share/doc/<package>/copyright` states, or NOASSERTION.
    fn stated_license(&mut self, root: &ImageRoot, package: &str) -> Result<String> {
        let rel = format!("usr/share/doc/{package}/copyright");
        if !root.is_file(Path::new(&rel)) {
            return Ok(document::NOASSERTION.into());
        }
        let Ok(text) = read_text(root, &rel) else {
            // Not UTF-8 (or too large): it states nothing this can read.
            return Ok(document::NOASSERTION.into());
        };
        let Some(debian) = license::stated_by_copyright(&text) else {
            return Ok(document::NOASSERTION.into());
        };
        let stated = license::to_spdx(&debian);
        for (id, name) in stated.references {
            self.licenses.entry(id).or_insert(name);
        }
        Ok(stated.expression)
    }

    fn add_files(&mut self, owner: &str, files: &[HashedFile]) {
        for file in files {
            let id = element_id("file", &file.path);
            self.files.push(File {
                spdx_id: id.clone(),
                file_name: format!("./{}", file.path),
                checksums: vec![
                    Checksum {
                        algorithm: "SHA1".into(),
                        checksum_value: file.sha1.clone(),
                    },
                    Checksum::sha256(&file.sha256),
                ],
                license_concluded: document::NOASSERTION.into(),
                copyright_text: document::NOASSERTION.into(),
                comment: None,
            });
            // Not `owner CONTAINS file`: SPDX allows that only of a package
            // whose files were analysed, which none here is.
            self.relate(&id, "GENERATED_FROM", owner);
        }
    }

    fn add_kernel(&mut self, kernel: &KernelFacts) {
        let upstream: String = kernel
            .release
            .chars()
            .take_while(|c| c.is_ascii_digit() || *c == '.')
            .collect();
        let mut package = Package::new(KERNEL_ID.into(), "linux")
            .with_purl(format!("pkg:generic/linux@{}", purl_part(&upstream)));
        package.version_info = Some(upstream);
        if kernel.source_origin.starts_with("https://") || kernel.source_origin.starts_with("http://") {
            package.download_location = kernel.source_origin.clone();
        }
        package.checksums = vec![Checksum::sha256(&kernel.source_sha256)];
        package.license_declared = "GPL-2.0-only WITH Linux-syscall-note".into();
        let tarball = format!(
            "source tarball sha256 {} ({})",
            kernel.source_sha256, kernel.source_origin
        );
        package.source_info = Some(match &kernel.debian_source {
            Some(source) => debian_source_info(&source.name, &source.version),
            None => tarball.clone(),
        });
        package.comment = Some(format!(
            "{tarball}; release {}; PREEMPT_RT: {}; .config sha256 {}; bzImage sha256 {}",
            kernel.release,
            if kernel.preempt_rt { "yes" } else { "no" },
            kernel.config_sha256,
            kernel.bzimage_sha256
        ));
        self.packages.push(package);
        self.relate(OS_ID, "CONTAINS", KERNEL_ID);
        self.add_files(KERNEL_ID, &kernel.files);
    }

    fn add_binaries(&mut self, binaries: &[Binary]) -> Result<()> {
        let dev_only = MANIFESTS
            .iter()
            .map(|(name, manifest)| Ok((name.to_string(), crates::dev_only_dependencies(manifest)?)))
            .collect::<Result<BTreeMap<_, _>>>()?;
        let mut crates_seen = BTreeSet::new();
        for binary in binaries {
            let binary_id = element_id("bin", binary.name);
            let mut package = Package::new(binary_id.clone(), binary.name);
            package.version_info = Some(env!("CARGO_PKG_VERSION").into());
            package.primary_package_purpose = Some("APPLICATION".into());
            package.comment = Some(format!("built from the workspace crate {}", binary.crate_name));
            self.packages.push(package);
            self.relate(OS_ID, "CONTAINS", &binary_id);
            self.add_files(&binary_id, std::slice::from_ref(&binary.file));
            for locked in crates::closure(CARGO_LOCK, binary.crate_name, &dev_only)? {
                let from = if locked.name == binary.crate_name && !locked.crates_io {
                    binary_id.clone()
                } else {
                    crate_id(&locked.name, &locked.version)
                };
                for (name, version) in &locked.dependencies {
                    self.relate(&from, "DEPENDS_ON", &crate_id(name, version));
                }
                if from != binary_id && crates_seen.insert(from.clone()) {
                    self.packages.push(crate_package(&locked, from));
                }
            }
        }
        Ok(())
    }

    fn add_overlays(&mut self, overlays: &[(String, String)]) {
        for (name, tree_sha256) in overlays {
            let id = element_id("overlay", name);
            let mut package = Package::new(id.clone(), &format!("overlay {name}"));
            package.checksums = vec![Checksum::sha256(tree_sha256)];
            package.comment = Some(
                "checksum: the sha256 of the overlay tree (paths, modes, link targets, contents)".into(),
            );
            self.packages.push(package);
            self.relate(OS_ID, "CONTAINS", &id);
        }
    }

    fn finish(mut self, inputs: &SbomInputs) -> Document {
        self.files.sort_by(|a, b| a.file_name.cmp(&b.file_name));
        Document {
            spdx_version: "SPDX-2.3".into(),
            data_license: "CC0-1.0".into(),
            spdx_id: "SPDXRef-DOCUMENT".into(),
            name: format!(
                "{} {} ({}) {}",
                inputs.name, inputs.version, inputs.flavor, inputs.subject
            ),
            document_namespace: String::new(),
            creation_info: document::CreationInfo {
                created: rtreport::utc::rfc3339(inputs.epoch),
                creators: vec![format!("Tool: imgbuild-{}", env!("CARGO_PKG_VERSION"))],
            },
            packages: self.packages,
            files: self.files,
            relationships: self.relationships.into_iter().collect(),
            has_extracted_licensing_infos: self
                .licenses
                .into_iter()
                .map(|(license_id, name)| ExtractedLicense {
                    extracted_text: format!(
                        "The Debian license name \"{name}\", as the `Files: *` paragraph of a package's \
                         DEP-5 copyright file (/usr/share/doc/<package>/copyright) states it; \
                         SPDX has no identifier it maps to one-to-one."
                    ),
                    license_id,
                    name,
                })
                .collect(),
        }
    }
}

fn crate_id(name: &str, version: &str) -> String {
    element_id("crate", &format!("{name}-{version}"))
}

fn crate_package(locked: &crates::LockedCrate, id: String) -> Package {
    let mut package = Package::new(id, &locked.name).with_purl(locked.purl());
    package.version_info = Some(locked.version.clone());
    package.primary_package_purpose = Some("LIBRARY".into());
    if locked.crates_io {
        package.download_location = format!(
            "https://crates.io/api/v1/crates/{}/{}/download",
            locked.name, locked.version
        );
    }
    if let Some(checksum) = &locked.checksum {
        package.checksums = vec![Checksum::sha256(checksum)];
    }
    package
}

#[cfg(test)]
mod tests;
