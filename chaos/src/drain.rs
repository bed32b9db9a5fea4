//! The end of a campaign: wait until everything drained, take what is left in the queues,
//! let the sink catch up.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use lapin::options::{BasicAckOptions, BasicGetOptions};

use crate::checker::{ROUTE_COUNTER, ROUTE_DOWNSTREAM, ROUTE_ENROLL, ROUTE_FLAKY};
use crate::sink::SINK_QUEUE;
use crate::{broker, collect, config};

/// Waits until every queue is empty, the outbox is published and every event took effect
/// downstream, and that holds for three samples in a row.
pub async fn drain(urls: &[String], pool: &sqlx::AnyPool, bound: Duration) -> bool {
    let deadline = Instant::now() + bound;
    let mut quiet = 0;
    while Instant::now() < deadline {
        let empty = queues_empty(urls).await;
        let outbox = collect::progress(pool)
            .await
            .is_some_and(|(_, pending)| pending == 0);
        let downstream = collect::downstream(pool)
            .await
            .is_some_and(|(done, events)| done == events);
        quiet = if empty && outbox && downstream {
            quiet + 1
        } else {
            0
        };
        if quiet >= 3 {
            return true;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    false
}

fn all_queues() -> Vec<String> {
    [ROUTE_ENROLL, ROUTE_COUNTER, ROUTE_FLAKY, ROUTE_DOWNSTREAM]
        .iter()
        .flat_map(|r| config::queues_of(r))
        .collect()
}

async fn queues_empty(urls: &[String]) -> bool {
    let Ok(conn) = broker::connect(urls).await else {
        return false;
    };
    let mut empty = true;
    for q in all_queues() {
        // A passive declare of a missing queue closes the channel: one channel per queue.
        let Ok(ch) = conn.create_channel().await else {
            return false;
        };
        empty &= broker::depth(&ch, &q).await.unwrap_or(0) == 0;
    }
    let _ = conn.close(200, "checked".into()).await;
    empty
}

/// After the gateways stopped: the message ids left in any route queue.
pub async fn take_queued(urls: &[String]) -> anyhow::Result<HashSet<String>> {
    let conn = broker::connect(urls).await?;
    let mut ids = HashSet::new();
    for q in all_queues() {
        let ch = conn.create_channel().await?;
        for _ in 0..1_000_000 {
            let get = ch.basic_get(q.as_str().into(), BasicGetOptions::default());
            let Ok(Ok(Some(msg))) = tokio::time::timeout(Duration::from_secs(5), get).await else {
                break;
            };
            if let Some(id) = msg.delivery.properties.message_id() {
                ids.insert(id.to_string());
            }
            msg.delivery.acker.ack(BasicAckOptions::default()).await?;
        }
    }
    if !ids.is_empty() {
        println!(
            "chaos: {} messages were still queued after the drain",
            ids.len()
        );
    }
    Ok(ids)
}

/// Waits (bounded) until the sink queue is empty, so every published copy was recorded.
pub async fn wait_sink_empty(urls: &[String]) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if let Ok(conn) = broker::connect(urls).await
            && let Ok(ch) = conn.create_channel().await
            && broker::depth(&ch, SINK_QUEUE).await == Some(0)
        {
            // Let the consumer's last deliveries land.
            tokio::time::sleep(Duration::from_secs(1)).await;
            return;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
