//! A page of a search, at a cost bounded by [`SEARCH_EXAMINED_MAX`] whatever the archive
//! holds. A search is driven by one index (its first body field's, else its message id's or
//! correlation id's: `SearchTerms::walk_sql`); its other terms and the filter's route, reason
//! or times are checked on the dead letters that index names. When most of what the index
//! names fails those checks (`body.status = "late" route:orders` where the late ones are all on
//! another route), filling a page would read every entry of the index. So a page reads at most
//! [`SEARCH_EXAMINED_MAX`] entries, newest first:
//! 1. the walk: how many entries the window holds, up to the cap, and its lowest id (the index
//!    alone, no dead letter read);
//! 2. the page: the dead letters of that window that match everything, newest first, up to the
//!    page's limit (the same query as an unbounded list, with the window's lowest id as a
//!    bound);
//! 3. when the window was full and the page is not: whether the index has entries below it.
//!    If so the search stopped there ([`DeadLetterPage::stopped_before`]): the page says so,
//!    and the next one continues below that id.

use sqlx::{AssertSqlSafe, Row};

use super::{Arg, COLUMNS, DeadLetter, DeadLetterFilter, arguments, dead_letter};
use crate::store::{Backend, Store, StoreError};

/// Index entries one page of a search reads at most (each names one dead letter, which is
/// then read by its id and checked against the other terms).
pub const SEARCH_EXAMINED_MAX: i64 = 10_000;

/// A page of dead letters a filter selects, and how much of the search index it read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetterPage {
    /// The dead letters, newest first.
    pub rows: Vec<DeadLetter>,
    /// Entries of the search index read to choose them (at most [`SEARCH_EXAMINED_MAX`]); 0
    /// for a filter without search terms, which reads no search index.
    pub examined: i64,
    /// The search stopped after [`SEARCH_EXAMINED_MAX`] entries, before filling the page:
    /// dead letters below this id were not looked at. The next page is `before_id` this id;
    /// a narrower first term (a message id, a rarer body field) reads fewer.
    pub stopped_before: Option<i64>,
}

/// The window a page is chosen from: entries read and the lowest id among them.
struct Window {
    examined: i64,
    lowest: Option<i64>,
}

impl Store {
    /// A page of the dead letters matching `filter`, newest first (`limit`, default 100),
    /// reading at most [`SEARCH_EXAMINED_MAX`] entries of the search index (module docs).
    pub async fn dead_letters_search(
        &self,
        filter: &DeadLetterFilter,
    ) -> Result<DeadLetterPage, StoreError> {
        let limit = filter.limit.unwrap_or(100).max(0);
        self.bounded("dead letters search", async {
            let Some((window, page)) = self.search_window(filter).await? else {
                let rows = self.page_rows(filter, limit).await?;
                return Ok(DeadLetterPage {
                    rows,
                    examined: 0,
                    stopped_before: None,
                });
            };
            let rows = self.search_rows(filter, &page, limit).await?;
            let stopped_before = match window.lowest {
                Some(lowest)
                    if window.examined >= SEARCH_EXAMINED_MAX && (rows.len() as i64) < limit =>
                {
                    let below = DeadLetterFilter {
                        before_id: Some(lowest),
                        ..filter.clone()
                    };
                    self.walk(&below, 1)
                        .await?
                        .examined
                        .gt(&0)
                        .then_some(lowest)
                }
                _ => None,
            };
            Ok(DeadLetterPage {
                rows,
                examined: window.examined,
                stopped_before,
            })
        })
        .await
    }

    /// The window of `filter`'s search and the filter its page is read with (bounded below
    /// by the window when the window is full); `None` without search terms.
    async fn search_window(
        &self,
        filter: &DeadLetterFilter,
    ) -> Result<Option<(Window, DeadLetterFilter)>, StoreError> {
        if filter.search.is_empty() {
            return Ok(None);
        }
        let window = self.walk(filter, SEARCH_EXAMINED_MAX).await?;
        let mut page = filter.clone();
        if let (true, Some(lowest)) = (window.examined >= SEARCH_EXAMINED_MAX, window.lowest) {
            page.after_id = Some(page.after_id.map_or(lowest - 1, |a| a.max(lowest - 1)));
        }
        Ok(Some((window, page)))
    }

    /// How many of the first `cap` entries of the index `filter`'s search is driven by are
    /// within its id bounds, and the lowest of their ids.
    async fn walk(&self, filter: &DeadLetterFilter, cap: i64) -> Result<Window, StoreError> {
        let mut args = Vec::new();
        let mut bind = |text: String| {
            args.push(Arg::Text(text));
            args.len()
        };
        let bounds = (filter.before_id, filter.after_id);
        let Some(walk) = filter.search.walk_sql(self.backend, bounds, cap, &mut bind) else {
            return Ok(Window {
                examined: 0,
                lowest: None,
            });
        };
        let sql = format!("SELECT COUNT(*), MIN(hit) FROM ({walk}) w");
        let row = sqlx::query_with(AssertSqlSafe(sql), arguments(args)?)
            .fetch_one(self.pool())
            .await?;
        Ok(Window {
            examined: row.try_get(0)?,
            lowest: row.try_get(1)?,
        })
    }

