//! The schema, embedded at compile time (no `macros` feature, no files at run time).
//! Both folders hold the same logical schema; add a migration to both, with the same number,
//! and list it here (a test checks that every file of both folders is listed).
//! (0008, the covering index of the dead-letter groups, is SQLite's alone: a PostgreSQL
//! B-tree refuses entries over about 2.7 kB, and a reason may be far longer. 0013, the body
//! fields as rows of `dead_letter_fields` instead of a GIN-indexed `jsonb` column, is
//! PostgreSQL's alone: SQLite's 0011 made that table already. So SQLite skips 13.)

use std::borrow::Cow;

use sqlx::SqlSafeStr;
use sqlx::migrate::{Migration, MigrationType, Migrator};

/// One migration: its version, description and SQL.
pub(crate) type MigrationFile = (i64, &'static str, &'static str);

/// SQLite's schema (`backend::Sqlite`).
pub(crate) const SQLITE: &[MigrationFile] = &[
    (
        1,
        "initial",
        include_str!("../../migrations/sqlite/0001_initial.sql"),
    ),
    (
        2,
        "outbox blocking index",
        include_str!("../../migrations/sqlite/0002_outbox_blocking_index.sql"),
    ),
    (
        3,
        "secrets",
        include_str!("../../migrations/sqlite/0003_secrets.sql"),
    ),
    (
        4,
        "dead letter originals",
        include_str!("../../migrations/sqlite/0004_dead_letter_originals.sql"),
    ),
    (
        5,
        "write probe",
        include_str!("../../migrations/sqlite/0005_write_probe.sql"),
    ),
    (
        6,
        "dead letter replay claims",
        include_str!("../../migrations/sqlite/0006_dead_letter_replay_claims.sql"),
    ),
    (
        7,
        "canary decisions",
        include_str!("../../migrations/sqlite/0007_canary_decisions.sql"),
    ),
    (
        8,
        "dead letter groups index",
        include_str!("../../migrations/sqlite/0008_dead_letter_groups_index.sql"),
    ),
    (
        9,
        "dead letter retention index",
        include_str!("../../migrations/sqlite/0009_dead_letter_retention_index.sql"),
    ),
    (
        10,
        "dead letter history",
        include_str!("../../migrations/sqlite/0010_dead_letter_history.sql"),
    ),
    (
        11,
        "dead letter search",
        include_str!("../../migrations/sqlite/0011_dead_letter_search.sql"),
    ),
    (
        12,
        "dead letter edit claims",
        include_str!("../../migrations/sqlite/0012_dead_letter_edit_claims.sql"),
    ),
    (
        14,
        "dead letter events forget",
        include_str!("../../migrations/sqlite/0014_dead_letter_events_forget.sql"),
    ),
    (
        20,
        "application outboxes",
        include_str!("../../migrations/sqlite/0020_application_outboxes.sql"),
    ),
    (
        21,
        "dead letter dedupe",
        include_str!("../../migrations/sqlite/0021_dead_letter_dedupe.sql"),
    ),
];

/// PostgreSQL's schema (`backend::Postgres`).
pub(crate) const POSTGRES: &[MigrationFile] = &[
    (
        1,
        "initial",
        include_str!("../../migrations/postgres/0001_initial.sql"),
    ),
    (
        2,
        "outbox blocking index",
        include_str!("../../migrations/postgres/0002_outbox_blocking_index.sql"),
    ),
    (
        3,
        "secrets",
        include_str!("../../migrations/postgres/0003_secrets.sql"),
    ),
    (
        4,
        "dead letter originals",
        include_str!("../../migrations/postgres/0004_dead_letter_originals.sql"),
    ),
    (
        5,
        "write probe",
        include_str!("../../migrations/postgres/0005_write_probe.sql"),
    ),
    (
        6,
        "dead letter replay claims",
        include_str!("../../migrations/postgres/0006_dead_letter_replay_claims.sql"),
    ),
    (
        7,
        "canary decisions",
        include_str!("../../migrations/postgres/0007_canary_decisions.sql"),
    ),
    (
        9,
        "dead letter retention index",
        include_str!("../../migrations/postgres/0009_dead_letter_retention_index.sql"),
    ),
    (
        10,
        "dead letter history",
        include_str!("../../migrations/postgres/0010_dead_letter_history.sql"),
    ),
    (
        11,
        "dead letter search",
        include_str!("../../migrations/postgres/0011_dead_letter_search.sql"),
    ),
    (
        12,
        "dead letter edit claims",
        include_str!("../../migrations/postgres/0012_dead_letter_edit_claims.sql"),
    ),
    (
        13,
        "dead letter fields",
        include_str!("../../migrations/postgres/0013_dead_letter_fields.sql"),
    ),
    (
        14,
        "dead letter events forget",
        include_str!("../../migrations/postgres/0014_dead_letter_events_forget.sql"),
    ),
    (
        20,
        "application outboxes",
        include_str!("../../migrations/postgres/0020_application_outboxes.sql"),
    ),
    (
        21,
        "dead letter dedupe",
        include_str!("../../migrations/postgres/0021_dead_letter_dedupe.sql"),
    ),
];

/// The migrations of `files` (a dialect's `schema`).
pub(crate) fn migrator(files: &[MigrationFile]) -> Migrator {
    Migrator::with_migrations(
        files
            .iter()
            .map(|&(version, description, sql)| {
                Migration::new(
                    version,
                    Cow::Borrowed(description),
                    MigrationType::Simple,
                    sql.into_sql_str(),
                    false,
                )
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::{POSTGRES, SQLITE};

    /// The version numbers of the `NNNN_*.sql` files in `host/migrations/FOLDER`.
    fn files_in(folder: &str) -> Vec<i64> {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("migrations")
            .join(folder);
        let mut versions: Vec<i64> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .flatten()
            .filter_map(|entry| {
                let name = entry.file_name().to_string_lossy().into_owned();
                name.strip_suffix(".sql")?.split('_').next()?.parse().ok()
            })
            .collect();
        versions.sort_unstable();
        versions
    }

    #[test]
    fn every_migration_file_is_listed_once() {
        for (folder, listed) in [("sqlite", SQLITE), ("postgres", POSTGRES)] {
            let listed: Vec<i64> = listed.iter().map(|&(version, _, _)| version).collect();
            assert_eq!(files_in(folder), listed, "{folder}: files and list differ");
        }
    }
}
