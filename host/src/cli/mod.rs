//! The `carteiro` command line: argument types and dispatch. Each command lives in its own
//! module; `main.rs` only sets up tracing and signals and calls [`run`].
//!
//! `ops` (run, check, migrate, relay, publish, outbox), `dlq_command` (its
//! `edit`, `replay` and `shadow` parts), `shadow_command`,
//! `canary_command`, `seal_command` (named apart from the parts they drive: `dlq`,
//! `pipeline::live_shadow`, `pipeline::canary`, `broker::seal`), `plugin_test`; for handler
//! authors `scaffold` (`plugin new`), `plugin_build` (`plugin build`), `sdk` (the embedded
//! SDKs, vendoring, `plugin sdk`) and `toolchain` (pinned build tools, missing-tool errors);
//! `completions` (shell completions and man pages, from this definition).

mod canary_command;
mod completions;
mod dlq_command;
mod ops;
mod plugin_build;
mod plugin_test;
mod scaffold;
mod sdk;
mod seal_command;
mod shadow_command;
mod toolchain;

use clap::{Parser, Subcommand};
use std::future::Future;
use std::path::PathBuf;

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

/// The config file argument shared by most commands.
#[derive(Debug, clap::Args)]
pub struct ConfigArg {
    /// Path to carteiro.toml.
    #[arg(
        short,
        long,
        global = true,
        default_value = "carteiro.toml",
        env = "CARTEIRO_CONFIG"
    )]
    pub config: PathBuf,
}

/// Top-level commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the gateway: consume every route, relay the outbox, serve /metrics.
    Run(ConfigArg),
    /// Validate the config and plugins; then the store and broker unless --no-environment.
    Check {
        #[command(flatten)]
        config: ConfigArg,
        /// Skip the store and broker probes.
        #[arg(long)]
        no_environment: bool,
    },
    /// Apply database migrations and exit.
    Migrate(ConfigArg),
    /// Run only the outbox relay.
    Relay(ConfigArg),
    /// Publish one message (confirmed, mandatory) to the config's broker.
    Publish {
        #[command(flatten)]
        config: ConfigArg,
        #[command(flatten)]
        args: ops::PublishArgs,
    },
    /// Inspect the outbox.
    #[command(subcommand)]
    Outbox(OutboxCommand),
    /// Inspect, replay and purge dead letters.
    Dlq {
        #[command(flatten)]
        config: ConfigArg,
        #[command(subcommand)]
        command: dlq_command::DlqCommand,
    },
    /// Work with handler plugins.
    #[command(subcommand)]
    Plugin(PluginCommand),
    /// Canaries (`[plugins.NAME.canary]`) of the running gateway: promote or abort one.
    Canary {
        #[command(flatten)]
        config: ConfigArg,
        #[command(subcommand)]
        command: canary_command::CanaryCommand,
    },
    /// The key that seals Carteiro's own headers on retry, dead-letter and replay copies.
    Seal {
        #[command(flatten)]
        config: ConfigArg,
        #[command(subcommand)]
        command: seal_command::SealCommand,
    },
    /// Live shadows (`[plugins.NAME] shadow = "new.wasm"`) of the running gateway.
    Shadow {
        #[command(flatten)]
        config: ConfigArg,
        #[command(subcommand)]
        command: shadow_command::ShadowCommand,
    },
    /// Print a shell completion script (bash, zsh, fish, ...).
    Completions(completions::CompletionsArgs),
    /// Write the man pages into a folder (for packaging).
    #[command(hide = true)]
    Man(completions::ManArgs),
}

/// `carteiro outbox ...`
#[derive(Debug, Subcommand)]
pub enum OutboxCommand {
    /// Pending rows, oldest pending age, rows with errors (every outbox).
    Status(ConfigArg),
    /// Print the PostgreSQL trigger that wakes the relay at each commit of an `[[outboxes]]`
    /// table (optional: the poll interval is the backstop).
    Trigger {
        #[command(flatten)]
        config: ConfigArg,
        /// The outbox's `name`.
        outbox: String,
    },
    /// Try parked rows of an `[[outboxes]]` table again (after fixing them in the table).
    Retry {
        #[command(flatten)]
        config: ConfigArg,
        /// The outbox's `name`.
        outbox: String,
        /// The rows' ids.
        #[arg(required = true)]
        ids: Vec<i64>,
    },
}

/// `carteiro plugin ...`
#[derive(Debug, Subcommand)]
pub enum PluginCommand {
    /// Run a .wasm handler on one message with an in-memory store (no broker).
    Test(PluginTestArgs),
    /// Scaffold a handler project (Rust, Python or JavaScript) with a vendored SDK.
    New(scaffold::NewArgs),
    /// Build a handler project into a WebAssembly component; prints its path.
    Build(plugin_build::BuildArgs),
    /// Compare a project's vendored SDK with this binary's, or rewrite it (--update).
    Sdk(sdk::SdkArgs),
}

/// The language of a handler project.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Lang {
    /// Rust, built with cargo for wasm32-wasip2.
    Rust,
    /// Python, built with componentize-py.
    Python,
    /// JavaScript or TypeScript, built with ComponentizeJS.
    Js,
}

impl std::fmt::Display for Lang {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Lang::Rust => "rust",
            Lang::Python => "python",
            Lang::Js => "js",
        })
    }
}

/// Runs a parsed command; returns the process exit code. `shutdown` resolves on SIGTERM;
/// `sighup` yields once per SIGHUP (`carteiro run` reloads; other commands drop it).
pub async fn run(
    cli: Cli,
    shutdown: impl Future<Output = ()>,
    sighup: tokio::sync::mpsc::UnboundedReceiver<()>,
) -> anyhow::Result<i32> {
    // Only a running gateway reloads: other commands let SIGHUP be logged and ignored.
    let sighup = matches!(cli.command, Command::Run(_)).then_some(sighup);
    match cli.command {
        Command::Run(c) => ops::run(&c.config, shutdown, sighup).await,
        Command::Check {
            config,
            no_environment,
        } => ops::check(&config.config, no_environment).await,
        Command::Migrate(c) => ops::migrate(&c.config).await,
        Command::Relay(c) => ops::relay(&c.config, shutdown).await,
        Command::Publish { config, args } => ops::publish(&config.config, args).await,
        Command::Outbox(OutboxCommand::Status(c)) => ops::outbox_status(&c.config).await,
        Command::Outbox(OutboxCommand::Trigger { config, outbox }) => {
            ops::outbox_trigger(&config.config, &outbox)
        }
        Command::Outbox(OutboxCommand::Retry {
            config,
            outbox,
            ids,
        }) => ops::outbox_retry(&config.config, &outbox, &ids).await,
        Command::Dlq { config, command } => dlq_command::run(&config.config, command).await,
        Command::Shadow { config, command } => shadow_command::run(&config.config, command).await,
        Command::Canary { config, command } => canary_command::run(&config.config, command).await,
        Command::Seal { config, command } => seal_command::run(&config.config, command).await,
        Command::Plugin(PluginCommand::Test(args)) => plugin_test::run(args).await,
        Command::Plugin(PluginCommand::New(args)) => scaffold::run(args),
        Command::Plugin(PluginCommand::Build(args)) => plugin_build::run(args),
        Command::Plugin(PluginCommand::Sdk(args)) => sdk::run(args),
        Command::Completions(args) => completions::completions(args),
        Command::Man(args) => completions::man(args),
    }
}
