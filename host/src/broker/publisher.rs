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
//!
//! - this file: what callers use — [`ConfirmedPublisher`], [`Outgoing`], [`PublishError`] —
//!   and the checks a message passes before it is queued;
//! - `lane`: the queue of jobs, how a batch is taken from it, and the lanes that publish
//!   batches and hand each caller its outcome.

use std::{
    collections::{HashSet, VecDeque},
    sync::{Arc, Mutex},
    time::Duration,
};

use lapin::{BasicProperties, Connection, options::BasicPublishOptions, types::ShortString};
use tokio::sync::{Notify, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::BrokerError;
use lane::{Job, Shared, message_id, open_lane, run_lane};

mod lane;
#[cfg(test)]
mod tests;

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
