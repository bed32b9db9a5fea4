//! The routes' supervisor, and a reload: validate and prepare everything first, then change
//! what runs.
//!
//! Order of a reload:
//! 1. read and validate the config file (the same checks as start-up);
//! 2. compile every new or changed plugin (changed: other bytes or other settings); a file
//!    that cannot be read, has the wrong digest or is not a handler component refuses it;
//! 3. build the contexts of added and changed routes and declare their topology on the
//!    broker (a queue that exists with other arguments refuses it);
//! 4. only then: swap the plugin version of routes that keep running (a delivery keeps the
//!    version it started with — see `PluginSlot::plugin`), stop removed and changed routes
//!    (no new deliveries; in-flight ones finish and ack), and start added and changed ones.
//!
//! Sections only a restart applies (`[broker]`, `[store]`, `[runtime]`, `[relay]`,
//! `[telemetry]`, `[admin] listen`) are reported, not applied. `[admin]` credentials,
//! `require_auth` and `allowed_hosts` are applied (the admin server reads them from the
//! running config). A changed broker or store URL that carries a password refuses the
//! reload, naming the key: only a restart can connect with it.

use super::{LiveHandle, ReloadError, ReloadReport, Request, RunningPlugin};
use crate::broker::connect_any;
use crate::config::{self, AdminConfig, Config};
use crate::pipeline::canary::Canary;
use crate::pipeline::live_shadow::Shadow;
use crate::pipeline::{
    PluginSlot, RouteConfig, RouteContext, RouteDeps, RouteError, RouteSettings, run_route,
};
use crate::runtime::{Plugin, PluginConfig, Runtime};
use crate::services::{Plugins, broker_settings, load_canary, load_plugin, load_shadow};
use crate::topology::declare_route;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// How long a stopping route may take beyond its in-flight grace period.
const STOP_SLACK: Duration = Duration::from_secs(15);

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
struct Loaded {
    plugin: Arc<Plugin>,
    shadow: Option<Arc<Shadow>>,
    canary: Option<Arc<Canary>>,
    /// The `[plugins.NAME]` table it was loaded with (compared, never printed: variables may
    /// hold secrets).
    settings: String,
}

struct RunningRoute {
    ctx: Arc<RouteContext>,
    fingerprint: String,
    stop: CancellationToken,
    task: JoinHandle<()>,
}

/// Owns the running routes; applies reloads one at a time.
pub struct Supervisor {
    shared: Shared,
    /// What runs: the last applied config (restart-only sections as at start-up).
    config: Config,
    config_path: Option<PathBuf>,
    plugins: BTreeMap<String, Loaded>,
    routes: BTreeMap<String, RunningRoute>,
    stop: CancellationToken,
    fatal_tx: mpsc::UnboundedSender<RouteError>,
    fatal_rx: mpsc::UnboundedReceiver<RouteError>,
    requests: mpsc::Receiver<Request>,
    live: LiveHandle,
}

/// A route's settings apart from its plugin (a plugin change alone is a swap, not a
/// restart).
fn route_fingerprint(route: &RouteConfig) -> String {
    let mut route = route.clone();
    route.plugin = toml::Spanned::new(0..0, String::new());
    // The alert is read by the alerts task, not by the running route: no restart for it.
    route.dead_letter_alert = None;
    format!("{route:?}")
}

fn plugin_settings(p: &PluginConfig) -> String {
    format!("{p:?}")
}

fn file_digest(path: &std::path::Path) -> Option<String> {
    std::fs::read(path)
        .ok()
        .map(|bytes| hex::encode(Sha256::digest(bytes)))
}

/// Sections of `new` that differ from `running` and only a restart applies.
fn restart_only_changes(running: &Config, new: &Config) -> Vec<String> {
    let mut out = Vec::new();
    let mut differs = |name: &str, a: String, b: String| {
        if a != b {
            out.push(format!("[{name}]"));
        }
    };
    differs(
        "broker",
        format!("{:?}", running.broker),
        format!("{:?}", new.broker),
    );
    differs(
        "store",
        format!("{:?}", running.store),
        format!("{:?}", new.store),
    );
    differs(
        "runtime",
        format!("{:?}", running.runtime),
        format!("{:?}", new.runtime),
    );
    differs(
        "relay",
        format!("{:?}", running.relay),
        format!("{:?}", new.relay),
    );
    differs(
        "telemetry",
        format!("{:?}", running.telemetry),
        format!("{:?}", new.telemetry),
    );
    if running.admin.listen != new.admin.listen {
        out.push("[admin] listen".to_owned());
    }
    out
}

