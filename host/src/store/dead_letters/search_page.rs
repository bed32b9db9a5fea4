//! A page of a search, at a cost bounded by [`SEARCH_EXAMINED_MAX`] whatever the archive
//! holds. A search is driven by one index (its first body field's, else its message id's or
//! correlation id's: `SearchTerms::walk_sql`); its other terms and the filter's route, reason
//! or times are checked on the dead letters that index names. When most of what the index
//! names fails those checks (`body.status = "late" route:orders` where the late ones are all on
//! another route), filling a page would read every entry of the index. So a page reads at most
//! [`SEARCH_EXAMINED_MAX`] entries, newest first, in windows:
//! 1. the walk: how many entries the window holds (the first [`FIRST_WINDOW`], and only if
//!    the page does not fill from those, the first [`SEARCH_EXAMINED_MAX`]) and its lowest id,
//!    from the index alone;
//! 2. the page: the dead letters of that window that match everything, newest first, up to
//!    the page's limit (on SQLite the same query as an unbounded list with the window's
//!    lowest id as a bound; on PostgreSQL the walk itself, each dead letter looked up by id);
//! 3. when the largest window was full and the page is not: whether the index has entries
//!    below it. If so the search stopped there ([`DeadLetterPage::stopped_before`]): the page
//!    says so, and the next one continues below that id.
//!
//! A page of a value many dead letters share that fills from its first window so reads at
//! most 1,000 entries; one that stops reads at most 11,000 (the first window again) and the
//! dead letters they name.

use sqlx::AssertSqlSafe;

use super::filter::{Arg, arguments};
use super::row::COLUMNS;
use super::{DeadLetter, DeadLetterFilter};
use crate::store::{Store, StoreError};

/// Index entries one page of a search looks at, at most (each names one dead letter, which is
/// then read by its id and checked against the other terms); the first [`FIRST_WINDOW`] of
/// them are read twice when the page does not fill from them.
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

/// The first window a page tries (index entries): a page that fills within it reads no
/// further; one that does not tries [`SEARCH_EXAMINED_MAX`].
const FIRST_WINDOW: i64 = 1_000;

/// The window a page is chosen from: the first `cap` entries of the search's index (fewer if
/// it has fewer), and the lowest id among them.
struct Window {
    cap: i64,
    examined: i64,
    lowest: Option<i64>,
}

/// What a walk of a window counts.
#[derive(sqlx::FromRow)]
struct Walked {
    examined: i64,
    lowest: Option<i64>,
}

