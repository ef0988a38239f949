//! Validation of the schema form, one function per recipe section. Each turns
//! its `Raw*` part into the validated part or a [`RecipeError`] that names
//! the field and its position.

use std::fmt::Display;
use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};

use super::distcc::DistccHosts;
use super::syntax::{self, Verdict};
use super::{
    ConfigBase, Disk, Flavor, Kernel, KernelBuild, Live, Locations, Ostree, RawDevice, RawDisk, RawKernel,
    RawLive, RawOstree, RawRecipe, RawRootfs, RawRootfsBase, RawRt, RawSource, RecipeError, Remote, Rootfs,
    RootfsBase, Source, normalize,
};
use super::{RawCcache, RawDistcc, RawKernelBuild, RawSecureBoot, SecureBootFiles};
use crate::io::hashing::is_sha256_hex;
use emberrtos_contract::policy::{self, HealthPolicy};

/// The mmdebstrap variants.
const VARIANTS: &[&str] = &[
    "extract",
    "custom",
    "essential",
    "apt",
    "required",
    "minbase",
    "buildd",
    "important",
    "debootstrap",
    "standard",
];

/// What a `debian:` source names.
#[derive(Clone, Copy)]
enum DebianKind {
    /// A kernel source package (`linux-source-6.12`).
    KernelSource,
    /// A suite for mmdebstrap (`bookworm`).
    Suite,
}

/// Builds errors against one recipe file.
pub(super) struct Validator<'a> {
    pub file: &'a Path,
    pub dir: &'a Path,
    pub locations: &'a Locations,
}

