//! Circuit breaker on the store: after a store failure, deliveries wait here (holding their
//! prefetch slots, which pauses consumption) until a probe finds the store taking writes
//! again (`Store::probe_write`: a committed write, not a read).

use crate::common::retry;
use crate::metrics::Metrics;
use crate::store::Store;
use std::sync::Arc;
use tokio::sync::watch;

/// Shared by every route of a gateway.
#[derive(Clone)]
pub struct StoreGate {
    store: Store,
    healthy: Arc<watch::Sender<bool>>,
    metrics: Arc<Metrics>,
}

impl StoreGate {
    pub fn new(store: Store, metrics: Arc<Metrics>) -> Self {
        metrics.store.available.set(1);
        Self {
            store,
            healthy: Arc::new(watch::channel(true).0),
            metrics,
        }
    }

    /// True while the store is believed reachable.
    pub fn is_healthy(&self) -> bool {
        *self.healthy.borrow()
    }

    /// Waits until the store is healthy.
    pub async fn wait_healthy(&self) {
        let mut rx = self.healthy.subscribe();
        // An error means the sender is gone, which cannot happen while `self` lives.
        let _ = rx.wait_for(|healthy| *healthy).await;
    }

    /// Opens the breaker and starts one probe that closes it when the store answers.
    pub fn report_failure(&self, error: &str) {
        let opened = self
            .healthy
            .send_if_modified(|healthy| std::mem::replace(healthy, false));
        if !opened {
            return;
        }
        self.metrics.store.available.set(0);
        self.metrics.store.outages.inc();
        tracing::error!(
            error,
            "store unavailable: pausing consumption until it answers"
        );
        let store = self.store.clone();
        let healthy = self.healthy.clone();
        let metrics = self.metrics.clone();
        tokio::spawn(async move {
            let mut backoff = retry::STORE_OUTAGE.backoff();
            loop {
                tokio::time::sleep(backoff.next_delay()).await;
                match store.probe_write().await {
                    Ok(()) => {
                        tracing::info!("store takes writes again: resuming consumption");
                        healthy.send_replace(true);
                        metrics.store.available.set(1);
                        return;
                    }
                    Err(e) => tracing::warn!(error = %e, "store still unavailable"),
                }
            }
        });
    }
}
