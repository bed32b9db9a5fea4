//! PostgreSQL: shared by several gateway instances, so writers exclude each other with row
//! locks, advisory locks and `SKIP LOCKED`; commits signal other instances with `NOTIFY`;
//! the planner goes by statistics and takes no hints, so a plan that matters is spelled out
//! in the query's shape.

use std::time::Duration;

use futures::future::BoxFuture;

use super::{Backend, Class, ColumnKind, Dialect, IndexWalk, Listen, Privilege, UrlError};
use crate::common::retry;
use crate::store::migrations::{MigrationFile, POSTGRES};

/// The PostgreSQL dialect.
#[derive(Debug, Clone, Copy)]
pub struct Postgres;

impl Dialect for Postgres {
    fn backend(&self) -> Backend {
        Backend::Postgres
    }

    fn prepare_url(&self, url: &str) -> Result<String, UrlError> {
        Ok(url.to_string())
    }

    fn database_setup(&self) -> &'static [&'static str] {
        &[]
    }

    fn session_setup(&self, statement_timeout: Duration) -> Vec<String> {
        let timeout_ms = statement_timeout.as_millis().max(1);
        vec![
            // Prepared statements are cached per connection. A generic plan made while a
            // table is still empty (a fresh deployment) picks a sequential scan and keeps it
            // as the table grows: the benchmark fell from ~2,300 to ~800 msg/s in one run of
            // three. Plan each execution instead.
            "SET plan_cache_mode = force_custom_plan".to_owned(),
            // A statement that runs longer fails with 57014, which counts as the store being
            // unavailable (requeue, pause), never as bad data.
            format!("SET statement_timeout = {timeout_ms}"),
        ]
    }

    fn read_only_check(&self) -> Option<&'static str> {
        Some("SELECT current_setting('transaction_read_only')")
    }

    fn schema(&self) -> &'static [MigrationFile] {
        POSTGRES
    }

    fn migrate_apart(&self) -> bool {
        true
    }

    fn classify(&self, code: &str, _message: &str) -> Class {
        classify(code)
    }

    fn begin_write(&self) -> Option<&'static str> {
        None
    }

    fn one_writer(&self) -> bool {
        false
    }

    fn lock_names(&self, n: usize) -> Option<String> {
        let values: Vec<String> = (1..=n).map(|i| format!("(${i})")).collect();
        Some(format!(
            "SELECT COUNT(pg_advisory_xact_lock(hashtextextended(k, 0))) FROM (VALUES {}) AS t(k)",
            values.join(", ")
        ))
    }

    fn for_update(&self) -> &'static str {
        " FOR UPDATE"
    }

    fn skip_locked(&self, alias: &str) -> String {
        format!("FOR UPDATE OF {alias} SKIP LOCKED")
    }

    fn notify(&self, channel: &str) -> Option<String> {
        // Delivered at COMMIT to the sessions listening on the channel.
        Some(format!("NOTIFY {channel}"))
    }

    fn listen(&self, to: Listen) -> Option<BoxFuture<'static, ()>> {
        Some(Box::pin(listen(to)))
    }

    fn clock_ms(&self) -> &'static str {
        "CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)"
    }

    fn placeholder(&self, n: usize, out: &mut String) {
        use std::fmt::Write;
        let _ = write!(out, "${n}");
    }

    fn id_in(&self, subquery: &str) -> String {
        // Through the primary key (or the rows' addresses) instead of hash-joining the table.
        format!("= ANY(ARRAY({subquery}))")
    }

    fn index_hint(&self, _index: &str) -> String {
        String::new()
    }

    fn contains_text(&self, text: &str, needle: &str) -> String {
        format!("strpos({text}, {needle}) > 0")
    }

    fn json_array_values(&self, n: usize, bigint: bool) -> String {
        if bigint {
            format!("SELECT CAST(jsonb_array_elements_text(CAST(${n} AS jsonb)) AS BIGINT)")
        } else {
            format!("SELECT jsonb_array_elements_text(CAST(${n} AS jsonb))")
        }
    }

    fn json_array_rows(&self, n: usize) -> String {
        format!("jsonb_array_elements(CAST(${n} AS jsonb)) AS e")
    }

    fn json_item(&self, i: usize) -> String {
        format!("e ->> {i}")
    }

    fn insert_or_ignore(&self, into: &str, rows: &str) -> String {
        format!("INSERT INTO {into} {rows} ON CONFLICT DO NOTHING")
    }

    fn delete_batch(
        &self,
        table: &str,
        _index: Option<&str>,
        condition: &str,
        limit: u64,
    ) -> String {
        // By the rows' addresses (a TID scan); rows another purge has locked are skipped,
        // not waited for, so gateways purging at once split the rows.
        format!(
            "DELETE FROM {table} WHERE ctid {} AND {condition}",
            self.id_in(&format!(
                "SELECT ctid FROM {table} WHERE {condition} LIMIT {limit} FOR UPDATE SKIP LOCKED"
            ))
        )
    }

    fn lookup_join(&self, table: &str, id: &str) -> String {
        // `OFFSET 0` keeps the subquery a lookup per row: a merge join with the primary key
        // would read every id between the ends, matching or not.
        format!("CROSS JOIN LATERAL (SELECT * FROM {table} d WHERE d.id = {id} OFFSET 0) {table}")
    }

    fn index_walk(&self, w: &IndexWalk<'_>) -> String {
        // No hints: the walk orders by the index's whole key, bounds its leading columns by a
        // range (`>= v AND <= v`, the same rows as `= v`) and the id by a comparison of the
        // whole key. With an equality the planner drops those columns from the order, and
        // could then walk another index through every row, filtering; the whole key's order
        // and bounds only the walked index gives.
        let id = w.id;
        let mut conditions: Vec<String> = w
            .keys
            .iter()
            .map(|(key, n)| format!("{key} >= ${n} AND {key} <= ${n}"))
            .collect();
        let key_bound = |op: &str, bound: i64| {
            let keys: Vec<&str> = w.keys.iter().map(|(key, _)| *key).collect();
            let values: Vec<String> = w.keys.iter().map(|(_, n)| format!("${n}")).collect();
            format!(
                "({}, {id}) {op} ({}, {bound})",
                keys.join(", "),
                values.join(", ")
            )
        };
        conditions.extend(w.before.map(|b| key_bound("<", b)));
        conditions.extend(w.after.map(|a| key_bound(">", a)));
        let order: Vec<String> = w
            .keys
            .iter()
            .map(|(key, _)| *key)
            .chain([id])
            .map(|k| format!("{k} DESC"))
            .collect();
        // The keys are selected too (as `k0`, ..), so that a query over the walk can keep its
        // order without a sort (`index_walk_order`).
        let selected: String = w
            .keys
            .iter()
            .enumerate()
            .map(|(i, (key, _))| format!("{key} AS k{i}, "))
            .collect();
        format!(
            "SELECT {selected}{id} AS hit FROM {} WHERE {} ORDER BY {} LIMIT {}",
            w.table,
            conditions.join(" AND "),
            order.join(", "),
            w.cap
        )
    }

    fn index_walk_order(&self, keys: usize, alias: &str) -> String {
        let mut order: Vec<String> = (0..keys).map(|i| format!("{alias}.k{i} DESC")).collect();
        order.push(format!("{alias}.hit DESC"));
        order.join(", ")
    }

    fn table_columns(&self) -> &'static str {
        "SELECT CAST(a.attname AS TEXT) AS name, format_type(a.atttypid, a.atttypmod) AS declared \
         FROM pg_attribute a WHERE a.attrelid = to_regclass(CAST($1 AS TEXT)) \
         AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum"
    }

    fn column_kind(&self, declared: &str) -> ColumnKind {
        let t = declared.to_ascii_lowercase();
        let base = t.split('(').next().unwrap_or_default().trim();
        match base {
            "smallint" | "integer" | "bigint" => ColumnKind::Integer,
            "text" | "character varying" | "character" | "varchar" | "char" => ColumnKind::Text,
            "bytea" => ColumnKind::Bytes,
            "json" | "jsonb" => ColumnKind::Json,
            "boolean" => ColumnKind::Boolean,
            "uuid" => ColumnKind::Uuid,
            _ if t.starts_with("timestamp") && !t.contains("without") && t.contains("with") => {
                ColumnKind::TimestampTz
            }
            _ if t.starts_with("timestamp") => ColumnKind::Timestamp,
            _ => ColumnKind::Other,
        }
    }

    fn body_bytes(&self, expr: &str, kind: ColumnKind) -> String {
        match kind {
            ColumnKind::Bytes => expr.to_owned(),
            _ => format!("convert_to(CAST({expr} AS TEXT), 'UTF8')"),
        }
    }

    fn timestamp_ms(&self, expr: &str, kind: ColumnKind) -> String {
        match kind {
            ColumnKind::Timestamp => {
                format!("CAST(EXTRACT(EPOCH FROM ({expr} AT TIME ZONE 'UTC')) * 1000 AS BIGINT)")
            }
            _ => format!("CAST(EXTRACT(EPOCH FROM {expr}) * 1000 AS BIGINT)"),
        }
    }

    fn now_for(&self, kind: ColumnKind) -> &'static str {
        match kind {
            ColumnKind::Timestamp => "(CURRENT_TIMESTAMP AT TIME ZONE 'UTC')",
            _ => "CURRENT_TIMESTAMP",
        }
    }

    fn json_text_array(&self, exprs: &[String]) -> String {
        let items: Vec<String> = exprs.iter().map(|e| format!("CAST({e} AS TEXT)")).collect();
        format!("CAST(json_build_array({}) AS TEXT)", items.join(", "))
    }

    fn may(&self, what: Privilege) -> Option<&'static str> {
        Some(match what {
            Privilege::Select => {
                "SELECT has_table_privilege(to_regclass(CAST($1 AS TEXT)), 'SELECT')"
            }
            Privilege::UpdateColumn => {
                "SELECT has_column_privilege(to_regclass(CAST($1 AS TEXT)), CAST($2 AS TEXT), 'UPDATE')"
            }
            Privilege::Delete => {
                "SELECT has_table_privilege(to_regclass(CAST($1 AS TEXT)), 'DELETE')"
            }
            Privilege::Replicate => {
                "SELECT rolreplication OR rolsuper FROM pg_roles WHERE rolname = current_user"
            }
        })
    }

    fn page_from_walk(&self) -> bool {
        true
    }
}