impl Validator<'_> {
    pub fn error(&self, field: &str, message: impl Into<String>) -> RecipeError {
        RecipeError {
            file: self.file.to_path_buf(),
            field: field.to_string(),
            position: self.locations.find(field),
            message: message.into(),
        }
    }

    /// Turns a [`syntax`] verdict into an error at `field`.
    fn check(&self, field: &str, verdict: Verdict) -> Result<(), RecipeError> {
        verdict.map_err(|message| self.error(field, message))
    }

    fn resolve(&self, field: &str, path: &str) -> Result<PathBuf, RecipeError> {
        if path.trim().is_empty() {
            return Err(self.error(field, "path is empty"));
        }
        // The user's own links are followed, as on the command line.
        crate::io::resolve_user_path(&normalize(&self.dir.join(path)))
            .map_err(|e| self.error(field, e.to_string()))
    }

    fn resolve_all(&self, field: &str, paths: &[String]) -> Result<Vec<PathBuf>, RecipeError> {
        paths
            .iter()
            .enumerate()
            .map(|(i, p)| self.resolve(&format!("{field}[{i}]"), p))
            .collect()
    }

    fn resolve_optional(&self, field: &str, path: Option<&str>) -> Result<Option<PathBuf>, RecipeError> {
        path.map(|p| self.resolve(field, p)).transpose()
    }

    fn sha256(&self, field: &str, value: &str) -> Result<String, RecipeError> {
        if is_sha256_hex(value) {
            return Ok(value.to_ascii_lowercase());
        }
        Err(self.error(
            field,
            format!(
                "sha256 must be 64 hex digits, got {:?} ({} characters)",
                value,
                value.len()
            ),
        ))
    }

    /// Debian package names, each checked with [`syntax::debian_package`].
    fn packages(&self, field: &str, packages: &[String]) -> Result<Vec<String>, RecipeError> {
        for (i, package) in packages.iter().enumerate() {
            self.check(&format!("{field}[{i}]"), syntax::debian_package(package))?;
        }
        Ok(packages.to_vec())
    }

    fn source(&self, field: &str, raw: &RawSource, kind: DebianKind) -> Result<Source, RecipeError> {
        self.exactly_one_kind(field, raw)?;
        if let Some(url) = &raw.url {
            return self.url_source(field, url, raw.sha256.as_deref());
        }
        let sha_field = format!("{field}.sha256");
        if let Some(path) = &raw.path {
            return Ok(Source::Path {
                path: self.resolve(&format!("{field}.path"), path)?,
                sha256: raw
                    .sha256
                    .as_deref()
                    .map(|s| self.sha256(&sha_field, s))
                    .transpose()?,
            });
        }
        if raw.sha256.is_some() {
            return Err(self.error(
                &sha_field,
                "`sha256` applies to `url` and `path` sources, not `debian`",
            ));
        }
        let name = raw.debian.as_deref().unwrap_or_default();
        let verdict = match kind {
            DebianKind::KernelSource => syntax::linux_source_package(name),
            DebianKind::Suite => syntax::debian_suite(name),
        };
        self.check(&format!("{field}.debian"), verdict)?;
        Ok(Source::Debian {
            package: name.to_string(),
        })
    }

    fn exactly_one_kind(&self, field: &str, raw: &RawSource) -> Result<(), RecipeError> {
        let given: Vec<&str> = [("url", &raw.url), ("path", &raw.path), ("debian", &raw.debian)]
            .into_iter()
            .filter(|(_, v)| v.is_some())
            .map(|(k, _)| k)
            .collect();
        if given.len() == 1 {
            return Ok(());
        }
        let found = if given.is_empty() {
            "none".to_string()
        } else {
            given.join(" and ")
        };
        Err(self.error(
            field,
            format!("give exactly one of `url` (with `sha256`), `path` or `debian`; found {found}"),
        ))
    }

    /// An integer within `range` (one of [`policy`]'s), else an error at
    /// `field` that gives the range.
    fn in_range<T>(&self, field: &str, value: i64, range: RangeInclusive<T>) -> Result<T, RecipeError>
    where
        T: TryFrom<i64> + PartialOrd + Display + Copy,
    {
        T::try_from(value)
            .ok()
            .filter(|v| range.contains(v))
            .ok_or_else(|| {
                self.error(
                    field,
                    format!(
                        "{value} is out of range: allowed {}..={}",
                        range.start(),
                        range.end()
                    ),
                )
            })
    }

    fn url_source(&self, field: &str, url: &str, sha256: Option<&str>) -> Result<Source, RecipeError> {
        let url_field = format!("{field}.url");
        self.check(&url_field, syntax::download_url(url))?;
        let sha = sha256.ok_or_else(|| {
            self.error(
                &url_field,
                "a url needs a `sha256` pin: downloads are verified and cached by content",
            )
        })?;
        Ok(Source::Url {
            url: url.to_string(),
            sha256: self.sha256(&format!("{field}.sha256"), sha)?,
        })
    }
}

/// `name` and `version`: they reach file names, GRUB menu titles and commit
/// subjects.
pub(super) fn identity(v: &Validator, raw: &RawRecipe) -> Result<(), RecipeError> {
    v.check("name", syntax::image_name(&raw.name))?;
    v.check("version", syntax::image_version(&raw.version))
}

pub(super) fn kernel(v: &Validator, rk: &RawKernel, flavor: Flavor) -> Result<Kernel, RecipeError> {
    Ok(Kernel {
        source: v.source("kernel.source", &rk.source, DebianKind::KernelSource)?,
        base: config_base(v, &rk.base)?,
        fragments: v.resolve_all("kernel.fragments", &rk.fragments)?,
        allow_dropped: allow_dropped(v, &rk.allow_dropped, flavor)?,
        cmdline: cmdline(v, &rk.cmdline)?,
        source_date_epoch: kernel_date(v, rk.source_date_epoch)?,
        build: kernel_build(v, rk.build.as_ref())?,
    })
}

