//! A [`DeadLetterFilter`] as SQL: the `FROM ... WHERE ...` every query over the archive
//! shares (lists, counts, groups, purges, a search page), its values bound in the order of
//! their placeholders.

use sqlx::any::{AnyArguments, AnyRow};
use sqlx::{Arguments, AssertSqlSafe, FromRow};

use super::DeadLetter;
use super::row::{self, COLUMNS};
use super::search::SearchTerms;
use super::text::{SHORT_MAX, TEXT_MAX, stand_in};
use crate::store::{Store, StoreError};

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

/// A value bound to a filter's query.
pub(in crate::store) enum Arg {
    Int(i64),
    Text(String),
}

impl Store {
    /// The rows of a filter's query (`(sql, args)`, as the `*_sql` methods give it), read as
    /// `T` (no timeout of its own).
    pub(super) async fn filtered_rows<T>(
        &self,
        (sql, args): (String, Vec<Arg>),
    ) -> Result<Vec<T>, StoreError>
    where
        T: for<'r> FromRow<'r, AnyRow> + Send + Unpin,
    {
        let rows = sqlx::query_as_with(AssertSqlSafe(sql), arguments(args)?)
            .fetch_all(self.pool())
            .await?;
        Ok(rows)
    }

    /// The dead letters a filter's query selects ([`Store::filtered_rows`]).
    pub(super) async fn filtered_dead_letters(
        &self,
        query: (String, Vec<Arg>),
    ) -> Result<Vec<DeadLetter>, StoreError> {
        row::dead_letters(self.filtered_rows(query).await?)
    }

    /// The query of [`Store::dead_letters_in_order`].
    pub(in crate::store) fn page_sql(
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

    /// The groups query: on SQLite it reads the `dead_letters_groups` covering index alone
    /// (migration 0008).
    pub(in crate::store) fn groups_sql(&self, filter: &DeadLetterFilter) -> (String, Vec<Arg>) {
        let (mut sql, args) = self.filter_sql(
            filter,
            "SELECT route, reason, COUNT(*) AS count, \
             COUNT(*) - COUNT(replayed_at) AS unreplayed, MIN(dead_lettered_at) AS first_at, \
             MAX(dead_lettered_at) AS last_at",
        );
        sql.push_str(" GROUP BY route, reason ORDER BY 3 DESC, route, reason");
        (sql, args)
    }

    /// `{head} FROM dead_letters WHERE ...` with `$n` placeholders; values stay bound. The
    /// search terms decide what the query starts from (`SearchTerms::tables_clause`: on SQLite,
    /// a body field's index joined to `dead_letters`). Text filters are compared with the
    /// stored text, so they go through the same stand-in as the columns (a NUL in a filter
    /// matches a stored `\u{0}`).
    pub(super) fn filter_sql(&self, f: &DeadLetterFilter, head: &str) -> (String, Vec<Arg>) {
        let mut args = Vec::new();
        let mut bind = |text: String| {
            args.push(Arg::Text(text));
            args.len()
        };
        let mut sql = format!(
            "{head} FROM {}",
            f.search.tables_clause(self.dialect, &mut bind)
        );
        f.search.conditions(&mut sql, &mut bind);
        self.other_conditions(f, f.search.id_column(), &mut sql, &mut args);
        (sql, args)
    }

    /// ` AND ...` for the filter's conditions other than its search terms; its id bounds on
    /// the column `id`.
    pub(super) fn other_conditions(
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
            // Not LIKE: no wildcard escaping to get wrong.
            let needle = format!("${}", args.len());
            let contains = self.dialect.contains_text("reason", &needle);
            sql.push_str(&format!(" AND {contains}"));
        }
        // A list as one JSON text, however long: no statement-size limit to run into.
        if let Some(reasons) = &f.reasons {
            let stored: Vec<String> = reasons.iter().map(|r| stand_in(r, TEXT_MAX)).collect();
            args.push(Arg::Text(serde_json::json!(stored).to_string()));
            let list = self.dialect.json_array_values(args.len(), false);
            sql.push_str(&format!(" AND reason IN ({list})"));
        }
        if let Some(ids) = &f.ids {
            args.push(Arg::Text(serde_json::json!(ids).to_string()));
            let list = self.dialect.json_array_values(args.len(), true);
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

/// A filter's values as one argument list, in the order of its placeholders.
pub(in crate::store) fn arguments(args: Vec<Arg>) -> Result<AnyArguments, StoreError> {
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
