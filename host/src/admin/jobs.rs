//! Background jobs the console and the JSON API start: a replay (the same engine as
//! `carteiro dlq replay`: oldest first, only what was not replayed yet, each row marked after
//! its confirm, rate-limited) and a shadow run of a new plugin file. Their progress is
//! polled at `/api/jobs/{id}`. A replay stopped (or lost with the process) is resumed by
//! starting the same replay again: it takes only the rows not marked yet.

use super::Refusal;
use crate::config::Config;
use crate::dlq::run::{Progress, ReplayOptions, ReplayReport};
use crate::dlq::shadow_replay::{self, ShadowOptions, Verdicts};
use crate::runtime::Runtime;
use crate::store::{DeadLetterFilter, Store};
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use tokio_util::sync::CancellationToken;

/// Jobs kept for their pages; older finished ones are dropped.
const KEPT: usize = 50;
/// Jobs of one kind that may run at once; past it a start is refused with 429. A replay
/// holds a broker channel and a store cursor, a shadow run a plugin's memory, a purge
/// the store's write lock in turns: a few at once is plenty for people.
pub const MAX_RUNNING_REPLAYS: usize = 4;
pub const MAX_RUNNING_SHADOWS: usize = 2;
pub const MAX_RUNNING_PURGES: usize = 1;
/// Per-message lines a shadow job keeps for its report.
const SHADOW_LINES: usize = 500;

/// What a job does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Replay,
    Shadow,
}

impl Kind {
    fn cap(self) -> usize {
        match self {
            Kind::Replay => MAX_RUNNING_REPLAYS,
            Kind::Shadow => MAX_RUNNING_SHADOWS,
        }
    }

    fn words(self) -> &'static str {
        match self {
            Kind::Replay => "replays",
            Kind::Shadow => "shadow runs",
        }
    }
}

fn too_many(running: usize, what: &str) -> Refusal {
    Refusal::new(
        axum::http::StatusCode::TOO_MANY_REQUESTS,
        format!(
            "429 Too Many Requests: {running} {what} are running already, the most this gateway \
             runs at once; wait for one to finish (or stop one on /jobs), then start again"
        ),
    )
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
    /// Cancelled when the job's thread has ended.
    ended: CancellationToken,
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

    /// Asks a running job to stop: a replay between two rows' publishes or while one awaits
    /// its confirm, a shadow run between two messages.
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
    /// Purges running now (they run inside their request, not as jobs).
    purges: Arc<AtomicU64>,
    /// The wasm runtime every shadow run compiles on, made by the first one.
    shadow_runtime: Mutex<Option<Arc<Runtime>>>,
}

/// A running purge; dropping it frees its place.
pub struct PurgeSlot(Arc<AtomicU64>);

impl Drop for PurgeSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Marks its job finished (with an error) if the job's thread ends without doing so: a
/// panic must not leave a job "running" forever, holding its place under the cap.
struct FinishOnDrop(Arc<Job>);

impl Drop for FinishOnDrop {
    fn drop(&mut self) {
        self.0.update(|s| {
            if !s.finished {
                s.finished = true;
                s.error = Some("the job ended unexpectedly (see the gateway's log)".into());
            }
        });
        self.0.ended.cancel();
    }
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

    /// Stops every running job and waits up to `grace` for their threads to end. The
    /// gateway calls it on shutdown: a job must not outlive it, replaying on through a
    /// connection and a store nobody watches any more (or holding its runtime's shutdown).
    pub async fn stop_all(&self, grace: std::time::Duration) {
        let running: Vec<_> = self
            .list()
            .into_iter()
            .filter(|j| !j.ended.is_cancelled())
            .collect();
        for job in &running {
            job.stop();
        }
        let ended = futures::future::join_all(running.iter().map(|j| j.ended.cancelled()));
        if tokio::time::timeout(grace, ended).await.is_err() {
            for job in running.iter().filter(|j| !j.ended.is_cancelled()) {
                tracing::warn!(job = job.id, title = %job.title, ?grace, "a console job did not stop within its grace period; it ends with the process");
            }
        }
    }

    /// A place for one more purge, or 429.
    pub fn purge_slot(&self) -> Result<PurgeSlot, Refusal> {
        let running = self.purges.fetch_add(1, Ordering::SeqCst);
        let slot = PurgeSlot(self.purges.clone());
        if running >= MAX_RUNNING_PURGES as u64 {
            return Err(too_many(usize::try_from(running).unwrap_or(0), "purges"));
        }
        Ok(slot)
    }

    /// The runtime shadow runs share (one engine for all of them, made on first use).
    pub fn shadow_runtime(&self, config: &Config) -> anyhow::Result<Arc<Runtime>> {
        let mut shared = self
            .shadow_runtime
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(runtime) = shared.as_ref() {
            return Ok(runtime.clone());
        }
        let runtime = crate::services::new_runtime(config)?;
        *shared = Some(runtime.clone());
        Ok(runtime)
    }

    fn add(&self, kind: Kind, title: String, back: String) -> Result<Arc<Job>, Refusal> {
        let mut jobs = self.jobs.lock().unwrap_or_else(PoisonError::into_inner);
        let running = jobs
            .values()
            .filter(|j| j.kind == kind && !j.state().finished)
            .count();
        if running >= kind.cap() {
            return Err(too_many(running, kind.words()));
        }
        let id = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        let job = Arc::new(Job {
            id,
            kind,
            title,
            back,
            started_ms: crate::common::now_ms(),
            state: Mutex::default(),
            stop: CancellationToken::new(),
            ended: CancellationToken::new(),
        });
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
        Ok(job)
    }

