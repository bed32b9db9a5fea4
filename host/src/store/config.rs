//! `[store]`: the database's settings and the checks that concern only them. `config`
//! interpolates `${VAR}` in the URL first.

use serde::Deserialize;
use std::path::Path;
use std::time::Duration;

/// `[store]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoreConfig {
    /// `sqlite://PATH` (relative to the config file) or `postgres://...`; `${VAR}` allowed.
    #[serde(default = "default_store_url")]
    pub url: String,
    /// Connection pool size.
    #[serde(default = "default_max_connections")]
    pub max_connections: u32,
    /// How long idempotency records are kept (a redelivery older than this runs again).
    #[serde(default = "default_inbox_retention", with = "humantime_serde")]
    pub inbox_retention: Duration,
    /// Most deliveries committed in one database transaction (group commit).
    #[serde(default = "default_commit_batch")]
    pub commit_batch: usize,
    /// Longest a statement may run. On PostgreSQL every connection sets it as its
    /// `statement_timeout` (an overrun is SQLSTATE 57014: the store counts as unavailable,
    /// the delivery is requeued). On both backends every store operation (a commit batch, a
    /// batched read, a relay claim, ...) is also abandoned client-side after this plus 5 s,
    /// so a database that stops answering cannot hang commits.
    #[serde(default = "default_statement_timeout", with = "humantime_serde")]
    pub statement_timeout: Duration,
}

fn default_store_url() -> String {
    "sqlite://carteiro.db".to_owned()
}
fn default_max_connections() -> u32 {
    8
}
fn default_inbox_retention() -> Duration {
    Duration::from_secs(7 * 24 * 3600)
}
fn default_commit_batch() -> usize {
    256
}
fn default_statement_timeout() -> Duration {
    Duration::from_secs(30)
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            url: default_store_url(),
            max_connections: default_max_connections(),
            inbox_retention: default_inbox_retention(),
            commit_batch: default_commit_batch(),
            statement_timeout: default_statement_timeout(),
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
fn resolve_sqlite_path(url: &str, base_dir: &Path) -> String {
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
