//! The CDC relay (`[relay] mode = "cdc"`, PostgreSQL only): reads committed outbox inserts
//! from a logical replication slot (`pgoutput`, a publication on `outbox`) instead of
//! polling the table, publishes each row with a confirm exactly as the polling relay would
//! (same message, same `message_id`), and tells the slot a commit is done only once every
//! row of it and of every earlier commit is confirmed *and* marked published.
//!
//! One relay reads the slot at a time; the others get "replication slot ... is active"
//! and stand by, retrying every few seconds (`carteiro_relay_cdc_active` 0/1). A reader
//! publishes only while its fence shows the slot is still read through its own connection
//! (`fence`), and a new reader waits out the old one's last permission before it publishes.
//!
//! At each start, before reading the slot, the relay drains through the polling path the
//! unpublished rows already in the table (the backlog from before the slot existed, or rows
//! a crashed relay left unmarked), then notes the WAL position: rows of commits up to it
//! that the slot sends again are published only if still unpublished in the table. So after
//! a crash a row goes out again only if it was confirmed but not yet marked (the window).
//!
//! Any [`SlotSource`] is read this way; Carteiro's own outbox is one.
//!
//! # Layout
//! - this file: the standby/active loop, the backlog hand-over, the slot-lag watch.
//! - `session`: one replication session: commits → per-key chains → confirms → marks → slot
//!   (the chains, publishing and marks are the polling relay's, `relay::publish`).
//! - `fence`: who reads the slot now, asked before each publish.
//! - `pgoutput`, `window`, `slot`, `conn`: decoding, the commit-LSN window, slot setup and
//!   lag, the replication connection's settings.

mod conn;
mod fence;
mod pgoutput;
mod session;
mod slot;
mod window;

use std::time::{Duration, Instant};

use pgwire_replication::{PgWireError, ReplicationClient};
use tokio_util::sync::CancellationToken;

use super::source::SlotSource;
use super::{Settings, poll, sleep_or_stop};
use crate::common::alert::Change;
use crate::common::retry;

pub(super) use conn::{ReplicationUrlError, replication_config};
pub(super) use pgoutput::{DecodeError, Relation, bytea, outbox_row};

/// How often a standing-by relay tries to take the slot.
const STANDBY_RETRY: Duration = Duration::from_secs(3);
/// How often the slot's lag is read.
const LAG_EVERY: Duration = Duration::from_secs(10);
/// A raised lag alert is logged again this often.
const LAG_REMIND: Duration = Duration::from_secs(300);

/// The CDC settings of a relay (`[relay]`).
#[derive(Debug, Clone)]
pub(super) struct CdcSettings {
    pub slot: String,
    pub publication: String,
    pub max_slot_lag: u64,
}

/// Why a replication session could not start.
enum Opened {
    /// The slot is this session's, read through the backend process `reader`.
    Active {
        client: ReplicationClient,
        reader: i32,
    },
    /// Another relay holds the slot.
    Standby,
    Failed(PgWireError),
}

