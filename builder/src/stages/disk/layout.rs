//! The disk's geometry, decided before anything is written (pure): a GPT
//! with the ESP, `/boot` and the root filesystem, sized from what the staged
//! sysroot holds, and every GUID derived from the commit checksum and the
//! role it plays, so the same inputs give the same image.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use uuid::Uuid;

pub const MIB: u64 = 1024 * 1024;
pub const SECTOR: u64 = 512;
/// The ESP: FAT32 (at least 65525 clusters of 1 KiB), GRUB and its modules.
pub const ESP_SIZE: u64 = 128 * MIB;
/// `/boot` unless its content asks for more: kernels and initramfs of two
/// deployments and room for a third during an update.
pub const BOOT_SIZE: u64 = 512 * MIB;
/// Partitions start on MiB boundaries; the first MiB holds the protective
/// MBR and the primary GPT, the last one the backup GPT (33 sectors).
const HEAD: u64 = MIB;
const TAIL: u64 = MIB;
/// ext4 bytes per inode at the default usage type.
const BYTES_PER_INODE: u64 = 16 * 1024;

/// What a partition holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Role {
    Esp,
    Boot,
    Root,
}

impl Role {
    pub fn name(self) -> &'static str {
        match self {
            Role::Esp => "esp",
            Role::Boot => "boot",
            Role::Root => "root",
        }
    }

    /// The GPT partition name.
    pub fn label(self) -> &'static str {
        match self {
            Role::Esp => "EFI System",
            Role::Boot => "boot",
            Role::Root => "root",
        }
    }

    /// The sgdisk type code: EFI System, Linux filesystem, Linux x86-64 root.
    pub fn type_code(self) -> &'static str {
        match self {
            Role::Esp => "EF00",
            Role::Boot => "8300",
            Role::Root => "8304",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct Partition {
    pub number: u32,
    pub role: Role,
    /// Byte offset from the start of the disk (a multiple of 1 MiB).
    pub offset: u64,
    pub size: u64,
    /// The GPT partition GUID (PARTUUID).
    pub partuuid: Uuid,
    /// The filesystem UUID (ext4), or for the ESP the FAT volume id as
    /// `blkid` prints it.
    pub fs_uuid: String,
}

impl Partition {
    pub fn first_sector(&self) -> u64 {
        self.offset / SECTOR
    }

    pub fn last_sector(&self) -> u64 {
        (self.offset + self.size) / SECTOR - 1
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct Layout {
    pub size: u64,
    pub disk_guid: Uuid,
    pub partitions: Vec<Partition>,
}

impl Layout {
    pub fn get(&self, role: Role) -> &Partition {
        self.partitions
            .iter()
            .find(|p| p.role == role)
            .expect("every role has a partition")
    }
}

/// A GUID for `role` of the disk of `checksum`: the first 128 bits of a
/// sha256, as an RFC 9562 version 8 (custom) UUID.
pub fn derive_uuid(checksum: &str, role: &str) -> Uuid {
    let digest = Sha256::new()
        .chain_update(b"imgbuild disk\0")
        .chain_update(checksum.as_bytes())
        .chain_update(b"\0")
        .chain_update(role.as_bytes())
        .finalize();
    let bytes: [u8; 16] = digest[..16].try_into().expect("16 bytes");
    uuid::Builder::from_custom_bytes(bytes).into_uuid()
}

/// The ESP's FAT volume id for the disk of `checksum`.
pub fn derive_volume_id(checksum: &str) -> u32 {
    let bytes = derive_uuid(checksum, "esp-fs").into_bytes();
    u32::from_be_bytes(bytes[..4].try_into().expect("4 bytes"))
}

/// The FAT volume id of its `XXXX-XXXX` text.
pub fn parse_volume_id(text: &str) -> anyhow::Result<u32> {
    u32::from_str_radix(&text.replace('-', ""), 16)
        .map_err(|e| anyhow::anyhow!("{text:?} is not a FAT volume id: {e}"))
}

/// `XXXX-XXXX`, how `blkid` and `/etc/fstab` name a FAT volume.
pub fn volume_id_text(id: u32) -> String {
    format!("{:04X}-{:04X}", id >> 16, id & 0xffff)
}

/// The filesystem UUID of `role` (the FAT volume id of the ESP), as
/// `/etc/fstab`, `root=UUID=` and GRUB's `search --fs-uuid` name it.
pub fn fs_uuid(checksum: &str, role: Role) -> String {
    match role {
        Role::Esp => volume_id_text(derive_volume_id(checksum)),
        _ => derive_uuid(checksum, &format!("{}-fs", role.name())).to_string(),
    }
}

fn round_up(bytes: u64, to: u64) -> u64 {
    bytes.div_ceil(to) * to
}

/// What the staged sysroot holds, as ext4 will store it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct Usage {
    /// Bytes in 4 KiB blocks, each inode counted once (hard links are free).
    pub bytes: u64,
    pub inodes: u64,
}

/// The root filesystem by default: twice the tree (a second deployment
/// during an update), a quarter more, and 256 MiB to grow in.
pub fn default_root_size(tree: Usage) -> u64 {
    round_up(2 * tree.bytes + tree.bytes / 4 + 256 * MIB, MIB)
}

/// The smallest root filesystem that still holds two deployments: twice the
/// tree, plus ext4's own share (5% reserved, inode tables, the journal).
pub fn minimum_root_size(tree: Usage) -> u64 {
    round_up(2 * tree.bytes * 100 / 90 + 96 * MIB, MIB)
}

/// Inodes for the root filesystem: room for a second deployment's files.
pub fn root_inodes(tree: Usage, root_size: u64) -> u64 {
    (2 * tree.inodes + tree.inodes / 4 + 16_384).max(root_size / BYTES_PER_INODE)
}

/// `/boot`: [`BOOT_SIZE`], or three times its content (two deployments and
/// one being written) when that is more.
pub fn boot_size(boot: Usage) -> u64 {
    BOOT_SIZE.max(round_up(3 * boot.bytes + 32 * MIB, MIB))
}

/// A requested disk size that cannot hold the tree.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "{requested} bytes is too small: the ESP ({esp} MiB), /boot ({boot} MiB) and a root filesystem with room for two deployments ({root} MiB) need at least {needed} bytes ({needed_mib} MiB)",
    esp = ESP_SIZE / MIB,
    boot = self.boot / MIB,
    root = self.root / MIB,
    needed_mib = self.needed / MIB
)]
pub struct TooSmall {
    pub requested: u64,
    pub needed: u64,
    pub boot: u64,
    pub root: u64,
}

