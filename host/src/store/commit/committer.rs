//! Group commit: concurrent deliveries hand their `CommitRequest` to one task, which commits
//! whatever is queued as one batch. One fsync (SQLite) or one round of COMMIT (PostgreSQL)
//! then serves many deliveries, which is how the throughput goals are reached.
//!
//! A submission may hold several requests that must share one transaction
//! ([`CommitterHandle::commit_all`]: the acked messages of one `handle-batch` call); the
//! task never splits a submission between transactions unless its own kv keys exceed
//! [`MAX_KV_KEYS_PER_COMMIT`].
//!
//! `concurrency` lets several batches commit at once (each on its own connection). The
//! default is one: on the 2-core benchmark machine four concurrent batches on PostgreSQL
//! were no faster (bench/README.md), and SQLite has a single writer anyway.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{Notify, Semaphore, mpsc, oneshot};

use super::handoff::{Handoff, Permit, handed_rows};
use super::request::{
    CommitOutcome, CommitRequest, Committed, MAX_KV_KEYS_PER_COMMIT, distinct_keys,
};
use crate::store::{Store, StoreError};

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

/// One submission: requests committed in one transaction, answered together.
type Job = (
    Vec<CommitRequest>,
    oneshot::Sender<Result<Vec<CommitOutcome>, StoreError>>,
);

/// Spawns the group-commit task.
pub struct GroupCommitter;

/// Submits requests to the group-commit task. Cheap to clone; the task ends when the last
/// handle is dropped (after finishing what was queued).
#[derive(Clone)]
pub struct CommitterHandle {
    tx: mpsc::Sender<Job>,
    outbox_committed: Arc<Notify>,
    handoff: Handoff,
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
        let handoff = Handoff::default();
        let wakes = Wakes {
            outbox_committed: outbox_committed.clone(),
            handoff: handoff.clone(),
        };
        tokio::spawn(run(store, config, rx, wakes));
        CommitterHandle {
            tx,
            outbox_committed,
            handoff,
        }
    }
}

impl CommitterHandle {
    /// Commits `req` in the next batch. `Err` means it is not committed (the whole batch
    /// failed): do not ack.
    pub async fn commit(&self, req: CommitRequest) -> Result<CommitOutcome, StoreError> {
        let mut outcomes = self.commit_all(vec![req]).await?;
        outcomes
            .pop()
            .ok_or_else(|| StoreError::Unavailable("the group-commit task gave no outcome".into()))
    }

    /// Commits `reqs` together in one transaction (with whatever else is queued), outcomes
    /// in order; each request still stands alone (a conflicting or refused one does not sink
    /// the others). Several transactions only when their kv keys add up to more than
    /// [`MAX_KV_KEYS_PER_COMMIT`]. `Err`: none of them is committed (as for [`Self::commit`]).
    pub async fn commit_all(
        &self,
        reqs: Vec<CommitRequest>,
    ) -> Result<Vec<CommitOutcome>, StoreError> {
        if reqs.is_empty() {
            return Ok(Vec::new());
        }
        let (reply, answer) = oneshot::channel();
        self.tx
            .send((reqs, reply))
            .await
            .map_err(|_| StoreError::Unavailable("the group-commit task has stopped".into()))?;
        answer.await.map_err(|_| {
            StoreError::Unavailable("the group-commit task stopped before answering".into())
        })?
    }

    /// Notified (`notify_one`, so a wake-up is never lost) after every batch that committed
    /// outbox rows to the table (not handed over): the in-process relay waits on it.
    pub fn outbox_committed(&self) -> Arc<Notify> {
        self.outbox_committed.clone()
    }

    /// Where the in-process relay takes committed rows straight from the commit (immediate
    /// dispatch; see `handoff`).
    pub fn handoff(&self) -> Handoff {
        self.handoff.clone()
    }
}

/// Who hears of committed outbox rows: the in-process relay, in memory or woken to claim.
#[derive(Clone)]
struct Wakes {
    outbox_committed: Arc<Notify>,
    handoff: Handoff,
}

