use super::*;

const STATUS: &str = "\
Package: libc6
Status: install ok installed
Architecture: amd64
Source: glibc
Version: 2.36-9+deb12u10

Package: bash
Status: install ok installed
Architecture: amd64
Version: 5.2.15-2+b7
Pre-Depends: libc6 (>= 2.36)
Depends: awk | mawk

Package: mawk
Status: install ok installed
Architecture: amd64
Version: 1:1.3.4.20200120-3.1
Provides: awk
";

const BASH_COPYRIGHT: &str = "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n\n\
Files: *\nCopyright: 1987-2022 Free Software Foundation, Inc.\nLicense: GPL-3+\n";

fn tree() -> (tempfile::TempDir, ImageRoot) {
    let dir = tempfile::tempdir().unwrap();
    let root = ImageRoot::open(dir.path()).unwrap();
    root.write(Path::new(dpkg::STATUS_PATHS[0]), STATUS.as_bytes(), 0o644)
        .unwrap();
    root.write(
        Path::new("usr/share/doc/bash/copyright"),
        BASH_COPYRIGHT.as_bytes(),
        0o644,
    )
    .unwrap();
    root.write(
        Path::new("usr/share/doc/mawk/copyright"),
        b"Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n\nFiles: *\nLicense: public-domain\n",
        0o644,
    )
    .unwrap();
    (dir, root)
}

fn hashed(path: &str, bytes: &[u8]) -> HashedFile {
    HashedFile::read(path, bytes).unwrap()
}

fn inputs(root: &ImageRoot) -> SbomInputs<'_> {
    SbomInputs {
        name: "emberrtos",
        version: "2026.12.1",
        flavor: "rt",
        arch: rtcheck::Arch::X86_64,
        subject: "ostree commit",
        root,
        kernel: KernelFacts {
            release: "6.12.58".into(),
            source_sha256: "ab".repeat(32),
            source_origin: "Debian package linux-source-6.12".into(),
            debian_source: Some(crate::cache::download::DebianSource {
                name: "linux-6.12".into(),
                version: "6.12.58-1~deb12u1".into(),
            }),
            config_sha256: "cd".repeat(32),
            bzimage_sha256: "ef".repeat(32),
            preempt_rt: true,
            files: vec![hashed("usr/lib/modules/6.12.58/vmlinuz", b"kernel")],
        },
        binaries: vec![Binary {
            name: "jitter",
            crate_name: "jitter",
            file: hashed("usr/libexec/emberrtos/jitter", b"elf"),
        }],
        overlays: vec![("../overlays/base".into(), "12".repeat(32))],
        epoch: 1_764_460_800,
    }
}

fn package<'a>(document: &'a Document, id: &str) -> &'a Package {
    document
        .packages
        .iter()
        .find(|p| p.spdx_id == id)
        .unwrap_or_else(|| panic!("no package {id}"))
}

#[test]
fn every_installed_package_with_its_purl_source_and_license() {
    let (_dir, root) = tree();
    let document = build(&inputs(&root)).unwrap();
    let debs: Vec<_> = document
        .packages
        .iter()
        .filter(|p| p.spdx_id.starts_with("SPDXRef-deb-"))
        .map(|p| (p.name.as_str(), p.version_info.as_deref().unwrap()))
        .collect();
    assert_eq!(
        debs,
        [
            ("bash", "5.2.15-2+b7"),
            ("libc6", "2.36-9+deb12u10"),
            ("mawk", "1:1.3.4.20200120-3.1")
        ]
    );
    let bash = package(&document, "SPDXRef-deb-bash.amd64");
    assert_eq!(bash.purl(), Some("pkg:deb/debian/bash@5.2.15-2%2Bb7?arch=amd64"));
    assert_eq!(bash.license_declared, "GPL-3.0-or-later");
    let libc = package(&document, "SPDXRef-deb-libc6.amd64");
    assert_eq!(
        libc.license_declared, "NOASSERTION",
        "no copyright file: nothing is guessed"
    );
    assert_eq!(
        libc.source_info.as_deref(),
        Some("built from the Debian source package glibc 2.36-9+deb12u10")
    );
    assert_eq!(
        parse_debian_source_info(libc.source_info.as_deref().unwrap()),
        Some(("glibc", "2.36-9+deb12u10"))
    );
    let mawk = package(&document, "SPDXRef-deb-mawk.amd64");
    assert_eq!(
        mawk.purl(),
        Some("pkg:deb/debian/mawk@1%3A1.3.4.20200120-3.1?arch=amd64")
    );
    assert_eq!(mawk.license_declared, "LicenseRef-debian-public-domain");
    assert_eq!(document.has_extracted_licensing_infos.len(), 1);
    assert_eq!(
        document.has_extracted_licensing_infos[0].license_id,
        mawk.license_declared
    );
}

