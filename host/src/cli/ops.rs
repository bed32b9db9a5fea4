//! Operator commands: `run`, `check`, `migrate`, `relay`, `outbox status`.

use crate::broker::connect_any;
use crate::config::{self, Config};
use crate::gateway;
use crate::metrics::Metrics;
use crate::relay::Relay;
use crate::services;
use crate::services::broker_settings;
use crate::telemetry::Telemetry;
use crate::topology::declare_route;
use anyhow::Context;
use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// Loads and validates a config file, with the file's errors as they are.
pub fn load_config(path: &Path) -> anyhow::Result<Config> {
    Ok(config::load(path)?)
}

/// `carteiro run`; each item of `sighup` reloads `path`.
pub async fn run(
    path: &Path,
    shutdown: impl Future<Output = ()>,
    sighup: Option<tokio::sync::mpsc::UnboundedReceiver<()>>,
) -> anyhow::Result<i32> {
    let config = load_config(path)?;
    let options = gateway::LiveOptions {
        metrics: Arc::new(Metrics::default()),
        config_path: Some(path.to_owned()),
        signals: sighup,
        native_handlers: Default::default(),
    };
    gateway::run_live(config, options, shutdown).await?;
    Ok(0)
}

/// `carteiro check`: everything `run` would refuse, without consuming anything.
pub async fn check(path: &Path, no_environment: bool) -> anyhow::Result<i32> {
    let config = load_config(path)?;
    println!(
        "config   {} is valid ({} plugins, {} routes)",
        path.display(),
        config.plugins.len(),
        config.routes.len()
    );
    let (runtime, plugins) = services::load_plugins(&config)?;
    for (name, plugin) in &plugins {
        println!(
            "plugin   {name}: loads, sha256 {}; isolation {}",
            plugin.digest(),
            plugin.isolation()
        );
    }
    // What `run` refuses once the plugins are loaded: `batch` on a plugin without it.
    for route in &config.routes {
        if let Some(plugin) = plugins.get(route.plugin_name()) {
            crate::live::check_batch(route, plugin)?;
        }
    }
    for (name, p) in &config.plugins {
        if let Some(shadow) = services::load_shadow(&runtime, name, p)? {
            println!("shadow   {name}: loads, sha256 {}", shadow.digest());
        }
        if let Some(canary) = services::load_canary(&runtime, name, p)? {
            println!("canary   {name}: loads, sha256 {}", canary.digest());
        }
    }
    match (runtime.compile_cache_dir(), runtime.compile_cache_stats()) {
        (Some(dir), Some((hits, misses))) => println!(
            "cache    {}: {hits} compiled components reused, {misses} compiled and stored (the next start reuses them)",
            dir.display()
        ),
        _ => println!("cache    off: every start compiles every plugin"),
    }
    for warning in config::unauthenticated_connections(&config) {
        println!("warning  {warning}");
    }
    if no_environment {
        println!("skipped  broker and store (--no-environment)");
        return Ok(0);
    }
    let store = services::open_store(&config).await?;
    store.ping().await?;
    println!(
        "store    {} answers; migrations applied",
        store.redacted_url()
    );
    let seal = match (&config.security.seal_key, &config.security.seal_key_file) {
        (Some(_), _) => "[security] seal_key".to_owned(),
        (None, Some(file)) => format!("[security] seal_key_file {}", file.display()),
        (None, None) => "the store (carteiro_secrets)".to_owned(),
    };
    println!("seal     header-seal key from {seal}");
    let settings = broker_settings(&config, "carteiro check");
    // BrokerError already names the (redacted) URL; adding it again printed it twice.
    for opened in services::open_outboxes(&config).await? {
        let o = opened.config();
        println!(
            "outbox   {}: table {} checked (columns, types, grants), mode {:?}",
            o.name, o.table, o.mode
        );
    }
    let conn = connect_any(&settings.urls, &settings.connect).await?;
    for route in &config.routes {
        declare_route(&conn, &route.topology())
            .await
            .with_context(|| format!("route `{}`", route.queue))?;
        println!("route    {}: topology declared and verified", route.queue);
    }
    for dlq in &config.dead_letter_queues {
        // A failed passive declare closes its channel: one channel per look.
        let channel = conn.create_channel().await?;
        let queue = crate::topology::queue_state(&channel, &dlq.queue)
            .await
            .with_context(|| {
                format!(
                    "dead-letter queue `{}` ([[dead_letter_queues]]) does not exist; Carteiro \
                     declares nothing for it: declare it where its dead letters come from",
                    dlq.queue
                )
            })?;
        println!(
            "dlq      {}: exists ({} waiting), archived as route `{}`",
            dlq.queue,
            queue.message_count(),
            dlq.route_name()
        );
        let _ = channel.close(200, "looked".into()).await;
    }
    services::check_exchanges(&config, &conn).await?;
    for o in &config.outboxes {
        println!("outbox   {}: exchange `{}` exists", o.name, o.exchange);
    }
    let _ = conn.close(200, "check done".into()).await;
    println!("ok");
    Ok(0)
}

