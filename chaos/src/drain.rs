//! The end of a campaign: wait until everything drained, take what is left in the queues,
//! let the sink catch up.
//!
//! A passive declare counts only ready messages, not deliveries a consumer holds unacked. So
//! "drained" here means ready = 0 everywhere (and the store says the outbox and downstream
//! are done); the campaign then stops the gateways, which returns whatever they held to its
//! queue, and [`take_queued`] reads every queue again: anything found there fails the run.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use lapin::options::{BasicAckOptions, BasicGetOptions};

use crate::config::{ROUTE_BATCH, ROUTE_COUNTER, ROUTE_DOWNSTREAM, ROUTE_ENROLL, ROUTE_FLAKY};
use crate::sink::SINK_QUEUE;
use crate::{broker, collect, config};

/// Waits until every queue is empty, the outbox is published and every event took effect
/// downstream, and that holds for three samples in a row. A check that cannot be made (the
/// broker or the store does not answer) counts as not drained.
pub async fn drain(urls: &[String], pool: &sqlx::AnyPool, bound: Duration) -> bool {
    let deadline = Instant::now() + bound;
    let mut quiet = 0;
    let mut left = String::new();
    while Instant::now() < deadline {
        // Bounded as a whole: a broker that stops answering mid-check must not hang the drain.
        let depths = tokio::time::timeout(STEP, depths(urls))
            .await
            .unwrap_or_else(|_| vec![None]);
        let empty = all_empty(&depths);
        let pending = collect::progress(pool).await.map(|(_, pending)| pending);
        let downstream = collect::downstream(pool).await;
        let outbox = pending == Some(0);
        let downstream_done = downstream.is_some_and(|(done, events)| done == events);
        quiet = if empty && outbox && downstream_done {
            quiet + 1
        } else {
            0
        };
        if quiet >= 3 {
            return true;
        }
        left = describe(&depths, pending, downstream);
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    println!("chaos: left when the drain gave up: {left}");
    if let Some(rows) = collect::unpublished_rows(pool).await {
        println!("chaos: unpublished outbox rows (id, route, ms since commit): {rows:?}");
    }
    false
}

/// What the last look found undone, for a drain that gave up.
fn describe(
    depths: &[Option<u32>],
    pending: Option<u64>,
    downstream: Option<(u64, u64)>,
) -> String {
    let queues: Vec<String> = all_queues()
        .iter()
        .zip(depths)
        .filter(|(_, d)| **d != Some(0))
        .map(|(q, d)| format!("{q}={}", d.map_or("?".into(), |n| n.to_string())))
        .collect();
    let show = |v: Option<u64>| v.map_or("?".to_owned(), |n| n.to_string());
    format!(
        "outbox rows unpublished {}; downstream effects {} of {} events; queues not empty [{}]",
        show(pending),
        show(downstream.map(|d| d.0)),
        show(downstream.map(|d| d.1)),
        queues.join(", ")
    )
}

/// Longest one broker step of the drain may take (connect, open a channel, read, close).
const STEP: Duration = Duration::from_secs(30);

/// Every route's work queue, retry tiers and DLQ (the gateways declared them all).
fn all_queues() -> Vec<String> {
    routes().iter().flat_map(|r| config::queues_of(r)).collect()
}

fn routes() -> [&'static str; 5] {
    [
        ROUTE_ENROLL,
        ROUTE_COUNTER,
        ROUTE_FLAKY,
        ROUTE_BATCH,
        ROUTE_DOWNSTREAM,
    ]
}

/// Empty only when every depth was read and is 0: a depth that could not be read (`None`)
/// is not an empty queue.
fn all_empty(depths: &[Option<u32>]) -> bool {
    !depths.is_empty() && depths.iter().all(|d| *d == Some(0))
}

/// Ready messages per queue of [`all_queues`]; `None` where the broker did not answer.
async fn depths(urls: &[String]) -> Vec<Option<u32>> {
    let Ok(conn) = broker::connect(urls).await else {
        return vec![None];
    };
    let mut depths = Vec::new();
    for q in all_queues() {
        // A passive declare of a missing queue closes the channel: one channel per queue.
        let channel = tokio::time::timeout(Duration::from_secs(5), conn.create_channel()).await;
        depths.push(match channel {
            Ok(Ok(ch)) => broker::depth(&ch, &q).await,
            _ => None,
        });
    }
    let _ = tokio::time::timeout(Duration::from_secs(5), conn.close(200, "checked".into())).await;
    depths
}

/// After the gateways stopped: the message ids left in any route queue (work, retry, DLQ),
/// and those parked in a quorum route's `Q.dlq.parked`. A queue that cannot be read is an
/// error, never an empty queue.
pub async fn take_queued(
    urls: &[String],
    quorum: bool,
) -> anyhow::Result<(HashSet<String>, HashSet<String>)> {
    let conn = broker::connect(urls)
        .await
        .context("connect to read what is left in the queues")?;
    let mut ids = HashSet::new();
    for q in all_queues() {
        take(&conn, &q, &mut ids).await?;
    }
    let mut parked = HashSet::new();
    if quorum {
        for r in routes() {
            take(&conn, &format!("{r}.dlq.parked"), &mut parked).await?;
        }
    }
    if !ids.is_empty() {
        println!(
            "chaos: {} messages were still queued after the drain",
            ids.len()
        );
    }
    if !parked.is_empty() {
        println!("chaos: {} dead letters were parked", parked.len());
    }
    let _ = tokio::time::timeout(Duration::from_secs(5), conn.close(200, "taken".into())).await;
    Ok((ids, parked))
}

/// Takes every message in `queue` (the gateways are stopped), adding their ids to `ids`.
async fn take(
    conn: &lapin::Connection,
    queue: &str,
    ids: &mut HashSet<String>,
) -> anyhow::Result<()> {
    let ch = tokio::time::timeout(Duration::from_secs(5), conn.create_channel())
        .await
        .with_context(|| format!("opening a channel to read {queue} timed out"))??;
    if broker::depth(&ch, queue).await.is_none() {
        bail!("could not read the depth of {queue}");
    }
    for _ in 0..1_000_000 {
        let get = ch.basic_get(queue.into(), BasicGetOptions::default());
        let msg = match tokio::time::timeout(Duration::from_secs(5), get).await {
            Ok(Ok(Some(msg))) => msg,
            Ok(Ok(None)) => return Ok(()),
            Ok(Err(e)) => bail!("could not read {queue}: {e}"),
            Err(_) => bail!("reading {queue} timed out"),
        };
        // A message without an id still counts: it is left over all the same.
        let id = msg.delivery.properties.message_id().as_ref().map_or_else(
            || format!("(no message id) in {queue}"),
            |id| id.to_string(),
        );
        ids.insert(id);
        msg.delivery.acker.ack(BasicAckOptions::default()).await?;
    }
    bail!("{queue} did not empty after 1,000,000 messages")
}

/// Waits (bounded) until the sink queue is empty, so every published copy was recorded.
/// `false` when it could not be seen empty: the sink's record may be incomplete.
pub async fn wait_sink_empty(urls: &[String]) -> bool {
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        let empty = async {
            let conn = broker::connect(urls).await.ok()?;
            let ch = conn.create_channel().await.ok()?;
            let depth = broker::depth(&ch, SINK_QUEUE).await;
            let _ = conn.close(200, "checked".into()).await;
            depth
        };
        if tokio::time::timeout(Duration::from_secs(10), empty).await == Ok(Some(0)) {
            // Let the consumer's last deliveries land.
            tokio::time::sleep(Duration::from_secs(1)).await;
            return true;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    false
}

#[cfg(test)]
mod tests {
    use super::all_empty;

    #[test]
    fn a_depth_that_could_not_be_read_is_not_empty() {
        assert!(all_empty(&[Some(0), Some(0)]));
        assert!(!all_empty(&[Some(0), None]));
        assert!(!all_empty(&[Some(0), Some(3)]));
        // No broker at all: nothing was read.
        assert!(!all_empty(&[None]));
        assert!(!all_empty(&[]));
    }
}
