//! `[[outboxes]]`: relaying an application's own outbox table, written in the
//! application's own transactions (a SQLAlchemy Unit of Work, say), without the service
//! moving into the sandbox (docs/outboxes.md). The table is one more relay source: the
//! chains, confirms, marks, parking, backoff and the slot are the relay's; what is this
//! folder's is reading someone else's table.
//!
//! # Layout
//! - this file: [`AppRelay`] (open, check, run) and [`AppStatus`].
//! - `config`: the `[[outboxes]]` entry and its checks without a database.
//! - `shape`: the real table's columns, types and grants.
//! - `statements`: the SQL on the table, in its dialect.
//! - `row`: a row (from the claim or the slot) as the relay's row.
//! - `source`: the table as a relay source; failures kept in Carteiro's store.
//! - `leader`: one relay publishes an outbox at a time (polling).

mod config;
mod leader;
mod row;
mod shape;
mod source;
mod statements;

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

pub use config::AppOutboxConfig;
pub use shape::ShapeError;

use super::{Settings, cdc, poll};
use crate::broker::{BrokerConfig, ConnectOptions};
use crate::common::FaultPoint;
use crate::metrics::Metrics;
use crate::relay::RelayMode;
use crate::store::{AppFailure, Store, StoreError, StoreOptions};
use crate::telemetry::Telemetry;
use leader::Leader;
use row::Reading;
use source::AppSource;
use statements::Statements;

/// Connections the relay keeps to the application's database.
const APP_CONNECTIONS: u32 = 4;

/// The `NOTIFY` channel of the opt-in trigger of outbox `name`.
pub fn notify_channel(name: &str) -> String {
    format!("carteiro_{name}")
}

/// The opt-in trigger that wakes the relay at each commit of a row (PostgreSQL), for
/// `carteiro outbox trigger`: the poll interval is then only a backstop.
pub fn trigger_sql(config: &AppOutboxConfig) -> String {
    let table = config::quoted(&config.table);
    let channel = notify_channel(&config.name);
    format!(
        "CREATE OR REPLACE FUNCTION {channel}_notify() RETURNS trigger LANGUAGE plpgsql AS $$\n\
         BEGIN PERFORM pg_notify('{channel}', ''); RETURN NULL; END $$;\n\
         CREATE OR REPLACE TRIGGER {channel}_notify AFTER INSERT ON {table}\n  \
         FOR EACH STATEMENT EXECUTE FUNCTION {channel}_notify();\n"
    )
}

/// Why an application outbox cannot be relayed.
#[derive(Debug, thiserror::Error)]
pub enum AppOutboxError {
    /// The error names the (redacted) URL already.
    #[error("outbox {name}: the application's database does not answer: {source}")]
    Connect { name: String, source: StoreError },
    #[error("outbox {name}: {source}")]
    Shape { name: String, source: ShapeError },
}

/// An application outbox, opened and checked against its table.
pub struct Opened {
    config: AppOutboxConfig,
    app: Store,
    shape: shape::Shape,
}

impl Opened {
    /// Connects to the application's database and checks the table: every configured
    /// column, its type, and the grants the relay needs.
    pub async fn open(config: &AppOutboxConfig) -> Result<Self, AppOutboxError> {
        let name = config.name.clone();
        let app = Store::connect_application(&config.url, &StoreOptions::new(APP_CONNECTIONS))
            .await
            .map_err(|source| AppOutboxError::Connect {
                name: name.clone(),
                source,
            })?;
        let shape = shape::read(&app, config)
            .await
            .map_err(|source| AppOutboxError::Shape { name, source })?;
        Ok(Self {
            config: config.clone(),
            app,
            shape,
        })
    }

    /// The entry it was opened from.
    pub fn config(&self) -> &AppOutboxConfig {
        &self.config
    }

    /// What the table holds now.
    pub async fn status(&self, store: &Store) -> Result<AppStatus, StoreError> {
        let sql = Statements::new(&self.config, &self.shape, self.app.dialect());
        let (pending, oldest_age_ms): (i64, Option<i64>) = self
            .app
            .bounded("application outbox status", async {
                Ok(sqlx::query_as(sqlx::AssertSqlSafe(sql.status))
                    .fetch_one(self.app.pool())
                    .await?)
            })
            .await?;
        let null_published = match sql.null_published {
            Some(q) => {
                self.app
                    .bounded("application outbox status", async {
                        Ok(sqlx::query_scalar(sqlx::AssertSqlSafe(q))
                            .fetch_one(self.app.pool())
                            .await?)
                    })
                    .await?
            }
            None => 0,
        };
        let failures = store.app_outbox_failures(&self.config.name, false).await?;
        let leader = store.app_outbox_leader(&self.config.name).await?;
        Ok(AppStatus {
            pending,
            oldest_age_ms,
            null_published,
            failures,
            leader,
        })
    }

