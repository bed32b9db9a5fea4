//! Changing handlers while the gateway runs (docs/architecture.md, "Changing handlers live").
//!
//! - this file: the handle the admin server and the SIGHUP forwarder use to ask for a
//!   reload, and what runs now (plugin versions, the last reload's outcome) for `/readyz`.
//! - `supervisor`: the [`Supervisor`] that owns the running routes and what they run, and
//!   serves reload requests one at a time.
//! - `reload`: one reload: read and validate the config, compile changed plugins, declare
//!   new routes' topology — all before anything changes — then swap plugin versions, stop
//!   removed routes and start added ones. A reload that fails at any step changes nothing.
//! - `diff`: what a new config changes against the running one (routes to restart, plugins
//!   to compile, restart-only sections, `[admin]` keys, credentials that refuse a reload).
//! - `error`: why a reload was refused ([`ReloadError`]) or a canary could not be ended
//!   ([`CanaryError`]).

mod diff;
mod error;
mod reload;
mod supervisor;

pub use error::{CanaryError, ReloadError};
pub use supervisor::{Shared, Supervisor, check_batch};

use crate::pipeline::canary::Canary;
use crate::pipeline::live_shadow::ShadowLog;
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

/// Reload requests waiting while one is applied; more are refused (the next one re-reads
/// the same file anyway).
const QUEUED_RELOADS: usize = 4;

/// What a reload did, or why it changed nothing.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct ReloadReport {
    /// Everything valid and applied. `false`: the previous config and plugins still run.
    pub applied: bool,
    /// Who asked: `SIGHUP` or `POST /admin/reload`.
    pub source: String,
    /// When it finished (ms since the Unix epoch).
    pub at_ms: i64,
    /// Why it was refused (the config error, the plugin that failed to load, ...).
    pub error: Option<String>,
    /// What changed, one line each (plugin versions swapped, routes started or stopped).
    pub changes: Vec<String>,
    /// Config sections that differ from the running ones but apply only on a restart.
    pub needs_restart: Vec<String>,
}

/// A running plugin version, as `/readyz` shows it.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct RunningPlugin {
    pub version: String,
    pub sha256: String,
    /// The live shadow's version, if it has one.
    pub shadow: Option<String>,
}

/// What runs now.
#[derive(Debug, Clone, Default)]
pub struct LiveStatus {
    /// Plugins by name.
    pub plugins: BTreeMap<String, RunningPlugin>,
    /// Routes (work queues) consuming.
    pub routes: Vec<String>,
    /// The last reload, applied or refused.
    pub last_reload: Option<ReloadReport>,
    /// The config that runs (restart-only sections as at start-up).
    pub config: Option<Arc<crate::config::Config>>,
    /// Deliveries in flight per route.
    pub in_flight: BTreeMap<String, Arc<std::sync::atomic::AtomicUsize>>,
}

struct Request {
    source: String,
    reply: Option<oneshot::Sender<ReloadReport>>,
}

/// Asks the running gateway for reloads and tells what runs. Cheap to clone.
#[derive(Clone)]
pub struct LiveHandle {
    requests: mpsc::Sender<Request>,
    status: Arc<Mutex<LiveStatus>>,
    /// Live-shadow counts and disagreements of every route.
    pub shadows: Arc<ShadowLog>,
    /// Canaries by plugin name.
    canaries: Arc<Mutex<BTreeMap<String, Arc<Canary>>>>,
}

impl LiveHandle {
    fn new() -> (Self, mpsc::Receiver<Request>) {
        let (requests, receiver) = mpsc::channel(QUEUED_RELOADS);
        let handle = Self {
            requests,
            status: Arc::default(),
            shadows: Arc::default(),
            canaries: Arc::default(),
        };
        (handle, receiver)
    }

