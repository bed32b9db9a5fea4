//! Dead-letter alerts. A route with `dead_letter_alert = { count, window }` is watched: when
//! its archived dead letters within the last `window` reach `count`, the gateway logs one
//! ERROR (route, count, top reasons), sets `carteiro_dead_letter_alert_active{route}` to 1
//! and notes it in `/readyz` and on the console. While it stays raised, one more ERROR per
//! window; when the window's count falls under the threshold, it clears (one WARN).
//!
//! Counts come from the store's archive, so they cover what every gateway on the store
//! dead-lettered, and the broker's own dead letters (TTL, overflow) too. Each gateway logs
//! its own alert.

use crate::common::alert::{Change, LoggedAlert};
use crate::common::now_ms;
use crate::foreign_dlq::DeadLetterQueueConfig;
use crate::metrics::Metrics;
use crate::pipeline::{DeadLetterAlertConfig, RouteConfig};
use crate::store::{DeadLetterFilter, Store, StoreError};
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Reasons named in an alert.
const TOP_REASONS: usize = 3;

/// A raised alert, as `/readyz` and the console show it.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct ActiveAlert {
    pub route: String,
    /// Dead letters in the window at the last check.
    pub count: u64,
    pub threshold: u64,
    pub window_secs: u64,
    /// Raised at (ms since the Unix epoch).
    pub since_ms: i64,
    /// The most frequent reasons in the window, with their counts.
    pub top_reasons: Vec<(String, u64)>,
}

impl ActiveAlert {
    /// One line: what crossed, and the reasons.
    pub fn describe(&self) -> String {
        let reasons: Vec<String> = self
            .top_reasons
            .iter()
            .map(|(reason, n)| format!("{n}× \"{}\"", shorten(reason, 120)))
            .collect();
        format!(
            "route `{}`: {} dead letters in the last {} (threshold {}); top reasons: {}",
            self.route,
            self.count,
            humantime::format_duration(Duration::from_secs(self.window_secs)),
            self.threshold,
            if reasons.is_empty() {
                "none recorded".to_owned()
            } else {
                reasons.join(", ")
            }
        )
    }
}

/// One route's alert over (count, ms since the epoch) observations, reminded every window.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AlertState(LoggedAlert);

impl AlertState {
    pub fn is_raised(&self) -> bool {
        self.0.is_raised()
    }

    /// Raised at (ms since the epoch), while it is.
    fn raised_at_ms(&self) -> Option<i64> {
        let raised_at = self.0.raised_at()?;
        Some(i64::try_from(raised_at.as_millis()).unwrap_or(i64::MAX))
    }

    /// Feeds the count of dead letters in the window at `now_ms`.
    pub fn observe(
        &mut self,
        count: u64,
        rule: &DeadLetterAlertConfig,
        now_ms: i64,
    ) -> Option<Change> {
        // In whole ms, as the times are.
        let window_ms = u64::try_from(rule.window.as_millis()).unwrap_or(u64::MAX);
        let now = Duration::from_millis(u64::try_from(now_ms).unwrap_or(0));
        self.0
            .observe(count >= rule.count, now, Duration::from_millis(window_ms))
    }
}

struct Watched {
    rule: DeadLetterAlertConfig,
    state: AlertState,
    last: Option<ActiveAlert>,
}

/// Every route's alert; shared by the alerts task, `/readyz` and the console.
pub struct DeadLetterAlerts {
    metrics: Arc<Metrics>,
    routes: Mutex<BTreeMap<String, Watched>>,
}

impl DeadLetterAlerts {
    pub fn new(metrics: Arc<Metrics>) -> Self {
        Self {
            metrics,
            routes: Mutex::new(BTreeMap::new()),
        }
    }

    /// Takes the rules of the routes and of the foreign dead-letter queues (at start and after
    /// each applied reload). A route whose rule is unchanged keeps its state; a route without
    /// a rule any more drops its alert.
    pub fn set_rules(&self, routes: &[RouteConfig], queues: &[DeadLetterQueueConfig]) {
        let mut watched = self.routes.lock().unwrap_or_else(PoisonError::into_inner);
        let wanted: BTreeMap<&str, DeadLetterAlertConfig> = routes
            .iter()
            .filter_map(|r| r.dead_letter_alert.map(|a| (r.queue.as_str(), a)))
            .chain(
                queues
                    .iter()
                    .filter_map(|q| q.alert.map(|a| (q.route_name(), a))),
            )
            .collect();
        watched.retain(|route, w| {
            let keep = wanted.get(route.as_str()) == Some(&w.rule);
            if !keep {
                self.metrics.set_alert_active(route, false);
            }
            keep
        });
        for (route, rule) in wanted {
            watched.entry(route.to_owned()).or_insert_with(|| {
                self.metrics.set_alert_active(route, false);
                Watched {
                    rule,
                    state: AlertState::default(),
                    last: None,
                }
            });
        }
    }

