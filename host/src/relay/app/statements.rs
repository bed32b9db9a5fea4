//! The SQL the relay runs on an application's table, built once from the entry and the
//! table's shape in the database's dialect. Every value is bound; names are the config's,
//! quoted (`config::quoted`).

use super::config::{AfterPublish, AppOutboxConfig, quoted};
use super::shape::Shape;
use crate::store::{ColumnKind, Dialect};

/// The statements of one application outbox.
#[derive(Debug, Clone)]
pub struct Statements {
    /// Unpublished rows, in id order, but those whose ids are bound as a JSON array (`$1`)
    /// and those whose ordering key is among the JSON array `$2`; at most `$3`.
    pub claim: String,
    /// Marks (or deletes) the rows whose ids are the JSON array `$1`.
    pub settle: String,
    /// The ids among the JSON array `$1` that exist.
    pub existing: String,
    /// The ids among the JSON array `$1` still to publish.
    pub unpublished: String,
    /// The highest id.
    pub last_id: String,
    /// How many rows up to id `$1` are still to publish.
    pub pending_up_to: String,
    /// Rows to publish, and the oldest one's age in ms (NULL without a `created_at`).
    pub status: String,
    /// Rows whose published column is NULL: the poll never sees them.
    pub null_published: Option<String>,
    /// The event id and ordering key of row `$1`.
    pub identity: String,
    /// Deletes up to a batch of rows published longer than `$1` ms ago.
    pub purge: Option<String>,
}

impl Statements {
    pub fn new(config: &AppOutboxConfig, shape: &Shape, dialect: &dyn Dialect) -> Self {
        let c = &config.columns;
        let t = quoted(&config.table);
        let id = quoted(&c.id);
        let text = |column: &Option<String>| match column {
            Some(col) => format!("CAST({} AS TEXT)", quoted(col)),
            None => "CAST(NULL AS TEXT)".to_owned(),
        };
        let created_ms = match &c.created_at {
            Some(col) => dialect.timestamp_ms(&quoted(col), shape.kind(col)),
            None => "CAST(NULL AS BIGINT)".to_owned(),
        };
        let headers = if c.headers.is_empty() {
            "CAST(NULL AS TEXT)".to_owned()
        } else {
            let columns: Vec<String> = c.headers.iter().map(|h| quoted(h)).collect();
            dialect.json_text_array(&columns)
        };
        let select = format!(
            "CAST({id} AS BIGINT) AS id, CAST({event_id} AS TEXT) AS event_id, \
             {message_type} AS message_type, {routing_key} AS routing_key, \
             {payload} AS payload, {key} AS ordering_key, {created_ms} AS created_ms, \
             {headers} AS headers",
            event_id = quoted(&c.event_id),
            message_type = text(&c.message_type),
            routing_key = text(&c.routing_key),
            payload = dialect.body_bytes(&quoted(&c.payload), shape.kind(&c.payload)),
            key = text(&c.key),
        );
        let pending = match &c.published {
            Some(col) => format!("NOT {}", quoted(col)),
            None => "1 = 1".to_owned(),
        };
        let held = match &c.key {
            Some(col) => format!(
                "AND ({k} IS NULL OR CAST({k} AS TEXT) NOT IN ({values}))",
                k = quoted(col),
                values = dialect.json_array_values(2, false)
            ),
            None => String::new(),
        };
        let ids = |n| dialect.json_array_values(n, true);
        let settle = match (config.after_publish, &c.published) {
            (AfterPublish::Mark, Some(published)) => {
                let yes = match shape.kind(published) {
                    ColumnKind::Integer => "1",
                    _ => "TRUE",
                };
                let at = match &c.published_at {
                    Some(col) => {
                        format!(", {} = {}", quoted(col), dialect.now_for(shape.kind(col)))
                    }
                    None => String::new(),
                };
                format!(
                    "UPDATE {t} SET {} = {yes}{at} WHERE {id} IN ({})",
                    quoted(published),
                    ids(1)
                )
            }
            _ => format!("DELETE FROM {t} WHERE {id} IN ({})", ids(1)),
        };
        let purge = match (&config.retain_published, &c.published, &c.published_at) {
            (Some(_), Some(published), Some(at)) => {
                let age = dialect.timestamp_ms(&quoted(at), shape.kind(at));
                let condition = format!(
                    "{} AND {age} < {} - $1",
                    quoted(published),
                    dialect.clock_ms()
                );
                Some(dialect.delete_batch(&t, None, &condition, PURGE_BATCH))
            }
            _ => None,
        };
        Self {
            claim: format!(
                "SELECT {select} FROM {t} WHERE {pending} AND {id} NOT IN ({}) {held} \
                 ORDER BY {id} LIMIT $3",
                ids(1)
            ),
            settle,
            existing: format!(
                "SELECT CAST({id} AS BIGINT) FROM {t} WHERE {id} IN ({})",
                ids(1)
            ),
            unpublished: format!(
                "SELECT CAST({id} AS BIGINT) FROM {t} WHERE {pending} AND {id} IN ({})",
                ids(1)
            ),
            last_id: format!("SELECT CAST(MAX({id}) AS BIGINT) FROM {t}"),
            pending_up_to: format!(
                "SELECT CAST(COUNT(*) AS BIGINT) FROM {t} WHERE {pending} AND {id} <= $1"
            ),
            status: format!(
                "SELECT CAST(COUNT(*) AS BIGINT) AS pending, \
                 CAST({} - MIN({created_ms}) AS BIGINT) AS oldest_age_ms FROM {t} WHERE {pending}",
                dialect.clock_ms()
            ),
            null_published: c.published.as_ref().map(|col| {
                format!(
                    "SELECT CAST(COUNT(*) AS BIGINT) FROM {t} WHERE {} IS NULL",
                    quoted(col)
                )
            }),
            identity: format!(
                "SELECT CAST({} AS TEXT), {} FROM {t} WHERE {id} = $1",
                quoted(&c.event_id),
                text(&c.key)
            ),
            purge,
        }
    }
}

/// Published rows deleted per statement by `retain_published`.
pub const PURGE_BATCH: u64 = 1_000;
