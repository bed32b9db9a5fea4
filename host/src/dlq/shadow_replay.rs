//! A shadow replay: what a new plugin version decides on archived dead letters, without
//! committing or publishing anything.
//!
//! Each selected dead letter (oldest first, the same selection as `dlq replay`) becomes the
//! message its replay would deliver (attempt 1, the archived properties and headers without
//! the failure story, the original exchange and routing key) and runs through the new
//! component with the limits and variables of the route's plugin in the config. Its kv
//! reads come from a [`MemoryKv`] over the real kv, read-only: the writes of each delivery
//! the new version acks go into that memory (so later messages see them, as after a real
//! commit), never into the store. Events are collected and shown, never written to the
//! outbox. Not simulated: the route's guards (body size, content type) and inbox
//! deduplication, which a real replay would apply first.

use crate::common::header_names::{ORIGINAL_EXCHANGE, ORIGINAL_ROUTING_KEY};
use crate::config::Config;
use crate::runtime::{
    EmittedEvent, Header, KvFuture, KvSource, MemoryKv, Message, Plugin, Verdict,
};
use crate::store::{DeadLetter, DeadLetterFilter, Store};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

/// What the new version decides on one dead letter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Now {
    Ack,
    Retry {
        reason: String,
        delay_ms: Option<u64>,
    },
    DeadLetter {
        reason: String,
    },
    /// A trap, timeout or limit (`kind` as in `x-carteiro-failure`), or a run that could not
    /// happen (`kind` `not-run`: the route is not in the config, the message cannot be
    /// rebuilt).
    Failure {
        kind: String,
        detail: String,
    },
}

impl Now {
    /// `ack`, `retry`, `dead-letter` or `failure`.
    pub fn label(&self) -> &'static str {
        match self {
            Now::Ack => "ack",
            Now::Retry { .. } => "retry",
            Now::DeadLetter { .. } => "dead-letter",
            Now::Failure { .. } => "failure",
        }
    }
}

/// How a person reads it: `ack`, `retry: REASON`, `still dead-letter: REASON` or
/// `failure (KIND): DETAIL` (the CLI's and the console's shadow lines).
impl std::fmt::Display for Now {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Now::Ack => f.write_str("ack"),
            Now::Retry { reason, .. } => write!(f, "retry: {reason}"),
            Now::DeadLetter { reason } => write!(f, "still dead-letter: {reason}"),
            Now::Failure { kind, detail } => write!(f, "failure ({kind}): {detail}"),
        }
    }
}

/// One dead letter, then and now.
#[derive(Debug, Clone)]
pub struct Verdicts {
    pub id: i64,
    pub route: String,
    pub message_id: Option<String>,
    /// Why it was dead-lettered.
    pub then_reason: String,
    /// The plugin version that gave up on it (`x-carteiro-plugin-sha256`), when recorded.
    pub then_sha256: Option<String>,
    pub now: Now,
    /// What an ack would commit (`None`: delete); empty unless acked.
    pub kv_writes: Vec<(String, Option<Vec<u8>>)>,
    /// What an ack would publish through the outbox; empty unless acked.
    pub events: Vec<EmittedEvent>,
}

/// Counts of a shadow run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Summary {
    pub total: u64,
    pub now_ack: u64,
    pub still_dead_letter: u64,
    pub now_retry: u64,
    pub now_failure: u64,
    /// SHA-256 of the new component.
    pub sha256: String,
}

impl Summary {
    /// `dead-letter → ack: 312, still dead-letter: 28, dead-letter → retry: 0, ...`
    pub fn line(&self) -> String {
        format!(
            "dead-letter → ack: {}, still dead-letter: {}, dead-letter → retry: {}, dead-letter → failure: {} ({} dead letters)",
            self.now_ack, self.still_dead_letter, self.now_retry, self.now_failure, self.total
        )
    }
}

/// Which dead letters, and how many at most.
#[derive(Debug, Clone, Default)]
pub struct ShadowOptions {
    pub include_replayed: bool,
    pub limit: Option<u64>,
    /// Load the new file only if its SHA-256 is this (hex).
    pub sha256: Option<String>,
}

/// Reads the real kv straight from the store, one read at a time; never writes (the
/// [`KvSource`] trait has no write).
struct DirectKv(Store);

