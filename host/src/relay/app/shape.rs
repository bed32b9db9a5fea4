//! The application's table as the database holds it: each configured column's type, and
//! the grants the relay needs. `carteiro check` and every relay start read it, so a missing
//! column, a wrong type or a missing grant is named before any row is read.

use std::collections::HashMap;

use super::config::{AfterPublish, AppOutboxConfig, quoted};
use crate::relay::RelayMode;
use crate::store::{ColumnKind, Privilege, Store, StoreError};

/// What the configured columns hold.
#[derive(Debug, Clone)]
pub struct Shape {
    kinds: HashMap<String, ColumnKind>,
}

impl Shape {
    /// What column `name` holds (`Other` for a column the shape does not know).
    pub fn kind(&self, name: &str) -> ColumnKind {
        self.kinds.get(name).copied().unwrap_or(ColumnKind::Other)
    }
}

/// Why the table cannot be relayed as configured.
#[derive(Debug, thiserror::Error)]
pub enum ShapeError {
    #[error("table {0} does not exist (or this role cannot see it)")]
    NoTable(String),
    #[error("columns.{key} = \"{column}\": table {table} has no such column (it has: {has})")]
    NoColumn {
        key: String,
        column: String,
        table: String,
        has: String,
    },
    #[error("columns.{key} = \"{column}\" is {declared}; expected {expected}")]
    WrongType {
        key: String,
        column: String,
        declared: String,
        expected: &'static str,
    },
    #[error("the role cannot {what}; grant it: {grant}")]
    Grant { what: String, grant: String },
    #[error(transparent)]
    Store(#[from] StoreError),
}

#[derive(sqlx::FromRow)]
struct ColumnRow {
    name: String,
    declared: String,
}

/// The kinds a configured column may hold, and the words for them.
fn accepted(key: &str) -> (&'static [ColumnKind], &'static str) {
    use ColumnKind::*;
    match key {
        "id" => (&[Integer], "an integer"),
        "event_id" => (&[Text, Uuid], "text or uuid"),
        "payload" => (&[Text, Bytes, Json], "text, bytea, json or jsonb"),
        "published" => (&[Boolean, Integer], "a boolean"),
        "published_at" | "created_at" => (&[Timestamp, TimestampTz], "a timestamp"),
        "type" | "routing_key" => (&[Text], "text"),
        // An ordering key or a header: any value, sent as its text.
        _ => (
            &[
                Integer,
                Text,
                Bytes,
                Json,
                Boolean,
                Timestamp,
                TimestampTz,
                Uuid,
                Other,
            ],
            "any",
        ),
    }
}

/// Reads the table's columns and checks them, and the grants, against `config`.
pub async fn read(app: &Store, config: &AppOutboxConfig) -> Result<Shape, ShapeError> {
    let dialect = app.dialect();
    let table = quoted(&config.table);
    let rows: Vec<ColumnRow> = sqlx::query_as(dialect.table_columns())
        .bind(&table)
        .fetch_all(app.pool())
        .await
        .map_err(StoreError::from)?;
    if rows.is_empty() {
        return Err(ShapeError::NoTable(config.table.clone()));
    }
    let declared: HashMap<&str, &str> = rows
        .iter()
        .map(|r| (r.name.as_str(), r.declared.as_str()))
        .collect();
    let mut kinds = HashMap::new();
    for (key, column) in config.named_columns() {
        let Some(declared) = declared.get(column) else {
            let has: Vec<&str> = rows.iter().map(|r| r.name.as_str()).collect();
            return Err(ShapeError::NoColumn {
                key,
                column: column.to_owned(),
                table: config.table.clone(),
                has: has.join(", "),
            });
        };
        let kind = dialect.column_kind(declared);
        let (ok, expected) = accepted(&key);
        if !ok.contains(&kind) {
            return Err(ShapeError::WrongType {
                key,
                column: column.to_owned(),
                declared: (*declared).to_owned(),
                expected,
            });
        }
        kinds.insert(column.to_owned(), kind);
    }
    check_grants(app, config, &table).await?;
    Ok(Shape { kinds })
}

async fn check_grants(
    app: &Store,
    config: &AppOutboxConfig,
    table: &str,
) -> Result<(), ShapeError> {
    let dialect = app.dialect();
    let mut asks: Vec<(Privilege, Option<&str>, String, String)> = vec![(
        Privilege::Select,
        None,
        format!("read {}", config.table),
        format!("GRANT SELECT ON {table} TO <role>"),
    )];
    match config.after_publish {
        AfterPublish::Mark => {
            let c = &config.columns;
            for column in [c.published.as_deref(), c.published_at.as_deref()]
                .into_iter()
                .flatten()
            {
                asks.push((
                    Privilege::UpdateColumn,
                    Some(column),
                    format!("update {}.{column}", config.table),
                    format!("GRANT UPDATE ({}) ON {table} TO <role>", quoted(column)),
                ));
            }
        }
        AfterPublish::Delete => asks.push((
            Privilege::Delete,
            None,
            format!("delete from {}", config.table),
            format!("GRANT DELETE ON {table} TO <role>"),
        )),
    }
    if config.mode == RelayMode::Cdc {
        asks.push((
            Privilege::Replicate,
            None,
            "open a replication connection (mode = \"cdc\")".into(),
            "ALTER ROLE <role> REPLICATION".into(),
        ));
    }
    for (privilege, column, what, grant) in asks {
        let Some(sql) = dialect.may(privilege) else {
            return Ok(());
        };
        let mut query = sqlx::query_scalar::<_, bool>(sql);
        if privilege != Privilege::Replicate {
            query = query.bind(table);
        }
        if let Some(column) = column {
            query = query.bind(column);
        }
        let allowed: Option<bool> = query
            .fetch_optional(app.pool())
            .await
            .map_err(StoreError::from)?;
        if allowed != Some(true) {
            return Err(ShapeError::Grant { what, grant });
        }
    }
    Ok(())
}
