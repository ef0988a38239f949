//! Man pages and shell completions generated from a clap command, so that
//! what the packages install is the command line the binary parses.
//!
//! Layout under the output directory:
//! `man/<name>.1` (and `man/<name>-<subcommand>[-<subcommand>…].1` for each
//! visible subcommand), `completions/bash/<name>`, `completions/zsh/_<name>`,
//! `completions/fish/<name>.fish`: the places Debian's bash-completion,
//! zsh and fish look in, relative to `/usr/share`.

use std::io;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Command;
use clap_complete::Shell;

/// The shells completions are written for, with each one's file path under
/// the output directory for a program called `name`.
pub fn completion_paths(name: &str) -> [(Shell, PathBuf); 3] {
    [
        (Shell::Bash, PathBuf::from(format!("completions/bash/{name}"))),
        (Shell::Zsh, PathBuf::from(format!("completions/zsh/_{name}"))),
        (
            Shell::Fish,
            PathBuf::from(format!("completions/fish/{name}.fish")),
        ),
    ]
}

/// The `main` of a docs generator binary (`imgbuild-docs OUT_DIR`,
/// `jitter-docs OUT_DIR`): writes everything under OUT_DIR and lists it.
pub fn generator_main(command: Command) -> ExitCode {
    let program = command.get_name().to_string();
    let mut args = std::env::args_os().skip(1);
    let (Some(out_dir), None) = (args.next(), args.next()) else {
        eprintln!("usage: {program}-docs OUT_DIR");
        return ExitCode::from(2);
    };
    match write_all(command, Path::new(&out_dir)) {
        Ok(written) => {
            for path in written {
                println!("{}", Path::new(&out_dir).join(path).display());
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!(
                "{program}-docs: writing into {}: {e}",
                Path::new(&out_dir).display()
            );
            ExitCode::FAILURE
        }
    }
}

/// Writes the man pages and completions of `command` under `out_dir` and
/// returns the files written, relative to `out_dir`, man pages first.
pub fn write_all(mut command: Command, out_dir: &Path) -> io::Result<Vec<PathBuf>> {
    command.build();
    let name = command.get_name().to_string();
    let mut written = Vec::new();
    for (page_name, page) in man_pages(&command, &name) {
        let path = PathBuf::from(format!("man/{page_name}.1"));
        write_file(&out_dir.join(&path), &page)?;
        written.push(path);
    }
    for (shell, path) in completion_paths(&name) {
        let mut script = Vec::new();
        clap_complete::generate(shell, &mut command, &name, &mut script);
        write_file(&out_dir.join(&path), &script)?;
        written.push(path);
    }
    Ok(written)
}

/// `(page name, roff)` for `command` and, recursively, each subcommand a
/// user can type (not hidden ones, not clap's `help`). Completions, by
/// clap_complete, do offer hidden subcommands: binaries keep none.
pub fn man_pages(command: &Command, page_name: &str) -> Vec<(String, Vec<u8>)> {
    let mut page = Vec::new();
    let titled = command.clone().name(page_name.to_string());
    clap_mangen::Man::new(titled)
        .render(&mut page)
        .expect("rendering into memory cannot fail");
    let mut pages = vec![(page_name.to_string(), page)];
    for sub in visible_subcommands(command) {
        pages.extend(man_pages(sub, &format!("{page_name}-{}", sub.get_name())));
    }
    pages
}

/// The subcommands of `command` a user can type: not hidden, not `help`.
pub fn visible_subcommands(command: &Command) -> impl Iterator<Item = &Command> {
    command
        .get_subcommands()
        .filter(|sub| !sub.is_hide_set() && sub.get_name() != "help")
}

/// Writes `bytes` to `path` through a temporary file beside it, so a path
/// that exists is complete.
fn write_file(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let dir = path.parent().expect("output paths have a directory");
    std::fs::create_dir_all(dir)?;
    let partial = dir.join(format!(
        ".{}.partial",
        path.file_name().expect("a file name").to_string_lossy()
    ));
    std::fs::write(&partial, bytes)?;
    std::fs::rename(&partial, path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{Arg, ArgAction};

    fn example() -> Command {
        Command::new("tool")
            .version("1.0")
            .about("An example")
            .arg(Arg::new("verbose").long("verbose").action(ArgAction::SetTrue))
            .subcommand(
                Command::new("cache")
                    .about("The cache")
                    .subcommand(Command::new("prune").about("Prune it")),
            )
            .subcommand(Command::new("secret").hide(true))
    }

    #[test]
    fn one_page_per_visible_subcommand_and_three_completions() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("docs");
        let written = write_all(example(), &dir).unwrap();
        let names: Vec<String> = written.iter().map(|p| p.display().to_string()).collect();
        assert_eq!(
            names,
            [
                "man/tool.1",
                "man/tool-cache.1",
                "man/tool-cache-prune.1",
                "completions/bash/tool",
                "completions/zsh/_tool",
                "completions/fish/tool.fish",
            ]
        );
        let page = std::fs::read_to_string(dir.join("man/tool-cache-prune.1")).unwrap();
        assert!(page.starts_with(".ie"), "{page}");
        assert!(page.contains(".TH tool-cache-prune 1"), "{page}");
        assert!(page.contains("Prune it"), "{page}");
        let bash = std::fs::read_to_string(dir.join("completions/bash/tool")).unwrap();
        assert!(bash.contains("complete -F _tool"), "{bash}");
        assert!(bash.contains("--verbose"), "{bash}");
    }
}
