//! `[[outboxes]]`: an application's own outbox table, relayed beside Carteiro's outbox
//! (docs/outboxes.md). This file holds the entry and the checks that need no database; the
//! checks against the real table are `shape`'s.

use std::time::Duration;

use serde::Deserialize;

use crate::relay::RelayMode;
use crate::relay::config::plain_name;

/// One `[[outboxes]]` entry.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AppOutboxConfig {
    /// Names the outbox in logs, metrics, `carteiro outbox status` and (by default) its
    /// replication slot and publication: 1 to 63 lower-case letters, digits and `_`.
    pub name: String,
    /// The application's database: `postgres://...` or `sqlite://PATH` (relative to the
    /// config file), with TLS parameters in the query as for `[store] url`.
    pub url: String,
    /// The table, optionally `schema.table`.
    pub table: String,
    /// Where every row is published; it must already exist (checked at start).
    pub exchange: String,
    /// A fixed routing key for every row, instead of `columns.routing_key`.
    #[serde(default)]
    pub routing_key: Option<String>,
    /// `poll` (any database) or `cdc` (a PostgreSQL replication slot).
    #[serde(default)]
    pub mode: RelayMode,
    /// The table's columns.
    pub columns: Columns,
    /// What becomes of a row once its confirm arrived: `mark` (the published columns) or
    /// `delete`.
    #[serde(default)]
    pub after_publish: AfterPublish,
    /// The AMQP content type of every row (default: `application/json` for a `json` or
    /// `jsonb` payload column, none otherwise).
    #[serde(default)]
    pub content_type: Option<String>,
    /// Rows leased and not yet marked at once: bounds the rows sent again after a crash.
    #[serde(default = "default_max_in_flight")]
    pub max_in_flight: usize,
    /// How often the table is read when nothing woke the relay.
    #[serde(default = "default_poll_interval", with = "humantime_serde")]
    pub poll_interval: Duration,
    /// A standing-by relay takes over this long after the active one stopped renewing.
    #[serde(default = "default_takeover", with = "humantime_serde")]
    pub takeover: Duration,
    /// A payload above this is never published: the row is parked with its error.
    #[serde(default = "default_max_payload", with = "crate::common::units::size")]
    pub max_payload: u64,
    /// `cdc`: the replication slot (default: `carteiro_<name>`).
    #[serde(default)]
    pub slot: Option<String>,
    /// `cdc`: the publication on the table (default: `carteiro_<name>`).
    #[serde(default)]
    pub publication: Option<String>,
    /// `cdc`: the WAL the slot may hold back before the lag alert (sizes like `1GiB`).
    #[serde(default = "default_max_slot_lag", with = "crate::common::units::size")]
    pub max_slot_lag: u64,
    /// Deletes published rows older than this, in bounded batches (off by default: the
    /// table is the application's).
    #[serde(default, with = "humantime_serde")]
    pub retain_published: Option<Duration>,
}

/// `[outboxes.columns]`: which column holds what. Only `id`, `event_id` and `payload` are
/// required.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Columns {
    /// An increasing integer key: rows are read in its order.
    pub id: String,
    /// The AMQP `message_id`.
    pub event_id: String,
    /// The AMQP `type`.
    #[serde(default, rename = "type")]
    pub message_type: Option<String>,
    /// The routing key (or a fixed `routing_key` on the outbox).
    #[serde(default)]
    pub routing_key: Option<String>,
    /// The body: text, bytea, json or jsonb.
    pub payload: String,
    /// Set true once the row's own confirm arrived.
    #[serde(default)]
    pub published: Option<String>,
    /// Set to the time of the mark.
    #[serde(default)]
    pub published_at: Option<String>,
    /// The ordering key: a key's rows go out in order; rows without one promise none.
    #[serde(default)]
    pub key: Option<String>,
    /// When the row was written: the AMQP `timestamp` and the pending age.
    #[serde(default)]
    pub created_at: Option<String>,
    /// Columns sent as AMQP headers named after them.
    #[serde(default)]
    pub headers: Vec<String>,
}

