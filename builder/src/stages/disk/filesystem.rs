//! Writing the disk without loop mounts: `sgdisk` lays the GPT into the image
//! file, `mkfs.ext4 -d` builds each ext4 filesystem straight at its
//! partition's offset (`-E offset=`), and mtools formats and fills the ESP at
//! its offset (`IMAGE@@OFFSET`). Every timestamp is the build epoch and every
//! UUID comes from the [`Layout`], so the image bytes follow the inputs.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result};

use super::layout::{Layout, Partition, Role, SECTOR, Usage};
use crate::tool;

/// FAT's first representable time, 1980-01-01T00:00:00Z: the timestamp of
/// every entry of a FAT image (the ESP, a configuration medium) when
/// `SOURCE_DATE_EPOCH` is not set.
pub const FAT_FIRST_EPOCH: u64 = 315_532_800;
/// FAT's last representable time, 2107-12-31T23:59:58Z.
pub const LAST_FAT_EPOCH: u64 = 4_354_819_198;

/// Writes the protective MBR and both GPTs of `layout` into `image`.
pub fn write_gpt(image: &Path, layout: &Layout) -> Result<()> {
    let mut cmd = tool::command("sgdisk")?;
    cmd.arg("--clear")
        .arg(format!("--disk-guid={}", layout.disk_guid));
    for p in &layout.partitions {
        let n = p.number;
        cmd.arg(format!("--new={n}:{}:{}", p.first_sector(), p.last_sector()))
            .arg(format!("--typecode={n}:{}", p.role.type_code()))
            .arg(format!("--change-name={n}:{}", p.role.label()))
            .arg(format!("--partition-guid={n}:{}", p.partuuid));
    }
    tool::run(cmd.arg(image)).context("writing the partition table")?;
    Ok(())
}

/// One ext4 filesystem built from a directory at its partition's offset.
pub struct Ext4<'a> {
    pub image: &'a Path,
    pub partition: &'a Partition,
    /// The directory whose contents become the filesystem (owners, modes,
    /// xattrs and hard links kept by `mkfs.ext4 -d`).
    pub source: &'a Path,
    pub label: &'a str,
    /// The htree hash seed, derived like the UUID.
    pub hash_seed: uuid::Uuid,
    pub inodes: Option<u64>,
    pub epoch: u64,
    /// ext4's `verity` feature, so the device can seal its files with
    /// fs-verity (the root filesystem, which holds the OS tree).
    pub verity: bool,
}

/// `mkfs.ext4 -d` into the image at the partition's offset. The image's
/// other bytes are left alone; no discard (it would punch the whole file on
/// some e2fsprogs versions).
pub fn make_ext4(fs: &Ext4) -> Result<()> {
    let p = fs.partition;
    let blocks = p.size / 4096;
    let mut cmd = tool::command("mkfs.ext4")?;
    // e2fsprogs reads a fake time of 0 as none.
    cmd.env("E2FSPROGS_FAKE_TIME", fs.epoch.max(1).to_string())
        .env("SOURCE_DATE_EPOCH", fs.epoch.to_string())
        .env("MKE2FS_CONFIG", "/etc/mke2fs.conf")
        .args(["-q", "-F", "-b", "4096", "-T", "default", "-L", fs.label])
        .arg("-U")
        .arg(&p.fs_uuid)
        .arg("-E")
        .arg(format!(
            "offset={},root_owner=0:0,hash_seed={},nodiscard",
            p.offset, fs.hash_seed
        ))
        .arg("-d")
        .arg(fs.source);
    if let Some(inodes) = fs.inodes {
        cmd.arg("-N").arg(inodes.to_string());
    }
    if fs.verity {
        cmd.args(["-O", "verity"]);
    }
    cmd.arg(fs.image).arg(blocks.to_string());
    tool::run(&mut cmd).with_context(|| format!("building the {} filesystem", p.role.name()))?;
    set_times(fs.image, p, fs.epoch)
        .with_context(|| format!("fixing the {} filesystem's times", p.role.name()))
}

