//! The lanes behind a [`ConfirmedPublisher`](super::ConfirmedPublisher): the queue of jobs,
//! how a batch is taken from it (one exchange, distinct message ids; see `publisher`), and
//! the lanes, each a confirm-mode channel that publishes one batch at a time and hands
//! every caller its own message's outcome.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};

use futures::future::join_all;
use lapin::{
    BasicProperties, Channel, Confirmation, Connection,
    options::{BasicPublishOptions, ConfirmSelectOptions},
    types::ShortString,
};
use tokio::sync::{Notify, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{MAX_BATCH, PublishError};

/// The jobs every lane takes its batches from, and the connection the lanes publish on.
pub(super) struct Shared {
    pub(super) conn: Arc<Connection>,
    pub(super) queue: Mutex<VecDeque<Job>>,
    pub(super) ready: Notify,
    /// The last group number handed out (see `Job::group`).
    pub(super) groups: std::sync::atomic::AtomicU64,
}

/// A message waiting for a lane, and where its outcome goes.
pub(super) struct Job {
    /// The message's non-empty `message_id`, by which a return is matched to it.
    pub(super) id: Option<String>,
    pub(super) exchange: ShortString,
    pub(super) routing_key: ShortString,
    pub(super) options: BasicPublishOptions,
    pub(super) body: Vec<u8>,
    pub(super) properties: BasicProperties,
    /// The caller gives up then; the lane waits for the confirm at most until then.
    pub(super) deadline: Instant,
    pub(super) reply: oneshot::Sender<Result<(), PublishError>>,
    /// Non-zero: the job belongs to a run published by `ConfirmedPublisher::publish_in_order`,
    /// which goes out whole, in order, in one batch (queued contiguously).
    pub(super) group: u64,
}

impl Shared {
    pub(super) fn lock_queue(&self) -> std::sync::MutexGuard<'_, VecDeque<Job>> {
        // A panic elsewhere while holding the lock leaves a plain queue behind: still usable.
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The next batch: the oldest job, and later jobs for the same exchange with distinct
    /// message ids (see `publisher`). A run of `ConfirmedPublisher::publish_in_order`
    /// joins a batch whole or not at all, so that its messages share one channel in order.
    /// Jobs whose caller gave up are dropped here.
    fn take_batch(&self) -> Vec<Job> {
        let mut queue = self.lock_queue();
        queue.retain(|job| !job.reply.is_closed());
        let Some(first) = queue.pop_front() else {
            return Vec::new();
        };
        let mut batch = vec![first];
        // The rest of the first job's run.
        while batch[0].group != 0 && queue.front().is_some_and(|j| j.group == batch[0].group) {
            batch.extend(queue.pop_front());
        }
        let mut ids = HashSet::new();
        let batchable = batch
            .iter()
            .all(|j| j.id.as_ref().is_some_and(|id| ids.insert(id.clone())));
        let exchange = batch[0].exchange.clone();
        if batchable {
            let mut rest = VecDeque::with_capacity(queue.len());
            while let Some(job) = queue.pop_front() {
                // A job and the rest of its run (queued contiguously), taken together.
                let mut run = vec![job];
                while run[0].group != 0 && queue.front().is_some_and(|j| j.group == run[0].group) {
                    run.extend(queue.pop_front());
                }
                let mut run_ids = HashSet::new();
                let joins = batch.len() + run.len() <= MAX_BATCH
                    && run.iter().all(|j| {
                        j.exchange == exchange
                            && j.id
                                .as_ref()
                                .is_some_and(|id| !ids.contains(id) && run_ids.insert(id.clone()))
                    });
                if joins {
                    ids.extend(run_ids);
                    batch.extend(run);
                } else {
                    rest.extend(run);
                }
            }
            *queue = rest;
        }
        if !queue.is_empty() {
            // More work: wake another lane rather than leave it for this one's next turn.
            self.ready.notify_one();
        }
        batch
    }
}

pub(super) fn message_id(properties: &BasicProperties) -> Option<&str> {
    properties
        .message_id()
        .as_ref()
        .map(|id| id.as_str())
        .filter(|id| !id.is_empty())
}

/// One lane: takes batches off the queue until the publisher is dropped.
pub(super) async fn run_lane(
    shared: Arc<Shared>,
    mut channel: Option<Channel>,
    stop: CancellationToken,
) {
    loop {
        let batch = shared.take_batch();
        if batch.is_empty() {
            tokio::select! {
                () = shared.ready.notified() => continue,
                () = stop.cancelled() => break,
            }
        }
        let lane = match channel.take().filter(|c| c.status().connected()) {
            Some(lane) => lane,
            None => match open_lane(&shared.conn).await {
                Ok(lane) => lane,
                Err(e) => {
                    let error = closed(e);
                    for job in batch {
                        let _ = job.reply.send(Err(error.clone()));
                    }
                    continue;
                }
            },
        };
        if publish_batch(&lane, batch).await {
            channel = Some(lane);
        } else {
            // Confirms still outstanding: a late confirm or return on this channel could be
            // taken for the next batch's. Close it; the next batch opens a fresh one.
            tokio::spawn(async move {
                let _ = lane.close(200, "confirm timeout".into()).await;
            });
        }
    }
    if let Some(lane) = channel {
        let _ = lane.close(200, "publisher dropped".into()).await;
    }
}

/// Publishes a batch and replies to each job. Returns false if the lane must be dropped
/// (some confirm did not arrive before its caller's deadline).
async fn publish_batch(lane: &Channel, batch: Vec<Job>) -> bool {
    let deadline = batch
        .iter()
        .map(|j| j.deadline)
        .max()
        .unwrap_or_else(Instant::now);
    let mut ids = Vec::with_capacity(batch.len());
    let mut replies = Vec::with_capacity(batch.len());
    let mut confirms = Vec::with_capacity(batch.len());
    for job in batch {
        let published = lane
            .basic_publish(
                job.exchange,
                job.routing_key,
                job.options,
                &job.body,
                job.properties,
            )
            .await;
        match published {
            Ok(confirm) => {
                ids.push(job.id);
                replies.push(job.reply);
                confirms.push(confirm);
            }
            Err(e) => {
                let _ = job.reply.send(Err(closed(e)));
            }
        }
    }
    let Ok(confirmations) = tokio::time::timeout_at(deadline, join_all(confirms)).await else {
        for reply in replies {
            let _ = reply.send(Err(PublishError::Timeout));
        }
        return false;
    };
    let outcomes = attribute(&ids, confirmations);
    for (reply, outcome) in replies.into_iter().zip(outcomes) {
        let _ = reply.send(outcome);
    }
    true
}

/// Each message's outcome from the batch's confirms, with returns matched by message id.
fn attribute(
    ids: &[Option<String>],
    confirmations: Vec<lapin::Result<Confirmation>>,
) -> Vec<Result<(), PublishError>> {
    let mut returned: HashMap<Option<String>, PublishError> = HashMap::new();
    let mut acked = Vec::with_capacity(confirmations.len());
    for confirmation in confirmations {
        let (outcome, message) = match confirmation {
            Ok(Confirmation::Ack(message)) => (Ok(()), message),
            Ok(Confirmation::Nack(message)) => (Err(PublishError::Nacked), message),
            Ok(Confirmation::NotRequested) => (
                Err(PublishError::ChannelClosed(
                    "channel is not in confirm mode".to_owned(),
                )),
                None,
            ),
            Err(e) => (Err(closed(e)), None),
        };
        if let Some(message) = message {
            let id = message_id(&message.properties).map(str::to_owned);
            returned.insert(
                id,
                PublishError::Returned {
                    reply_code: message.reply_code,
                    reply_text: message.reply_text.to_string(),
                },
            );
        }
        acked.push(outcome);
    }
    // A return whose id matches no message of the batch cannot be placed: then no ack in
    // this batch can be trusted to mean "routed" (never the case with distinct ids).
    let stray = returned
        .iter()
        .find(|(id, _)| !ids.contains(id))
        .map(|(_, error)| error.clone());
    ids.iter()
        .zip(acked)
        .map(|(id, outcome)| match (outcome, &stray) {
            (Ok(()), Some(error)) => Err(error.clone()),
            (Ok(()), None) => match returned.get(id) {
                Some(error) => Err(error.clone()),
                None => Ok(()),
            },
            (Err(e), _) => Err(e),
        })
        .collect()
}

pub(super) async fn open_lane(conn: &Connection) -> lapin::Result<Channel> {
    let channel = conn.create_channel().await?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    Ok(channel)
}

fn closed(err: lapin::Error) -> PublishError {
    PublishError::ChannelClosed(err.to_string())
}
