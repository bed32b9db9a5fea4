//! Background jobs the console and the JSON API start: a replay (the same engine as
//! `carteiro dlq replay`: oldest first, only what was not replayed yet, each row marked after
//! its confirm, rate-limited) and a shadow run of a new plugin file. Their progress is
//! polled at `/api/jobs/{id}`. A replay stopped (or lost with the process) is resumed by
//! starting the same replay again: it takes only the rows not marked yet.

use crate::config::Config;
use crate::dlq::run::{Progress, ReplayOptions, ReplayReport};
use crate::dlq::shadow::{self, Now, ShadowOptions, Verdicts};
use crate::store::{DeadLetterFilter, Store};
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use tokio_util::sync::CancellationToken;

/// Jobs kept for their pages; older finished ones are dropped.
const KEPT: usize = 50;
/// Per-message lines a shadow job keeps for its report.
const SHADOW_LINES: usize = 500;

/// What a job does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Replay,
    Shadow,
}

/// Where a job is, as `/api/jobs/{id}` shows it.
#[derive(Debug, Clone, Default, Serialize)]
pub struct State {
    /// Rows the job means to take (known once it started).
    pub planned: u64,
    /// Rows done so far.
    pub done: u64,
    /// Over (finished, stopped or failed).
    pub finished: bool,
    /// Stopped by an operator before the end.
    pub stopped: bool,
    /// Replay: rows whose replay failed (left unmarked for the next run).
    pub failed: Vec<(i64, String)>,
    /// Replay: matching rows not replayed yet after the run.
    pub remaining: Option<u64>,
    /// Why the job failed or gave up.
    pub error: Option<String>,
    /// Shadow: the summary (`dlq replay --shadow --json`'s last line).
    pub summary: Option<serde_json::Value>,
    /// Shadow: one line per message (the first few hundred).
    pub lines: Vec<String>,
}

/// One job.
pub struct Job {
    pub id: u64,
    pub kind: Kind,
    /// What it runs on, for people (`route orders, group "timeout"`).
    pub title: String,
    /// Where to go back to (the group's page).
    pub back: String,
    pub started_ms: i64,
    state: Mutex<State>,
    stop: CancellationToken,
}

impl Job {
    /// A copy of its state.
    pub fn state(&self) -> State {
        self.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn update(&self, change: impl FnOnce(&mut State)) {
        change(&mut self.state.lock().unwrap_or_else(PoisonError::into_inner));
    }

    /// Asks a running job to stop (a replay stops between two rows' publishes).
    pub fn stop(&self) {
        self.stop.cancel();
    }

    /// The job as JSON.
    pub fn json(&self) -> serde_json::Value {
        let state = self.state();
        serde_json::json!({
            "id": self.id,
            "kind": self.kind,
            "title": self.title,
            "started_ms": self.started_ms,
            "planned": state.planned,
            "done": state.done,
            "finished": state.finished,
            "stopped": state.stopped,
            "failed": state.failed.iter().map(|(id, why)| serde_json::json!({"id": id, "error": why})).collect::<Vec<_>>(),
            "remaining": state.remaining,
            "error": state.error,
            "summary": state.summary,
            "lines": state.lines,
        })
    }
}

/// The jobs of this process.
#[derive(Default)]
pub struct Jobs {
    next: AtomicU64,
    jobs: Mutex<BTreeMap<u64, Arc<Job>>>,
}

/// What a replay job needs from the gateway.
pub struct ReplayContext {
    pub store: Store,
    pub connection: Arc<lapin::Connection>,
    pub publish_timeout: std::time::Duration,
    /// Where the `carteiro_replay_*` metrics go.
    pub metrics: Arc<crate::metrics::Metrics>,
}

impl Jobs {
    /// Job `id`, if kept.
    pub fn get(&self, id: u64) -> Option<Arc<Job>> {
        self.jobs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&id)
            .cloned()
    }

    /// Every kept job, newest first.
    pub fn list(&self) -> Vec<Arc<Job>> {
        let jobs = self.jobs.lock().unwrap_or_else(PoisonError::into_inner);
        jobs.values().rev().cloned().collect()
    }

    fn add(&self, kind: Kind, title: String, back: String) -> Arc<Job> {
        let id = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        let job = Arc::new(Job {
            id,
            kind,
            title,
            back,
            started_ms: crate::common::now_ms(),
            state: Mutex::default(),
            stop: CancellationToken::new(),
        });
        let mut jobs = self.jobs.lock().unwrap_or_else(PoisonError::into_inner);
        jobs.insert(id, job.clone());
        while jobs.len() > KEPT {
            let oldest_finished = jobs
                .iter()
                .find(|(_, j)| j.state().finished)
                .map(|(id, _)| *id);
            match oldest_finished {
                Some(old) => jobs.remove(&old),
                None => break,
            };
        }
        job
    }

