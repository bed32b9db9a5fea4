//! Loading plugins: the wasm runtime the config asks for, each plugin with its digest pin,
//! and the shadow and canary versions beside it.

use crate::config::Config;
use crate::runtime::{LoadError, Plugin, PluginConfig, PluginLimits, Runtime};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

/// Plugins by config name.
pub type Plugins = BTreeMap<String, Arc<Plugin>>;

/// The wasm runtime the config's `[runtime]` section asks for.
pub fn new_runtime(config: &Config) -> anyhow::Result<Arc<Runtime>> {
    let cache = config
        .runtime
        .compile_cache
        .as_deref()
        .filter(|p| !p.as_os_str().is_empty());
    Runtime::with_compile_cache(config.runtime.max_instances, cache)
        .map_err(|e| anyhow::anyhow!("cannot start the wasm runtime: {e:#}"))
}

/// Reads, checks (digest pin), compiles and pre-links plugin `name` of the config.
pub fn load_plugin(
    runtime: &Arc<Runtime>,
    name: &str,
    p: &PluginConfig,
) -> Result<Plugin, LoadError> {
    let limits = PluginLimits {
        timeout: p.timeout,
        memory_bytes: p.memory,
        max_host_calls: p.max_host_calls,
        max_events: p.max_events,
        totals: crate::runtime::DeliveryTotals {
            kv_bytes: p.max_kv_bytes,
            event_bytes: p.max_event_bytes,
            log_bytes: p.max_log_bytes,
        },
        max_concurrency: p.max_concurrency,
        isolation: p.isolation(),
    };
    let plugin = Plugin::load(
        runtime,
        name,
        &p.path,
        p.sha256.as_deref(),
        limits,
        p.variables.clone(),
    )?
    .with_standard_exchange(p.standard_exchange.clone());
    tracing::info!(plugin = %name, version = plugin.version(), sha256 = plugin.digest(), world = plugin.world().label(), isolation = %plugin.isolation(), "plugin loaded");
    Ok(plugin)
}

/// Loads another build of plugin `name` (its shadow or canary) from `path`, pinned by
/// `sha256`, with the plugin's own settings and name.
fn load_build(
    runtime: &Arc<Runtime>,
    name: &str,
    p: &PluginConfig,
    path: &Path,
    sha256: &Option<String>,
) -> Result<Plugin, LoadError> {
    let mut settings = p.clone();
    settings.path = path.to_path_buf();
    settings.sha256 = sha256.clone();
    load_plugin(runtime, name, &settings)
}

/// Loads the live shadow of plugin `name`, if the config gives it one (`shadow`, pinned by
/// `shadow_sha256`), with the plugin's own settings and name (so it reads the same kv).
pub fn load_shadow(
    runtime: &Arc<Runtime>,
    name: &str,
    p: &PluginConfig,
) -> Result<Option<Plugin>, LoadError> {
    let Some(path) = &p.shadow else {
        return Ok(None);
    };
    let shadow = load_build(runtime, name, p, path, &p.shadow_sha256)?;
    tracing::info!(plugin = %name, shadow = shadow.version(), sample = p.shadow_sample, "live shadow loaded: compared, never committed or published");
    Ok(Some(shadow))
}

/// Loads the canary of plugin `name`, if the config gives it one, with the plugin's own
/// settings and name (so it reads and writes the same kv).
pub fn load_canary(
    runtime: &Arc<Runtime>,
    name: &str,
    p: &PluginConfig,
) -> Result<Option<Plugin>, LoadError> {
    let Some(canary) = &p.canary else {
        return Ok(None);
    };
    let plugin = load_build(runtime, name, p, &canary.path, &canary.sha256)?;
    tracing::info!(plugin = %name, canary = plugin.version(), percent = canary.percent, "canary loaded");
    Ok(Some(plugin))
}

/// Loads every plugin of the config (digests checked) into one runtime.
pub fn load_plugins(config: &Config) -> anyhow::Result<(Arc<Runtime>, Plugins)> {
    let runtime = new_runtime(config)?;
    let mut plugins = BTreeMap::new();
    for (name, p) in &config.plugins {
        let plugin = load_plugin(&runtime, name, p)?;
        plugins.insert(name.clone(), Arc::new(plugin));
    }
    Ok((runtime, plugins))
}
