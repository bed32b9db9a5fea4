//! `carteiro dlq replay --shadow NEW.wasm` (what a new version would do with the dead
//! letters, nothing committed or published) and `--only-acked-by NEW.wasm` (replay for real
//! just the ones it acks).

use std::path::Path;

use crate::config::Config;
use crate::dlq::run::ReplayOptions;
use crate::dlq::shadow_replay::{self, Now, ShadowOptions, Verdicts};
use crate::services;
use crate::store::{DeadLetterFilter, Store};

/// A candidate component and the dead letters a shadow run of it reads.
pub(super) struct ShadowReplayRun<'a> {
    config: &'a Config,
    store: &'a Store,
    wasm: &'a Path,
    filter: DeadLetterFilter,
}

impl<'a> ShadowReplayRun<'a> {
    pub(super) fn new(
        config: &'a Config,
        store: &'a Store,
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
pub(super) async fn shadow_report(
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
pub(super) async fn replay_acked_by(
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
        match crate::dlq::replay(
            store,
            &publisher,
            &seal,
            &d,
            timeout,
            None,
            Default::default(),
        )
        .await
        {
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