impl KvSource for DirectKv {
    fn get<'a>(&'a self, namespace: &'a str, key: &'a str) -> KvFuture<'a> {
        Box::pin(async move { crate::pipeline::kv_answer(self.0.kv_get(namespace, key).await) })
    }
}

/// The message a replay of `d` would deliver to its route.
pub fn message_of(d: &DeadLetter) -> anyhow::Result<Message> {
    let properties = super::replay_properties_of(d)?;
    let headers = properties
        .headers()
        .as_ref()
        .map(crate::broker::field_table::to_text_pairs)
        .unwrap_or_default();
    Ok(Message {
        id: properties
            .message_id()
            .as_ref()
            .map(|s| s.as_str().to_owned()),
        exchange: d.header(ORIGINAL_EXCHANGE).unwrap_or_default().to_owned(),
        routing_key: d
            .header(ORIGINAL_ROUTING_KEY)
            .map_or_else(|| d.letter.route.clone(), str::to_owned),
        headers: headers
            .into_iter()
            .map(|(name, value)| Header { name, value })
            .collect(),
        content_type: properties
            .content_type()
            .as_ref()
            .map(|s| s.as_str().to_owned()),
        body: d.letter.body.clone(),
        attempt: 1,
        redelivered: false,
    })
}

/// Runs the dead letters `filter` selects through the component at `wasm`, compiled on
/// `runtime` (the gateway shares one between its shadow jobs: an engine reserves a lot of
/// address space); `each` sees every result as it comes. Nothing is committed or published.
pub async fn run(
    config: &Config,
    runtime: &Arc<crate::runtime::Runtime>,
    store: &Store,
    wasm: &Path,
    filter: &DeadLetterFilter,
    options: &ShadowOptions,
    each: &mut dyn FnMut(&Verdicts),
) -> anyhow::Result<Summary> {
    let bytes =
        std::fs::read(wasm).map_err(|e| anyhow::anyhow!("cannot read {}: {e}", wasm.display()))?;
    let mut summary = Summary {
        sha256: hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&bytes)),
        ..Summary::default()
    };
    let kv = Arc::new(MemoryKv::over(Arc::new(DirectKv(store.clone()))));
    // The new version loaded once per plugin name (each has its own limits and variables).
    let mut versions: BTreeMap<String, Arc<Plugin>> = BTreeMap::new();
    let selection = super::run::selection(filter, options.include_replayed);
    let mut cursor = None;
    'pages: loop {
        let page_filter = DeadLetterFilter {
            after_id: cursor,
            ..selection.clone()
        };
        let page = store
            .dead_letters_oldest_first(&page_filter, super::run::PAGE)
            .await?;
        if page.is_empty() {
            break;
        }
        for d in page {
            if options.limit.is_some_and(|l| summary.total >= l) {
                break 'pages;
            }
            cursor = Some(d.id);
            let verdicts =
                shadow_one(config, runtime, wasm, options, &mut versions, &kv, &d).await?;
            summary.total += 1;
            match verdicts.now {
                Now::Ack => summary.now_ack += 1,
                Now::DeadLetter { .. } => summary.still_dead_letter += 1,
                Now::Retry { .. } => summary.now_retry += 1,
                Now::Failure { .. } => summary.now_failure += 1,
            }
            each(&verdicts);
        }
    }
    Ok(summary)
}

