//! The supervised consumer of one route. lapin does not recover connections or consumers,
//! so this loop does: connect, declare, subscribe, process; on any loss, drop the dead
//! channel's in-flight work (the broker requeues it), back off with jitter, and start over.
//! A route with `batch` gathers deliveries (up to `max`, for at most `wait` after the
//! first) and hands each batch to `batch::process_batch`.

use super::acks::Acks;
use super::archiver;
use super::batch::process_batch;
use super::context::RouteContext;
use super::process::process;
use crate::broker::{
    BrokerError, ConfirmedPublisher, ConnectOptions, PublisherOptions, connect_any,
};
use crate::common::retry;
use crate::topology::{TopologyError, declare_route};
use futures::StreamExt;
use lapin::options::{BasicCancelOptions, BasicConsumeOptions, BasicQosOptions};
use lapin::types::FieldTable;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

/// Broker settings shared by every route.
#[derive(Clone)]
pub struct BrokerSettings {
    /// Every node to try, in turn (`[broker] url` or `urls`).
    pub urls: Vec<String>,
    pub connect: ConnectOptions,
    pub reconnect_max_backoff: Duration,
    /// How long in-flight deliveries may take to finish after SIGTERM.
    pub shutdown_grace: Duration,
}

/// Why a route stopped for good (the gateway exits non-zero).
#[derive(Debug, thiserror::Error)]
pub enum RouteError {
    #[error("route `{queue}`: {source}")]
    Topology {
        queue: String,
        source: TopologyError,
    },
}

/// Runs the route until `shutdown`; returns an error only for problems retrying cannot fix.
pub async fn run_route(
    ctx: Arc<RouteContext>,
    broker: BrokerSettings,
    shutdown: CancellationToken,
) -> Result<(), RouteError> {
    ctx.deps.metrics.route_started(&ctx.settings.queue);
    let mut backoff = retry::reconnect(broker.reconnect_max_backoff).backoff();
    while !shutdown.is_cancelled() {
        match session(&ctx, &broker, &shutdown, &mut backoff).await {
            Ok(()) => {}
            Err(SessionError::Fatal(e)) => return Err(e),
            Err(SessionError::Lost(why)) => {
                ctx.deps.metrics.set_connected(&ctx.settings.queue, false);
                ctx.deps.metrics.broker_reconnect(&ctx.settings.queue);
                let delay = backoff.next_delay();
                tracing::warn!(queue = %ctx.settings.queue, reason = %why, ?delay, "broker session lost; reconnecting");
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    _ = shutdown.cancelled() => {}
                }
            }
        }
    }
    Ok(())
}

enum SessionError {
    Fatal(RouteError),
    Lost(Lost),
}

