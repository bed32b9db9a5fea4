//! The dead-letter archive: every message that gave up, with its reason (G4), queryable and
//! replayable by operators.

use sqlx::any::AnyRow;
use sqlx::{AssertSqlSafe, Row};

use super::{Backend, Store, StoreError, headers_from_json, headers_to_json, now_ms, validate};

/// A message to archive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewDeadLetter {
    /// Route it belonged to.
    pub route: String,
    /// Queue it was consumed from (usually `Q.dlq`).
    pub queue: String,
    /// Why it was dead-lettered. NUL bytes are replaced (a reason must never block archiving).
    pub reason: String,
    /// Plugin that handled it, when known.
    pub plugin: Option<String>,
    /// Delivery attempts made.
    pub attempts: i64,
    /// AMQP headers, in order.
    pub headers: Vec<(String, String)>,
    /// Body, verbatim.
    pub body: Vec<u8>,
    /// Unix ms of the first failure, when known.
    pub first_failed_at: Option<i64>,
    /// Unix ms it was dead-lettered.
    pub dead_lettered_at: i64,
}

/// An archived dead letter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetter {
    /// Archive id.
    pub id: i64,
    /// Route.
    pub route: String,
    /// Queue it was archived from.
    pub queue: String,
    /// Why.
    pub reason: String,
    /// Plugin, when known.
    pub plugin: Option<String>,
    /// Delivery attempts.
    pub attempts: i64,
    /// AMQP headers.
    pub headers: Vec<(String, String)>,
    /// Body.
    pub body: Vec<u8>,
    /// First failure, unix ms.
    pub first_failed_at: Option<i64>,
    /// Dead-lettered, unix ms.
    pub dead_lettered_at: i64,
    /// Last replay, unix ms.
    pub replayed_at: Option<i64>,
    /// Number of replays.
    pub replay_count: i64,
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
    /// Only ids below this (paging: pass the last id of the previous page).
    pub before_id: Option<i64>,
    /// At most this many (newest first); ignored by purge. Default 100.
    pub limit: Option<i64>,
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
}

const COLUMNS: &str = "id, route, queue, reason, plugin, attempts, headers, body, \
                       first_failed_at, dead_lettered_at, replayed_at, replay_count";

enum Arg {
    Int(i64),
    Text(String),
}

