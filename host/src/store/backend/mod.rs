//! Every way PostgreSQL and SQLite differ, behind one interface: a [`Dialect`], with one
//! implementation per backend (`sqlite`, `postgres`), as Spin's key-value crates give each
//! backend one implementation of the same store. Nothing outside this folder compares
//! backends (docs/architecture.md, "The store"): a third backend is one more implementation,
//! and the compiler names every method it must answer.
//!
//! A dialect knows SQL and the database, not Carteiro's tables (its only tie to them is
//! [`Dialect::schema`], the migrations it applies), so a relay of an application's own table
//! can use it on the application's database: [`for_url`] picks it.
//!
//! # Layout
//! - this file: the [`Dialect`] trait, [`Backend`] (which one a store runs on), [`Class`]
//!   (what a database error means) and [`IndexWalk`];
//! - `sqlite`, `postgres`: the two implementations, with their error-code tables.

mod postgres;
mod sqlite;

use std::fmt;
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::sync::mpsc;

pub use postgres::Postgres;
pub use sqlite::Sqlite;

use super::migrations::MigrationFile;

/// Which database a store talks to. Code that must act differently asks the [`Dialect`]
/// ([`Backend::dialect`]); this names the backend for tests and messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// `sqlite://PATH`: one file, WAL mode, one writer at a time.
    Sqlite,
    /// `postgres://...`: shared by several gateway instances.
    Postgres,
}

impl Backend {
    /// This backend's dialect.
    pub fn dialect(self) -> &'static dyn Dialect {
        match self {
            Backend::Sqlite => &Sqlite,
            Backend::Postgres => &Postgres,
        }
    }
}

/// The dialect of the database at `url` (`sqlite:...`, `postgres://...` or
/// `postgresql://...`); `None` for any other scheme.
pub fn for_url(url: &str) -> Option<&'static dyn Dialect> {
    if url.starts_with("sqlite:") {
        Some(&Sqlite)
    } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        Some(&Postgres)
    } else {
        None
    }
}

/// A listener of [`Dialect::listen`]: `channel` of the database at `url`, on a connection of
/// its own (reopened when lost), a wake-up on `wake` for each signal.
#[derive(Debug)]
pub struct Listen {
    pub url: String,
    pub channel: String,
    pub wake: mpsc::Sender<()>,
}

/// What a column holds, whatever the database calls its type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ColumnKind {
    Integer,
    Text,
    Bytes,
    Json,
    Boolean,
    /// A timestamp without a time zone (read as UTC).
    Timestamp,
    /// A timestamp with a time zone.
    TimestampTz,
    Uuid,
    Other,
}

/// What [`Dialect::may`] asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Privilege {
    /// Read the table.
    Select,
    /// Update the column `$2`.
    UpdateColumn,
    /// Delete rows.
    Delete,
    /// Open a replication connection (the role's `REPLICATION`).
    Replicate,
}

/// What a database error code means, whatever the statement (see [`Dialect::classify`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// Lost a race (deadlock victim, serialization failure): run it again.
    Conflict,
    /// The connection or server is in trouble: every request would fail alike.
    Unavailable,
    /// This request's data was refused by the database.
    Data,
}

/// The dialect whose database gives error codes like `code`: PostgreSQL's SQLSTATEs are
/// always five characters; SQLite's result codes are numbers of at most four digits.
pub(crate) fn of_error_code(code: &str) -> &'static dyn Dialect {
    if code.len() == 5 { &Postgres } else { &Sqlite }
}

/// Why a database's URL could not be made ready (a SQLite file or its folder).
#[derive(Debug, thiserror::Error)]
pub enum UrlError {
    #[error("cannot create folder {}: {source}", dir.display())]
    Folder {
        dir: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("cannot create the SQLite file {}: {source}", path.display())]
    File {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
}

/// A walk of the index on `(keys.., id)` of `table`, newest id first: the entries whose keys
/// equal bound values and whose ids are within bounds, the first `cap` of them, selected as
/// `hit` (and, where the dialect needs the order spelled out, the keys as `k0`, `k1`, ..).
#[derive(Debug, Clone, Copy)]
pub struct IndexWalk<'a> {
    pub table: &'a str,
    /// The index, when it is not the table's own key; named where the planner takes hints.
    pub index: Option<&'a str>,
    /// The index's leading columns, each with the placeholder number (`$n`) of its value.
    pub keys: &'a [(&'a str, usize)],
    /// The id column, the index's last.
    pub id: &'a str,
    /// Only ids below this.
    pub before: Option<i64>,
    /// Only ids above this.
    pub after: Option<i64>,
    /// At most this many entries.
    pub cap: i64,
}