/// `after_publish`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AfterPublish {
    /// Set `published` (and `published_at`).
    #[default]
    Mark,
    /// Delete the row.
    Delete,
}

fn default_max_in_flight() -> usize {
    256
}
fn default_poll_interval() -> Duration {
    // A commit waits at most this long to be read: p99 commit-to-publish about 80 ms, at
    // about 0.6 % of a core of the database's CPU when idle (bench/run.sh outbox).
    Duration::from_millis(80)
}
fn default_takeover() -> Duration {
    Duration::from_secs(5)
}
fn default_max_payload() -> u64 {
    16 << 20
}
fn default_max_slot_lag() -> u64 {
    1 << 30
}

impl AppOutboxConfig {
    /// The replication slot of `mode = "cdc"`.
    pub fn slot(&self) -> String {
        self.slot
            .clone()
            .unwrap_or_else(|| format!("carteiro_{}", self.name))
    }

    /// The publication of `mode = "cdc"`.
    pub fn publication(&self) -> String {
        self.publication
            .clone()
            .unwrap_or_else(|| format!("carteiro_{}", self.name))
    }

    /// Every configured column, with the key naming it (`columns.<key>`).
    pub fn named_columns(&self) -> Vec<(String, &str)> {
        let c = &self.columns;
        let mut out = vec![
            ("id".to_owned(), c.id.as_str()),
            ("event_id".to_owned(), c.event_id.as_str()),
            ("payload".to_owned(), c.payload.as_str()),
        ];
        let optional = [
            ("type", &c.message_type),
            ("routing_key", &c.routing_key),
            ("published", &c.published),
            ("published_at", &c.published_at),
            ("key", &c.key),
            ("created_at", &c.created_at),
        ];
        out.extend(
            optional
                .into_iter()
                .filter_map(|(k, v)| v.as_deref().map(|v| (k.to_owned(), v))),
        );
        out.extend(c.headers.iter().map(|h| ("headers".to_owned(), h.as_str())));
        out
    }

    /// Checks that need no database. `Err((key, message))` with the key under the entry.
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        if !plain_name(&self.name) {
            return Err((
                "name",
                format!(
                    "`{}`: use 1 to 63 lower-case letters, digits and `_`",
                    self.name
                ),
            ));
        }
        if crate::store::for_url(&self.url).is_none() {
            return Err((
                "url",
                "expected postgres://... or sqlite://PATH (the application's database)".into(),
            ));
        }
        if self.mode == RelayMode::Cdc && !self.url.starts_with("postgres") {
            return Err((
                "mode",
                "\"cdc\" reads a PostgreSQL replication slot; use mode = \"poll\" with SQLite"
                    .into(),
            ));
        }
        for (key, name) in [("slot", self.slot()), ("publication", self.publication())] {
            if !plain_name(&name) {
                return Err((
                    key,
                    format!("`{name}`: use 1 to 63 lower-case letters, digits and `_`"),
                ));
            }
        }
        if !self.table.split('.').all(identifier) || self.table.split('.').count() > 2 {
            return Err((
                "table",
                format!("`{}`: expected `table` or `schema.table`", self.table),
            ));
        }
        for (key, column) in self.named_columns() {
            if !identifier(column) {
                return Err((
                    "columns",
                    format!("columns.{key} = `{column}` is not a column name"),
                ));
            }
        }
        match (&self.routing_key, &self.columns.routing_key) {
            (Some(_), Some(_)) => {
                return Err((
                    "routing_key",
                    "set a fixed `routing_key` or `columns.routing_key`, not both".into(),
                ));
            }
            (None, None) => {
                return Err((
                    "routing_key",
                    "missing: set `columns.routing_key` (a column) or `routing_key` (the same \
                     for every row)"
                        .into(),
                ));
            }
            _ => {}
        }
        match (self.after_publish, &self.columns.published) {
            (AfterPublish::Mark, None) => {
                return Err((
                    "columns",
                    "columns.published is missing: the relay marks each row published there \
                     (or set after_publish = \"delete\")"
                        .into(),
                ));
            }
            (AfterPublish::Delete, Some(_)) => {
                return Err((
                    "after_publish",
                    "\"delete\" deletes published rows; drop columns.published and \
                     columns.published_at, or use \"mark\""
                        .into(),
                ));
            }
            _ => {}
        }
        if self.columns.published_at.is_some() && self.columns.published.is_none() {
            return Err((
                "columns",
                "columns.published_at needs columns.published".into(),
            ));
        }
        if self.retain_published.is_some() && self.after_publish == AfterPublish::Delete {
            return Err((
                "retain_published",
                "rows are deleted at publish already (after_publish = \"delete\")".into(),
            ));
        }
        if self.retain_published.is_some() && self.columns.published_at.is_none() {
            return Err((
                "retain_published",
                "needs columns.published_at: the age of a published row is read there".into(),
            ));
        }
        if self.max_in_flight == 0 {
            return Err(("max_in_flight", "must be at least 1".into()));
        }
        if self.poll_interval.is_zero() || self.takeover < Duration::from_secs(1) {
            return Err((
                "poll_interval",
                "poll_interval must be above zero and takeover at least 1s".into(),
            ));
        }
        Ok(())
    }
}

