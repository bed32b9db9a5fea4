//! The campaign's inputs: keyed enrollments, hot counters, transient failures, batches and poison,
//! with about 10% duplicates by message id; and a publisher that keeps a backlog in front of
//! the gateways and republishes anything whose confirm it did not get.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Connection};
use rand::Rng;
use rand::rngs::StdRng;
use tokio::sync::Mutex;

use crate::broker;
use crate::config::{INPUT_EXCHANGE, ROUTE_BATCH, ROUTE_COUNTER, ROUTE_ENROLL, ROUTE_FLAKY};

/// Hot counter keys: many messages, few keys.
const HOT_KEYS: u64 = 8;

/// What an input is and so what its effect must be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// A valid enrollment: kv record and three events.
    Enroll,
    /// Increments `counter/<key>`.
    Counter { key: String },
    /// Retries until attempt `until`, then acks.
    Flaky { until: u32 },
    /// Handled in a batch: one effect and one event, after one retry when `retry`.
    Batch { retry: bool },
    /// Invalid JSON for the enrollment handler: dead-lettered at once.
    PoisonJson,
    /// Traps on every attempt: dead-lettered after the retry limit.
    PoisonTrap,
}

impl Kind {
    /// The route (and queue) that handles it.
    pub fn route(&self) -> &'static str {
        match self {
            Kind::Enroll | Kind::PoisonJson => ROUTE_ENROLL,
            Kind::Counter { .. } => ROUTE_COUNTER,
            Kind::Flaky { .. } | Kind::PoisonTrap => ROUTE_FLAKY,
            Kind::Batch { .. } => ROUTE_BATCH,
        }
    }

    fn routing_key(&self) -> &'static str {
        match self {
            Kind::Enroll | Kind::PoisonJson => "enroll",
            Kind::Counter { .. } => "count",
            Kind::Flaky { .. } | Kind::PoisonTrap => "flaky",
            Kind::Batch { .. } => "batch",
        }
    }
}

/// One distinct input.
#[derive(Debug, Clone)]
pub struct Sent {
    /// Sequence number; also the enrollment's `matricula_id`.
    pub number: u64,
    /// AMQP message id (the routes' idempotency key).
    pub id: String,
    pub kind: Kind,
}

impl Sent {
    pub fn new(number: u64, kind: Kind) -> Self {
        Self {
            id: format!("m-{number}"),
            number,
            kind,
        }
    }

    fn body(&self) -> Vec<u8> {
        match &self.kind {
            Kind::Enroll => serde_json::json!({
                "matricula_id": self.number,
                "usuario_id": format!("u-{}", self.number % 97),
                "curso_id": self.number % 13,
            })
            .to_string()
            .into_bytes(),
            Kind::PoisonJson => br#"{"matricula_id": 1, "usuario_id": "#.to_vec(),
            Kind::Counter { .. } => b"{}".to_vec(),
            Kind::Flaky { until } => format!("retry-until-{until}").into_bytes(),
            Kind::PoisonTrap => b"trap".to_vec(),
            Kind::Batch { retry: true } => b"retry".to_vec(),
            Kind::Batch { retry: false } => b"ok".to_vec(),
        }
    }

    /// JSON for the enrollment and counter handlers; the flaky and batch handlers read
    /// plain text (so an operator can edit such a dead letter's body as text).
    fn content_type(&self) -> &'static str {
        match self.kind {
            Kind::Flaky { .. } | Kind::PoisonTrap | Kind::Batch { .. } => "text/plain",
            Kind::Enroll | Kind::PoisonJson | Kind::Counter { .. } => "application/json",
        }
    }

    fn properties(&self) -> BasicProperties {
        let mut headers = FieldTable::default();
        if let Kind::Counter { key } = &self.kind {
            headers.insert(
                ShortString::from("x-counter-key"),
                AMQPValue::LongString(LongString::from(key.as_bytes())),
            );
        }
        BasicProperties::default()
            .with_message_id(self.id.as_str().into())
            .with_content_type(self.content_type().into())
            .with_delivery_mode(2)
            .with_headers(headers)
    }
}

