//! Publishing with publisher confirms, one result per message.
//!
//! Messages queue up and go out in batches: each lane (a confirm-mode channel) takes up to
//! [`MAX_BATCH`] queued messages, publishes them back to back, waits for all their confirms
//! and hands each caller its own message's outcome. A lane carries one batch at a time, so
//! every confirm and every `basic.return` on it belongs to that batch.
//!
//! Why not take the return lapin attaches to a confirm? lapin 4.12 hands a `basic.return`
//! to whichever pending confirm it completes first when the broker acks several delivery
//! tags at once (`multiple = true`). A return is therefore matched to its message by
//! `message_id` instead: a batch holds messages with distinct ids only (a message without
//! one goes alone), and all of the batch's returns have arrived once all of its confirms
//! have (the broker sends a message's return before its ack). A batch also holds messages
//! for one exchange only: a publish to a missing exchange closes the lane's channel, and
//! that must fail only messages that went to the same missing exchange.

use std::{
    collections::{HashMap, HashSet, VecDeque},
    sync::{Arc, Mutex},
    time::Duration,
};

use futures::future::join_all;
use lapin::{
    BasicProperties, Channel, Confirmation, Connection,
    options::{BasicPublishOptions, ConfirmSelectOptions},
    types::ShortString,
};
use tokio::sync::{Notify, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::BrokerError;

/// Most messages one lane publishes before awaiting their confirms.
pub const MAX_BATCH: usize = 64;

/// One message to publish.
#[derive(Debug, Clone, Default)]
pub struct Outgoing {
    /// Target exchange; `""` is the default exchange (routing key = queue name).
    pub exchange: String,
    /// Routing key (at most 255 bytes).
    pub routing_key: String,
    /// AMQP properties: headers, `message_id`, `delivery_mode` (2 = persistent), ...
    pub properties: BasicProperties,
    /// Payload.
    pub body: Vec<u8>,
    /// Ask the broker to return the message when no queue is bound for it, so an
    /// unroutable message is an error instead of a silent drop.
    pub mandatory: bool,
}

/// Sizing of a [`ConfirmedPublisher`].
#[derive(Debug, Clone)]
pub struct PublisherOptions {
    /// Channels publishing at once, each carrying a batch of up to [`MAX_BATCH`] messages.
    pub lanes: usize,
}

impl Default for PublisherOptions {
    fn default() -> Self {
        Self { lanes: 4 }
    }
}

impl PublisherOptions {
    /// Enough lanes for about `messages` awaiting their confirms at once (at least two, so
    /// one slow batch never holds up every publish).
    pub fn for_in_flight(messages: usize) -> Self {
        Self {
            lanes: messages.div_ceil(MAX_BATCH).clamp(2, 16),
        }
    }
}

/// Why a message was not confirmed. Only [`PublishError::Invalid`] is permanent; after the
/// others, publishing the same message again later may succeed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum PublishError {
    /// The broker accepted the message but no queue was bound for its exchange and routing
    /// key (mandatory publish): it was dropped.
    #[error(
        "broker returned the message as unroutable ({reply_code} {reply_text}): no queue is \
         bound for this exchange and routing key"
    )]
    Returned {
        /// AMQP reply code, 312 (NO_ROUTE) for unroutable.
        reply_code: u16,
        /// The broker's reason.
        reply_text: String,
    },
    /// The broker refused responsibility for the message (e.g. a queue's internal error or
    /// `x-overflow = reject-publish`); publish it again later.
    #[error("broker nacked the message: it did not take responsibility for it")]
    Nacked,
    /// No confirm within the caller's timeout. The message may or may not have been stored.
    #[error("no publisher confirm within the timeout; the message may or may not be stored")]
    Timeout,
    /// The channel or connection failed; for a missing exchange the text says
    /// `NOT_FOUND - no exchange ...`.
    #[error("publish failed, channel closed: {0}")]
    ChannelClosed(String),
    /// The message cannot be expressed in AMQP (exchange or routing key over 255 bytes,
    /// headers over the connection's `frame_max`). Publishing it again never helps.
    #[error("message cannot be published: {0}")]
    Invalid(String),
}

/// Publishes with publisher confirms and reports each message's own outcome.
///
/// Cheap to clone; clones share the lanes, which stop when the last clone is dropped.
#[derive(Clone)]
pub struct ConfirmedPublisher {
    inner: Arc<Handle>,
}

