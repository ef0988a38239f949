//! Command-line interface (the CLI contract: exit codes in docs/ARCHITECTURE.md, "The device contract").

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context as _, Result};
use clap::{ArgGroup, Args, CommandFactory, FromArgMatches, Parser, Subcommand};

use crate::cache::{Cache, remote};
use crate::commands::config_medium::{self, MediumOptions};
use crate::commands::{diff, publish, vm};
use crate::cve::DataSource;
use crate::cve::tracker::Urgency;
use crate::io::user_path;
use crate::ostree;
use crate::pipeline::{self, PipelineReport};
use crate::qualify;
use crate::recipe::{DiskFormat, Recipe, Remote};
use crate::sbom;
use crate::secure_boot::{SigningKey, load_certificate};
use crate::stage::Stage;
use crate::stages::boot::{self, Accel, BootOptions};
use crate::stages::commit;
use crate::stages::disk::{self, DiskRequest, InputNames};
use crate::stages::fetch::FetchOptions;
use crate::stages::kernel::compiler::{self, CompilerFlags};
use crate::stages::verify;
use crate::ui::Ui;
use emberrtos_contract::error::{BadInput, exit, exit_code};
use emberrtos_contract::provision::ProvisionError;

#[derive(Parser, Debug)]
#[command(
    name = "imgbuild",
    version,
    about = "Build an immutable Linux OS with a mainline PREEMPT_RT kernel"
)]
pub struct Cli {
    /// Print one JSON document on stdout; progress stays on stderr.
    #[arg(long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run the pipeline of a recipe.
    Recipe(RecipeArgs),
    /// Check a kernel image (bzImage) for PREEMPT_RT and print the evidence.
    VerifyKernel(VerifyKernelArgs),
    /// Boot an ISO in QEMU and check the running kernel over the serial console.
    Boot(BootArgs),
    /// Publish tagged commits to an ostree remote.
    Publish(PublishArgs),
    /// Show a commit's metadata, including the RT evidence.
    Inspect(InspectArgs),
    /// What changed between two commits: packages, kernel config, kargs,
    /// files in the whole tree, RT evidence, and the bytes devices download.
    Diff(DiffArgs),
    /// A commit's known vulnerabilities: its SBOM's Debian source packages
    /// against Debian's vulnerability data.
    Cve(crate::commands::cve::CveArgs),
    /// The vulnerability data `cve`, `diff --cve` and `promote
    /// --max-severity` read: fetch it into the cache, or show it.
    CveDb(crate::commands::cve_db::CveDbArgs),
    /// Write a configuration medium (FAT image labelled EMBERCFG) from a provision.yaml.
    ConfigMedium(ConfigMediumArgs),
    /// Boot a disk image in QEMU through a copy-on-write overlay, with SSH
    /// forwarded and the serial console captured, until it powers off.
    Vm(VmArgs),
    /// Write a GPT disk image that boots a tagged ref under UEFI.
    Disk(DiskArgs),
    /// Measure candidate machines booted from the live ISO over SSH, and
    /// store a signed qualification record per machine beside the commit.
    Qualify(QualifyArgs),
    /// Move a release ref to a commit only on valid signed PASS records.
    Promote(PromoteArgs),
    /// The local artifact cache: list it, prune it, push it to a shared remote.
    Cache(crate::commands::cache::CacheArgs),
    /// A static release site of the repo: every ref's history, each
    /// commit's checks, signatures, update sizes and changes, and the
    /// qualification matrix, with every signature verified.
    Site(SiteArgs),
}

#[derive(Args, Debug)]
pub struct SiteArgs {
    /// The ostree repo, with the qualification and promotion records
    /// beside its commits.
    #[arg(long, value_parser = user_path)]
    repo: PathBuf,
    /// The site's directory: created, or replaced when it holds a site
    /// imgbuild wrote.
    #[arg(long, value_name = "DIR", value_parser = user_path)]
    out: PathBuf,
    /// The OpenPGP public key commits and records must be signed by: the
    /// pages mark everything it did not sign.
    #[arg(long, value_name = "FILE")]
    trust_key: PathBuf,
    #[command(flatten)]
    cve: CveDataArgs,
}

/// Known vulnerabilities, for `diff` and `site`: the cache's data, or a file.
#[derive(Args, Debug)]
pub struct CveDataArgs {
    /// Also the known vulnerabilities fixed and introduced, by the data
    /// `imgbuild cve-db update` kept in the cache.
    #[arg(long)]
    cve: bool,
    /// Also the known vulnerabilities fixed and introduced, by this file
    /// (the Debian security tracker's JSON, or osv.dev's zip of Debian OSV
    /// records).
    #[arg(long, value_name = "FILE")]
    cve_db: Option<PathBuf>,
    /// With --cve: the cache directory [default: $IMGBUILD_CACHE, else
    /// ~/.cache/imgbuild].
    #[arg(long, value_name = "DIR", requires = "cve", conflicts_with = "cve_db", value_parser = user_path)]
    cache_dir: Option<PathBuf>,
}

impl CveDataArgs {
    /// The data asked for, if any.
    fn source(self) -> Result<Option<DataSource>> {
        match self.cve || self.cve_db.is_some() {
            true => Ok(Some(DataSource::choose(self.cve_db, "--cve-db", self.cache_dir)?)),
            false => Ok(None),
        }
    }
}