    /// The raised alerts.
    pub fn active(&self) -> Vec<ActiveAlert> {
        let watched = self.routes.lock().unwrap_or_else(PoisonError::into_inner);
        watched.values().filter_map(|w| w.last.clone()).collect()
    }

    fn rules(&self) -> Vec<(String, DeadLetterAlertConfig)> {
        let watched = self.routes.lock().unwrap_or_else(PoisonError::into_inner);
        watched.iter().map(|(r, w)| (r.clone(), w.rule)).collect()
    }

    /// How often to look: a twentieth of the shortest window, between 250 ms and 10 s.
    fn tick(&self) -> Duration {
        let shortest = self
            .rules()
            .iter()
            .map(|(_, rule)| rule.window)
            .min()
            .unwrap_or(Duration::from_secs(10));
        (shortest / 20).clamp(Duration::from_millis(250), Duration::from_secs(10))
    }

    /// Feeds one route's observation; logs and sets the gauge on a change.
    fn observe(&self, route: &str, count: u64, top_reasons: Vec<(String, u64)>, now: i64) {
        let mut watched = self.routes.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(w) = watched.get_mut(route) else {
            return;
        };
        let change = w.state.observe(count, &w.rule, now);
        if w.state.is_raised() {
            let alert = ActiveAlert {
                route: route.to_owned(),
                count,
                threshold: w.rule.count,
                window_secs: w.rule.window.as_secs(),
                since_ms: w.state.raised_at_ms().unwrap_or(now),
                top_reasons,
            };
            let message = match change {
                Some(Change::Raised) => Some(format!(
                    "dead-letter alert: {}. Look with `carteiro dlq stats --route {route}` or the console; replay with `carteiro dlq replay --route {route} --reason ...` once fixed",
                    alert.describe()
                )),
                Some(Change::Reminder) => Some(format!(
                    "dead-letter alert still raised: {}",
                    alert.describe()
                )),
                _ => None,
            };
            if let Some(message) = message {
                tracing::error!(route, count, threshold = w.rule.count, "{message}");
            }
            w.last = Some(alert);
            self.metrics.set_alert_active(route, true);
        } else {
            if change == Some(Change::Cleared) {
                tracing::warn!(
                    route,
                    count,
                    threshold = w.rule.count,
                    "dead-letter alert cleared: {count} dead letters in the window, under the threshold"
                );
            }
            w.last = None;
            self.metrics.set_alert_active(route, false);
        }
    }

    /// One look at every watched route.
    async fn check(&self, store: &Store) -> Result<(), ArchiveUnreadable> {
        for (route, rule) in self.rules() {
            let now = now_ms();
            let window_ms = i64::try_from(rule.window.as_millis()).unwrap_or(i64::MAX);
            let filter = DeadLetterFilter {
                route: Some(route.clone()),
                since_ms: Some(now.saturating_sub(window_ms)),
                ..Default::default()
            };
            let groups =
                store
                    .dead_letter_groups(&filter)
                    .await
                    .map_err(|source| ArchiveUnreadable {
                        route: route.clone(),
                        source,
                    })?;
            let count = groups.iter().map(|g| g.count.max(0) as u64).sum();
            let top = groups
                .into_iter()
                .take(TOP_REASONS)
                .map(|g| (g.reason, g.count.max(0) as u64))
                .collect();
            self.observe(&route, count, top, now);
        }
        Ok(())
    }
}

/// The store did not answer a route's look at its dead letters (a transient failure: the
/// next tick tries again).
#[derive(Debug, thiserror::Error)]
#[error("route `{route}`: {source}")]
struct ArchiveUnreadable {
    route: String,
    source: StoreError,
}