/// PostgreSQL SQLSTATEs (appendix A of the PostgreSQL manual).
fn classify(code: &str) -> Class {
    match code {
        // Serialization failure, deadlock victim: lost a race, run again.
        "40001" | "40P01" => Class::Conflict,
        // 25006 read-only transaction (a failover demoted the primary, or
        // default_transaction_read_only), 25P03 idle-in-transaction timeout.
        "25006" | "25P03" => Class::Unavailable,
        // 55P03 lock_timeout, 55006 object in use, 55000 object not in prerequisite state.
        "55P03" | "55006" | "55000" => Class::Unavailable,
        // 42P01 undefined table, 42703 undefined column, 42883 undefined function, 3F000
        // undefined schema: the schema is not the one we migrated. 42501 insufficient
        // privilege: the role lost a grant.
        "42P01" | "42703" | "42883" | "3F000" | "42501" => Class::Unavailable,
        // 3D000 the database does not exist.
        "3D000" => Class::Unavailable,
        _ => {
            // 08 connection exception, 28 invalid authorization, 53 insufficient resources
            // (disk full, out of memory, too many connections), 57 operator intervention
            // (57014 statement_timeout / cancel, 57P0x shutdown, cannot connect now), 58
            // system error (I/O), XX internal error (data or index corrupted), HV foreign
            // data wrapper.
            let class = code.get(..2).unwrap_or_default();
            if ["08", "28", "53", "57", "58", "XX", "HV"].contains(&class) {
                Class::Unavailable
            } else {
                // 22 data exception (e.g. 22021 bad encoding, 22P05 NUL), 23 integrity
                // constraint (23505 unique: an inbox conflict never raises it, the inbox
                // insert is ON CONFLICT DO NOTHING), 54 program limit (54000 e.g. an index
                // row too large): about this request's values.
                Class::Data
            }
        }
    }
}

/// `LISTEN` on the channel: a wake-up per notification, the connection reopened when lost,
/// until the wake-ups' receiver is gone.
async fn listen(Listen { url, channel, wake }: Listen) {
    let mut pause = retry::WAKEUPS.backoff();
    loop {
        let listened = async {
            let mut listener = sqlx::postgres::PgListener::connect(&url).await?;
            listener.listen(&channel).await?;
            loop {
                listener.recv().await?;
                // Full: a wake-up is pending already, which covers this commit too.
                let _ = wake.try_send(());
            }
            #[allow(unreachable_code)]
            Ok::<(), sqlx::Error>(())
        };
        tokio::select! {
            () = wake.closed() => return,
            result = listened => {
                if let Err(e) = result {
                    tracing::debug!(error = %e, %channel, "LISTEN connection lost; the poll interval covers the gap");
                }
            }
        }
        tokio::select! {
            () = wake.closed() => return,
            () = tokio::time::sleep(pause.next_delay()) => {}
        }
    }
}
