//! The boot path: UEFI firmware → GRUB on the ESP → the menu ostree keeps on
//! `/boot`.
//!
//! Why GRUB, and this split: Debian 12's GRUB has no `blscfg`, so it cannot
//! read ostree's BLS entries itself; systemd-boot 252 reads them only from a
//! FAT ESP, where ostree's `/boot/loader` symlink (swapped atomically on
//! every deploy) cannot exist. So `/boot` is ext4, and ostree's grub2
//! backend keeps the menu there: on the device every deploy runs
//! `grub-mkconfig` (its `/etc/grub.d/15_ostree` calls `ostree admin instutil
//! grub2-generate`) into `/boot/loader.N/grub.cfg` and swaps the symlink.
//! The ESP holds a GRUB image (`grub-mkimage`, modules beside it) and a
//! static `grub.cfg` that finds `/boot` by UUID and runs
//! `/boot/loader/grub.cfg`. At build time the first menu is generated the
//! same way, with the same `grub2-generate`.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

use crate::secure_boot::SigningKey;
use crate::tool;
use emberrtos_contract::boot::{FALLBACK, TRIAL_VAR, TRIES_VAR};
use rtcheck::Arch;

/// GRUB for one machine's UEFI: its platform, where Debian installs its
/// modules, and the name every firmware boots from removable media.
#[derive(Debug, PartialEq, Eq)]
pub struct GrubEfi {
    /// `grub-mkimage -O`, and the directory of the modules on the ESP.
    pub platform: &'static str,
    pub modules: &'static str,
    /// The file under [`ESP_GRUB_DIR`] the firmware starts.
    pub removable: &'static str,
    pub package: &'static str,
    /// GRUB's terminal commands: a PC's first serial port beside the
    /// screen; on arm64 the firmware's console, which is the serial port
    /// (GRUB has no `com0` there).
    pub terminal: &'static str,
}

impl GrubEfi {
    pub const fn of(arch: Arch) -> GrubEfi {
        match arch {
            Arch::X86_64 => GrubEfi {
                platform: "x86_64-efi",
                modules: "/usr/lib/grub/x86_64-efi",
                removable: "BOOTX64.EFI",
                package: "grub-efi-amd64-bin",
                terminal: "serial --unit=0 --speed=115200\nterminal_input serial console\nterminal_output serial console\n",
            },
            Arch::Arm64 => GrubEfi {
                platform: "arm64-efi",
                modules: "/usr/lib/grub/arm64-efi",
                removable: "BOOTAA64.EFI",
                package: "grub-efi-arm64-bin:arm64",
                terminal: "terminal_input console\nterminal_output console\n",
            },
        }
    }

    /// Fails, naming the package, when the modules are not installed.
    pub fn require(&self) -> Result<()> {
        if !Path::new(self.modules).join("moddep.lst").is_file() {
            bail!(
                "GRUB's {} modules are not installed ({}): apt-get install {}",
                self.platform,
                self.modules,
                self.package
            );
        }
        Ok(())
    }
}

/// GRUB's modules for x86_64 UEFI, the only machine with Secure Boot here.
const X86_64_GRUB: GrubEfi = GrubEfi::of(Arch::X86_64);
/// Where GRUB lives on the ESP: the removable-media path every UEFI
/// firmware boots without NVRAM entries.
pub const ESP_GRUB_DIR: &str = "/EFI/BOOT";

/// Built into the GRUB image (the rest are loaded from `$prefix`).
const CORE_MODULES: &[&str] = &[
    "part_gpt",
    "fat",
    "ext2",
    "normal",
    "configfile",
    "search",
    "search_fs_uuid",
    "linux",
    "gzio",
    "loadenv",
    "test",
    "echo",
    "all_video",
    "efi_gop",
    "sleep",
    "reboot",
    "serial",
    "terminal",
    // Measures what GRUB loads (PCR 9) and runs (PCR 8) into the TPM.
    "tpm",
];