/// `[admin]` keys a reload applies (credentials and who needs them), one line each; never
/// the secrets themselves. (`Secret`'s `Debug` hides them, so compare the values.)
fn admin_changes(running: &AdminConfig, new: &AdminConfig) -> Vec<String> {
    let mut out = Vec::new();
    let token = |a: &AdminConfig| a.token.as_ref().map(|t| t.0.clone());
    if token(running) != token(new) {
        out.push("[admin] token: changed; the previous one is no longer accepted".to_owned());
    }
    let basic = |a: &AdminConfig| {
        a.basic
            .as_ref()
            .map(|b| (b.user.clone(), b.password.0.clone()))
    };
    if basic(running) != basic(new) {
        out.push("[admin] basic: changed; the previous credentials are no longer accepted".into());
    }
    if running.require_auth != new.require_auth {
        out.push(format!("[admin] require_auth: now {:?}", new.require_auth));
    }
    if running.allowed_hosts != new.allowed_hosts {
        out.push(format!(
            "[admin] allowed_hosts: now {:?}",
            new.allowed_hosts
        ));
    }
    out
}

/// A reload cannot apply new broker or store credentials (the connections are made with the
/// old ones): a changed URL that carries a password refuses the reload, naming the key, so
/// nobody believes a rotated password is in use when it is not.
fn credentials_needing_restart(running: &Config, new: &Config) -> Result<(), ReloadError> {
    let carries_secret = |url: &str| crate::redact::redact_url(url) != url;
    let check = |key: &'static str, a: &[String], b: &[String]| {
        if a != b && a.iter().chain(b).any(|u| carries_secret(u)) {
            Err(ReloadError::CredentialsChanged { key })
        } else {
            Ok(())
        }
    };
    check(
        "[broker] url",
        std::slice::from_ref(&running.broker.url),
        std::slice::from_ref(&new.broker.url),
    )?;
    check("[broker] urls", &running.broker.urls, &new.broker.urls)?;
    check(
        "[store] url",
        std::slice::from_ref(&running.store.url),
        std::slice::from_ref(&new.store.url),
    )
}

fn shadow_of(shared: &Shared, live: &LiveHandle, plugin: Plugin, p: &PluginConfig) -> Arc<Shadow> {
    Arc::new(Shadow::new(
        Arc::new(plugin),
        p.shadow_sample,
        p.shadow_max_in_flight,
        live.shadows.clone(),
        shared.deps.metrics.clone(),
    ))
}

