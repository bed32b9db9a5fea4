//! `carteiro run`: load everything, start every route, the relay and the admin server, and
//! stop cleanly when `shutdown` resolves (mini-redis style `run(config, shutdown)`).

use crate::admin::GatewayHandle;
use crate::broker::redact_url;
use crate::config::Config;
use crate::live::{Shared, Supervisor};
use crate::metrics::Metrics;
use crate::pipeline::{RouteDeps, StoreGate};
use crate::runtime::Plugin;
use crate::runtime::native::NativeHandler;
use crate::services::load_plugins;
use crate::store::{BatchedReads, GroupCommitter};
use anyhow::Context;
use std::collections::BTreeMap;
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// How [`run_live`] is started.
pub struct LiveOptions {
    /// Where the metrics go (tests read them).
    pub metrics: Arc<Metrics>,
    /// The config file a reload reads again; `None`: reloads are refused.
    pub config_path: Option<PathBuf>,
    /// One item per SIGHUP (`main.rs` installs the handler); each asks for a reload.
    pub signals: Option<tokio::sync::mpsc::UnboundedReceiver<()>>,
    /// Plugins of the config to run natively instead of their component, by name (the
    /// pipeline benchmark's measure of the sandbox's cost; empty everywhere else). The
    /// config file cannot ask for this.
    pub native_handlers: BTreeMap<String, Arc<dyn NativeHandler>>,
}

/// Runs the gateway until `shutdown` resolves or a route fails for good.
pub async fn run(config: Config, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
    run_with_metrics(config, Arc::new(Metrics::default()), shutdown).await
}

/// [`run`], recording into the caller's metrics (tests read them).
pub async fn run_with_metrics(
    config: Config,
    metrics: Arc<Metrics>,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let options = LiveOptions {
        metrics,
        config_path: None,
        signals: None,
        native_handlers: BTreeMap::new(),
    };
    run_live(config, options, shutdown).await
}