/// `kernel.source-date-epoch`: a Unix time the kernel's build stamp and
/// the boot initramfs's 32-bit cpio dates can hold.
fn kernel_date(v: &Validator, epoch: Option<u64>) -> Result<Option<u64>, RecipeError> {
    match epoch {
        Some(e) if e == 0 || e > u64::from(u32::MAX) => Err(v.error(
            "kernel.source-date-epoch",
            format!("{e} is not a Unix time from 1 to {}", u32::MAX),
        )),
        other => Ok(other),
    }
}

fn kernel_build(v: &Validator, raw: Option<&RawKernelBuild>) -> Result<KernelBuild, RecipeError> {
    let Some(raw) = raw else {
        return Ok(KernelBuild::default());
    };
    let distcc = match &raw.distcc {
        None => None,
        Some(RawDistcc { hosts: None }) => Some(None),
        Some(RawDistcc { hosts: Some(hosts) }) => {
            DistccHosts::parse(hosts).map_err(|e| v.error("kernel.build.distcc.hosts", e.to_string()))?;
            Some(Some(hosts.clone()))
        }
    };
    let ccache = match &raw.ccache {
        None | Some(RawCcache::Enabled(false)) => None,
        Some(RawCcache::Enabled(true)) => Some(None),
        Some(RawCcache::Dir(dir)) => Some(Some(v.resolve("kernel.build.ccache", dir)?)),
    };
    let jobs = match raw.jobs {
        None => None,
        Some(n) if (1..=4096).contains(&n) => Some(n as usize),
        Some(n) => return Err(v.error("kernel.build.jobs", format!("{n} is not from 1 to 4096"))),
    };
    Ok(KernelBuild { distcc, ccache, jobs })
}

/// A make config target, else a path to a `.config` (never a make option).
fn config_base(v: &Validator, base: &str) -> Result<ConfigBase, RecipeError> {
    if syntax::is_make_config_target(base) {
        Ok(ConfigBase::Target(base.to_string()))
    } else {
        Ok(ConfigBase::File(v.resolve("kernel.base", base)?))
    }
}

/// Kconfig symbols, given with or without `CONFIG_`; never PREEMPT_RT in `rt`.
fn allow_dropped(v: &Validator, symbols: &[String], flavor: Flavor) -> Result<Vec<String>, RecipeError> {
    let mut full_names = Vec::new();
    for (i, symbol) in symbols.iter().enumerate() {
        let field = format!("kernel.allow-dropped[{i}]");
        let bare = symbol.strip_prefix("CONFIG_").unwrap_or(symbol);
        if bare.is_empty() || !bare.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
            return Err(v.error(&field, format!("{symbol:?} is not a Kconfig symbol")));
        }
        if flavor == Flavor::Rt && bare == "PREEMPT_RT" {
            return Err(v.error(
                &field,
                "PREEMPT_RT can never be allowed to drop in an `rt` recipe",
            ));
        }
        full_names.push(format!("CONFIG_{bare}"));
    }
    Ok(full_names)
}

fn cmdline(v: &Validator, args: &[String]) -> Result<Vec<String>, RecipeError> {
    for (i, arg) in args.iter().enumerate() {
        v.check(&format!("kernel.cmdline[{i}]"), syntax::kernel_argument(arg))?;
    }
    Ok(args.to_vec())
}

pub(super) fn rootfs(v: &Validator, rr: &RawRootfs) -> Result<Rootfs, RecipeError> {
    let base = match &rr.base.debian {
        Some(suite) => debian_base(v, &rr.base, suite)?,
        None => tarball_base(v, &rr.base)?,
    };
    Ok(Rootfs {
        base,
        overlays: v.resolve_all("rootfs.overlays", &rr.overlays)?,
    })
}

