//! A reload: validate and prepare everything first, then change what runs.
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

use super::diff::{
    admin_changes, credentials_needing_restart, file_digest, plugin_settings, restart_only_changes,
    route_fingerprint,
};
use super::supervisor::{Loaded, Supervisor, canary_of, shadow_of};
use super::{ReloadError, ReloadReport};
use crate::broker::connect_any;
use crate::config;
use crate::pipeline::{RouteConfig, RouteContext};
use crate::runtime::{LoadError, PluginConfig, Runtime};
use crate::services::{broker_settings, load_canary, load_plugin, load_shadow};
use crate::topology::declare_route;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinError;

/// How long a stopping route may take beyond its in-flight grace period.
const STOP_SLACK: Duration = Duration::from_secs(15);

/// Which build of a plugin a reload compiles: what a failure to load it is reported as.
#[derive(Debug, Clone, Copy)]
enum Build {
    Plugin,
    Shadow,
    Canary,
}

impl Build {
    /// Loads this build of plugin `name` with `loader` on the blocking pool (compiling
    /// blocks); a load that fails or does not finish refuses the reload.
    async fn load<T: Send + 'static>(
        self,
        runtime: &Arc<Runtime>,
        name: &str,
        p: &PluginConfig,
        loader: fn(&Arc<Runtime>, &str, &PluginConfig) -> Result<T, LoadError>,
    ) -> Result<T, ReloadError> {
        let task = {
            let (runtime, name, p) = (runtime.clone(), name.to_owned(), p.clone());
            tokio::task::spawn_blocking(move || loader(&runtime, &name, &p))
        };
        let name = name.to_owned();
        match task.await {
            Ok(loaded) => loaded.map_err(|source| self.failed(name, source)),
            Err(source) => Err(self.unfinished(name, source)),
        }
    }

    /// Loading this build of plugin `name` did not finish (its task panicked or was
    /// cancelled).
    fn unfinished(self, name: String, source: JoinError) -> ReloadError {
        match self {
            Self::Plugin => ReloadError::PluginTask { name, source },
            Self::Shadow => ReloadError::ShadowTask { name, source },
            Self::Canary => ReloadError::CanaryTask { name, source },
        }
    }

    /// This build of plugin `name` cannot be loaded.
    fn failed(self, name: String, source: LoadError) -> ReloadError {
        match self {
            Self::Plugin => ReloadError::Plugin(source),
            Self::Shadow => ReloadError::Shadow {
                name,
                source: Box::new(source),
            },
            Self::Canary => ReloadError::Canary {
                name,
                source: Box::new(source),
            },
        }
    }
}

impl Supervisor {
    /// One reload; logs, counts and records its outcome.
    pub(super) async fn reload(&mut self, source: &str) -> ReloadReport {
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
                    let runtime = &self.shared.runtime;
                    let loaded = Build::Plugin.load(runtime, name, p, load_plugin).await?;
                    let loaded = Arc::new(loaded);
                    let shadow = Build::Shadow
                        .load(runtime, name, p, load_shadow)
                        .await?
                        .map(|s| shadow_of(&self.shared, &self.live, s, p));
                    let canary = Build::Canary
                        .load(runtime, name, p, load_canary)
                        .await?
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
            // A running route keeps its context: its new plugin version is checked here.
            if let Some(next) = plugins.get(route.plugin_name()) {
                super::supervisor::check_batch(route, &next.plugin)?;
            }
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
        self.shared
            .alerts
            .set_rules(&new.routes, &new.dead_letter_queues);
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
