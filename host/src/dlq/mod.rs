//! Dead letters for people: JSON views and replay (back onto the route's work queue with a
//! fresh attempt counter, via a confirmed publish, then marked replayed). `run`: a replay
//! of everything a filter selects, resumable. `shadow_replay`: what a new plugin version would
//! decide on dead letters, in a throwaway store (nothing committed or published). `unpark`:
//! a quorum route's parked dead letters back into its DLQ. `edit`: edit and retry (only the
//! edited copy is sent). `journey`: every attempt, replay and edit of a message, read back.
//! `search`: the query syntax (`id:`, `correlation:`, `body.PATH = VALUE`, ...) of the console,
//! the JSON API and the CLI, parsed into the store's indexed search terms.
//!
//! A foreign dead letter (`[[dead_letter_queues]]`) goes back where it came from
//! ([`copy_of`]). Every copy a replay or an edit of a route's dead letter sends carries
//! `x-carteiro-replay-of` (sealed): should it fail again, its new dead letter links back to
//! the one it was sent from.

pub mod edit;
pub mod journey;
pub mod run;
pub mod search;
pub mod shadow_replay;
pub mod unpark;

use crate::broker::outgoing::replay_properties;
use crate::broker::seal::SealKey;
use crate::broker::{ConfirmedPublisher, Outgoing, PublisherOptions};
use crate::common::header_names::{PROP_CONTENT_TYPE, PROP_CORRELATION_ID, PROP_MESSAGE_ID};
use crate::common::retry;
use crate::foreign_dlq::{self, Destination};
use crate::store::{DeadLetter, Store, StoreError};
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
        "route": d.letter.route,
        "queue": d.letter.queue,
        "reason": d.letter.reason,
        "plugin": d.letter.plugin,
        "attempts": d.letter.attempts,
        "dead_lettered_at": d.letter.dead_lettered_at,
        "replay_count": d.replay_count,
        "message_id": d.header(PROP_MESSAGE_ID),
        "correlation_id": d.header(PROP_CORRELATION_ID),
        "task": celery_task(d).map(|t| t.task),
    })
}

/// The Celery task a dead letter is, if it is one (`foreign_dlq::celery`).
pub fn celery_task(d: &DeadLetter) -> Option<foreign_dlq::CeleryTask> {
    foreign_dlq::celery_task(&d.letter.headers, &d.letter.body)
}

/// Everything about one dead letter.
pub fn detail_json(d: &DeadLetter) -> serde_json::Value {
    let mut value = summary_json(d);
    value["headers"] = serde_json::json!(
        d.letter
            .headers
            .iter()
            .map(|(k, v)| [k, v])
            .collect::<Vec<_>>()
    );
    value["body"] = body_preview(&d.letter.body);
    value["body_bytes"] = serde_json::json!(d.letter.body.len());
    value["first_failed_at"] = serde_json::json!(d.letter.first_failed_at);
    // The plugin version that gave up on it (a sealed header of the dead-letter copy).
    value["plugin_sha256"] = serde_json::json!(
        d.letter
            .headers
            .iter()
            .find(|(k, _)| k == crate::common::header_names::PLUGIN_SHA256)
            .map(|(_, v)| v)
    );
    value["replayed_at"] = serde_json::json!(d.replayed_at);
    value["stored_encoded"] = serde_json::json!(d.stored_encoded);
    value["replay_of"] = serde_json::json!(d.replay_of);
    value["edited_at"] = serde_json::json!(d.edited_at);
    value["celery"] = serde_json::json!(celery_task(d));
    value
}

/// Headers a replay must not carry: our failure story and the broker's death records.
fn is_failure_header(name: &str) -> bool {
    (name.starts_with("x-carteiro-")
        && name != crate::common::header_names::ORIGINAL_EXCHANGE
        && name != crate::common::header_names::ORIGINAL_ROUTING_KEY)
        || name.starts_with("x-death")
        || name.starts_with("x-first-death")
        || name.starts_with("x-last-death")
        || name.starts_with(':')
}