fn debian_base(v: &Validator, rb: &RawRootfsBase, suite: &str) -> Result<RootfsBase, RecipeError> {
    if rb.url.is_some() || rb.path.is_some() || rb.sha256.is_some() {
        return Err(v.error(
            "rootfs.base",
            "give either `debian` (mmdebstrap) or a tarball `path`/`url`, not both",
        ));
    }
    v.check("rootfs.base.debian", syntax::debian_suite(suite))?;
    let variant = rb.variant.clone().unwrap_or_else(|| "minbase".to_string());
    if !VARIANTS.contains(&variant.as_str()) {
        return Err(v.error(
            "rootfs.base.variant",
            format!(
                "unknown mmdebstrap variant {variant:?}; one of {}",
                VARIANTS.join(", ")
            ),
        ));
    }
    let mirror = rb
        .mirror
        .as_deref()
        .map(|m| syntax::mirror_url(m).map_err(|e| v.error("rootfs.base.mirror", e)))
        .transpose()?;
    Ok(RootfsBase::Debian {
        suite: suite.to_string(),
        variant,
        packages: v.packages("rootfs.base.packages", &rb.packages)?,
        mirror,
    })
}

fn tarball_base(v: &Validator, rb: &RawRootfsBase) -> Result<RootfsBase, RecipeError> {
    if rb.variant.is_some() || !rb.packages.is_empty() || rb.mirror.is_some() {
        return Err(v.error(
            "rootfs.base",
            "`variant`, `packages` and `mirror` apply only to a `debian` base",
        ));
    }
    let raw_source = RawSource {
        url: rb.url.clone(),
        path: rb.path.clone(),
        debian: None,
        sha256: rb.sha256.clone(),
    };
    Ok(RootfsBase::Tarball(v.source(
        "rootfs.base",
        &raw_source,
        DebianKind::Suite,
    )?))
}

pub(super) fn ostree(v: &Validator, ro: &RawOstree, arch: rtcheck::Arch) -> Result<Ostree, RecipeError> {
    v.check("ostree.ref", syntax::ostree_ref(&ro.ref_name))?;
    v.check("ostree.ref", ref_names_no_other_machine(&ro.ref_name, arch))?;
    if ro.gpg_homedir.is_some() && ro.gpg_key.is_none() {
        return Err(v.error("ostree.gpg-homedir", "`gpg-homedir` needs `gpg-key`"));
    }
    Ok(Ostree {
        repo: v.resolve_optional("ostree.repo", ro.repo.as_deref())?,
        ref_name: ro.ref_name.clone(),
        gpg_key: ro.gpg_key.clone(),
        gpg_homedir: v.resolve_optional("ostree.gpg-homedir", ro.gpg_homedir.as_deref())?,
    })
}

/// A ref that names a machine names the recipe's (`uname -m`'s name, as in
/// `emberrtos/aarch64/rt`), so one remote serves every architecture
/// without an image for one landing on another's ref.
fn ref_names_no_other_machine(ref_name: &str, arch: rtcheck::Arch) -> Result<(), String> {
    let other = rtcheck::Arch::ALL.into_iter().filter(|a| *a != arch).find(|a| {
        ref_name
            .split('/')
            .any(|part| part == a.machine() || part == a.name() || part == a.debian())
    });
    match other {
        Some(other) => Err(format!(
            "{ref_name:?} names the {other} machine, but the recipe's arch is {arch} (name {:?} in the ref, as in `name/{}/rt`)",
            arch.machine(),
            arch.machine()
        )),
        None => Ok(()),
    }
}

/// `device:` over the default policy: the trial boots' tries and health check.
pub(super) fn device(v: &Validator, rd: Option<&RawDevice>) -> Result<HealthPolicy, RecipeError> {
    let mut health = HealthPolicy::default();
    let Some(rd) = rd else {
        return Ok(health);
    };
    if let Some(tries) = rd.boot_tries {
        health.boot_tries = v.in_range("device.boot-tries", tries, policy::BOOT_TRIES)?;
    }
    if let Some(rh) = &rd.health {
        if let Some(seconds) = rh.latency_seconds {
            health.latency_seconds =
                v.in_range("device.health.latency-seconds", seconds, policy::LATENCY_SECONDS)?;
        }
        if let Some(on_invalid) = rh.on_invalid {
            health.on_invalid = on_invalid;
        }
    }
    Ok(health)
}

