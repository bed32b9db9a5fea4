//! One relay publishes an application outbox at a time: it holds a lease in Carteiro's
//! store, renewed a few times per `takeover`; the others stand by and take over once it
//! runs out. A relay claims rows only while its lease runs, with a margin: a row it claimed
//! starts out before another relay can take the outbox over (docs/outboxes.md).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::store::Store;

/// How much of the lease is kept back from claiming.
const MARGIN_SHARE: u32 = 3;

/// Whether this relay leads its outbox (cheap to clone).
#[derive(Clone)]
pub struct Leader {
    outbox: String,
    owner: String,
    takeover: Duration,
    until: Arc<Mutex<Option<Instant>>>,
    /// `false`: something else picks the one relay (the replication slot); always held.
    gated: bool,
}

impl Leader {
    pub fn new(outbox: &str, takeover: Duration, gated: bool) -> Self {
        Self {
            outbox: outbox.to_owned(),
            owner: format!(
                "relay-{}-{}",
                std::process::id(),
                uuid::Uuid::now_v7().simple()
            ),
            takeover,
            until: Arc::default(),
            gated,
        }
    }

    /// How long before its lease runs out a relay stops claiming.
    pub fn margin(takeover: Duration) -> Duration {
        takeover / MARGIN_SHARE
    }

    /// The outbox it leads.
    pub fn outbox(&self) -> &str {
        &self.outbox
    }

    /// May this relay claim rows now?
    pub fn holds(&self) -> bool {
        !self.gated
            || self
                .until
                .lock()
                .map(|u| u.is_some_and(|until| Instant::now() < until))
                .unwrap_or(false)
    }

    /// Renews (or takes) the lease until `stop`, then gives it up. `active` hears each change
    /// between leading and standing by.
    pub async fn run(self, store: Store, stop: CancellationToken, active: impl Fn(bool)) {
        if !self.gated {
            return;
        }
        let every = self.takeover / 4;
        let lease_ms = i64::try_from(self.takeover.as_millis()).unwrap_or(i64::MAX);
        let margin = Self::margin(self.takeover);
        let mut was = None;
        loop {
            let asked = Instant::now();
            let leads = match store
                .app_outbox_lead(&self.outbox, &self.owner, lease_ms)
                .await
            {
                Ok(leads) => leads,
                Err(e) => {
                    tracing::warn!(outbox = %self.outbox, error = %e, "cannot renew the outbox's relay lease; claiming nothing until it is renewed");
                    false
                }
            };
            // Counted from before the statement: the store's lease ends later than this.
            let until = leads.then(|| asked + self.takeover - margin);
            if let Ok(mut held) = self.until.lock() {
                *held = until;
            }
            if was != Some(leads) {
                if leads {
                    tracing::info!(outbox = %self.outbox, "relaying the application outbox (active)");
                } else {
                    tracing::info!(outbox = %self.outbox, "another relay publishes this outbox; standing by");
                }
                active(leads);
                was = Some(leads);
            }
            tokio::select! {
                () = tokio::time::sleep(every) => {}
                () = stop.cancelled() => break,
            }
        }
        if let Ok(mut held) = self.until.lock() {
            *held = None;
        }
        if let Err(e) = store.app_outbox_step_down(&self.outbox, &self.owner).await {
            tracing::debug!(error = %e, "could not give the outbox's relay lease back; it runs out");
        }
    }
}
