//! The recipe: schema, validation and path resolution.
//!
//! [`Recipe::parse`] is pure (text in, recipe or error out; paths are resolved
//! lexically against the recipe's directory). [`Recipe::load`] adds the checks
//! that need the filesystem: referenced files exist, outputs do not collide
//! with inputs once symlinks are resolved, and an `rt` recipe's fragments
//! really request `CONFIG_PREEMPT_RT=y`.
//!
//! Layout: [`schema`] is the YAML as written, [`syntax`] the pure checks on
//! every value that reaches a command or a config file, `sections` turns
//! each section into its validated form, `outputs` keeps outputs away from
//! inputs, and `identity` hashes what defines the image.

pub mod distcc;
mod identity;
mod outputs;
mod schema;
mod sections;
pub use emberrtos_contract::syntax;

use std::fmt;
use std::path::{Component, Path, PathBuf};

use serde::Serialize;

use emberrtos_contract::policy::HealthPolicy;
pub use emberrtos_contract::yaml::{Locations, Position, fmt_field_error, locate, split_yaml_error};
pub use schema::{
    DiskFormat, Flavor, RawCcache, RawDevice, RawDisk, RawDistcc, RawHealth, RawKernel, RawKernelBuild,
    RawLive, RawOstree, RawRecipe, RawRemote, RawRootfs, RawRootfsBase, RawRt, RawSecureBoot, RawSource,
};
use sections::Validator;

/// A recipe error that points at the offending field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct RecipeError {
    pub file: PathBuf,
    /// Dotted field path, e.g. `kernel.source.sha256`.
    pub field: String,
    pub position: Option<Position>,
    pub message: String,
}

impl fmt::Display for RecipeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt_field_error(f, self.file.display(), self.position, &self.field, &self.message)
    }
}

// ---- The validated recipe, with resolved paths. ----

