//! The recipe: schema, validation and path resolution.
//!
//! [`Recipe::parse`] is pure (text in, recipe or error out; paths are resolved
//! lexically against the recipe's directory). [`Recipe::load`] adds the checks
//! that need the filesystem: referenced files exist, and an `rt` recipe's
//! fragments really request `CONFIG_PREEMPT_RT=y`.

mod locate;

use std::fmt;
use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::io::hashing::{is_sha256_hex, sha256_hex};
pub use locate::{Locations, Position, locate};

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
        write!(f, "{}", self.file.display())?;
        if let Some(p) = self.position {
            write!(f, ":{}:{}", p.line, p.column)?;
        }
        if self.field.is_empty() {
            write!(f, ": {}", self.message)
        } else {
            write!(f, ": {}: {}", self.field, self.message)
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Flavor {
    /// PREEMPT_RT kernel: the RT gate applies.
    Rt,
    /// General-purpose kernel.
    Standard,
}

impl fmt::Display for Flavor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Flavor::Rt => "rt",
            Flavor::Standard => "standard",
        })
    }
}

// ---- The YAML schema, exactly as written (round-trips through serde). ----

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct RawRecipe {
    pub name: String,
    pub version: String,
    pub flavor: Flavor,
    /// Timestamp for reproducible builds; `$SOURCE_DATE_EPOCH` overrides it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_date_epoch: Option<u64>,
    pub kernel: RawKernel,
    pub rootfs: RawRootfs,
    pub ostree: RawOstree,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub live: Option<RawLive>,
}

/// Where an input tarball comes from: exactly one of `url`, `path`, `debian`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct RawSource {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub debian: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct RawKernel {
    pub source: RawSource,
    /// A make target (`x86_64_defconfig`, `tinyconfig`) or a path to a full `.config`.
    pub base: String,
    #[serde(default)]
    pub fragments: Vec<String>,
    /// Symbols a fragment may request but Kconfig may drop without failing the build.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_dropped: Vec<String>,
    #[serde(default)]
    pub cmdline: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct RawRootfs {
    pub base: RawRootfsBase,
    #[serde(default)]
    pub overlays: Vec<String>,
}

/// `{ debian: <suite>, variant, packages, mirror }` for mmdebstrap, or a
/// rootfs tarball as `{ path | url, sha256 }`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct RawRootfsBase {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub debian: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub packages: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mirror: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct RawOstree {
    /// Archive repo; defaults to `<work-dir>/repo`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repo: Option<String>,
    #[serde(rename = "ref")]
    pub ref_name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpg_key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpg_homedir: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct RawLive {
    /// Output ISO; defaults to `<work-dir>/<name>-<flavor>-live.iso`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iso: Option<String>,
    #[serde(default)]
    pub ssh_authorized_keys: Vec<String>,
    /// Extra Debian packages for the live rootfs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub packages: Vec<String>,
    /// The live image's files: `init`, motd, banner, and a `packages` list
    /// (usually `../live-image/rootfs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rootfs: Option<String>,
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
        packages: Vec<String>,
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
    pub ssh_authorized_keys: Vec<String>,
    pub packages: Vec<String>,
    pub rootfs: Option<PathBuf>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Recipe {
    /// The recipe file as given.
    pub file: PathBuf,
    /// Directory that relative paths resolve against.
    pub dir: PathBuf,
    /// sha256 of the recipe text.
    pub sha256: String,
    pub name: String,
    pub version: String,
    pub flavor: Flavor,
    pub source_date_epoch: Option<u64>,
    pub kernel: Kernel,
    pub rootfs: Rootfs,
    pub ostree: Ostree,
    pub live: Live,
    #[serde(skip)]
    pub raw: RawRecipe,
    #[serde(skip)]
    locations: Locations,
}

/// Collects validation errors against one recipe file.
struct Validator<'a> {
    file: &'a Path,
    dir: &'a Path,
    locations: &'a Locations,
}

