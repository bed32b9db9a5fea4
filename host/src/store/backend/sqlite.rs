//! SQLite: one file in WAL mode, one writer at a time (`BEGIN IMMEDIATE`, and in-process
//! writers queued before it), no row locks, no statistics for the planner (so indexes are
//! named with `INDEXED BY` where a plan matters), `?` placeholders for long lists.

use std::path::Path;
use std::time::Duration;

use futures::future::BoxFuture;

use super::{Backend, Class, ColumnKind, Dialect, IndexWalk, Listen, Privilege, UrlError};
use crate::store::migrations::{MigrationFile, SQLITE};

/// The SQLite dialect.
#[derive(Debug, Clone, Copy)]
pub struct Sqlite;

impl Dialect for Sqlite {
    fn backend(&self) -> Backend {
        Backend::Sqlite
    }

    fn prepare_url(&self, url: &str) -> Result<String, UrlError> {
        prepare_url(url)
    }

    fn database_setup(&self) -> &'static [&'static str] {
        // WAL lets readers run beside the single writer. It is persistent and needs an
        // exclusive lock to switch, so it is set once here rather than on every connection.
        &["PRAGMA journal_mode = WAL"]
    }

    fn session_setup(&self, _statement_timeout: Duration) -> Vec<String> {
        Vec::new()
    }

    fn read_only_check(&self) -> Option<&'static str> {
        None
    }

    fn schema(&self) -> &'static [MigrationFile] {
        SQLITE
    }

    fn migrate_apart(&self) -> bool {
        // Nothing to leave out (no statement timeout), and `:memory:` is one connection's.
        false
    }

    fn classify(&self, code: &str, message: &str) -> Class {
        classify(code.parse::<i64>().unwrap_or(-1), message)
    }

    fn begin_write(&self) -> Option<&'static str> {
        // Takes the write lock up front (waiting up to busy_timeout only for other
        // processes), so a later write in it cannot fail with SQLITE_BUSY_SNAPSHOT when
        // another process committed in between.
        Some("BEGIN IMMEDIATE")
    }

    fn one_writer(&self) -> bool {
        true
    }

    fn lock_names(&self, _n: usize) -> Option<String> {
        None // BEGIN IMMEDIATE already made this the only writer.
    }

    fn for_update(&self) -> &'static str {
        ""
    }

    fn skip_locked(&self, _alias: &str) -> String {
        String::new()
    }

    fn notify(&self, _channel: &str) -> Option<String> {
        None
    }

    fn listen(&self, _to: Listen) -> Option<BoxFuture<'static, ()>> {
        // No signal: a process's own committer wakes its relay.
        None
    }

    fn clock_ms(&self) -> &'static str {
        "CAST(unixepoch('subsec') * 1000 AS INTEGER)"
    }

    fn placeholder(&self, _n: usize, out: &mut String) {
        // SQLite looks `$N` names up by linear scan when it prepares and binds, which makes
        // a statement with thousands of them quadratic.
        out.push('?');
    }

    fn id_in(&self, subquery: &str) -> String {
        format!("IN ({subquery})")
    }

    fn index_hint(&self, index: &str) -> String {
        format!(" INDEXED BY {index}")
    }

    fn contains_text(&self, text: &str, needle: &str) -> String {
        format!("instr({text}, {needle}) > 0")
    }

    fn json_array_values(&self, n: usize, _bigint: bool) -> String {
        format!("SELECT value FROM json_each(${n})")
    }

    fn json_array_rows(&self, n: usize) -> String {
        format!("json_each(${n})")
    }

    fn json_item(&self, i: usize) -> String {
        format!("json_extract(value, '$[{i}]')")
    }

    fn insert_or_ignore(&self, into: &str, rows: &str) -> String {
        format!("INSERT OR IGNORE INTO {into} {rows}")
    }

    fn delete_batch(
        &self,
        table: &str,
        index: Option<&str>,
        condition: &str,
        limit: u64,
    ) -> String {
        // `NOT INDEXED` keeps the outer delete on rowid lookups of the batch rather than a
        // scan of an index; the inner select names the index (without statistics the planner
        // may otherwise walk the whole table for every batch).
        let index = index.map(|i| self.index_hint(i)).unwrap_or_default();
        format!(
            "DELETE FROM {table} NOT INDEXED WHERE rowid IN (SELECT rowid FROM \
             {table}{index} WHERE {condition} LIMIT {limit}) AND {condition}"
        )
    }

    fn lookup_join(&self, table: &str, id: &str) -> String {
        // `CROSS JOIN` keeps the table on its left outside: SQLite never reorders it.
        format!("CROSS JOIN {table} ON {table}.id = {id}")
    }

    fn index_walk(&self, w: &IndexWalk<'_>) -> String {
        let id = w.id;
        let mut conditions: Vec<String> = w
            .keys
            .iter()
            .map(|(key, n)| format!("{key} = ${n}"))
            .collect();
        conditions.extend(w.before.map(|b| format!("{id} < {b}")));
        conditions.extend(w.after.map(|a| format!("{id} > {a}")));
        let index = w.index.map(|i| self.index_hint(i)).unwrap_or_default();
        format!(
            "SELECT {id} AS hit FROM {}{index} WHERE {} ORDER BY {id} DESC LIMIT {}",
            w.table,
            conditions.join(" AND "),
            w.cap
        )
    }

    fn index_walk_order(&self, _keys: usize, alias: &str) -> String {
        format!("{alias}.hit DESC")
    }

    fn table_columns(&self) -> &'static str {
        // `pragma_table_info` takes the bare name; the relay binds it quoted.
        "SELECT name, type AS declared FROM pragma_table_info(trim($1, '\"'))"
    }

    fn column_kind(&self, declared: &str) -> ColumnKind {
        // SQLite's own affinity rules, with the names SQLAlchemy declares checked first.
        let t = declared.to_ascii_uppercase();
        if t.contains("BOOL") {
            ColumnKind::Boolean
        } else if t.contains("DATE") || t.contains("TIME") {
            ColumnKind::Timestamp
        } else if t.contains("INT") {
            ColumnKind::Integer
        } else if t.contains("JSON") {
            ColumnKind::Json
        } else if t.contains("CHAR") || t.contains("CLOB") || t.contains("TEXT") {
            ColumnKind::Text
        } else if t.contains("BLOB") || t.is_empty() {
            ColumnKind::Bytes
        } else if t.contains("UUID") {
            ColumnKind::Uuid
        } else {
            ColumnKind::Other
        }
    }

    fn body_bytes(&self, expr: &str, _kind: ColumnKind) -> String {
        format!("CAST({expr} AS BLOB)")
    }

    fn timestamp_ms(&self, expr: &str, _kind: ColumnKind) -> String {
        format!("CAST((julianday({expr}) - 2440587.5) * 86400000 AS INTEGER)")
    }

    fn now_for(&self, _kind: ColumnKind) -> &'static str {
        // SQLAlchemy's own text form, with microseconds.
        "(strftime('%Y-%m-%d %H:%M:%f', 'now') || '000')"
    }

    fn json_text_array(&self, exprs: &[String]) -> String {
        let items: Vec<String> = exprs.iter().map(|e| format!("CAST({e} AS TEXT)")).collect();
        format!("json_array({})", items.join(", "))
    }

    fn may(&self, _what: Privilege) -> Option<&'static str> {
        None
    }

    fn page_from_walk(&self) -> bool {
        false
    }
}

