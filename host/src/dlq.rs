//! Dead letters for people: JSON views and replay (back onto the route's work queue with a
//! fresh attempt counter, via a confirmed publish, then marked replayed). `run`: a replay
//! of everything a filter selects, resumable. `shadow`: what a new plugin version would
//! decide on dead letters, in a throwaway store (nothing committed or published).

pub mod run;
pub mod shadow;

use crate::broker::outgoing::replay_properties;
use crate::broker::seal::SealKey;
use crate::broker::{ConfirmedPublisher, Outgoing, PublisherOptions};
use crate::common::headers::{PROP_CONTENT_TYPE, PROP_CORRELATION_ID, PROP_MESSAGE_ID};
use crate::store::{DeadLetter, Store};
use std::time::Duration;

fn body_preview(body: &[u8]) -> serde_json::Value {
    match std::str::from_utf8(body) {
        Ok(text) => serde_json::Value::String(text.chars().take(4096).collect()),
        Err(_) => serde_json::Value::String(format!("<{} bytes, not UTF-8>", body.len())),
    }
}

/// One line of a listing.
pub fn summary_json(d: &DeadLetter) -> serde_json::Value {
    serde_json::json!({
        "id": d.id,
        "route": d.route,
        "queue": d.queue,
        "reason": d.reason,
        "plugin": d.plugin,
        "attempts": d.attempts,
        "dead_lettered_at": d.dead_lettered_at,
        "replay_count": d.replay_count,
    })
}

/// Everything about one dead letter.
pub fn detail_json(d: &DeadLetter) -> serde_json::Value {
    let mut value = summary_json(d);
    value["headers"] = serde_json::json!(d.headers.iter().map(|(k, v)| [k, v]).collect::<Vec<_>>());
    value["body"] = body_preview(&d.body);
    value["body_bytes"] = serde_json::json!(d.body.len());
    value["first_failed_at"] = serde_json::json!(d.first_failed_at);
    // The plugin version that gave up on it (a sealed header of the dead-letter copy).
    value["plugin_sha256"] = serde_json::json!(
        d.headers
            .iter()
            .find(|(k, _)| k == crate::common::headers::PLUGIN_SHA256)
            .map(|(_, v)| v)
    );
    value["replayed_at"] = serde_json::json!(d.replayed_at);
    value["stored_encoded"] = serde_json::json!(d.stored_encoded);
    value
}

/// Headers a replay must not carry: our failure story and the broker's death records.
fn is_failure_header(name: &str) -> bool {
    (name.starts_with("x-carteiro-")
        && name != crate::common::headers::ORIGINAL_EXCHANGE
        && name != crate::common::headers::ORIGINAL_ROUTING_KEY)
        || name.starts_with("x-death")
        || name.starts_with("x-first-death")
        || name.starts_with("x-last-death")
        || name.starts_with(':')
}

/// The properties a replay of `d` is published with (unsealed): its headers without the
/// failure story, and its archived message id, content type and correlation id.
pub fn replay_properties_of(d: &DeadLetter) -> anyhow::Result<lapin::BasicProperties> {
    let prop = |name: &str| {
        d.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    };
    let pairs: Vec<(String, String)> = d
        .headers
        .iter()
        .filter(|(k, _)| !is_failure_header(k))
        .cloned()
        .collect();
    replay_properties(
        &pairs,
        prop(PROP_MESSAGE_ID).as_deref(),
        prop(PROP_CONTENT_TYPE).as_deref(),
        prop(PROP_CORRELATION_ID).as_deref(),
    )
    .map_err(|e| anyhow::anyhow!("dead letter {} cannot be replayed: {e}", d.id))
}

/// Publishes the dead letter back to its route's queue (confirmed) and marks it replayed.
pub async fn replay(
    store: &Store,
    publisher: &ConfirmedPublisher,
    seal: &SealKey,
    d: &DeadLetter,
    timeout: Duration,
) -> anyhow::Result<()> {
    let properties = replay_properties_of(d)?;
    // Sealed, so the route believes the original exchange and routing key it carries.
    let properties = seal.seal(&d.route, properties, &d.body);
    publisher
        .publish(
            Outgoing {
                exchange: String::new(),
                routing_key: d.route.clone(),
                properties,
                body: d.body.clone(),
                mandatory: true,
            },
            timeout,
        )
        .await
        .map_err(|e| {
            anyhow::anyhow!(
                "replay of dead letter {} to queue `{}` failed: {e}",
                d.id,
                d.route
            )
        })?;
    store.dead_letter_mark_replayed(d.id).await?;
    Ok(())
}

/// Opens a publisher for replays.
pub async fn replay_publisher(
    conn: std::sync::Arc<lapin::Connection>,
) -> anyhow::Result<ConfirmedPublisher> {
    Ok(ConfirmedPublisher::open(conn, PublisherOptions { lanes: 8 }).await?)
}
