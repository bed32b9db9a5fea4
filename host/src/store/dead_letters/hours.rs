//! Dead letters per hour, for the console's charts: how many of each (route, reason) were
//! dead-lettered in each hour of a window. One grouped query whose bucket is integer
//! arithmetic, `(dead_lettered_at - since) / 3600000`, the same text on SQLite and
//! PostgreSQL (both divide integers as integers, and every row is at or after `since`). It
//! reads only the window's rows of the dead letters the filter selects (the groups a page
//! shows), found by the time indexes of migration 0001 (`dead_letters_route_time`,
//! `dead_letters_time`).

use super::DeadLetterFilter;
use super::filter::Arg;
use crate::store::{Store, StoreError};

/// One hour in milliseconds.
pub const HOUR_MS: i64 = 3_600_000;

/// How many dead letters of one (route, reason) a window's hour holds.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct DeadLetterHour {
    /// Route.
    pub route: String,
    /// Reason, as stored (the text `dead_letter_groups` gives too).
    pub reason: String,
    /// The hour: 0 is the first of the window.
    pub hour: i64,
    /// Dead letters of that hour.
    pub count: i64,
}

impl Store {
    /// The dead letters matching `filter` (its time bounds and limit are not used) per
    /// (route, reason) and hour, over the `hours` hours from `since_ms`: hour `n` holds those
    /// dead-lettered in `[since_ms + n h, since_ms + (n + 1) h)`. Hours without any are not
    /// listed. Ordered by route, reason and hour.
    pub async fn dead_letters_per_hour(
        &self,
        filter: &DeadLetterFilter,
        since_ms: i64,
        hours: u32,
    ) -> Result<Vec<DeadLetterHour>, StoreError> {
        let query = self.per_hour_sql(filter, since_ms, hours);
        self.bounded("dead letters per hour", self.filtered_rows(query))
            .await
    }

    /// The filter's rows within the window, then grouped by their hour of it.
    fn per_hour_sql(
        &self,
        filter: &DeadLetterFilter,
        since_ms: i64,
        hours: u32,
    ) -> (String, Vec<Arg>) {
        let window = DeadLetterFilter {
            since_ms: Some(since_ms),
            until_ms: Some(since_ms.saturating_add(i64::from(hours) * HOUR_MS)),
            limit: None,
            ..filter.clone()
        };
        let (rows, mut args) = self.filter_sql(&window, "SELECT route, reason, dead_lettered_at");
        args.push(Arg::Int(since_ms));
        let since = args.len();
        let sql = format!(
            "SELECT route, reason, (dead_lettered_at - ${since}) / {HOUR_MS} AS hour, \
             COUNT(*) AS count \
             FROM ({rows}) AS window_rows GROUP BY route, reason, 3 ORDER BY route, reason, 3"
        );
        (sql, args)
    }
}