/// Draws the next input: a new one, or (10%) a copy of an earlier one.
pub fn draw(rng: &mut StdRng, sent: &[Sent], poison: bool) -> (Sent, bool) {
    if !sent.is_empty() && rng.random_bool(0.10) {
        let earlier = &sent[rng.random_range(0..sent.len())];
        return (earlier.clone(), true);
    }
    let number = sent.len() as u64 + 1;
    let roll = rng.random_range(0..100);
    let kind = match roll {
        0..50 => Kind::Enroll,
        50..72 => Kind::Counter {
            key: format!("k{}", rng.random_range(0..HOT_KEYS)),
        },
        72..82 => Kind::Flaky {
            until: rng.random_range(2..=3),
        },
        82..95 => Kind::Batch {
            retry: rng.random_bool(0.2),
        },
        _ if !poison => Kind::Enroll,
        95..98 => Kind::PoisonJson,
        _ => Kind::PoisonTrap,
    };
    (Sent::new(number, kind), false)
}

/// Shared between the publisher and the runner.
#[derive(Default)]
pub struct Ledger {
    /// Every distinct input, in the order first drawn.
    pub sent: Mutex<Vec<Sent>>,
    /// Distinct inputs drawn (the backlog is counted in these).
    pub drawn: AtomicU64,
    /// Publishes confirmed (duplicates included).
    pub confirmed: AtomicU64,
    /// Duplicates published.
    pub duplicates: AtomicU64,
    /// Publishes that got no confirm and were sent again.
    pub republished: AtomicU64,
    /// Confirmed publishes per message id: a poison input published twice is dead-lettered
    /// twice, rightly.
    pub publishes: Mutex<std::collections::HashMap<String, u32>>,
}

/// Messages published before their confirms are awaited.
const BATCH: usize = 64;

/// How far behind the gateways are: inputs not finished upstream, and events not yet
/// consumed downstream. The sampler keeps both up to date.
#[derive(Default)]
pub struct Lag {
    pub processed: AtomicU64,
    /// Every commit, upstream and downstream: progress of any kind.
    pub commits: AtomicU64,
    pub events_behind: AtomicU64,
}

/// Publishes until `stop`, keeping at most `backlog` distinct inputs ahead of what the
/// gateways finished, and pausing while more than `backlog` events wait downstream.
pub async fn publish(
    urls: Vec<String>,
    mut rng: StdRng,
    ledger: Arc<Ledger>,
    lag: Arc<Lag>,
    backlog: u64,
    stop: Arc<AtomicBool>,
) {
    let mut channel: Option<(Connection, Channel)> = None;
    // Unconfirmed messages, sent again first (the routes deduplicate by message id).
    let mut resend: Vec<Sent> = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let ahead = ledger
            .drawn
            .load(Ordering::Relaxed)
            .saturating_sub(lag.processed.load(Ordering::Relaxed));
        let mut room = backlog.saturating_sub(ahead).min(BATCH as u64) as usize;
        if lag.events_behind.load(Ordering::Relaxed) > backlog {
            room = 0;
        }
        if resend.is_empty() && room == 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        }
        let mut batch = std::mem::take(&mut resend);
        if batch.is_empty() {
            let mut sent = ledger.sent.lock().await;
            for _ in 0..room {
                let (msg, duplicate) = draw(&mut rng, &sent, true);
                if duplicate {
                    ledger.duplicates.fetch_add(1, Ordering::Relaxed);
                } else {
                    sent.push(msg.clone());
                    ledger.drawn.fetch_add(1, Ordering::Relaxed);
                }
                batch.push(msg);
            }
        }
        let ch = match channel.as_ref().filter(|(c, _)| c.status().connected()) {
            Some((_, ch)) => ch.clone(),
            None => match open(&urls).await {
                Ok(pair) => {
                    let ch = pair.1.clone();
                    channel = Some(pair);
                    ch
                }
                Err(_) => {
                    resend = batch;
                    tokio::time::sleep(Duration::from_millis(250)).await;
                    continue;
                }
            },
        };
        resend = publish_recorded(&ch, batch, &ledger).await;
        if !resend.is_empty() {
            // No confirm: the broker may or may not have them. Fresh connection, send again.
            channel = None;
        }
    }
    // Stopping with messages unconfirmed: send them again (bounded) rather than leave them
    // behind. What still has no confirm after that, the checker knows by its missing entry
    // in `publishes`, and does not count as lost when it has no effect.
    let give_up = tokio::time::Instant::now() + RESEND_AT_STOP;
    while !resend.is_empty() && tokio::time::Instant::now() < give_up {
        match open(&urls).await {
            Ok((conn, ch)) => {
                resend = publish_recorded(&ch, std::mem::take(&mut resend), &ledger).await;
                let _ = conn.close(200, "stopping".into()).await;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(250)).await,
        }
    }
    if !resend.is_empty() {
        eprintln!(
            "chaos: {} publishes still unconfirmed when publishing stopped",
            resend.len()
        );
    }
}

