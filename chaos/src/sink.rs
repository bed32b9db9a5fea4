//! The sink: a queue bound to the events exchange, consumed for the whole campaign, so the
//! checker knows every copy the relays published and when it arrived.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicQosOptions};
use lapin::types::FieldTable;
use tokio::sync::Mutex;

use crate::broker;
use crate::checker::Arrival;

pub const SINK_QUEUE: &str = "chaos-sink";

/// Bound on opening a session (channel, prefetch, consume) and on one ack. lapin can leave
/// such a step pending forever when the broker goes away in the middle of it (a full run
/// saw the sink stop consuming for good after a broker restart): a step past this bound
/// ends the session, and the sink reconnects.
const STEP_TIMEOUT: Duration = Duration::from_secs(10);

/// Consumes the sink until `stop`, reconnecting through broker faults.
pub async fn run(
    urls: Vec<String>,
    started: Instant,
    arrivals: Arc<Mutex<Vec<Arrival>>>,
    stop: Arc<AtomicBool>,
) {
    let mut down = false;
    while !stop.load(Ordering::Relaxed) {
        if let Err(e) = session(&urls, started, &arrivals, &stop, &mut down).await
            && !down
        {
            eprintln!("chaos: sink lost the broker ({e}); reconnecting");
            down = true;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

async fn session(
    urls: &[String],
    started: Instant,
    arrivals: &Mutex<Vec<Arrival>>,
    stop: &AtomicBool,
    down: &mut bool,
) -> anyhow::Result<()> {
    let conn = broker::connect(urls).await?;
    let open = async {
        let ch = conn.create_channel().await?;
        ch.basic_qos(500, BasicQosOptions::default()).await?;
        let consumer = ch
            .basic_consume(
                SINK_QUEUE.into(),
                "chaos-sink".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await?;
        anyhow::Ok((ch, consumer))
    };
    let (ch, mut consumer) = tokio::time::timeout(STEP_TIMEOUT, open)
        .await
        .map_err(|_| anyhow::anyhow!("opening the sink's channel timed out"))??;
    *down = false;
    while !stop.load(Ordering::Relaxed) {
        let next = tokio::time::timeout(Duration::from_millis(500), consumer.next()).await;
        let delivery = match next {
            Err(_) => {
                if !conn.status().connected() || !ch.status().connected() {
                    anyhow::bail!("connection lost");
                }
                continue;
            }
            Ok(None) => anyhow::bail!("consumer cancelled"),
            Ok(Some(d)) => d?,
        };
        let event_id = delivery
            .properties
            .message_id()
            .as_ref()
            .map(|s| s.to_string())
            .unwrap_or_default();
        arrivals.lock().await.push(Arrival {
            event_id,
            at_ms: started.elapsed().as_millis() as u64,
            redelivered: delivery.redelivered,
        });
        tokio::time::timeout(STEP_TIMEOUT, delivery.acker.ack(BasicAckOptions::default()))
            .await
            .map_err(|_| anyhow::anyhow!("an ack timed out"))??;
    }
    Ok(())
}
