//! Checks on text before it reaches the database. PostgreSQL text cannot hold NUL, and we
//! refuse it on SQLite too so both backends accept exactly the same data. Headers need no
//! check: they are stored as JSON text, where NUL is escaped.

use super::StoreError;

/// Refuses a NUL byte in `value`, naming the field so the operator can find the culprit.
pub(crate) fn text(field: &str, value: &str) -> Result<(), StoreError> {
    match value.find('\0') {
        None => Ok(()),
        Some(at) => Err(StoreError::Invalid(format!(
            "{field} contains a NUL byte (U+0000) at byte {at}; the store cannot hold NUL in text \
             fields"
        ))),
    }
}

/// For text we only record (error messages): replace NUL rather than fail.
pub(crate) fn lossy(value: &str) -> String {
    value.replace('\0', "\u{FFFD}")
}
