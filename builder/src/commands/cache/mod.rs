//! `imgbuild cache ls | gc | push`: the local artifact cache, and uploading
//! it to a shared remote that `--cache-remote` reads.

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use anyhow::Result;
use clap::{Args, Subcommand};

use crate::cache::Cache;
use crate::cache::admin::{self, LocalEntry};

mod push;
use crate::ui::Ui;
use emberrtos_contract::error::BadInput;

#[derive(Args, Debug)]
pub struct CacheArgs {
    /// Cache directory [default: $IMGBUILD_CACHE, else ~/.cache/imgbuild].
    #[arg(long, global = true)]
    cache_dir: Option<PathBuf>,
    #[command(subcommand)]
    action: CacheAction,
}

#[derive(Subcommand, Debug)]
enum CacheAction {
    /// List the cache's entries, oldest first, with size and age.
    Ls,
    /// Remove entries older than --older-than, then the oldest until the
    /// cache fits in --max-size.
    Gc {
        /// An age such as 30d, 12h or 90min.
        #[arg(long, value_parser = parse_age)]
        older_than: Option<Duration>,
        /// A size such as 20GiB or 500M.
        #[arg(long, value_parser = parse_bytes)]
        max_size: Option<u64>,
        /// Print what would go, remove nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Upload the cached kernels and rootfs bases to DEST (a directory,
    /// file:// or ssh://user@host[:port]/path), which any static HTTP server
    /// can then serve to `--cache-remote`, each entry signed with --gpg-key.
    Push {
        dest: String,
        /// Sign each entry with this GPG key (readers pin its public key
        /// with --cache-remote-key). One of --gpg-key and --unsigned is
        /// required.
        #[arg(long, value_name = "KEYID", required_unless_present = "unsigned")]
        gpg_key: Option<String>,
        /// Push entries unsigned: only `--cache-remote-insecure` readers
        /// take them, and no rt ref is tagged from what they build.
        #[arg(long, conflicts_with = "gpg_key")]
        unsigned: bool,
        /// The GnuPG home holding that key [default: $GNUPGHOME, else ~/.gnupg].
        #[arg(long, value_name = "DIR", requires = "gpg_key")]
        gpg_homedir: Option<PathBuf>,
    },
}

fn parse_age(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text).map_err(|e| format!("{e} (an age such as 30d, 12h or 90min)"))
}

fn parse_bytes(text: &str) -> Result<u64, String> {
    parse_size::Config::new()
        .with_binary()
        .parse_size(text)
        .map_err(|e| format!("{e} (a size such as 20GiB or 500M)"))
}

pub fn run(args: CacheArgs, ui: &Ui, json: bool) -> Result<serde_json::Value> {
    let cache = Cache::open(&args.cache_dir.unwrap_or_else(Cache::default_root))?;
    match args.action {
        CacheAction::Ls => {
            let entries = admin::list(&cache, SystemTime::now())?;
            if !json {
                print!("{}", render(&entries));
            }
            Ok(serde_json::json!({ "cache": cache.root(), "entries": entries }))
        }
        CacheAction::Gc {
            older_than,
            max_size,
            dry_run,
        } => gc(&cache, older_than, max_size, dry_run, ui, json),
        CacheAction::Push {
            dest,
            gpg_key,
            gpg_homedir,
            unsigned: _,
        } => {
            let transport =
                crate::transport::open(&dest).map_err(|e| BadInput::new("DEST", format!("{e:#}")))?;
            let signer = signer(gpg_key.as_deref(), gpg_homedir, ui)?;
            let report = push::push(&cache, transport.as_ref(), signer.as_ref(), ui)?;
            if !json {
                println!(
                    "pushed {} entr{} ({} bytes) to {}; {} already there",
                    report.pushed.len(),
                    if report.pushed.len() == 1 { "y" } else { "ies" },
                    report.bytes,
                    report.destination,
                    report.present
                );
                for skipped in &report.skipped {
                    println!("not pushed: {skipped}");
                }
            }
            Ok(serde_json::to_value(&report)?)
        }
    }
}

/// The signer `--gpg-key` names; without one (`--unsigned`), a warning.
fn signer(gpg_key: Option<&str>, gpg_homedir: Option<PathBuf>, ui: &Ui) -> Result<Option<push::Signer>> {
    let Some(key) = gpg_key else {
        ui.warn(
            "pushing unsigned entries (--unsigned): readers refuse them unless they pass --cache-remote-insecure",
        );
        return Ok(None);
    };
    push::Signer::new(key, gpg_homedir)
        .map(Some)
        .map_err(|e| BadInput::new("--gpg-key", format!("{e:#}")).into())
}

fn gc(
    cache: &Cache,
    older_than: Option<Duration>,
    max_size: Option<u64>,
    dry_run: bool,
    ui: &Ui,
    json: bool,
) -> Result<serde_json::Value> {
    if older_than.is_none() && max_size.is_none() {
        return Err(BadInput::new("--older-than/--max-size", "name at least one of them").into());
    }
    let _hold = cache.hold_for_gc()?;
    let entries = admin::list(cache, SystemTime::now())?;
    let doomed: Vec<&LocalEntry> = admin::plan_gc(&entries, older_than, max_size)
        .into_iter()
        .map(|i| &entries[i])
        .collect();
    let freed: u64 = doomed.iter().map(|e| e.bytes).sum();
    for entry in &doomed {
        if !dry_run {
            admin::remove_entry(cache, entry)?;
        }
        ui.note(format!(
            "{} {}/{} ({} bytes, {} old)",
            if dry_run { "would remove" } else { "removed" },
            entry.area,
            entry.name,
            entry.bytes,
            humantime::format_duration(Duration::from_secs(entry.age_seconds))
        ));
    }
    if !json {
        println!(
            "{} {} entries, {freed} bytes; {} entries kept",
            if dry_run { "would remove" } else { "removed" },
            doomed.len(),
            entries.len() - doomed.len()
        );
    }
    Ok(serde_json::json!({ "removed": doomed, "bytes": freed, "dry-run": dry_run }))
}

/// The human form of `cache ls`.
fn render(entries: &[LocalEntry]) -> String {
    let mut out = String::new();
    for e in entries {
        let age = humantime::format_duration(Duration::from_secs(e.age_seconds)).to_string();
        let age = age.split(' ').take(2).collect::<Vec<_>>().join(" ");
        out.push_str(&format!("{:<13} {:<70} {:>14} {age}\n", e.area, e.name, e.bytes));
    }
    let total: u64 = entries.iter().map(|e| e.bytes).sum();
    out.push_str(&format!("{} entries, {total} bytes\n", entries.len()));
    out
}
