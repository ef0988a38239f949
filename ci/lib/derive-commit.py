#!/usr/bin/python3
"""derive-commit.py REPO REF BASE VERSION SUBJECT OVERLAY [KEY=JSON-STRING...]

Test updates for the device tier: commits BASE's tree with OVERLAY's files
laid over it on REF, as BASE's child, with BASE's metadata (its RT evidence
included) and its detached boot evidence, VERSION as `version`, and each
KEY set to the string given. The kernel is BASE's, byte for byte, so its
evidence still describes it; only userspace changes. BASE's fs-verity
manifest is carried over with OVERLAY's files under usr/ measured anew by
fsverity-utils (`fsverity digest`), as `imgbuild` would list them, so the
device's tree check holds for the new commit. Prints the checksum.
Run with Debian's Python (python3-gi, gir1.2-ostree-1.0).
"""
import os
import subprocess
import sys
import tempfile
import time

import gi

gi.require_version("OSTree", "1.0")
from gi.repository import Gio, GLib, OSTree  # noqa: E402

MANIFEST = "usr/lib/emberrtos/fsverity-digests"
MANIFEST_KEY = "imgbuild.fsverity.manifest-digest"


def main(repo_path, ref, base, version, subject, overlay, *pairs):
    repo = OSTree.Repo.new(Gio.File.new_for_path(repo_path))
    repo.open(None)
    _, base = repo.resolve_rev(base, False)
    _, commit, _ = repo.load_commit(base)
    metadata = dict(commit.get_child_value(0).unpack())
    metadata["version"] = version
    for pair in pairs:
        key, value = pair.split("=", 1)
        metadata[key] = value
    _, detached = repo.read_commit_detached_metadata(base, None)
    detached = without_signatures(detached)

    repo.prepare_transaction(None)
    try:
        mtree = OSTree.MutableTree.new()
        _, root, _ = repo.read_commit(base, None)
        repo.write_directory_to_mtree(root, mtree, None, None)
        # Root-owned, canonical modes: the overlay's directories replace
        # those of / and /usr in the tree, whoever ran this.
        modifier = OSTree.RepoCommitModifier.new(
            OSTree.RepoCommitModifierFlags.CANONICAL_PERMISSIONS, None
        )
        repo.write_directory_to_mtree(Gio.File.new_for_path(overlay), mtree, modifier, None)
        with tempfile.TemporaryDirectory() as scratch:
            if MANIFEST_KEY in metadata:
                metadata[MANIFEST_KEY] = resealed_manifest(root, overlay, scratch)
                repo.write_directory_to_mtree(Gio.File.new_for_path(scratch), mtree, modifier, None)
            _, tree = repo.write_mtree(mtree, None)
        variant = GLib.Variant(
            "a{sv}", {k: metadata_value(v) for k, v in metadata.items()}
        )
        # Now (and after BASE): pulls and upgrades refuse older commits, and
        # each test update must be newer than the one before it.
        timestamp = max(OSTree.commit_get_timestamp(commit) + 1, int(time.time()))
        _, checksum = repo.write_commit_with_time(
            base, subject, None, variant, tree, timestamp, None
        )
        if detached is not None:
            repo.write_commit_detached_metadata(checksum, detached, None)
        repo.transaction_set_ref(None, ref, checksum)
        repo.commit_transaction(None)
    except BaseException:
        repo.abort_transaction(None)
        raise
    print(checksum)


def resealed_manifest(root, overlay, scratch):
    """BASE's manifest with OVERLAY's regular files under usr/ measured
    anew, written at SCRATCH/MANIFEST; its own fs-verity digest."""
    header, *lines = read_text(root.resolve_relative_path(MANIFEST)).splitlines()
    digests = {path: digest for digest, path in (line.split(" ", 1) for line in lines)}
    for top, _, files in os.walk(overlay):
        for name in files:
            path = os.path.join(top, name)
            rel = os.path.relpath(path, overlay)
            if rel.startswith("usr/") and os.path.isfile(path) and not os.path.islink(path):
                digests[rel] = fsverity_digest(path)
    out = os.path.join(scratch, MANIFEST)
    os.makedirs(os.path.dirname(out))
    # SCRATCH's directories become /, /usr, /usr/lib... of the new tree:
    # 0755 like theirs (a temporary directory is 0700, and a 0700 / breaks
    # every service that is not root).
    for parent in [scratch] + [os.path.join(scratch, *MANIFEST.split("/")[:n]) for n in range(1, 4)]:
        os.chmod(parent, 0o755)
    with open(out, "w") as f:
        f.write(header + "\n" + "".join(f"{digests[rel]} {rel}\n" for rel in sorted(digests)))
    return fsverity_digest(out)


def read_text(repo_file):
    """A file of a commit, whole, as text."""
    repo_file.ensure_resolved()
    _, stream, _, _ = repo_file.get_repo().load_file(repo_file.get_checksum(), None)
    chunks = []
    while chunk := stream.read_bytes(1 << 20, None).get_data():
        chunks.append(chunk)
    return b"".join(chunks).decode()


def fsverity_digest(path):
    """The file's fs-verity digest (hex), by fsverity-utils."""
    out = subprocess.run(["fsverity", "digest", path], check=True, capture_output=True, text=True)
    return out.stdout.split()[0].removeprefix("sha256:")


def without_signatures(detached):
    """BASE's detached metadata without its signatures: they sign BASE, not
    the new commit, which `imgbuild publish` signs itself."""
    if detached is None:
        return None
    kept = {}
    for i in range(detached.n_children()):
        entry = detached.get_child_value(i)
        key = entry.get_child_value(0).get_string()
        if key == "ostree.gpgsigs" or key.startswith("ostree.sign"):
            continue
        kept[key] = entry.get_child_value(1).get_variant()
    return GLib.Variant("a{sv}", kept)


def metadata_value(value):
    """A Python value from the base commit back as the GVariant it was."""
    if isinstance(value, bool):
        return GLib.Variant("b", value)
    if isinstance(value, str):
        return GLib.Variant("s", value)
    if isinstance(value, list):
        return GLib.Variant("as", value)
    if isinstance(value, int):
        return GLib.Variant("t", value)
    raise SystemExit(f"derive-commit: metadata value {value!r} of an unknown type")


if __name__ == "__main__":
    if len(sys.argv) < 7:
        raise SystemExit(__doc__)
    main(*sys.argv[1:])
