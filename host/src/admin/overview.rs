//! What the routes page shows: per route its queue depths (passive declares on a
//! connection of the console's own), deliveries in flight, totals and rates by outcome
//! (from the gateway's metrics, sampled every few seconds), plugin version, retry tiers, its
//! last hour a minute at a time (`metrics::history`, for the charts); and the outbox backlog.

use crate::admin::GatewayHandle;
use crate::broker::connect_any;
use crate::common::labels::Outcome;
use crate::common::now_ms;
use crate::config::Config;
use crate::metrics::{AppOutboxSeen, RouteHistory};
use crate::services::broker_settings;
use crate::topology::{dlq_name, retry_queue_name};
use serde::Serialize;
use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// The outcomes shown, with their `carteiro_deliveries_total` labels.
pub const OUTCOMES: [(&str, Outcome); 5] = [
    ("acked", Outcome::Acked),
    ("duplicate", Outcome::Duplicate),
    ("retried", Outcome::Retried),
    ("dead-lettered", Outcome::DeadLettered),
    ("requeued", Outcome::Requeued),
];
/// How often totals are sampled for rates, and the window rates are taken over.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(5);
const RATE_WINDOW: Duration = Duration::from_secs(60);
/// Bound on one passive declare.
const PROBE_TIMEOUT: Duration = Duration::from_secs(3);

/// A queue and how many messages are ready in it (`None`: could not be asked).
#[derive(Debug, Clone, Serialize)]
pub struct Depth {
    pub queue: String,
    pub messages: Option<u32>,
    pub consumers: Option<u32>,
}

/// A retry tier.
#[derive(Debug, Clone, Serialize)]
pub struct Tier {
    pub delay_ms: u128,
    pub depth: Depth,
}

/// An outcome's total and rate.
#[derive(Debug, Clone, Serialize)]
pub struct OutcomeCount {
    pub outcome: &'static str,
    pub total: u64,
    /// Per minute over the last minute (`None` until two samples exist).
    pub per_minute: Option<f64>,
}

/// One route.
#[derive(Debug, Clone, Serialize)]
pub struct RouteView {
    pub queue: Depth,
    pub plugin: String,
    pub version: Option<String>,
    pub sha256: Option<String>,
    pub in_flight: usize,
    pub outcomes: Vec<OutcomeCount>,
    pub max_attempts: u32,
    pub tiers: Vec<Tier>,
    pub dead_letter_queue: Depth,
    /// The last hour, one point a minute: deliveries by outcome, dead letters by class.
    pub last_hour: RouteHistory,
}

/// The outbox backlog.
#[derive(Debug, Clone, Serialize)]
pub struct OutboxView {
    pub pending: i64,
    pub oldest_pending_age_ms: Option<i64>,
    pub with_errors: i64,
}

/// The whole routes page.
#[derive(Debug, Clone, Serialize)]
pub struct Overview {
    pub routes: Vec<RouteView>,
    pub outbox: Option<OutboxView>,
    /// Applications' own outbox tables (`[[outboxes]]`) this gateway relays, by name.
    pub app_outboxes: BTreeMap<String, AppOutboxSeen>,
    pub store_healthy: bool,
    /// Why depths are missing, if the broker could not be asked.
    pub broker_error: Option<String>,
}

type Totals = BTreeMap<(String, Outcome), u64>;

/// The console's broker connection and rate samples.
#[derive(Default)]
pub struct Probe {
    connection: tokio::sync::Mutex<Option<Arc<lapin::Connection>>>,
    samples: Mutex<VecDeque<(Instant, Totals)>>,
}

impl Probe {
    /// A connected connection of the console's own (opened again when lost).
    pub async fn connection(&self, config: &Config) -> anyhow::Result<Arc<lapin::Connection>> {
        let mut slot = self.connection.lock().await;
        if let Some(conn) = slot.as_ref()
            && conn.status().connected()
        {
            return Ok(conn.clone());
        }
        let settings = broker_settings(config, "carteiro console");
        let conn = tokio::time::timeout(
            config.broker.connect_timeout + Duration::from_secs(1),
            connect_any(&settings.urls, &settings.connect),
        )
        .await
        .map_err(|_| anyhow::anyhow!("connecting to the broker timed out"))??;
        let conn = Arc::new(conn);
        *slot = Some(conn.clone());
        Ok(conn)
    }