/// `carteiro migrate`.
pub async fn migrate(path: &Path) -> anyhow::Result<i32> {
    let config = load_config(path)?;
    let store = services::open_store(&config).await?;
    println!("migrations applied to {}", store.redacted_url());
    Ok(0)
}

/// `carteiro relay`: only the outbox relay.
pub async fn relay(path: &Path, shutdown: impl Future<Output = ()>) -> anyhow::Result<i32> {
    let config = load_config(path)?;
    tokio::pin!(shutdown);
    // Like the gateway, wait (with backoff) while the store refuses writes.
    let Some(crate::startup::Opened { store, .. }) =
        crate::startup::open_waiting(&config, &mut shutdown).await?
    else {
        return Ok(0);
    };
    let telemetry = Telemetry::start(&config.telemetry)?;
    let metrics = Arc::new(Metrics::default());
    let outboxes = services::outbox_relays(&config, &store, &metrics, &telemetry).await?;
    let relay = Relay::new(
        &config.broker,
        &config.relay,
        &config.store.url,
        store,
        metrics,
        None,
    )
    .with_telemetry(telemetry.clone());
    let stop = CancellationToken::new();
    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn(relay.run(stop.clone()));
    for outbox in outboxes {
        tasks.spawn(outbox.run(stop.clone()));
    }
    let ended = tokio::select! {
        () = &mut shutdown => None,
        Some(ended) = tasks.join_next() => Some(ended),
    };
    stop.cancel();
    let mut result = match ended {
        Some(ended) => ended.map_err(anyhow::Error::from).and_then(|r| r),
        None => Ok(()),
    };
    while let Some(ended) = tasks.join_next().await {
        if result.is_ok() {
            result = ended.map_err(anyhow::Error::from).and_then(|r| r);
        }
    }
    telemetry.shutdown().await;
    result?;
    Ok(0)
}

/// `carteiro outbox status`.
pub async fn outbox_status(path: &Path) -> anyhow::Result<i32> {
    let config = load_config(path)?;
    let store = services::open_store(&config).await?;
    let status = store.outbox_status().await?;
    println!("pending            {}", status.pending);
    match status.oldest_pending_age_ms {
        Some(ms) => println!("oldest pending age {:.1}s", ms as f64 / 1000.0),
        None => println!("oldest pending age -"),
    }
    println!("rows with errors   {}", status.with_errors);
    println!("leased (in flight) {}", status.leased);
    for opened in services::open_outboxes(&config).await? {
        print_app_status(&opened, &store).await?;
    }
    Ok(0)
}

/// The `[[outboxes]]` entry named `name`.
fn outbox_named<'a>(
    config: &'a Config,
    name: &str,
) -> anyhow::Result<&'a crate::relay::AppOutboxConfig> {
    config
        .outboxes
        .iter()
        .find(|o| o.name == name)
        .with_context(|| {
            let names: Vec<&str> = config.outboxes.iter().map(|o| o.name.as_str()).collect();
            format!(
                "no [[outboxes]] entry is named `{name}` (there are: {})",
                names.join(", ")
            )
        })
}

