//! Group commit: concurrent deliveries hand their `CommitRequest` to one task, which commits
//! whatever is queued as one batch. One fsync (SQLite) or one round of COMMIT (PostgreSQL)
//! then serves many deliveries, which is how the throughput goals are reached.
//!
//! `concurrency` lets several batches commit at once (each on its own connection). The
//! default is one: on the 2-core benchmark machine four concurrent batches on PostgreSQL
//! were no faster (bench/README.md), and SQLite has a single writer anyway.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Notify, Semaphore, mpsc, oneshot};

use super::commit::key_groups;
use super::{CommitOutcome, CommitRequest, Store, StoreError};

/// Tuning for [`GroupCommitter::spawn_with`].
#[derive(Debug, Clone)]
pub struct CommitterConfig {
    /// Most requests per database transaction.
    pub max_batch: usize,
    /// After the first request arrives, wait this long for more (zero: take only what is
    /// already queued; batches then grow naturally while a commit is in progress).
    pub linger: Duration,
    /// Requests that may wait in the queue before `commit` callers are held back.
    pub queue: usize,
    /// Batches committing at the same time (each on its own connection).
    pub concurrency: usize,
}

type Job = (
    CommitRequest,
    oneshot::Sender<Result<CommitOutcome, StoreError>>,
);

/// Spawns the group-commit task.
pub struct GroupCommitter;

/// Submits requests to the group-commit task. Cheap to clone; the task ends when the last
/// handle is dropped (after finishing what was queued).
#[derive(Clone)]
pub struct CommitterHandle {
    tx: mpsc::Sender<Job>,
    outbox_committed: Arc<Notify>,
}

impl GroupCommitter {
    /// Starts the task with no linger, one batch at a time. Needs a tokio runtime.
    pub fn spawn(store: Store, max_batch: usize) -> CommitterHandle {
        let max_batch = max_batch.max(1);
        Self::spawn_with(
            store,
            CommitterConfig {
                max_batch,
                linger: Duration::ZERO,
                queue: max_batch * 4,
                concurrency: 1,
            },
        )
    }

    /// Starts the task with explicit tuning.
    pub fn spawn_with(store: Store, config: CommitterConfig) -> CommitterHandle {
        let (tx, rx) = mpsc::channel(config.queue.max(1));
        let outbox_committed = Arc::new(Notify::new());
        tokio::spawn(run(store, config, rx, outbox_committed.clone()));
        CommitterHandle {
            tx,
            outbox_committed,
        }
    }
}

impl CommitterHandle {
    /// Commits `req` in the next batch. `Err` means it is not committed (the whole batch
    /// failed): do not ack.
    pub async fn commit(&self, req: CommitRequest) -> Result<CommitOutcome, StoreError> {
        let (reply, answer) = oneshot::channel();
        self.tx
            .send((req, reply))
            .await
            .map_err(|_| StoreError::Unavailable("the group-commit task has stopped".into()))?;
        answer.await.map_err(|_| {
            StoreError::Unavailable("the group-commit task stopped before answering".into())
        })?
    }

    /// Notified (`notify_one`, so a wake-up is never lost) after every batch that committed
    /// outbox rows: the in-process relay waits on it.
    pub fn outbox_committed(&self) -> Arc<Notify> {
        self.outbox_committed.clone()
    }
}

async fn run(
    store: Store,
    config: CommitterConfig,
    mut rx: mpsc::Receiver<Job>,
    outbox_committed: Arc<Notify>,
) {
    let max_batch = config.max_batch.max(1);
    let slots = Arc::new(Semaphore::new(config.concurrency.max(1)));
    while let Some(first) = rx.recv().await {
        // Wait for a free slot before collecting: requests arriving meanwhile join this batch.
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let mut jobs: Vec<Job> = Vec::with_capacity(max_batch);
        jobs.push(first);
        if !config.linger.is_zero() {
            let deadline = tokio::time::Instant::now() + config.linger;
            while jobs.len() < max_batch {
                match tokio::time::timeout_at(deadline, rx.recv()).await {
                    Ok(Some(job)) => jobs.push(job),
                    Ok(None) | Err(_) => break,
                }
            }
        }
        while jobs.len() < max_batch {
            match rx.try_recv() {
                Ok(job) => jobs.push(job),
                Err(_) => break,
            }
        }
        let store = store.clone();
        let outbox_committed = outbox_committed.clone();
        tokio::spawn(async move {
            commit_jobs(&store, jobs, &outbox_committed).await;
            drop(slot);
        });
    }
    // Let the batches in flight finish before the task (and the last handle) is gone.
    let _ = slots.acquire_many(config.concurrency.max(1) as u32).await;
}

/// Commits `jobs` in as few transactions as their kv keys allow, answering each run's
/// deliveries as soon as its own transaction is done.
async fn commit_jobs(store: &Store, jobs: Vec<Job>, outbox_committed: &Notify) {
    let (requests, replies): (Vec<_>, Vec<_>) = jobs.into_iter().unzip();
    let groups = key_groups(&requests);
    let (mut requests, mut replies) = (requests.into_iter(), replies.into_iter());
    for group in groups {
        let n = group.len();
        let group_requests = requests.by_ref().take(n).collect();
        let group_replies = replies.by_ref().take(n).collect();
        commit_group(store, group_requests, group_replies, outbox_committed).await;
    }
}

async fn commit_group(
    store: &Store,
    requests: Vec<CommitRequest>,
    replies: Vec<oneshot::Sender<Result<CommitOutcome, StoreError>>>,
    outbox_committed: &Notify,
) {
    match store.commit_transaction(&requests).await {
        Ok(outcomes) => {
            let wrote_outbox = requests
                .iter()
                .zip(&outcomes)
                .any(|(r, o)| *o == CommitOutcome::Committed && !r.outbox.is_empty());
            for (reply, outcome) in replies.into_iter().zip(outcomes) {
                // The caller may have gone away (cancelled); its effects still committed.
                let _ = reply.send(Ok(outcome));
            }
            if wrote_outbox {
                outbox_committed.notify_one();
            }
        }
        Err(e) => {
            tracing::warn!(
                store = %store.redacted_url(),
                batch = replies.len(),
                error = %e,
                "group commit failed; no delivery of the batch is committed"
            );
            for reply in replies {
                let _ = reply.send(Err(e.clone()));
            }
        }
    }
}
