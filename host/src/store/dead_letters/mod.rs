//! The dead-letter archive: every message that gave up, with its reason (G4), queryable and
//! replayable by operators. Any dead letter can be archived, whatever its text: see `text`
//! for how text the columns cannot hold is stored losslessly.
//!
//! # Layout
//! - this file: reading the archive (lists, counts, groups) and purging it;
//! - `archive`: archiving a dead letter ([`Store::dead_letter_insert`]);
//! - `row`: a dead letter as its row holds it;
//! - `text`: [`NewDeadLetter`] and the lossless encoding of its text;
//! - `filter`: [`DeadLetterFilter`] and the SQL every query over the archive shares;
//! - `search`: what a dead letter is found by ([`BodyField`], [`SearchTerms`]), worked out
//!   when it is archived; `search_page`: a search's page, its cost capped by
//!   [`SEARCH_EXAMINED_MAX`];
//! - `hours`: dead letters per hour, for the console's charts;
//! - `history`: each replay and edit of a dead letter ([`DeadLetterEvent`]), the claims they
//!   take and the marks they leave; `edit_claims`: the claim an edited copy holds on its
//!   idempotency key until it settles ([`EditKeyClaim`]).

use sqlx::AssertSqlSafe;

use super::{PURGE_CHUNK, Store, StoreError};
use filter::arguments;
use row::COLUMNS;

mod archive;
mod edit_claims;
mod filter;
mod history;
mod hours;
mod row;
mod search;
mod search_page;
mod text;

pub use edit_claims::{EditKeyClaim, HeldEditClaim, KeyTaken};
pub use filter::DeadLetterFilter;
pub use history::DeadLetterEvent;
pub use hours::{DeadLetterHour, HOUR_MS};
pub use search::{
    BodyField, MAX_FIELD_BYTES, MAX_FIELDS, MAX_INDEXED_BODY, SearchTerms, body_fields,
};
pub use search_page::{DeadLetterPage, SEARCH_EXAMINED_MAX};
pub use text::NewDeadLetter;

#[cfg(test)]
pub(in crate::store) use filter::arguments as filter_arguments;

/// An archived dead letter: the message as it was archived, and the archive's bookkeeping.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetter {
    /// Archive id.
    pub id: i64,
    /// What was archived, its text exactly as given (see `stored_encoded`).
    pub letter: NewDeadLetter,
    /// Last replay, unix ms.
    pub replayed_at: Option<i64>,
    /// Number of replays.
    pub replay_count: i64,
    /// Some text field could not be stored verbatim in its column (NUL byte, too long): the
    /// columns hold a visible stand-in, and the fields here are the originals.
    pub stored_encoded: bool,
    /// The dead letter whose replay (or edited copy) this one is (its sealed
    /// `x-carteiro-replay-of` header), if it is one.
    pub replay_of: Option<i64>,
    /// When an edited copy of it was last sent (unix ms): its original is never replayed again.
    pub edited_at: Option<i64>,
}

impl DeadLetter {
    /// The first header `name` it was archived with (an AMQP property: `:message-id`, ...).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.letter
            .headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

#[cfg(test)]
impl DeadLetter {
    /// Dead letter `id` with `headers` and `body`, as archived from route `orders` (reason
    /// `boom`, plugin `p`, one attempt) and never replayed nor edited: for tests.
    pub(crate) fn fixture(id: i64, headers: Vec<(String, String)>, body: &[u8]) -> DeadLetter {
        DeadLetter {
            id,
            letter: NewDeadLetter {
                route: "orders".into(),
                queue: "orders".into(),
                reason: "boom".into(),
                plugin: Some("p".into()),
                attempts: 1,
                headers,
                body: body.to_vec(),
                first_failed_at: None,
                dead_lettered_at: 1,
            },
            replayed_at: None,
            replay_count: 0,
            stored_encoded: false,
            replay_of: None,
            edited_at: None,
        }
    }
}

/// Count of dead letters per route and reason.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct DeadLetterStat {
    /// Route.
    pub route: String,
    /// Reason.
    pub reason: String,
    /// All archived.
    pub count: i64,
    /// Not replayed yet.
    pub unreplayed: i64,
    /// Oldest `dead_lettered_at` (unix ms).
    pub first_at: i64,
    /// Newest `dead_lettered_at` (unix ms).
    pub last_at: i64,
}

impl Store {
    /// Lists dead letters matching `filter`, newest first: the rows of
    /// [`Store::dead_letters_search`], so a search reads at most [`SEARCH_EXAMINED_MAX`]
    /// index entries (that page also says where a search stopped short).
    pub async fn dead_letters_list(
        &self,
        filter: &DeadLetterFilter,
    ) -> Result<Vec<DeadLetter>, StoreError> {
        Ok(self.dead_letters_search(filter).await?.rows)
    }

    /// Up to `limit` dead letters matching `filter`, oldest first (id order), after
    /// `filter.after_id`: the pages a replay walks through.
    pub async fn dead_letters_oldest_first(
        &self,
        filter: &DeadLetterFilter,
        limit: i64,
    ) -> Result<Vec<DeadLetter>, StoreError> {
        self.dead_letters_in_order("dead letters page", filter, false, limit)
            .await
    }

    /// Up to `limit` dead letters matching `filter`, in id order (newest first when
    /// `descending`); `what` names the operation in a timeout error.
    async fn dead_letters_in_order(
        &self,
        what: &str,
        filter: &DeadLetterFilter,
        descending: bool,
        limit: i64,
    ) -> Result<Vec<DeadLetter>, StoreError> {
        let query = self.page_sql(filter, descending, limit);
        self.bounded(what, self.filtered_dead_letters(query)).await
    }

