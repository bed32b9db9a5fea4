//! `carteiro dlq list|show|stats|replay|edit|purge`: the dead-letter store for operators
//! (`edit` and `show --journey` live in `dlq_edit_command`). `--search` takes the console's
//! query syntax (`dlq::search`) wherever the filters are.

use super::dlq_edit_command::{self, EditArgs};
use super::ops::load_config;
use crate::broker::connect_any;
use crate::common::header_names::PROP_MESSAGE_ID;
use crate::dlq::run::{Progress, ReplayOptions};
use crate::dlq::shadow_replay::{self, Now, ShadowOptions, Verdicts};
use crate::services;
use crate::services::broker_settings;
use crate::store::DeadLetterFilter;
use std::io::IsTerminal;
use std::path::Path;

/// Filters shared by `list`, `replay` and `purge`. Times compare with `dead_lettered_at`:
/// when the gateway that gave up on the message stamped it (`x-carteiro-dead-lettered-at`,
/// that gateway's clock), or when it was archived if nobody did; "now" is this machine's
/// clock.
#[derive(Debug, clap::Args)]
pub struct FilterArgs {
    /// Only this route (work queue).
    #[arg(long)]
    pub route: Option<String>,
    /// Only reasons containing this text (case-sensitive, no wildcards).
    #[arg(long)]
    pub reason: Option<String>,
    /// Only dead letters dead-lettered within this long before now (at or after now − D),
    /// e.g. `1h`: the newest ones.
    #[arg(long, value_parser = crate::common::units::parse_duration)]
    pub since: Option<std::time::Duration>,
    /// Only dead letters dead-lettered more than this long before now (before now − D),
    /// e.g. `7d`: the oldest ones.
    #[arg(long, value_parser = crate::common::units::parse_duration)]
    pub older_than: Option<std::time::Duration>,
    /// Only dead letters this search finds, from the archive's indexes: `id:MESSAGE-ID`,
    /// `correlation:ID`, `body.PATH = VALUE` (VALUE a JSON number, "string", true, false or
    /// null; `body.a.b` is a nested field), `route:R`, `reason:TEXT`; terms separated by
    /// spaces all hold. E.g. --search 'body.matricula_id = 123'.
    #[arg(long, value_name = "QUERY")]
    pub search: Option<String>,
}

impl FilterArgs {
    /// The store filter; a search that does not parse (or contradicts `--route` or
    /// `--reason`) is refused with the column where it goes wrong.
    fn filter(&self) -> anyhow::Result<DeadLetterFilter> {
        let ago = |d: std::time::Duration| {
            crate::common::now_ms().saturating_sub(i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        };
        let filter = DeadLetterFilter {
            route: self.route.clone(),
            reason_contains: self.reason.clone(),
            since_ms: self.since.map(ago),
            until_ms: self.older_than.map(ago),
            ..Default::default()
        };
        let Some(query) = &self.search else {
            return Ok(filter);
        };
        let search = crate::dlq::search::parse(query)
            .map_err(|e| anyhow::anyhow!("--search: {e}\n{}", e.pointer(query)))?;
        search
            .narrow(filter)
            .map_err(|why| anyhow::anyhow!("--search: {why}"))
    }

    fn is_empty(&self) -> bool {
        self.route.is_none()
            && self.reason.is_none()
            && self.since.is_none()
            && self.older_than.is_none()
            && self.search.is_none()
    }
}

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
            let page = store.dead_letters_search(&filter).await?;
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
        }
        DlqCommand::Show { id, journey: true } => {
            return dlq_edit_command::show_journey(&config, &store, id).await;
        }
        DlqCommand::Edit(args) => return dlq_edit_command::edit(&config, &store, args).await,
        DlqCommand::Show { id, .. } => match store.dead_letter_get(id).await? {
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
        } => {
            let options = ReplayOptions {
                include_replayed,
                limit,
                rate_per_sec: rate,
            };
            let shadow_options = ShadowOptions {
                include_replayed,
                limit,
                sha256: None,
            };
            if let Some(wasm) = shadow {
                let run = ShadowReplayRun::new(&config, &store, &wasm, filter.filter()?);
                return shadow_report(&run, &shadow_options, json).await;
            }
            if let Some(wasm) = only_acked_by {
                let run = ShadowReplayRun::new(&config, &store, &wasm, filter.filter()?);
                return replay_acked_by(&run, &options).await;
            }
            return replay(&config, &store, id, &filter.filter()?, &options, dry_run).await;
        }
        DlqCommand::Purge { filter } => {
            if filter.is_empty() {
                eprintln!(
                    "refusing to purge everything: give --route, --reason, --since, --older-than \
                     or --search"
                );
                return Ok(1);
            }
            let n = store.dead_letters_purge(&filter.filter()?).await?;
            println!("{n} dead letters deleted");
        }
        DlqCommand::Unpark { .. } => unreachable!("handled before the store opens"),
    }
    Ok(0)
}

