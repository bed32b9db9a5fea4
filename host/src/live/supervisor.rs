//! The routes' supervisor: owns the running routes and what they run (each plugin with its
//! live shadow and canary), starts them, and serves reload requests one at a time (see
//! `reload`, which changes what runs).

use super::diff::{plugin_settings, route_fingerprint};
use super::{LiveHandle, ReloadError, ReloadReport, Request, RunningPlugin};
use crate::config::Config;
use crate::pipeline::canary::Canary;
use crate::pipeline::live_shadow::Shadow;
use crate::pipeline::{
    PluginSlot, RouteConfig, RouteContext, RouteDeps, RouteError, RouteSettings, run_route,
};
use crate::runtime::{Plugin, PluginConfig, Runtime};
use crate::services::{Plugins, broker_settings, load_canary, load_shadow};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// What every route shares; fixed for the gateway's life.
pub struct Shared {
    /// Told the routes' alert rules after each applied reload.
    pub alerts: Arc<crate::alerts::DeadLetterAlerts>,
    pub runtime: Arc<Runtime>,
    /// What each route's deliveries use: the store, metrics, seal, spans.
    pub deps: RouteDeps,
    /// How canaries ended, shared through the store.
    pub canaries: Arc<crate::pipeline::canary_decisions::CanaryDecisions>,
}

/// A loaded plugin and what it was loaded from.
pub(super) struct Loaded {
    pub(super) plugin: Arc<Plugin>,
    pub(super) shadow: Option<Arc<Shadow>>,
    pub(super) canary: Option<Arc<Canary>>,
    /// The `[plugins.NAME]` table it was loaded with (compared, never printed: variables may
    /// hold secrets).
    pub(super) settings: String,
}

/// A running route: its context, the settings it started with, and how to stop it.
pub(super) struct RunningRoute {
    pub(super) ctx: Arc<RouteContext>,
    pub(super) fingerprint: String,
    pub(super) stop: CancellationToken,
    pub(super) task: JoinHandle<()>,
}

/// Owns the running routes; applies reloads one at a time.
pub struct Supervisor {
    pub(super) shared: Shared,
    /// What runs: the last applied config (restart-only sections as at start-up).
    pub(super) config: Config,
    pub(super) config_path: Option<PathBuf>,
    pub(super) plugins: BTreeMap<String, Loaded>,
    pub(super) routes: BTreeMap<String, RunningRoute>,
    pub(super) stop: CancellationToken,
    pub(super) fatal_tx: mpsc::UnboundedSender<RouteError>,
    pub(super) fatal_rx: mpsc::UnboundedReceiver<RouteError>,
    pub(super) requests: mpsc::Receiver<Request>,
    pub(super) live: LiveHandle,
}

pub(super) fn shadow_of(
    shared: &Shared,
    live: &LiveHandle,
    plugin: Plugin,
    p: &PluginConfig,
) -> Arc<Shadow> {
    Arc::new(Shadow::new(
        Arc::new(plugin),
        p.shadow_sample,
        p.shadow_max_in_flight,
        live.shadows.clone(),
        shared.deps.metrics.clone(),
    ))
}

pub(super) fn canary_of(
    shared: &Shared,
    stable: &Plugin,
    canary: Plugin,
    p: &PluginConfig,
) -> Arc<Canary> {
    let (percent, rule) = p
        .canary
        .as_ref()
        .map(|c| (c.percent, c.rollback_on.clone()))
        .unwrap_or_default();
    Arc::new(Canary::new(
        Arc::new(canary),
        stable,
        percent,
        rule,
        shared.deps.metrics.clone(),
        shared.canaries.clone(),
    ))
}

impl Supervisor {
    /// Starts the config's routes on `plugins` (already loaded).
    pub fn start(
        shared: Shared,
        config: Config,
        plugins: Plugins,
        config_path: Option<PathBuf>,
        stop: &CancellationToken,
    ) -> anyhow::Result<(Self, LiveHandle)> {
        let (live, requests) = LiveHandle::new();
        let (fatal_tx, fatal_rx) = mpsc::unbounded_channel();
        let mut loaded = BTreeMap::new();
        for (name, plugin) in plugins {
            let Some(p) = config.plugins.get(&name) else {
                continue;
            };
            let shadow =
                load_shadow(&shared.runtime, &name, p)?.map(|s| shadow_of(&shared, &live, s, p));
            let canary =
                load_canary(&shared.runtime, &name, p)?.map(|c| canary_of(&shared, &plugin, c, p));
            let settings = plugin_settings(p);
            loaded.insert(
                name,
                Loaded {
                    plugin,
                    shadow,
                    canary,
                    settings,
                },
            );
        }
        let plugins = loaded;
        let mut supervisor = Self {
            shared,
            config,
            config_path,
            plugins,
            routes: BTreeMap::new(),
            stop: stop.clone(),
            fatal_tx,
            fatal_rx,
            requests,
            live: live.clone(),
        };
        for route in supervisor.config.routes.clone() {
            // The message alone, as before: `{:#}` would repeat a wrapped error's words.
            let ctx = supervisor
                .context(&route, &supervisor.plugins)
                .map_err(|e| anyhow::anyhow!(e.to_string()))?;
            supervisor.spawn_route(&route, ctx);
        }
        for (name, loaded) in &supervisor.plugins {
            supervisor.shared.deps.metrics.plugin_version(
                name,
                None,
                Some(loaded.plugin.version()),
            );
        }
        supervisor.publish_status(None);
        Ok((supervisor, live))
    }

