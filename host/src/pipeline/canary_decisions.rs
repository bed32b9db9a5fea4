//! How canaries ended, kept in the store so a rollback (or a promote, an abort) holds
//! across restarts and reloads and for every gateway on that store: keyed by the plugin and
//! the canary component's digest, so only a new canary version starts afresh.

use crate::common::retry;
use crate::store::{CanaryDecision, Store, StoreError};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How often the decisions of other gateways are read.
pub const REFRESH: Duration = Duration::from_secs(5);
/// How long a decision is retried when the store refuses it (it holds in memory meanwhile).
const WRITE_FOR: Duration = Duration::from_secs(600);

/// Where a canary stands. Here rather than in `canary`, which imports this module: a decision
/// is the phase a canary ended in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Phase {
    Active,
    RolledBack(String),
    Promoted,
    Aborted,
}

/// The decisions known to this gateway: read at start, refreshed, and written through.
pub struct CanaryDecisions {
    store: Store,
    known: Mutex<HashMap<(String, String), Phase>>,
    /// Moves whenever `known` gains a decision, so a canary looks it up only then (not on
    /// every delivery).
    generation: AtomicU64,
}

fn phase_of(d: &CanaryDecision) -> Phase {
    match d.decision.as_str() {
        "promoted" => Phase::Promoted,
        "aborted" => Phase::Aborted,
        _ => Phase::RolledBack(d.reason.clone()),
    }
}

impl CanaryDecisions {
    /// Reads every decision recorded in `store`.
    pub async fn load(store: Store) -> Result<Arc<Self>, StoreError> {
        let this = Arc::new(Self {
            store,
            known: Mutex::default(),
            generation: AtomicU64::new(0),
        });
        this.refresh().await?;
        Ok(this)
    }

    fn known(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), Phase>> {
        self.known.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Moves when a decision is learnt.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// How the canary `digest` of `plugin` ended, if it did.
    pub fn decided(&self, plugin: &str, digest: &str) -> Option<Phase> {
        self.known()
            .get(&(plugin.to_owned(), digest.to_owned()))
            .cloned()
    }

    /// Reads the store's decisions again (another gateway may have decided). The store keeps
    /// the first decision written for a canary, and it wins here: a gateway that decided
    /// otherwise at the same moment (its write then changed nothing) takes the stored one, so
    /// every gateway on the store agrees within [`REFRESH`].
    pub async fn refresh(&self) -> Result<(), StoreError> {
        let rows = self.store.canary_decisions().await?;
        let mut known = self.known();
        let mut learnt = false;
        for d in rows {
            let phase = phase_of(&d);
            let key = (d.plugin.clone(), d.canary_digest.clone());
            if known.get(&key) != Some(&phase) {
                known.insert(key, phase);
                learnt = true;
            }
        }
        if learnt {
            self.generation.fetch_add(1, Ordering::Release);
        }
        Ok(())
    }

    /// Records this gateway's decision: at once in memory, and in the store in the
    /// background (retried while the store refuses writes).
    pub fn record(self: &Arc<Self>, plugin: &str, digest: &str, phase: &Phase) {
        let (decision, reason) = match phase {
            Phase::Active => return,
            Phase::RolledBack(why) => ("rolled-back", why.clone()),
            Phase::Promoted => ("promoted", String::new()),
            Phase::Aborted => ("aborted", String::new()),
        };
        self.known()
            .entry((plugin.to_owned(), digest.to_owned()))
            .or_insert_with(|| phase.clone());
        self.generation.fetch_add(1, Ordering::Release);
        let row = CanaryDecision {
            plugin: plugin.to_owned(),
            canary_digest: digest.to_owned(),
            decision: decision.to_owned(),
            reason,
        };
        let store = self.store.clone();
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        runtime.spawn(async move {
            let until = tokio::time::Instant::now() + WRITE_FOR;
            let mut backoff = retry::STORE_PATIENT.backoff();
            loop {
                match store.canary_decide(&row).await {
                    Ok(()) => return,
                    Err(e) if tokio::time::Instant::now() < until => {
                        tracing::warn!(plugin = %row.plugin, error = %e, "canary decision not stored yet; retrying (it holds in this gateway meanwhile)");
                        tokio::time::sleep(backoff.next_delay()).await;
                    }
                    Err(e) => {
                        tracing::error!(plugin = %row.plugin, error = %e, "canary decision could not be stored: it holds in this gateway only, until a restart");
                        return;
                    }
                }
            }
        });
    }

    /// Refreshes every [`REFRESH`] until `stop`.
    pub async fn run(self: Arc<Self>, stop: CancellationToken) {
        let mut tick = tokio::time::interval(REFRESH);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                () = stop.cancelled() => return,
            }
            if let Err(e) = self.refresh().await {
                tracing::debug!(error = %e, "could not read canary decisions; trying again");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::store::tests::TestDb;

    /// Waits (bounded) until the store holds a decision for `digest`.
    async fn stored(store: &Store, digest: &str) {
        for _ in 0..100 {
            let rows = store.canary_decisions().await.unwrap();
            if rows.iter().any(|d| d.canary_digest == digest) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("the decision for {digest} was never stored");
    }

    /// Two gateways on one store decide one canary differently at the same moment: the
    /// first decision written holds, and the other gateway takes it at its next refresh
    /// (before, it kept its own until a restart).
    async fn gateways_that_decided_differently_agree_after_a_refresh(db: TestDb) {
        let a = CanaryDecisions::load(db.store.clone()).await.unwrap();
        let b = CanaryDecisions::load(db.store.clone()).await.unwrap();
        a.record("p", "d1", &Phase::RolledBack("5 of 20 failed".into()));
        stored(&db.store, "d1").await;
        b.record("p", "d1", &Phase::Promoted);
        let before = b.generation();
        b.refresh().await.unwrap();
        assert_eq!(
            b.decided("p", "d1"),
            Some(Phase::RolledBack("5 of 20 failed".into()))
        );
        assert!(b.generation() > before, "a canary looks again");
        a.refresh().await.unwrap();
        assert_eq!(a.decided("p", "d1"), b.decided("p", "d1"));
        db.finish().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn gateways_that_decided_differently_agree_after_a_refresh_sqlite() {
        gateways_that_decided_differently_agree_after_a_refresh(TestDb::sqlite().await).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn gateways_that_decided_differently_agree_after_a_refresh_postgres() {
        gateways_that_decided_differently_agree_after_a_refresh(TestDb::postgres().await).await;
    }
}
