//! A dead letter as the archive's row holds it ([`DeadLetterRecord`]), and the
//! [`DeadLetter`] it reads back as: the original text where the columns hold a stand-in
//! (`text`).

use super::DeadLetter;
use super::text::{self, NewDeadLetter};
use crate::store::{StoreError, headers_from_json};

/// The columns a [`DeadLetterRecord`] is read from.
pub(super) const COLUMNS: &str = "id, route, queue, reason, plugin, attempts, headers, body, \
                                  first_failed_at, dead_lettered_at, replayed_at, replay_count, \
                                  original, replay_of, edited_at";

/// A row of `dead_letters` ([`COLUMNS`]).
#[derive(sqlx::FromRow)]
pub(super) struct DeadLetterRecord {
    id: i64,
    route: String,
    queue: String,
    reason: String,
    plugin: Option<String>,
    attempts: i64,
    /// JSON text (`headers_to_json`).
    headers: String,
    body: Vec<u8>,
    first_failed_at: Option<i64>,
    dead_lettered_at: i64,
    replayed_at: Option<i64>,
    replay_count: i64,
    /// The original text of the fields the columns hold a stand-in of (`text::encode`).
    original: Option<String>,
    replay_of: Option<i64>,
    edited_at: Option<i64>,
}

impl TryFrom<DeadLetterRecord> for DeadLetter {
    type Error = StoreError;

    fn try_from(r: DeadLetterRecord) -> Result<Self, StoreError> {
        let stored_encoded = r.original.is_some();
        let original = text::decode(r.original.as_deref()).unwrap_or_default();
        Ok(DeadLetter {
            id: r.id,
            letter: NewDeadLetter {
                route: original.route.unwrap_or(r.route),
                queue: original.queue.unwrap_or(r.queue),
                reason: original.reason.unwrap_or(r.reason),
                plugin: original.plugin.or(r.plugin),
                attempts: r.attempts,
                headers: headers_from_json(&r.headers)?,
                body: r.body,
                first_failed_at: r.first_failed_at,
                dead_lettered_at: r.dead_lettered_at,
            },
            replayed_at: r.replayed_at,
            replay_count: r.replay_count,
            stored_encoded,
            replay_of: r.replay_of,
            edited_at: r.edited_at,
        })
    }
}

/// The dead letters of `records`, in order.
pub(super) fn dead_letters(records: Vec<DeadLetterRecord>) -> Result<Vec<DeadLetter>, StoreError> {
    records.into_iter().map(DeadLetter::try_from).collect()
}