    /// Reloads and waits for the outcome.
    pub async fn reload(&self, source: &str) -> ReloadReport {
        let (reply, outcome) = oneshot::channel();
        let refused = |why: &str| ReloadReport {
            applied: false,
            source: source.to_owned(),
            at_ms: crate::common::now_ms(),
            error: Some(why.to_owned()),
            changes: Vec::new(),
            needs_restart: Vec::new(),
        };
        let request = Request {
            source: source.to_owned(),
            reply: Some(reply),
        };
        if self.requests.try_send(request).is_err() {
            return refused("too many reloads queued, or the gateway is stopping; try again");
        }
        outcome
            .await
            .unwrap_or_else(|_| refused("the gateway stopped before the reload finished"))
    }

    /// Asks for a reload without waiting (its outcome is logged and kept for `/readyz`).
    pub fn request(&self, source: &str) {
        let request = Request {
            source: source.to_owned(),
            reply: None,
        };
        if self.requests.try_send(request).is_err() {
            tracing::warn!(
                source,
                "reload not queued: too many reloads queued, or the gateway is stopping"
            );
        }
    }

    /// What runs now.
    pub fn status(&self) -> LiveStatus {
        self.status
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The config that runs, if the gateway has started (cheaper than [`Self::status`]).
    pub fn config(&self) -> Option<Arc<crate::config::Config>> {
        self.status
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .config
            .clone()
    }

    fn set_canaries(&self, canaries: BTreeMap<String, Arc<Canary>>) {
        *self.canaries.lock().unwrap_or_else(PoisonError::into_inner) = canaries;
    }

    /// Ends plugin `name`'s canary by hand (`carteiro canary promote|abort`).
    pub fn finish_canary(&self, name: &str, promote: bool) -> Result<String, CanaryError> {
        let canary = self
            .canaries
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(name)
            .cloned()
            .ok_or_else(|| CanaryError::NoCanary(name.to_owned()))?;
        canary.finish(promote)?;
        Ok(canary.describe())
    }

    fn update(&self, change: impl FnOnce(&mut LiveStatus)) {
        change(&mut self.status.lock().unwrap_or_else(PoisonError::into_inner));
    }

    /// `/readyz` detail lines: plugin versions, routes, the last reload.
    pub fn readiness_detail(&self) -> String {
        let status = self.status();
        let mut out = String::new();
        for (name, p) in &status.plugins {
            out.push_str(&format!(
                "plugin {name}: version {} (sha256 {})\n",
                p.version, p.sha256
            ));
            if let Some(shadow) = &p.shadow {
                out.push_str(&format!("plugin {name}: shadow version {shadow}\n"));
            }
        }
        for (name, canary) in self
            .canaries
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
        {
            out.push_str(&format!("plugin {name}: {}\n", canary.describe()));
        }
        out.push_str(&format!("routes: {}\n", status.routes.join(", ")));
        if let Some(r) = &status.last_reload {
            let at = crate::common::rfc3339(r.at_ms);
            match &r.error {
                None => out.push_str(&format!(
                    "last reload: applied at {at} ({}): {}\n",
                    r.source,
                    if r.changes.is_empty() {
                        "no changes".to_owned()
                    } else {
                        r.changes.join("; ")
                    }
                )),
                Some(why) => out.push_str(&format!(
                    "last reload: FAILED at {at} ({}); still running the previous config and \
                     plugins: {why}\n",
                    r.source
                )),
            }
            if !r.needs_restart.is_empty() {
                out.push_str(&format!(
                    "needs a restart to apply: {}\n",
                    r.needs_restart.join(", ")
                ));
            }
        }
        out
    }
}

/// Turns each SIGHUP into a reload request until `stop`.
pub async fn forward_signals(
    mut signals: mpsc::UnboundedReceiver<()>,
    live: LiveHandle,
    stop: CancellationToken,
) -> anyhow::Result<()> {
    loop {
        tokio::select! {
            _ = stop.cancelled() => return Ok(()),
            signal = signals.recv() => match signal {
                Some(()) => {
                    tracing::info!("SIGHUP received: reloading the config and plugins");
                    live.request("SIGHUP");
                }
                None => {
                    stop.cancelled().await;
                    return Ok(());
                }
            },
        }
    }
}
