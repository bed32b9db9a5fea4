//! A canary: a new plugin version that takes a share of the deliveries, chosen by a hash of
//! the idempotency key (so a redelivery, a retry copy or a replay meets the same version),
//! and is rolled back automatically when its failure rate — retry, dead-letter and
//! classified failures (trap, timeout, limit) of the handler — exceeds the stable version's
//! by more than the configured threshold over a sliding window, once it handled enough
//! deliveries in it. `carteiro canary promote|abort` end it by hand: promoted, every
//! delivery runs on it; aborted or rolled back, none does. The end is kept in the store
//! (`canary_decisions`): a restart, a reload or another gateway on that store does not
//! start the same canary version again.

use super::canary_decisions::{CanaryDecisions, Phase};
use crate::metrics::Metrics;
use crate::runtime::Plugin;
use crate::runtime::RollbackConfig;
use sha2::{Digest, Sha256};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// A canary that cannot be ended by hand: it already ended (promoted, aborted, or rolled
/// back and asked to be promoted). Holds the phase it is in.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the canary is {}", describe_phase(.0))]
pub struct AlreadyEnded(pub Phase);

/// Slices of the window (counts per slice; old slices drop off).
const SLICES: u32 = 20;

#[derive(Debug, Clone, Copy, Default)]
struct Counts {
    stable: u64,
    stable_failed: u64,
    canary: u64,
    canary_failed: u64,
}

struct State {
    phase: Phase,
    slices: VecDeque<(Instant, Counts)>,
    /// The decisions' generation last looked at: a delivery only looks again when it moved.
    seen: u64,
}

/// One plugin's canary.
pub struct Canary {
    pub plugin: Arc<Plugin>,
    /// The stable version's label (for messages).
    stable_version: String,
    percent: f64,
    rule: RollbackConfig,
    state: Mutex<State>,
    metrics: Arc<Metrics>,
    /// Where this canary's end is kept and learnt from (restarts, reloads, other gateways).
    decisions: Arc<CanaryDecisions>,
}

