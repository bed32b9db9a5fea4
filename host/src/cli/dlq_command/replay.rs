//! `carteiro dlq replay`: one dead letter by id, or every one matching the filters (with
//! `--dry-run`, only what would be replayed), with progress on stderr.

use std::io::IsTerminal;

use crate::config::Config;
use crate::dlq::run::{Progress, ReplayOptions, ReplayReport};
use crate::store::{DeadLetterFilter, Store};

/// Replays dead letter `id`, or those `filter` matches; with `dry_run`, only says what
/// would be replayed.
pub(super) async fn replay(
    config: &Config,
    store: &Store,
    id: Option<i64>,
    filter: &DeadLetterFilter,
    options: &ReplayOptions,
    dry_run: bool,
) -> anyhow::Result<i32> {
    if dry_run {
        return print_plan(store, id, filter, options).await;
    }
    match id {
        Some(id) => replay_one(config, store, id, options.to_queue.as_deref()).await,
        None => replay_matching(config, store, filter, options).await,
    }
}

/// `--dry-run`: how many would be replayed, by route and reason.
async fn print_plan(
    store: &Store,
    id: Option<i64>,
    filter: &DeadLetterFilter,
    options: &ReplayOptions,
) -> anyhow::Result<i32> {
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
    Ok(0)
}

/// One dead letter by id, replayed before or not; never an edited one's original.
async fn replay_one(
    config: &Config,
    store: &Store,
    id: i64,
    to_queue: Option<&str>,
) -> anyhow::Result<i32> {
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
    let (publisher, seal) =
        crate::dlq::open_replay_sender(config, store, "carteiro dlq replay").await?;
    let timeout = config.broker.publish_timeout;
    let since = Some(crate::common::now_ms());
    let run = crate::dlq::ReplayRun {
        owner: None,
        to_queue,
    };
    let (destination, _) = crate::dlq::copy_of(&d, Default::default(), &[], &seal, to_queue);
    Ok(
        match crate::dlq::replay(store, &publisher, &seal, &d, timeout, since, run).await? {
            crate::dlq::Replayed::Done => {
                println!(
                    "replayed #{} to {}",
                    d.id,
                    crate::dlq::describe(&destination)
                );
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
    )
}

/// Every dead letter `filter` matches, oldest first, with progress; the report says what is
/// left and how to continue.
async fn replay_matching(
    config: &Config,
    store: &Store,
    filter: &DeadLetterFilter,
    options: &ReplayOptions,
) -> anyhow::Result<i32> {
    let (publisher, seal) =
        crate::dlq::open_replay_sender(config, store, "carteiro dlq replay").await?;
    let mut progress = CliProgress::new();
    let report = crate::dlq::run::replay_matching(
        store,
        &publisher,
        &seal,
        config.broker.publish_timeout,
        filter,
        options,
        &mut progress,
    )
    .await?;
    print_report(&report, options);
    Ok(if report.failed.is_empty() && report.gave_up.is_none() {
        0
    } else {
        1
    })
}

fn print_report(report: &ReplayReport, options: &ReplayOptions) {
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

    fn finish(&mut self, report: &ReplayReport) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        } else {
            eprintln!("replayed {} of {}", report.replayed, self.planned);
        }
    }
}