    /// Starts a replay of what `filter` selects.
    pub fn start_replay(
        &self,
        ctx: ReplayContext,
        title: String,
        back: String,
        filter: DeadLetterFilter,
        options: ReplayOptions,
    ) -> Arc<Job> {
        let job = self.add(Kind::Replay, title, back);
        let running = job.clone();
        tracing::info!(job = job.id, title = %job.title, rate = ?options.rate_per_sec, "console replay started");
        // The engine's progress callback is not `Send`: the run gets a thread of its own.
        let handle = tokio::runtime::Handle::current();
        tokio::task::spawn_blocking(move || {
            handle.block_on(async move {
                let outcome = replay(&ctx, &running, &filter, &options).await;
                running.update(|s| {
                    match outcome {
                        Ok(Some(report)) => {
                            s.done = report.replayed;
                            s.failed = report.failed;
                            s.remaining = Some(report.remaining);
                            s.error = report.gave_up;
                        }
                        Ok(None) => s.stopped = true,
                        Err(e) => s.error = Some(format!("{e:#}")),
                    }
                    s.finished = true;
                });
                let s = running.state();
                tracing::info!(job = running.id, replayed = s.done, stopped = s.stopped, error = ?s.error, "console replay over");
            });
        });
        job
    }

    /// Starts a shadow run of `wasm` on what `filter` selects (nothing committed or
    /// published).
    pub fn start_shadow(
        &self,
        config: Arc<Config>,
        store: Store,
        title: String,
        back: String,
        wasm: PathBuf,
        filter: DeadLetterFilter,
    ) -> Arc<Job> {
        let job = self.add(Kind::Shadow, title, back);
        let running = job.clone();
        let handle = tokio::runtime::Handle::current();
        tokio::task::spawn_blocking(move || {
            handle.block_on(async move {
                let planned = store.dead_letters_count(&filter).await.unwrap_or(0);
                running.update(|s| s.planned = u64::try_from(planned).unwrap_or(0));
                let options = ShadowOptions {
                    include_replayed: true,
                    limit: None,
                };
                let mut each = |v: &Verdicts| {
                    running.update(|s| {
                        s.done += 1;
                        if s.lines.len() < SHADOW_LINES {
                            s.lines.push(verdict_line(v));
                        }
                    });
                };
                let outcome =
                    shadow::run(&config, &store, &wasm, &filter, &options, &mut each).await;
                running.update(|s| {
                    match outcome {
                        Ok(summary) => s.summary = Some(shadow::summary_json(&summary)),
                        Err(e) => s.error = Some(format!("{e:#}")),
                    }
                    s.finished = true;
                });
            });
        });
        job
    }
}

/// `None`: stopped by an operator.
async fn replay(
    ctx: &ReplayContext,
    job: &Arc<Job>,
    filter: &DeadLetterFilter,
    options: &ReplayOptions,
) -> anyhow::Result<Option<ReplayReport>> {
    let publisher = crate::dlq::replay_publisher(ctx.connection.clone()).await?;
    let seal = crate::gateway::seal_key(&ctx.store).await?;
    let mut job_progress = JobProgress(job.clone());
    let mut progress = crate::dlq::run::Metered::new(&ctx.metrics, &mut job_progress);
    let run = crate::dlq::run::replay_matching(
        &ctx.store,
        &publisher,
        &seal,
        ctx.publish_timeout,
        filter,
        options,
        &mut progress,
    );
    tokio::select! {
        report = run => report.map(Some),
        // Dropped between rows or while one awaits its confirm: that row stays unmarked
        // and the next run takes it (the engine's one window; see `dlq::run`).
        () = job.stop.cancelled() => Ok(None),
    }
}

struct JobProgress(Arc<Job>);

impl Progress for JobProgress {
    fn start(&mut self, planned: u64) {
        self.0.update(|s| s.planned = planned);
    }
    fn advance(&mut self, done: u64) {
        self.0.update(|s| s.done = done);
    }
    fn finish(&mut self, _: &ReplayReport) {}
}

fn verdict_line(v: &Verdicts) -> String {
    let now = match &v.now {
        Now::Ack => "ack".to_owned(),
        Now::Retry { reason, .. } => format!("retry: {reason}"),
        Now::DeadLetter { reason } => format!("still dead-letter: {reason}"),
        Now::Failure { kind, detail } => format!("failure ({kind}): {detail}"),
    };
    format!(
        "#{} {}: dead-letter ({}) → {now}; {} kv writes, {} events",
        v.id,
        v.message_id.as_deref().unwrap_or("-"),
        v.then_reason,
        v.kv_writes.len(),
        v.events.len()
    )
}