async fn shadow_one(
    config: &Config,
    runtime: &Arc<crate::runtime::Runtime>,
    wasm: &Path,
    options: &ShadowOptions,
    versions: &mut BTreeMap<String, Arc<Plugin>>,
    kv: &Arc<MemoryKv>,
    d: &DeadLetter,
) -> anyhow::Result<Verdicts> {
    let mut out = Verdicts {
        id: d.id,
        route: d.letter.route.clone(),
        message_id: None,
        then_reason: d.letter.reason.clone(),
        then_sha256: d
            .letter
            .headers
            .iter()
            .find(|(k, _)| k == crate::common::header_names::PLUGIN_SHA256)
            .map(|(_, v)| v.clone()),
        now: Now::Failure {
            kind: "not-run".into(),
            detail: String::new(),
        },
        kv_writes: Vec::new(),
        events: Vec::new(),
    };
    let not_run = |detail: String| Now::Failure {
        kind: "not-run".into(),
        detail,
    };
    let Some(route) = config.routes.iter().find(|r| r.queue == d.letter.route) else {
        out.now = not_run(format!("route `{}` is not in the config", d.letter.route));
        return Ok(out);
    };
    let name = route.plugin_name().to_owned();
    let plugin = match versions.get(&name) {
        Some(p) => p.clone(),
        None => {
            let Some(settings) = config.plugins.get(&name) else {
                out.now = not_run(format!("plugin `{name}` is not in the config"));
                return Ok(out);
            };
            // The route's plugin settings, on the new file; its pin is for the old one.
            let mut settings = settings.clone();
            settings.path = wasm.to_owned();
            settings.sha256 = options.sha256.clone();
            let (runtime, name2) = (runtime.clone(), name.clone());
            let plugin = tokio::task::spawn_blocking(move || {
                crate::services::load_plugin(&runtime, &name2, &settings)
            })
            .await??;
            let plugin = Arc::new(plugin);
            versions.insert(name.clone(), plugin.clone());
            plugin
        }
    };
    let message = match message_of(d) {
        Ok(m) => m,
        Err(e) => {
            out.now = not_run(format!("{e:#}"));
            return Ok(out);
        }
    };
    out.message_id = message.id.clone();
    let source: Arc<dyn KvSource> = kv.clone();
    out.now = match plugin.handle(&message, source).await {
        Err(failure) => Now::Failure {
            kind: failure.kind().label().to_owned(),
            detail: failure.to_string(),
        },
        Ok(invocation) => match (&invocation.verdict, &invocation.store_error) {
            (_, Some(error)) => anyhow::bail!("reading the real kv failed: {error}"),
            (Verdict::Ack, None) => {
                kv.apply(plugin.name(), &invocation.effects.writes)
                    .await
                    .map_err(|e| anyhow::anyhow!(e))?;
                out.kv_writes = invocation.effects.writes.into_iter().collect();
                out.events = invocation.effects.events;
                Now::Ack
            }
            (Verdict::Retry(r), None) => Now::Retry {
                reason: r.reason.clone(),
                delay_ms: r.delay_ms,
            },
            (Verdict::DeadLetter(reason), None) => Now::DeadLetter {
                reason: reason.clone(),
            },
        },
    };
    Ok(out)
}

/// One result as a JSON line (`--json`).
pub fn verdicts_json(v: &Verdicts) -> serde_json::Value {
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    let mut now = serde_json::json!({ "verdict": v.now.label() });
    match &v.now {
        Now::Ack => {}
        Now::Retry { reason, delay_ms } => {
            now["reason"] = serde_json::json!(reason);
            now["delay_ms"] = serde_json::json!(delay_ms);
        }
        Now::DeadLetter { reason } => now["reason"] = serde_json::json!(reason),
        Now::Failure { kind, detail } => {
            now["kind"] = serde_json::json!(kind);
            now["reason"] = serde_json::json!(detail);
        }
    }
    serde_json::json!({
        "id": v.id,
        "route": v.route,
        "message_id": v.message_id,
        "then": { "verdict": "dead-letter", "reason": v.then_reason, "sha256": v.then_sha256 },
        "now": now,
        "kv_writes": v.kv_writes.iter().map(|(k, val)| serde_json::json!({
            "key": k,
            "value": val.as_deref().map(text),
        })).collect::<Vec<_>>(),
        "events": v.events.iter().map(|e| serde_json::json!({
            "exchange": e.exchange,
            "routing_key": e.routing_key,
            "content_type": e.content_type,
            "payload": text(&e.payload),
        })).collect::<Vec<_>>(),
    })
}

/// The summary as JSON (`--json`, the last line).
pub fn summary_json(s: &Summary) -> serde_json::Value {
    serde_json::json!({ "summary": {
        "sha256": s.sha256,
        "total": s.total,
        "dead_letter_to_ack": s.now_ack,
        "still_dead_letter": s.still_dead_letter,
        "dead_letter_to_retry": s.now_retry,
        "dead_letter_to_failure": s.now_failure,
    }})
}