/// Adds `mode=rwc` (create if missing) unless the URL chose a mode, and creates the folder.
fn prepare_url(url: &str) -> Result<String, UrlError> {
    let rest = url.trim_start_matches("sqlite:").trim_start_matches("//");
    let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
    let dir = Path::new(path)
        .parent()
        .filter(|d| !d.as_os_str().is_empty());
    if let Some(dir) = dir.filter(|_| path != ":memory:") {
        std::fs::create_dir_all(dir).map_err(|source| UrlError::Folder {
            dir: dir.to_owned(),
            source,
        })?;
    }
    let mode = query.split('&').find_map(|kv| kv.strip_prefix("mode="));
    if path != ":memory:" && mode.is_none_or(|m| m.contains('c')) {
        create_private(Path::new(path))?;
    }
    if mode.is_some() {
        Ok(url.to_string())
    } else if query.is_empty() {
        Ok(format!("{url}?mode=rwc"))
    } else {
        Ok(format!("{url}&mode=rwc"))
    }
}

/// Creates the SQLite file readable by its owner only (0600) when it does not exist yet:
/// it holds the header-seal key and every message's effects. SQLite gives its `-wal` and
/// `-shm` files the database file's mode. An existing file that others may read is kept as
/// it is, with a warning.
fn create_private(path: &Path) -> Result<(), UrlError> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    match options.open(path) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            if let Some(mode) = crate::common::loose_permissions(path) {
                tracing::warn!(
                    path = %path.display(),
                    mode = format!("{mode:o}"),
                    "the SQLite store can be read by other users; it holds the header-seal key                      and every message's effects: chmod 600 it (and its -wal and -shm files)"
                );
            }
            Ok(())
        }
        Err(source) => Err(UrlError::File {
            path: path.to_owned(),
            source,
        }),
    }
}

/// SQLite result codes (<https://www.sqlite.org/rescode.html>), extended or primary.
/// `message` is read only for the generic `SQLITE_ERROR` (1), which is also what a missing
/// table or column returns.
fn classify(code: i64, message: &str) -> Class {
    match code & 0xff {
        // 1 SQLITE_ERROR: generic; "no such table/column" means the schema is not ours.
        1 if message.starts_with("no such table") || message.starts_with("no such column") => {
            Class::Unavailable
        }
        // 3 PERM, 5 BUSY, 6 LOCKED, 7 NOMEM, 8 READONLY, 9 INTERRUPT, 10 IOERR, 11 CORRUPT,
        // 13 FULL, 14 CANTOPEN, 15 PROTOCOL, 17 SCHEMA (changed under a prepared statement),
        // 23 AUTH, 26 NOTADB.
        3 | 5 | 6 | 7 | 8 | 9 | 10 | 11 | 13 | 14 | 15 | 17 | 23 | 26 => Class::Unavailable,
        // 18 TOOBIG, 19 CONSTRAINT, 20 MISMATCH, 25 RANGE, and anything else.
        _ => Class::Data,
    }
}
