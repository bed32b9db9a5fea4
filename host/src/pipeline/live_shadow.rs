//! A live shadow: a new plugin version run beside the live one on sampled deliveries, in a
//! throwaway store, its verdict and effects compared with the live version's.
//!
//! The live run reads kv through a [`RecordingKv`]; the shadow then runs (in the
//! background, after the live delivery is decided, within its CPU budget) on a
//! [`MemoryKv`] holding exactly the values the live run read, over the real kv for keys it
//! did not — so both versions decide on the same state, whatever the live commit changed
//! meanwhile. The shadow's writes and events stay in memory; its failures are counted and
//! never reach the live delivery.
//!
//! Kinds of comparison (the `result` label of `carteiro_shadow_runs_total`):
//! `agree` (same verdict, and for an ack the same kv writes and events), `verdict` (another
//! verdict), `effects` (both ack, other writes or events), `shadow-failure` (the shadow
//! trapped, timed out or hit a limit where the live version did not), `skipped` (sampled
//! but the budget was spent). Disagreements are kept, the newest [`KEPT_DISAGREEMENTS`],
//! for `GET /shadow` and `carteiro shadow report`.

use crate::metrics::Metrics;
use crate::runtime::{
    EmittedEvent, Invocation, KvFuture, KvSource, KvValue, MemoryKv, Message, Plugin,
    PluginFailure, Verdict,
};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use tokio::sync::Semaphore;

/// Disagreements kept for the report.
pub const KEPT_DISAGREEMENTS: usize = 100;

/// What a version decided, in comparable form (event ids left out: they are fresh UUIDs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// `ack`, `retry`, `dead-letter`, or `failure:<kind>`.
    pub verdict: String,
    pub reason: Option<String>,
    pub writes: BTreeMap<String, Option<Vec<u8>>>,
    pub events: Vec<EventKey>,
}

impl Decision {
    /// From one `handle` call.
    pub fn of(result: &Result<Invocation, PluginFailure>) -> Self {
        let none = |verdict: &str, reason: Option<String>| Self {
            verdict: verdict.to_owned(),
            reason,
            writes: BTreeMap::new(),
            events: Vec::new(),
        };
        match result {
            Err(f) => none(&format!("failure:{}", f.kind()), Some(f.to_string())),
            Ok(i) => match &i.verdict {
                Verdict::Ack => Self {
                    verdict: "ack".into(),
                    reason: None,
                    writes: i.effects.writes.clone(),
                    events: i.effects.events.iter().map(event_key).collect(),
                },
                Verdict::Retry(r) => none("retry", Some(r.reason.clone())),
                Verdict::DeadLetter(reason) => none("dead-letter", Some(reason.clone())),
            },
        }
    }

    fn describe(&self) -> String {
        let mut out = self.verdict.clone();
        if let Some(reason) = &self.reason {
            out.push_str(&format!(": {reason}"));
        }
        if self.verdict == "ack" {
            let writes: Vec<String> = self
                .writes
                .iter()
                .map(|(k, v)| match v {
                    Some(v) => format!("{k}={}", String::from_utf8_lossy(v)),
                    None => format!("{k} deleted"),
                })
                .collect();
            out.push_str(&format!(
                " (kv: {}; {} events)",
                writes.join(", "),
                self.events.len()
            ));
        }
        out
    }
}

type EventKey = (
    String,
    String,
    Vec<(String, String)>,
    Option<String>,
    Vec<u8>,
);

fn event_key(e: &EmittedEvent) -> EventKey {
    (
        e.exchange.clone(),
        e.routing_key.clone(),
        e.headers.clone(),
        e.content_type.clone(),
        e.payload.clone(),
    )
}

/// How a shadow run compared.
pub fn compare(live: &Decision, shadow: &Decision) -> &'static str {
    if live.verdict != shadow.verdict {
        if shadow.verdict.starts_with("failure:") {
            "shadow-failure"
        } else {
            "verdict"
        }
    } else if live.writes != shadow.writes || live.events != shadow.events {
        "effects"
    } else {
        "agree"
    }
}

/// One disagreement, for the report.
#[derive(Debug, Clone, Serialize)]
pub struct Disagreement {
    pub at_ms: i64,
    pub route: String,
    pub message_id: Option<String>,
    pub kind: String,
    pub live: String,
    pub shadow: String,
}

/// Counts and the newest disagreements, shared by every route of a gateway.
#[derive(Default)]
pub struct ShadowLog {
    inner: Mutex<LogInner>,
}

#[derive(Default)]
struct LogInner {
    counts: BTreeMap<(String, String), u64>,
    kept: VecDeque<Disagreement>,
}

/// What `GET /shadow` returns.
#[derive(Debug, Clone, Serialize)]
pub struct ShadowReport {
    /// `route` → `result` → count.
    pub counts: BTreeMap<String, BTreeMap<String, u64>>,
    /// Newest last.
    pub disagreements: Vec<Disagreement>,
}

impl ShadowLog {
    fn record(&self, route: &str, kind: &str, disagreement: Option<Disagreement>) {
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        *inner
            .counts
            .entry((route.to_owned(), kind.to_owned()))
            .or_default() += 1;
        if let Some(d) = disagreement {
            if inner.kept.len() >= KEPT_DISAGREEMENTS {
                inner.kept.pop_front();
            }
            inner.kept.push_back(d);
        }
    }

