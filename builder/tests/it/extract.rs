//! Extraction refuses hostile archives and never leaves a partial tree.

use crate::common;

use std::io::Write;
use std::path::Path;

use common::files_under;
use imgbuild::io::extract::{ExtractOptions, Truncated, UnsafeEntry, extract_reader, extract_tarball};
use imgbuild::ui::Ui;

/// Appends an entry with a raw name, bypassing the tar crate's own path checks.
fn raw_entry(
    builder: &mut tar::Builder<Vec<u8>>,
    name: &str,
    kind: tar::EntryType,
    link: Option<&str>,
    data: &[u8],
) {
    let mut header = tar::Header::new_old();
    header.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
    if let Some(link) = link {
        header.as_old_mut().linkname[..link.len()].copy_from_slice(link.as_bytes());
    }
    header.set_entry_type(kind);
    header.set_mode(if kind == tar::EntryType::Directory {
        0o755
    } else {
        0o644
    });
    header.set_uid(0);
    header.set_gid(0);
    header.set_mtime(0);
    header.set_size(data.len() as u64);
    header.set_cksum();
    builder.append(&header, data).unwrap();
}

fn archive(entries: &[(&str, tar::EntryType, Option<&str>, &[u8])]) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    for (name, kind, link, data) in entries {
        raw_entry(&mut builder, name, *kind, *link, data);
    }
    builder.into_inner().unwrap()
}

fn refuse(tar: Vec<u8>) -> (UnsafeEntry, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().join("tree");
    let err = extract_reader(&tar[..], &dest, ExtractOptions::default()).unwrap_err();
    let unsafe_entry = err
        .downcast_ref::<UnsafeEntry>()
        .cloned()
        .unwrap_or_else(|| panic!("{err:#}"));
    // Nothing at the destination, and nothing left beside it.
    assert!(!dest.exists());
    assert!(
        files_under(dir.path()).is_empty(),
        "{:?}",
        files_under(dir.path())
    );
    (unsafe_entry, dir)
}

use tar::EntryType::{Directory, Regular, Symlink};

#[test]
fn refuses_parent_dir_entries() {
    let (e, _) = refuse(archive(&[
        ("ok/a", Regular, None, b"a"),
        ("../x", Regular, None, b"evil"),
    ]));
    assert_eq!(e, UnsafeEntry::ParentDir { entry: "../x".into() });
    let (e, _) = refuse(archive(&[("a/../../x", Regular, None, b"evil")]));
    assert!(e.to_string().contains("a/../../x"));
}

#[test]
fn refuses_absolute_entries() {
    let target = format!("/tmp/imgbuild-evil-{}", std::process::id());
    let (e, _) = refuse(archive(&[(&target, Regular, None, b"evil")]));
    assert_eq!(
        e,
        UnsafeEntry::Absolute {
            entry: target.clone()
        }
    );
    assert!(!Path::new(&target).exists());
}

#[test]
fn refuses_writing_through_a_symlink_to_root() {
    let outside = format!("tmp/imgbuild-evil-through-{}", std::process::id());
    let (e, _) = refuse(archive(&[
        ("root", Symlink, Some("/"), b""),
        (&format!("root/{outside}"), Regular, None, b"evil"),
    ]));
    // The absolute link is already refused before anything goes through it.
    assert!(
        matches!(e, UnsafeEntry::LinkEscapes { ref entry, .. } if entry == "root"),
        "{e}"
    );
    assert!(!Path::new("/").join(&outside).exists());

    // A link that stays inside is fine on its own, but nothing may be written through it.
    let (e, _) = refuse(archive(&[
        ("dir", Directory, None, b""),
        ("inside", Symlink, Some("dir"), b""),
        ("inside/file", Regular, None, b"x"),
    ]));
    assert_eq!(
        e,
        UnsafeEntry::ThroughSymlink {
            entry: "inside/file".into(),
            link: "inside".into()
        }
    );
}

#[test]
fn refuses_relative_links_that_escape() {
    let (e, _) = refuse(archive(&[("a/link", Symlink, Some("../../etc/passwd"), b"")]));
    assert!(matches!(e, UnsafeEntry::LinkEscapes { .. }), "{e}");
    let (e, _) = refuse(archive(&[(
        "hard",
        tar::EntryType::Link,
        Some("../outside"),
        b"",
    )]));
    assert!(matches!(e, UnsafeEntry::LinkEscapes { .. }), "{e}");
}

