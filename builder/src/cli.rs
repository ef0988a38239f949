//! Command-line interface (the CLI contract of DESIGN.md).

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context as _, Result};
use clap::{Parser, Subcommand};

use crate::cache::Cache;
use crate::commands::publish;
use crate::error::{exit, exit_code};
use crate::ostree;
use crate::pipeline::{self, PipelineReport};
use crate::recipe::Recipe;
use crate::stage::Stage;
use crate::stages::boot::{self, Accel, BootOptions};
use crate::stages::commit;
use crate::stages::fetch::FetchOptions;
use crate::stages::verify;
use crate::ui::Ui;
use rtcheck::evidence::id;

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
    Recipe {
        /// The recipe file (YAML).
        file: PathBuf,
        /// Stop after this stage.
        #[arg(long, value_enum, default_value = "tag")]
        until: Stage,
        /// Work directory for stage outputs.
        #[arg(long, default_value = "build")]
        work_dir: PathBuf,
        /// Cache directory [default: $IMGBUILD_CACHE, else ~/.cache/imgbuild].
        #[arg(long)]
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
    },
    /// Check a kernel image (bzImage) for PREEMPT_RT and print the evidence.
    VerifyKernel {
        image: PathBuf,
        /// The .config the image was built from.
        #[arg(long)]
        config: Option<PathBuf>,
        /// A modules directory (lib/modules/<release>) whose vermagic to check.
        #[arg(long)]
        modules: Option<PathBuf>,
    },
    /// Boot an ISO in QEMU and check the running kernel over the serial console.
    Boot {
        iso: PathBuf,
        #[arg(long, value_enum, default_value = "tcg")]
        accel: Accel,
        /// Seconds to wait for the guest.
        #[arg(long, default_value_t = 600)]
        timeout: u64,
        /// Run jitter for this many seconds and print its report.
        #[arg(long)]
        jitter: Option<u64>,
        /// Boot through UEFI firmware (OVMF) instead of BIOS.
        #[arg(long)]
        uefi: bool,
    },
    /// Publish tagged commits to an ostree remote.
    Publish {
        #[arg(long)]
        repo: PathBuf,
        /// A directory or file:// URL (the remote's web root).
        #[arg(long)]
        to: String,
        /// Refs to publish [default: every ref of the repo].
        #[arg(long = "ref")]
        refs: Vec<String>,
        /// GPG key to sign the summary with.
        #[arg(long)]
        gpg_key: Option<String>,
        #[arg(long, requires = "gpg_key")]
        gpg_homedir: Option<PathBuf>,
        /// Static deltas from this many previously published commits per ref.
        #[arg(long, default_value_t = 2)]
        deltas: usize,
        /// Publish even when the version is not newer than the remote's.
        #[arg(long)]
        force: bool,
    },
    /// Show a commit's metadata, including the RT evidence.
    Inspect {
        #[arg(long)]
        repo: PathBuf,
        #[arg(value_name = "REF")]
        ref_name: String,
    },
}

/// Parses the command line, runs it and maps the result to the exit code.
pub fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { exit::USAGE } else { exit::OK });
        }
    };
    match run(cli) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(exit_code(&e))
        }
    }
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
        Command::Recipe {
            file,
            until,
            work_dir,
            cache_dir,
            accel,
            boot_jitter,
            boot_timeout,
            uefi,
        } => {
            let recipe = Recipe::load(&file)?;
            let cache_root = cache_dir.unwrap_or_else(Cache::default_root);
            let cache = Cache::open(&cache_root)?;
            std::fs::create_dir_all(&work_dir)
                .with_context(|| format!("creating work dir {}", work_dir.display()))?;
            let work_dir = work_dir.canonicalize()?;
            let ctx = pipeline::Context {
                recipe,
                work_dir,
                cache,
                ui,
                fetch_options: FetchOptions::default(),
                boot: BootOptions {
                    accel,
                    timeout: Duration::from_secs(boot_timeout),
                    jitter: (boot_jitter > 0).then_some(boot_jitter),
                    uefi,
                },
            };
            let mut report = PipelineReport::default();
            let result = pipeline::run(&ctx, until, &mut report);
            if cli.json {
                let mut doc = serde_json::to_value(&report)?;
                doc["ok"] = serde_json::Value::Bool(result.is_ok());
                if let Err(e) = &result {
                    doc["error"] = serde_json::Value::String(format!("{e:#}"));
                    doc["exit-code"] = exit_code(e).into();
                }
                print_json(&doc)?;
            }
            result?;
            ctx.ui
                .step("done", format!("pipeline finished after stage `{until}`"));
            Ok(exit::OK)
        }
        Command::VerifyKernel {
            image,
            config,
            modules,
        } => {
            let evidence = verify::check_artifacts(&image, config.as_deref(), modules.as_deref())?;
            let mut required = vec![id::HEADER, id::UTS_VERSION];
            if config.is_some() {
                required.push(id::BUILD_CONFIG);
            }
            let verdict = verify::gate("verify-kernel", &evidence, &required);
            if cli.json {
                let mut doc = serde_json::to_value(&evidence)?;
                doc["preempt-rt"] = verdict.is_ok().into();
                doc["image"] = image.display().to_string().into();
                print_json(&doc)?;
            } else {
                print!("{}", verify::render(&evidence));
            }
            verdict?;
            Ok(exit::OK)
        }
        Command::Boot {
            iso,
            accel,
            timeout,
            jitter,
            uefi,
        } => {
            let options = BootOptions {
                accel,
                timeout: Duration::from_secs(timeout),
                jitter,
                uefi,
            };
            let sha = crate::io::hashing::sha256_file(&iso, None)?;
            let log_dir = tempfile::Builder::new()
                .prefix("imgbuild-boot-")
                .tempdir()?
                .keep();
            let out = boot::boot(&iso, &sha, &options, &log_dir.join("console.log"), &ui)?;
            if cli.json {
                print_json(&serde_json::to_value(&out)?)?;
            } else {
                print!("{}", boot::render(&out));
            }
            verify::gate("boot", &out.evidence, &[id::BOOT_UNAME, id::BOOT_CONFIG])?;
            Ok(exit::OK)
        }
        Command::Publish {
            repo,
            to,
            refs,
            gpg_key,
            gpg_homedir,
            deltas,
            force,
        } => {
            let transport = publish::LocalDir::parse(&to)?;
            let options = publish::PublishOptions {
                refs,
                gpg_key: gpg_key.as_deref(),
                gpg_homedir: gpg_homedir.as_deref(),
                deltas,
                force,
                after_phase: &|_| Ok(()),
            };
            let report = publish::publish(&repo, &transport, &options, &ui)?;
            if cli.json {
                print_json(&serde_json::to_value(&report)?)?;
            } else if report.no_op {
                println!(
                    "nothing to publish: {} already serves these commits",
                    report.destination
                );
            } else {
                for r in &report.refs {
                    println!(
                        "{} -> {} ({}), deltas: {}",
                        r.ref_name,
                        r.commit,
                        r.version,
                        r.deltas.join(", ")
                    );
                }
            }
            Ok(exit::OK)
        }
        Command::Inspect { repo, ref_name } => {
            let repository = ostree::open(&repo)?;
            let info = ostree::read_commit(&repository, &ref_name)?;
            let evidence = commit::full_evidence(&info).ok();
            if cli.json {
                let mut doc = serde_json::to_value(&info)?;
                doc["evidence"] = serde_json::to_value(&evidence)?;
                print_json(&doc)?;
            } else {
                print!("{}", render_commit(&info, evidence.as_ref()));
            }
            Ok(exit::OK)
        }
    }
}