/// A name the relay can quote as an SQL identifier (`"name"`) on every backend.
fn identifier(name: &str) -> bool {
    !name.is_empty() && name.len() <= 63 && !name.contains(['"', '\0'])
}

/// `name` quoted as an SQL identifier; `schema.table` quoted part by part.
pub fn quoted(name: &str) -> String {
    name.split('.')
        .map(|part| format!("\"{part}\""))
        .collect::<Vec<_>>()
        .join(".")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    /// The issue's configuration, as written.
    pub const STORY: &str = r#"
name = "matriculas"
url = "postgres://app@db:5432/matriculas"
table = "outbox_events"
exchange = "matriculas"
mode = "poll"

[columns]
id = "id"
event_id = "evento_id"
type = "tipo"
routing_key = "routing_key"
payload = "payload"
published = "publicado"
published_at = "publicado_em"
"#;

    #[test]
    fn the_story_entry_reads_as_written() {
        let c: AppOutboxConfig = toml::from_str(STORY).unwrap();
        c.validate().unwrap();
        assert_eq!(c.columns.message_type.as_deref(), Some("tipo"));
        assert_eq!(c.slot(), "carteiro_matriculas");
        assert_eq!(c.after_publish, AfterPublish::Mark);
        assert_eq!(c.max_in_flight, 256);
        assert_eq!(quoted("app.outbox_events"), "\"app\".\"outbox_events\"");
    }

    #[test]
    fn entries_that_cannot_work_are_refused_naming_the_key() {
        let refused = |edit: &dyn Fn(&mut AppOutboxConfig)| {
            let mut c: AppOutboxConfig = toml::from_str(STORY).unwrap();
            edit(&mut c);
            c.validate().unwrap_err().0
        };
        assert_eq!(refused(&|c| c.name = "Matrículas".into()), "name");
        assert_eq!(refused(&|c| c.url = "mysql://x/y".into()), "url");
        assert_eq!(
            refused(&|c| {
                c.url = "sqlite:///tmp/x.db".into();
                c.mode = RelayMode::Cdc;
            }),
            "mode"
        );
        assert_eq!(
            refused(&|c| c.routing_key = Some("fixed".into())),
            "routing_key"
        );
        assert_eq!(refused(&|c| c.columns.routing_key = None), "routing_key");
        assert_eq!(refused(&|c| c.columns.published = None), "columns");
        assert_eq!(
            refused(&|c| c.after_publish = AfterPublish::Delete),
            "after_publish"
        );
        assert_eq!(refused(&|c| c.columns.payload = "a\"b".into()), "columns");
        assert_eq!(refused(&|c| c.table = "a.b.c".into()), "table");
        assert_eq!(refused(&|c| c.max_in_flight = 0), "max_in_flight");
    }
}