/// Stops the lanes when the last publisher clone goes.
struct Handle {
    shared: Arc<Shared>,
    stop: CancellationToken,
}

impl Drop for Handle {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

struct Shared {
    conn: Arc<Connection>,
    queue: Mutex<VecDeque<Job>>,
    ready: Notify,
    /// The last group number handed out (see `Job::group`).
    groups: std::sync::atomic::AtomicU64,
}

/// A message waiting for a lane, and where its outcome goes.
struct Job {
    /// The message's non-empty `message_id`, by which a return is matched to it.
    id: Option<String>,
    exchange: ShortString,
    routing_key: ShortString,
    options: BasicPublishOptions,
    body: Vec<u8>,
    properties: BasicProperties,
    /// The caller gives up then; the lane waits for the confirm at most until then.
    deadline: Instant,
    reply: oneshot::Sender<Result<(), PublishError>>,
    /// Non-zero: the job belongs to a run published by [`ConfirmedPublisher::publish_in_order`],
    /// which goes out whole, in order, in one batch (queued contiguously).
    group: u64,
}

impl std::fmt::Debug for ConfirmedPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConfirmedPublisher")
            .field("connected", &self.is_connected())
            .field("queued", &self.inner.shared.lock_queue().len())
            .finish()
    }
}

impl ConfirmedPublisher {
    /// Opens the first lane now, so a broker that refuses channels or confirms fails here.
    pub async fn open(conn: Arc<Connection>, opts: PublisherOptions) -> Result<Self, BrokerError> {
        let first = open_lane(&conn)
            .await
            .map_err(|e| BrokerError::Channel(format!("opening a publisher channel: {e}")))?;
        let shared = Arc::new(Shared {
            conn,
            queue: Mutex::new(VecDeque::new()),
            ready: Notify::new(),
            groups: std::sync::atomic::AtomicU64::new(0),
        });
        let stop = CancellationToken::new();
        let mut first = Some(first);
        for _ in 0..opts.lanes.max(1) {
            tokio::spawn(run_lane(shared.clone(), first.take(), stop.clone()));
        }
        Ok(Self {
            inner: Arc::new(Handle { shared, stop }),
        })
    }

    /// Whether the underlying connection is up. A closed lane is reopened by its next
    /// batch; a closed connection needs a new publisher on a new connection.
    pub fn is_connected(&self) -> bool {
        self.inner.shared.conn.status().connected()
    }

    /// Publishes `msg` and waits for the broker's confirm of this very message, at most
    /// `timeout` (including waiting for a lane).
    pub async fn publish(&self, msg: Outgoing, timeout: Duration) -> Result<(), PublishError> {
        if timeout.is_zero() {
            // No budget at all: tokio's timer rounds a zero deadline up to its next tick, so
            // a fast local confirm could otherwise still win. Never publish without a budget.
            self.job(msg, Instant::now(), 0)?;
            return Err(PublishError::Timeout);
        }
        let deadline = Instant::now() + timeout;
        let (job, outcome) = self.job(msg, deadline, 0)?;
        let shared = &self.inner.shared;
        shared.lock_queue().push_back(job);
        shared.ready.notify_one();
        await_outcome(outcome, deadline).await
    }