impl Validator<'_> {
    fn error(&self, field: &str, message: impl Into<String>) -> RecipeError {
        RecipeError {
            file: self.file.to_path_buf(),
            field: field.to_string(),
            position: self.locations.find(field),
            message: message.into(),
        }
    }

    fn resolve(&self, field: &str, path: &str) -> Result<PathBuf, RecipeError> {
        if path.trim().is_empty() {
            return Err(self.error(field, "path is empty"));
        }
        Ok(normalize(&self.dir.join(path)))
    }

    fn sha256(&self, field: &str, value: &str) -> Result<String, RecipeError> {
        if is_sha256_hex(value) {
            Ok(value.to_ascii_lowercase())
        } else {
            Err(self.error(
                field,
                format!(
                    "sha256 must be 64 hex digits, got {:?} ({} characters)",
                    value,
                    value.len()
                ),
            ))
        }
    }

    fn source(&self, field: &str, raw: &RawSource, debian_kind: &str) -> Result<Source, RecipeError> {
        let given: Vec<&str> = [("url", &raw.url), ("path", &raw.path), ("debian", &raw.debian)]
            .into_iter()
            .filter(|(_, v)| v.is_some())
            .map(|(k, _)| k)
            .collect();
        if given.len() != 1 {
            return Err(self.error(
                field,
                format!(
                    "give exactly one of `url` (with `sha256`), `path` or `debian`; found {}",
                    if given.is_empty() {
                        "none".to_string()
                    } else {
                        given.join(" and ")
                    }
                ),
            ));
        }
        let sha_field = format!("{field}.sha256");
        if let Some(url) = &raw.url {
            let url_field = format!("{field}.url");
            if !(url.starts_with("https://") || url.starts_with("http://")) {
                return Err(self.error(
                    &url_field,
                    format!("url must be http:// or https://, got {url:?}"),
                ));
            }
            let sha = raw.sha256.as_deref().ok_or_else(|| {
                self.error(
                    &url_field,
                    "a url needs a `sha256` pin: downloads are verified and cached by content",
                )
            })?;
            return Ok(Source::Url {
                url: url.clone(),
                sha256: self.sha256(&sha_field, sha)?,
            });
        }
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
        let name = raw.debian.as_deref().unwrap_or_default();
        if raw.sha256.is_some() {
            return Err(self.error(
                &sha_field,
                "`sha256` applies to `url` and `path` sources, not `debian`",
            ));
        }
        let valid = match debian_kind {
            "package" => is_linux_source_package(name),
            _ => {
                !name.is_empty()
                    && name
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            }
        };
        if !valid {
            let expected = if debian_kind == "package" {
                "a Debian kernel source package like `linux-source-6.12`"
            } else {
                "a Debian suite like `bookworm`"
            };
            return Err(self.error(
                &format!("{field}.debian"),
                format!("expected {expected}, got {name:?}"),
            ));
        }
        Ok(Source::Debian {
            package: name.to_string(),
        })
    }
}