/// Plans the disk: the default sizes, or `requested` bytes (rounded down to
/// a MiB) with the root filesystem taking what the ESP and `/boot` leave.
pub fn plan(checksum: &str, tree: Usage, boot: Usage, requested: Option<u64>) -> Result<Layout, TooSmall> {
    let boot_bytes = boot_size(boot);
    let fixed = HEAD + ESP_SIZE + boot_bytes + TAIL;
    let root_bytes = match requested {
        None => default_root_size(tree),
        Some(requested) => {
            let minimum = minimum_root_size(tree);
            let total = requested / MIB * MIB;
            if total < fixed + minimum {
                return Err(TooSmall {
                    requested,
                    needed: fixed + minimum,
                    boot: boot_bytes,
                    root: minimum,
                });
            }
            total - fixed
        }
    };
    let mut offset = HEAD;
    let mut partitions = Vec::new();
    for (number, (role, size)) in [
        (Role::Esp, ESP_SIZE),
        (Role::Boot, boot_bytes),
        (Role::Root, root_bytes),
    ]
    .into_iter()
    .enumerate()
    {
        let fs_uuid = fs_uuid(checksum, role);
        partitions.push(Partition {
            number: number as u32 + 1,
            role,
            offset,
            size,
            partuuid: derive_uuid(checksum, &format!("{}-part", role.name())),
            fs_uuid,
        });
        offset += size;
    }
    Ok(Layout {
        size: offset + TAIL,
        disk_guid: derive_uuid(checksum, "disk"),
        partitions,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const CSUM: &str = "e7489082567465fa8ea209f037898be87e9f1fc8f1aa68f150fc9b569309e73a";

    fn usage(mib: u64) -> Usage {
        Usage {
            bytes: mib * MIB,
            inodes: 20_000,
        }
    }

    #[test]
    fn guids_follow_the_commit_and_the_role() {
        let a = derive_uuid(CSUM, "disk");
        assert_eq!(a, derive_uuid(CSUM, "disk"));
        assert_ne!(a, derive_uuid(CSUM, "root-part"));
        assert_ne!(a, derive_uuid(&CSUM.replace('e', "f"), "disk"));
        assert_eq!(a.get_version_num(), 8);
        assert_eq!(a.get_variant(), uuid::Variant::RFC4122);
        assert_eq!(volume_id_text(0x1234_abcd), "1234-ABCD");
        assert_eq!(parse_volume_id("1234-ABCD").unwrap(), 0x1234_abcd);
    }

    #[test]
    fn default_layout_is_aligned_and_contiguous() {
        let layout = plan(CSUM, usage(400), usage(40), None).unwrap();
        let [esp, boot, root] = &layout.partitions[..] else {
            panic!("three partitions")
        };
        assert_eq!((esp.offset, esp.size), (MIB, ESP_SIZE));
        assert_eq!(boot.offset, MIB + ESP_SIZE);
        assert_eq!(boot.size, BOOT_SIZE);
        assert_eq!(root.offset, boot.offset + boot.size);
        // 2 x 400 + 100 + 256 MiB.
        assert_eq!(root.size, 1156 * MIB);
        assert_eq!(layout.size, root.offset + root.size + MIB);
        for p in &layout.partitions {
            assert_eq!(p.offset % MIB, 0);
            assert_eq!(p.size % MIB, 0);
        }
        assert_eq!(esp.first_sector(), 2048);
        assert_eq!(esp.last_sector(), 2048 + 262_144 - 1);
        let uuids: std::collections::BTreeSet<String> = layout
            .partitions
            .iter()
            .flat_map(|p| [p.partuuid.to_string(), p.fs_uuid.clone()])
            .chain([layout.disk_guid.to_string()])
            .collect();
        assert_eq!(uuids.len(), 7, "{uuids:?}");
    }

    #[test]
    fn a_large_boot_grows_its_partition() {
        assert_eq!(boot_size(usage(10)), BOOT_SIZE);
        assert_eq!(boot_size(usage(200)), 632 * MIB);
    }

    #[test]
    fn requested_size_gives_root_the_rest_or_is_refused() {
        let layout = plan(CSUM, usage(100), usage(10), Some(4096 * MIB + 123)).unwrap();
        assert_eq!(layout.size, 4096 * MIB);
        assert_eq!(
            layout.get(Role::Root).size,
            4096 * MIB - 2 * MIB - ESP_SIZE - BOOT_SIZE
        );
        let err = plan(CSUM, usage(1000), usage(10), Some(1024 * MIB)).unwrap_err();
        let text = err.to_string();
        assert!(text.starts_with("1073741824 bytes is too small"), "{text}");
        assert!(text.contains("two deployments"), "{text}");
        assert!(err.needed > 2000 * MIB);
        // Exactly the minimum fits.
        let needed = err.needed;
        assert!(plan(CSUM, usage(1000), usage(10), Some(needed)).is_ok());
        assert!(plan(CSUM, usage(1000), usage(10), Some(needed - MIB)).is_err());
    }

    #[test]
    fn the_default_always_exceeds_the_minimum() {
        for mib in [0, 1, 50, 400, 5000] {
            assert!(default_root_size(usage(mib)) >= minimum_root_size(usage(mib)));
        }
    }

    #[test]
    fn inodes_leave_room_for_a_second_deployment() {
        let tree = Usage {
            bytes: 100 * MIB,
            inodes: 30_000,
        };
        assert!(root_inodes(tree, 512 * MIB) >= 2 * 30_000);
        assert_eq!(root_inodes(tree, 64 << 30), (64 << 30) / BYTES_PER_INODE);
    }
}
