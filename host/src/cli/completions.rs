//! `carteiro completions SHELL` and the hidden `carteiro man DIR`: shell completions and man
//! pages generated from the command definition itself, so they cannot drift from it. The
//! Debian package installs both (`scripts/package.sh`).

use clap::CommandFactory;
use std::path::PathBuf;

/// `carteiro completions ...`
#[derive(Debug, clap::Args)]
pub struct CompletionsArgs {
    /// The shell to complete for; the script goes to stdout.
    #[arg(value_enum)]
    shell: clap_complete::Shell,
}

/// `carteiro man ...`
#[derive(Debug, clap::Args)]
pub struct ManArgs {
    /// Folder to write `carteiro.1` and one page per subcommand (`carteiro-dlq.1`, ...) into.
    dir: PathBuf,
}

pub fn completions(args: CompletionsArgs) -> anyhow::Result<i32> {
    let mut command = super::Cli::command();
    clap_complete::generate(args.shell, &mut command, "carteiro", &mut std::io::stdout());
    Ok(0)
}

pub fn man(args: ManArgs) -> anyhow::Result<i32> {
    std::fs::create_dir_all(&args.dir)?;
    clap_mangen::generate_to(super::Cli::command(), &args.dir)?;
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap_complete::Shell;

    #[test]
    fn completions_offer_every_visible_command() {
        for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
            let mut script = Vec::new();
            clap_complete::generate(
                shell,
                &mut super::super::Cli::command(),
                "carteiro",
                &mut script,
            );
            let script = String::from_utf8(script).expect("UTF-8");
            for command in [
                "run",
                "check",
                "dlq",
                "replay",
                "completions",
                "--no-environment",
            ] {
                assert!(script.contains(command), "{shell}: no `{command}`");
            }
        }
    }

    #[test]
    fn man_writes_a_page_per_command_and_none_for_itself() {
        let dir = tempfile::tempdir().expect("tempdir");
        man(ManArgs {
            dir: dir.path().join("man1"),
        })
        .expect("man pages");
        let page = |name: &str| dir.path().join("man1").join(name).exists();
        for name in [
            "carteiro.1",
            "carteiro-run.1",
            "carteiro-dlq-replay.1",
            "carteiro-completions.1",
        ] {
            assert!(page(name), "{name}");
        }
        assert!(!page("carteiro-man.1"), "the hidden command has no page");
    }
}