/// A tarball input.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Source {
    Url {
        url: String,
        sha256: String,
    },
    Path {
        path: PathBuf,
        sha256: Option<String>,
    },
    /// A Debian source package such as `linux-source-6.12`.
    Debian {
        package: String,
    },
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Url { url, .. } => write!(f, "{url}"),
            Source::Path { path, .. } => write!(f, "{}", path.display()),
            Source::Debian { package } => write!(f, "Debian package {package}"),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ConfigBase {
    /// A make target such as `x86_64_defconfig` or `tinyconfig`.
    Target(String),
    /// A full `.config` file.
    File(PathBuf),
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum RootfsBase {
    Debian {
        suite: String,
        variant: String,
        /// `name[:arch][=version]`, checked by [`syntax::debian_package`].
        packages: Vec<String>,
        /// An http(s) URL, checked and normalised by [`syntax::mirror_url`].
        mirror: Option<String>,
    },
    Tarball(Source),
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Kernel {
    pub source: Source,
    pub base: ConfigBase,
    pub fragments: Vec<PathBuf>,
    /// With the `CONFIG_` prefix.
    pub allow_dropped: Vec<String>,
    pub cmdline: Vec<String>,
    /// `kernel.source-date-epoch`: the kernel's build date, else its
    /// source's ([`crate::stages::kernel::KernelDate`]); never the release's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source_date_epoch: Option<u64>,
    /// How, not what: left out of the image hash and every cache key.
    #[serde(skip)]
    pub build: KernelBuild,
}

/// `kernel.build`, checked: how to compile, which the environment and the
/// command line override ([`crate::stages::kernel::compiler::resolve`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct KernelBuild {
    /// `Some(None)`: distcc on `$DISTCC_HOSTS`.
    pub distcc: Option<Option<String>>,
    /// `Some(None)`: ccache in the cache's `ccache` area.
    pub ccache: Option<Option<PathBuf>>,
    pub jobs: Option<usize>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Rootfs {
    pub base: RootfsBase,
    pub overlays: Vec<PathBuf>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Ostree {
    pub repo: Option<PathBuf>,
    pub ref_name: String,
    pub gpg_key: Option<String>,
    pub gpg_homedir: Option<PathBuf>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Live {
    pub iso: Option<PathBuf>,
    /// Validated and normalised OpenSSH public keys, `type base64 [comment]`,
    /// one line each: see [`Live::authorized_keys`].
    pub ssh_authorized_keys: Vec<String>,
    pub packages: Vec<String>,
    pub rootfs: Option<PathBuf>,
}

/// The device's ostree remote, configured on disk images.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct Remote {
    /// Checked by [`syntax::remote_url`].
    pub url: String,
    /// The publisher's OpenPGP public key file.
    pub gpg_key: PathBuf,
}

/// The `disk` stage's settings.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct Disk {
    /// Bytes; `None` sizes the disk from the tree.
    pub size: Option<u64>,
    /// At least one, no duplicates, in the order given.
    pub formats: Vec<DiskFormat>,
    pub embed: Vec<String>,
    /// Embedded when the repo has them, left out (and said so) when not.
    pub embed_if_present: Vec<String>,
    pub remote: Option<Remote>,
}

/// The Secure Boot key and certificate files (`secure-boot:`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SecureBootFiles {
    pub key: PathBuf,
    pub cert: PathBuf,
}

#[derive(Clone, Debug, Serialize)]
pub struct Recipe {
    /// The recipe file as given.
    pub file: PathBuf,
    /// Directory that relative paths resolve against.
    pub dir: PathBuf,
    /// What defines the image, hashed: not the recipe text, not output paths
    /// or signing settings (see `identity`). Committed as
    /// `imgbuild.recipe-sha256`, so one image built into two places gets
    /// one value.
    pub sha256: String,
    pub name: String,
    pub version: String,
    pub flavor: Flavor,
    /// `arch:`, x86_64 when left out.
    pub arch: rtcheck::Arch,
    pub source_date_epoch: Option<u64>,
    pub kernel: Kernel,
    pub rootfs: Rootfs,
    pub ostree: Ostree,
    /// What the image's commits ask of their trial boots (`device:`, `rt:`),
    /// defaults for what the recipe leaves out.
    pub health: HealthPolicy,
    pub live: Live,
    pub disk: Option<Disk>,
    pub secure_boot: Option<SecureBootFiles>,
    #[serde(skip)]
    pub raw: RawRecipe,
    #[serde(skip)]
    locations: Locations,
}

impl Live {
    /// The `authorized_keys` file: one validated key per line, or empty.
    pub fn authorized_keys(&self) -> String {
        self.ssh_authorized_keys
            .iter()
            .map(|key| format!("{key}\n"))
            .collect()
    }
}

/// Lexically removes `.` and `..` so paths in messages and cache keys are stable.
pub fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    out.push("..");
                }
            }
            other => out.push(other),
        }
    }
    out
}

/// The schema form, or the first error with its position: the size and
/// depth guard ([`check_bounds`](emberrtos_contract::yaml::check_bounds))
/// runs before the deserializer sees the text.
fn deserialize(text: &str, file: &Path) -> Result<RawRecipe, RecipeError> {
    use emberrtos_contract::yaml::{LIMITS, check_bounds};
    check_bounds(text, LIMITS).map_err(|e| RecipeError {
        file: file.to_path_buf(),
        field: String::new(),
        position: Some(e.position()),
        message: e.to_string(),
    })?;
    yaml_serde::from_str(text).map_err(|e| {
        let (field, message) = split_yaml_error(&e.to_string());
        RecipeError {
            file: file.to_path_buf(),
            field,
            position: e.location().map(|l| Position {
                line: l.line(),
                column: l.column(),
            }),
            message,
        }
    })
}