    /// Starts a replay of what `filter` selects, unless [`MAX_RUNNING_REPLAYS`] run.
    pub fn start_replay(
        &self,
        ctx: ReplayContext,
        title: String,
        back: String,
        filter: DeadLetterFilter,
        options: ReplayOptions,
    ) -> Result<Arc<Job>, Refusal> {
        let job = self.add(Kind::Replay, title, back)?;
        let running = job.clone();
        tracing::info!(job = job.id, title = %job.title, rate = ?options.rate_per_sec, "console replay started");
        // The engine's progress callback is not `Send`: the run gets a thread of its own.
        let handle = tokio::runtime::Handle::current();
        tokio::task::spawn_blocking(move || {
            let _finish = FinishOnDrop(running.clone());
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
        Ok(job)
    }

    /// Starts a shadow run of `file` on what `filter` selects (nothing committed or
    /// published), unless [`MAX_RUNNING_SHADOWS`] run.
    pub fn start_shadow(
        &self,
        config: Arc<Config>,
        store: Store,
        title: String,
        back: String,
        file: super::shadow_file::ShadowFile,
        filter: DeadLetterFilter,
    ) -> Result<Arc<Job>, Refusal> {
        let runtime = self.shadow_runtime(&config).map_err(|e| {
            Refusal::new(
                axum::http::StatusCode::SERVICE_UNAVAILABLE,
                format!("{e:#}"),
            )
        })?;
        let job = self.add(Kind::Shadow, title, back)?;
        let running = job.clone();
        let handle = tokio::runtime::Handle::current();
        tokio::task::spawn_blocking(move || {
            let _finish = FinishOnDrop(running.clone());
            handle.block_on(async move {
                let planned = store.dead_letters_count(&filter).await.unwrap_or(0);
                running.update(|s| s.planned = u64::try_from(planned).unwrap_or(0));
                let options = ShadowOptions {
                    include_replayed: true,
                    limit: None,
                    sha256: Some(file.sha256.clone()),
                };
                let mut each = |v: &Verdicts| {
                    running.update(|s| {
                        s.done += 1;
                        if s.lines.len() < SHADOW_LINES {
                            s.lines.push(verdict_line(v));
                        }
                    });
                };
                let run = shadow_replay::run(
                    &config, &runtime, &store, &file.path, &filter, &options, &mut each,
                );
                // Nothing is committed or published: stopping between messages is safe.
                let outcome = tokio::select! {
                    outcome = run => Some(outcome),
                    () = running.stop.cancelled() => None,
                };
                running.update(|s| {
                    match outcome {
                        Some(Ok(summary)) => {
                            s.summary = Some(shadow_replay::summary_json(&summary));
                        }
                        Some(Err(e)) => s.error = Some(format!("{e:#}")),
                        None => s.stopped = true,
                    }
                    s.finished = true;
                });
            });
        });
        Ok(job)
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
    let seal = crate::services::seal_key(&ctx.store).await?;
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
    let now = &v.now;
    format!(
        "#{} {}: dead-letter ({}) → {now}; {} kv writes, {} events",
        v.id,
        v.message_id.as_deref().unwrap_or("-"),
        v.then_reason,
        v.kv_writes.len(),
        v.events.len()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn running_jobs_are_capped_per_kind() {
        let jobs = Jobs::default();
        let shadows: Vec<_> = (0..MAX_RUNNING_SHADOWS)
            .map(|_| {
                jobs.add(Kind::Shadow, "s".into(), "/".into())
                    .expect("room")
            })
            .collect();
        let Refusal { status, why } = jobs
            .add(Kind::Shadow, "s".into(), "/".into())
            .err()
            .expect("over the cap");
        assert_eq!(status, axum::http::StatusCode::TOO_MANY_REQUESTS);
        assert!(why.contains("shadow runs are running already"), "{why}");
        // Another kind has its own cap.
        jobs.add(Kind::Replay, "r".into(), "/".into())
            .expect("a replay still starts");
        // A job that ends (even by a panic of its thread) frees its place.
        drop(FinishOnDrop(shadows[0].clone()));
        assert!(shadows[0].state().finished);
        assert!(shadows[0].state().error.is_some());
        jobs.add(Kind::Shadow, "s".into(), "/".into())
            .expect("room again");
    }

    #[test]
    fn shadow_runs_share_one_runtime() {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = crate::config::load_str(
            "version = 1\n[broker]\nurl = \"amqp://127.0.0.1\"\n[runtime]\ncompile_cache = \"\"\n",
            &dir.path().join("carteiro.toml"),
            dir.path(),
        )
        .expect("config");
        let jobs = Jobs::default();
        let first = jobs.shadow_runtime(&config).expect("runtime");
        let second = jobs.shadow_runtime(&config).expect("runtime");
        assert!(
            Arc::ptr_eq(&first, &second),
            "one engine for every shadow run"
        );
    }

    #[test]
    fn one_purge_at_a_time() {
        let jobs = Jobs::default();
        let first = jobs.purge_slot().expect("first purge");
        let Refusal { status, .. } = jobs.purge_slot().err().expect("second refused");
        assert_eq!(status, axum::http::StatusCode::TOO_MANY_REQUESTS);
        drop(first);
        jobs.purge_slot().expect("free again");
    }
}
