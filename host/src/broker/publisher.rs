//! Publishing with publisher confirms, one result per message.
//!
//! Each publish runs on a "lane": a confirm-mode channel that carries one message at a time.
//! Why not pipeline everything on one channel? lapin 4.12 hands a `basic.return` to whichever
//! pending confirm it completes first when the broker acks several delivery tags at once
//! (`multiple = true`), and its pending confirms live in a `HashMap`. With concurrent
//! mandatory publishes on one channel, an unroutable message could then look confirmed while
//! a routable sibling looks returned; the relay would mark an outbox row published that no
//! queue received. One message per lane makes every return belong to its lane's message;
//! concurrency comes from many lanes (channels are cheap), and a publish to a missing
//! exchange (a channel error) fails only its own lane.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use lapin::{
    BasicProperties, Channel, Confirmation, Connection,
    options::{BasicPublishOptions, ConfirmSelectOptions},
    types::ShortString,
};
use tokio::sync::Semaphore;

use super::BrokerError;

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
    /// Messages awaiting their confirm at once, i.e. channels opened at most. Throughput is
    /// about `lanes / confirm latency`.
    pub lanes: usize,
}

impl Default for PublisherOptions {
    fn default() -> Self {
        Self { lanes: 64 }
    }
}

/// Why a message was not confirmed. Only [`PublishError::Invalid`] is permanent; after the
/// others, publishing the same message again later may succeed.
#[derive(Debug, thiserror::Error)]
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
    /// The message cannot be expressed in AMQP (exchange or routing key over 255 bytes).
    #[error("message cannot be published: {0}")]
    Invalid(String),
}

/// Publishes with publisher confirms and reports each message's own outcome.
///
/// Cheap to clone; clones share the lanes. Needs the connection by `Arc` because lanes are
/// reopened on demand after a channel error.
#[derive(Clone)]
pub struct ConfirmedPublisher {
    inner: Arc<Inner>,
}

struct Inner {
    conn: Arc<Connection>,
    idle: Mutex<Vec<Channel>>,
    lanes: Semaphore,
}

impl std::fmt::Debug for ConfirmedPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConfirmedPublisher")
            .field("connected", &self.is_connected())
            .field("free_lanes", &self.inner.lanes.available_permits())
            .finish()
    }
}

impl ConfirmedPublisher {
    /// Opens the first lane now, so a broker that refuses channels or confirms fails here.
    pub async fn open(conn: Arc<Connection>, opts: PublisherOptions) -> Result<Self, BrokerError> {
        let first = open_lane(&conn)
            .await
            .map_err(|e| BrokerError::Channel(format!("opening a publisher channel: {e}")))?;
        Ok(Self {
            inner: Arc::new(Inner {
                conn,
                idle: Mutex::new(vec![first]),
                lanes: Semaphore::new(opts.lanes.max(1)),
            }),
        })
    }

    /// Whether the underlying connection is up. A closed lane is reopened by the next
    /// publish; a closed connection needs a new publisher on a new connection.
    pub fn is_connected(&self) -> bool {
        self.inner.conn.status().connected()
    }

    /// Publishes `msg` and waits for the broker's confirm of this very message, at most
    /// `timeout` (including waiting for a free lane).
    pub async fn publish(&self, msg: Outgoing, timeout: Duration) -> Result<(), PublishError> {
        let exchange = ShortString::try_new(msg.exchange)
            .map_err(|e| PublishError::Invalid(format!("exchange name: {e}")))?;
        let routing_key = ShortString::try_new(msg.routing_key)
            .map_err(|e| PublishError::Invalid(format!("routing key: {e}")))?;
        if timeout.is_zero() {
            // No budget at all: tokio's timer rounds a zero deadline up to its next tick, so
            // a fast local confirm could otherwise still win. Never publish without a budget.
            return Err(PublishError::Timeout);
        }
        let options = BasicPublishOptions {
            mandatory: msg.mandatory,
            immediate: false,
        };
        let attempt =
            self.publish_on_a_lane(exchange, routing_key, options, &msg.body, msg.properties);
        // On timeout the lane is dropped mid-flight, which closes its channel: a late return
        // or confirm can never be taken for the next message's.
        tokio::time::timeout(timeout, attempt)
            .await
            .unwrap_or(Err(PublishError::Timeout))
    }

    async fn publish_on_a_lane(
        &self,
        exchange: ShortString,
        routing_key: ShortString,
        options: BasicPublishOptions,
        body: &[u8],
        properties: BasicProperties,
    ) -> Result<(), PublishError> {
        let _permit = self
            .inner
            .lanes
            .acquire()
            .await
            .map_err(|_| PublishError::ChannelClosed("publisher shut down".to_owned()))?;
        let lane = self.take_lane().await?;
        let confirm = lane
            .basic_publish(exchange, routing_key, options, body, properties)
            .await
            .map_err(closed)?;
        let outcome = match confirm.await.map_err(closed)? {
            Confirmation::Ack(None) => Ok(()),
            Confirmation::Ack(Some(returned)) => Err(PublishError::Returned {
                reply_code: returned.reply_code,
                reply_text: returned.reply_text.to_string(),
            }),
            Confirmation::Nack(_) => Err(PublishError::Nacked),
            Confirmation::NotRequested => Err(PublishError::ChannelClosed(
                "channel is not in confirm mode".to_owned(),
            )),
        };
        // Back to the pool only once its one message is settled.
        self.lock_idle().push(lane);
        outcome
    }

    /// An idle open lane, or a new one. Lanes closed by the broker are discarded here.
    async fn take_lane(&self) -> Result<Channel, PublishError> {
        loop {
            let Some(lane) = self.lock_idle().pop() else {
                break;
            };
            if lane.status().connected() {
                return Ok(lane);
            }
        }
        open_lane(&self.inner.conn).await.map_err(closed)
    }

    fn lock_idle(&self) -> std::sync::MutexGuard<'_, Vec<Channel>> {
        // A panic elsewhere while holding the lock leaves a plain Vec behind: still usable.
        self.inner.idle.lock().unwrap_or_else(|e| e.into_inner())
    }
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

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_publishes_each_get_their_own_confirm() {
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
                    (
                        i,
                        publisher
                            .publish(to("", &target, &body), Duration::from_secs(30))
                            .await,
                    )
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