    /// The relay of this outbox, publishing to `broker`; its bookkeeping goes to `store`.
    fn relay(
        self,
        broker: &BrokerConfig,
        store: Store,
        metrics: Arc<Metrics>,
        telemetry: Telemetry,
    ) -> Running {
        let config = self.config;
        let sql = Statements::new(&config, &self.shape, self.app.dialect());
        let reading = Reading::new(&config, &self.shape);
        let cdc = (config.mode == RelayMode::Cdc).then(|| cdc::CdcSettings {
            slot: config.slot(),
            publication: config.publication(),
            max_slot_lag: config.max_slot_lag,
        });
        // The slot already lets one relay read at a time.
        let leader = Leader::new(&config.name, config.takeover, cdc.is_none());
        let settings = Settings {
            // The relay's shared code counts into Carteiro's own outbox families; this
            // outbox's counts are kept apart and mirrored under its name (`observe`).
            metrics: Arc::new(Metrics::default()),
            wake: Arc::default(),
            urls: broker.addresses(),
            connect: ConnectOptions {
                heartbeat: broker.heartbeat,
                connect_timeout: broker.connect_timeout,
                connection_name: format!("carteiro relay {}", config.name),
                tls: broker.tls.clone(),
            },
            publish_timeout: broker.publish_timeout,
            max_in_flight: config.max_in_flight,
            max_in_flight_bytes: 64 << 20,
            poll_interval: config.poll_interval,
            reconnect_max: broker.reconnect_max_backoff,
            // The poll session lets a claimed row start up to `lease` less a publish timeout
            // less a second after its claim: that is the leader's margin, so the row starts
            // before a standing-by relay could take the outbox over (`leader`).
            lease: broker.publish_timeout
                + broker
                    .publish_timeout
                    .min(std::time::Duration::from_secs(1))
                + Leader::margin(config.takeover),
            fault: FaultPoint::from_env(),
            // The application commits its own rows: nothing is handed over.
            handoff: None,
            telemetry,
        };
        let source = AppSource::new(
            config,
            self.app,
            store.clone(),
            sql,
            reading,
            leader.clone(),
            metrics.clone(),
        );
        Running {
            settings,
            source,
            cdc,
            leader,
            store,
            metrics,
        }
    }
}

/// How often the metrics read what an outbox's table holds.
const OBSERVE_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// Reads what the table holds, and what the relay counted in `counted`, into `metrics`
/// under the outbox's name every [`OBSERVE_EVERY`], until `stop`.
async fn observe(
    source: AppSource,
    metrics: Arc<Metrics>,
    counted: Arc<Metrics>,
    cdc: bool,
    stop: CancellationToken,
) {
    let name = source.name().to_owned();
    let mut failed = 0;
    loop {
        match source.observe().await {
            Ok(seen) => metrics.app_outbox_observed(&name, seen),
            Err(e) => tracing::debug!(error = %e, "cannot read the application outbox's backlog"),
        }
        let now_failed = counted.outbox.failed.get();
        metrics.app_outbox_failed(&name, now_failed.saturating_sub(failed));
        failed = now_failed;
        if cdc {
            let o = &counted.outbox;
            metrics.app_outbox_active(&name, o.cdc_active.get() == 1);
            metrics.app_outbox_slot_lag(
                &name,
                o.cdc_slot_lag_bytes.get(),
                o.cdc_slot_lag_alert.get() == 1,
            );
        }
        tokio::select! {
            () = tokio::time::sleep(OBSERVE_EVERY) => {}
            () = stop.cancelled() => return,
        }
    }
}

/// What `carteiro outbox status` shows of an application outbox.
#[derive(Debug)]
pub struct AppStatus {
    /// Rows still to publish (parked ones included).
    pub pending: i64,
    /// The oldest of them, by `columns.created_at` (`None` without it, or none pending).
    pub oldest_age_ms: Option<i64>,
    /// Rows whose published column is NULL: never read (fix them to `false`).
    pub null_published: i64,
    /// Rows whose publish failed, parked or in backoff.
    pub failures: Vec<AppFailure>,
    /// The relay publishing it now.
    pub leader: Option<String>,
}