#[test]
fn relationships_mean_something() {
    let (_dir, root) = tree();
    let document = build(&inputs(&root)).unwrap();
    let has = |from: &str, kind: &str, to: &str| {
        document
            .relationships
            .contains(&Relationship::new(from, kind, to))
    };
    assert!(has("SPDXRef-DOCUMENT", "DESCRIBES", OS_ID));
    let os = document.packages.iter().find(|p| p.spdx_id == OS_ID).unwrap();
    let comment = os.comment.as_deref().unwrap();
    assert!(comment.starts_with("rt flavor for x86_64 (x86_64);"), "{comment}");
    assert!(has(OS_ID, "CONTAINS", "SPDXRef-deb-bash.amd64"));
    assert!(has(
        "SPDXRef-deb-bash.amd64",
        "DEPENDS_ON",
        "SPDXRef-deb-libc6.amd64"
    ));
    assert!(
        has("SPDXRef-deb-bash.amd64", "DEPENDS_ON", "SPDXRef-deb-mawk.amd64"),
        "awk is provided by mawk"
    );
    assert!(has(OS_ID, "CONTAINS", KERNEL_ID));
    assert!(has(
        &element_id("file", "usr/lib/modules/6.12.58/vmlinuz"),
        "GENERATED_FROM",
        KERNEL_ID
    ));
    assert!(has(
        "SPDXRef-bin-jitter",
        "DEPENDS_ON",
        &crate_id("rtcheck", "0.1.0")
    ));
    let ids: BTreeSet<&str> = document
        .packages
        .iter()
        .map(|p| p.spdx_id.as_str())
        .chain(document.files.iter().map(|f| f.spdx_id.as_str()))
        .chain(["SPDXRef-DOCUMENT"])
        .collect();
    for r in &document.relationships {
        assert!(ids.contains(r.spdx_element_id.as_str()), "{r:?}");
        assert!(ids.contains(r.related_spdx_element.as_str()), "{r:?}");
    }
}

#[test]
fn the_kernel_and_the_crates_are_stated() {
    let (_dir, root) = tree();
    let document = build(&inputs(&root)).unwrap();
    let kernel = package(&document, KERNEL_ID);
    assert_eq!(kernel.version_info.as_deref(), Some("6.12.58"));
    assert_eq!(kernel.checksums, [Checksum::sha256(&"ab".repeat(32))]);
    let comment = kernel.comment.as_deref().unwrap();
    assert!(comment.contains("PREEMPT_RT: yes"), "{comment}");
    assert!(
        comment.contains(&format!("source tarball sha256 {}", "ab".repeat(32))),
        "{comment}"
    );
    // Built from linux-source-6.12: vulnerability data knows it by its Debian source.
    assert_eq!(
        parse_debian_source_info(kernel.source_info.as_deref().unwrap()),
        Some(("linux-6.12", "6.12.58-1~deb12u1"))
    );
    assert!(
        comment.contains(&"cd".repeat(32)) && comment.contains(&"ef".repeat(32)),
        "{comment}"
    );
    let crates: Vec<_> = document
        .packages
        .iter()
        .filter(|p| p.spdx_id.starts_with("SPDXRef-crate-"))
        .collect();
    assert!(
        crates.iter().any(|p| p.name == "serde_json"),
        "jitter writes JSON with serde_json"
    );
    for krate in &crates {
        assert!(krate.purl().unwrap().starts_with("pkg:cargo/"), "{krate:?}");
        assert_ne!(krate.name, "proptest", "a dev-dependency is not in the binary");
    }
}

#[test]
fn the_same_inputs_give_the_same_bytes_and_other_inputs_another_namespace() {
    let (_dir, root) = tree();
    let first = render(&build(&inputs(&root)).unwrap()).unwrap();
    let second = render(&build(&inputs(&root)).unwrap()).unwrap();
    assert_eq!(first, second);
    let mut changed = inputs(&root);
    changed.overlays[0].1 = "34".repeat(32);
    let other = build(&changed).unwrap();
    let first: Document = serde_json::from_slice(&first).unwrap();
    assert_ne!(first.document_namespace, other.document_namespace);
    assert_eq!(first.creation_info.created, "2025-11-30T00:00:00Z");
}