impl Store {
    /// Archives one dead letter; returns its id.
    pub async fn dead_letter_insert(&self, dl: &NewDeadLetter) -> Result<i64, StoreError> {
        validate::text("route", &dl.route)?;
        validate::text("queue", &dl.queue)?;
        if let Some(p) = &dl.plugin {
            validate::text("plugin", p)?;
        }
        let mut tx = self.begin_write().await?;
        let id: i64 = sqlx::query_scalar(
            "INSERT INTO dead_letters (route, queue, reason, plugin, attempts, headers, body, \
             first_failed_at, dead_lettered_at, replay_count) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, 0) RETURNING id",
        )
        .bind(dl.route.as_str())
        .bind(dl.queue.as_str())
        .bind(validate::lossy(&dl.reason))
        .bind(dl.plugin.as_deref())
        .bind(dl.attempts)
        .bind(headers_to_json(&dl.headers))
        .bind(dl.body.as_slice())
        .bind(dl.first_failed_at)
        .bind(dl.dead_lettered_at)
        .fetch_one(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(id)
    }

    /// Lists dead letters matching `filter`, newest first.
    pub async fn dead_letters_list(
        &self,
        filter: &DeadLetterFilter,
    ) -> Result<Vec<DeadLetter>, StoreError> {
        let (mut sql, mut args) = self.filter_sql(filter, &format!("SELECT {COLUMNS}"))?;
        args.push(Arg::Int(filter.limit.unwrap_or(100).max(0)));
        sql.push_str(&format!(" ORDER BY id DESC LIMIT ${}", args.len()));
        let mut query = sqlx::query(AssertSqlSafe(sql));
        for arg in args {
            query = match arg {
                Arg::Int(i) => query.bind(i),
                Arg::Text(t) => query.bind(t),
            };
        }
        let rows = query.fetch_all(self.pool()).await?;
        rows.iter().map(dead_letter).collect()
    }

    /// One dead letter by id.
    pub async fn dead_letter_get(&self, id: i64) -> Result<Option<DeadLetter>, StoreError> {
        let sql = format!("SELECT {COLUMNS} FROM dead_letters WHERE id = $1");
        let row = sqlx::query(AssertSqlSafe(sql))
            .bind(id)
            .fetch_optional(self.pool())
            .await?;
        row.as_ref().map(dead_letter).transpose()
    }

    /// Counts per (route, reason), largest first.
    pub async fn dead_letter_stats(&self) -> Result<Vec<DeadLetterStat>, StoreError> {
        let rows: Vec<(String, String, i64, i64)> = sqlx::query_as(
            "SELECT route, reason, COUNT(*), COUNT(*) - COUNT(replayed_at) FROM dead_letters \
             GROUP BY route, reason ORDER BY 3 DESC, route, reason",
        )
        .fetch_all(self.pool())
        .await?;
        Ok(rows
            .into_iter()
            .map(|(route, reason, count, unreplayed)| DeadLetterStat {
                route,
                reason,
                count,
                unreplayed,
            })
            .collect())
    }

    /// Records a replay of `id` (after the copy was republished and confirmed).
    pub async fn dead_letter_mark_replayed(&self, id: i64) -> Result<(), StoreError> {
        let mut tx = self.begin_write().await?;
        let done = sqlx::query(
            "UPDATE dead_letters SET replayed_at = $2, replay_count = replay_count + 1 \
             WHERE id = $1",
        )
        .bind(id)
        .bind(now_ms())
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        if done.rows_affected() == 0 {
            return Err(StoreError::Invalid(format!("no dead letter with id {id}")));
        }
        Ok(())
    }

    /// Deletes the dead letters matching `filter` (its `limit` is ignored).
    pub async fn dead_letters_purge(&self, filter: &DeadLetterFilter) -> Result<u64, StoreError> {
        let (sql, args) = self.filter_sql(filter, "DELETE")?;
        let mut query = sqlx::query(AssertSqlSafe(sql));
        for arg in args {
            query = match arg {
                Arg::Int(i) => query.bind(i),
                Arg::Text(t) => query.bind(t),
            };
        }
        let mut tx = self.begin_write().await?;
        let purged = query.execute(&mut *tx).await?.rows_affected();
        tx.commit().await?;
        Ok(purged)
    }

    /// `{head} FROM dead_letters WHERE ...` with `$n` placeholders; values stay bound.
    fn filter_sql(
        &self,
        f: &DeadLetterFilter,
        head: &str,
    ) -> Result<(String, Vec<Arg>), StoreError> {
        let mut sql = format!("{head} FROM dead_letters WHERE 1 = 1");
        let mut args = Vec::new();
        if let Some(route) = &f.route {
            validate::text("route filter", route)?;
            args.push(Arg::Text(route.clone()));
            sql.push_str(&format!(" AND route = ${}", args.len()));
        }
        if let Some(text) = &f.reason_contains {
            validate::text("reason filter", text)?;
            args.push(Arg::Text(text.clone()));
            // instr/strpos rather than LIKE: no wildcard escaping to get wrong.
            let find = match self.backend {
                Backend::Sqlite => "instr",
                Backend::Postgres => "strpos",
            };
            sql.push_str(&format!(" AND {find}(reason, ${}) > 0", args.len()));
        }
        if let Some(since) = f.since_ms {
            args.push(Arg::Int(since));
            sql.push_str(&format!(" AND dead_lettered_at >= ${}", args.len()));
        }
        if let Some(until) = f.until_ms {
            args.push(Arg::Int(until));
            sql.push_str(&format!(" AND dead_lettered_at < ${}", args.len()));
        }
        match f.replayed {
            Some(true) => sql.push_str(" AND replayed_at IS NOT NULL"),
            Some(false) => sql.push_str(" AND replayed_at IS NULL"),
            None => {}
        }
        if let Some(before) = f.before_id {
            args.push(Arg::Int(before));
            sql.push_str(&format!(" AND id < ${}", args.len()));
        }
        Ok((sql, args))
    }
}

fn dead_letter(row: &AnyRow) -> Result<DeadLetter, StoreError> {
    let headers: String = row.try_get("headers")?;
    Ok(DeadLetter {
        id: row.try_get("id")?,
        route: row.try_get("route")?,
        queue: row.try_get("queue")?,
        reason: row.try_get("reason")?,
        plugin: row.try_get("plugin")?,
        attempts: row.try_get("attempts")?,
        headers: headers_from_json(&headers)?,
        body: row.try_get("body")?,
        first_failed_at: row.try_get("first_failed_at")?,
        dead_lettered_at: row.try_get("dead_lettered_at")?,
        replayed_at: row.try_get("replayed_at")?,
        replay_count: row.try_get("replay_count")?,
    })
}