    pub(super) fn context(
        &self,
        route: &RouteConfig,
        plugins: &BTreeMap<String, Loaded>,
    ) -> Result<RouteContext, ReloadError> {
        let loaded =
            plugins
                .get(route.plugin_name())
                .ok_or_else(|| ReloadError::UnknownPlugin {
                    queue: route.queue.clone(),
                    plugin: route.plugin_name().to_owned(),
                })?;
        check_batch(route, &loaded.plugin)?;
        let settings =
            RouteSettings::new(route, self.config.broker.publish_timeout).map_err(|source| {
                ReloadError::Route {
                    queue: route.queue.clone(),
                    source,
                }
            })?;
        let slot = PluginSlot::new(
            loaded.plugin.clone(),
            loaded.shadow.clone(),
            loaded.canary.clone(),
        );
        Ok(RouteContext::new(settings, self.shared.deps.clone(), slot))
    }

    pub(super) fn spawn_route(&mut self, route: &RouteConfig, ctx: RouteContext) {
        let ctx = Arc::new(ctx);
        let stop = self.stop.child_token();
        let settings = broker_settings(&self.config, &format!("carteiro route {}", route.queue));
        let fatal = self.fatal_tx.clone();
        let task = tokio::spawn({
            let (ctx, stop) = (ctx.clone(), stop.clone());
            async move {
                if let Err(e) = run_route(ctx, settings, stop).await {
                    let _ = fatal.send(e);
                }
            }
        });
        self.routes.insert(
            route.queue.clone(),
            RunningRoute {
                ctx,
                fingerprint: route_fingerprint(route),
                stop,
                task,
            },
        );
    }

    pub(super) fn publish_status(&self, last: Option<ReloadReport>) {
        self.live.set_canaries(
            self.plugins
                .iter()
                .filter_map(|(name, l)| Some((name.clone(), l.canary.clone()?)))
                .collect(),
        );
        let plugins = self
            .plugins
            .iter()
            .map(|(name, l)| {
                let running = RunningPlugin {
                    version: l.plugin.version().to_owned(),
                    sha256: l.plugin.digest().to_owned(),
                    shadow: l.shadow.as_ref().map(|s| s.plugin.version().to_owned()),
                };
                (name.clone(), running)
            })
            .collect();
        let routes = self.routes.keys().cloned().collect();
        let in_flight = self
            .routes
            .iter()
            .map(|(queue, r)| (queue.clone(), r.ctx.in_flight.clone()))
            .collect();
        let config = Arc::new(self.config.clone());
        self.live.update(|s| {
            s.plugins = plugins;
            s.routes = routes;
            s.in_flight = in_flight;
            s.config = Some(config);
            if last.is_some() {
                s.last_reload = last;
            }
        });
    }

    /// Serves reload requests until `stop`; returns an error when a route fails for good
    /// (the gateway then stops, as at start-up).
    pub async fn run(mut self) -> anyhow::Result<()> {
        let result = loop {
            tokio::select! {
                _ = self.stop.cancelled() => break Ok(()),
                Some(e) = self.fatal_rx.recv() => break Err(anyhow::Error::from(e)),
                Some(request) = self.requests.recv() => {
                    let report = self.reload(&request.source).await;
                    if let Some(reply) = request.reply {
                        let _ = reply.send(report);
                    }
                }
            }
        };
        self.requests.close();
        self.stop.cancel();
        for (_, route) in std::mem::take(&mut self.routes) {
            let _ = route.task.await;
        }
        result
    }
}

/// A route with `batch` needs a plugin that exports `handle-batch`.
pub fn check_batch(route: &RouteConfig, plugin: &Plugin) -> Result<(), ReloadError> {
    if route.batch.is_some() && !plugin.supports_batch() {
        return Err(ReloadError::BatchUnsupported {
            queue: route.queue.clone(),
            plugin: route.plugin_name().to_owned(),
        });
    }
    Ok(())
}