/// Runs the CDC relay on `source` until `stop`.
pub(super) async fn run<S: SlotSource>(
    relay: &Settings,
    source: &S,
    cdc: &CdcSettings,
    stop: &CancellationToken,
) -> anyhow::Result<()> {
    // pgwire-replication's TLS installs ring as the process default if none is set.
    crate::common::use_aws_lc_rs();
    let settings = source.replication(&cdc.slot, &cdc.publication)?;
    let lag = tokio::spawn(watch_lag(
        source.clone(),
        cdc.clone(),
        relay.metrics.clone(),
        stop.clone(),
    ));
    let mut backoff = retry::reconnect(relay.reconnect_max).backoff();
    let mut standing_by = false;
    let result = loop {
        if stop.is_cancelled() {
            break Ok(());
        }
        if let Err(e) = slot::ensure(source, &cdc.slot, &cdc.publication).await {
            if e.is_permanent() {
                tracing::error!(error = %e, "CDC relay cannot start");
                break Err(e.into());
            }
            tracing::warn!(error = %e, "CDC relay cannot set up its slot; retrying");
            sleep_or_stop(backoff.next_delay(), stop).await;
            continue;
        }
        let publisher = match relay.open_publisher().await {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(error = %e, "CDC relay cannot reach the broker; the slot keeps the rows");
                sleep_or_stop(backoff.next_delay(), stop).await;
                continue;
            }
        };
        let (client, reader) = match open(settings.clone()).await {
            Opened::Active { client, reader } => (client, reader),
            Opened::Standby => {
                if !standing_by {
                    tracing::info!(slot = %cdc.slot, "another relay reads the replication slot; standing by");
                    standing_by = true;
                }
                relay.metrics.outbox.cdc_active.set(0);
                sleep_or_stop(STANDBY_RETRY, stop).await;
                continue;
            }
            Opened::Failed(e) => {
                tracing::warn!(error = %e, slot = %cdc.slot, "CDC relay cannot open the replication slot; retrying");
                sleep_or_stop(backoff.next_delay(), stop).await;
                continue;
            }
        };
        standing_by = false;
        relay.metrics.outbox.cdc_active.set(1);
        tracing::info!(slot = %cdc.slot, "CDC relay active: reading the replication slot");
        let session_stop = stop.child_token();
        let fence = fence::watch(
            source.clone(),
            cdc.slot.clone(),
            reader,
            session_stop.clone(),
        );
        // The slot is ours: once the previous reader's last permission ran out, no other
        // relay publishes while the backlog drains.
        fence::grace(stop).await;
        if let Err(e) = drain_backlog(relay, source, stop).await {
            session_stop.cancel();
            tracing::warn!(error = %e, "CDC relay could not drain the outbox backlog; retrying");
            relay.metrics.outbox.cdc_active.set(0);
            drop(client);
            sleep_or_stop(backoff.next_delay(), stop).await;
            continue;
        }
        let recheck_until = match source.wal_position().await {
            Ok(lsn) => lsn,
            Err(e) => {
                session_stop.cancel();
                tracing::warn!(error = %e, "CDC relay cannot read the WAL position; retrying");
                relay.metrics.outbox.cdc_active.set(0);
                drop(client);
                sleep_or_stop(backoff.next_delay(), stop).await;
                continue;
            }
        };
        backoff.reset();
        let end = session::Session::new(relay, source, publisher, client, fence, recheck_until)
            .run(stop)
            .await;
        session_stop.cancel();
        relay.metrics.outbox.cdc_active.set(0);
        match end {
            session::End::Stopped => break Ok(()),
            session::End::Broker(e) => {
                tracing::warn!(error = %e, "CDC relay lost the broker; the slot resends what was not confirmed");
                relay.metrics.broker_reconnect("relay");
            }
            session::End::Stream(e) => {
                tracing::warn!(error = %e, "CDC relay lost the replication stream; reopening");
            }
            session::End::Store(e) => {
                tracing::warn!(error = %e, "CDC relay cannot reach the store; retrying");
            }
            session::End::Fenced(e) => {
                tracing::warn!(error = %e, "CDC relay stopped publishing; it stands by");
            }
        }
        sleep_or_stop(backoff.next_delay(), stop).await;
    };
    lag.abort();
    result
}

/// Starts replication on the slot and waits until the server accepted it (the slot is then
/// this session's alone). The backend's process id, asked first on the same connection, is
/// what `pg_replication_slots.active_pid` names while the slot is this session's.
async fn open(settings: pgwire_replication::ReplicationConfig) -> Opened {
    let mut client = match ReplicationClient::connect_gated(settings).await {
        Ok(c) => c,
        Err(e) => return Opened::Failed(e),
    };
    let reader = match backend_pid(&mut client).await {
        Ok(pid) => pid,
        Err(e) => return Opened::Failed(e),
    };
    if let Err(e) = client.start().await {
        return Opened::Failed(e);
    }
    match tokio::time::timeout(Duration::from_secs(30), client.wait_started()).await {
        Ok(Ok(())) => Opened::Active { client, reader },
        Ok(Err(e)) if slot_in_use(&e) => Opened::Standby,
        Ok(Err(e)) => Opened::Failed(e),
        Err(_) => Opened::Failed(PgWireError::Task(
            "START_REPLICATION not answered within 30s".into(),
        )),
    }
}

