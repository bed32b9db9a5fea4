//! `carteiro dlq list|show|stats|replay|edit|purge|unpark`: the dead-letter store for
//! operators. `edit` and `show --journey` live in `edit`, `replay` in `replay` and its
//! shadow runs in `shadow`. `--search` takes the console's query syntax (`dlq::search`)
//! wherever the filters are.

mod edit;
mod filters;
mod replay;
mod shadow;

use std::path::Path;

use super::ops::load_config;
use crate::broker::connect_any;
use crate::common::header_names::PROP_MESSAGE_ID;
use crate::dlq::run::ReplayOptions;
use crate::dlq::shadow_replay::ShadowOptions;
use crate::services;
use crate::services::broker_settings;
use crate::store::{DeadLetterFilter, Store};
use edit::EditArgs;
use filters::FilterArgs;
use shadow::ShadowReplayRun;

/// `carteiro dlq ...`
#[derive(Debug, clap::Subcommand)]
pub enum DlqCommand {
    /// List dead letters, newest first (id, route, message id, attempts, reason); with
    /// --search, the ones a search finds, e.g. --search 'body.matricula_id = 123'.
    List {
        #[command(flatten)]
        filter: FilterArgs,
        /// At most this many.
        #[arg(long, default_value_t = 100)]
        limit: i64,
        /// Only ids below this one: the next page, or where a search stopped short.
        #[arg(long, value_name = "ID")]
        before: Option<i64>,
        /// Print JSON lines.
        #[arg(long)]
        json: bool,
    },
    /// Show one dead letter with headers and body.
    Show {
        id: i64,
        /// Print its message's journey instead: every attempt (when, plugin version, verdict
        /// or failure with its reason, retry tier, trace id), the dead-lettering, each replay
        /// and edit, and the outcome.
        #[arg(long)]
        journey: bool,
    },
    /// Counts per route and reason.
    Stats,
    /// Publish dead letters back to their route's queue (attempts start again at 1): one by
    /// id, or every one matching the filters that was not replayed yet, oldest first. Each
    /// is marked replayed right after its confirm, so running the same command again
    /// continues where an interrupted run stopped (and replays nothing after a finished one).
    Replay {
        /// Replay this id (even if it was replayed before), or use filters.
        id: Option<i64>,
        #[command(flatten)]
        filter: FilterArgs,
        /// Stop after this many replays (the run then says how many remain).
        #[arg(long)]
        limit: Option<u64>,
        /// Take dead letters that were already replayed too (such a run does not resume: a
        /// re-run replays every matching one again).
        #[arg(long)]
        include_replayed: bool,
        /// Print how many would be replayed and their groups (route, reason); publish
        /// nothing.
        #[arg(long)]
        dry_run: bool,
        /// At most this many replays per second, e.g. `50/s`.
        #[arg(long, value_parser = crate::dlq::run::parse_rate)]
        rate: Option<f64>,
        /// Publish nothing: run each selected dead letter through this new component (with
        /// the route's plugin settings, an in-memory store over the real kv, read-only) and
        /// report, per message and in total, the verdict then and now and the kv writes and
        /// events the new version would make. Nothing is committed or published.
        #[arg(long, value_name = "NEW.wasm", conflicts_with_all = ["id", "dry_run", "only_acked_by", "rate"])]
        shadow: Option<std::path::PathBuf>,
        /// Replay for real only the selected dead letters this component acks in a shadow
        /// run (deploy it on the route first: the replayed messages meet the running version).
        #[arg(long, value_name = "NEW.wasm", conflicts_with_all = ["id", "dry_run"])]
        only_acked_by: Option<std::path::PathBuf>,
        /// With --shadow: print JSON lines (one per message, then the summary).
        #[arg(long, requires = "shadow")]
        json: bool,
        /// Send them to this queue (through the default exchange) instead of where each came
        /// from: its route's queue, or for a `[[dead_letter_queues]]` dead letter the exchange
        /// and routing key of its `x-death` record.
        #[arg(long, value_name = "QUEUE", conflicts_with_all = ["shadow", "only_acked_by"])]
        to_queue: Option<String>,
    },
    /// Change a dead letter's body or headers and send the edited copy to its route's queue:
    /// only the edited copy, never the original as well (the dead letter is then never
    /// replayed as archived). The archive keeps the original, who edited it, when and what
    /// changed. Without --body-file or header changes, the body opens in $EDITOR.
    Edit(EditArgs),
    /// Delete every dead letter matching the filters, replayed or not (at least one filter
    /// is required). `--since 1h` deletes those dead-lettered in the last hour;
    /// `--older-than 7d` those dead-lettered more than seven days ago.
    Purge {
        #[command(flatten)]
        filter: FilterArgs,
    },
    /// Move a quorum route's parked dead letters (`ROUTE.dlq.parked`: those the archiver
    /// could not take within the DLQ's delivery limit) back into `ROUTE.dlq`, where the
    /// running gateway archives them. Takes those parked when it starts.
    Unpark {
        /// The route (work queue).
        #[arg(long)]
        route: String,
    },
}