#[derive(Args, Debug)]
pub struct RecipeArgs {
    /// The recipe file (YAML).
    file: PathBuf,
    /// Stop after this stage (`disk` runs only when the recipe has a `disk` section).
    #[arg(long, value_enum, default_value = "disk")]
    until: Stage,
    /// Work directory for stage outputs.
    #[arg(long, default_value = "build", value_parser = user_path)]
    work_dir: PathBuf,
    /// Cache directory [default: $IMGBUILD_CACHE, else ~/.cache/imgbuild].
    #[arg(long, value_parser = user_path)]
    cache_dir: Option<PathBuf>,
    /// QEMU accelerator for the boot check.
    #[arg(long, value_enum, default_value = "tcg")]
    accel: Accel,
    /// Seconds of jitter during the boot check (0: none).
    #[arg(long, default_value_t = 5)]
    boot_jitter: u64,
    /// Seconds the boot check may take.
    #[arg(long, default_value_t = 900)]
    boot_timeout: u64,
    /// Boot check through UEFI firmware (OVMF) instead of BIOS.
    #[arg(long)]
    uefi: bool,
    /// Compile the kernel through distcc on HOSTS (a DISTCC_HOSTS list;
    /// without a value, $DISTCC_HOSTS). Overrides `kernel.build.distcc`.
    #[arg(long, value_name = "HOSTS", num_args = 0..=1, default_missing_value = "")]
    distcc: Option<String>,
    /// Compile the kernel through ccache, in DIR [default: the cache's
    /// `ccache` area]. Overrides $IMGBUILD_CCACHE and `kernel.build.ccache`.
    #[arg(long, value_name = "DIR", num_args = 0..=1, default_missing_value = "")]
    ccache: Option<PathBuf>,
    /// make -j for the kernel [default: $IMGBUILD_JOBS, `kernel.build.jobs`,
    /// distcc's host slots, else the CPUs here].
    #[arg(short = 'j', long, value_parser = clap::value_parser!(u64).range(1..=4096))]
    jobs: Option<u64>,
    /// Look stage artifacts (kernels, rootfs bases) up on this shared cache
    /// (http://, https:// or file://, as `imgbuild cache push` fills it)
    /// before building them [default: $IMGBUILD_CACHE_REMOTE]. Needs
    /// --cache-remote-key or --cache-remote-insecure.
    #[arg(long, value_name = "URL")]
    cache_remote: Option<String>,
    /// The OpenPGP public key that signs the shared cache's entries (`cache
    /// push --gpg-key`): an entry is used only with a good signature by it
    /// [default: $IMGBUILD_CACHE_REMOTE_KEY].
    #[arg(long, value_name = "FILE")]
    cache_remote_key: Option<PathBuf>,
    /// Use the shared cache's entries unverified (no pinned key). The
    /// commit records it, and the tag stage refuses an rt ref built so
    /// [default: $IMGBUILD_CACHE_REMOTE_INSECURE=1].
    #[arg(long)]
    cache_remote_insecure: bool,
    #[command(flatten)]
    secure_boot: SecureBootArgs,
}

/// The Secure Boot key the gate signs with (overrides `secure-boot:`).
#[derive(Args, Debug)]
pub struct SecureBootArgs {
    /// The Secure Boot private key (PEM, readable by its owner only): a
    /// recipe signs the proven kernel with it before the commit, a disk its
    /// shim and GRUB, and every kernel must verify against the certificate
    /// [default: the recipe's `secure-boot.key`].
    #[arg(
        long,
        value_name = "FILE",
        requires = "secure_boot_cert",
        env = "IMGBUILD_SECURE_BOOT_KEY"
    )]
    secure_boot_key: Option<PathBuf>,
    /// Its certificate (PEM): what the devices' firmware enrolls.
    #[arg(
        long,
        value_name = "FILE",
        requires = "secure_boot_key",
        env = "IMGBUILD_SECURE_BOOT_CERT"
    )]
    secure_boot_cert: Option<PathBuf>,
}

impl SecureBootArgs {
    /// The key from the command line, else from `recipe`, checked (exit 2
    /// naming the file).
    fn load(&self, recipe: Option<&crate::recipe::SecureBootFiles>) -> Result<Option<SigningKey>> {
        let key = match (&self.secure_boot_key, &self.secure_boot_cert, recipe) {
            (Some(key), Some(cert), _) => {
                SigningKey::load(key, cert, ("--secure-boot-key", "--secure-boot-cert"))?
            }
            (_, _, Some(files)) => {
                SigningKey::load(&files.key, &files.cert, ("secure-boot.key", "secure-boot.cert"))?
            }
            _ => return Ok(None),
        };
        Ok(Some(key))
    }
}

#[derive(Args, Debug)]
pub struct VerifyKernelArgs {
    image: PathBuf,
    /// The .config the image was built from.
    #[arg(long)]
    config: Option<PathBuf>,
    /// A modules directory (lib/modules/<release>) whose vermagic to check.
    #[arg(long)]
    modules: Option<PathBuf>,
    /// The machine the kernel must be for (x86_64 or arm64); without it,
    /// the image's header decides which checks read it.
    #[arg(long)]
    arch: Option<rtcheck::Arch>,
}

#[derive(Args, Debug)]
pub struct BootArgs {
    iso: PathBuf,
    #[arg(long, value_enum, default_value = "tcg")]
    accel: Accel,
    /// Seconds to wait for the guest.
    #[arg(long, default_value_t = 600)]
    timeout: u64,
    /// Run jitter for this many seconds and print its report.
    #[arg(long)]
    jitter: Option<u64>,
    /// Boot through UEFI firmware (OVMF) instead of BIOS; arm64 always
    /// boots through UEFI (AAVMF).
    #[arg(long)]
    uefi: bool,
    /// The machine the ISO is for: x86_64 boots in qemu-system-x86_64,
    /// arm64 in qemu-system-aarch64's `virt` board.
    #[arg(long, default_value = "x86_64")]
    arch: rtcheck::Arch,
}

