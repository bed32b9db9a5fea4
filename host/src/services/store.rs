//! Opening the store (connect, migrate, the header-seal key from `[security]` or the store)
//! for the CLI and the admin server; `startup` opens it for a gateway, waiting while it
//! refuses writes.

use crate::broker::redact_url;
use crate::broker::seal::SealKey;
use crate::config::Config;
use crate::store::{Store, StoreOptions};
use anyhow::Context;

/// Connects the store, applies migrations, and takes the header-seal key from
/// `[security]` when it is set there.
pub async fn open_store(config: &Config) -> anyhow::Result<Store> {
    let options = StoreOptions {
        max_connections: config.store.max_connections,
        statement_timeout: config.store.statement_timeout,
    };
    let store = Store::connect_with(&config.store.url, &options)
        .await
        .with_context(|| format!("cannot open the store at {}", redact_url(&config.store.url)))?;
    store
        .migrate()
        .await
        .context("cannot apply database migrations")?;
    Ok(match security_seal(config)? {
        Some(secret) => store.with_header_seal_secret(secret),
        None => store,
    })
}

/// The header-seal key `[security]` gives (`seal_key` or `seal_key_file`), if it does.
pub fn security_seal(config: &Config) -> anyhow::Result<Option<Vec<u8>>> {
    let seal = config
        .security
        .seal_secret()
        .map_err(|(key, m)| anyhow::anyhow!("[security] {key}: {m}"))?;
    if let Some(path) = &config.security.seal_key_file
        && let Some(mode) = crate::common::loose_permissions(path)
    {
        tracing::warn!(
            path = %path.display(),
            mode = format!("{mode:o}"),
            "the seal key file can be read by other users: chmod 600 it"
        );
    }
    Ok(seal)
}

/// The key that seals Carteiro's headers: `[security]`'s (through [`open_store`]), else the
/// one shared through the store by every gateway on it.
pub async fn seal_key(store: &Store) -> anyhow::Result<SealKey> {
    let secrets = store
        .header_seal_secrets()
        .await
        .context("cannot read the header-seal key from the store")?;
    Ok(SealKey::with_retired(
        &secrets.current,
        &secrets.verifying(),
    ))
}