impl Recipe {
    /// Parses and validates recipe text. Pure: touches no files. `file` names
    /// the recipe in errors and anchors relative paths.
    pub fn parse(text: &str, file: &Path) -> Result<Recipe, RecipeError> {
        let raw = deserialize(text, file)?;
        let locations = locate(text);
        let dir = normalize(&file.parent().map(Path::to_path_buf).unwrap_or_default());
        let v = Validator {
            file,
            dir: &dir,
            locations: &locations,
        };
        sections::identity(&v, &raw)?;
        let mut recipe = Recipe {
            file: file.to_path_buf(),
            sha256: String::new(),
            name: raw.name.clone(),
            version: raw.version.clone(),
            flavor: raw.flavor,
            arch: raw.arch.unwrap_or_default(),
            source_date_epoch: raw.source_date_epoch,
            kernel: sections::kernel(&v, &raw.kernel, raw.flavor)?,
            rootfs: sections::rootfs(&v, &raw.rootfs)?,
            ostree: sections::ostree(&v, &raw.ostree, raw.arch.unwrap_or_default())?,
            health: sections::rt(
                &v,
                raw.rt.as_ref(),
                raw.flavor,
                sections::device(&v, raw.device.as_ref())?,
            )?,
            live: sections::live(&v, raw.live.as_ref())?,
            disk: sections::disk(&v, raw.disk.as_ref())?,
            secure_boot: sections::secure_boot(&v, raw.secure_boot.as_ref())?,
            dir: dir.clone(),
            raw,
            locations,
        };
        recipe.check_outputs(|p| p.to_path_buf())?;
        recipe.sha256 = identity::image_sha256(&recipe);
        Ok(recipe)
    }

    /// Reads, parses and validates a recipe file, including the checks that
    /// need the filesystem.
    pub fn load(file: &Path) -> Result<Recipe, RecipeError> {
        let text = std::fs::read_to_string(file).map_err(|e| RecipeError {
            file: file.to_path_buf(),
            field: String::new(),
            position: None,
            message: format!("cannot read the recipe: {e}"),
        })?;
        let recipe = Recipe::parse(&text, file)?;
        recipe.check_inputs()?;
        Ok(recipe)
    }

    /// The image hash; see [`Recipe::sha256`](Recipe#structfield.sha256).
    pub fn image_sha256(&self) -> &str {
        &self.sha256
    }