async fn run(store: Store, config: CommitterConfig, mut rx: mpsc::Receiver<Job>, wakes: Wakes) {
    let max_batch = config.max_batch.max(1);
    let slots = Arc::new(Semaphore::new(config.concurrency.max(1)));
    while let Some(first) = rx.recv().await {
        // Wait for a free slot before collecting: requests arriving meanwhile join this batch.
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        // `max_batch` counts requests; a submission of several counts them all.
        let mut requests = first.0.len();
        let mut jobs: Vec<Job> = Vec::with_capacity(max_batch);
        jobs.push(first);
        if !config.linger.is_zero() {
            let deadline = tokio::time::Instant::now() + config.linger;
            while requests < max_batch {
                match tokio::time::timeout_at(deadline, rx.recv()).await {
                    Ok(Some(job)) => {
                        requests += job.0.len();
                        jobs.push(job);
                    }
                    Ok(None) | Err(_) => break,
                }
            }
        }
        while requests < max_batch {
            match rx.try_recv() {
                Ok(job) => {
                    requests += job.0.len();
                    jobs.push(job);
                }
                Err(_) => break,
            }
        }
        let store = store.clone();
        let wakes = wakes.clone();
        tokio::spawn(async move {
            commit_jobs(&store, jobs, &wakes).await;
            drop(slot);
        });
    }
    // Let the batches in flight finish before the task (and the last handle) is gone.
    let _ = slots.acquire_many(config.concurrency.max(1) as u32).await;
}

/// Commits `jobs` in as few transactions as their kv keys allow (whole submissions per
/// transaction), answering each transaction's submissions as soon as it is done.
async fn commit_jobs(store: &Store, jobs: Vec<Job>, wakes: &Wakes) {
    let mut group: Vec<Job> = Vec::new();
    let mut keys = 0;
    for job in jobs {
        let n: usize = job.0.iter().map(distinct_keys).sum();
        if !group.is_empty() && keys + n > MAX_KV_KEYS_PER_COMMIT {
            commit_group(store, std::mem::take(&mut group), wakes).await;
            keys = 0;
        }
        keys += n;
        group.push(job);
    }
    if !group.is_empty() {
        commit_group(store, group, wakes).await;
    }
}

async fn commit_group(store: &Store, jobs: Vec<Job>, wakes: &Wakes) {
    let (submissions, replies): (Vec<_>, Vec<_>) = jobs.into_iter().unzip();
    let sizes: Vec<usize> = submissions.iter().map(Vec::len).collect();
    let requests: Vec<CommitRequest> = submissions.into_iter().flatten().collect();
    let keys: usize = requests.iter().map(distinct_keys).sum();
    let rows: usize = requests.iter().map(|r| r.outbox.len()).sum();
    let batch = requests.len();
    let began = Instant::now();
    // Only a lone submission can exceed the keys of one transaction (see `commit_jobs`);
    // `commit_batch` then splits it at request boundaries, and hands nothing over.
    let (committed, permit) = if keys > MAX_KV_KEYS_PER_COMMIT {
        let committed = store
            .commit_batch(&requests)
            .await
            .map(|outcomes| Committed {
                outcomes,
                unleased: rows,
                ..Committed::default()
            });
        (committed, None)
    } else {
        let permit = (rows > 0).then(|| wakes.handoff.permit(rows)).flatten();
        let lease = permit.as_ref().map(Permit::lease);
        (store.commit_handing(&requests, lease).await, permit)
    };
    match committed {
        Ok(Committed {
            outcomes,
            handed,
            unleased,
            at,
        }) => {
            if let Some(permit) = permit {
                permit.hand(began, handed_rows(&handed, at, requests));
            }
            let mut outcomes = outcomes.into_iter();
            for (reply, size) in replies.into_iter().zip(sizes) {
                // The caller may have gone away (cancelled); its effects still committed.
                let _ = reply.send(Ok(outcomes.by_ref().take(size).collect()));
            }
            if unleased > 0 {
                wakes.outbox_committed.notify_one();
            }
        }
        Err(e) => {
            drop(permit);
            tracing::warn!(
                store = %store.redacted_url(),
                batch,
                error = %e,
                "group commit failed; no delivery of the batch is committed"
            );
            for reply in replies {
                let _ = reply.send(Err(e.clone()));
            }
        }
    }
}