#[test]
fn a_status_file_linking_out_of_the_tree_is_not_read() {
    let dir = tempfile::tempdir().unwrap();
    let root = ImageRoot::open(dir.path()).unwrap();
    std::fs::create_dir_all(dir.path().join("var/lib/dpkg")).unwrap();
    std::os::unix::fs::symlink(
        "../../../../../../etc/passwd",
        dir.path().join("var/lib/dpkg/status"),
    )
    .unwrap();
    let err = build(&inputs(&root)).unwrap_err();
    assert!(format!("{err:#}").contains("no dpkg status"), "{err:#}");
}

#[test]
fn a_kernel_file_reached_through_a_symlink_is_refused() {
    let (dir, root) = tree();
    root.write(
        Path::new("usr/lib/modules/6.12.58/other"),
        b"another kernel",
        0o644,
    )
    .unwrap();
    std::os::unix::fs::symlink("other", dir.path().join("usr/lib/modules/6.12.58/vmlinuz")).unwrap();
    let err = HashedFile::in_tree(&root, "usr/lib/modules/6.12.58/vmlinuz").unwrap_err();
    assert!(err.to_string().contains("not a regular file"), "{err:#}");
    std::fs::create_dir_all(dir.path().join("real")).unwrap();
    std::fs::write(dir.path().join("real/vmlinuz"), b"k").unwrap();
    std::os::unix::fs::symlink("real", dir.path().join("linked")).unwrap();
    assert!(
        HashedFile::in_tree(&root, "linked/vmlinuz").is_err(),
        "a link in the parent path"
    );
    assert!(HashedFile::in_tree(&root, "real/vmlinuz").is_ok());
}

#[test]
fn a_huge_status_file_is_refused_before_it_is_read() {
    let (dir, root) = tree();
    let status = std::fs::File::create(dir.path().join(dpkg::STATUS_PATHS[0])).unwrap();
    status.set_len(MAX_TEXT_BYTES + 1).unwrap();
    let err = build(&inputs(&root)).unwrap_err();
    assert!(format!("{err:#}").contains("more than the"), "{err:#}");
}

#[test]
fn a_source_info_names_a_debian_source_or_nothing() {
    for bad in [
        "built from the Debian source package glibc",
        "built from the Debian source package Glibc 2.36",
        "built from the Debian source package glibc 2.36 extra",
        "built from the Debian source package ../x 1",
        "glibc 2.36",
    ] {
        assert_eq!(parse_debian_source_info(bad), None, "{bad}");
    }
}

#[test]
fn the_cyclonedx_document_names_the_spdx_packages() {
    let (_dir, root) = tree();
    let document = build(&inputs(&root)).unwrap();
    let bom = cyclonedx::from_spdx(&document);
    assert_eq!(bom["specVersion"], "1.5");
    let metadata = &bom["metadata"]["component"];
    assert_eq!(metadata["type"], "operating-system");
    let components = bom["components"].as_array().unwrap();
    let named = |value: &serde_json::Value| {
        let version = value["version"].as_str().map(String::from);
        (value["name"].as_str().unwrap().to_string(), version)
    };
    let mut cdx: Vec<_> = components.iter().chain([metadata]).map(named).collect();
    let mut spdx: Vec<_> = document
        .packages
        .iter()
        .map(|p| (p.name.clone(), p.version_info.clone()))
        .collect();
    cdx.sort();
    spdx.sort();
    assert_eq!(cdx, spdx);
    let bash = components.iter().find(|c| c["name"] == "bash").unwrap();
    assert_eq!(bash["purl"], "pkg:deb/debian/bash@5.2.15-2%2Bb7?arch=amd64");
    assert_eq!(bash["licenses"][0]["expression"], "GPL-3.0-or-later");
    assert_eq!(bash["supplier"]["name"], "Debian");
    let kernel = components
        .iter()
        .find(|c| c["bom-ref"] == "SPDXRef-kernel-linux")
        .unwrap();
    assert_eq!(kernel["type"], "operating-system");
    assert_eq!(kernel["hashes"][0]["alg"], "SHA-256");
    let refs: std::collections::BTreeSet<&str> = components
        .iter()
        .map(|c| c["bom-ref"].as_str().unwrap())
        .collect();
    for dependency in bom["dependencies"].as_array().unwrap() {
        assert!(refs.contains(dependency["ref"].as_str().unwrap()), "{dependency}");
        for on in dependency["dependsOn"].as_array().unwrap() {
            assert!(refs.contains(on.as_str().unwrap()), "{dependency}");
        }
    }
}
