//! Group commit of "published" marks.
//!
//! The relay hands over each row id the moment that row's own confirm arrives; the marker
//! writes everything received so far in one `UPDATE ... WHERE id IN (...)`, and starts the
//! next write as soon as the previous one returns (no timer, no waiting for a batch to fill).
//! So a row is never marked before its confirm, and a crash republishes only rows whose
//! confirm arrived but whose mark had not committed yet (G3; the relay bounds those by its
//! in-flight window, which counts a row until its mark commits).
//!
//! A store failure loses nothing: the ids stay in memory and the write is retried with
//! backoff; rows the marker finally gives up on (store still down when the session ends)
//! keep their lease and are republished after it expires (downstream inboxes dedupe by
//! `message_id`).

use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::store::Store;

/// Write attempts for the last ids after the relay session closed the channel.
const FINAL_ATTEMPTS: u32 = 3;

/// The session's side of the marker.
pub(super) struct Marker {
    ids: mpsc::UnboundedSender<i64>,
    task: JoinHandle<()>,
}

impl Marker {
    /// Starts the marker; the receiver reports the ids of each committed write (as handed
    /// over, whether or not another relay had marked some already).
    pub fn spawn(store: Store) -> (Marker, mpsc::UnboundedReceiver<Vec<i64>>) {
        let (ids, rx) = mpsc::unbounded_channel();
        let (done_tx, done) = mpsc::unbounded_channel();
        let task = tokio::spawn(run(store, rx, done_tx));
        (Marker { ids, task }, done)
    }

    /// A handle for publish tasks.
    pub fn sender(&self) -> MarkSender {
        MarkSender(self.ids.clone())
    }

    /// No more ids (every [`MarkSender`] must be gone too): writes what is left (a few
    /// attempts), then returns.
    pub async fn close(self) {
        drop(self.ids);
        if let Err(e) = self.task.await {
            tracing::error!(error = %e, "outbox marker task failed; unmarked rows are republished after their lease");
        }
    }
}

/// Hands confirmed row ids to the marker.
#[derive(Clone)]
pub(super) struct MarkSender(mpsc::UnboundedSender<i64>);

impl MarkSender {
    /// Row `id` was confirmed by the broker: mark it published.
    pub fn confirmed(&self, id: i64) {
        // The task only ends once every sender is gone (or it panicked: nothing to do then
        // but let the lease expire).
        let _ = self.0.send(id);
    }
}

async fn run(
    store: Store,
    mut ids: mpsc::UnboundedReceiver<i64>,
    done: mpsc::UnboundedSender<Vec<i64>>,
) {
    let mut batch: Vec<i64> = Vec::new();
    let mut open = true;
    let mut failures: u32 = 0;
    loop {
        if batch.is_empty() {
            match ids.recv().await {
                Some(id) => batch.push(id),
                None => return,
            }
        }
        loop {
            match ids.try_recv() {
                Ok(id) => batch.push(id),
                Err(mpsc::error::TryRecvError::Empty) => break,
                Err(mpsc::error::TryRecvError::Disconnected) => {
                    open = false;
                    break;
                }
            }
        }
        match store.outbox_mark_published_many(&batch).await {
            Ok(_) => {
                let _ = done.send(std::mem::take(&mut batch));
                failures = 0;
            }
            Err(e) => {
                failures += 1;
                if !open && failures >= FINAL_ATTEMPTS {
                    tracing::warn!(rows = batch.len(), error = %e, "could not mark confirmed outbox rows published; they are republished after their lease expires");
                    return;
                }
                tracing::warn!(rows = batch.len(), error = %e, "could not mark confirmed outbox rows published; retrying");
                let delay = Duration::from_millis(50 << failures.min(6));
                tokio::time::sleep(delay).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::store::{CommitRequest, NewOutboxRow};

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn marks_what_it_is_given_in_few_writes() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("store.db").display());
        let store = Store::connect(&url, 4).await.unwrap();
        store.migrate().await.unwrap();
        let rows: Vec<CommitRequest> = (0..300)
            .map(|i| CommitRequest {
                route: "r".into(),
                inbox_key: format!("k{i}"),
                namespace: "ns".into(),
                reads: vec![],
                writes: vec![],
                outbox: vec![NewOutboxRow {
                    event_id: uuid::Uuid::now_v7(),
                    route: "r".into(),
                    plugin: "p".into(),
                    exchange: "x".into(),
                    routing_key: "k".into(),
                    headers: vec![],
                    content_type: None,
                    payload: vec![],
                    ordering_key: String::new(),
                }],
            })
            .collect();
        store.commit_batch(&rows).await.unwrap();
        let leased = store.outbox_pending(300, "r1", 60_000).await.unwrap();

        let (marker, mut done) = Marker::spawn(store.clone());
        let marks = marker.sender();
        // Only the first 250 were "confirmed".
        for row in &leased[..250] {
            marks.confirmed(row.id);
        }
        let mut reported = Vec::new();
        while reported.iter().sum::<usize>() < 250 {
            let n = tokio::time::timeout(std::time::Duration::from_secs(10), done.recv())
                .await
                .expect("the marker reports its writes")
                .expect("marker running")
                .len();
            reported.push(n);
        }
        assert!(
            reported.len() < 250,
            "ids that arrive while a write runs share the next write: {reported:?}"
        );
        drop(marks);
        marker.close().await;
        let status = store.outbox_status().await.unwrap();
        assert_eq!(status.pending, 50, "only confirmed rows are marked");
        assert_eq!(status.leased, 50);
    }
}