    /// Publishes `msgs` back to back in this order on one channel, as one batch, and waits
    /// for all their confirms (at most `timeout`): RabbitMQ keeps the order of a channel's
    /// messages, so they arrive in order without waiting for each confirm in turn. Each
    /// message still gets its own outcome, in order.
    ///
    /// One batch needs one exchange, distinct non-empty message ids and at most
    /// [`MAX_BATCH`] messages (see the module doc); other runs go out one after another,
    /// each after the previous confirm, stopping at the first failure. A message that cannot
    /// be expressed in AMQP ends the run there: it gets its `Invalid` outcome and the
    /// messages after it get none (they are not published).
    pub async fn publish_in_order(
        &self,
        msgs: Vec<Outgoing>,
        timeout: Duration,
    ) -> Vec<Result<(), PublishError>> {
        let mut ids = HashSet::new();
        let one_batch = msgs.len() <= MAX_BATCH
            && msgs.iter().all(|m| {
                m.exchange == msgs[0].exchange
                    && message_id(&m.properties).is_some_and(|id| ids.insert(id.to_owned()))
            });
        let mut results = Vec::with_capacity(msgs.len());
        if !one_batch || timeout.is_zero() {
            for msg in msgs {
                let result = self.publish(msg, timeout).await;
                let failed = result.is_err();
                results.push(result);
                if failed {
                    break;
                }
            }
            return results;
        }
        let deadline = Instant::now() + timeout;
        let shared = &self.inner.shared;
        let group = shared
            .groups
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            .wrapping_add(1)
            .max(1);
        let mut jobs = Vec::with_capacity(msgs.len());
        let mut outcomes = Vec::with_capacity(msgs.len());
        let mut invalid = None;
        for msg in msgs {
            match self.job(msg, deadline, group) {
                Ok((job, outcome)) => {
                    jobs.push(job);
                    outcomes.push(outcome);
                }
                Err(e) => {
                    invalid = Some(e);
                    break;
                }
            }
        }
        if !jobs.is_empty() {
            shared.lock_queue().extend(jobs);
            shared.ready.notify_one();
        }
        for outcome in outcomes {
            results.push(await_outcome(outcome, deadline).await);
        }
        results.extend(invalid.map(Err));
        results
    }

    /// Checks `msg` against AMQP's limits and makes its job.
    fn job(
        &self,
        msg: Outgoing,
        deadline: Instant,
        group: u64,
    ) -> Result<(Job, oneshot::Receiver<Result<(), PublishError>>), PublishError> {
        let exchange = ShortString::try_new(msg.exchange)
            .map_err(|e| PublishError::Invalid(format!("exchange name: {e}")))?;
        let routing_key = ShortString::try_new(msg.routing_key)
            .map_err(|e| PublishError::Invalid(format!("routing key: {e}")))?;
        // Every message Carteiro publishes passes here: a header frame over the broker's
        // frame_max would close the whole connection, so it is refused before it goes out.
        let frame_max = usize::try_from(self.inner.shared.conn.configuration().frame_max())
            .unwrap_or(usize::MAX);
        super::outgoing::check_header_frame(&msg.properties, frame_max)
            .map_err(|e| PublishError::Invalid(e.to_string()))?;
        let (reply, outcome) = oneshot::channel();
        let job = Job {
            id: message_id(&msg.properties).map(str::to_owned),
            exchange,
            routing_key,
            options: BasicPublishOptions {
                mandatory: msg.mandatory,
                immediate: false,
            },
            body: msg.body,
            properties: msg.properties,
            deadline,
            reply,
            group,
        };
        Ok((job, outcome))
    }
}

/// One job's outcome, or a timeout at `deadline`.
async fn await_outcome(
    outcome: oneshot::Receiver<Result<(), PublishError>>,
    deadline: Instant,
) -> Result<(), PublishError> {
    match tokio::time::timeout_at(deadline, outcome).await {
        Ok(Ok(result)) => result,
        Ok(Err(_)) => Err(PublishError::ChannelClosed(
            "publisher shut down before the confirm".to_owned(),
        )),
        Err(_) => Err(PublishError::Timeout),
    }
}