/// `rt:` over `health`: the latency budget. Only an `rt` recipe has one.
pub(super) fn rt(
    v: &Validator,
    rr: Option<&RawRt>,
    flavor: Flavor,
    mut health: HealthPolicy,
) -> Result<HealthPolicy, RecipeError> {
    let Some(rr) = rr else {
        return Ok(health);
    };
    if flavor != Flavor::Rt {
        return Err(v.error(
            "rt",
            format!("`rt` applies only to `flavor: rt` recipes; this one is `{flavor}`"),
        ));
    }
    if let Some(budget) = rr.budget_us {
        health.budget_us = v.in_range("rt.budget-us", budget, policy::BUDGET_US)?;
    }
    Ok(health)
}

pub(super) fn live(v: &Validator, rl: Option<&RawLive>) -> Result<Live, RecipeError> {
    let Some(rl) = rl else {
        return Ok(Live::default());
    };
    Ok(Live {
        iso: v.resolve_optional("live.iso", rl.iso.as_deref())?,
        ssh_authorized_keys: ssh_keys(v, &rl.ssh_authorized_keys)?,
        packages: v.packages("live.packages", &rl.packages)?,
        rootfs: v.resolve_optional("live.rootfs", rl.rootfs.as_deref())?,
    })
}

/// Each key parsed as an OpenSSH public key and normalised.
fn ssh_keys(v: &Validator, keys: &[String]) -> Result<Vec<String>, RecipeError> {
    keys.iter()
        .enumerate()
        .map(|(i, key)| {
            syntax::ssh_public_key(key).map_err(|e| v.error(&format!("live.ssh-authorized-keys[{i}]"), e))
        })
        .collect()
}

pub(super) fn disk(v: &Validator, rd: Option<&RawDisk>) -> Result<Option<Disk>, RecipeError> {
    let Some(rd) = rd else {
        return Ok(None);
    };
    let size = rd
        .size
        .as_deref()
        .map(|text| syntax::disk_size(text).map_err(|e| v.error("disk.size", e)))
        .transpose()?;
    let mut formats = Vec::new();
    for (i, format) in rd.formats.iter().enumerate() {
        if formats.contains(format) {
            return Err(v.error(
                &format!("disk.formats[{i}]"),
                format!("`{format}` is listed twice"),
            ));
        }
        formats.push(*format);
    }
    if formats.is_empty() {
        formats.push(super::DiskFormat::Raw);
    }
    for (field, refs) in [
        ("disk.embed", &rd.embed),
        ("disk.embed-if-present", &rd.embed_if_present),
    ] {
        for (i, ref_name) in refs.iter().enumerate() {
            v.check(&format!("{field}[{i}]"), syntax::ostree_ref(ref_name))?;
        }
    }
    let remote = match &rd.remote {
        Some(remote) => {
            v.check("disk.remote.url", syntax::remote_url(&remote.url))?;
            Some(Remote {
                url: remote.url.clone(),
                gpg_key: v.resolve("disk.remote.gpg-key", &remote.gpg_key)?,
            })
        }
        None => None,
    };
    Ok(Some(Disk {
        size,
        formats,
        embed: rd.embed.clone(),
        embed_if_present: rd.embed_if_present.clone(),
        remote,
    }))
}

/// `secure-boot:`: the key and certificate, resolved against the recipe
/// (checked when the build starts, see [`crate::secure_boot::SigningKey`]).
pub(super) fn secure_boot(
    v: &Validator,
    raw: Option<&RawSecureBoot>,
) -> Result<Option<SecureBootFiles>, RecipeError> {
    raw.map(|raw| {
        Ok(SecureBootFiles {
            key: v.resolve("secure-boot.key", &raw.key)?,
            cert: v.resolve("secure-boot.cert", &raw.cert)?,
        })
    })
    .transpose()
}
