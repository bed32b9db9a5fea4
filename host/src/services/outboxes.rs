//! `[[outboxes]]` at start: each application's table opened and checked, its exchange
//! found, and its relay made (for `carteiro run`, `carteiro relay` and `carteiro check`).

use std::sync::Arc;

use anyhow::Context;

use crate::broker::connect_any;
use crate::config::Config;
use crate::metrics::Metrics;
use crate::relay::{AppOutboxError, AppRelay, OpenedOutbox};
use crate::store::Store;
use crate::telemetry::Telemetry;
use crate::topology::check_exchange;
use lapin::Connection;

use super::broker_settings;

/// Opens and checks every `[[outboxes]]` entry against its table, and (when the broker
/// answers) its exchange. A table that cannot be relayed is an error naming what is wrong.
pub async fn open_outboxes(config: &Config) -> anyhow::Result<Vec<OpenedOutbox>> {
    let mut opened = Vec::with_capacity(config.outboxes.len());
    for outbox in &config.outboxes {
        opened.push(OpenedOutbox::open(outbox).await?);
    }
    Ok(opened)
}

/// Checks that every outbox's exchange exists on `conn`, but those a route of this config
/// declares (its bindings' exchanges are declared when the route starts).
pub async fn check_exchanges(config: &Config, conn: &Connection) -> anyhow::Result<()> {
    let declared: std::collections::HashSet<&str> = config
        .routes
        .iter()
        .flat_map(|r| r.bindings.iter().map(|b| b.exchange.as_str()))
        .collect();
    for outbox in config
        .outboxes
        .iter()
        .filter(|o| !declared.contains(o.exchange.as_str()))
    {
        check_exchange(conn, &outbox.exchange)
            .await
            .with_context(|| {
                format!(
                    "outbox {}: exchange `{}` (declare it first: the relay publishes there and \
                 declares nothing)",
                    outbox.name, outbox.exchange
                )
            })?;
    }
    Ok(())
}

/// The relays of every `[[outboxes]]` entry, checked first: a table that cannot be relayed
/// (a missing column, type or grant) and, if the broker answers now, a missing exchange
/// refuse the start. An application database that does not answer is waited for by its
/// relay, so that one application's outage holds nothing else back.
pub async fn outbox_relays(
    config: &Config,
    store: &Store,
    metrics: &Arc<Metrics>,
    telemetry: &Telemetry,
) -> anyhow::Result<Vec<AppRelay>> {
    if config.outboxes.is_empty() {
        return Ok(Vec::new());
    }
    let mut relays = Vec::with_capacity(config.outboxes.len());
    for outbox in &config.outboxes {
        let opened = match OpenedOutbox::open(outbox).await {
            Ok(opened) => Ok(opened),
            Err(e @ AppOutboxError::Connect { .. }) => {
                tracing::warn!(error = %e, "the outbox's database does not answer; its relay waits for it");
                Err(outbox.clone())
            }
            Err(e) => return Err(e.into()),
        };
        relays.push(AppRelay::new(
            opened,
            &config.broker,
            store.clone(),
            metrics.clone(),
            telemetry.clone(),
        ));
    }
    let settings = broker_settings(config, "carteiro outbox check");
    match connect_any(&settings.urls, &settings.connect).await {
        Ok(conn) => {
            let checked = check_exchanges(config, &conn).await;
            let _ = conn.close(200, "outbox exchanges checked".into()).await;
            checked?;
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot check the outboxes' exchanges now; the relays wait for the broker")
        }
    }
    Ok(relays)
}