#[test]
fn refuses_device_nodes_unless_allowed() {
    let (e, _) = refuse(archive(&[("dev/sda", tar::EntryType::Block, None, b"")]));
    assert!(matches!(e, UnsafeEntry::UnsupportedType { .. }), "{e}");
}

#[test]
fn extracts_a_good_archive_atomically() {
    let tar = archive(&[
        ("linux/", Directory, None, b""),
        ("linux/Makefile", Regular, None, b"VERSION = 6\n"),
        ("linux/scripts/link", Symlink, Some("../Makefile"), b""),
        ("linux/hard", tar::EntryType::Link, Some("linux/Makefile"), b""),
    ]);
    let dir = tempfile::tempdir().unwrap();
    let xz_path = dir.path().join("src.tar.xz");
    let mut enc = liblzma::write::XzEncoder::new(std::fs::File::create(&xz_path).unwrap(), 1);
    enc.write_all(&tar).unwrap();
    enc.finish().unwrap();
    let dest = dir.path().join("tree");
    let stats = extract_tarball(&xz_path, &dest, ExtractOptions::default(), &Ui::plain()).unwrap();
    assert_eq!(stats.entries, 4);
    assert_eq!(
        std::fs::read_to_string(dest.join("linux/scripts/link")).unwrap(),
        "VERSION = 6\n"
    );
    assert_eq!(
        std::fs::read_to_string(dest.join("linux/hard")).unwrap(),
        "VERSION = 6\n"
    );
    // An existing destination is never overwritten.
    assert!(extract_tarball(&xz_path, &dest, ExtractOptions::default(), &Ui::plain()).is_err());
}

#[test]
fn truncated_archive_leaves_nothing() {
    let big = vec![7u8; 100_000];
    let tar = archive(&[("a", Regular, None, b"a"), ("big", Regular, None, &big)]);
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().join("tree");
    let cut = &tar[..tar.len() / 2];
    assert!(extract_reader(cut, &dest, ExtractOptions::default()).is_err());
    assert!(!dest.exists());
    assert!(files_under(dir.path()).is_empty());
}

#[derive(Clone, Copy, Debug)]
enum Compression {
    Plain,
    Gz,
    Xz,
    Zst,
}

const ALL_COMPRESSIONS: [Compression; 4] = [
    Compression::Plain,
    Compression::Gz,
    Compression::Xz,
    Compression::Zst,
];

fn compress(kind: Compression, data: &[u8]) -> Vec<u8> {
    match kind {
        Compression::Plain => data.to_vec(),
        Compression::Gz => {
            let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            enc.write_all(data).unwrap();
            enc.finish().unwrap()
        }
        Compression::Xz => {
            let mut enc = liblzma::write::XzEncoder::new(Vec::new(), 1);
            enc.write_all(data).unwrap();
            enc.finish().unwrap()
        }
        Compression::Zst => zstd::encode_all(data, 3).unwrap(),
    }
}

/// A small source tree; its last entry is three blocks of data.
fn source_tar() -> Vec<u8> {
    archive(&[
        ("src/", Directory, None, b""),
        ("src/Makefile", Regular, None, b"VERSION = 6\n"),
        ("src/big", Regular, None, &[7u8; 3 * 512]),
    ])
}

/// Extracts `bytes` (an archive file's content) and returns the error; checks
/// that nothing was left at the destination or beside it.
fn extract_fails(bytes: &[u8], what: &str) -> anyhow::Error {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("in").join("src.tar");
    std::fs::create_dir(file.parent().unwrap()).unwrap();
    std::fs::write(&file, bytes).unwrap();
    let dest = dir.path().join("out").join("tree");
    let err = extract_tarball(&file, &dest, ExtractOptions::default(), &Ui::plain())
        .map(|stats| panic!("{what}: a truncated archive was accepted: {stats:?}"))
        .unwrap_err();
    assert!(!dest.exists(), "{what}");
    assert!(
        files_under(&dir.path().join("out")).is_empty(),
        "{what}: {:?}",
        files_under(&dir.path().join("out"))
    );
    err
}

