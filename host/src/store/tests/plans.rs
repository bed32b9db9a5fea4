//! The plans the database makes of the archive's queries (`EXPLAIN`), for the tests that
//! check a query reads the index it should.

use sqlx::AssertSqlSafe;

use crate::store::dead_letters::filter_arguments as arguments;
use crate::store::{Backend, DeadLetterFilter, Store};

impl Store {
    /// The plan of a page of `filter`, newest first (the console's, `dlq list`'s), for tests:
    /// SQLite's `EXPLAIN QUERY PLAN` details; PostgreSQL's `EXPLAIN` lines with sequential
    /// scans and plain index walks priced out (`enable_seqscan`, `enable_indexscan` off: on a
    /// test-sized table a walk of the primary key can look as cheap as anything), so the plan
    /// names the index a search can be answered from, if there is one.
    pub(crate) async fn page_plan(&self, filter: &DeadLetterFilter) -> Vec<String> {
        let (sql, args) = self.page_sql(filter, true, 100);
        let args = arguments(args).expect("arguments");
        match self.backend() {
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
}