async fn replay(
    config: &crate::config::Config,
    store: &crate::store::Store,
    id: Option<i64>,
    filter: &DeadLetterFilter,
    options: &ReplayOptions,
    dry_run: bool,
) -> anyhow::Result<i32> {
    if dry_run {
        let (count, groups) = match id {
            Some(id) => match store.dead_letter_get(id).await? {
                Some(d) => (1, vec![(d.letter.route, d.letter.reason, 1)]),
                None => (0, Vec::new()),
            },
            None => {
                let (count, groups) =
                    crate::dlq::run::dry_run(store, filter, options.include_replayed).await?;
                let groups = groups
                    .into_iter()
                    .map(|g| {
                        let n = if options.include_replayed {
                            g.count
                        } else {
                            g.unreplayed
                        };
                        (g.route, g.reason, n)
                    })
                    .collect();
                (count, groups)
            }
        };
        let planned = options.limit.map_or(count, |l| l.min(count));
        println!("would replay {planned} of {count} matching dead letters, oldest first");
        for (route, reason, n) in groups {
            println!("{n:>8}  {route:<24} {reason}");
        }
        return Ok(0);
    }
    let (publisher, seal) =
        crate::dlq::open_replay_sender(config, store, "carteiro dlq replay").await?;
    let timeout = config.broker.publish_timeout;
    if let Some(id) = id {
        let Some(d) = store.dead_letter_get(id).await? else {
            eprintln!("no dead letter with id {id}");
            return Ok(1);
        };
        if let Some(edited) = d.edited_at {
            eprintln!(
                "#{id} was edited at {}: only its edited copy is sent, never the original; edit \
                 it again (`carteiro dlq edit {id}`) to send another copy",
                crate::common::rfc3339(edited)
            );
            return Ok(1);
        }
        let since = Some(crate::common::now_ms());
        return Ok(
            match crate::dlq::replay(store, &publisher, &seal, &d, timeout, since, None).await? {
                crate::dlq::Replayed::Done => {
                    println!("replayed #{} to queue {}", d.id, d.letter.route);
                    println!("1 replayed");
                    0
                }
                crate::dlq::Replayed::Skipped => {
                    eprintln!(
                        "#{} is being replayed by another run right now; not replayed",
                        d.id
                    );
                    1
                }
            },
        );
    }
    let mut progress = CliProgress::new();
    let report = crate::dlq::run::replay_matching(
        store,
        &publisher,
        &seal,
        timeout,
        filter,
        options,
        &mut progress,
    )
    .await?;
    println!("{} replayed", report.replayed);
    if report.skipped > 0 {
        println!(
            "{} skipped: another replay running at the same time had them",
            report.skipped
        );
    }
    for (id, why) in &report.failed {
        println!("#{id} failed: {why}");
    }
    if report.stopped_by_limit {
        println!(
            "stopped at --limit {}: {} matching dead letters not replayed yet; run the same \
             command again to continue",
            options.limit.unwrap_or(0),
            report.remaining
        );
    } else if report.remaining > 0 {
        println!(
            "{} matching dead letters not replayed yet; run the same command again to retry them",
            report.remaining
        );
    }
    if let Some(why) = &report.gave_up {
        eprintln!("replay stopped: {why}");
    }
    Ok(if report.failed.is_empty() && report.gave_up.is_none() {
        0
    } else {
        1
    })
}

/// A candidate component and the dead letters a shadow run of it reads.
struct ShadowReplayRun<'a> {
    config: &'a crate::config::Config,
    store: &'a crate::store::Store,
    wasm: &'a Path,
    filter: DeadLetterFilter,
}

impl<'a> ShadowReplayRun<'a> {
    fn new(
        config: &'a crate::config::Config,
        store: &'a crate::store::Store,
        wasm: &'a Path,
        filter: DeadLetterFilter,
    ) -> Self {
        Self {
            config,
            store,
            wasm,
            filter,
        }
    }

    /// Runs the candidate on a runtime of its own; nothing is committed or published.
    async fn run(
        &self,
        options: &ShadowOptions,
        each: &mut dyn FnMut(&Verdicts),
    ) -> anyhow::Result<shadow_replay::Summary> {
        let runtime = services::new_runtime(self.config)?;
        shadow_replay::run(
            self.config,
            &runtime,
            self.store,
            self.wasm,
            &self.filter,
            options,
            each,
        )
        .await
    }
}