impl Window {
    /// The window holds `cap` entries: the index may go on below it.
    fn is_full(&self) -> bool {
        self.examined >= self.cap
    }
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
            if filter.search.is_empty() {
                let query = self.page_sql(filter, true, limit);
                let rows = self.filtered_dead_letters(query).await?;
                return Ok(DeadLetterPage {
                    rows,
                    examined: 0,
                    stopped_before: None,
                });
            }
            let mut cap = FIRST_WINDOW.min(SEARCH_EXAMINED_MAX);
            loop {
                let window = self.walk(filter, cap).await?;
                let rows = self.search_rows(filter, &window, limit).await?;
                // The window was full and the page is not: the index may hold more below.
                let short = window.is_full() && (rows.len() as i64) < limit;
                if short && cap < SEARCH_EXAMINED_MAX {
                    cap = SEARCH_EXAMINED_MAX;
                    continue;
                }
                let stopped_before = if short {
                    self.below(filter, &window).await?
                } else {
                    None
                };
                return Ok(DeadLetterPage {
                    rows,
                    examined: window.examined,
                    stopped_before,
                });
            }
        })
        .await
    }

    /// The lowest id of a full `window` of `filter`'s search if its index goes on below it.
    async fn below(
        &self,
        filter: &DeadLetterFilter,
        window: &Window,
    ) -> Result<Option<i64>, StoreError> {
        let Some(lowest) = window.lowest else {
            return Ok(None);
        };
        let below = DeadLetterFilter {
            before_id: Some(lowest),
            ..filter.clone()
        };
        Ok((self.walk(&below, 1).await?.examined > 0).then_some(lowest))
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
        let Some(walk) = filter.search.walk_sql(self.dialect, bounds, cap, &mut bind) else {
            return Ok(Window {
                cap,
                examined: 0,
                lowest: None,
            });
        };
        let sql = format!("SELECT COUNT(*) AS examined, MIN(hit) AS lowest FROM ({walk}) w");
        let walked: Walked = sqlx::query_as_with(AssertSqlSafe(sql), arguments(args)?)
            .fetch_one(self.pool())
            .await?;
        Ok(Window {
            cap,
            examined: walked.examined,
            lowest: walked.lowest,
        })
    }

    /// The page of a search on `filter` within `window` (`Dialect::page_from_walk`): the
    /// plain page query, bounded below by the window's lowest id when the window is full
    /// (SQLite); or the window's walk itself, each dead letter looked up by id, where the
    /// planner may otherwise walk the primary key through every id between the window's ends
    /// (PostgreSQL).
    async fn search_rows(
        &self,
        filter: &DeadLetterFilter,
        window: &Window,
        limit: i64,
    ) -> Result<Vec<DeadLetter>, StoreError> {
        let query = self.search_sql(filter, window, limit);
        self.filtered_dead_letters(query).await
    }

    /// The query of [`Store::search_rows`].
    fn search_sql(
        &self,
        filter: &DeadLetterFilter,
        window: &Window,
        limit: i64,
    ) -> (String, Vec<Arg>) {
        let bounded = |filter: &DeadLetterFilter| {
            let mut page = filter.clone();
            if let (true, Some(lowest)) = (window.is_full(), window.lowest) {
                page.after_id = Some(page.after_id.map_or(lowest - 1, |a| a.max(lowest - 1)));
            }
            page
        };
        if self.dialect.page_from_walk() {
            self.walk_page_sql(filter, window.cap, limit)
                .unwrap_or_else(|| self.page_sql(filter, true, limit))
        } else {
            self.page_sql(&bounded(filter), true, limit)
        }
    }

    /// A search page's query read through its walk: the first `cap` entries of the index the
    /// search is driven by (`SearchTerms::walk_sql`), each dead letter then looked up by its
    /// id (`Dialect::lookup_join`) and checked against the rest of `f`, newest first, up to
    /// `limit`. `None` without search terms.
    fn walk_page_sql(
        &self,
        f: &DeadLetterFilter,
        cap: i64,
        limit: i64,
    ) -> Option<(String, Vec<Arg>)> {
        let mut args = Vec::new();
        let mut bind = |text: String| {
            args.push(Arg::Text(text));
            args.len()
        };
        let bounds = (f.before_id, f.after_id);
        let walk = f.search.walk_sql(self.dialect, bounds, cap, &mut bind)?;
        let join = self.dialect.lookup_join("dead_letters", "w.hit");
        let mut sql = format!("SELECT {COLUMNS} FROM ({walk}) w {join} WHERE 1 = 1");
        f.search.conditions(&mut sql, &mut bind);
        self.other_conditions(f, "dead_letters.id", &mut sql, &mut args);
        args.push(Arg::Int(limit.max(0)));
        let order = f.search.walk_order(self.dialect);
        sql.push_str(&format!(" ORDER BY {order} LIMIT ${}", args.len()));
        Some((sql, args))
    }

    /// What the page query of a search on `filter` reads, for tests (PostgreSQL only: its
    /// `EXPLAIN ANALYZE`): the most rows any one scan in its plan returned, over all its loops.
    #[cfg(test)]
    pub(crate) async fn search_page_rows_scanned(&self, filter: &DeadLetterFilter) -> i64 {
        let window = self
            .walk(filter, SEARCH_EXAMINED_MAX)
            .await
            .expect("window");
        let limit = filter.limit.unwrap_or(100);
        let (sql, args) = self.search_sql(filter, &window, limit);
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
