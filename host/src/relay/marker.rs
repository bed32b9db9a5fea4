//! Group commit of "published" marks.
//!
//! The relay hands over each row id the moment that row's own confirm arrives; the marker
//! writes everything received so far in one `UPDATE ... WHERE id IN (...)`, and starts the
//! next write as soon as the previous one returns (no timer, no waiting for a batch to fill).
//! So a row is never marked before its confirm, and a crash republishes only rows whose
//! confirm arrived but whose mark had not committed yet (G3; the relay bounds those by its
//! in-flight window, which counts a row until its mark commits).
//!
//! A row the write did not find is one a CDC relay read from the slot a moment before its
//! transaction became visible to other sessions (PostgreSQL decodes a commit once it is in
//! the WAL): its mark is written again shortly, until the row shows, for up to
//! [`UNSEEN_FOR`]. Without that its mark was lost, and the row stayed pending until a
//! relay restart published it again. A row whose commit became visible between the write and
//! the look that followed it is found unpublished, and written again too (that race lost one
//! mark in three or ten runs of the PostgreSQL test). A row found already published was
//! marked by another relay.
//!
//! A store failure loses nothing: the ids stay in memory and the write is retried with
//! backoff; rows the marker finally gives up on (store still down when the session ends)
//! keep their lease and are republished after it expires (downstream inboxes dedupe by
//! `message_id`).

use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::source::Source;
use crate::common::retry;
use crate::store::StoreError;

/// Write attempts for the last ids after the relay session closed the channel.
const FINAL_ATTEMPTS: u32 = 3;
/// How long a confirmed row that the store does not show yet is waited for, and how often
/// its mark is tried again meanwhile.
const UNSEEN_FOR: Duration = Duration::from_secs(5);
const UNSEEN_RETRY: Duration = Duration::from_millis(20);

/// The session's side of the marker.
pub(super) struct Marker {
    ids: mpsc::UnboundedSender<i64>,
    task: JoinHandle<()>,
}

impl Marker {
    /// Starts the marker; the receiver reports the ids of each committed write (as handed
    /// over, whether or not another relay had marked some already).
    pub fn spawn<S: Source>(source: S) -> (Marker, mpsc::UnboundedReceiver<Vec<i64>>) {
        let (ids, rx) = mpsc::unbounded_channel();
        let (done_tx, done) = mpsc::unbounded_channel();
        let task = tokio::spawn(run(source, rx, done_tx));
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

async fn run<S: Source>(
    source: S,
    mut ids: mpsc::UnboundedReceiver<i64>,
    done: mpsc::UnboundedSender<Vec<i64>>,
) {
    let mut batch: Vec<i64> = Vec::new();
    let mut open = true;
    let mut failures: u32 = 0;
    let mut backoff = retry::MARK.backoff();
    // Since when the oldest row of `batch` that the store did not show has waited.
    let mut unseen_since: Option<tokio::time::Instant> = None;
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
        let written = match source.mark_published(&batch).await {
            Ok(changed) if changed as usize >= batch.len() => Ok(Vec::new()),
            Ok(_) => unseen(&source, &batch).await,
            Err(e) => Err(e),
        };
        match written {
            Ok(unseen_ids) => {
                failures = 0;
                backoff.reset();
                let marked: Vec<i64> = batch
                    .drain(..)
                    .filter(|id| !unseen_ids.contains(id))
                    .collect();
                if !marked.is_empty() {
                    let _ = done.send(marked);
                }
                if !unseen_ids.is_empty() {
                    unseen_since.get_or_insert_with(tokio::time::Instant::now);
                    if unseen_since.is_some_and(|t| t.elapsed() > UNSEEN_FOR) {
                        tracing::warn!(rows = ?unseen_ids, "confirmed outbox rows not found in the store; not marked (a restart's backlog drain publishes them again)");
                        unseen_since = None;
                        let _ = done.send(unseen_ids);
                    } else {
                        batch = unseen_ids;
                        tokio::time::sleep(UNSEEN_RETRY).await;
                    }
                } else {
                    unseen_since = None;
                }
            }
            Err(e) => {
                failures += 1;
                if !open && failures >= FINAL_ATTEMPTS {
                    tracing::warn!(rows = batch.len(), error = %e, "could not mark confirmed outbox rows published; they are republished after their lease expires");
                    return;
                }
                tracing::warn!(rows = batch.len(), error = %e, "could not mark confirmed outbox rows published; retrying");
                tokio::time::sleep(backoff.next_delay()).await;
            }
        }
    }
}

/// Which of `batch` a mark write did not change and must write again: rows that do not exist
/// yet for this session, and rows still open (not published) although they exist: their
/// commit became visible after the write had looked (PostgreSQL), and before this look. A row
/// that exists and is not open was published already, by another relay.
async fn unseen<S: Source>(source: &S, batch: &[i64]) -> Result<Vec<i64>, StoreError> {
    let existing = source.existing_among(batch).await?;
    let open = source.unpublished_among(batch).await?;
    Ok(batch
        .iter()
        .copied()
        .filter(|id| existing.binary_search(id).is_err() || open.binary_search(id).is_ok())
        .collect())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::relay::outbox_table::OutboxTable;
    use crate::store::{CommitRequest, NewOutboxRow, Store};

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn marks_what_it_is_given_in_few_writes() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("store.db").display());
        let store = Store::connect(&url, 4).await.unwrap();
        store.migrate().await.unwrap();
        let rows: Vec<CommitRequest> = (0..300).map(row).collect();
        store.commit_batch(&rows).await.unwrap();
        let leased = store.outbox_pending(300, "r1", 60_000).await.unwrap();