/// The SQL and behaviour of one database backend. Statements use `$n` placeholders (sqlx
/// `Any` takes them on both backends) unless they are built with [`Dialect::placeholder`].
pub trait Dialect: Send + Sync + fmt::Debug {
    /// Which backend this is.
    fn backend(&self) -> Backend;

    // --- Connecting ---

    /// The URL to connect with: made ready for use (SQLite creates its file and folder).
    fn prepare_url(&self, url: &str) -> Result<String, UrlError>;

    /// Statements run once per database on a connection of their own before the pool opens
    /// (settings that persist in the database and need an exclusive lock to change).
    fn database_setup(&self) -> &'static [&'static str];

    /// Statements run on every new connection, given the statement timeout to apply.
    fn session_setup(&self, statement_timeout: Duration) -> Vec<String>;

    /// A query answering `on` when the session cannot write (a standby after a failover);
    /// `None`: a plain round trip is all a ping can check.
    fn read_only_check(&self) -> Option<&'static str>;

    /// Carteiro's schema on this backend, in version order.
    fn schema(&self) -> &'static [MigrationFile];

    /// Migrations run on a connection of their own, without the pool's session settings
    /// (an index build must not hit the statement timeout). `false`: on the pool itself.
    fn migrate_apart(&self) -> bool;

    /// What error `code` (with its `message`) means; see [`Class`].
    fn classify(&self, code: &str, message: &str) -> Class;

    // --- Transactions and locks ---

    /// The statement that begins a write transaction; `None`: the driver's plain `BEGIN`.
    fn begin_write(&self) -> Option<&'static str>;

    /// The database takes one writer at a time: writers of one process queue in order
    /// before they begin, rather than sleep in the database's busy handler.
    fn one_writer(&self) -> bool;

    /// A statement taking a transaction-scoped lock on each of `n` bound names, in order;
    /// `None` where a write transaction already excludes every other writer.
    fn lock_names(&self, n: usize) -> Option<String>;

    /// What follows a `SELECT` to lock the rows it reads until the transaction ends (with
    /// its leading space), or nothing where writers are excluded already.
    fn for_update(&self) -> &'static str;

    /// What follows a `SELECT ... LIMIT` from `alias` to lock the rows it takes and skip
    /// those another transaction holds; nothing where writers are excluded already.
    fn skip_locked(&self, alias: &str) -> String;

    /// A statement that signals `channel` to other sessions when the transaction commits;
    /// `None` where the database has no such signal.
    fn notify(&self, channel: &str) -> Option<String>;

    /// Listens to what [`Dialect::notify`] signals, as [`Listen`] says, until its `wake`
    /// closes; `None` where the database signals nothing.
    fn listen(&self, to: Listen) -> Option<BoxFuture<'static, ()>>;

    // --- SQL spellings ---

    /// The database's clock in unix milliseconds, as an SQL expression.
    fn clock_ms(&self) -> &'static str;

    /// Appends placeholder number `n` (from 1, in order of appearance) to `out`.
    fn placeholder(&self, n: usize, out: &mut String);

    /// `id` is among the ids `subquery` selects: what follows the column in a condition.
    fn id_in(&self, subquery: &str) -> String;

    /// An index hint after a table name (with its leading space), or nothing where the
    /// planner takes none.
    fn index_hint(&self, index: &str) -> String;

    /// `text` contains `needle` (both SQL expressions), without wildcards.
    fn contains_text(&self, text: &str, needle: &str) -> String;

    /// A subquery of the values of the JSON array bound as `$n`, as `BIGINT` when `bigint`.
    fn json_array_values(&self, n: usize, bigint: bool) -> String;

    /// A `FROM` item of the elements of the JSON array bound as `$n`; each is an array whose
    /// items [`Dialect::json_item`] reads.
    fn json_array_rows(&self, n: usize) -> String;

    /// Item `i` of an element of [`Dialect::json_array_rows`], as text.
    fn json_item(&self, i: usize) -> String;

    /// `INSERT INTO {into} {rows}`, where a row that conflicts with one already there is
    /// left out.
    fn insert_or_ignore(&self, into: &str, rows: &str) -> String;

    /// Deletes at most `limit` rows of `table` matching `condition` (checked again on each
    /// row deleted), found through `index` where the planner needs telling; rows another
    /// transaction holds are skipped.
    fn delete_batch(&self, table: &str, index: Option<&str>, condition: &str, limit: u64)
    -> String;

    // --- Plans ---

    /// A join of `table`'s row whose `id` is `id`, looked up row by row for each row before
    /// it, never merged or hashed; the row keeps the name `table`.
    fn lookup_join(&self, table: &str, id: &str) -> String;

    /// The `SELECT` of `walk`.
    fn index_walk(&self, walk: &IndexWalk<'_>) -> String;

    /// The order of the rows of an [`IndexWalk`] with `keys` leading columns, newest first,
    /// selected from it as `alias`.
    fn index_walk_order(&self, keys: usize, alias: &str) -> String;

    // --- Application tables (`[[outboxes]]`) ---

    /// The columns of the table bound as `$1` (quoted, `schema.table` allowed) with their
    /// declared types, in order: rows of `(name, declared)`, both text.
    fn table_columns(&self) -> &'static str;

    /// What a column of `declared` type holds.
    fn column_kind(&self, declared: &str) -> ColumnKind;

    /// The column `expr`, holding `kind`, as the bytes of a message body.
    fn body_bytes(&self, expr: &str, kind: ColumnKind) -> String;

    /// The timestamp column `expr`, holding `kind`, in unix milliseconds.
    fn timestamp_ms(&self, expr: &str, kind: ColumnKind) -> String;

    /// The database's clock, as a value for a timestamp column holding `kind`.
    fn now_for(&self, kind: ColumnKind) -> &'static str;

    /// `exprs` as a JSON array of text, itself text.
    fn json_text_array(&self, exprs: &[String]) -> String;

    /// A query answering whether the session may do `what` (the table bound as `$1`, quoted;
    /// a column as `$2`); `None` where the database has no grants.
    fn may(&self, what: Privilege) -> Option<&'static str>;

    /// A page of a search is read through its index walk, each row looked up by id (a
    /// planner that goes by statistics could otherwise walk the primary key between the
    /// window's ends); `false`: the plain page query, bounded by the window's lowest id (a
    /// planner that takes index hints).
    fn page_from_walk(&self) -> bool;
}