    /// How many dead letters match `filter` (its `limit` is ignored).
    pub async fn dead_letters_count(&self, filter: &DeadLetterFilter) -> Result<i64, StoreError> {
        let count = self
            .dead_letters_number("dead letters count", filter, "SELECT COUNT(*)")
            .await?;
        Ok(count.unwrap_or(0))
    }

    /// The highest id among the dead letters matching `filter`.
    pub async fn dead_letters_max_id(
        &self,
        filter: &DeadLetterFilter,
    ) -> Result<Option<i64>, StoreError> {
        self.dead_letters_number("dead letters max id", filter, "SELECT MAX(id)")
            .await
    }

    /// One number over the dead letters matching `filter`: `select` is its `SELECT` clause
    /// (an aggregate; `None` where SQL gives NULL). `what` names it in a timeout error.
    async fn dead_letters_number(
        &self,
        what: &str,
        filter: &DeadLetterFilter,
        select: &str,
    ) -> Result<Option<i64>, StoreError> {
        self.bounded(what, async {
            let (sql, args) = self.filter_sql(filter, select);
            let number: Option<i64> = sqlx::query_scalar_with(AssertSqlSafe(sql), arguments(args)?)
                .fetch_one(self.pool())
                .await?;
            Ok(number)
        })
        .await
    }

    /// One dead letter by id.
    pub async fn dead_letter_get(&self, id: i64) -> Result<Option<DeadLetter>, StoreError> {
        let found = self
            .dead_letters_where("dead letter get", "id = $1", id)
            .await?;
        Ok(found.into_iter().next())
    }

    /// The dead letters that replays (or edited copies) of dead letter `id` became again,
    /// oldest first (at most 100): the rows whose `replay_of` is `id`.
    pub async fn dead_letters_replaying(&self, id: i64) -> Result<Vec<DeadLetter>, StoreError> {
        let condition = "replay_of = $1 ORDER BY id LIMIT 100";
        self.dead_letters_where("dead letters replaying", condition, id)
            .await
    }

    /// The dead letters `condition` (what follows `WHERE`, `$1` bound to `value`) selects;
    /// `what` names the operation in a timeout error.
    async fn dead_letters_where(
        &self,
        what: &str,
        condition: &str,
        value: i64,
    ) -> Result<Vec<DeadLetter>, StoreError> {
        self.bounded(what, async {
            let sql = format!("SELECT {COLUMNS} FROM dead_letters WHERE {condition}");
            let rows = sqlx::query_as(AssertSqlSafe(sql))
                .bind(value)
                .fetch_all(self.pool())
                .await?;
            row::dead_letters(rows)
        })
        .await
    }

    /// Counts per (route, reason), largest first.
    pub async fn dead_letter_stats(&self) -> Result<Vec<DeadLetterStat>, StoreError> {
        self.dead_letter_groups(&DeadLetterFilter::default()).await
    }

    /// Counts per (route, reason) of the dead letters matching `filter`, largest first.
    /// Reasons are the stored text (a visible stand-in where the original had a NUL).
    pub async fn dead_letter_groups(
        &self,
        filter: &DeadLetterFilter,
    ) -> Result<Vec<DeadLetterStat>, StoreError> {
        let query = self.groups_sql(filter);
        self.bounded("dead letter groups", self.filtered_rows(query))
            .await
    }

    /// Deletes the dead letters matching `filter` (its `limit` is ignored), in chunks of
    /// [`PURGE_CHUNK`] rows, one short transaction each; their search fields and history go
    /// with each chunk (a trigger on SQLite, `ON DELETE CASCADE` on PostgreSQL).
    pub async fn dead_letters_purge(&self, filter: &DeadLetterFilter) -> Result<u64, StoreError> {
        let mut total = 0;
        loop {
            let purged = self
                .bounded("dead letters purge", async {
                    let (select, args) = self.filter_sql(filter, "SELECT id");
                    let sql = format!(
                        "DELETE FROM dead_letters WHERE id IN ({select} LIMIT {PURGE_CHUNK})"
                    );
                    let query = sqlx::query_with(AssertSqlSafe(sql), arguments(args)?);
                    self.execute_write(query).await
                })
                .await?;
            total += purged;
            if purged < PURGE_CHUNK {
                break;
            }
        }
        Ok(total)
    }

    /// Retention (`[dead_letters] retain`): deletes the dead letters dead-lettered before
    /// `cutoff_ms` (the rows `dlq purge --older-than` selects) that were replayed at least
    /// once, or (`replayed_only` false) all of them, in batches (`Store::purge_where`). A row
    /// that a running replay holds a claim on is left for a later pass. The replayed ones
    /// are found by the `dead_letters_replayed_time` index (migration 0009), so a pass reads
    /// only what it deletes, however many unreplayed dead letters are kept.
    pub async fn dead_letters_purge_expired(
        &self,
        cutoff_ms: i64,
        replayed_only: bool,
    ) -> Result<u64, StoreError> {
        let clock = self.dialect.clock_ms();
        let unclaimed = format!("(replaying_by IS NULL OR replaying_until < {clock})");
        let (index, condition) = if replayed_only {
            (
                "dead_letters_replayed_time",
                format!("replayed_at IS NOT NULL AND dead_lettered_at < $1 AND {unclaimed}"),
            )
        } else {
            (
                "dead_letters_time",
                format!("dead_lettered_at < $1 AND {unclaimed}"),
            )
        };
        self.purge_where("dead_letters", Some(index), &condition, cutoff_ms)
            .await
    }
}