/// `carteiro outbox trigger NAME`.
pub fn outbox_trigger(path: &Path, name: &str) -> anyhow::Result<i32> {
    let config = load_config(path)?;
    let outbox = outbox_named(&config, name)?;
    anyhow::ensure!(
        outbox.url.starts_with("postgres"),
        "outbox {name} is on SQLite, which has no NOTIFY: the poll interval is what wakes it"
    );
    print!("{}", crate::relay::trigger_sql(outbox));
    Ok(0)
}

/// `carteiro outbox retry NAME ID...`.
pub async fn outbox_retry(path: &Path, name: &str, ids: &[i64]) -> anyhow::Result<i32> {
    let config = load_config(path)?;
    outbox_named(&config, name)?;
    let store = services::open_store(&config).await?;
    let released = store.app_outbox_forget(name, ids).await?;
    println!(
        "{released} of {} rows released: the relay tries them again at its next read",
        ids.len()
    );
    Ok(if released as usize == ids.len() { 0 } else { 1 })
}

/// One `[[outboxes]]` entry in `carteiro outbox status`.
async fn print_app_status(
    opened: &crate::relay::OpenedOutbox,
    store: &crate::store::Store,
) -> anyhow::Result<()> {
    let o = opened.config();
    let s = opened.status(store).await?;
    println!();
    println!("outbox {} ({}, table {})", o.name, s.mode_words(o), o.table);
    println!("  pending            {}", s.pending);
    match s.oldest_age_ms {
        Some(ms) => println!("  oldest pending age {:.1}s", ms as f64 / 1000.0),
        None => println!("  oldest pending age -"),
    }
    let parked = s.failures.iter().filter(|f| f.parked()).count();
    println!("  failing            {}", s.failures.len() - parked);
    println!("  parked             {parked}");
    println!(
        "  relay              {}",
        s.leader.as_deref().unwrap_or("none leads now")
    );
    if s.null_published > 0 {
        println!(
            "  WARNING            {} rows have a NULL {}: the relay never reads them; set it to false",
            s.null_published,
            o.columns.published.as_deref().unwrap_or_default()
        );
    }
    for f in &s.failures {
        let how = if f.parked() { "parked" } else { "retrying" };
        println!(
            "  row {} (event {}): {how} after {} attempts: {}",
            f.row_id, f.event_id, f.attempts, f.last_error
        );
    }
    if parked > 0 {
        println!(
            "  fix each parked row in the table, then: carteiro outbox retry -c FILE {} ID...",
            o.name
        );
    }
    Ok(())
}

/// Arguments of `carteiro publish`.
#[derive(Debug, clap::Args)]
pub struct PublishArgs {
    /// Exchange ("" is the default exchange: the routing key is then a queue name).
    #[arg(long, default_value = "")]
    pub exchange: String,
    /// Routing key.
    #[arg(long)]
    pub routing_key: String,
    /// AMQP message_id (the default idempotency key).
    #[arg(long)]
    pub message_id: Option<String>,
    /// Content type.
    #[arg(long, default_value = "application/json")]
    pub content_type: String,
    /// The body.
    #[arg(long)]
    pub body: String,
}

/// `carteiro publish`: one confirmed, mandatory publish to the config's broker (smoke tests).
pub async fn publish(path: &Path, args: PublishArgs) -> anyhow::Result<i32> {
    use crate::broker::{ConfirmedPublisher, Outgoing, PublisherOptions};
    let config = load_config(path)?;
    let settings = broker_settings(&config, "carteiro publish");
    let conn = Arc::new(connect_any(&settings.urls, &settings.connect).await?);
    let publisher = ConfirmedPublisher::open(conn, PublisherOptions { lanes: 1 }).await?;
    let mut properties = lapin::BasicProperties::default()
        .with_delivery_mode(2)
        .with_content_type(args.content_type.as_str().into());
    if let Some(id) = &args.message_id {
        properties = properties.with_message_id(id.as_str().into());
    }
    let outgoing = Outgoing {
        exchange: args.exchange.clone(),
        routing_key: args.routing_key.clone(),
        properties,
        body: args.body.into_bytes(),
        mandatory: true,
    };
    publisher
        .publish(outgoing, config.broker.publish_timeout)
        .await?;
    println!(
        "published to exchange {:?} with routing key {:?} (confirmed)",
        args.exchange, args.routing_key
    );
    Ok(0)
}