#[cfg(test)]
mod tests {
    use super::{Backend, for_url};

    #[test]
    fn the_url_names_the_dialect() {
        let backend = |url: &str| for_url(url).map(|d| d.backend());
        assert_eq!(backend("sqlite://x.db"), Some(Backend::Sqlite));
        assert_eq!(backend("sqlite::memory:"), Some(Backend::Sqlite));
        assert_eq!(backend("postgres://u@h/db"), Some(Backend::Postgres));
        assert_eq!(backend("postgresql://u@h/db"), Some(Backend::Postgres));
        assert_eq!(backend("mysql://u@h/db"), None);
        assert_eq!(Backend::Postgres.dialect().backend(), Backend::Postgres);
    }

    #[test]
    fn column_types_as_sqlalchemy_declares_them_read_as_their_kinds() {
        use super::ColumnKind::*;
        let pg = Backend::Postgres.dialect();
        for (declared, kind) in [
            ("integer", Integer),
            ("bigint", Integer),
            ("character varying(64)", Text),
            ("text", Text),
            ("jsonb", Json),
            ("bytea", Bytes),
            ("boolean", Boolean),
            ("timestamp without time zone", Timestamp),
            ("timestamp(6) with time zone", TimestampTz),
            ("uuid", Uuid),
            ("numeric(10,2)", Other),
        ] {
            assert_eq!(pg.column_kind(declared), kind, "postgres {declared}");
        }
        let lite = Backend::Sqlite.dialect();
        for (declared, kind) in [
            ("INTEGER", Integer),
            ("VARCHAR(64)", Text),
            ("TEXT", Text),
            ("DATETIME", Timestamp),
            ("BOOLEAN", Boolean),
            ("JSON", Json),
            ("BLOB", Bytes),
        ] {
            assert_eq!(lite.column_kind(declared), kind, "sqlite {declared}");
        }
    }

    #[test]
    fn placeholders_are_numbered_on_postgres_and_anonymous_on_sqlite() {
        let three = |backend: Backend| {
            let mut out = String::new();
            for n in 1..=3 {
                backend.dialect().placeholder(n, &mut out);
                out.push(' ');
            }
            out
        };
        assert_eq!(three(Backend::Postgres), "$1 $2 $3 ");
        assert_eq!(three(Backend::Sqlite), "? ? ? ");
    }
}