    /// The counts and kept disagreements.
    pub fn report(&self) -> ShadowReport {
        let inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let mut counts: BTreeMap<String, BTreeMap<String, u64>> = BTreeMap::new();
        for ((route, kind), n) in &inner.counts {
            counts
                .entry(route.clone())
                .or_default()
                .insert(kind.clone(), *n);
        }
        ShadowReport {
            counts,
            disagreements: inner.kept.iter().cloned().collect(),
        }
    }
}

/// A plugin's shadow version.
pub struct Shadow {
    pub plugin: Arc<Plugin>,
    sample: f64,
    budget: Arc<Semaphore>,
    log: Arc<ShadowLog>,
    metrics: Arc<Metrics>,
}

impl Shadow {
    pub fn new(
        plugin: Arc<Plugin>,
        sample: f64,
        max_in_flight: u32,
        log: Arc<ShadowLog>,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            plugin,
            sample,
            budget: Arc::new(Semaphore::new(max_in_flight.max(1) as usize)),
            log,
            metrics,
        }
    }

    /// Whether this delivery is shadowed (drawn at the configured rate).
    pub fn sampled(&self) -> bool {
        self.sample >= 1.0 || (self.sample > 0.0 && rand::random::<f64>() < self.sample)
    }

    fn count(&self, route: &str, kind: &str, disagreement: Option<Disagreement>) {
        self.metrics.shadow_run(route, self.plugin.version(), kind);
        self.log.record(route, kind, disagreement);
    }

    /// Runs the shadow on `message` in the background, within the budget, and compares it
    /// with the live decision; `reads` are the values the live run read.
    pub fn compare_later(
        self: &Arc<Self>,
        route: &str,
        message: &Message,
        reads: HashMap<String, Option<KvValue>>,
        fallback: Arc<dyn KvSource>,
        live: Decision,
    ) {
        let Ok(permit) = self.budget.clone().try_acquire_owned() else {
            self.count(route, "skipped", None);
            return;
        };
        let (shadow, route, message) = (self.clone(), route.to_owned(), message.clone());
        tokio::spawn(async move {
            let _permit = permit;
            let kv = Arc::new(MemoryKv::over(fallback));
            for (key, value) in reads {
                kv.preset(shadow.plugin.name(), &key, value);
            }
            let result = shadow.plugin.handle(&message, kv).await;
            let decided = Decision::of(&result);
            let kind = compare(&live, &decided);
            let disagreement = (kind != "agree").then(|| Disagreement {
                at_ms: crate::common::now_ms(),
                route: route.clone(),
                message_id: message.id.clone(),
                kind: kind.to_owned(),
                live: live.describe(),
                shadow: decided.describe(),
            });
            if kind != "agree" {
                tracing::info!(route = %route, kind, message_id = message.id.as_deref().unwrap_or(""), shadow = shadow.plugin.version(), "shadow disagrees with the live version");
            }
            shadow.count(&route, kind, disagreement);
        });
    }
}

/// Reads through to the live kv and remembers what each key read as (first read wins).
pub struct RecordingKv {
    inner: Arc<dyn KvSource>,
    seen: Mutex<HashMap<String, Option<KvValue>>>,
}

impl RecordingKv {
    pub fn new(inner: Arc<dyn KvSource>) -> Self {
        Self {
            inner,
            seen: Mutex::default(),
        }
    }

    /// What the run read, by key.
    pub fn take(&self) -> HashMap<String, Option<KvValue>> {
        std::mem::take(&mut *self.seen.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

impl KvSource for RecordingKv {
    fn get<'a>(&'a self, namespace: &'a str, key: &'a str) -> KvFuture<'a> {
        Box::pin(async move {
            let value = self.inner.get(namespace, key).await?;
            self.seen
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .entry(key.to_owned())
                .or_insert_with(|| value.clone());
            Ok(value)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decision(verdict: &str, writes: &[(&str, &str)]) -> Decision {
        Decision {
            verdict: verdict.into(),
            reason: None,
            writes: writes
                .iter()
                .map(|(k, v)| ((*k).to_owned(), Some(v.as_bytes().to_vec())))
                .collect(),
            events: Vec::new(),
        }
    }

    #[test]
    fn kinds() {
        let ack = decision("ack", &[("a", "1")]);
        assert_eq!(compare(&ack, &ack.clone()), "agree");
        assert_eq!(compare(&ack, &decision("ack", &[("a", "2")])), "effects");
        assert_eq!(compare(&ack, &decision("dead-letter", &[])), "verdict");
        assert_eq!(
            compare(&ack, &decision("failure:trap", &[])),
            "shadow-failure"
        );
        let trap = decision("failure:trap", &[]);
        assert_eq!(compare(&trap, &trap.clone()), "agree");
        assert_eq!(compare(&trap, &ack), "verdict");
    }

    #[test]
    fn the_log_keeps_the_newest_disagreements() {
        let log = ShadowLog::default();
        for i in 0..(KEPT_DISAGREEMENTS + 5) {
            let d = Disagreement {
                at_ms: i as i64,
                route: "q".into(),
                message_id: None,
                kind: "verdict".into(),
                live: String::new(),
                shadow: String::new(),
            };
            log.record("q", "verdict", Some(d));
        }
        log.record("q", "agree", None);
        let report = log.report();
        assert_eq!(report.disagreements.len(), KEPT_DISAGREEMENTS);
        assert_eq!(report.disagreements[0].at_ms, 5);
        assert_eq!(
            report.counts["q"]["verdict"],
            (KEPT_DISAGREEMENTS + 5) as u64
        );
        assert_eq!(report.counts["q"]["agree"], 1);
    }
}