/// Watches the routes' dead letters until `stop`. A store that does not answer is logged
/// once per outage; alerts keep their last state meanwhile.
pub async fn run(
    alerts: Arc<DeadLetterAlerts>,
    store: Store,
    stop: CancellationToken,
) -> anyhow::Result<()> {
    let mut failing = false;
    while !stop.is_cancelled() {
        match alerts.check(&store).await {
            Ok(()) => failing = false,
            Err(e) if !failing => {
                failing = true;
                tracing::warn!(error = %e, "dead-letter alerts cannot read the archive; alerts keep their state until it answers");
            }
            Err(_) => {}
        }
        tokio::select! {
            _ = tokio::time::sleep(alerts.tick()) => {}
            _ = stop.cancelled() => {}
        }
    }
    Ok(())
}

fn shorten(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_owned();
    }
    let cut: String = text.chars().take(max).collect();
    format!("{cut}…")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule() -> DeadLetterAlertConfig {
        DeadLetterAlertConfig {
            count: 10,
            window: Duration::from_secs(3600),
        }
    }

    const HOUR: i64 = 3_600_000;

    #[test]
    fn one_error_per_window_while_raised_then_it_clears() {
        let mut state = AlertState::default();
        assert_eq!(state.observe(9, &rule(), 0), None);
        assert_eq!(state.observe(10, &rule(), 1_000), Some(Change::Raised));
        // Still over the threshold within the window: nothing more to log.
        for t in [2_000, HOUR / 2, HOUR] {
            assert_eq!(state.observe(25, &rule(), t), None, "at {t}");
        }
        assert_eq!(
            state.observe(12, &rule(), HOUR + 1_000),
            Some(Change::Reminder)
        );
        assert_eq!(state.observe(12, &rule(), HOUR + 2_000), None);
        assert_eq!(
            state.observe(9, &rule(), HOUR + 3_000),
            Some(Change::Cleared)
        );
        assert!(!state.is_raised());
        assert_eq!(state.observe(3, &rule(), HOUR + 4_000), None);
        assert_eq!(
            state.observe(10, &rule(), HOUR + 5_000),
            Some(Change::Raised)
        );
    }

    fn route(queue: &str, alert: Option<DeadLetterAlertConfig>) -> RouteConfig {
        let toml = format!(
            "queue = \"{queue}\"\nplugin = \"p\"\n{}",
            alert.map_or(String::new(), |a| format!(
                "dead_letter_alert = {{ count = {}, window = \"{}s\" }}\n",
                a.count,
                a.window.as_secs()
            ))
        );
        toml::from_str(&toml).expect("route")
    }

    #[test]
    fn observations_raise_clear_and_follow_the_rules() {
        let metrics = Arc::new(Metrics::default());
        let alerts = DeadLetterAlerts::new(metrics.clone());
        alerts.set_rules(&[route("a", Some(rule())), route("b", None)], &[]);
        alerts.observe("a", 11, vec![("missing field".into(), 11)], 5);
        let active = alerts.active();
        assert_eq!(active.len(), 1);
        assert_eq!(active[0].route, "a");
        assert!(
            active[0]
                .describe()
                .contains("11 dead letters in the last 1h (threshold 10)")
        );
        assert!(
            metrics
                .encode()
                .contains("carteiro_dead_letter_alert_active{route=\"a\"} 1")
        );
        // A reload that keeps the rule keeps the alert; one that drops it clears it.
        alerts.set_rules(&[route("a", Some(rule()))], &[]);
        assert_eq!(alerts.active().len(), 1);
        alerts.set_rules(&[route("a", None)], &[]);
        assert!(alerts.active().is_empty());
        assert!(
            metrics
                .encode()
                .contains("carteiro_dead_letter_alert_active{route=\"a\"} 0")
        );
        // A route that is not watched is ignored.
        alerts.observe("b", 100, Vec::new(), 6);
        assert!(alerts.active().is_empty());
    }

    #[test]
    fn the_tick_follows_the_shortest_window() {
        let alerts = DeadLetterAlerts::new(Arc::new(Metrics::default()));
        assert_eq!(alerts.tick(), Duration::from_millis(500));
        let short = DeadLetterAlertConfig {
            count: 1,
            window: Duration::from_secs(2),
        };
        alerts.set_rules(&[route("a", Some(rule())), route("b", Some(short))], &[]);
        assert_eq!(alerts.tick(), Duration::from_millis(250));
    }
}