/// The process id of the replication connection's backend.
async fn backend_pid(client: &mut ReplicationClient) -> Result<i32, PgWireError> {
    let rows = client.simple_query("SELECT pg_backend_pid()").await?;
    rows.first()
        .and_then(|row| row.first().cloned().flatten())
        .and_then(|text| std::str::from_utf8(&text).ok()?.parse().ok())
        .ok_or_else(|| PgWireError::Protocol("pg_backend_pid() gave no number".into()))
}

/// "replication slot ... is active for PID ..." (SQLSTATE 55006, object_in_use).
fn slot_in_use(e: &PgWireError) -> bool {
    matches!(e, PgWireError::Server(text) if text.contains("55006") || text.contains("is active"))
}

/// Publishes, through the polling path, the unpublished rows already in the table (not
/// parked), then returns. Rows that keep failing hold it here, as they would hold their
/// keys in the polling relay; each failure is logged by that path.
async fn drain_backlog<S: SlotSource>(
    relay: &Settings,
    source: &S,
    stop: &CancellationToken,
) -> Result<(), crate::store::StoreError> {
    let up_to = source.last_id().await?;
    let waiting = source.pending_up_to(up_to).await?;
    if waiting == 0 {
        return Ok(());
    }
    tracing::info!(
        rows = waiting,
        up_to,
        "CDC relay publishing the outbox backlog through the polling path first"
    );
    let poll_stop = stop.child_token();
    let poll = poll::run(relay, source, &poll_stop);
    tokio::pin!(poll);
    let started = Instant::now();
    let mut poll_ended = false;
    let result = loop {
        tokio::select! {
            _ = &mut poll => {
                poll_ended = true;
                break Ok(());
            }
            () = tokio::time::sleep(Duration::from_millis(250)) => {}
        }
        match source.pending_up_to(up_to).await {
            Ok(0) => break Ok(()),
            Ok(_) => {}
            Err(e) => break Err(e),
        }
    };
    poll_stop.cancel();
    // The poller marks what was confirmed and gives its leases back before it returns.
    if !poll_ended {
        let _ = poll.await;
    }
    tracing::info!(elapsed = ?started.elapsed(), "outbox backlog drained; reading the slot");
    result
}

/// Reads the slot's retained WAL every [`LAG_EVERY`] into the metrics, and raises the
/// `max_slot_lag` alert (an ERROR log, `carteiro_relay_cdc_slot_lag_alert`) above it.
async fn watch_lag<S: SlotSource>(
    source: S,
    cdc: CdcSettings,
    metrics: std::sync::Arc<crate::metrics::Metrics>,
    stop: CancellationToken,
) {
    let mut alert = slot::LagAlert::default();
    while !stop.is_cancelled() {
        match source.slot_lag(&cdc.slot).await {
            Ok(Some(bytes)) => {
                let bytes = u64::try_from(bytes).unwrap_or(0);
                metrics
                    .outbox
                    .cdc_slot_lag_bytes
                    .set(i64::try_from(bytes).unwrap_or(i64::MAX));
                let shown = |b: u64| format!("{:.1} MiB", b as f64 / (1 << 20) as f64);
                match alert.observe(bytes, cdc.max_slot_lag, Instant::now(), LAG_REMIND) {
                    Some(Change::Raised | Change::Reminder) => tracing::error!(
                        slot = %cdc.slot,
                        retained = %shown(bytes),
                        max_slot_lag = %shown(cdc.max_slot_lag),
                        "the outbox replication slot holds back more WAL than [relay] max_slot_lag: \
                         no relay is confirming (broker down, relay stopped or failing). PostgreSQL \
                         keeps this WAL until the slot advances; bound it with max_slot_wal_keep_size"
                    ),
                    Some(Change::Cleared) => {
                        tracing::warn!(slot = %cdc.slot, retained = %shown(bytes), "replication slot lag back under [relay] max_slot_lag")
                    }
                    None => {}
                }
                metrics
                    .outbox
                    .cdc_slot_lag_alert
                    .set(i64::from(alert.is_raised()));
            }
            Ok(None) => {}
            Err(e) => tracing::debug!(error = %e, "cannot read the replication slot's lag"),
        }
        sleep_or_stop(LAG_EVERY, &stop).await;
    }
}