    /// The page of a search on `filter` (`page`: the same, bounded below by its window): on
    /// SQLite the plain page query, which the bound keeps within the window; on PostgreSQL
    /// the window's walk itself, each dead letter looked up by id, since its planner may
    /// otherwise walk the primary key through every id between the window's ends.
    async fn search_rows(
        &self,
        filter: &DeadLetterFilter,
        page: &DeadLetterFilter,
        limit: i64,
    ) -> Result<Vec<DeadLetter>, StoreError> {
        let (sql, args) = self.search_sql(filter, page, limit);
        let rows = sqlx::query_with(AssertSqlSafe(sql), arguments(args)?)
            .fetch_all(self.pool())
            .await?;
        rows.iter().map(dead_letter).collect()
    }

    /// The query of [`Store::search_rows`].
    fn search_sql(
        &self,
        filter: &DeadLetterFilter,
        page: &DeadLetterFilter,
        limit: i64,
    ) -> (String, Vec<Arg>) {
        match self.backend {
            Backend::Postgres => self
                .walk_page_sql(filter, limit)
                .unwrap_or_else(|| self.page_sql(page, true, limit)),
            Backend::Sqlite => self.page_sql(page, true, limit),
        }
    }

    /// Up to `limit` dead letters matching `filter`, newest first (no timeout of its own).
    async fn page_rows(
        &self,
        filter: &DeadLetterFilter,
        limit: i64,
    ) -> Result<Vec<DeadLetter>, StoreError> {
        let (sql, args) = self.page_sql(filter, true, limit);
        let rows = sqlx::query_with(AssertSqlSafe(sql), arguments(args)?)
            .fetch_all(self.pool())
            .await?;
        rows.iter().map(dead_letter).collect()
    }

    /// A search page's query on PostgreSQL: the first [`SEARCH_EXAMINED_MAX`] entries of the
    /// index the search is driven by (`SearchTerms::walk_sql`), each dead letter then looked
    /// up by its id (`LATERAL`, `OFFSET 0` keeping it a lookup) and checked against the rest
    /// of `f`, newest first, up to `limit`. `None` without search terms.
    fn walk_page_sql(&self, f: &DeadLetterFilter, limit: i64) -> Option<(String, Vec<Arg>)> {
        let mut args = Vec::new();
        let mut bind = |text: String| {
            args.push(Arg::Text(text));
            args.len()
        };
        let bounds = (f.before_id, f.after_id);
        let walk = f
            .search
            .walk_sql(self.backend, bounds, SEARCH_EXAMINED_MAX, &mut bind)?;
        let mut sql = format!(
            "SELECT {COLUMNS} FROM ({walk}) w CROSS JOIN LATERAL (SELECT * FROM dead_letters d \
             WHERE d.id = w.hit OFFSET 0) dead_letters WHERE 1 = 1"
        );
        f.search.conditions(&mut sql, &mut bind);
        self.other_conditions(f, "dead_letters.id", &mut sql, &mut args);
        args.push(Arg::Int(limit.max(0)));
        let order = f.search.walk_order(self.backend);
        sql.push_str(&format!(" ORDER BY {order} LIMIT ${}", args.len()));
        Some((sql, args))
    }

    /// What the page query of a search on `filter` reads, for tests (PostgreSQL only: its
    /// `EXPLAIN ANALYZE`): the most rows any one scan in its plan returned, over all its loops.
    #[cfg(test)]
    pub(crate) async fn search_page_rows_scanned(&self, filter: &DeadLetterFilter) -> i64 {
        let page = match self.search_window(filter).await.expect("window") {
            Some((_, page)) => page,
            None => filter.clone(),
        };
        let limit = filter.limit.unwrap_or(100);
        let (sql, args) = self.search_sql(filter, &page, limit);
        let explain = format!("EXPLAIN ANALYZE {sql}");
        let lines: Vec<String> =
            sqlx::query_scalar_with(AssertSqlSafe(explain), arguments(args).expect("args"))
                .fetch_all(self.pool())
                .await
                .expect("explain");
        most_scanned(&lines)
    }
}

/// The most rows one scan of an `EXPLAIN ANALYZE` read: the rows it returned and those its
/// filter removed, times its loops (both are shown per loop).
#[cfg(test)]
fn most_scanned(lines: &[String]) -> i64 {
    let number = |text: &str, key: &str| -> i64 {
        text.split(key)
            .nth(1)
            .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    let mut most = 0;
    let mut scan: Option<(i64, i64)> = None; // (rows, loops) of the scan being read
    for line in lines {
        if line.contains("(actual") {
            if let Some((rows, loops)) = scan.take() {
                most = most.max(rows * loops);
            }
            if line.contains("Scan") {
                let actual = line.split("(actual").nth(1).unwrap_or("");
                scan = Some((number(actual, "rows="), number(actual, "loops=").max(1)));
            }
        } else if let (Some((rows, _)), true) = (scan.as_mut(), line.contains("Rows Removed by")) {
            *rows += number(line, ": ");
        }
    }
    if let Some((rows, loops)) = scan {
        most = most.max(rows * loops);
    }
    most
}
