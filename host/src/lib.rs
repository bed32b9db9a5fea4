//! # Carteiro
//!
//! A RabbitMQ message-processing gateway whose handlers are sandboxed WebAssembly
//! components. See `docs/architecture.md` and the README for the whole picture.
//!
//! # Layout
//! - [`config`]: the operator's TOML assembled — [`Config`](config::Config) names each
//!   part's section, loading with file:line errors, `${VAR}` interpolation, the checks across
//!   sections; and `[admin]` and `[security]`, whose users sit above it. Every other section
//!   lives beside its code as `PART/config.rs` (struct, defaults, its own checks): `broker`,
//!   `store`, `runtime` (`[runtime]`, `[plugins]`), `relay`, `housekeeping` (`[outbox]`,
//!   `[dead_letters]`), `telemetry`, `pipeline` (`[[routes]]`).
//! - [`cli`]: the `carteiro` command line. A command that drives a part is named apart from
//!   it: `dlq_command`, `shadow_command`, `canary_command`, `seal_command`.
//! - [`runtime`]: the wasmtime sandbox — engine, limits, host imports, one call of `handle`,
//!   instances kept for reuse by plugins with `isolation = "per-batch"` (`pool`), the
//!   default for Python and JavaScript components (`language`: read from their metadata);
//!   one call of `handle-batch` with effects kept per message (`batch`, `linked`: which
//!   carteiro world a component was linked for); `standard`: wasi:messaging@0.2.0-draft
//!   components, detected at load, with `producer.send` through the outbox.
//! - [`common`]: time, test-only fault points, Carteiro's header names (`header_names`), the
//!   labels deliveries are counted by, units such as `64MiB` (used by many, config included),
//!   and `retry`: the named retry policies every site that retries uses (on `backon`).
//! - [`broker`]: AMQP connections, confirmed publishing, field tables as text
//!   (`field_table`), the builder of everything Carteiro publishes, and the seal on
//!   Carteiro's own headers.
//! - [`topology`]: declare and verify a route's queues and exchanges (it knows no config:
//!   `RouteConfig::topology` says what a route needs).
//! - [`pipeline`]: one delivery from receipt to ack, the supervised consumers, a route's
//!   config; `batch`: a route's deliveries gathered into one `handle-batch` call, each settled
//!   by its own verdict, the acked ones committed together; a new plugin version beside the
//!   live one: `canary` (a share of deliveries), `live_shadow` (sampled deliveries, compared).
//! - [`store`]: sqlx on SQLite or PostgreSQL — inbox, kv, outbox, dead letters (`dead_letters/`),
//!   group commit (`commit/`); `outbox_cdc`: the outbox queries of the CDC relay (no leases);
//!   `change_feed`: commit wake-ups and the replication slot's setup;
//!   `backend/`: the dialect, every difference between the two databases.
//! - [`relay`]: the outbox publisher, reading a `Source` (Carteiro's outbox, `outbox_table`)
//!   by polling (`poll`), or `cdc`: its inserts from a PostgreSQL logical replication slot
//!   (`[relay] mode = "cdc"`); chains, publishing, marks, parking and backoff are shared.
//! - [`foreign_dlq`]: `[[dead_letter_queues]]`, the DLQs of services Carteiro does not feed,
//!   archived into the same archive (consumer, record and dedupe key, replay to the origin,
//!   Celery tasks).
//! - [`dlq`]: dead letters for people (JSON views, replay, `shadow_replay`: what a new
//!   version would decide on archived dead letters, `edit`: edit and retry, `journey`: every
//!   attempt, replay and edit of a message, `search`: the query syntax of the console and the
//!   CLI).
//! - [`gateway`]: `carteiro run` — everything wired together (on top: nothing imports it
//!   but `cli`).
//! - [`services`]: what the gateway wires, below it: plugin loading, the runtime factory, the
//!   store and its seal key, broker settings.
//! - [`startup`]: opening the store at start-up, waiting while it refuses writes.
//! - [`live`]: changing handlers while running — reload (SIGHUP, `POST /admin/reload`).
//! - [`admin`]: health, readiness, metrics, the console and DLQ over HTTP; `GatewayHandle`,
//!   what a running gateway exposes to it.
//! - [`metrics`]: Prometheus metrics, one file per part (deliveries, versions, plugin
//!   instances, batches, reload, outbox, broker, alerts, store gate, replay, retention), each
//!   registering its own families; below every part, which all share one `Arc<Metrics>`.
//!   Also each route's last hour a minute at a time (`history`), for the console's charts.
//! - [`housekeeping`]: retention — how long each table keeps its rows (`[outbox]`,
//!   `[dead_letters]`), the purges once a minute in batches, and what the last ones did.
//! - [`alerts`]: dead-letter alerts per route (an ERROR log, a gauge, a `/readyz` line).
//! - [`telemetry`]: OpenTelemetry spans of deliveries and relay publishes (`[telemetry]`).
//! - [`redact`]: the one redaction for URLs that may hold a password (broker and store).
//! - [`logfmt`]: text logs with control characters escaped in every field.
//! - `module_graph` (tests only): the check that these modules import each other without a
//!   circle.

pub mod admin;
pub mod alerts;
pub mod broker;
pub mod cli;
pub mod common;
pub mod config;
pub mod dlq;
pub mod foreign_dlq;
pub mod gateway;
pub mod housekeeping;
pub mod live;
pub mod logfmt;
pub mod metrics;
#[cfg(test)]
mod module_graph;
pub mod pipeline;
pub mod redact;
pub mod relay;
pub mod runtime;
pub mod services;
pub mod startup;
pub mod store;
pub mod telemetry;
pub mod topology;
