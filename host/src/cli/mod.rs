//! The `carteiro` command line: argument types and dispatch. Each command lives in its own
//! module; `main.rs` only sets up tracing and signals and calls [`run`].

mod plugin_test;

use clap::{Parser, Subcommand};

pub use plugin_test::{MemoryKv, PluginTestArgs};

/// Carteiro: a RabbitMQ gateway that runs sandboxed WebAssembly handlers.
#[derive(Debug, Parser)]
#[command(name = "carteiro", version, about)]
pub struct Cli {
    /// Log as JSON lines instead of human-readable text.
    #[arg(long, global = true)]
    pub log_json: bool,
    #[command(subcommand)]
    pub command: Command,
}

/// Top-level commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Work with handler plugins.
    #[command(subcommand)]
    Plugin(PluginCommand),
}

/// `carteiro plugin ...`
#[derive(Debug, Subcommand)]
pub enum PluginCommand {
    /// Run a .wasm handler on one message with an in-memory store (no broker).
    Test(PluginTestArgs),
}

/// Runs a parsed command; returns the process exit code.
pub async fn run(cli: Cli) -> anyhow::Result<i32> {
    match cli.command {
        Command::Plugin(PluginCommand::Test(args)) => plugin_test::run(args).await,
    }
}