#[derive(Args, Debug)]
#[command(group(ArgGroup::new("signing").required(true).args(["gpg_key", "unsigned"])))]
pub struct PublishArgs {
    #[arg(long, value_parser = user_path)]
    repo: PathBuf,
    /// A directory, file:// URL (the remote's web root) or
    /// ssh://user@host[:port]/path (the system OpenSSH client; host keys
    /// checked; $IMGBUILD_SSH_CONFIG names an ssh_config to use).
    #[arg(long)]
    to: String,
    /// Refs to publish [default: every ref of the repo].
    #[arg(long = "ref")]
    refs: Vec<String>,
    /// GPG key to sign the commits and the summary with (or --unsigned).
    #[arg(long)]
    gpg_key: Option<String>,
    #[arg(long, requires = "gpg_key")]
    gpg_homedir: Option<PathBuf>,
    /// Publish without signatures (or --gpg-key).
    #[arg(long)]
    unsigned: bool,
    /// Static deltas from this many previously published commits per ref.
    #[arg(long, default_value_t = 2)]
    deltas: usize,
    /// Also generate a static delta from empty to each tip (first pulls).
    /// Off by default: it takes minutes, and clients pull objects without it.
    #[arg(long)]
    delta_from_empty: bool,
    /// Parents of each ref's tip to carry along (with a delta from each), so
    /// devices can pull or deploy them by checksum.
    #[arg(long, default_value_t = publish::DEFAULT_DEPTH)]
    depth: usize,
    /// Publish even when the version is not newer than the remote's.
    #[arg(long)]
    force: bool,
    /// Remove the refs the destination serves whose commits the GPG key did
    /// not sign [default: refuse to publish, exit 3, naming each].
    #[arg(long, requires = "gpg_key")]
    prune_unsigned_refs: bool,
    /// The Secure Boot certificate (PEM) the devices' firmware trusts:
    /// every published kernel must verify against it (exit 3 otherwise).
    #[arg(long, value_name = "FILE")]
    secure_boot_cert: Option<PathBuf>,
    /// Also write the release site (`imgbuild site`) under `site/` at the
    /// destination, its signatures checked against --gpg-key.
    #[arg(long, requires = "gpg_key")]
    site: bool,
}

#[derive(Args, Debug)]
pub struct InspectArgs {
    #[arg(long, value_parser = user_path)]
    repo: PathBuf,
    #[arg(value_name = "REF")]
    ref_name: String,
    /// Also the commit's SBOM: its path, checksum (checked against the
    /// metadata), package count and the licenses seen.
    #[arg(long)]
    sbom: bool,
}

#[derive(Args, Debug)]
pub struct DiffArgs {
    /// The ostree repo (archive mode) holding both commits.
    #[arg(long, value_parser = user_path)]
    repo: PathBuf,
    /// The commit devices have (a ref or checksum).
    from: String,
    /// The commit they would take.
    to: String,
    /// The most files named per directory group and kind (added, removed,
    /// changed), in text and JSON; the rest are counted. 0 names them all.
    #[arg(long, value_name = "N", default_value_t = 10)]
    files_per_group: usize,
    #[command(flatten)]
    cve: CveDataArgs,
}

#[derive(Args, Debug)]
pub struct QualifyArgs {
    /// Machines booted from the live ISO: USER@HOST, USER@HOST:PORT or USER@[IPV6]:PORT.
    #[arg(value_name = "TARGET", required = true)]
    targets: Vec<String>,
    /// The repo holding the ref; the records are stored beside its commit.
    #[arg(long, value_parser = user_path)]
    repo: PathBuf,
    /// The tagged rt ref whose kernel the machines must run.
    #[arg(long = "ref", value_name = "REF")]
    ref_name: String,
    /// Seconds of measurement on each machine.
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    duration: u64,
    /// Worst-case latency allowed, in microseconds.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..))]
    budget: u64,
    /// The SSH private key to log in with.
    #[arg(short = 'i', value_name = "KEY")]
    identity: Option<PathBuf>,
    /// The SSH port of targets that name none.
    #[arg(long, default_value_t = 22, value_parser = clap::value_parser!(u16).range(1..))]
    port: u16,
    /// Trust only the host keys in this known_hosts file (e.g.
    /// ~/.ssh/known_hosts; hashed entries work). A machine whose key is not
    /// in it is refused before login. This or --trust-on-first-use is needed.
    #[arg(long, value_name = "FILE")]
    known_hosts: Option<PathBuf>,
    /// Take each machine's host key as it first shows it (nothing vouches
    /// for it), pinned for the run; its record says "trust-on-first-use" and
    /// promote counts it only with --allow-tofu.
    #[arg(long)]
    trust_on_first_use: bool,
    /// Also keep each machine's files here, in HOST-PORT/.
    #[arg(long, value_name = "DIR", value_parser = user_path)]
    out: Option<PathBuf>,
    /// The GPG key that signs the records.
    #[arg(long, value_name = "KEYID")]
    gpg_key: String,
    /// The GnuPG home holding that key [default: $GNUPGHOME, else ~/.gnupg].
    #[arg(long, value_name = "DIR")]
    gpg_homedir: Option<PathBuf>,
    /// The live ISO the targets booted. A target with a TPM is then
    /// attested: its quote must show GRUB loaded this ISO's kernel (the
    /// ref's) and initramfs, and its EK becomes its hardware id.
    #[arg(long, value_name = "ISO", value_parser = user_path)]
    live_iso: Option<PathBuf>,
    /// PEM certificates (roots and intermediates) a TPM's EK certificate
    /// must chain to; without it the record says the certificate was not checked.
    #[arg(long, value_name = "FILE", requires = "live_iso", value_parser = user_path)]
    tpm_ca: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct PromoteArgs {
    #[arg(long, value_parser = user_path)]
    repo: PathBuf,
    /// The qualified ref (e.g. emberrtos/x86_64/rt).
    #[arg(long, value_name = "REF")]
    from: String,
    /// The release ref to move (e.g. emberrtos/x86_64/rt-stable).
    #[arg(long, value_name = "REF")]
    to: String,
    /// The GPG key that must have signed the records; it signs the promotion.
    #[arg(long, value_name = "KEYID")]
    gpg_key: String,
    /// The GnuPG home holding that key [default: $GNUPGHOME, else ~/.gnupg].
    #[arg(long, value_name = "DIR")]
    gpg_homedir: Option<PathBuf>,
    /// A hardware id that must have a PASS; repeatable. Required ones count
    /// toward --min-platforms, which still applies.
    #[arg(long = "require", value_name = "HARDWARE-ID")]
    require: Vec<String>,
    /// Distinct platforms, measured through distinct host keys, that must
    /// have a PASS (one platform alone: say --min-platforms 1).
    #[arg(long, default_value_t = 2)]
    min_platforms: usize,
    /// Also count PASS records whose host key was not pinned
    /// (trust-on-first-use, or a qualification/1 record, which does not say).
    #[arg(long)]
    allow_tofu: bool,
    /// Also count PASS records no TPM attested (`provenance.attestation:
    /// none`): their hardware, kernel and figures are the target's own word.
    #[arg(long)]
    allow_unattested: bool,
    /// PEM certificates (TPM vendors' roots and intermediates) an attested
    /// PASS's EK certificate must chain to; without it, an attested PASS
    /// counts only with --allow-unattested.
    #[arg(long, value_name = "FILE", value_parser = user_path)]
    tpm_ca: Option<PathBuf>,
    /// The shortest measurement a PASS counts with, in seconds.
    #[arg(long, default_value_t = 300)]
    min_duration: u64,
    /// The largest budget a PASS counts with, in microseconds.
    #[arg(long, default_value_t = 100)]
    max_budget: u64,
    /// Refuse while the commit has a known vulnerability (affected or
    /// undetermined) at or above LEVEL that no signed VEX statement clears:
    /// unimportant, low, medium, high, end-of-life, unassigned (`high` also
    /// refuses end-of-life and unassigned ones).
    #[arg(long, value_name = "LEVEL", value_parser = urgency_word)]
    max_severity: Option<Urgency>,
    /// The vulnerability data --max-severity judges by (the Debian security
    /// tracker's JSON, or osv.dev's zip of Debian OSV records) [default:
    /// what `imgbuild cve-db update` kept in the cache].
    #[arg(long, value_name = "FILE", requires = "max_severity")]
    cve_db: Option<PathBuf>,
    /// With --max-severity: the cache directory [default: $IMGBUILD_CACHE,
    /// else ~/.cache/imgbuild].
    #[arg(
        long,
        value_name = "DIR",
        requires = "max_severity",
        conflicts_with = "cve_db"
    )]
    cache_dir: Option<PathBuf>,
    /// Refuse data dated more than DAYS days ago.
    #[arg(long, value_name = "DAYS", requires = "max_severity")]
    max_age: Option<u64>,
    /// An OpenVEX document whose statements may clear findings; it counts
    /// only with an armored detached signature FILE.sig by --gpg-key.
    /// Repeatable.
    #[arg(long, value_name = "FILE", requires = "max_severity")]
    vex: Vec<PathBuf>,
}

