//! The dead-letter archive: every message that gave up, with its reason (G4), queryable and
//! replayable by operators. Any dead letter can be archived, whatever its text: see
//! `text` for how text the columns cannot hold is stored losslessly.

use sqlx::any::{AnyArguments, AnyRow};
use sqlx::{Arguments, AssertSqlSafe, Row};

use super::{Backend, PURGE_CHUNK, Store, StoreError, headers_from_json};
use crate::common::header_names::REPLAY_OF;
use text::{SHORT_MAX, TEXT_MAX, stand_in};

mod edit_claims;
mod history;
mod hours;
mod search;
mod search_page;
mod text;

pub use edit_claims::{EditKeyClaim, HeldEditClaim, KeyTaken};
pub use history::DeadLetterEvent;
pub use hours::{DeadLetterHour, HOUR_MS};
pub use search::{
    BodyField, MAX_FIELD_BYTES, MAX_FIELDS, MAX_INDEXED_BODY, SearchTerms, body_fields,
};
pub use search_page::{DeadLetterPage, SEARCH_EXAMINED_MAX};
pub use text::NewDeadLetter;

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

/// Which dead letters to list or purge; every field narrows the set.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeadLetterFilter {
    /// Exactly this route.
    pub route: Option<String>,
    /// Reason contains this text (case-sensitive).
    pub reason_contains: Option<String>,
    /// Dead-lettered at or after (unix ms).
    pub since_ms: Option<i64>,
    /// Dead-lettered before (unix ms).
    pub until_ms: Option<i64>,
    /// `Some(false)`: never replayed; `Some(true)`: replayed at least once.
    pub replayed: Option<bool>,
    /// Only ids below this (paging newest first: pass the last id of the previous page).
    pub before_id: Option<i64>,
    /// Only ids above this (paging oldest first, as replay does).
    pub after_id: Option<i64>,
    /// At most this many (newest first); ignored by purge and counts. Default 100.
    pub limit: Option<i64>,
    /// Reason is exactly one of these (a console group: the reasons that normalise alike).
    pub reasons: Option<Vec<String>>,
    /// Id is one of these (a console selection).
    pub ids: Option<Vec<i64>>,
    /// Message id, correlation id and body fields, answered from the search indexes
    /// (migration 0011; a query is parsed into them by `dlq::search`).
    pub search: SearchTerms,
}

/// Count of dead letters per route and reason.
#[derive(Debug, Clone, PartialEq, Eq)]
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

const COLUMNS: &str = "id, route, queue, reason, plugin, attempts, headers, body, \
                       first_failed_at, dead_lettered_at, replayed_at, replay_count, original, \
                       replay_of, edited_at";

enum Arg {
    Int(i64),
    Text(String),
}