    /// Ready messages and consumers of each queue, by passive declares.
    async fn depths(&self, config: &Config, queues: &[String]) -> (Vec<Depth>, Option<String>) {
        let unknown = |q: &String| Depth {
            queue: q.clone(),
            messages: None,
            consumers: None,
        };
        let conn = match self.connection(config).await {
            Ok(c) => c,
            Err(e) => return (queues.iter().map(unknown).collect(), Some(format!("{e:#}"))),
        };
        let mut out = Vec::new();
        let mut channel = None;
        for queue in queues {
            if channel.is_none() {
                channel = conn.create_channel().await.ok();
            }
            let Some(ch) = channel.as_ref() else {
                out.push(unknown(queue));
                continue;
            };
            let passive = lapin::options::QueueDeclareOptions {
                passive: true,
                ..Default::default()
            };
            let declared = tokio::time::timeout(
                PROBE_TIMEOUT,
                ch.queue_declare(queue.as_str().into(), passive, Default::default()),
            )
            .await;
            match declared {
                Ok(Ok(q)) => out.push(Depth {
                    queue: queue.clone(),
                    messages: Some(q.message_count()),
                    consumers: Some(q.consumer_count()),
                }),
                // A failed passive declare closes the channel: the next queue gets a new one.
                _ => {
                    channel = None;
                    out.push(unknown(queue));
                }
            }
        }
        if let Some(ch) = channel {
            let _ = ch.close(200, "console probe".into()).await;
        }
        (out, None)
    }

    /// Records the current totals (the sampler calls this every [`SAMPLE_EVERY`]).
    pub fn sample(&self, h: &GatewayHandle) {
        let totals = totals(h);
        let mut samples = self.samples.lock().unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        samples.push_back((now, totals));
        while samples
            .front()
            .is_some_and(|(at, _)| now.duration_since(*at) > RATE_WINDOW + SAMPLE_EVERY)
        {
            samples.pop_front();
        }
    }

    fn per_minute(&self, route: &str, outcome: Outcome, now_total: u64) -> Option<f64> {
        let samples = self.samples.lock().unwrap_or_else(PoisonError::into_inner);
        let (at, oldest) = samples.front()?;
        let elapsed = at.elapsed().as_secs_f64();
        if elapsed < 1.0 {
            return None;
        }
        let then = oldest
            .get(&(route.to_owned(), outcome))
            .copied()
            .unwrap_or(0);
        Some(now_total.saturating_sub(then) as f64 * 60.0 / elapsed)
    }

    /// Everything the routes page shows.
    pub async fn overview(&self, h: &GatewayHandle) -> Overview {
        let status = h.live.status();
        let Some(config) = status.config.clone() else {
            return Overview {
                routes: Vec::new(),
                outbox: None,
                app_outboxes: BTreeMap::new(),
                store_healthy: h.gate.is_healthy(),
                broker_error: None,
            };
        };
        let mut queues = Vec::new();
        for r in &config.routes {
            queues.push(r.queue.clone());
            queues.extend(
                r.retry
                    .backoff
                    .iter()
                    .map(|d| retry_queue_name(&r.queue, *d)),
            );
            queues.push(dlq_name(&r.queue));
        }
        let (depths, broker_error) = self.depths(&config, &queues).await;
        let now = now_ms();
        let mut depths = depths.into_iter();
        let mut routes = Vec::new();
        for r in &config.routes {
            let mut next = |q: String| {
                depths.next().unwrap_or(Depth {
                    queue: q,
                    messages: None,
                    consumers: None,
                })
            };
            let queue = next(r.queue.clone());
            let tiers = r
                .retry
                .backoff
                .iter()
                .map(|d| Tier {
                    delay_ms: d.as_millis(),
                    depth: next(retry_queue_name(&r.queue, *d)),
                })
                .collect();
            let dead_letter_queue = next(dlq_name(&r.queue));
            let running = status.plugins.get(r.plugin_name());
            let outcomes = OUTCOMES
                .iter()
                .map(|(name, label)| {
                    let total = h.metrics.delivered(&r.queue, *label);
                    OutcomeCount {
                        outcome: name,
                        total,
                        per_minute: self.per_minute(&r.queue, *label, total),
                    }
                })
                .collect();
            routes.push(RouteView {
                queue,
                plugin: r.plugin_name().to_owned(),
                version: running.map(|p| p.version.clone()),
                sha256: running.map(|p| p.sha256.clone()),
                in_flight: status
                    .in_flight
                    .get(&r.queue)
                    .map_or(0, |n| n.load(std::sync::atomic::Ordering::Relaxed)),
                outcomes,
                max_attempts: r.retry.max_attempts,
                tiers,
                dead_letter_queue,
                last_hour: h.metrics.last_hour(&r.queue, now),
            });
        }
        let outbox = h.store.outbox_status().await.ok().map(|o| OutboxView {
            pending: o.pending,
            oldest_pending_age_ms: o.oldest_pending_age_ms,
            with_errors: o.with_errors,
        });
        Overview {
            routes,
            outbox,
            app_outboxes: h.metrics.app_outboxes_seen(),
            store_healthy: h.gate.is_healthy(),
            broker_error,
        }
    }
}

fn totals(h: &GatewayHandle) -> Totals {
    let mut out = Totals::new();
    for route in h.live.status().routes {
        for (_, label) in OUTCOMES {
            out.insert((route.clone(), label), h.metrics.delivered(&route, label));
        }
    }
    out
}
