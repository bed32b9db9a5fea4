//! Store errors, classified so the pipeline can choose between "pause and retry later"
//! (transient: never ack, the message stays in the broker) and "this data is bad".

use sqlx::error::DatabaseError;

pub(crate) use super::backend::Class;
use super::backend::UrlError;

/// What went wrong talking to the store.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// The store itself is in trouble, whatever the data: unreachable, too busy or too slow
    /// (connect refused, pool or statement timeout, SQLite busy/locked), read-only after a
    /// failover, full, corrupt, or missing its tables or grants (see `classify_code`).
    /// Retry later; do not ack, never dead-letter for it.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The caller's data cannot be stored (e.g. a NUL byte in a text field).
    #[error("invalid data for the store: {0}")]
    Invalid(String),
    /// Applying the schema migrations failed.
    #[error("store migration failed: {0}")]
    Migration(String),
    /// Any other database error.
    #[error("store error: {0}")]
    Database(String),
}

impl StoreError {
    /// True when retrying the same operation later may succeed.
    pub fn is_transient(&self) -> bool {
        matches!(self, StoreError::Unavailable(_))
    }
}

/// What a database error code means by itself, by the dialect whose codes look like it
/// (`Dialect::classify`).
///
/// The rule: an error that would hit *any* request the same way (the database is read-only,
/// full, corrupt, unreachable, too slow, or its schema or permissions are not the ones
/// Carteiro migrated) is the store's trouble, `Unavailable`: the delivery is requeued and the
/// route pauses, so a good message is never dead-lettered for it. Only an error about *this*
/// request's values is `Data`. Unknown codes count as `Data`, so the savepoint fallback of
/// `commit_batch` isolates them to one request.
pub(crate) fn classify_code(code: &str, message: &str) -> Class {
    super::backend::of_error_code(code).classify(code, message)
}

pub(crate) fn classify(err: &sqlx::Error) -> Class {
    match err {
        sqlx::Error::Database(db) => match db.code() {
            Some(code) => classify_code(&code, db.message()),
            None => Class::Data,
        },
        sqlx::Error::Encode(_) | sqlx::Error::InvalidArgument(_) => Class::Data,
        _ => Class::Unavailable,
    }
}

fn db_message(db: &dyn DatabaseError) -> String {
    match db.code() {
        Some(code) => format!("{} (code {code})", db.message()),
        None => db.message().to_string(),
    }
}

impl From<sqlx::Error> for StoreError {
    fn from(err: sqlx::Error) -> Self {
        let msg = match &err {
            sqlx::Error::Database(db) => db_message(db.as_ref()),
            other => other.to_string(),
        };
        match classify(&err) {
            Class::Unavailable => StoreError::Unavailable(msg),
            Class::Conflict | Class::Data => StoreError::Database(msg),
        }
    }
}

impl From<UrlError> for StoreError {
    fn from(err: UrlError) -> Self {
        StoreError::Unavailable(err.to_string())
    }
}

impl From<sqlx::migrate::MigrateError> for StoreError {
    fn from(err: sqlx::migrate::MigrateError) -> Self {
        match err {
            sqlx::migrate::MigrateError::Execute(e) => match StoreError::from(e) {
                StoreError::Unavailable(m) => StoreError::Unavailable(m),
                other => StoreError::Migration(other.to_string()),
            },
            other => StoreError::Migration(other.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Class, classify_code};

    fn name(c: &Class) -> &'static str {
        match c {
            Class::Conflict => "conflict",
            Class::Unavailable => "unavailable",
            Class::Data => "data",
        }
    }

    /// Lost races: (code, message).
    const CONFLICT: &[(&str, &str)] = &[
        // PostgreSQL.
        ("40001", ""),
        ("40P01", ""),
    ];

    /// The store's trouble: (code, message).
    const UNAVAILABLE: &[(&str, &str)] = &[
        // PostgreSQL.
        ("25006", "cannot execute INSERT in a read-only transaction"),
        ("57014", "canceling statement due to statement timeout"),
        ("55P03", "canceling statement due to lock timeout"),
        ("42P01", "relation \"inbox\" does not exist"),
        ("42703", "column \"lease_owner\" does not exist"),
        ("42501", "permission denied for table kv"),
        ("3D000", "database \"carteiro\" does not exist"),
        ("28P01", "password authentication failed"),
        ("08006", "connection failure"),
        ("53100", "could not extend file: No space left on device"),
        ("53300", "too many connections"),
        (
            "57P01",
            "terminating connection due to administrator command",
        ),
        ("57P03", "the database system is starting up"),
        ("58030", "could not write to file"),
        ("XX001", "invalid page in block"),
        ("XX002", "index is corrupted"),
        // SQLite (primary and extended codes).
        ("5", "database is locked"),
        ("517", "database is locked"),
        ("6", "database table is locked"),
        ("8", "attempt to write a readonly database"),
        ("1032", "attempt to write a readonly database"),
        ("10", "disk I/O error"),
        ("266", "disk I/O error"),
        ("11", "database disk image is malformed"),
        ("779", "database disk image is malformed"),
        ("13", "database or disk is full"),
        ("14", "unable to open database file"),
        ("26", "file is not a database"),
        ("1", "no such table: inbox"),
        ("1", "no such column: lease_owner"),
    ];

    /// This request's data: (code, message).
    const DATA: &[(&str, &str)] = &[
        // PostgreSQL.
        ("22021", "invalid byte sequence for encoding \"UTF8\": 0x00"),
        ("22P05", "unsupported Unicode escape sequence"),
        ("23505", "duplicate key value violates unique constraint"),
        ("23502", "null value in column violates not-null constraint"),
        (
            "54000",
            "index row size 3000 exceeds btree version 4 maximum 2704",
        ),
        ("22003", "value out of range"),
        // SQLite.
        ("19", "UNIQUE constraint failed"),
        ("2067", "UNIQUE constraint failed: outbox.event_id"),
        ("1299", "NOT NULL constraint failed"),
        ("18", "string or blob too big"),
        ("1", "near \"x\": syntax error"),
    ];

    #[test]
    fn the_classification_table() {
        for (want, table) in [
            ("conflict", CONFLICT),
            ("unavailable", UNAVAILABLE),
            ("data", DATA),
        ] {
            for (code, message) in table {
                assert_eq!(
                    name(&classify_code(code, message)),
                    want,
                    "code {code} ({message})"
                );
            }
        }
    }
}