fn assert_truncated(err: &anyhow::Error, what: &str) {
    assert!(err.downcast_ref::<Truncated>().is_some(), "{what}: {err:#}");
    assert!(format!("{err:#}").contains("truncated"), "{what}: {err:#}");
}

#[test]
fn every_compression_of_a_whole_archive_extracts() {
    for kind in ALL_COMPRESSIONS {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("src.tar");
        std::fs::write(&file, compress(kind, &source_tar())).unwrap();
        let dest = dir.path().join("tree");
        let stats = extract_tarball(&file, &dest, ExtractOptions::default(), &Ui::plain())
            .unwrap_or_else(|e| panic!("{kind:?}: {e:#}"));
        assert_eq!(stats.entries, 3, "{kind:?}");
        assert_eq!(std::fs::read(dest.join("src/big")).unwrap(), vec![7u8; 3 * 512]);
    }
}

/// Cut at block boundaries the tar reader alone cannot tell from an end:
/// no end-of-archive marker at all, half of it, and inside an entry's data.
#[test]
fn tar_cut_at_a_block_boundary_is_refused_in_every_compression() {
    let tar = source_tar();
    // The builder ends the stream with the two zero blocks.
    let end_of_entries = tar.len() - 2 * 512;
    let cuts = [
        ("no end marker", end_of_entries),
        ("one zero block", end_of_entries + 512),
        ("inside the last entry", end_of_entries - 2 * 512),
        ("after the last header", end_of_entries - 3 * 512),
    ];
    for kind in ALL_COMPRESSIONS {
        for (name, cut) in cuts {
            let what = format!("{kind:?}, {name}");
            let err = extract_fails(&compress(kind, &tar[..cut]), &what);
            assert_truncated(&err, &what);
        }
    }
}

#[test]
fn lone_zero_block_followed_by_data_is_refused() {
    let tar = source_tar();
    let mut odd = tar[..tar.len() - 2 * 512].to_vec();
    odd.extend_from_slice(&[0u8; 512]);
    odd.extend_from_slice(&[1u8; 512]);
    let err = extract_fails(&odd, "lone zero block");
    assert!(format!("{err:#}").contains("lone zero block"), "{err:#}");
}

#[test]
fn tar_cut_in_the_middle_of_an_entry_is_refused_in_every_compression() {
    let tar = source_tar();
    let cut = tar.len() - 2 * 512 - 1000;
    for kind in ALL_COMPRESSIONS {
        let what = format!("{kind:?}, mid-entry");
        let err = extract_fails(&compress(kind, &tar[..cut]), &what);
        assert_truncated(&err, &what);
    }
}

/// The tar stream is whole but the compressed file is cut: in its middle,
/// and in its trailer (after every tar byte was already decompressed).
#[test]
fn compressed_stream_cut_short_is_refused() {
    let tar = source_tar();
    for kind in [Compression::Gz, Compression::Xz, Compression::Zst] {
        let packed = compress(kind, &tar);
        for (name, cut) in [("middle", packed.len() / 2), ("trailer", packed.len() - 4)] {
            let what = format!("{kind:?}, cut in the {name}");
            let err = extract_fails(&packed[..cut], &what);
            assert_truncated(&err, &what);
        }
    }
}

/// A rootfs may hold absolute links, but a directory entry at a link's own
/// path must not chmod or chown what the link points at on the host.
#[test]
fn a_directory_entry_at_a_link_never_changes_the_host() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let host = tempfile::tempdir().unwrap();
    std::fs::set_permissions(host.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let target = host.path().display().to_string();
    let tar = archive(&[("a", Symlink, Some(&target), b""), ("a/", Directory, None, b"")]);
    let dir = tempfile::tempdir().unwrap();
    let options = ExtractOptions {
        preserve_owners: true,
        skip_special_files: true,
        rootfs_symlinks: true,
    };
    let err = extract_reader(&tar[..], &dir.path().join("root"), options).unwrap_err();
    assert!(
        matches!(
            err.downcast_ref::<UnsafeEntry>(),
            Some(UnsafeEntry::ThroughSymlink { .. })
        ),
        "{err:#}"
    );
    let meta = std::fs::metadata(host.path()).unwrap();
    assert_eq!(meta.mode() & 0o7777, 0o700, "the host directory's mode changed");
}