/// `IMAGE?offset=N`, how e2fsprogs' tools address a filesystem in an image.
fn at_offset(image: &Path, partition: &Partition) -> std::ffi::OsString {
    let mut target = image.as_os_str().to_owned();
    target.push(format!("?offset={}", partition.offset));
    target
}

/// Sets every used inode's change and access times to `epoch`. `mkfs.ext4
/// -d` of e2fsprogs 1.47.0 copies each source file's ctime, which no one can
/// set (1.47.1 clamps it to `SOURCE_DATE_EPOCH`), and its atime, which its
/// own reading moves; `debugfs` sets both, by inode number.
fn set_times(image: &Path, partition: &Partition, epoch: u64) -> Result<()> {
    let target = at_offset(image, partition);
    let listing = tool::run(tool::command("dumpe2fs")?.arg(&target))?;
    let inodes = used_inodes(&String::from_utf8_lossy(&listing.stdout))?;
    let mut commands = String::new();
    for inode in inodes
        .into_iter()
        .filter(|&i| i == ROOT_INODE || i >= FIRST_INODE)
    {
        for field in ["ctime", "atime"] {
            commands.push_str(&format!("set_inode_field <{inode}> {field} @{epoch}\n"));
        }
    }
    let mut file = tempfile::NamedTempFile::new()?;
    std::io::Write::write_all(&mut file, commands.as_bytes())?;
    let output = tool::run(
        tool::command("debugfs")?
            // Or closing the filesystem stamps the clock into the superblock.
            .env("E2FSPROGS_FAKE_TIME", epoch.max(1).to_string())
            .arg("-w")
            .arg("-f")
            .arg(file.path())
            .arg(&target),
    )?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    // debugfs reports a failed command on stderr and still exits 0.
    if let Some(line) = stderr.lines().find(|l| !l.starts_with("debugfs ")) {
        anyhow::bail!("debugfs: {line}");
    }
    Ok(())
}

const ROOT_INODE: u64 = 2;
/// The first inode that is not reserved.
const FIRST_INODE: u64 = 11;

/// The inodes in use, from `dumpe2fs`'s listing: every inode of each group
/// that its `Free inodes:` line does not name. Pure.
pub fn used_inodes(listing: &str) -> Result<Vec<u64>> {
    let per_group: u64 = listing
        .lines()
        .find_map(|l| l.strip_prefix("Inodes per group:"))
        .context("dumpe2fs printed no `Inodes per group`")?
        .trim()
        .parse()
        .context("dumpe2fs's `Inodes per group` is not a number")?;
    let mut used = Vec::new();
    let mut group = 0;
    for line in listing.lines() {
        // Indented: the header's own `Free inodes:` is a count.
        let Some(free) = line.strip_prefix("  Free inodes:") else {
            continue;
        };
        let first = group * per_group + 1;
        let mut free_set = Vec::new();
        for range in free.split(',').map(str::trim).filter(|r| !r.is_empty()) {
            let (a, b) = range.split_once('-').unwrap_or((range, range));
            let (a, b): (u64, u64) = (a.parse()?, b.parse()?);
            free_set.push(a..=b);
        }
        used.extend((first..first + per_group).filter(|i| !free_set.iter().any(|r| r.contains(i))));
        group += 1;
    }
    anyhow::ensure!(group > 0, "dumpe2fs listed no groups");
    Ok(used)
}

/// An mtools command on the FAT filesystem at `partition` in `image`, its
/// timestamps `epoch` held inside what FAT can represent.
fn mtools(tool_name: &str, image: &Path, partition: &Partition, epoch: u64) -> Result<Command> {
    let epoch = epoch.clamp(FAT_FIRST_EPOCH, LAST_FAT_EPOCH);
    let mut cmd = tool::command(tool_name)?;
    let mut target = image.as_os_str().to_owned();
    target.push(format!("@@{}", partition.offset));
    cmd.env("MTOOLS_SKIP_CHECK", "1")
        .env("MTOOLSRC", "/dev/null")
        .env("TZ", "UTC")
        .env("SOURCE_DATE_EPOCH", epoch.to_string())
        .arg("-i")
        .arg(target);
    Ok(cmd)
}