/// The properties a replay of `d` is published with (unsealed): its headers without the
/// failure story, and its archived message id, content type and correlation id.
pub fn replay_properties_of(d: &DeadLetter) -> anyhow::Result<lapin::BasicProperties> {
    let pairs: Vec<(String, String)> = d
        .letter
        .headers
        .iter()
        .filter(|(k, _)| !is_failure_header(k))
        .cloned()
        .collect();
    replay_properties(
        &pairs,
        d.header(PROP_MESSAGE_ID),
        d.header(PROP_CONTENT_TYPE),
        d.header(PROP_CORRELATION_ID),
    )
    .map_err(|e| anyhow::anyhow!("dead letter {} cannot be replayed: {e}", d.id))
}

/// `properties` with `x-carteiro-replay-of: ID` (to be sealed with the rest): a dead letter the
/// copy becomes again is linked to dead letter `id`.
fn with_replay_of(properties: lapin::BasicProperties, id: i64) -> lapin::BasicProperties {
    let mut headers = properties.headers().clone().unwrap_or_default();
    crate::broker::outgoing::set_int(&mut headers, crate::common::header_names::REPLAY_OF, id);
    properties.with_headers(headers)
}

/// How a replay run sends: whose claims it takes, and where to.
#[derive(Debug, Clone, Copy, Default)]
pub struct ReplayRun<'a> {
    /// Whose claim it is (one run's rows share an owner, so a stopped run can give its
    /// claims back at once: see `run::replay_matching`); `None`, a claim of its own.
    pub owner: Option<&'a str>,
    /// Send to this queue (through the default exchange) instead of where each came from.
    pub to_queue: Option<&'a str>,
}

/// Where a copy of `d` goes, and its final properties (from `properties`, the archived
/// ones): a route's dead letter to its route's queue, sealed, linked back to `d`; a foreign
/// one (`[[dead_letter_queues]]`) to the exchange and routing key it came from, as its own
/// consumer first read it. `body`: the copy's (an edit's may differ). `to_queue` overrides
/// the destination.
pub fn copy_of(
    d: &DeadLetter,
    properties: lapin::BasicProperties,
    body: &[u8],
    seal: &SealKey,
    to_queue: Option<&str>,
) -> (Destination, lapin::BasicProperties) {
    let to = |queue: &str| Destination {
        exchange: String::new(),
        routing_key: queue.to_owned(),
    };
    if foreign_dlq::is_foreign(d) {
        let destination = match (to_queue, foreign_dlq::origin(d)) {
            (Some(queue), _) => to(queue),
            (None, Some(origin)) => origin,
            (None, None) => to(&d.letter.queue),
        };
        return (destination, foreign_dlq::restore(d, properties));
    }
    let properties = with_replay_of(properties, d.id);
    // Sealed, so the route believes the original exchange and routing key it carries.
    let properties = seal.seal(&d.letter.route, properties, body);
    (to(to_queue.unwrap_or(&d.letter.route)), properties)
}

/// "queue `Q`" or "exchange `X` with routing key `K`".
pub fn describe(destination: &Destination) -> String {
    match destination.exchange.as_str() {
        "" => format!("queue `{}`", destination.routing_key),
        exchange => format!(
            "exchange `{exchange}` with routing key `{}`",
            destination.routing_key
        ),
    }
}

/// How one replay of a dead letter ended, when nothing failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replayed {
    /// Published, confirmed and marked replayed.
    Done,
    /// Another replay holds it, or replayed it meanwhile: nothing published.
    Skipped,
}