impl Store {
    /// Archives one dead letter; returns its id.
    ///
    /// Accepts any `NewDeadLetter`: its text is stored in the lossless encoding of
    /// `text`, so the row always fits the schema, and the only error is
    /// [`StoreError::Unavailable`]: the store is down, too slow, read-only, full, or does
    /// not have the schema Carteiro migrated (any refusal of an encoded row means that).
    /// The caller requeues and pauses; it never needs to park or drop the message.
    ///
    /// What it will be found by is worked out here, once (`search`): its message
    /// and correlation ids, and at most 64 fields of a JSON body, written in the same
    /// transaction (one more statement: the rows of `dead_letter_fields`).
    pub async fn dead_letter_insert(&self, dl: &NewDeadLetter) -> Result<i64, StoreError> {
        let stored = text::encode(dl);
        let search = search::search_columns(dl);
        // A replay or edited copy names the dead letter it came from (a sealed header: the
        // archiver and the pipeline pass only trusted Carteiro headers on).
        let replay_of = dl
            .headers
            .iter()
            .find(|(name, _)| name == REPLAY_OF)
            .and_then(|(_, value)| value.trim().parse::<i64>().ok());
        let insert = "INSERT INTO dead_letters (route, queue, reason, plugin, attempts, headers, \
                      body, first_failed_at, dead_lettered_at, replay_count, original, replay_of, \
                      message_id, correlation_id) \
                      VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, 0, $10, $11, $12, $13) \
                      RETURNING id";
        let field_rows = search::fields_rows(&search.fields);
        let insert_fields = match self.backend {
            Backend::Sqlite => {
                "INSERT OR IGNORE INTO dead_letter_fields (path, value, dead_letter_id) \
                 SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]'), $2 \
                 FROM json_each($1)"
            }
            Backend::Postgres => {
                "INSERT INTO dead_letter_fields (path, value, dead_letter_id) \
                 SELECT e ->> 0, e ->> 1, $2 FROM jsonb_array_elements(CAST($1 AS jsonb)) AS e \
                 ON CONFLICT DO NOTHING"
            }
        };
        self.bounded("dead letter insert", async {
            let mut tx = self.begin_write().await?;
            let id: i64 = sqlx::query_scalar(insert)
                .bind(stored.route.as_str())
                .bind(stored.queue.as_str())
                .bind(stored.reason.as_str())
                .bind(stored.plugin.as_deref())
                .bind(dl.attempts)
                .bind(stored.headers.as_str())
                .bind(dl.body.as_slice())
                .bind(dl.first_failed_at)
                .bind(dl.dead_lettered_at)
                .bind(stored.original.as_deref())
                .bind(replay_of)
                .bind(search.message_id.as_deref())
                .bind(search.correlation_id.as_deref())
                .fetch_one(&mut *tx)
                .await?;
            if let Some(rows) = &field_rows {
                sqlx::query(insert_fields)
                    .bind(rows.as_str())
                    .bind(id)
                    .execute(&mut *tx)
                    .await?;
            }
            if let Some(of) = replay_of {
                let route = stored.route.as_str();
                let message_id = dl
                    .headers
                    .iter()
                    .find(|(name, _)| name == crate::common::header_names::PROP_MESSAGE_ID)
                    .map(|(_, value)| value.as_str());
                edit_claims::settle(&mut tx, of, route, message_id).await?;
            }
            tx.commit().await?;
            Ok(id)
        })
        .await
        .map_err(|e| match e {
            StoreError::Unavailable(m) => StoreError::Unavailable(m),
            other => StoreError::Unavailable(format!(
                "the store refused an encoded dead letter, so its schema or settings are not \
                 the ones Carteiro migrated: {other}"
            )),
        })
    }

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
        self.bounded(what, async {
            let (sql, args) = self.page_sql(filter, descending, limit);
            let rows = sqlx::query_with(AssertSqlSafe(sql), arguments(args)?)
                .fetch_all(self.pool())
                .await?;
            rows.iter().map(dead_letter).collect()
        })
        .await
    }

    /// The query of [`Store::dead_letters_in_order`].
    fn page_sql(
        &self,
        filter: &DeadLetterFilter,
        descending: bool,
        limit: i64,
    ) -> (String, Vec<Arg>) {
        let (mut sql, mut args) = self.filter_sql(filter, &format!("SELECT {COLUMNS}"));
        args.push(Arg::Int(limit.max(0)));
        let key = filter.search.id_column();
        let direction = if descending { " DESC" } else { "" };
        sql.push_str(&format!(" ORDER BY {key}{direction} LIMIT ${}", args.len()));
        (sql, args)
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
            let rows = sqlx::query(AssertSqlSafe(sql))
                .bind(value)
                .fetch_all(self.pool())
                .await?;
            rows.iter().map(dead_letter).collect()
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
        self.bounded("dead letter groups", async {
            let (sql, args) = self.groups_sql(filter);
            let rows: Vec<(String, String, i64, i64, i64, i64)> =
                sqlx::query_as_with(AssertSqlSafe(sql), arguments(args)?)
                    .fetch_all(self.pool())
                    .await?;
            Ok(rows
                .into_iter()
                .map(
                    |(route, reason, count, unreplayed, first_at, last_at)| DeadLetterStat {
                        route,
                        reason,
                        count,
                        unreplayed,
                        first_at,
                        last_at,
                    },
                )
                .collect())
        })
        .await
    }

    /// The groups query: on SQLite it reads the `dead_letters_groups` covering index alone
    /// (migration 0008).
    fn groups_sql(&self, filter: &DeadLetterFilter) -> (String, Vec<Arg>) {
        let (mut sql, args) = self.filter_sql(
            filter,
            "SELECT route, reason, COUNT(*), COUNT(*) - COUNT(replayed_at), \
             MIN(dead_lettered_at), MAX(dead_lettered_at)",
        );
        sql.push_str(" GROUP BY route, reason ORDER BY 3 DESC, route, reason");
        (sql, args)
    }

    /// The plan of a page of `filter`, newest first (the console's, `dlq list`'s), for tests:
    /// SQLite's `EXPLAIN QUERY PLAN` details; PostgreSQL's `EXPLAIN` lines with sequential
    /// scans and plain index walks priced out (`enable_seqscan`, `enable_indexscan` off: on a
    /// test-sized table a walk of the primary key can look as cheap as anything), so the plan
    /// names the index a search can be answered from, if there is one.
    #[cfg(test)]
    pub(crate) async fn page_plan(&self, filter: &DeadLetterFilter) -> Vec<String> {
        let (sql, args) = self.page_sql(filter, true, 100);
        let args = arguments(args).expect("arguments");
        match self.backend {
            Backend::Sqlite => {
                let rows: Vec<(i64, i64, i64, String)> =
                    sqlx::query_as_with(AssertSqlSafe(format!("EXPLAIN QUERY PLAN {sql}")), args)
                        .fetch_all(self.pool())
                        .await
                        .expect("plan");
                rows.into_iter().map(|r| r.3).collect()
            }
            Backend::Postgres => {
                let mut tx = self.pool().begin().await.expect("begin");
                for setting in ["enable_seqscan", "enable_indexscan"] {
                    sqlx::query(AssertSqlSafe(format!("SET LOCAL {setting} = off")))
                        .execute(&mut *tx)
                        .await
                        .expect("set");
                }
                let rows: Vec<(String,)> =
                    sqlx::query_as_with(AssertSqlSafe(format!("EXPLAIN {sql}")), args)
                        .fetch_all(&mut *tx)
                        .await
                        .expect("plan");
                tx.rollback().await.expect("rollback");
                rows.into_iter().map(|r| r.0).collect()
            }
        }
    }

    /// SQLite's plan of the groups query (`EXPLAIN QUERY PLAN`), for tests.
    #[cfg(test)]
    pub(crate) async fn groups_plan(&self, filter: &DeadLetterFilter) -> Vec<String> {
        let (sql, args) = self.groups_sql(filter);
        let rows: Vec<(i64, i64, i64, String)> = sqlx::query_as_with(
            AssertSqlSafe(format!("EXPLAIN QUERY PLAN {sql}")),
            arguments(args).expect("arguments"),
        )
        .fetch_all(self.pool())
        .await
        .expect("plan");
        rows.into_iter().map(|r| r.3).collect()
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
        let clock = super::outbox::db_clock_ms(self.backend);
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

    /// `{head} FROM dead_letters WHERE ...` with `$n` placeholders; values stay bound. The
    /// search terms decide what the query starts from (`SearchTerms::tables_clause`: on SQLite,
    /// a body field's index joined to `dead_letters`). Text filters are compared with the
    /// stored text, so they go through the same stand-in as the columns (a NUL in a filter
    /// matches a stored `\u{0}`).
    fn filter_sql(&self, f: &DeadLetterFilter, head: &str) -> (String, Vec<Arg>) {
        let mut args = Vec::new();
        let mut bind = |text: String| {
            args.push(Arg::Text(text));
            args.len()
        };
        let mut sql = format!(
            "{head} FROM {}",
            f.search.tables_clause(self.backend, &mut bind)
        );
        f.search.conditions(&mut sql, &mut bind);
        self.other_conditions(f, f.search.id_column(), &mut sql, &mut args);
        (sql, args)
    }

    /// ` AND ...` for the filter's conditions other than its search terms; its id bounds on
    /// the column `id`.
    fn other_conditions(
        &self,
        f: &DeadLetterFilter,
        id: &str,
        sql: &mut String,
        args: &mut Vec<Arg>,
    ) {
        if let Some(route) = &f.route {
            args.push(Arg::Text(stand_in(route, SHORT_MAX)));
            sql.push_str(&format!(" AND route = ${}", args.len()));
        }
        if let Some(text) = &f.reason_contains {
            args.push(Arg::Text(stand_in(text, TEXT_MAX)));
            // instr/strpos rather than LIKE: no wildcard escaping to get wrong.
            let find = match self.backend {
                Backend::Sqlite => "instr",
                Backend::Postgres => "strpos",
            };
            sql.push_str(&format!(" AND {find}(reason, ${}) > 0", args.len()));
        }
        // A list as one JSON text, however long: no statement-size limit to run into.
        if let Some(reasons) = &f.reasons {
            let stored: Vec<String> = reasons.iter().map(|r| stand_in(r, TEXT_MAX)).collect();
            args.push(Arg::Text(serde_json::json!(stored).to_string()));
            let list = json_elements(self.backend, args.len(), false);
            sql.push_str(&format!(" AND reason IN ({list})"));
        }
        if let Some(ids) = &f.ids {
            args.push(Arg::Text(serde_json::json!(ids).to_string()));
            let list = json_elements(self.backend, args.len(), true);
            sql.push_str(&format!(" AND id IN ({list})"));
        }
        let bounds = [
            ("dead_lettered_at", ">=", f.since_ms),
            ("dead_lettered_at", "<", f.until_ms),
            (id, "<", f.before_id),
            (id, ">", f.after_id),
        ];
        for (column, bound, value) in bounds {
            if let Some(value) = value {
                args.push(Arg::Int(value));
                sql.push_str(&format!(" AND {column} {bound} ${}", args.len()));
            }
        }
        match f.replayed {
            Some(true) => sql.push_str(" AND replayed_at IS NOT NULL"),
            Some(false) => sql.push_str(" AND replayed_at IS NULL"),
            None => {}
        }
    }
}

