//! `carteiro-chaos`: the fault campaign. Runs the real `carteiro` binary against its own
//! RabbitMQ (one node or a 3-node cluster) and store, injects faults at random moments under
//! load, then drains everything and checks that nothing was lost, duplicated or unexpected.
//!
//! Modules:
//! - [`campaign`]: one run, start to verdict;
//! - [`workload`]: the inputs and their publisher; [`sink`]: every published event;
//! - [`faults`]: the fault kinds, their weights and injection ([`dlq_repair`]: the operator's); [`lanes`]: short faults one at
//!   a time, long ones in the background, and each fault's record;
//! - [`services`], [`procs`], [`config`]: broker, database, `carteiro` processes, their config;
//! - [`drain`]: the end of a run; [`collect`]: reading the store; [`checker`]: the verdict;
//!   [`report`]: Markdown.

mod broker;
mod campaign;
mod checker;
mod collect;
mod config;
mod dlq_repair;
mod drain;
mod faults;
mod lanes;
mod logs;
mod procs;
mod report;
mod services;
mod sink;
mod workload;

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

use campaign::{Backend, Options};

/// Fault campaign for Carteiro. Exit status 0 only when the checker finds nothing.
#[derive(Debug, Parser)]
#[command(name = "carteiro-chaos")]
struct Args {
    /// About three minutes (CI): faults every few seconds over ~75 s.
    #[arg(long, conflicts_with = "full")]
    smoke: bool,
    /// About 30 minutes (on demand); writes a Markdown report.
    #[arg(long)]
    full: bool,
    #[arg(long, value_enum, default_value = "sqlite")]
    backend: Backend,
    /// A 3-node RabbitMQ cluster and quorum queues (PostgreSQL recommended).
    #[arg(long)]
    cluster: bool,
    /// PostgreSQL: the two relays read the outbox from a replication slot (`[relay] mode =
    /// "cdc"`), one active and one standing by, instead of polling it.
    #[arg(long)]
    cdc: bool,
    /// Replays a schedule: the same faults and inputs in the same order.
    #[arg(long)]
    seed: Option<u64>,
    /// Overrides the campaign's length in seconds.
    #[arg(long)]
    duration: Option<u64>,
    /// Where the Markdown report goes (default for --full: bench/results/chaos-<setup>.md).
    #[arg(long)]
    report: Option<PathBuf>,
    /// The `carteiro` binary under test.
    #[arg(long, env = "CARTEIRO_BIN")]
    binary: PathBuf,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() -> std::process::ExitCode {
    let args = Args::parse();
    match run(args).await {
        Ok(true) => std::process::ExitCode::SUCCESS,
        Ok(false) => std::process::ExitCode::FAILURE,
        Err(e) => {
            eprintln!("chaos: campaign could not run: {e:#}");
            std::process::ExitCode::from(2)
        }
    }
}

async fn run(args: Args) -> anyhow::Result<bool> {
    if args.cdc && args.backend != Backend::Postgres {
        anyhow::bail!("--cdc needs --backend postgres (the CDC relay reads a PostgreSQL slot)");
    }
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .canonicalize()?;
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64 % 1_000_000)
    });
    let duration = Duration::from_secs(args.duration.unwrap_or(if args.full { 1800 } else { 75 }));
    let quiet = (duration / 10).clamp(Duration::from_secs(10), Duration::from_secs(60));
    let command = format!(
        "scripts/chaos.sh {} --backend {}{}{} --seed {seed}{}",
        if args.full { "--full" } else { "--smoke" },
        match args.backend {
            Backend::Sqlite => "sqlite",
            Backend::Postgres => "postgres",
        },
        if args.cluster { " --cluster" } else { "" },
        if args.cdc { " --cdc" } else { "" },
        args.duration
            .map_or(String::new(), |d| format!(" --duration {d}")),
    );
    println!("chaos: replay this run with: {command}");
    let outcome = campaign::run(Options {
        repo: repo.clone(),
        binary: args.binary.canonicalize()?,
        backend: args.backend,
        cluster: args.cluster,
        cdc: args.cdc,
        seed,
        quiet,
        duration,
        gap: if args.full { (0.5, 1.5) } else { (1.0, 4.0) },
        backlog: if args.full { 1_000 } else { 400 },
        drain_timeout: Duration::from_secs(if args.full { 600 } else { 240 }),
        full: args.full,
    })
    .await?;
    let date = today();
    let md = report::markdown(&outcome, &command, &date);
    println!("\n{md}");
    let report = args.report.or_else(|| {
        args.full.then(|| {
            let setup = format!(
                "{}{}{}",
                if args.backend == Backend::Postgres {
                    "postgres"
                } else {
                    "sqlite"
                },
                if args.cdc { "-cdc" } else { "" },
                if args.cluster { "-cluster" } else { "" }
            );
            repo.join(format!("bench/results/chaos-{setup}.md"))
        })
    });
    if let Some(path) = report {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(&path, &md)?;
        println!("chaos: report written to {}", path.display());
    }
    let passed = outcome.passed();
    let f = &outcome.findings;
    println!(
        "chaos: {} — {} faults, {} lost, {} duplicate effects, {} unexpected, {} duplicate events beyond the window, {} left in the queues, {} exited unprompted, {} stalls, drained: {}",
        if passed { "PASSED" } else { "FAILED" },
        outcome.faults.len(),
        f.lost,
        f.duplicate_effects,
        f.unexpected,
        f.duplicate_events_beyond_window,
        f.left_in_queues,
        f.unexpected_exits,
        f.stalled_faults,
        f.drained
    );
    Ok(passed)
}

/// Today's date (UTC) from `date`, for the report's heading.
fn today() -> String {
    std::process::Command::new("date")
        .args(["-u", "+%Y-%m-%d"])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default()
}