/// `dlq replay --shadow NEW.wasm`: the report; exit code 0 (the verdicts are the output).
async fn shadow_report(
    run: &ShadowReplayRun<'_>,
    options: &ShadowOptions,
    json: bool,
) -> anyhow::Result<i32> {
    let mut print = |v: &Verdicts| {
        if json {
            println!("{}", shadow_replay::verdicts_json(v));
        } else {
            print_verdicts(v);
        }
    };
    let summary = run.run(options, &mut print).await?;
    if json {
        println!("{}", shadow_replay::summary_json(&summary));
    } else {
        println!(
            "shadow of {} (sha256 {}): nothing was committed or published",
            run.wasm.display(),
            summary.sha256
        );
        println!("{}", summary.line());
    }
    Ok(0)
}

fn print_verdicts(v: &Verdicts) {
    let now = &v.now;
    println!(
        "#{:<6} {:<24} {:<20} dead-letter → {now}   (then: {})",
        v.id,
        v.route,
        v.message_id.as_deref().unwrap_or("-"),
        v.then_reason
    );
    for (key, value) in &v.kv_writes {
        match value {
            Some(value) => println!(
                "         kv set    {key:?} = {:?}",
                String::from_utf8_lossy(value)
            ),
            None => println!("         kv delete {key:?}"),
        }
    }
    for e in &v.events {
        println!(
            "         event     exchange {:?} routing key {:?}: {}",
            e.exchange,
            e.routing_key,
            String::from_utf8_lossy(&e.payload)
        );
    }
}

/// `dlq replay --only-acked-by NEW.wasm`: a shadow run, then a real replay of exactly the
/// dead letters it acked (each marked replayed after its confirm).
async fn replay_acked_by(
    run: &ShadowReplayRun<'_>,
    options: &ReplayOptions,
) -> anyhow::Result<i32> {
    let ShadowReplayRun {
        config,
        store,
        wasm,
        ..
    } = *run;
    let mut acked = Vec::new();
    let shadow_options = ShadowOptions {
        include_replayed: options.include_replayed,
        limit: None,
        sha256: None,
    };
    let summary = run
        .run(&shadow_options, &mut |v| {
            if v.now == Now::Ack {
                acked.push(v.id);
            }
        })
        .await?;
    println!("shadow: {}", summary.line());
    if let Some(limit) = options.limit {
        acked.truncate(usize::try_from(limit).unwrap_or(usize::MAX));
    }
    let (publisher, seal) =
        crate::dlq::open_replay_sender(config, store, "carteiro dlq replay").await?;
    let (mut replayed, mut failed) = (0u64, 0u64);
    for id in acked {
        let Some(d) = store.dead_letter_get(id).await? else {
            continue;
        };
        let timeout = config.broker.publish_timeout;
        match crate::dlq::replay(store, &publisher, &seal, &d, timeout, None, None).await {
            Ok(crate::dlq::Replayed::Done) => replayed += 1,
            Ok(crate::dlq::Replayed::Skipped) => println!("#{id} skipped: another run has it"),
            Err(e) => {
                failed += 1;
                println!("#{id} failed: {e:#}");
            }
        }
    }
    println!(
        "{replayed} replayed (the ones {} acks); {} left in the dead-letter store",
        wasm.display(),
        summary.total.saturating_sub(replayed)
    );
    Ok(if failed == 0 { 0 } else { 1 })
}

/// An `indicatif` bar when stderr is a terminal; otherwise a line every few seconds.
struct CliProgress {
    bar: Option<indicatif::ProgressBar>,
    planned: u64,
    last_line: std::time::Instant,
}

/// Seconds between progress lines when stderr is not a terminal.
const LINE_EVERY: std::time::Duration = std::time::Duration::from_secs(2);

impl CliProgress {
    fn new() -> Self {
        Self {
            bar: None,
            planned: 0,
            last_line: std::time::Instant::now(),
        }
    }
}

impl Progress for CliProgress {
    fn start(&mut self, planned: u64) {
        self.planned = planned;
        if std::io::stderr().is_terminal() {
            let bar = indicatif::ProgressBar::new(planned);
            if let Ok(style) = indicatif::ProgressStyle::with_template(
                "replaying {bar:40} {pos}/{len} ({per_sec}, eta {eta})",
            ) {
                bar.set_style(style);
            }
            self.bar = Some(bar);
        } else {
            eprintln!("replaying {planned} dead letters, oldest first");
        }
        self.last_line = std::time::Instant::now();
    }

    fn advance(&mut self, done: u64) {
        match &self.bar {
            Some(bar) => bar.set_position(done),
            None if self.last_line.elapsed() >= LINE_EVERY => {
                eprintln!("replayed {done} of {}", self.planned);
                self.last_line = std::time::Instant::now();
            }
            None => {}
        }
    }

    fn finish(&mut self, report: &crate::dlq::run::ReplayReport) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        } else {
            eprintln!("replayed {} of {}", report.replayed, self.planned);
        }
    }
}