/// Where `key` falls in 0..100 (stable across processes and restarts).
pub fn bucket(key: &str) -> f64 {
    let digest = Sha256::digest(key.as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    (u64::from_be_bytes(first) % 10_000) as f64 / 100.0
}

impl Canary {
    pub fn new(
        plugin: Arc<Plugin>,
        stable: &Plugin,
        percent: f64,
        rule: RollbackConfig,
        metrics: Arc<Metrics>,
        decisions: Arc<CanaryDecisions>,
    ) -> Self {
        // Read before the lookup: a decision learnt in between is looked at again.
        let seen = decisions.generation();
        let phase = decisions
            .decided(plugin.name(), plugin.digest())
            .unwrap_or(Phase::Active);
        if phase != Phase::Active {
            tracing::warn!(plugin = plugin.name(), canary = plugin.version(), phase = %describe_phase(&phase), "canary already decided in the store; not starting it again");
        }
        metrics.canary_percent(plugin.name(), plugin.version(), share(&phase, percent));
        metrics.canary_started(plugin.name());
        Self {
            plugin,
            stable_version: stable.version().to_owned(),
            percent,
            rule,
            state: Mutex::new(State {
                phase,
                slices: VecDeque::new(),
                seen,
            }),
            metrics,
            decisions,
        }
    }

    /// Takes a decision another gateway (or an earlier run) stored, once: while the canary
    /// runs, or when the store holds another decision than this gateway's own (two gateways
    /// that decided at once; the first written holds for both).
    fn adopt(&self, state: &mut State) {
        let now = self.decisions.generation();
        if state.seen == now {
            return;
        }
        state.seen = now;
        let stored = self
            .decisions
            .decided(self.plugin.name(), self.plugin.digest());
        if let Some(phase) = stored.filter(|p| *p != state.phase) {
            tracing::warn!(plugin = self.plugin.name(), canary = self.plugin.version(), phase = %describe_phase(&phase), "canary decided by another gateway on this store");
            self.metrics.canary_percent(
                self.plugin.name(),
                self.plugin.version(),
                share(&phase, self.percent),
            );
            state.phase = phase;
        }
    }

    fn decide(&self, state: &mut State, phase: Phase) {
        self.decisions
            .record(self.plugin.name(), self.plugin.digest(), &phase);
        state.phase = phase;
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn phase(&self) -> Phase {
        self.state().phase.clone()
    }

    /// Whether the delivery with idempotency key `key` runs on the canary.
    pub fn assign(&self, key: &str) -> bool {
        let mut state = self.state();
        self.adopt(&mut state);
        match state.phase {
            Phase::Active => bucket(key) < self.percent,
            Phase::Promoted => true,
            Phase::RolledBack(_) | Phase::Aborted => false,
        }
    }

    /// Counts one handler outcome; rolls the canary back when the rule says so.
    pub fn record(&self, on_canary: bool, failed: bool) {
        let now = Instant::now();
        let slice = self.rule.window / SLICES;
        let mut state = self.state();
        self.adopt(&mut state);
        if state.phase != Phase::Active {
            return;
        }
        while state
            .slices
            .front()
            .is_some_and(|(at, _)| now.duration_since(*at) > self.rule.window)
        {
            state.slices.pop_front();
        }
        let fresh = state
            .slices
            .back()
            .is_some_and(|(at, _)| now.duration_since(*at) < slice.max(Duration::from_millis(1)));
        if !fresh {
            state.slices.push_back((now, Counts::default()));
        }
        if let Some((_, c)) = state.slices.back_mut() {
            if on_canary {
                c.canary += 1;
                c.canary_failed += u64::from(failed);
            } else {
                c.stable += 1;
                c.stable_failed += u64::from(failed);
            }
        }
        let total = state
            .slices
            .iter()
            .fold(Counts::default(), |mut t, (_, c)| {
                t.stable += c.stable;
                t.stable_failed += c.stable_failed;
                t.canary += c.canary;
                t.canary_failed += c.canary_failed;
                t
            });
        if total.canary < self.rule.min_deliveries.max(1) {
            return;
        }
        let rate = |failed: u64, all: u64| {
            if all == 0 {
                0.0
            } else {
                failed as f64 / all as f64
            }
        };
        let canary_rate = rate(total.canary_failed, total.canary);
        let stable_rate = rate(total.stable_failed, total.stable);
        if canary_rate - stable_rate > self.rule.failure_rate {
            let why = format!(
                "failure rate {:.1}% ({} of {}) against the stable version {}'s {:.1}% ({} of {}) over {:?}, above the allowed {:.1} points",
                canary_rate * 100.0,
                total.canary_failed,
                total.canary,
                self.stable_version,
                stable_rate * 100.0,
                total.stable_failed,
                total.stable,
                self.rule.window,
                self.rule.failure_rate * 100.0
            );
            tracing::error!(plugin = self.plugin.name(), canary = self.plugin.version(), reason = %why, "canary rolled back: every delivery runs on the stable version again");
            self.decide(&mut state, Phase::RolledBack(why));
            self.metrics.canary_rollback(self.plugin.name());
            self.metrics
                .canary_percent(self.plugin.name(), self.plugin.version(), 0.0);
        }
    }

    /// Ends the canary by hand: `promote` sends every delivery to it, else none.
    pub fn finish(&self, promote: bool) -> Result<(), AlreadyEnded> {
        let mut state = self.state();
        match (&state.phase, promote) {
            (Phase::Active, _) | (Phase::RolledBack(_), false) => {
                let phase = if promote {
                    Phase::Promoted
                } else {
                    Phase::Aborted
                };
                self.decide(&mut state, phase);
                let percent = if promote { 100.0 } else { 0.0 };
                self.metrics
                    .canary_percent(self.plugin.name(), self.plugin.version(), percent);
                tracing::warn!(
                    plugin = self.plugin.name(),
                    canary = self.plugin.version(),
                    promote,
                    "canary finished by hand"
                );
                Ok(())
            }
            (phase, _) => Err(AlreadyEnded(phase.clone())),
        }
    }

    /// One line for `/readyz`.
    pub fn describe(&self) -> String {
        format!(
            "canary version {} ({}% of deliveries): {}",
            self.plugin.version(),
            self.percent,
            describe_phase(&self.phase())
        )
    }
}

/// The share of deliveries a canary in `phase` takes.
fn share(phase: &Phase, percent: f64) -> f64 {
    match phase {
        Phase::Active => percent,
        Phase::Promoted => 100.0,
        Phase::RolledBack(_) | Phase::Aborted => 0.0,
    }
}

fn describe_phase(phase: &Phase) -> String {
    match phase {
        Phase::Active => "active".to_owned(),
        Phase::RolledBack(why) => format!("ROLLED BACK: {why}"),
        Phase::Promoted => {
            "promoted by hand: every delivery runs on it (point the plugin's `path` at it to keep it after a restart or reload)"
                .to_owned()
        }
        Phase::Aborted => "aborted by hand: every delivery runs on the stable version".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_stable_and_spread() {
        assert_eq!(bucket("order-17"), bucket("order-17"));
        let under_ten = (0..10_000)
            .filter(|i| bucket(&format!("k-{i}")) < 10.0)
            .count();
        assert!((800..1200).contains(&under_ten), "{under_ten}");
    }
}