/// Why a broker session ended before shutdown: the route reconnects.
#[derive(Debug, thiserror::Error)]
enum Lost {
    /// Connecting, or opening the confirmed publisher.
    #[error(transparent)]
    Broker(#[from] BrokerError),
    /// Declaring the route's topology failed for a reason a retry may fix.
    #[error(transparent)]
    Topology(TopologyError),
    /// A channel operation (`what`) failed.
    #[error("{what}: {source}")]
    Channel {
        what: &'static str,
        source: lapin::Error,
    },
    #[error("consumer error: {0}")]
    Consumer(lapin::Error),
    #[error("the broker cancelled the consumer")]
    Cancelled,
    #[error("connection closed")]
    Closed,
}

impl From<Lost> for SessionError {
    fn from(lost: Lost) -> Self {
        SessionError::Lost(lost)
    }
}

fn lost(what: &'static str) -> impl FnOnce(lapin::Error) -> SessionError {
    move |source| SessionError::Lost(Lost::Channel { what, source })
}

/// One connection's life: returns `Ok` only on shutdown.
async fn session(
    ctx: &Arc<RouteContext>,
    broker: &BrokerSettings,
    shutdown: &CancellationToken,
    backoff: &mut retry::Backoff,
) -> Result<(), SessionError> {
    let conn = Arc::new(
        connect_any(&broker.urls, &broker.connect)
            .await
            .map_err(Lost::from)?,
    );
    declare_route(&conn, &ctx.settings.topology)
        .await
        .map_err(|source| {
            if source.is_permanent() {
                SessionError::Fatal(RouteError::Topology {
                    queue: ctx.settings.queue.clone(),
                    source,
                })
            } else {
                SessionError::Lost(Lost::Topology(source))
            }
        })?;
    let lanes = PublisherOptions::for_in_flight(usize::from(ctx.settings.prefetch));
    let publisher = ConfirmedPublisher::open(conn.clone(), lanes)
        .await
        .map_err(Lost::from)?;
    let channel = conn.create_channel().await.map_err(lost("open channel"))?;
    channel
        .basic_qos(ctx.settings.prefetch, BasicQosOptions::default())
        .await
        .map_err(lost("basic.qos"))?;
    let tag = format!(
        "carteiro-{}-{}",
        ctx.settings.queue,
        uuid::Uuid::now_v7().simple()
    );
    let mut consumer = channel
        .basic_consume(
            ctx.settings.queue.as_str().into(),
            tag.as_str().into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .map_err(lost("basic.consume"))?;
    let (acks, acker) = Acks::start(channel.clone(), ctx.settings.queue.clone());
    let archiver_stop = shutdown.child_token();
    let archiver = tokio::spawn(archiver::run(
        ctx.clone(),
        conn.clone(),
        archiver_stop.clone(),
    ));
    let parked = tokio::spawn(archiver::watch_parked(
        ctx.clone(),
        conn.clone(),
        archiver_stop.clone(),
    ));
    ctx.deps.metrics.set_connected(&ctx.settings.queue, true);
    backoff.reset();
    tracing::info!(queue = %ctx.settings.queue, plugin = ctx.slot.plugin().name(), version = ctx.slot.plugin().version(), prefetch = ctx.settings.prefetch, "consumer started");

    let mut in_flight = JoinSet::new();
    let mut health = tokio::time::interval(Duration::from_millis(500));
    // A route with `batch`: deliveries gathered until `max` or until `wait` after the first.
    let mut gathered: Vec<lapin::message::Delivery> = Vec::new();
    let mut gathered_until: Option<tokio::time::Instant> = None;
    let outcome = loop {
        tokio::select! {
            _ = shutdown.cancelled() => break Ok(()),
            next = consumer.next() => match next {
                Some(Ok(delivery)) => match ctx.settings.batch {
                    None => {
                        in_flight.spawn(process(ctx.clone(), publisher.clone(), acks.clone(), delivery));
                    }
                    Some(batch) => {
                        gathered_until.get_or_insert_with(|| tokio::time::Instant::now() + batch.wait);
                        gathered.push(delivery);
                        if gathered.len() >= usize::from(batch.max) {
                            gathered_until = None;
                            in_flight.spawn(process_batch(ctx.clone(), publisher.clone(), acks.clone(), std::mem::take(&mut gathered)));
                        }
                    }
                },
                Some(Err(e)) => break Err(SessionError::Lost(Lost::Consumer(e))),
                None => break Err(SessionError::Lost(Lost::Cancelled)),
            },
            Some(_) = in_flight.join_next(), if !in_flight.is_empty() => {}
            _ = tokio::time::sleep_until(gathered_until.unwrap_or_else(tokio::time::Instant::now)), if gathered_until.is_some() => {
                gathered_until = None;
                in_flight.spawn(process_batch(ctx.clone(), publisher.clone(), acks.clone(), std::mem::take(&mut gathered)));
            }
            _ = health.tick() => {
                if !conn.status().connected() || !channel.status().connected() {
                    break Err(SessionError::Lost(Lost::Closed));
                }
            }
        }
        ctx.in_flight
            .store(in_flight.len(), std::sync::atomic::Ordering::Relaxed);
    };
    if outcome.is_ok() && !gathered.is_empty() {
        // Graceful stop: a batch still gathering is processed like the deliveries in flight.
        in_flight.spawn(process_batch(
            ctx.clone(),
            publisher.clone(),
            acks.clone(),
            std::mem::take(&mut gathered),
        ));
    }
    ctx.in_flight.store(0, std::sync::atomic::Ordering::Relaxed);
    archiver_stop.cancel();
    // The acker stops once the in-flight deliveries, the last holders, are gone.
    drop(acks);

    let queue = ctx.settings.queue.as_str();
    if outcome.is_ok() {
        // Graceful stop: no new deliveries; let in-flight ones finish and ack.
        let cancel = channel.basic_cancel(tag.as_str().into(), BasicCancelOptions::default());
        bounded_step(queue, "basic.cancel", cancel).await;
        let drained = tokio::time::timeout(broker.shutdown_grace, async {
            while in_flight.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            tracing::warn!(queue = %ctx.settings.queue, left = in_flight.len(), "grace period over; unfinished deliveries return to the queue");
            in_flight.abort_all();
            while in_flight.join_next().await.is_some() {}
        }
        // Every ack given to the acker goes out before the channel closes.
        if tokio::time::timeout(Duration::from_secs(5), acker)
            .await
            .is_err()
        {
            tracing::warn!(queue = %ctx.settings.queue, "acks not sent within 5 s; those deliveries return to the queue");
        }
        bounded_step(
            queue,
            "channel.close",
            channel.close(200, "shutdown".into()),
        )
        .await;
        bounded_step(
            queue,
            "connection.close",
            conn.close(200, "shutdown".into()),
        )
        .await;
        tracing::info!(queue = %ctx.settings.queue, "consumer stopped");
    } else {
        // The channel is dead: its unacked deliveries are back in the queue already, so
        // in-flight work can only fail to ack. Stop it now rather than race redeliveries.
        in_flight.abort_all();
        acker.abort();
    }
    bounded_step(
        queue,
        "the dead-letter archiver's end",
        AbortOnDropHandle::new(archiver),
    )
    .await;
    bounded_step(
        queue,
        "the parked-letter watch's end",
        AbortOnDropHandle::new(parked),
    )
    .await;
    ctx.deps.metrics.set_connected(&ctx.settings.queue, false);
    outcome
}

/// How long each step of a route's stop other than the in-flight grace may wait (the
/// broker's reply to a cancel or close, a helper task's end): a stop never hangs on one.
const STOP_STEP: Duration = Duration::from_secs(5);

/// Waits for one shutdown step at most [`STOP_STEP`], and says which one did not end.
async fn bounded_step<T>(queue: &str, step: &str, work: impl std::future::Future<Output = T>) {
    if tokio::time::timeout(STOP_STEP, work).await.is_err() {
        tracing::warn!(queue, step, after = ?STOP_STEP, "route stop: a step did not end in time; going on without it");
    }
}