/// Formats the ESP as FAT32 labelled `EFI` and copies `files` onto it:
/// each (host files, path on the ESP), the path a directory ending in `/`
/// when there are several. `dirs` are created first, parents first.
pub fn make_esp(
    image: &Path,
    esp: &Partition,
    volume_id: u32,
    epoch: u64,
    dirs: &[&str],
    files: &[(Vec<PathBuf>, String)],
) -> Result<()> {
    debug_assert_eq!(esp.role, Role::Esp);
    let sectors = esp.size / SECTOR;
    tool::run(
        mtools("mformat", image, esp, epoch)?
            .args(["-F", "-v", "EFI", "-h", "64", "-s", "32"])
            .arg("-N")
            .arg(format!("{volume_id:08x}"))
            .arg("-T")
            .arg(sectors.to_string())
            .arg("-H")
            .arg(esp.first_sector().to_string())
            .arg("::"),
    )
    .context("formatting the ESP")?;
    for dir in dirs {
        tool::run(mtools("mmd", image, esp, epoch)?.arg(format!("::{dir}")))?;
    }
    for (hosts, target) in files {
        tool::run(
            mtools("mcopy", image, esp, epoch)?
                .args(hosts)
                .arg(format!("::{target}")),
        )
        .with_context(|| format!("copying onto the ESP's {target}"))?;
    }
    Ok(())
}

/// `qemu-img convert -O qcow2`.
pub fn convert_qcow2(raw: &Path, out: &Path) -> Result<()> {
    tool::run(
        tool::command("qemu-img")?
            .args(["convert", "-q", "-f", "raw", "-O", "qcow2"])
            .arg(raw)
            .arg(out),
    )
    .context("converting the disk to qcow2")?;
    Ok(())
}

/// Every entry under `dir` with its own metadata (links themselves, never
/// their targets: walkdir does not follow links here).
fn entries_with_metadata(
    dir: &Path,
) -> impl Iterator<Item = Result<(walkdir::DirEntry, std::fs::Metadata)>> + '_ {
    walkdir::WalkDir::new(dir).into_iter().map(move |entry| {
        let entry = entry.with_context(|| format!("walking {}", dir.display()))?;
        let meta = entry
            .metadata()
            .with_context(|| format!("reading {}", entry.path().display()))?;
        Ok((entry, meta))
    })
}

/// Sets every timestamp newer than `epoch` under `dir` (links themselves,
/// not their targets) to `epoch`, so `mkfs.ext4 -d` copies stable times.
/// Older ones (ostree's objects carry 0) are kept.
pub fn clamp_mtimes(dir: &Path, epoch: u64) -> Result<()> {
    let epoch = i64::try_from(epoch).context("the epoch does not fit a timestamp")?;
    for entry in entries_with_metadata(dir) {
        let (entry, meta) = entry?;
        if meta.mtime() <= epoch && meta.atime() <= epoch {
            continue;
        }
        let time = libc::timespec {
            tv_sec: epoch,
            tv_nsec: 0,
        };
        // ostree makes deployments immutable (`chattr +i`): lifted for the
        // change, then put back.
        let immutable = entry.file_type().is_dir() && is_immutable(entry.path())?;
        if immutable {
            set_immutable(entry.path(), false)?;
        }
        let path = std::ffi::CString::new(entry.path().as_os_str().as_encoded_bytes())
            .context("a path with a NUL byte")?;
        // SAFETY: `path` is NUL-terminated and `times` holds two timespecs.
        let rc = unsafe {
            libc::utimensat(
                libc::AT_FDCWD,
                path.as_ptr(),
                [time, time].as_ptr(),
                libc::AT_SYMLINK_NOFOLLOW,
            )
        };
        let error = (rc != 0).then(std::io::Error::last_os_error);
        if immutable {
            set_immutable(entry.path(), true)?;
        }
        if let Some(error) = error {
            return Err(error).with_context(|| format!("setting the times of {}", entry.path().display()));
        }
    }
    Ok(())
}