impl Shared {
    fn lock_queue(&self) -> std::sync::MutexGuard<'_, VecDeque<Job>> {
        // A panic elsewhere while holding the lock leaves a plain queue behind: still usable.
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The next batch: the oldest job, and later jobs for the same exchange with distinct
    /// message ids (see the module doc). A run of [`ConfirmedPublisher::publish_in_order`]
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

fn message_id(properties: &BasicProperties) -> Option<&str> {
    properties
        .message_id()
        .as_ref()
        .map(|id| id.as_str())
        .filter(|id| !id.is_empty())
}

/// One lane: takes batches off the queue until the publisher is dropped.
async fn run_lane(shared: Arc<Shared>, mut channel: Option<Channel>, stop: CancellationToken) {
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

async fn open_lane(conn: &Connection) -> lapin::Result<Channel> {
    let channel = conn.create_channel().await?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    Ok(channel)
}

fn closed(err: lapin::Error) -> PublishError {
    PublishError::ChannelClosed(err.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::broker::testing::{test_connection, unique_name};
    use lapin::{
        ExchangeKind,
        options::{ExchangeDeclareOptions, QueueDeclareOptions},
        types::FieldTable,
    };

    const WAIT: Duration = Duration::from_secs(10);

    async fn setup() -> (ConfirmedPublisher, Channel, String) {
        let conn = Arc::new(test_connection().await);
        let admin = conn.create_channel().await.expect("channel");
        let queue = unique_name("pub");
        // x-expires: the broker removes the queue a minute after the test stops using it.
        let mut args = FieldTable::default();
        args.insert(
            "x-expires".into(),
            lapin::types::AMQPValue::LongLongInt(60_000),
        );
        admin
            .queue_declare(queue.as_str().into(), QueueDeclareOptions::default(), args)
            .await
            .expect("declare queue");
        let publisher = ConfirmedPublisher::open(conn, PublisherOptions::default())
            .await
            .expect("publisher");
        (publisher, admin, queue)
    }

    fn to(exchange: &str, routing_key: &str, body: &[u8]) -> Outgoing {
        Outgoing {
            exchange: exchange.to_owned(),
            routing_key: routing_key.to_owned(),
            body: body.to_vec(),
            mandatory: true,
            ..Default::default()
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn unroutable_mandatory_publish_is_returned() {
        let (publisher, admin, queue) = setup().await;
        let exchange = unique_name("ex");
        let opts = ExchangeDeclareOptions {
            auto_delete: true,
            ..Default::default()
        };
        admin
            .exchange_declare(
                exchange.as_str().into(),
                ExchangeKind::Direct,
                opts,
                FieldTable::default(),
            )
            .await
            .expect("declare exchange");

        let err = publisher
            .publish(to(&exchange, "nobody-binds-this", b"x"), WAIT)
            .await;
        match err {
            Err(PublishError::Returned {
                reply_code,
                reply_text,
            }) => {
                assert_eq!((reply_code, reply_text.as_str()), (312, "NO_ROUTE"));
            }
            other => panic!("expected Returned, got {other:?}"),
        }
        let err = publisher
            .publish(to("", &unique_name("no-such-queue"), b"x"), WAIT)
            .await;
        assert!(matches!(err, Err(PublishError::Returned { .. })), "{err:?}");
        // Still usable, and routable messages are confirmed.
        publisher
            .publish(to("", &queue, b"ok"), WAIT)
            .await
            .expect("routable");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn missing_exchange_fails_only_that_publish() {
        let (publisher, _admin, queue) = setup().await;
        let err = publisher
            .publish(to(&unique_name("absent"), "k", b"x"), WAIT)
            .await;
        match err {
            Err(PublishError::ChannelClosed(text)) => assert!(text.contains("NOT_FOUND"), "{text}"),
            other => panic!("expected ChannelClosed, got {other:?}"),
        }
        publisher
            .publish(to("", &queue, b"ok"), WAIT)
            .await
            .expect("lane reopened");
        assert!(publisher.is_connected());
    }

    /// Distinct ids: the messages share batches, and returns are matched by id.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_publishes_with_ids_each_get_their_own_confirm() {
        concurrent_publishes(true).await;
    }

    /// Without ids every message goes alone.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_publishes_without_ids_each_get_their_own_confirm() {
        concurrent_publishes(false).await;
    }

    async fn concurrent_publishes(with_ids: bool) {
        let (publisher, admin, queue) = setup().await;
        let missing = unique_name("nowhere");
        let tasks: Vec<_> = (0..200)
            .map(|i| {
                let publisher = publisher.clone();
                // Every fifth message is unroutable: only those may come back as Returned.
                let target = if i % 5 == 0 {
                    missing.clone()
                } else {
                    queue.clone()
                };
                tokio::spawn(async move {
                    let body = format!("message {i}").into_bytes();
                    let mut msg = to("", &target, &body);
                    if with_ids {
                        msg.properties = msg
                            .properties
                            .with_message_id(uuid::Uuid::now_v7().to_string().into());
                    }
                    (i, publisher.publish(msg, Duration::from_secs(30)).await)
                })
            })
            .collect();
        for task in tasks {
            let (i, result) = task.await.expect("task");
            match (i % 5 == 0, result) {
                (true, Err(PublishError::Returned { .. })) | (false, Ok(())) => {}
                (unroutable, other) => {
                    panic!("message {i} (unroutable: {unroutable}) got {other:?}")
                }
            }
        }
        let passive = QueueDeclareOptions {
            passive: true,
            ..Default::default()
        };
        let q = admin
            .queue_declare(queue.as_str().into(), passive, FieldTable::default())
            .await
            .expect("passive declare");
        assert_eq!(q.message_count(), 160);
    }

    /// Runs of several keys at once, each run in order on its own channel: every key's
    /// messages reach the queue in order, and one returned message in the middle of a run
    /// fails alone (the rest of its run is confirmed, the caller decides what that means).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn runs_published_in_order_arrive_in_order_with_their_own_outcomes() {
        let (publisher, admin, queue) = setup().await;
        let missing = unique_name("nowhere");
        let tasks: Vec<_> = (0..6)
            .map(|key| {
                let publisher = publisher.clone();
                let (queue, missing) = (queue.clone(), missing.clone());
                tokio::spawn(async move {
                    let mut outcomes = Vec::new();
                    // 150 messages per key in runs of 50: each run waits for the one before.
                    for run in 0..3 {
                        let msgs = (0..50)
                            .map(|i| {
                                let seq = run * 50 + i;
                                // Key 0's 75th message routes nowhere.
                                let target = if key == 0 && seq == 75 {
                                    &missing
                                } else {
                                    &queue
                                };
                                let mut msg = to("", target, format!("{key}/{seq}").as_bytes());
                                msg.properties = msg
                                    .properties
                                    .with_message_id(uuid::Uuid::now_v7().to_string().into());
                                msg
                            })
                            .collect();
                        outcomes.extend(publisher.publish_in_order(msgs, WAIT).await);
                    }
                    (key, outcomes)
                })
            })
            .collect();
        for task in tasks {
            let (key, outcomes) = task.await.expect("task");
            assert_eq!(outcomes.len(), 150);
            for (seq, outcome) in outcomes.into_iter().enumerate() {
                match (key == 0 && seq == 75, outcome) {
                    (true, Err(PublishError::Returned { .. })) | (false, Ok(())) => {}
                    (returned, other) => {
                        panic!("{key}/{seq} (unroutable: {returned}) got {other:?}")
                    }
                }
            }
        }
        let mut last: HashMap<String, i64> = HashMap::new();
        let mut count = 0;
        while let Some(m) = admin
            .basic_get(
                queue.as_str().into(),
                lapin::options::BasicGetOptions { no_ack: true },
            )
            .await
            .expect("get")
        {
            let text = String::from_utf8(m.delivery.data.clone()).expect("utf-8");
            let (key, seq) = text.split_once('/').expect("key/seq");
            let seq: i64 = seq.parse().expect("seq");
            let before = last.insert(key.to_owned(), seq).unwrap_or(-1);
            assert!(seq > before, "{key}/{seq} arrived after {key}/{before}");
            count += 1;
        }
        assert_eq!(count, 6 * 150 - 1);
    }

    /// A run one batch cannot carry (a repeated id) goes out one message after another,
    /// stopping at the first failure; an invalid message ends a run with its own error.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn runs_that_cannot_share_a_batch_go_one_by_one_and_stop_at_a_failure() {
        let (publisher, _admin, queue) = setup().await;
        let same = |body: &[u8]| {
            let mut msg = to("", &queue, body);
            msg.properties = msg.properties.with_message_id("same-id".into());
            msg
        };
        let out = publisher
            .publish_in_order(vec![same(b"a"), same(b"b")], WAIT)
            .await;
        assert!(out.iter().all(Result::is_ok), "{out:?}");
        assert_eq!(out.len(), 2);
        let mut bad = to("", &queue, b"x");
        bad.routing_key = "r".repeat(300);
        let out = publisher
            .publish_in_order(vec![same(b"c"), bad, same(b"d")], WAIT)
            .await;
        assert_eq!(out.len(), 2, "{out:?}");
        assert!(out[0].is_ok());
        assert!(matches!(out[1], Err(PublishError::Invalid(_))), "{out:?}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn timeout_and_invalid_names_are_reported() {
        let (publisher, _admin, queue) = setup().await;
        let err = publisher
            .publish(to("", &queue, b"x"), Duration::ZERO)
            .await;
        assert!(matches!(err, Err(PublishError::Timeout)), "{err:?}");
        let err = publisher
            .publish(to("", &"k".repeat(256), b"x"), WAIT)
            .await;
        assert!(matches!(err, Err(PublishError::Invalid(_))), "{err:?}");
        publisher
            .publish(to("", &queue, b"ok"), WAIT)
            .await
            .expect("still works");
    }
}