/// A subquery of the elements of the JSON array bound as `$n` (one bound text, however long
/// the list: no statement-size limit), as BIGINT when `bigint` (PostgreSQL's are text).
fn json_elements(backend: Backend, n: usize, bigint: bool) -> String {
    match backend {
        Backend::Sqlite => format!("SELECT value FROM json_each(${n})"),
        Backend::Postgres if bigint => {
            format!("SELECT CAST(jsonb_array_elements_text(CAST(${n} AS jsonb)) AS BIGINT)")
        }
        Backend::Postgres => format!("SELECT jsonb_array_elements_text(CAST(${n} AS jsonb))"),
    }
}

/// A filter's values as one argument list, in the order of its placeholders.
fn arguments(args: Vec<Arg>) -> Result<AnyArguments, StoreError> {
    let mut out = AnyArguments::default();
    for arg in args {
        match arg {
            Arg::Int(i) => out.add(i),
            Arg::Text(t) => out.add(t),
        }
        .map_err(|e| StoreError::Database(format!("cannot bind a dead-letter filter: {e}")))?;
    }
    Ok(out)
}

fn dead_letter(row: &AnyRow) -> Result<DeadLetter, StoreError> {
    let headers: String = row.try_get("headers")?;
    let original: Option<String> = row.try_get("original")?;
    let stored_encoded = original.is_some();
    let original = text::decode(original.as_deref()).unwrap_or_default();
    let route: String = row.try_get("route")?;
    let queue: String = row.try_get("queue")?;
    let reason: String = row.try_get("reason")?;
    let plugin: Option<String> = row.try_get("plugin")?;
    Ok(DeadLetter {
        id: row.try_get("id")?,
        letter: NewDeadLetter {
            route: original.route.unwrap_or(route),
            queue: original.queue.unwrap_or(queue),
            reason: original.reason.unwrap_or(reason),
            plugin: original.plugin.or(plugin),
            attempts: row.try_get("attempts")?,
            headers: headers_from_json(&headers)?,
            body: row.try_get("body")?,
            first_failed_at: row.try_get("first_failed_at")?,
            dead_lettered_at: row.try_get("dead_lettered_at")?,
        },
        replayed_at: row.try_get("replayed_at")?,
        replay_count: row.try_get("replay_count")?,
        stored_encoded,
        replay_of: row.try_get("replay_of")?,
        edited_at: row.try_get("edited_at")?,
    })
}