        let (marker, mut done) = Marker::spawn(OutboxTable::new(store.clone(), &url));
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

    fn row(i: usize) -> CommitRequest {
        CommitRequest {
            route: "r".into(),
            inbox_key: format!("k{i}"),
            namespace: "ns".into(),
            reads: vec![],
            writes: vec![],
            outbox: vec![NewOutboxRow {
                event_id: uuid::Uuid::now_v7().to_string(),
                route: "r".into(),
                plugin: "p".into(),
                exchange: "x".into(),
                routing_key: "k".into(),
                headers: vec![],
                content_type: None,
                payload: vec![],
                ordering_key: String::new(),
            }],
        }
    }

    /// A CDC relay can confirm a row its transaction does not show yet to other sessions
    /// (on PostgreSQL, where the slot sends a commit a moment before it is visible): the
    /// mark waits for it instead of finding nothing and forgetting it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_row_that_shows_after_its_confirm_is_marked_once_it_does_on_postgres() {
        let db = crate::store::tests::TestDb::postgres().await;
        a_row_that_shows_after_its_confirm_is_marked_once_it_does(&db.store).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_row_that_shows_after_its_confirm_is_marked_once_it_does_on_sqlite() {
        let db = crate::store::tests::TestDb::sqlite().await;
        a_row_that_shows_after_its_confirm_is_marked_once_it_does(&db.store).await;
    }

    async fn a_row_that_shows_after_its_confirm_is_marked_once_it_does(store: &Store) {
        store.commit_batch(&[row(1), row(2), row(3)]).await.unwrap();
        let (marker, mut done) = Marker::spawn(OutboxTable::new(store.clone(), ""));
        let marks = marker.sender();
        for id in 1..=4 {
            marks.confirmed(id);
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        // Row 4 becomes visible only now.
        store.commit_batch(&[row(4)]).await.unwrap();
        let mut reported = Vec::new();
        while reported.len() < 4 {
            let ids = tokio::time::timeout(std::time::Duration::from_secs(10), done.recv())
                .await
                .expect("the marker reports every id")
                .expect("marker running");
            reported.extend(ids);
        }
        reported.sort_unstable();
        assert_eq!(reported, vec![1, 2, 3, 4], "each id reported once");
        drop(marks);
        marker.close().await;
        assert_eq!(
            store.outbox_status().await.unwrap().pending,
            0,
            "row 4 marked once it showed"
        );
    }
}