/// `FS_IMMUTABLE_FL` of `<linux/fs.h>`.
const FS_IMMUTABLE_FL: libc::c_long = 0x10;

/// A directory opened for its inode flags (never following a link).
fn open_dir(dir: &Path) -> Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
        .open(dir)
        .with_context(|| format!("opening {}", dir.display()))
}

/// Whether the directory is immutable (`lsattr`); false where the
/// filesystem has no inode flags.
pub fn is_immutable(dir: &Path) -> Result<bool> {
    use std::os::fd::AsRawFd;
    let file = open_dir(dir)?;
    let mut flags: libc::c_long = 0;
    // SAFETY: FS_IOC_GETFLAGS writes an int into `flags`, which is larger.
    let rc = unsafe { libc::ioctl(file.as_raw_fd(), libc::FS_IOC_GETFLAGS, &mut flags) };
    Ok(rc == 0 && flags & FS_IMMUTABLE_FL != 0)
}

/// `chattr +i` or `chattr -i` on a directory.
pub fn set_immutable(dir: &Path, on: bool) -> Result<()> {
    use std::os::fd::AsRawFd;
    let file = open_dir(dir)?;
    let mut flags: libc::c_long = 0;
    // SAFETY: as in `is_immutable`; FS_IOC_SETFLAGS reads an int from `flags`.
    let ok = unsafe {
        libc::ioctl(file.as_raw_fd(), libc::FS_IOC_GETFLAGS, &mut flags) == 0 && {
            flags = if on {
                flags | FS_IMMUTABLE_FL
            } else {
                flags & !FS_IMMUTABLE_FL
            };
            libc::ioctl(file.as_raw_fd(), libc::FS_IOC_SETFLAGS, &flags) == 0
        }
    };
    if !ok {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("changing the immutable flag of {}", dir.display()));
    }
    Ok(())
}

/// What `dir` takes on ext4: each inode once (a deployment is a farm of
/// hard links into the repo), regular files and directories in 4 KiB
/// blocks, symlinks short enough to live in their inode free.
pub fn usage(dir: &Path) -> Result<Usage> {
    let mut seen = std::collections::HashSet::new();
    let mut usage = Usage::default();
    for entry in entries_with_metadata(dir) {
        let (_, meta) = entry?;
        if !seen.insert((meta.dev(), meta.ino())) {
            continue;
        }
        usage.inodes += 1;
        let bytes = if meta.file_type().is_symlink() && meta.len() < 60 {
            0
        } else {
            meta.len().max(1)
        };
        usage.bytes += bytes.div_ceil(4096) * 4096;
    }
    Ok(usage)
}

#[cfg(test)]
mod tests {
    use super::*;

    const LISTING: &str = "\
Inode count:              24
Free inodes:              11
Inodes per group:         8
Group 0: (Blocks 0-32767) csum 0x29f5
  Free inodes: 5-6, 8
Group 1: (Blocks 32768-65535) csum 0xf600 [INODE_UNINIT]
  Free inodes: 9-16
Group 2: (Blocks 65536-66815) csum 0xcd66
  Free inodes: 
";

    #[test]
    fn used_inodes_are_those_no_free_list_names() {
        assert_eq!(
            used_inodes(LISTING).unwrap(),
            [1, 2, 3, 4, 7, 17, 18, 19, 20, 21, 22, 23, 24]
        );
        assert!(used_inodes("Group 0:\n  Free inodes: 1-8\n").is_err());
        assert!(used_inodes("Inodes per group: 8\n").is_err());
        assert!(used_inodes("Inodes per group: 8\n  Free inodes: x-2\n").is_err());
    }
}