fn canary_of(shared: &Shared, stable: &Plugin, canary: Plugin, p: &PluginConfig) -> Arc<Canary> {
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

    fn context(
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

    fn spawn_route(&mut self, route: &RouteConfig, ctx: RouteContext) {
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

    fn publish_status(&self, last: Option<ReloadReport>) {
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

    /// One reload; logs, counts and records its outcome.
    async fn reload(&mut self, source: &str) -> ReloadReport {
        let mut report = ReloadReport {
            applied: false,
            source: source.to_owned(),
            at_ms: 0,
            error: None,
            changes: Vec::new(),
            needs_restart: Vec::new(),
        };
        match self.try_reload(&mut report).await {
            Ok(()) => {
                report.applied = true;
                self.shared.deps.metrics.reload.applied.inc();
                self.shared.deps.metrics.reload.success.set(1);
                tracing::info!(source, changes = %report.changes.join("; "), "reload applied");
                if !report.needs_restart.is_empty() {
                    tracing::warn!(source, sections = %report.needs_restart.join(", "), "these config sections changed but apply only on a restart");
                }
            }
            Err(why) => {
                self.shared.deps.metrics.reload.failures.inc();
                self.shared.deps.metrics.reload.success.set(0);
                tracing::error!(source, error = %why, "reload refused; still running the previous config and plugins");
                report.error = Some(why.to_string());
                report.changes.clear();
            }
        }
        report.at_ms = crate::common::now_ms();
        self.publish_status(Some(report.clone()));
        report
    }

    async fn try_reload(&mut self, report: &mut ReloadReport) -> Result<(), ReloadError> {
        let path = self.config_path.clone().ok_or(ReloadError::NoConfigFile)?;
        // 1. The config, validated as at start-up.
        let mut new = config::load(&path).map_err(ReloadError::InvalidConfig)?;
        credentials_needing_restart(&self.config, &new)?;
        report.needs_restart = restart_only_changes(&self.config, &new);
        let admin_changes = admin_changes(&self.config.admin, &new.admin);
        new.broker = self.config.broker.clone();
        new.store = self.config.store.clone();
        new.runtime = self.config.runtime.clone();
        new.relay = self.config.relay.clone();
        // The admin server reads its credentials from the running config: they apply now.
        new.admin.listen = self.config.admin.listen.clone();

        // 2. Plugins: unchanged ones kept, new and changed ones compiled now.
        let mut plugins = BTreeMap::new();
        for (name, p) in &new.plugins {
            let settings = plugin_settings(p);
            let running = self.plugins.get(name);
            let unchanged = running.filter(|l| {
                l.settings == settings
                    && file_digest(&p.path).as_deref() == Some(l.plugin.digest())
                    && p.shadow.as_deref().map(file_digest)
                        == l.shadow
                            .as_ref()
                            .map(|s| Some(s.plugin.digest().to_owned()))
                    && p.canary.as_ref().map(|c| file_digest(&c.path))
                        == l.canary
                            .as_ref()
                            .map(|c| Some(c.plugin.digest().to_owned()))
            });
            let (plugin, shadow, canary) = match unchanged {
                Some(l) => (l.plugin.clone(), l.shadow.clone(), l.canary.clone()),
                None => {
                    let (runtime, name2, p2) =
                        (self.shared.runtime.clone(), name.clone(), p.clone());
                    let loaded =
                        tokio::task::spawn_blocking(move || load_plugin(&runtime, &name2, &p2))
                            .await
                            .map_err(|source| ReloadError::PluginTask {
                                name: name.clone(),
                                source,
                            })?
                            .map_err(ReloadError::Plugin)?;
                    let loaded = Arc::new(loaded);
                    let (runtime, name2, p2) =
                        (self.shared.runtime.clone(), name.clone(), p.clone());
                    let shadow =
                        tokio::task::spawn_blocking(move || load_shadow(&runtime, &name2, &p2))
                            .await
                            .map_err(|source| ReloadError::ShadowTask {
                                name: name.clone(),
                                source,
                            })?
                            .map_err(|source| ReloadError::Shadow {
                                name: name.clone(),
                                source: Box::new(source),
                            })?
                            .map(|s| shadow_of(&self.shared, &self.live, s, p));
                    let (runtime, name2, p2) =
                        (self.shared.runtime.clone(), name.clone(), p.clone());
                    let canary =
                        tokio::task::spawn_blocking(move || load_canary(&runtime, &name2, &p2))
                            .await
                            .map_err(|source| ReloadError::CanaryTask {
                                name: name.clone(),
                                source,
                            })?
                            .map_err(|source| ReloadError::Canary {
                                name: name.clone(),
                                source: Box::new(source),
                            })?
                            .map(|c| canary_of(&self.shared, &loaded, c, p));
                    report.changes.push(match running {
                        Some(old) if old.plugin.digest() != loaded.digest() => format!(
                            "plugin `{name}`: version {} -> {}",
                            old.plugin.version(),
                            loaded.version()
                        ),
                        Some(_) => format!(
                            "plugin `{name}`: settings changed (version {})",
                            loaded.version()
                        ),
                        None => format!("plugin `{name}`: loaded version {}", loaded.version()),
                    });
                    (loaded, shadow, canary)
                }
            };
            plugins.insert(
                name.clone(),
                Loaded {
                    plugin,
                    shadow,
                    canary,
                    settings,
                },
            );
        }
        for name in self.plugins.keys().filter(|n| !plugins.contains_key(*n)) {
            report.changes.push(format!("plugin `{name}`: unloaded"));
        }

        // 3. Routes: which start, stop, or only change plugin version.
        let wanted: BTreeMap<&str, &RouteConfig> =
            new.routes.iter().map(|r| (r.queue.as_str(), r)).collect();
        let mut to_start = Vec::new();
        for (queue, route) in &wanted {
            match self.routes.get(*queue) {
                Some(running) if running.fingerprint == route_fingerprint(route) => {}
                _ => to_start.push(((*route).clone(), self.context(route, &plugins)?)),
            }
        }
        let to_stop: Vec<String> = self
            .routes
            .iter()
            .filter(|(queue, running)| {
                wanted
                    .get(queue.as_str())
                    .is_none_or(|r| route_fingerprint(r) != running.fingerprint)
            })
            .map(|(queue, _)| queue.clone())
            .collect();
        if !to_start.is_empty() {
            self.declare(&to_start).await?;
        }

        // 4. Apply. Nothing below can fail.
        for (queue, running) in &self.routes {
            if to_stop.contains(queue) {
                continue;
            }
            let Some(route) = wanted.get(queue.as_str()) else {
                continue;
            };
            let Some(next) = plugins.get(route.plugin_name()) else {
                continue;
            };
            let current = running.ctx.slot.plugin();
            running.ctx.slot.set_shadow(next.shadow.clone());
            running.ctx.slot.set_canary(next.canary.clone());
            if !Arc::ptr_eq(&current, &next.plugin) {
                running.ctx.slot.swap_plugin(next.plugin.clone());
                tracing::info!(queue = %queue, plugin = next.plugin.name(), from = current.version(), to = next.plugin.version(), sha256 = next.plugin.digest(), "route swapped to a new plugin version; deliveries in flight finish on the old one");
                report.changes.push(format!(
                    "route `{queue}`: plugin `{}` version {} -> `{}` version {}",
                    current.name(),
                    current.version(),
                    next.plugin.name(),
                    next.plugin.version()
                ));
            }
        }
        for queue in &to_stop {
            if let Some(running) = self.routes.remove(queue) {
                running.stop.cancel();
                let grace = broker_settings(&self.config, "").shutdown_grace + STOP_SLACK;
                if tokio::time::timeout(grace, running.task).await.is_err() {
                    tracing::warn!(queue = %queue, "route did not stop in time; its unacked deliveries return to the queue");
                }
                let restarted = wanted.contains_key(queue.as_str());
                if !restarted {
                    tracing::info!(queue = %queue, "route removed by reload: stopped consuming");
                    report.changes.push(format!("route `{queue}`: stopped"));
                }
            }
        }
        for (previous, loaded) in self.plugins.iter() {
            let next = plugins.get(previous).map(|l| l.plugin.version());
            if next != Some(loaded.plugin.version()) {
                self.shared.deps.metrics.plugin_version(
                    previous,
                    Some(loaded.plugin.version()),
                    next,
                );
            }
        }
        for (name, loaded) in &plugins {
            if !self.plugins.contains_key(name) {
                self.shared
                    .deps
                    .metrics
                    .plugin_version(name, None, Some(loaded.plugin.version()));
            }
        }
        self.plugins = plugins;
        self.shared.alerts.set_rules(&new.routes);
        self.config = new;
        report.changes.extend(admin_changes);
        for (route, ctx) in to_start {
            let restarted = to_stop.contains(&route.queue);
            tracing::info!(queue = %route.queue, restarted, "route started by reload");
            report.changes.push(if restarted {
                format!("route `{}`: restarted with new settings", route.queue)
            } else {
                format!("route `{}`: started", route.queue)
            });
            self.spawn_route(&route, ctx);
        }
        Ok(())
    }

    /// Declares the topology of routes about to start, so a queue that exists with other
    /// arguments refuses the reload instead of stopping the gateway later.
    async fn declare(&self, routes: &[(RouteConfig, RouteContext)]) -> Result<(), ReloadError> {
        let settings = broker_settings(&self.config, "carteiro reload");
        let conn = connect_any(&settings.urls, &settings.connect)
            .await
            .map_err(ReloadError::Connect)?;
        let mut result = Ok(());
        for (route, ctx) in routes {
            if let Err(source) = declare_route(&conn, &ctx.settings.topology).await {
                result = Err(ReloadError::Declare {
                    queue: route.queue.clone(),
                    source,
                });
                break;
            }
        }
        let _ = conn.close(200, "reload checked".into()).await;
        result
    }
}