fn urgency_word(word: &str) -> std::result::Result<Urgency, String> {
    Urgency::from_word(word).ok_or_else(|| {
        let words: Vec<&str> = Urgency::ALL.iter().map(|u| u.as_str()).collect();
        format!("not one of {}", words.join(", "))
    })
}

#[derive(Args, Debug)]
pub struct ConfigMediumArgs {
    /// The provision.yaml to validate and put on the medium.
    provision: PathBuf,
    /// The image to write (replaced atomically).
    #[arg(long, value_parser = user_path)]
    out: PathBuf,
    /// The publisher key that update-remote.gpg-key names [default: that
    /// file beside the yaml].
    #[arg(long)]
    gpg_key: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct VmArgs {
    /// The disk image (raw or qcow2, or a hybrid ISO); it is never modified.
    disk: PathBuf,
    /// A configuration medium image, plugged in as a read-only USB stick.
    #[arg(long, value_name = "IMG")]
    config_medium: Option<PathBuf>,
    /// Boot through UEFI firmware (OVMF) instead of BIOS; arm64 always
    /// boots through UEFI (AAVMF).
    #[arg(long)]
    uefi: bool,
    /// The machine the disk is for: x86_64 boots in qemu-system-x86_64's
    /// q35, arm64 in qemu-system-aarch64's `virt` board.
    #[arg(long, default_value = "x86_64")]
    arch: rtcheck::Arch,
    /// Boot OVMF's Secure Boot build with these variables (keys enrolled,
    /// e.g. by virt-fw-vars; copied, never modified). Implies --uefi.
    #[arg(long, value_name = "VARS")]
    secure_boot: Option<PathBuf>,
    /// Port on 127.0.0.1 forwarded to the guest's SSH [default: a free one].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..))]
    ssh_port: Option<u16>,
    /// Kill the guest after this many seconds (exit 1) [default: none].
    #[arg(long, value_name = "S")]
    timeout: Option<u64>,
    /// Write the serial console here [default: a new temp dir's console.log].
    #[arg(long, value_name = "FILE")]
    console: Option<PathBuf>,
    /// Let the guest reach this port of the host's 127.0.0.1, at
    /// 10.0.2.100:PORT (e.g. an update remote); repeatable. Nothing else on
    /// the host or beyond is reachable.
    #[arg(long = "host-port", value_name = "PORT", value_parser = clap::value_parser!(u16).range(1..))]
    host_ports: Vec<u16>,
    /// Boot through this qcow2 overlay, kept after the run: made on first
    /// use, booted again after (e.g. to power on a guest that was killed).
    #[arg(long, value_name = "FILE")]
    overlay: Option<PathBuf>,
    #[arg(long, value_enum, default_value = "tcg")]
    accel: Accel,
    /// Guest memory.
    #[arg(long, value_name = "MIB", default_value_t = 1536, value_parser = clap::value_parser!(u32).range(128..))]
    memory: u32,
    /// Give the guest its own SMBIOS identity, so two guests look like two
    /// machines (the guest reads it in /sys/class/dmi/id/); repeatable, each
    /// FIELD at most once. FIELD: sys-vendor, product-name,
    /// product-version, serial, board-vendor, board-name, bios-vendor,
    /// bios-version. VALUE: 1-64 of `A-Za-z0-9 ._+()/-` (no comma), e.g.
    /// `--dmi "sys-vendor=Acme Corp" --dmi serial=SN-0042`.
    #[arg(long = "dmi", value_name = "FIELD=VALUE", value_parser = vm::parse_dmi_setting)]
    dmi: Vec<vm::DmiSetting>,
    /// Give the guest a TPM 2.0 (swtpm) whose state lives in DIR: made,
    /// with an EK certificate from swtpm's local CA, on first use; kept
    /// after, so the guest keeps its TPM identity. Another DIR, another TPM.
    #[arg(long, value_name = "DIR")]
    tpm: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct DiskArgs {
    /// The ostree repo holding the refs.
    #[arg(long, value_parser = user_path)]
    repo: PathBuf,
    /// The ref to deploy.
    #[arg(long = "ref", value_name = "REF")]
    ref_name: String,
    /// A ref to store in the device's repo too (e.g. the rt ref, for
    /// offline provisioning); repeatable.
    #[arg(long = "embed", value_name = "REF")]
    embed: Vec<String>,
    /// The image to write (replaced atomically).
    #[arg(long, value_parser = user_path)]
    out: PathBuf,
    #[arg(long, value_enum, default_value = "raw")]
    format: DiskFormat,
    /// The whole disk, e.g. `8G` [default: from the tree, room for two deployments].
    #[arg(long)]
    size: Option<String>,
    /// The device's ostree remote (http or https), verified with --remote-gpg-key.
    #[arg(long, value_name = "URL", requires = "remote_gpg_key")]
    remote_url: Option<String>,
    /// The publisher's OpenPGP public key for the remote.
    #[arg(long, value_name = "FILE", requires = "remote_url")]
    remote_gpg_key: Option<PathBuf>,
    /// A kernel argument after the commit's own; repeatable.
    #[arg(long = "karg", value_name = "ARG")]
    kargs: Vec<String>,
    #[command(flatten)]
    secure_boot: SecureBootArgs,
}

/// Parses the command line, runs it and maps the result to the exit code.
pub fn main() -> ExitCode {
    emberrtos_contract::error::finish(parse(), run)
}

/// `Cli::try_parse`, with the version (`-V`, `--version`) built at run
/// time: it names the libostree this process loaded.
fn parse() -> Result<Cli, clap::Error> {
    let version = crate::version::long_version();
    let command = Cli::command().version(version.clone()).long_version(version);
    Cli::from_arg_matches_mut(&mut command.try_get_matches()?).map_err(|e| e.format(&mut Cli::command()))
}

fn print_json(value: &serde_json::Value) -> Result<()> {
    let mut out = std::io::stdout().lock();
    serde_json::to_writer_pretty(&mut out, value)?;
    writeln!(out)?;
    Ok(())
}

/// The human form of `inspect`.
fn render_commit(info: &ostree::CommitInfo, evidence: Option<&rtcheck::Evidence>) -> String {
    use std::fmt::Write as _;
    let text = |key: &str| {
        info.metadata
            .get(key)
            .map(|v| v.as_str().map_or(v.to_string(), str::to_string))
    };
    let mut out = String::new();
    let _ = writeln!(out, "commit   {}", info.checksum);
    if let Some(parent) = &info.parent {
        let _ = writeln!(out, "parent   {parent}");
    }
    let _ = writeln!(out, "subject  {}", info.subject);
    let _ = writeln!(
        out,
        "date     {}",
        crate::stages::kernel::format_utc(info.timestamp)
    );
    match commit::arch_of(info) {
        Ok(arch) => writeln!(out, "arch     {arch} ({})", arch.machine()),
        Err(e) => writeln!(out, "arch     unknown: {e}"),
    }
    .ok();
    for (label, key) in [
        ("version", commit::key::VERSION),
        ("flavor", commit::key::FLAVOR),
        ("kernel", commit::key::KERNEL_RELEASE),
        ("config", commit::key::KERNEL_CONFIG_SHA256),
        ("recipe", commit::key::RECIPE_SHA256),
    ] {
        if let Some(value) = text(key) {
            let _ = writeln!(out, "{label:<8} {value}");
        }
    }
    if let Some(kargs) = info.metadata.get(commit::key::KARGS).and_then(|v| v.as_array()) {
        let words: Vec<&str> = kargs.iter().filter_map(|v| v.as_str()).collect();
        let _ = writeln!(out, "kargs    {}", words.join(" "));
    }
    let signatures = info
        .detached_metadata
        .get("ostree.gpgsigs")
        .and_then(|v| v.as_array())
        .map_or(0, Vec::len);
    let _ = writeln!(out, "gpg      {signatures} signature(s)");
    match evidence {
        Some(evidence) => {
            let _ = writeln!(out, "PREEMPT_RT evidence:");
            for check in &evidence.checks {
                let _ = writeln!(out, "  {check}");
            }
        }
        None => {
            let _ = writeln!(out, "PREEMPT_RT evidence: none recorded");
        }
    }
    out
}

/// Runs a parsed command; returns the exit code for non-error outcomes.
pub fn run(cli: Cli) -> Result<u8> {
    let ui = Ui::new(cli.json);
    match cli.command {
        Command::Recipe(args) => run_recipe(args, ui, cli.json),
        Command::VerifyKernel(args) => run_verify_kernel(args, cli.json),
        Command::Boot(args) => run_boot(args, &ui, cli.json),
        Command::Publish(args) => run_publish(args, &ui, cli.json),
        Command::Inspect(args) => run_inspect(args, cli.json),
        Command::Diff(args) => run_diff(args, cli.json),
        Command::Cve(args) => run_cve(args, &ui, cli.json),
        Command::CveDb(args) => {
            let shown = crate::commands::cve_db::run(args, &ui)?;
            if cli.json {
                print_json(&serde_json::to_value(&shown)?)?;
            } else {
                print!("{}", crate::commands::cve_db::render(&shown));
            }
            Ok(exit::OK)
        }
        Command::ConfigMedium(args) => run_config_medium(args, cli.json),
        Command::Vm(args) => run_vm(args, &ui, cli.json),
        Command::Disk(args) => run_disk(args, &ui, cli.json),
        Command::Qualify(args) => run_qualify(args, &ui, cli.json),
        Command::Promote(args) => run_promote(args, &ui, cli.json),
        Command::Site(args) => run_site(args, &ui, cli.json),
        Command::Cache(args) => {
            let doc = crate::commands::cache::run(args, &ui, cli.json)?;
            if cli.json {
                print_json(&doc)?;
            }
            Ok(exit::OK)
        }
    }
}

fn run_recipe(args: RecipeArgs, ui: Ui, json: bool) -> Result<u8> {
    let recipe = Recipe::load(&args.file)?;
    recipe.check_work_dir(&std::path::absolute(&args.work_dir)?)?;
    let signing = args.secure_boot.load(recipe.secure_boot.as_ref())?;
    pipeline::check_reach(&recipe, args.until, signing.as_ref())?;
    let cache_root = args.cache_dir.unwrap_or_else(Cache::default_root);
    let flags = remote::RemoteFlags {
        url: args.cache_remote,
        key: args.cache_remote_key,
        insecure: args.cache_remote_insecure,
    };
    let remote = remote::from_flags(&flags, |name| std::env::var(name).ok())
        .map_err(|e| BadInput::new(&e.origin.clone(), e.to_string()))?;
    if let Some(insecure) = remote.as_ref().filter(|r| r.is_insecure()) {
        ui.warn(format!(
            "the cache remote {} is used UNVERIFIED (--cache-remote-insecure): anyone who can answer for it can put a kernel or files into this build; the commit records it, and an rt ref built from it is not tagged",
            insecure.url()
        ));
    }
    let cache = Cache::open(&cache_root)?.with_remote(remote);
    // Held until the run ends: `cache gc` removes nothing meanwhile.
    let _cache_hold = cache.hold_for_build()?;
    std::fs::create_dir_all(&args.work_dir)
        .with_context(|| format!("creating work dir {}", args.work_dir.display()))?;
    let flags = CompilerFlags {
        distcc: args.distcc.map(|h| Some(h).filter(|h| !h.is_empty())),
        ccache: args.ccache.map(|d| Some(d).filter(|d| !d.as_os_str().is_empty())),
        jobs: args.jobs.map(|n| n as usize),
    };
    let compiler = compiler::resolve(
        &recipe.kernel.build,
        &flags,
        |name| std::env::var(name).ok(),
        cache.root().join("ccache"),
    )
    .map_err(|e| BadInput::new(&e.source_name, e.message))?;
    let ctx = pipeline::Context {
        recipe,
        work_dir: args.work_dir.canonicalize()?,
        cache,
        ui,
        fetch_options: FetchOptions::default(),
        boot: BootOptions {
            accel: args.accel,
            timeout: Duration::from_secs(args.boot_timeout),
            jitter: (args.boot_jitter > 0).then_some(args.boot_jitter),
            uefi: args.uefi,
            cpus: 2,
        },
        compiler,
        signing,
    };
    let mut report = PipelineReport::default();
    let result = pipeline::run(&ctx, args.until, &mut report);
    let summary = crate::summary::of(&report);
    if json {
        let mut doc = serde_json::to_value(&report)?;
        doc["summary"] = serde_json::to_value(&summary)?;
        doc["ok"] = serde_json::Value::Bool(result.is_ok());
        if let Err(e) = &result {
            doc["error"] = serde_json::Value::String(format!("{e:#}"));
            doc["exit-code"] = exit_code(e).into();
        }
        print_json(&doc)?;
    }
    result?;
    ctx.ui
        .step("done", format!("pipeline finished after stage `{}`", args.until));
    if !json {
        eprint!("{}", crate::summary::render(&summary));
    }
    Ok(exit::OK)
}

fn run_verify_kernel(args: VerifyKernelArgs, json: bool) -> Result<u8> {
    let mut evidence = verify::check_artifacts(&args.image, args.config.as_deref(), args.modules.as_deref())?;
    if let Some(arch) = args.arch {
        evidence.expect_arch(arch);
    }
    let required = rtcheck::required_checks(rtcheck::RequiredFor::image(args.config.is_some()));
    let verdict = verify::gate("verify-kernel", &evidence, &required);
    if json {
        let mut doc = serde_json::to_value(&evidence)?;
        doc["preempt-rt"] = verdict.is_ok().into();
        doc["image"] = args.image.display().to_string().into();
        print_json(&doc)?;
    } else {
        print!("{}", verify::render(&evidence));
    }
    verdict?;
    Ok(exit::OK)
}

fn run_boot(args: BootArgs, ui: &Ui, json: bool) -> Result<u8> {
    let options = BootOptions {
        accel: args.accel,
        timeout: Duration::from_secs(args.timeout),
        jitter: args.jitter,
        uefi: args.uefi,
        cpus: 2,
    };
    let sha = crate::io::hashing::sha256_file(&args.iso, None)?;
    let log_dir = tempfile::Builder::new()
        .prefix("imgbuild-boot-")
        .tempdir()?
        .keep();
    let board = crate::io::qemu::board(args.arch);
    let out = boot::boot(&args.iso, &sha, board, &options, &log_dir.join("console.log"), ui)?;
    if json {
        // What the table would say goes to stderr, with the progress.
        for line in boot::render(&out).lines() {
            ui.note(line);
        }
        print_json(&serde_json::to_value(&out)?)?;
    } else {
        print!("{}", boot::render(&out));
    }
    verify::gate(
        "boot",
        &out.evidence,
        &rtcheck::required_checks(rtcheck::RequiredFor::boot()),
    )?;
    Ok(exit::OK)
}

fn run_publish(args: PublishArgs, ui: &Ui, json: bool) -> Result<u8> {
    let expected = args
        .secure_boot_cert
        .as_deref()
        .map(|path| load_certificate("--secure-boot-cert", path))
        .transpose()?;
    let transport = crate::transport::open(&args.to)?;
    let options = publish::PublishOptions {
        refs: args.refs,
        gpg_key: args.gpg_key.as_deref(),
        gpg_homedir: args.gpg_homedir.as_deref(),
        deltas: args.deltas,
        delta_from_empty: args.delta_from_empty,
        depth: args.depth,
        force: args.force,
        prune_unsigned_refs: args.prune_unsigned_refs,
        secure_boot_cert: expected.as_ref(),
        after_phase: &|_| Ok(()),
    };
    let mut report = publish::publish(&args.repo, transport.as_ref(), &options, ui)?;
    if let (true, Some(key)) = (args.site, args.gpg_key.as_deref()) {
        let trust = crate::site::publisher_trust(key, args.gpg_homedir.as_deref())?;
        let pages = crate::site::publish_site(&args.repo, transport.as_ref(), &trust, ui)?;
        ui.note(format!("the release site: {pages} pages under site/"));
        report.site_pages = Some(pages);
    }
    if json {
        print_json(&serde_json::to_value(&report)?)?;
    } else {
        print!("{}", render_publish(&report));
    }
    Ok(exit::OK)
}

/// The human form of `publish`.
fn render_publish(report: &publish::PublishReport) -> String {
    if report.no_op {
        return format!(
            "nothing to publish: {} already serves these commits\n",
            report.destination
        );
    }
    let mut out: String = report
        .refs
        .iter()
        .map(|r| {
            format!(
                "{} -> {} ({}), history: {}, deltas: {}\n",
                r.ref_name,
                r.commit,
                r.version,
                r.history.len(),
                r.deltas.join(", ")
            )
        })
        .collect();
    if report.records_copied > 0 {
        out.push_str(&format!("records-copied: {}\n", report.records_copied));
    }
    out
}

fn run_inspect(args: InspectArgs, json: bool) -> Result<u8> {
    let repository = ostree::open(&args.repo)?;
    let info = ostree::read_commit(&repository, &args.ref_name)?;
    let evidence = commit::full_evidence(&info).ok();
    let records = qualify::listing::list(&args.repo, &info.checksum)?;
    let sbom = match args.sbom {
        true => Some(sbom::read_from_commit(&repository, &info)?),
        false => None,
    };
    if json {
        let mut doc = serde_json::to_value(&info)?;
        doc["evidence"] = serde_json::to_value(&evidence)?;
        doc["qualifications"] = serde_json::to_value(&records.qualifications)?;
        doc["promotions"] = serde_json::to_value(&records.promotions)?;
        if let Some(sbom) = &sbom {
            doc["sbom"] = serde_json::to_value(sbom)?;
        }
        print_json(&doc)?;
    } else {
        print!("{}", render_commit(&info, evidence.as_ref()));
        print!("{}", qualify::listing::render(&records));
        if let Some(sbom) = &sbom {
            println!(
                "sbom     {} ({} bytes, sha256 {}, as the metadata records)",
                sbom.path, sbom.bytes, sbom.sha256
            );
            print!("{}", sbom::summary::render(&sbom.summary));
        }
    }
    Ok(exit::OK)
}

fn run_diff(args: DiffArgs, json: bool) -> Result<u8> {
    let cve = args.cve.source()?;
    let diff = diff::diff(
        &args.repo,
        &args.from,
        &args.to,
        args.files_per_group,
        cve.as_ref(),
    )?;
    if json {
        print_json(&serde_json::to_value(&diff)?)?;
    } else {
        print!("{}", diff::render(&diff));
    }
    Ok(exit::OK)
}

fn run_site(args: SiteArgs, ui: &Ui, json: bool) -> Result<u8> {
    let cve = args.cve.source()?;
    let request = crate::site::SiteRequest {
        repo: args.repo,
        out: args.out,
        trust_key: args.trust_key,
        cve,
    };
    let report = crate::site::build(&request, ui)?;
    if json {
        print_json(&serde_json::to_value(&report)?)?;
    } else {
        print!("{}", crate::site::render(&report));
    }
    Ok(exit::OK)
}

fn run_cve(args: crate::commands::cve::CveArgs, ui: &Ui, json: bool) -> Result<u8> {
    let report = crate::commands::cve::run(args, ui)?;
    if json {
        print_json(&serde_json::to_value(&report)?)?;
    } else {
        print!("{}", crate::cve::report::render(&report));
    }
    Ok(exit::OK)
}

fn parse_targets(texts: &[String], port: u16) -> Result<Vec<qualify::target::Target>> {
    let mut targets: Vec<qualify::target::Target> = Vec::new();
    for text in texts {
        let target =
            qualify::target::Target::parse(text, port).map_err(|e| BadInput::new("TARGET", e.to_string()))?;
        if let Some(earlier) = targets.iter().find(|t| t.same_machine(&target)) {
            return Err(BadInput::new("TARGET", format!("{target} and {earlier} are one machine")).into());
        }
        targets.push(target);
    }
    Ok(targets)
}

fn run_qualify(args: QualifyArgs, ui: &Ui, json: bool) -> Result<u8> {
    let request = qualify::QualifyRequest {
        targets: parse_targets(&args.targets, args.port)?,
        repo: args.repo,
        ref_name: args.ref_name,
        run: qualify::measure::Run {
            duration_s: args.duration,
            budget_us: args.budget,
        },
        ssh: qualify::ssh::SshOptions {
            identity: args.identity,
            host_keys: qualify::ssh::HostKeys::from_flags(args.known_hosts, args.trust_on_first_use)?,
        },
        out: args.out,
        gpg_key: args.gpg_key,
        gpg_homedir: args.gpg_homedir,
        live_iso: args.live_iso,
        tpm_ca: args.tpm_ca,
    };
    let report = qualify::qualify(&request, ui)?;
    if json {
        print_json(&serde_json::to_value(&report)?)?;
    } else {
        print!("{}", qualify::render(&report));
    }
    Ok(report.exit_code())
}

fn run_promote(args: PromoteArgs, ui: &Ui, json: bool) -> Result<u8> {
    let request = qualify::promote::PromoteRequest {
        repo: args.repo,
        from: args.from,
        to: args.to,
        gpg_key: args.gpg_key,
        gpg_homedir: args.gpg_homedir,
        require: args.require,
        min_platforms: args.min_platforms,
        policy: qualify::promote::Policy {
            min_duration_s: args.min_duration,
            max_budget_us: args.max_budget,
            allow_tofu: args.allow_tofu,
            allow_unattested: args.allow_unattested,
            tpm_ca: None,
        },
        tpm_ca: args.tpm_ca,
        cve: match args.max_severity {
            Some(max_severity) => Some(qualify::promote::CveGate {
                max_severity,
                data: DataSource::choose(args.cve_db, "--cve-db", args.cache_dir)?,
                max_age: args.max_age,
                vex: args.vex,
            }),
            None => None,
        },
    };
    qualify::promote::promote(&request, ui, &mut |report| {
        if json {
            let _ = print_json(&serde_json::to_value(report).unwrap_or_default());
        } else {
            print!("{}", qualify::promote::render(&report.rows));
            if let Some(cve) = &report.cve {
                print!("{}", crate::cve::gate::render(cve));
            }
        }
    })?;
    Ok(exit::OK)
}

/// A bad `provision.yaml` (or key file) is a usage error: exit 2, the field
/// named, nothing written.
fn run_config_medium(args: ConfigMediumArgs, json: bool) -> Result<u8> {
    let options = MediumOptions {
        provision: &args.provision,
        out: &args.out,
        gpg_key: args.gpg_key.as_deref(),
    };
    let report = match config_medium::build(&options) {
        Ok(report) => report,
        Err(e) if e.is::<ProvisionError>() => {
            eprintln!("error: {e:#}");
            return Ok(exit::USAGE);
        }
        Err(e) => return Err(e),
    };
    if json {
        print_json(&serde_json::to_value(&report)?)?;
    } else {
        println!(
            "{}: {} {} ({}, {}): {}\nsha256 {}",
            report.image.display(),
            report.label,
            report.volume_id,
            report.flavor,
            report.hostname,
            report.files.join(", "),
            report.sha256
        );
    }
    Ok(exit::OK)
}

fn run_vm(args: VmArgs, ui: &Ui, json: bool) -> Result<u8> {
    // Each value was checked by clap; a field given twice is refused here
    // (exit 2), before anything is read or started.
    let dmi = vm::Dmi::new(args.dmi).map_err(|e| BadInput::new("--dmi", e.to_string()))?;
    let options = vm::VmOptions {
        accel: args.accel,
        memory_mib: args.memory,
        uefi: args.uefi,
        ssh_port: args.ssh_port,
        timeout: args.timeout.map(Duration::from_secs),
        config_medium: args.config_medium,
        console: args.console,
        host_ports: args.host_ports,
        overlay: args.overlay,
        dmi,
        secure_boot_vars: args.secure_boot,
        arch: args.arch,
        tpm: args.tpm,
    };
    let report = vm::run(&args.disk, &options, ui)?;
    if json {
        print_json(&serde_json::to_value(&report)?)?;
    } else {
        print!("{}", vm::render(&report));
    }
    Ok(exit::OK)
}

/// Bad options are exit 2 and a refused commit exit 3, with nothing written.
fn run_disk(args: DiskArgs, ui: &Ui, json: bool) -> Result<u8> {
    let size = args
        .size
        .as_deref()
        .map(|text| crate::recipe::syntax::disk_size(text).map_err(|e| BadInput::new("--size", e)))
        .transpose()?;
    let signing = args.secure_boot.load(None)?;
    let remote = match (args.remote_url, args.remote_gpg_key) {
        (Some(url), Some(gpg_key)) => Some(Remote { url, gpg_key }),
        _ => None,
    };
    let outputs = [(args.format, args.out)];
    let request = DiskRequest {
        repo: &args.repo,
        ref_name: &args.ref_name,
        embed: &args.embed,
        outputs: &outputs,
        size,
        remote: remote.as_ref(),
        kargs: &args.kargs,
        epoch: source_date_epoch(),
        names: &InputNames::CLI,
        signing: signing.as_ref(),
    };
    let out = disk::build(&request, ui)?;
    if json {
        print_json(&serde_json::to_value(&out)?)?;
    } else {
        for image in &out.images {
            println!(
                "{} ({}, {} bytes): {} {} -> {}\nsha256 {}",
                image.path.display(),
                image.format,
                image.bytes,
                out.deployed.ref_name,
                out.origin,
                out.deployed.commit,
                image.sha256
            );
        }
    }
    Ok(exit::OK)
}

/// `$SOURCE_DATE_EPOCH`, when set.
fn source_date_epoch() -> Option<u64> {
    std::env::var("SOURCE_DATE_EPOCH")
        .ok()
        .and_then(|s| s.trim().parse().ok())
}