    fn validator(&self) -> Validator<'_> {
        Validator {
            file: &self.file,
            dir: &self.dir,
            locations: &self.locations,
        }
    }

    /// Refuses outputs that collide with inputs or with each other, comparing
    /// paths as `view` maps them.
    fn check_outputs(&self, view: impl Fn(&Path) -> PathBuf) -> Result<(), RecipeError> {
        let v = self.validator();
        outputs::check(self, None, view, |field, message| v.error(field, message))
    }

    /// Refuses a work dir that collides with an input (stages write under
    /// it, and the default `ostree.repo` and `live.iso` live in it): equal
    /// to one, inside an input dir, or holding an input. Symlinks resolved.
    pub fn check_work_dir(&self, work_dir: &Path) -> Result<(), RecipeError> {
        let v = self.validator();
        outputs::check(self, Some(work_dir), outputs::real_path, |field, message| {
            v.error(field, message)
        })
    }

    /// Checks that every input exists, that no output collides with an input
    /// once symlinks are resolved, and that an `rt` recipe's fragments
    /// request `CONFIG_PREEMPT_RT=y`.
    pub fn check_inputs(&self) -> Result<(), RecipeError> {
        self.check_input_files()?;
        self.check_outputs(outputs::real_path)?;
        let merged = self.merged_fragments()?;
        if self.flavor == Flavor::Rt {
            self.check_rt_requested(&merged)?;
        }
        Ok(())
    }

    fn check_input_files(&self) -> Result<(), RecipeError> {
        let v = self.validator();
        let must_be = |field: &str, path: &Path, is_dir: bool| {
            let (found, what) = if is_dir {
                (path.is_dir(), "directory")
            } else {
                (path.is_file(), "file")
            };
            if found {
                Ok(())
            } else {
                Err(v.error(field, format!("{what} not found: {}", path.display())))
            }
        };
        if let Source::Path { path, .. } = &self.kernel.source {
            must_be("kernel.source.path", path, false)?;
        }
        if let ConfigBase::File(path) = &self.kernel.base {
            must_be("kernel.base", path, false)?;
        }
        for (i, path) in self.kernel.fragments.iter().enumerate() {
            must_be(&format!("kernel.fragments[{i}]"), path, false)?;
        }
        if let RootfsBase::Tarball(Source::Path { path, .. }) = &self.rootfs.base {
            must_be("rootfs.base.path", path, false)?;
        }
        for (i, path) in self.rootfs.overlays.iter().enumerate() {
            must_be(&format!("rootfs.overlays[{i}]"), path, true)?;
        }
        if let Some(home) = &self.ostree.gpg_homedir {
            must_be("ostree.gpg-homedir", home, true)?;
        }
        if let Some(remote) = self.disk.as_ref().and_then(|d| d.remote.as_ref()) {
            must_be("disk.remote.gpg-key", &remote.gpg_key, false)?;
        }
        if let Some(live_rootfs) = &self.live.rootfs {
            must_be("live.rootfs", live_rootfs, true)?;
            if !live_rootfs.join("init").is_file() {
                return Err(v.error("live.rootfs", format!("{} has no `init`", live_rootfs.display())));
            }
        }
        Ok(())
    }

    /// The fragments merged in order, errors pointing at the fragment.
    fn merged_fragments(&self) -> Result<rtcheck::kconfig::MergedFragments, RecipeError> {
        let v = self.validator();
        let mut fragments = Vec::new();
        for (i, (name, path)) in self.fragment_names().enumerate() {
            let text = std::fs::read_to_string(path).map_err(|e| {
                v.error(
                    &format!("kernel.fragments[{i}]"),
                    format!("cannot read {}: {e}", path.display()),
                )
            })?;
            fragments.push((name, text));
        }
        rtcheck::kconfig::merge_fragments(fragments.iter().map(|(n, t)| (*n, t.as_str()))).map_err(|e| {
            let index = fragments.iter().position(|(n, _)| *n == e.file).unwrap_or(0);
            v.error(&format!("kernel.fragments[{index}]"), e.to_string())
        })
    }

    /// An `rt` recipe's last word on PREEMPT_RT (a fragment, else a base
    /// `.config` file) must be `y`.
    fn check_rt_requested(&self, merged: &rtcheck::kconfig::MergedFragments) -> Result<(), RecipeError> {
        let request = merged.requests.get("CONFIG_PREEMPT_RT");
        let from_base = match &self.kernel.base {
            ConfigBase::File(path) => std::fs::read_to_string(path)
                .ok()
                .and_then(|t| rtcheck::kconfig::Config::parse(&t).ok())
                .is_some_and(|c| c.is_preempt_rt()),
            ConfigBase::Target(_) => false,
        };
        let rt_requested = match request {
            Some(r) => r.value == rtcheck::kconfig::Value::Yes,
            None => from_base,
        };
        if rt_requested {
            return Ok(());
        }
        let why = match request {
            Some(r) => format!(
                "the last request is `{}` at {}",
                r.value.config_line(&r.symbol),
                r.origin
            ),
            None => "no fragment sets it".to_string(),
        };
        Err(self.validator().error(
            "kernel.fragments",
            format!(
                "flavor is `rt` but CONFIG_PREEMPT_RT=y is not requested ({why}); add kernel-configs/rt.config"
            ),
        ))
    }

    /// The fragments as `(name as written in the recipe, resolved path)`.
    pub fn fragment_names(&self) -> impl Iterator<Item = (&str, &Path)> {
        self.raw
            .kernel
            .fragments
            .iter()
            .map(String::as_str)
            .zip(self.kernel.fragments.iter().map(PathBuf::as_path))
    }

    /// The build timestamp: `$SOURCE_DATE_EPOCH`, else the recipe's, else 0.
    pub fn source_date_epoch(&self) -> u64 {
        std::env::var("SOURCE_DATE_EPOCH")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .or(self.source_date_epoch)
            .unwrap_or(0)
    }

    /// Serializes the schema form back to YAML.
    pub fn to_yaml(&self) -> String {
        yaml_serde::to_string(&self.raw).expect("recipe serializes")
    }
}

#[cfg(test)]
mod tests;