/// GRUB's countdown of [`TRIES_VAR`]: Debian's GRUB has no `increment`
/// module, so each digit is compared as a string and replaced by the next
/// lower one. Anything else (`0`, garbage) means no try is left.
fn countdown() -> String {
    let mut script = String::new();
    for tries in (1..=9).rev() {
        let keyword = if tries == 9 { "if" } else { "elif" };
        script.push_str(&format!(
            "  {keyword} [ \"${TRIES_VAR}\" = {tries} ]; then set {TRIES_VAR}={}\n",
            tries - 1
        ));
    }
    script.push_str(&format!("  else set {TRIAL_VAR}={FALLBACK}\n  fi\n"));
    script
}

/// The ESP's `grub.cfg`: serial and screen, the trial-boot counter over
/// `$prefix/grubenv`, then the menu ostree maintains on the `/boot`
/// filesystem found by `boot_uuid`, whose entry 0 is the default deployment
/// and entry 1 the previous one.
///
/// A trial try is spent (saved to the environment block) before the trial
/// deployment boots, so a panic, a hang the watchdog ends, a power cut or a
/// failed health check all count. When no try is left, or the block cannot
/// be written (a try that is not counted must not be taken), GRUB boots
/// entry 1 and leaves `fallback` for `emberrtos-health` to act on.
pub fn esp_grub_cfg(grub: &GrubEfi, boot_uuid: &str) -> String {
    menu_cfg(grub, boot_uuid, "$prefix/grubenv", "")
}

