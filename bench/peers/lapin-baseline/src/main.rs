//! The peers bench's "lapin baseline": the box's limit for what Carteiro's enrollment route
//! does on the wire, with nothing written anywhere.
//!
//! It consumes the bench queue with the route's prefetch and, for each delivery, publishes the
//! three events the enrollment handler emits (the same exchange, routing keys, body, and the
//! properties Carteiro's relay gives an outbox event: a fresh `message_id`, persistent, the
//! time, `application/json`, `x-causation-id`; mandatory), awaits their publisher confirms,
//! then acks. Deliveries run side by side, as many as the prefetch lets in.
//!
//! Like `baseline.py`, it writes `DONE_FILE` (`{"first_ms", "last_ms"}`: its first and last
//! ack, unix ms) once `EXPECT` deliveries are acked, then runs until it is terminated, so the
//! driver can read its CPU and RSS. Any failure exits with status 1.
//!
//!     lapin-baseline AMQP_URL QUEUE PREFETCH EXPECT DONE_FILE EVENTS_EXCHANGE

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use futures::StreamExt;
use lapin::message::Delivery;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Confirmation, Connection, ConnectionProperties};

/// The enrollment handler's events (plugins/enrollment-rules: `ROUTING_KEYS`).
const ROUTING_KEYS: [&str; 3] = ["acesso.liberado", "fatura.solicitada", "email.solicitado"];

struct Args {
    url: String,
    queue: String,
    prefetch: u16,
    expect: u64,
    done_file: String,
    exchange: String,
}

fn args() -> anyhow::Result<Args> {
    let a: Vec<String> = std::env::args().skip(1).collect();
    let [url, queue, prefetch, expect, done_file, exchange] = a.as_slice() else {
        bail!("usage: lapin-baseline AMQP_URL QUEUE PREFETCH EXPECT DONE_FILE EVENTS_EXCHANGE");
    };
    Ok(Args {
        url: url.clone(),
        queue: queue.clone(),
        prefetch: prefetch.parse().context("PREFETCH")?,
        expect: expect.parse().context("EXPECT")?,
        done_file: done_file.clone(),
        exchange: exchange.clone(),
    })
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// What every delivery's task shares: the confirm channel and the count of acks.
struct Shared {
    publish: Channel,
    exchange: ShortString,
    expect: u64,
    done_file: String,
    acked: AtomicU64,
    first_ms: AtomicU64,
}

#[tokio::main]
async fn main() {
    if let Err(e) = run().await {
        eprintln!("lapin-baseline: {e:#}");
        std::process::exit(1);
    }
}

async fn run() -> anyhow::Result<()> {
    let a = args()?;
    let conn = Connection::connect(&a.url, ConnectionProperties::default())
        .await
        .context("connecting to the broker")?;
    let publish = conn.create_channel().await?;
    publish
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    let consume = conn.create_channel().await?;
    consume
        .basic_qos(a.prefetch, BasicQosOptions::default())
        .await?;
    let mut consumer = consume
        .basic_consume(
            a.queue.as_str().into(),
            "lapin-baseline".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let shared = Arc::new(Shared {
        publish,
        exchange: a.exchange.as_str().into(),
        expect: a.expect,
        done_file: a.done_file,
        acked: AtomicU64::new(0),
        first_ms: AtomicU64::new(0),
    });
    while let Some(delivery) = consumer.next().await {
        let delivery = delivery.context("consuming")?;
        let shared = shared.clone();
        tokio::spawn(async move {
            if let Err(e) = handle(&shared, delivery).await {
                eprintln!("lapin-baseline: {e:#}");
                std::process::exit(1);
            }
        });
    }
    bail!("the consumer was cancelled")
}

/// Three confirmed publishes, then the ack.
async fn handle(shared: &Shared, delivery: Delivery) -> anyhow::Result<()> {
    // The handler's event body is its record re-serialised: the same bytes as Carteiro's.
    let payload = match serde_json::from_slice::<serde_json::Value>(&delivery.data) {
        Ok(record) => serde_json::to_vec(&record)?,
        Err(_) => delivery.data.clone(),
    };
    let causation = delivery.properties.message_id().clone();
    let mut confirms = Vec::with_capacity(ROUTING_KEYS.len());
    for key in ROUTING_KEYS {
        let confirm = shared
            .publish
            .basic_publish(
                shared.exchange.clone(),
                key.into(),
                BasicPublishOptions {
                    mandatory: true,
                    ..BasicPublishOptions::default()
                },
                &payload,
                properties(causation.as_ref()),
            )
            .await?;
        confirms.push(confirm);
    }
    for confirm in confirms {
        match confirm.await? {
            Confirmation::Ack(None) => {}
            other => bail!("an event was not confirmed as routed: {other:?}"),
        }
    }
    delivery.acker.ack(BasicAckOptions::default()).await?;
    acked(shared)
}

/// What Carteiro's relay sets on an outbox event (`event_properties`).
fn properties(causation: Option<&ShortString>) -> BasicProperties {
    let mut headers = FieldTable::default();
    if let Some(id) = causation {
        headers.insert(
            "x-causation-id".into(),
            AMQPValue::LongString(LongString::from(id.as_str())),
        );
    }
    BasicProperties::default()
        .with_message_id(uuid::Uuid::now_v7().to_string().into())
        .with_delivery_mode(2)
        .with_timestamp(now_ms() / 1000)
        .with_content_type("application/json".into())
        .with_headers(headers)
}

fn acked(shared: &Shared) -> anyhow::Result<()> {
    let n = shared.acked.fetch_add(1, Ordering::SeqCst) + 1;
    if n == 1 {
        shared.first_ms.store(now_ms(), Ordering::SeqCst);
    }
    if n == shared.expect {
        let done = serde_json::json!({
            "first_ms": shared.first_ms.load(Ordering::SeqCst),
            "last_ms": now_ms(),
        });
        // Renamed into place: the driver never reads half a file.
        let tmp = format!("{}.tmp", shared.done_file);
        std::fs::write(&tmp, done.to_string())?;
        std::fs::rename(&tmp, &shared.done_file)?;
    }
    Ok(())
}