impl AppStatus {
    /// How the outbox is relayed, in words.
    pub fn mode_words(&self, config: &AppOutboxConfig) -> &'static str {
        match config.mode {
            RelayMode::Poll => "poll",
            RelayMode::Cdc => "cdc",
        }
    }
}

/// The relay of one application outbox: opened at start, or, when its database did not
/// answer then, opened once it does. Carteiro's own routes and outbox do not wait for it.
pub struct AppRelay {
    start: Start,
    broker: BrokerConfig,
    store: Store,
    metrics: Arc<Metrics>,
    telemetry: Telemetry,
}

enum Start {
    Opened(Opened),
    /// The database did not answer at start.
    Waiting(AppOutboxConfig),
}

impl AppRelay {
    /// The relay of `opened`, or of an outbox whose database did not answer (`Err`),
    /// publishing to `broker`; its bookkeeping goes to `store`.
    pub fn new(
        opened: Result<Opened, AppOutboxConfig>,
        broker: &BrokerConfig,
        store: Store,
        metrics: Arc<Metrics>,
        telemetry: Telemetry,
    ) -> Self {
        Self {
            start: match opened {
                Ok(o) => Start::Opened(o),
                Err(config) => Start::Waiting(config),
            },
            broker: broker.clone(),
            store,
            metrics,
            telemetry,
        }
    }

    /// Runs until `stop` (see [`Running::run`]), opening the outbox first if it waits.
    pub async fn run(self, stop: CancellationToken) -> anyhow::Result<()> {
        let opened = match self.start {
            Start::Opened(o) => o,
            Start::Waiting(config) => match open_waiting(&config, &self.broker, &stop).await {
                Some(o) => o,
                None => return Ok(()),
            },
        };
        opened
            .relay(&self.broker, self.store, self.metrics, self.telemetry)
            .run(stop)
            .await
    }
}

/// Opens `config`'s outbox once its database answers and its table can be relayed, trying
/// again with backoff (up to the broker's reconnect bound) until `stop`.
async fn open_waiting(
    config: &AppOutboxConfig,
    broker: &BrokerConfig,
    stop: &CancellationToken,
) -> Option<Opened> {
    let mut backoff = crate::common::retry::reconnect(broker.reconnect_max_backoff).backoff();
    loop {
        match Opened::open(config).await {
            Ok(opened) => {
                tracing::info!(outbox = %config.name, "the application's database answers; relaying its outbox");
                return Some(opened);
            }
            Err(e) => {
                tracing::warn!(error = %e, "application outbox not relayed yet; trying again")
            }
        }
        tokio::select! {
            () = tokio::time::sleep(backoff.next_delay()) => {}
            () = stop.cancelled() => return None,
        }
    }
}

/// A relay running on an opened outbox.
struct Running {
    settings: Settings,
    source: AppSource,
    cdc: Option<cdc::CdcSettings>,
    leader: Leader,
    store: Store,
    /// Where this outbox's families are exported (`settings.metrics` is the relay's own).
    metrics: Arc<Metrics>,
}

impl Running {
    /// Runs until `stop`; gives the outbox up to a standing-by relay only once its last
    /// confirmed rows are marked.
    pub async fn run(self, stop: CancellationToken) -> anyhow::Result<()> {
        self.source.load_failures().await?;
        let leader_stop = CancellationToken::new();
        let (metrics, name) = (self.metrics.clone(), self.leader.outbox().to_owned());
        let leading = tokio::spawn(self.leader.clone().run(
            self.store.clone(),
            leader_stop.clone(),
            move |active| metrics.app_outbox_active(&name, active),
        ));
        tokio::spawn(observe(
            self.source.clone(),
            self.metrics.clone(),
            self.settings.metrics.clone(),
            self.cdc.is_some(),
            leader_stop.clone(),
        ));
        if let Some(retain) = self.source.retain_published() {
            tokio::spawn(
                self.source
                    .clone()
                    .purge_published(retain, leader_stop.clone()),
            );
        }
        let result = match &self.cdc {
            Some(cdc) => cdc::run(&self.settings, &self.source, cdc, &stop).await,
            None => {
                poll::run(&self.settings, &self.source, &stop).await;
                Ok(())
            }
        };
        leader_stop.cancel();
        let _ = leading.await;
        result
    }
}
