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
