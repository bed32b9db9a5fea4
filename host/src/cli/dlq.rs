//! `carteiro dlq list|show|stats|replay|purge`: the dead-letter store for operators.

use super::ops::load_config;
use crate::broker::connect;
use crate::gateway::{self, broker_settings};
use crate::store::DeadLetterFilter;
use std::path::Path;

/// Filters shared by `list`, `replay` and `purge`.
#[derive(Debug, clap::Args)]
pub struct FilterArgs {
    /// Only this route (work queue).
    #[arg(long)]
    pub route: Option<String>,
    /// Only reasons containing this text.
    #[arg(long)]
    pub reason: Option<String>,
    /// Only dead letters newer than this long ago, e.g. `2h`.
    #[arg(long, value_parser = crate::config::units::parse_duration)]
    pub since: Option<std::time::Duration>,
    /// At most this many.
    #[arg(long, default_value_t = 100)]
    pub limit: i64,
}

impl FilterArgs {
    fn filter(&self) -> DeadLetterFilter {
        DeadLetterFilter {
            route: self.route.clone(),
            reason_contains: self.reason.clone(),
            since_ms: self.since.map(|d| {
                crate::common::now_ms() - i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
            }),
            limit: Some(self.limit),
            ..Default::default()
        }
    }
}

/// `carteiro dlq ...`
#[derive(Debug, clap::Subcommand)]
pub enum DlqCommand {
    /// List dead letters, newest first.
    List {
        #[command(flatten)]
        filter: FilterArgs,
        /// Print JSON lines.
        #[arg(long)]
        json: bool,
    },
    /// Show one dead letter with headers and body.
    Show { id: i64 },
    /// Counts per route and reason.
    Stats,
    /// Publish dead letters back to their route's queue (attempts start again at 1).
    Replay {
        /// Replay this id (or use filters).
        id: Option<i64>,
        #[command(flatten)]
        filter: FilterArgs,
    },
    /// Delete dead letters matching the filters (at least one filter is required).
    Purge {
        #[command(flatten)]
        filter: FilterArgs,
    },
}

/// Runs a `dlq` subcommand against the config's store (and broker for replay).
pub async fn run(config_path: &Path, command: DlqCommand) -> anyhow::Result<i32> {
    let config = load_config(config_path)?;
    let store = gateway::open_store(&config).await?;
    match command {
        DlqCommand::List { filter, json } => {
            for d in store.dead_letters_list(&filter.filter()).await? {
                if json {
                    println!("{}", crate::dlq::summary_json(&d));
                } else {
                    println!(
                        "#{:<6} {:<24} attempts {:<3} {}",
                        d.id, d.route, d.attempts, d.reason
                    );
                }
            }
        }
        DlqCommand::Show { id } => match store.dead_letter_get(id).await? {
            Some(d) => println!(
                "{}",
                serde_json::to_string_pretty(&crate::dlq::detail_json(&d))?
            ),
            None => {
                eprintln!("no dead letter with id {id}");
                return Ok(1);
            }
        },
        DlqCommand::Stats => {
            for s in store.dead_letter_stats().await? {
                println!(
                    "{:<24} {:>6} ({} not replayed)  {}",
                    s.route, s.count, s.unreplayed, s.reason
                );
            }
        }
        DlqCommand::Replay { id, filter } => {
            let rows = match id {
                Some(id) => store.dead_letter_get(id).await?.into_iter().collect(),
                None => store.dead_letters_list(&filter.filter()).await?,
            };
            let settings = broker_settings(&config, "carteiro dlq replay");
            let conn = std::sync::Arc::new(connect(&settings.url, &settings.connect).await?);
            let publisher = crate::dlq::replay_publisher(conn).await?;
            let seal = gateway::seal_key(&store).await?;
            for d in &rows {
                crate::dlq::replay(&store, &publisher, &seal, d, config.broker.publish_timeout)
                    .await?;
                println!("replayed #{} to queue {}", d.id, d.route);
            }
            println!("{} replayed", rows.len());
        }
        DlqCommand::Purge { filter } => {
            if filter.route.is_none() && filter.reason.is_none() && filter.since.is_none() {
                eprintln!("refusing to purge everything: give --route, --reason or --since");
                return Ok(1);
            }
            let n = store.dead_letters_purge(&filter.filter()).await?;
            println!("{n} dead letters deleted");
        }
    }
    Ok(0)
}