/// [`esp_grub_cfg`] with the environment block at `env` and `prelude` first.
fn menu_cfg(grub: &GrubEfi, boot_uuid: &str, env: &str, prelude: &str) -> String {
    format!(
        "\
{prelude}# Written by imgbuild disk. GRUB finds /boot by its UUID and runs the menu
# that ostree maintains there: /boot/loader is ostree's symlink to
# loader.0 or loader.1, swapped atomically by every deploy.
{terminal}set timeout=1
# Trial boots (emberrtos-health): a new default deployment gets
# {TRIES_VAR} tries, counted down here, before GRUB boots the previous one.
set {TRIAL_VAR}=
set {TRIES_VAR}=
load_env --file {env} {TRIAL_VAR} {TRIES_VAR}
set emberrtos_entry=0
if [ \"${TRIAL_VAR}\" = 1 ]; then
{countdown}  if [ \"${TRIAL_VAR}\" = 1 ]; then
    if save_env --file {env} {TRIES_VAR}; then
      echo \"EmberRTOS: trial boot of the new deployment, ${TRIES_VAR} tries left\"
    else
      echo \"EmberRTOS: the try cannot be counted (grubenv not writable): booting the previous deployment\"
      set emberrtos_entry=1
    fi
  else
    save_env --file {env} {TRIAL_VAR}
  fi
fi
if [ \"${TRIAL_VAR}\" = {FALLBACK} ]; then
  echo \"EmberRTOS: the new deployment used up its tries: booting the previous deployment\"
  set emberrtos_entry=1
fi
if search --no-floppy --fs-uuid --set=boot {boot_uuid}; then
  source ($boot)/loader/grub.cfg
  set default=$emberrtos_entry
else
  echo \"EmberRTOS: the /boot filesystem (UUID {boot_uuid}) was not found\"
fi
",
        countdown = countdown(),
        terminal = grub.terminal,
    )
}

/// What precedes `grub2-generate`'s menu entries in the first
/// `loader.N/grub.cfg`, as `grub-mkconfig`'s header does on the device:
/// its entries call `load_video`, which the header defines.
pub fn loader_header(grub: &GrubEfi) -> String {
    format!(
        "\
# Written by imgbuild disk: the header grub-mkconfig would write, then the
# entries of `ostree admin instutil grub2-generate`. The first deploy on the
# device replaces this file through grub-mkconfig and /etc/grub.d/15_ostree.
set default=0
set timeout=1
{}function load_video {{
  insmod all_video
}}
",
        grub.terminal
    )
}

/// `grub-mkimage` for `grub`'s UEFI with `$prefix` at [`ESP_GRUB_DIR`].
pub fn make_grub_image(grub: &GrubEfi, out: &Path) -> Result<()> {
    grub.require()?;
    tool::run(
        tool::command("grub-mkimage")?
            .args(["-O", grub.platform, "-d", grub.modules, "-p", ESP_GRUB_DIR, "-o"])
            .arg(out)
            .args(CORE_MODULES),
    )
    .context("building the GRUB UEFI image")?;
    Ok(())
}

/// A 1024-byte GRUB environment block (`grub-editenv FILE create`).
pub fn make_grubenv(path: &Path) -> Result<()> {
    tool::run(tool::command("grub-editenv")?.arg(path).arg("create"))?;
    Ok(())
}

/// GRUB's modules and lists (`*.mod`, `*.lst`), sorted, so the ESP can load
/// what a menu generated on the device asks for.
pub fn module_files(grub: &GrubEfi) -> Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(grub.modules)
        .with_context(|| format!("listing {}", grub.modules))?
        .map(|e| e.map(|e| e.path()))
        .collect::<std::io::Result<_>>()?;
    files.retain(|p| p.is_file() && p.extension().is_some_and(|ext| ext == "mod" || ext == "lst"));
    files.sort();
    Ok(files)
}

/// The menu entries of `bootversion` as ostree's grub2 backend writes them
/// (`ostree admin instutil grub2-generate`: no library API exists), with
/// `/boot` found by `boot_uuid`.
pub fn generate_entries(sysroot: &Path, bootversion: i32, boot_uuid: &str) -> Result<String> {
    let output = tool::run(
        tool::command("ostree")?
            .env("GRUB2_BOOT_DEVICE_ID", boot_uuid)
            .env(
                "GRUB2_PREPARE_ROOT_CACHE",
                format!("insmod part_gpt; insmod ext2; search --no-floppy --fs-uuid --set=root {boot_uuid}"),
            )
            .args(["admin", "instutil", "grub2-generate"])
            .arg(format!("--sysroot={}", sysroot.display()))
            .arg(bootversion.to_string()),
    )
    .context("generating GRUB's menu with ostree")?;
    String::from_utf8(output.stdout).context("grub2-generate wrote something that is not UTF-8")
}

/// Checks a generated menu: exactly one entry, whose kernel and initramfs
/// are ostree's under `/ostree/`, with every one of `kargs` and an
/// `ostree=` argument on the kernel line. Pure.
pub fn check_menu(menu: &str, kargs: &[String]) -> Result<(), String> {
    let entries = menu
        .lines()
        .filter(|l| l.trim_start().starts_with("menuentry "))
        .count();
    if entries != 1 {
        return Err(format!("expected one menu entry, found {entries}"));
    }
    let command = |name: &str| -> Option<Vec<&str>> {
        menu.lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .find(|words| words.first() == Some(&name))
    };
    let linux = command("linux").ok_or("the entry has no `linux` line")?;
    let initrd = command("initrd").ok_or("the entry has no `initrd` line")?;
    for (what, words) in [("kernel", &linux), ("initramfs", &initrd)] {
        if !words.get(1).is_some_and(|p| p.starts_with("/ostree/")) {
            return Err(format!("the {what} is not ostree's: {}", words.join(" ")));
        }
    }
    let args = &linux[2..];
    if !args.iter().any(|a| a.starts_with("ostree=/ostree/boot.")) {
        return Err("the kernel line has no ostree= argument".into());
    }
    if let Some(missing) = kargs.iter().find(|k| !args.contains(&k.as_str())) {
        return Err(format!("the kernel line lacks {missing:?}: {}", linux.join(" ")));
    }
    Ok(())
}

// ---- Secure Boot: firmware → shim → GRUB → kernel, each signed by the gate. ----
//
// Debian 12's GRUB verifies a kernel only through shim's shim-lock protocol
// (without shim, a GRUB built with --disable-shim-lock boots any kernel), so
// the chain is Debian's own shim (shim-unsigned, signed here with the
// gate's key) → a GRUB image signed with the same key, holding its modules
// and its menu (lockdown loads nothing from disk) → the kernel, which GRUB
// hands to shim: shim accepts it only when it verifies against the
// firmware's db (the gate's certificate) or shim's built-in Debian CA,
// which the firmware's dbx must revoke (see docs/ARCHITECTURE.md).

/// Debian's shim, unsigned (package shim-unsigned).
pub const SHIM_UNSIGNED: &str = "/usr/lib/shim/shimx64.efi";
/// The name shim loads its second stage by, beside itself.
pub const SECOND_STAGE: &str = "grubx64.efi";

/// Built into the signed image besides [`CORE_MODULES`]: Debian's `linux`
/// hands Secure Boot kernels to `linuxefi`; the menu lives in a memdisk;
/// the live ISO's menu reads SMBIOS strings from an ISO 9660 volume.
const SECURE_MODULES: &[&str] = &[
    "linuxefi",
    "memdisk",
    "tar",
    "gfxterm",
    "font",
    "iso9660",
    "part_msdos",
    "smbios",
    "regexp",
];

/// The SBAT section of the GRUB image: the generations of Debian's own
/// signed build of this GRUB (grub-efi-amd64-signed 2.06-13+deb12u2), which
/// shim compares with its revocation level.
pub fn sbat_csv(grub_version: &str) -> String {
    format!(
        "sbat,1,SBAT Version,sbat,1,https://github.com/rhboot/shim/blob/main/SBAT.md\n\
         grub,5,Free Software Foundation,grub,2.06,https://www.gnu.org/software/grub/\n\
         grub.debian,5,Debian,grub2,{grub_version},https://tracker.debian.org/pkg/grub2\n\
         grub.debian12,1,Debian,grub2,{grub_version},https://tracker.debian.org/pkg/grub2\n"
    )
}

/// The menu built into the signed GRUB image: [`esp_grub_cfg`] with the
/// environment block on the ESP (found by `esp_volume`), nobody allowed to
/// edit an entry or open GRUB's shell (a superuser with no password), and
/// a fallback for a kernel the chain refuses: a trial reboots (its try is
/// spent, as for any failed boot), anything else boots the previous
/// deployment.
///
/// GRUB's `fallback` takes a list of entry numbers only, so the fallback
/// entry comes first (entry 0) and ostree's default and previous
/// deployments are entries 1 and 2.
pub fn secure_grub_cfg(boot_uuid: &str, esp_volume: &str) -> String {
    let prelude = format!(
        "\
# Secure Boot: entries boot, but nobody can edit one or open GRUB's shell:
# the only superuser has no password.
set superusers=emberrtos
search --no-floppy --fs-uuid --set=esp {esp_volume}
# Entry 0: a kernel that shim refuses fails its entry, and GRUB falls back
# here: a trial reboots to spend its next try; anything else goes on to
# entry 2, the previous deployment (ostree's entries follow, from 1).
menuentry 'EmberRTOS: fallback for a refused kernel' --unrestricted {{
  echo \"EmberRTOS: the kernel was refused by Secure Boot\"
  if [ \"${TRIAL_VAR}\" = 1 ]; then
    sleep 1
    reboot
  fi
}}
"
    );
    let cfg = menu_cfg(&X86_64_GRUB, boot_uuid, "($esp)/EFI/BOOT/grubenv", &prelude)
        .replace("set emberrtos_entry=1", "set emberrtos_entry=2")
        .replace("set emberrtos_entry=0", "set emberrtos_entry=1");
    format!("{cfg}set fallback=\"0 2\"\n")
}

/// Builds the GRUB image for Secure Boot at `out`, signed with `key`:
/// every module it needs built in, `config` in a memdisk as its menu, and
/// the SBAT section shim checks. Scratch files go to `scratch`.
pub fn make_signed_grub(
    out: &Path,
    config: &str,
    key: &SigningKey,
    (scratch, epoch): (&Path, u64),
) -> Result<()> {
    let work = tempfile::Builder::new()
        .prefix(".grub-")
        .tempdir_in(scratch)
        .context("a scratch dir for GRUB's image")?;
    let menu_dir = work.path().join("tree/boot/grub");
    std::fs::create_dir_all(&menu_dir)?;
    std::fs::write(menu_dir.join("grub.cfg"), config)?;
    let memdisk = work.path().join("memdisk.tar");
    tool::run(
        tool::command("tar")?
            .args(["--format=ustar", "--owner=0", "--group=0", "--mtime=@0", "-cf"])
            .arg(&memdisk)
            .arg("-C")
            .arg(work.path().join("tree"))
            .arg("boot"),
    )?;
    let sbat = work.path().join("sbat.csv");
    std::fs::write(&sbat, sbat_csv(&grub_package_version()?))?;
    let unsigned = work.path().join("grub.efi");
    tool::run(
        tool::command("grub-mkimage")?
            .args([
                "-O",
                X86_64_GRUB.platform,
                "-d",
                X86_64_GRUB.modules,
                "-p",
                "(memdisk)/boot/grub",
            ])
            .arg("-m")
            .arg(&memdisk)
            .arg("-s")
            .arg(&sbat)
            .arg("-o")
            .arg(&unsigned)
            .args(CORE_MODULES)
            .args(SECURE_MODULES),
    )
    .context("building the signed GRUB image")?;
    key.sign(&unsigned, out, scratch, epoch)
}

/// The version of the installed grub-efi-amd64-bin.
fn grub_package_version() -> Result<String> {
    let out = tool::run(tool::command("dpkg-query")?.args(["-W", "-f", "${Version}", "grub-efi-amd64-bin"]))
        .context("asking dpkg for grub-efi-amd64-bin's version")?;
    let version = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if version.is_empty()
        || !version
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "+-.~:".contains(c))
    {
        bail!("dpkg-query gave no usable version of grub-efi-amd64-bin: {version:?}");
    }
    Ok(version)
}

/// Debian's shim signed with `key` at `out` (the signature dated `epoch`).
pub fn sign_shim(out: &Path, key: &SigningKey, (scratch, epoch): (&Path, u64)) -> Result<()> {
    if !Path::new(SHIM_UNSIGNED).is_file() {
        bail!("Debian's shim is not installed ({SHIM_UNSIGNED}): apt-get install shim-unsigned");
    }
    key.sign(Path::new(SHIM_UNSIGNED), out, scratch, epoch)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MENU: &str = "\
menuentry 'debian 1 (ostree:0)' --class gnu-linux --class gnu --class os --unrestricted 'ostree-0-u' {
load_video
set gfxpayload=keep
insmod gzio
insmod part_gpt; insmod ext2; search --no-floppy --fs-uuid --set=root u
linux /ostree/emberrtos-e7/vmlinuz-6.12.0 root=UUID=r rw quiet ostree=/ostree/boot.1/emberrtos/e7/0
initrd /ostree/emberrtos-e7/initramfs-6.12.0.img
}
";

    fn kargs(words: &[&str]) -> Vec<String> {
        words.iter().map(|w| w.to_string()).collect()
    }

    #[test]
    fn a_generated_menu_passes() {
        check_menu(MENU, &kargs(&["root=UUID=r", "rw", "quiet"])).unwrap();
    }

    #[test]
    fn menus_that_would_not_boot_as_built_fail() {
        let err = check_menu(MENU, &kargs(&["isolcpus=1"])).unwrap_err();
        assert!(err.contains("isolcpus=1"), "{err}");
        let two = format!("{MENU}{MENU}");
        assert!(check_menu(&two, &[]).unwrap_err().contains("found 2"));
        assert!(check_menu("", &[]).is_err());
        let foreign = MENU.replace("linux /ostree/", "linux /boot/");
        assert!(check_menu(&foreign, &[]).unwrap_err().contains("kernel"));
        let no_ostree = MENU.replace(" ostree=/ostree/boot.1/emberrtos/e7/0", "");
        assert!(check_menu(&no_ostree, &[]).unwrap_err().contains("ostree="));
        let no_initrd = MENU.replace("initrd /ostree", "# /ostree");
        assert!(check_menu(&no_initrd, &[]).unwrap_err().contains("initrd"));
    }

    #[test]
    fn esp_config_finds_boot_by_uuid_and_runs_ostrees_menu() {
        let cfg = esp_grub_cfg(&X86_64_GRUB, "0b6c4ad4-1d3f-8a2e-9c1b-77f0e5d2a001");
        assert!(cfg.contains("search --no-floppy --fs-uuid --set=boot 0b6c4ad4-1d3f-8a2e-9c1b-77f0e5d2a001"));
        assert!(cfg.contains("source ($boot)/loader/grub.cfg"));
        assert!(cfg.contains("terminal_output serial console"));
        let arm64 = esp_grub_cfg(&GrubEfi::of(Arch::Arm64), "u");
        assert!(
            arm64.contains("\nterminal_output console\nset timeout=1"),
            "{arm64}"
        );
        assert!(!arm64.contains("serial"), "GRUB has no com0 on arm64: {arm64}");
        assert!(cfg.contains("set timeout=1"));
        assert!(cfg.contains("load_env --file $prefix/grubenv emberrtos_trial emberrtos_tries"));
    }

    #[test]
    fn grub_parses_the_esp_configs() {
        if !Path::new("/usr/bin/grub-script-check").exists() {
            eprintln!("SKIPPED: grub-script-check is not installed (grub-common)");
            return;
        }
        let uuid = "0b6c4ad4-1d3f-8a2e-9c1b-77f0e5d2a001";
        let arm64 = GrubEfi::of(Arch::Arm64);
        for cfg in [
            esp_grub_cfg(&X86_64_GRUB, uuid),
            esp_grub_cfg(&arm64, uuid),
            loader_header(&arm64),
            secure_grub_cfg(uuid, "1234-ABCD"),
        ] {
            let file = tempfile::NamedTempFile::new().unwrap();
            std::fs::write(file.path(), cfg).unwrap();
            let out = std::process::Command::new("grub-script-check")
                .arg(file.path())
                .output()
                .unwrap();
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        }
    }

    #[test]
    fn the_secure_boot_menu_locks_editing_and_keeps_the_counter_on_the_esp() {
        let cfg = secure_grub_cfg("u", "1234-ABCD");
        assert!(cfg.starts_with("# Secure Boot"));
        assert!(cfg.contains("set superusers=emberrtos\n"));
        let passwords = cfg
            .lines()
            .filter(|l| l.trim_start().starts_with("password"))
            .count();
        assert_eq!(passwords, 0, "a password would let someone edit");
        assert!(cfg.contains("search --no-floppy --fs-uuid --set=esp 1234-ABCD"));
        assert!(!cfg.contains("$prefix/grubenv"));
        assert_eq!(cfg.matches("--file ($esp)/EFI/BOOT/grubenv").count(), 3);
        assert!(cfg.ends_with("set fallback=\"0 2\"\n"));
        // The fallback entry is entry 0, before ostree's menu; the default
        // and previous deployments are entries 1 and 2.
        let refused = cfg.find("menuentry 'EmberRTOS: fallback").unwrap();
        assert!(refused < cfg.find("source ($boot)/loader/grub.cfg").unwrap());
        assert_eq!(cfg.matches("menuentry ").count(), 1);
        assert!(cfg[refused..].find("reboot").unwrap() > cfg[refused..].find("= 1 ]").unwrap());
        assert_eq!(cfg.matches("set emberrtos_entry=1").count(), 1);
        assert_eq!(cfg.matches("set emberrtos_entry=2").count(), 2);
        assert!(!cfg.contains("set emberrtos_entry=0"));
    }

    #[test]
    fn the_trial_counter_counts_every_digit_down_and_gives_up_on_anything_else() {
        let cfg = esp_grub_cfg(&X86_64_GRUB, "u");
        for tries in 1..=9 {
            let step = format!(
                "[ \"$emberrtos_tries\" = {tries} ]; then set emberrtos_tries={}",
                tries - 1
            );
            assert!(cfg.contains(&step), "{step}");
        }
        assert!(cfg.contains("else set emberrtos_trial=fallback"));
        // The try is saved before the trial boots; no save, no trial.
        let save = cfg
            .find("save_env --file $prefix/grubenv emberrtos_tries")
            .unwrap();
        assert!(save < cfg.find("source ($boot)").unwrap());
        assert!(cfg.contains("set default=$emberrtos_entry"));
        assert_eq!(cfg.matches("set emberrtos_entry=1").count(), 2);
    }
}