/// Runs the gateway until `shutdown` resolves or a route fails for good, reloading the
/// config file on SIGHUP and `POST /admin/reload` (see `live`).
pub async fn run_live(
    config: Config,
    options: LiveOptions,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let metrics = options.metrics;
    let (runtime, mut plugins) = load_plugins(&config)?;
    runtime.count_instances_in(metrics.clone());
    for (name, handler) in options.native_handlers {
        let Some(loaded) = plugins.get_mut(&name) else {
            anyhow::bail!("no plugin `{name}` in the config to run natively");
        };
        let variables = config
            .plugins
            .get(&name)
            .map(|p| p.variables.clone())
            .unwrap_or_default();
        let native = Plugin::native(&runtime, &name, handler, loaded.limits().clone(), variables);
        tracing::warn!(plugin = %name, "running a native handler instead of the component: no sandbox");
        *loaded = Arc::new(native);
    }
    tokio::pin!(shutdown);
    // Bound first, so the admin address answers (healthy, not ready) while the store waits.
    let admin_listener = match config.admin.listen.as_str() {
        "" => None,
        listen => Some(
            tokio::net::TcpListener::bind(listen)
                .await
                .with_context(|| format!("cannot listen on admin address {listen}"))?
                .into_std()?,
        ),
    };
    let starting = CancellationToken::new();
    let responder = match &admin_listener {
        Some(listener) => {
            let clone = tokio::net::TcpListener::from_std(listener.try_clone()?)?;
            Some(tokio::spawn(crate::startup::serve_waiting(
                clone,
                starting.clone(),
            )))
        }
        None => None,
    };
    let opened = crate::startup::open_waiting(&config, &mut shutdown)
        .await
        .with_context(|| format!("cannot open the store at {}", redact_url(&config.store.url)))?;
    starting.cancel();
    if let Some(responder) = responder {
        let _ = responder.await;
    }
    let Some(crate::startup::Opened { store, seal }) = opened else {
        tracing::info!("shut down while waiting for the store");
        return Ok(());
    };
    let committer = GroupCommitter::spawn(store.clone(), config.store.commit_batch);
    let reads = BatchedReads::spawn(store.clone());
    let gate = StoreGate::new(store.clone(), metrics.clone());
    let stop = CancellationToken::new();
    let alerts = Arc::new(crate::alerts::DeadLetterAlerts::new(metrics.clone()));
    alerts.set_rules(&config.routes, &config.dead_letter_queues);
    let telemetry = crate::telemetry::Telemetry::start(&config.telemetry)?;

    let canaries = crate::pipeline::canary_decisions::CanaryDecisions::load(store.clone())
        .await
        .context("cannot read canary decisions from the store")?;
    let mut tasks = tokio::task::JoinSet::new();
    {
        let (canaries, stop) = (canaries.clone(), stop.clone());
        tasks.spawn(async move {
            canaries.run(stop).await;
            Ok(())
        });
    }
    let deps = RouteDeps::new(
        store.clone(),
        committer.clone(),
        reads.clone(),
        gate.clone(),
        metrics.clone(),
        seal.clone(),
    )
    .with_telemetry(telemetry.clone());
    let shared = Shared {
        canaries,
        alerts: alerts.clone(),
        runtime,
        deps,
    };
    let (supervisor, live) =
        Supervisor::start(shared, config.clone(), plugins, options.config_path, &stop)?;
    let retention = Arc::new(crate::housekeeping::RetentionStatus::new(
        config.retention(),
    ));
    let handle = GatewayHandle {
        metrics: metrics.clone(),
        store: store.clone(),
        gate: gate.clone(),
        alerts: alerts.clone(),
        live: live.clone(),
        retention: retention.clone(),
    };
    tasks.spawn(supervisor.run());
    if let Some(signals) = options.signals {
        tasks.spawn(crate::live::forward_signals(signals, live, stop.clone()));
    }
    if config.relay.enabled {
        let relay = crate::relay::Relay::new(
            &config.broker,
            &config.relay,
            &config.store.url,
            store.clone(),
            metrics.clone(),
            Some(committer.outbox_committed()),
        )
        .with_handoff(committer.handoff(), &config.relay)
        .with_telemetry(telemetry.clone());
        let stop = stop.clone();
        tasks.spawn(async move { relay.run(stop).await });
    }
    for outbox in crate::services::outbox_relays(&config, &store, &metrics, &telemetry).await? {
        let stop = stop.clone();
        tasks.spawn(async move { outbox.run(stop).await });
    }
    tasks.spawn(crate::alerts::run(alerts, store.clone(), stop.clone()));
    for dlq in &config.dead_letter_queues {
        let deps = crate::foreign_dlq::Deps {
            broker: crate::services::broker_settings(&config, "carteiro dead-letter archive"),
            store: store.clone(),
            gate: gate.clone(),
            metrics: metrics.clone(),
        };
        tasks.spawn(crate::foreign_dlq::run(dlq.clone(), deps, stop.clone()));
    }
    {
        let (store, seal, stop) = (store.clone(), seal.clone(), stop.clone());
        tasks.spawn(async move {
            crate::startup::refresh_keyring(store, seal, stop).await;
            Ok(())
        });
    }
    tasks.spawn(crate::housekeeping::run(
        retention,
        store.clone(),
        metrics.clone(),
        stop.clone(),
    ));
    if let Some(listener) = admin_listener {
        let listener = tokio::net::TcpListener::from_std(listener)?;
        tracing::info!(address = %config.admin.listen, "admin server listening");
        let stop = stop.clone();
        tasks.spawn(crate::admin::serve(
            listener,
            handle.clone(),
            config.admin.clone(),
            stop,
        ));
    }
    tracing::info!(routes = config.routes.len(), broker = %redact_url(&config.broker.url), store = %store.redacted_url(), "gateway running");
    for warning in crate::config::unauthenticated_connections(&config) {
        tracing::warn!("{warning}");
    }

    let (mut result, by_signal) = tokio::select! {
        _ = &mut shutdown => {
            tracing::info!("shutting down: finishing in-flight deliveries");
            (Ok(()), true)
        }
        Some(joined) = tasks.join_next() => (match joined {
            Ok(Err(e)) => Err(e),
            Ok(Ok(())) => Ok(()),
            Err(e) => Err(anyhow::anyhow!("a gateway task panicked: {e}")),
        }, false),
    };
    stop.cancel();
    while let Some(joined) = tasks.join_next().await {
        if let Ok(Err(e)) = joined {
            // A task that failed for good cancels `stop` itself, so another task may have
            // ended cleanly first: without a signal, the failure is the gateway's result.
            if !by_signal && result.is_ok() {
                result = Err(e);
            } else {
                tracing::warn!(error = %e, "task ended with an error during shutdown");
            }
        }
    }
    // Every delivery and relay task has ended: their spans are finished; send them.
    telemetry.shutdown().await;
    result
}