/// How long the publisher keeps resending unconfirmed messages once told to stop.
const RESEND_AT_STOP: Duration = Duration::from_secs(30);

/// Publishes `batch` and records each confirm; returns the messages with none.
async fn publish_recorded(ch: &Channel, batch: Vec<Sent>, ledger: &Ledger) -> Vec<Sent> {
    let confirmed = publish_batch(ch, &batch).await;
    let mut publishes = ledger.publishes.lock().await;
    let mut unconfirmed = Vec::new();
    for (msg, ok) in batch.into_iter().zip(confirmed) {
        if ok {
            ledger.confirmed.fetch_add(1, Ordering::Relaxed);
            *publishes.entry(msg.id.clone()).or_default() += 1;
        } else {
            ledger.republished.fetch_add(1, Ordering::Relaxed);
            unconfirmed.push(msg);
        }
    }
    unconfirmed
}

async fn open(urls: &[String]) -> anyhow::Result<(Connection, Channel)> {
    let conn = broker::connect(urls).await?;
    let ch = conn.create_channel().await?;
    ch.confirm_select(ConfirmSelectOptions::default()).await?;
    Ok((conn, ch))
}

/// Publishes `batch`, then waits (bounded) for each confirm: `true` where the broker acked.
async fn publish_batch(ch: &Channel, batch: &[Sent]) -> Vec<bool> {
    let mut confirms = Vec::with_capacity(batch.len());
    for msg in batch {
        let body = msg.body();
        let publish = ch.basic_publish(
            INPUT_EXCHANGE.into(),
            msg.kind.routing_key().into(),
            BasicPublishOptions::default(),
            &body,
            msg.properties(),
        );
        match tokio::time::timeout(Duration::from_secs(5), publish).await {
            Ok(Ok(confirm)) => confirms.push(Some(confirm)),
            _ => confirms.push(None),
        }
    }
    let mut acked = Vec::with_capacity(batch.len());
    for confirm in confirms {
        let ok = match confirm {
            Some(c) => matches!(
                tokio::time::timeout(Duration::from_secs(5), c).await,
                Ok(Ok(c)) if c.is_ack()
            ),
            None => false,
        };
        acked.push(ok);
    }
    acked
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn a_seed_draws_the_same_inputs_with_about_ten_percent_duplicates() {
        let run = |seed| {
            let mut rng = StdRng::seed_from_u64(seed);
            let (mut sent, mut dups) = (Vec::new(), 0);
            for _ in 0..2_000 {
                let (msg, dup) = draw(&mut rng, &sent, true);
                if dup {
                    dups += 1;
                } else {
                    sent.push(msg);
                }
            }
            (sent, dups)
        };
        let (a, dups) = run(7);
        let (b, _) = run(7);
        assert_eq!(
            a.iter().map(|s| &s.kind).collect::<Vec<_>>(),
            b.iter().map(|s| &s.kind).collect::<Vec<_>>()
        );
        assert!((150..250).contains(&dups), "{dups} duplicates in 2,000");
        assert!(a.iter().any(|s| s.kind == Kind::PoisonTrap));
        assert!(a.iter().any(|s| matches!(s.kind, Kind::Flaky { .. })));
        for retry in [false, true] {
            assert!(a.iter().any(|s| s.kind == Kind::Batch { retry }));
        }
    }
}
