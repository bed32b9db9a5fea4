//! Store errors, classified so the pipeline can choose between "pause and retry later"
//! (transient: never ack, the message stays in the broker) and "this data is bad".

use sqlx::error::DatabaseError;

/// What went wrong talking to the store.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// The database cannot be reached or is too busy right now (connect refused, pool
    /// timeout, I/O, SQLite busy/locked, server shutting down). Retry later; do not ack.
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

/// What a per-request database error means inside `commit_batch`.
pub(crate) enum Class {
    /// Lost a race (deadlock victim, serialization failure): re-run the handler.
    Conflict,
    /// The connection or server is in trouble: the whole batch fails.
    Unavailable,
    /// The request's data was refused by the database.
    Data,
}

/// PostgreSQL SQLSTATEs (always 5 characters) and SQLite result codes (numbers, at most 4
/// digits) that mean "try again later".
fn transient_code(code: &str) -> bool {
    if code.len() == 5 {
        // 08 connection exception, 53 insufficient resources, 57P0x shutdown / cannot
        // connect now, 58 system error (I/O).
        return ["08", "53", "57P", "58"]
            .iter()
            .any(|p| code.starts_with(p));
    }
    // SQLite primary code is the low byte: 5 BUSY, 6 LOCKED, 10 IOERR, 13 FULL.
    code.parse::<i64>()
        .is_ok_and(|c| matches!(c & 0xff, 5 | 6 | 10 | 13))
}

pub(crate) fn classify(err: &sqlx::Error) -> Class {
    match err {
        sqlx::Error::Database(db) => match db.code().as_deref() {
            Some("40001") | Some("40P01") => Class::Conflict,
            Some(c) if transient_code(c) => Class::Unavailable,
            _ => Class::Data,
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
    use super::transient_code;

    #[test]
    fn codes() {
        for c in ["08006", "57P01", "57P03", "53300", "5", "517", "6", "10"] {
            assert!(transient_code(c), "{c} should be transient");
        }
        for c in ["22021", "23505", "42P01", "19", "2067", "1"] {
            assert!(!transient_code(c), "{c} should not be transient");
        }
    }
}
