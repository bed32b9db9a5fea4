//! `[store]`: the database's settings and the checks that concern only them. `config`
//! interpolates `${VAR}` in the URL first.

use serde::Deserialize;
use std::path::Path;
use std::time::Duration;

/// `[store]`
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StoreConfig {
    /// `sqlite://PATH` (relative to the config file) or `postgres://...`; `${VAR}` allowed.
    pub url: String,
    /// Connection pool size.
    pub max_connections: u32,
    /// How long idempotency records are kept (a redelivery older than this runs again).
    #[serde(with = "humantime_serde")]
    pub inbox_retention: Duration,
    /// Most deliveries committed in one database transaction (group commit).
    pub commit_batch: usize,
    /// Longest a statement may run. On PostgreSQL every connection sets it as its
    /// `statement_timeout` (an overrun is SQLSTATE 57014: the store counts as unavailable,
    /// the delivery is requeued). On both backends every store operation (a commit batch, a
    /// batched read, a relay claim, ...) is also abandoned client-side after this plus 5 s,
    /// so a database that stops answering cannot hang commits.
    #[serde(with = "humantime_serde")]
    pub statement_timeout: Duration,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            url: "sqlite://carteiro.db".to_owned(),
            max_connections: 8,
            inbox_retention: Duration::from_secs(7 * 24 * 3600),
            commit_batch: 256,
            statement_timeout: Duration::from_secs(30),
        }
    }
}

impl StoreConfig {
    /// Resolves a relative SQLite path against `base_dir`, checks the URL's TLS parameters
    /// and the limits. `Err((key, message))` with the key under `store`.
    pub fn validate(&mut self, base_dir: &Path) -> Result<(), (&'static str, String)> {
        self.url = resolve_sqlite_path(&self.url, base_dir);
        self.url =
            super::check_tls_params(&self.url, base_dir).map_err(|m| ("url", m.to_string()))?;
        if self.commit_batch == 0 {
            return Err(("commit_batch", "must be at least 1".into()));
        }
        if self.statement_timeout.is_zero() {
            return Err((
                "statement_timeout",
                "must be above zero (it also bounds every store operation client-side)".into(),
            ));
        }
        Ok(())
    }
}

/// `sqlite://relative.db` is relative to the config file, like plugin paths.
pub(crate) fn resolve_sqlite_path(url: &str, base_dir: &Path) -> String {
    match url.strip_prefix("sqlite://") {
        Some(rest) if !rest.starts_with('/') && !rest.starts_with(':') => {
            let path = base_dir.join(rest);
            // Absolute, so the URL means the same file whatever the working directory.
            let path = std::path::absolute(&path).unwrap_or(path);
            format!("sqlite://{}", path.display())
        }
        _ => url.to_owned(),
    }
}
