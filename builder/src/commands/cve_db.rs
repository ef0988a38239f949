//! `imgbuild cve-db update | show`: the vulnerability data reports read
//! when no file is named, kept in the cache with its source, sha256 and date.

use std::path::PathBuf;
use std::time::SystemTime;

use anyhow::Result;
use clap::{Args, Subcommand};
use emberrtos_contract::error::BadInput;

use crate::cache::Cache;
use crate::cache::download::FetchOptions;
use crate::cve::store::{self, Current, DEFAULT_URL, Origin};
use crate::io::hashing::is_sha256_hex;
use crate::ui::Ui;

#[derive(Args, Debug)]
pub struct CveDbArgs {
    /// Cache directory [default: $IMGBUILD_CACHE, else ~/.cache/imgbuild].
    #[arg(long, global = true)]
    cache_dir: Option<PathBuf>,
    #[command(subcommand)]
    action: CveDbAction,
}

#[derive(Subcommand, Debug)]
enum CveDbAction {
    /// Fetch (or import) vulnerability data, check every record of it, and
    /// only then make it the data `cve`, `diff --cve` and `promote
    /// --max-severity` read: the Debian security tracker's JSON, or
    /// osv.dev's zip of Debian OSV records.
    Update {
        /// An https:// URL (TLS authenticates it), an http:// URL with
        /// --sha256, or a file.
        #[arg(long, value_name = "URL|FILE", default_value = DEFAULT_URL)]
        from: String,
        /// Keep the data only if its sha256 is HEX.
        #[arg(long, value_name = "HEX")]
        sha256: Option<String>,
    },
    /// The data the cache holds: where it came from, its date and sha256.
    Show,
}

/// The cache's data as shown: the note and its age.
#[derive(serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct Shown {
    #[serde(flatten)]
    pub current: Current,
    pub age_days: u64,
}

pub fn run(args: CveDbArgs, ui: &Ui) -> Result<Shown> {
    let cache = Cache::open(&args.cache_dir.unwrap_or_else(Cache::default_root))?;
    let current = match args.action {
        CveDbAction::Update { from, sha256 } => {
            let origin = Origin::parse(&from).map_err(|e| BadInput::new("--from", e))?;
            if let Some(bad) = sha256.as_deref().filter(|hex| !is_sha256_hex(hex)) {
                return Err(BadInput::new("--sha256", format!("{bad:?} is not 64 hex digits")).into());
            }
            let sha256 = sha256.map(|hex| hex.to_ascii_lowercase());
            if matches!(&origin, Origin::Url(url) if !url.starts_with("https://")) && sha256.is_none() {
                let message = format!(
                    "{from}: an http:// URL needs --sha256: only TLS or a pinned hash authenticates data"
                );
                return Err(BadInput::new("--from", message).into());
            }
            store::update(&cache, &origin, sha256.as_deref(), &FetchOptions::default(), ui)?
        }
        CveDbAction::Show => store::current(&cache)?,
    };
    let date = current.date().unwrap_or(SystemTime::UNIX_EPOCH);
    Ok(Shown {
        age_days: crate::cve::age_days(date, SystemTime::now()),
        current,
    })
}

/// The data as text; every field is shown cleaned, as a note in the cache
/// may have been written by anyone who can write there.
pub fn render(shown: &Shown) -> String {
    use crate::io::clean;
    let current = &shown.current;
    format!(
        "source   {}\nformat   {} ({})\nsha256   {}\nbytes    {}\ndated    {} ({} days ago)\nupdated  {}\n",
        clean(&current.source),
        clean(&current.format),
        clean(&current.summary),
        current.sha256,
        current.bytes,
        clean(&current.date),
        shown.age_days,
        clean(&current.updated)
    )
}