/// Why one replay failed.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// Nothing was published (or no confirm came); the row stays unreplayed.
    #[error(transparent)]
    NotPublished(#[from] anyhow::Error),
    /// Published and confirmed, but the mark did not reach the store: the row still reads
    /// unreplayed, and a later run publishes it again (the route's inbox takes one).
    #[error(
        "dead letter {id} was republished to queue `{route}` and confirmed, but marking it \
         replayed failed: {source}; stop replaying until the store takes writes (a re-run \
         publishes it again, and the route's inbox keeps its effects once)"
    )]
    Unmarked {
        id: i64,
        route: String,
        #[source]
        source: StoreError,
    },
}

/// How long a replay's claim on a row lasts: the publish and its confirm, with room. A run
/// killed while holding one leaves that row to the next run once this is over.
fn claim_lease(timeout: Duration) -> i64 {
    i64::try_from((timeout * 2 + Duration::from_secs(5)).as_millis()).unwrap_or(i64::MAX)
}

/// Claims the dead letter (so a concurrent replay or edit skips it), publishes it back to its
/// route's queue (confirmed) and marks it replayed. A dead letter that was edited is never
/// replayed (its claim fails: `Skipped`): only its edited copy is sent. `replayed_before`: a
/// row replayed already is taken only if that was before this moment (`None`: only unreplayed
/// rows).
/// `run`: whose claim it is and where it goes ([`ReplayRun`]).
pub async fn replay(
    store: &Store,
    publisher: &ConfirmedPublisher,
    seal: &SealKey,
    d: &DeadLetter,
    timeout: Duration,
    replayed_before: Option<i64>,
    run: ReplayRun<'_>,
) -> Result<Replayed, ReplayError> {
    let fresh;
    let owner = match run.owner {
        Some(owner) => owner,
        None => {
            fresh = uuid::Uuid::now_v7().to_string();
            fresh.as_str()
        }
    };
    let (destination, properties) = copy_of(
        d,
        replay_properties_of(d)?,
        &d.letter.body,
        seal,
        run.to_queue,
    );
    let claimed = store
        .dead_letter_claim_replay(d.id, owner, claim_lease(timeout), replayed_before)
        .await
        .map_err(|e| anyhow::anyhow!("cannot claim dead letter {} for replay: {e}", d.id))?;
    if !claimed {
        return Ok(Replayed::Skipped);
    }
    let published = publisher
        .publish(
            Outgoing {
                exchange: destination.exchange.clone(),
                routing_key: destination.routing_key.clone(),
                properties,
                body: d.letter.body.clone(),
                mandatory: true,
            },
            timeout,
        )
        .await;
    if let Err(e) = published {
        // Best effort: an unreleased claim expires on its own.
        let _ = store.dead_letter_release_replay(Some(d.id), owner).await;
        return Err(anyhow::anyhow!(
            "replay of dead letter {} to {} failed: {e}",
            d.id,
            describe(&destination)
        )
        .into());
    }
    retry::retry_transient(
        retry::AFTER_CONFIRM,
        || store.dead_letter_mark_replayed(d.id),
        StoreError::is_transient,
    )
    .await
    .map(|()| Replayed::Done)
    .map_err(|source| ReplayError::Unmarked {
        id: d.id,
        route: d.letter.route.clone(),
        source,
    })
}

/// Opens a publisher for replays.
pub async fn replay_publisher(
    conn: std::sync::Arc<lapin::Connection>,
) -> anyhow::Result<ConfirmedPublisher> {
    Ok(ConfirmedPublisher::open(conn, PublisherOptions { lanes: 8 }).await?)
}

/// What a command that sends dead letters again opens: a [`replay_publisher`] on a broker
/// connection of its own, named `name`, and the header-seal key.
pub async fn open_replay_sender(
    config: &crate::config::Config,
    store: &Store,
    name: &str,
) -> anyhow::Result<(ConfirmedPublisher, SealKey)> {
    let settings = crate::services::broker_settings(config, name);
    let conn = crate::broker::connect_any(&settings.urls, &settings.connect).await?;
    let publisher = replay_publisher(std::sync::Arc::new(conn)).await?;
    let seal = crate::services::seal_key(store).await?;
    Ok((publisher, seal))
}
