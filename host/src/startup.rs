//! Start-up before the store takes writes: a gateway restarted during a read-only window or
//! behind a long SQLite lock must not exit. It opens the store (connect, migrations, the
//! header-seal key) with backoff for as long as the failure is the store's trouble, and
//! meanwhile answers its admin address: `/healthz` 200, `/readyz` and the rest 503.

use crate::broker::seal::SealKey;
use crate::common::retry;
use crate::config::Config;
use crate::store::{Store, StoreError, StoreOptions};
use axum::Router;
use axum::http::StatusCode;
use axum::routing::get;
use std::future::Future;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// What start-up waits for: the store, migrated, and its header-seal key.
pub struct Opened {
    pub store: Store,
    pub seal: SealKey,
}

/// One try: connect, migrate, read (or create) the seal key; `seal_secret`: the key
/// `[security]` gives instead of the store's.
pub async fn open(config: &Config, seal_secret: Option<&[u8]>) -> Result<Opened, StoreError> {
    let options = StoreOptions {
        max_connections: config.store.max_connections,
        statement_timeout: config.store.statement_timeout,
    };
    let mut store = Store::connect_with(&config.store.url, &options).await?;
    store.migrate().await?;
    if let Some(secret) = seal_secret {
        store = store.with_header_seal_secret(secret.to_vec());
    }
    let secrets = store.header_seal_secrets().await?;
    let seal = SealKey::with_retired(&secrets.current, &secrets.verifying());
    Ok(Opened { store, seal })
}

/// How often a running gateway reads the header-seal keyring again, so a rotation
/// (`carteiro seal rotate`) reaches it without a restart.
pub const KEYRING_REFRESH: Duration = Duration::from_secs(30);

/// How long after `carteiro seal rotate` its new key starts sealing (it verifies at once):
/// one [`KEYRING_REFRESH`], so every running gateway has read it by then, and as much again
/// for a slow read or a busy gateway.
pub const SEAL_KEY_ACTIVATION: Duration = Duration::from_secs(2 * KEYRING_REFRESH.as_secs());

/// Keeps `seal` equal to the store's keyring until `stop`, and lets it read the keyring
/// again when a seal names a key it does not know (`SealKey::learn_unknown_key`). A failed
/// read keeps the keys it has: copies sealed with a key it does not know yet still count
/// their attempts (see `pipeline::received`).
pub async fn refresh_keyring(store: Store, seal: SealKey, stop: CancellationToken) {
    let reader = store.clone();
    seal.reread_with(std::sync::Arc::new(move || {
        let store = reader.clone();
        Box::pin(async move {
            read_keyring(&store)
                .await
                .map(|s| (s.current.clone(), s.verifying()))
        })
    }));
    let mut tick = tokio::time::interval(KEYRING_REFRESH);
    tick.tick().await;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = stop.cancelled() => return,
        }
        if let Some(secrets) = read_keyring(&store).await {
            let before = seal.current_id();
            seal.update(&secrets.current, &secrets.verifying());
            let now = seal.current_id();
            if now != before {
                tracing::info!(key = %now, retired = secrets.retired.len(), "header-seal key rotated: sealing with the new key");
            }
        }
    }
}

async fn read_keyring(store: &Store) -> Option<crate::store::SealSecrets> {
    store
        .header_seal_keyring()
        .await
        .inspect_err(|e| tracing::warn!(error = %e, "could not read the header-seal keys; keeping the ones in use"))
        .ok()
}

/// [`open`] until it succeeds, while each failure is transient (the store's trouble, not a
/// bad URL or schema); `None` when `shutdown` comes first.
pub async fn open_waiting(
    config: &Config,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<Option<Opened>> {
    // A bad [security] key is the config's fault: fail at once, never wait for it.
    let seal_secret = crate::services::security_seal(config)?;
    tokio::pin!(shutdown);
    let mut backoff = retry::STORE_PATIENT.backoff();
    let mut tries = 0u32;
    loop {
        tries += 1;
        match open(config, seal_secret.as_deref()).await {
            Ok(opened) => {
                if tries > 1 {
                    tracing::info!(tries, "store takes writes: starting the routes");
                }
                return Ok(Some(opened));
            }
            Err(e) if e.is_transient() => {
                let wait = backoff.next_delay();
                tracing::error!(error = %e, tries, retry_in = ?wait, store = %crate::redact::redact_url(&config.store.url), "store not ready at start-up (refusing writes or unreachable): not ready, waiting for it");
                tokio::select! {
                    () = tokio::time::sleep(wait) => {}
                    () = &mut shutdown => return Ok(None),
                }
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Answers the admin address while start-up waits, until `done`: healthy (the process runs
/// and keeps trying), not ready. Says nothing about why: the log does.
pub async fn serve_waiting(listener: tokio::net::TcpListener, done: CancellationToken) {
    let app = Router::new()
        .route("/healthz", get(|| async { "ok: starting\n" }))
        .fallback(|| async {
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "not ready: the gateway is starting and waits for its store\n",
            )
        });
    let served = axum::serve(listener, app)
        .with_graceful_shutdown(async move { done.cancelled().await })
        .await;
    if let Err(e) = served {
        tracing::warn!(error = %e, "the start-up admin responder stopped");
    }
}