/// Runs a `dlq` subcommand against the config's store (and broker for replay).
pub async fn run(config_path: &Path, command: DlqCommand) -> anyhow::Result<i32> {
    let config = load_config(config_path)?;
    if let DlqCommand::Unpark { route } = &command {
        let settings = broker_settings(&config, "carteiro dlq unpark");
        let conn = connect_any(&settings.urls, &settings.connect).await?;
        let moved = crate::dlq::unpark::unpark(&conn, route).await?;
        println!("{moved} parked dead letters moved back to {route}.dlq");
        return Ok(0);
    }
    let store = services::open_store(&config).await?;
    match command {
        DlqCommand::List {
            filter,
            limit,
            before,
            json,
        } => {
            let filter = DeadLetterFilter {
                limit: Some(limit),
                before_id: before,
                ..filter.filter()?
            };
            list(&store, &filter, json).await
        }
        DlqCommand::Show { id, journey: true } => edit::show_journey(&config, &store, id).await,
        DlqCommand::Show { id, .. } => show(&store, id).await,
        DlqCommand::Edit(args) => edit::edit(&config, &store, args).await,
        DlqCommand::Stats => stats(&store).await,
        DlqCommand::Replay {
            id,
            filter,
            limit,
            include_replayed,
            dry_run,
            rate,
            shadow,
            only_acked_by,
            json,
            to_queue,
        } => {
            let options = ReplayOptions {
                include_replayed,
                limit,
                rate_per_sec: rate,
                to_queue: to_queue.clone(),
            };
            let filter = filter.filter()?;
            if let Some(wasm) = shadow {
                let run = ShadowReplayRun::new(&config, &store, &wasm, filter);
                let shadow_options = ShadowOptions {
                    include_replayed,
                    limit,
                    sha256: None,
                };
                return shadow::shadow_report(&run, &shadow_options, json).await;
            }
            if let Some(wasm) = only_acked_by {
                let run = ShadowReplayRun::new(&config, &store, &wasm, filter);
                return shadow::replay_acked_by(&run, &options).await;
            }
            replay::replay(&config, &store, id, &filter, &options, dry_run).await
        }
        DlqCommand::Purge { filter } => purge(&store, &filter).await,
        DlqCommand::Unpark { .. } => unreachable!("handled before the store opens"),
    }
}

/// `list`: one line (or JSON line) per dead letter, and where a search stopped short.
async fn list(store: &Store, filter: &DeadLetterFilter, json: bool) -> anyhow::Result<i32> {
    let page = store.dead_letters_search(filter).await?;
    for d in &page.rows {
        if json {
            println!("{}", crate::dlq::summary_json(d));
        } else {
            let message_id = d.header(PROP_MESSAGE_ID).unwrap_or("-");
            println!(
                "#{:<6} {:<24} {:<24} attempts {:<3} {}",
                d.id, d.letter.route, message_id, d.letter.attempts, d.letter.reason
            );
        }
    }
    if let Some(below) = page.stopped_before {
        let note = crate::dlq::search::stopped_short(page.examined, below);
        eprintln!("{note} (here: --before {below})");
    }
    Ok(0)
}

async fn show(store: &Store, id: i64) -> anyhow::Result<i32> {
    match store.dead_letter_get(id).await? {
        Some(d) => {
            let detail = crate::dlq::detail_json(&d);
            println!("{}", serde_json::to_string_pretty(&detail)?);
            Ok(0)
        }
        None => {
            eprintln!("no dead letter with id {id}");
            Ok(1)
        }
    }
}

async fn stats(store: &Store) -> anyhow::Result<i32> {
    for s in store.dead_letter_stats().await? {
        println!(
            "{:<24} {:>6} ({} not replayed)  {}",
            s.route, s.count, s.unreplayed, s.reason
        );
    }
    Ok(0)
}

/// `purge`: refused without a filter, so that no typo deletes the whole archive.
async fn purge(store: &Store, filter: &FilterArgs) -> anyhow::Result<i32> {
    if filter.is_empty() {
        eprintln!(
            "refusing to purge everything: give --route, --reason, --since, --older-than \
             or --search"
        );
        return Ok(1);
    }
    let n = store.dead_letters_purge(&filter.filter()?).await?;
    println!("{n} dead letters deleted");
    Ok(0)
}