fn is_linux_source_package(name: &str) -> bool {
    name.strip_prefix("linux-source-").is_some_and(|v| {
        let mut parts = v.split('.');
        let major = parts
            .next()
            .is_some_and(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
        let minor = parts
            .next()
            .is_some_and(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
        major && minor && parts.next().is_none()
    })
}

fn is_make_config_target(base: &str) -> bool {
    base.ends_with("config")
        && !base.contains('/')
        && !base.contains('.')
        && base
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
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

fn is_valid_ref(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with('/')
        && !name.ends_with('/')
        && name.split('/').all(|part| {
            !part.is_empty()
                && part != "."
                && part != ".."
                && part
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
        })
}

fn is_ssh_public_key(line: &str) -> bool {
    let mut words = line.split_whitespace();
    let kind = words.next().unwrap_or_default();
    let blob = words.next().unwrap_or_default();
    (kind.starts_with("ssh-") || kind.starts_with("ecdsa-") || kind.starts_with("sk-"))
        && blob.len() >= 16
        && blob
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"+/=".contains(&b))
}

/// Splits a yaml_serde message `path: message at line L column C`.
fn split_yaml_error(message: &str) -> (String, String) {
    let message = match message.rfind(" at line ") {
        Some(at) => &message[..at],
        None => message,
    };
    match message.split_once(": ") {
        Some((field, rest))
            if !field.is_empty()
                && field
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.[]".contains(&b)) =>
        {
            (field.to_string(), rest.to_string())
        }
        _ => (String::new(), message.to_string()),
    }
}

impl Recipe {
    /// Parses and validates recipe text. Pure: touches no files. `file` names
    /// the recipe in errors and anchors relative paths.
    pub fn parse(text: &str, file: &Path) -> Result<Recipe, RecipeError> {
        let raw: RawRecipe = yaml_serde::from_str(text).map_err(|e| {
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
        })?;
        let locations = locate(text);
        let dir = normalize(&file.parent().map(Path::to_path_buf).unwrap_or_default());
        let v = Validator {
            file,
            dir: &dir,
            locations: &locations,
        };

        let name_ok = raw.name.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
            && raw
                .name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-_.".contains(&b));
        if !name_ok {
            return Err(v.error(
                "name",
                "use lowercase letters, digits, `-`, `_` and `.`, starting with a letter or digit",
            ));
        }
        if raw.version.is_empty() || raw.version.chars().any(char::is_whitespace) {
            return Err(v.error("version", "version must be non-empty and contain no spaces"));
        }

        let kernel = {
            let rk = &raw.kernel;
            let source = v.source("kernel.source", &rk.source, "package")?;
            let base = if is_make_config_target(&rk.base) {
                ConfigBase::Target(rk.base.clone())
            } else {
                ConfigBase::File(v.resolve("kernel.base", &rk.base)?)
            };
            let fragments = rk
                .fragments
                .iter()
                .enumerate()
                .map(|(i, f)| v.resolve(&format!("kernel.fragments[{i}]"), f))
                .collect::<Result<Vec<_>, _>>()?;
            let mut allow_dropped = Vec::new();
            for (i, symbol) in rk.allow_dropped.iter().enumerate() {
                let field = format!("kernel.allow-dropped[{i}]");
                let full = if symbol.starts_with("CONFIG_") {
                    symbol.clone()
                } else {
                    format!("CONFIG_{symbol}")
                };
                if !full[7..].bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') || full.len() == 7 {
                    return Err(v.error(&field, format!("{symbol:?} is not a Kconfig symbol")));
                }
                if raw.flavor == Flavor::Rt && full == "CONFIG_PREEMPT_RT" {
                    return Err(v.error(
                        &field,
                        "PREEMPT_RT can never be allowed to drop in an `rt` recipe",
                    ));
                }
                allow_dropped.push(full);
            }
            for (i, arg) in rk.cmdline.iter().enumerate() {
                if arg.is_empty() || arg.chars().any(char::is_whitespace) {
                    return Err(v.error(
                        &format!("kernel.cmdline[{i}]"),
                        format!("{arg:?}: each kernel argument is one word; put separate arguments in separate items"),
                    ));
                }
            }
            Kernel {
                source,
                base,
                fragments,
                allow_dropped,
                cmdline: rk.cmdline.clone(),
            }
        };

        let rootfs = {
            let rb = &raw.rootfs.base;
            let base = if let Some(suite) = &rb.debian {
                if rb.url.is_some() || rb.path.is_some() || rb.sha256.is_some() {
                    return Err(v.error(
                        "rootfs.base",
                        "give either `debian` (mmdebstrap) or a tarball `path`/`url`, not both",
                    ));
                }
                v.source(
                    "rootfs.base",
                    &RawSource {
                        debian: Some(suite.clone()),
                        ..Default::default()
                    },
                    "suite",
                )?;
                let variant = rb.variant.clone().unwrap_or_else(|| "minbase".to_string());
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
                if !VARIANTS.contains(&variant.as_str()) {
                    return Err(v.error(
                        "rootfs.base.variant",
                        format!(
                            "unknown mmdebstrap variant {variant:?}; one of {}",
                            VARIANTS.join(", ")
                        ),
                    ));
                }
                RootfsBase::Debian {
                    suite: suite.clone(),
                    variant,
                    packages: rb.packages.clone(),
                    mirror: rb.mirror.clone(),
                }
            } else {
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
                RootfsBase::Tarball(v.source("rootfs.base", &raw_source, "suite")?)
            };
            let overlays = raw
                .rootfs
                .overlays
                .iter()
                .enumerate()
                .map(|(i, o)| v.resolve(&format!("rootfs.overlays[{i}]"), o))
                .collect::<Result<Vec<_>, _>>()?;
            Rootfs { base, overlays }
        };

        let ostree = {
            let ro = &raw.ostree;
            if !is_valid_ref(&ro.ref_name) {
                return Err(v.error(
                    "ostree.ref",
                    format!(
                        "{:?} is not a valid ostree ref (letters, digits, `._-`, parts separated by `/`)",
                        ro.ref_name
                    ),
                ));
            }
            if ro.gpg_homedir.is_some() && ro.gpg_key.is_none() {
                return Err(v.error("ostree.gpg-homedir", "`gpg-homedir` needs `gpg-key`"));
            }
            Ostree {
                repo: ro
                    .repo
                    .as_deref()
                    .map(|r| v.resolve("ostree.repo", r))
                    .transpose()?,
                ref_name: ro.ref_name.clone(),
                gpg_key: ro.gpg_key.clone(),
                gpg_homedir: ro
                    .gpg_homedir
                    .as_deref()
                    .map(|h| v.resolve("ostree.gpg-homedir", h))
                    .transpose()?,
            }
        };

        let live = match &raw.live {
            None => Live::default(),
            Some(rl) => {
                for (i, key) in rl.ssh_authorized_keys.iter().enumerate() {
                    if !is_ssh_public_key(key) {
                        return Err(v.error(
                            &format!("live.ssh-authorized-keys[{i}]"),
                            "not an SSH public key line (`ssh-ed25519 AAAA... comment`)",
                        ));
                    }
                }
                Live {
                    iso: rl.iso.as_deref().map(|p| v.resolve("live.iso", p)).transpose()?,
                    ssh_authorized_keys: rl.ssh_authorized_keys.clone(),
                    packages: rl.packages.clone(),
                    rootfs: rl
                        .rootfs
                        .as_deref()
                        .map(|p| v.resolve("live.rootfs", p))
                        .transpose()?,
                }
            }
        };

        Ok(Recipe {
            file: file.to_path_buf(),
            sha256: sha256_hex(text),
            name: raw.name.clone(),
            version: raw.version.clone(),
            flavor: raw.flavor,
            source_date_epoch: raw.source_date_epoch,
            kernel,
            rootfs,
            ostree,
            live,
            dir,
            raw,
            locations,
        })
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

    fn validator(&self) -> Validator<'_> {
        Validator {
            file: &self.file,
            dir: &self.dir,
            locations: &self.locations,
        }
    }

    /// Checks that every input file exists and that an `rt` recipe's fragments
    /// request `CONFIG_PREEMPT_RT=y`.
    pub fn check_inputs(&self) -> Result<(), RecipeError> {
        let v = self.validator();
        let must_be_file = |field: &str, path: &Path| {
            if path.is_file() {
                Ok(())
            } else {
                Err(v.error(field, format!("file not found: {}", path.display())))
            }
        };
        let must_be_dir = |field: &str, path: &Path| {
            if path.is_dir() {
                Ok(())
            } else {
                Err(v.error(field, format!("directory not found: {}", path.display())))
            }
        };
        if let Source::Path { path, .. } = &self.kernel.source {
            must_be_file("kernel.source.path", path)?;
        }
        if let ConfigBase::File(path) = &self.kernel.base {
            must_be_file("kernel.base", path)?;
        }
        let mut fragments = Vec::new();
        for (i, path) in self.kernel.fragments.iter().enumerate() {
            let field = format!("kernel.fragments[{i}]");
            must_be_file(&field, path)?;
            let text = std::fs::read_to_string(path)
                .map_err(|e| v.error(&field, format!("cannot read {}: {e}", path.display())))?;
            fragments.push((self.raw.kernel.fragments[i].clone(), text));
        }
        let merged =
            rtcheck::kconfig::merge_fragments(fragments.iter().map(|(n, t)| (n.as_str(), t.as_str())))
                .map_err(|e| {
                    let index = fragments.iter().position(|(n, _)| *n == e.file).unwrap_or(0);
                    v.error(&format!("kernel.fragments[{index}]"), e.to_string())
                })?;
        if self.flavor == Flavor::Rt {
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
            if !rt_requested {
                let why = match request {
                    Some(r) => format!(
                        "the last request is `{}` at {}",
                        r.value.config_line(&r.symbol),
                        r.origin
                    ),
                    None => "no fragment sets it".to_string(),
                };
                return Err(v.error(
                    "kernel.fragments",
                    format!("flavor is `rt` but CONFIG_PREEMPT_RT=y is not requested ({why}); add kernel-configs/rt.config"),
                ));
            }
        }
        if let RootfsBase::Tarball(Source::Path { path, .. }) = &self.rootfs.base {
            must_be_file("rootfs.base.path", path)?;
        }
        for (i, path) in self.rootfs.overlays.iter().enumerate() {
            must_be_dir(&format!("rootfs.overlays[{i}]"), path)?;
        }
        if let Some(home) = &self.ostree.gpg_homedir {
            must_be_dir("ostree.gpg-homedir", home)?;
        }
        if let Some(live_rootfs) = &self.live.rootfs {
            must_be_dir("live.rootfs", live_rootfs)?;
            if !live_rootfs.join("init").is_file() {
                return Err(v.error("live.rootfs", format!("{} has no `init`", live_rootfs.display())));
            }
        }
        Ok(())
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
