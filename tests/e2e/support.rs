//! Shared helpers: real plugins, real services, unique names, bounded waits.

use carteiro::config::{self, Config};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Where `scripts/build-plugins.sh` puts the components.
pub fn plugins_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/plugins")
}

/// A built plugin; fails with the command to run when it is missing.
pub fn plugin(name: &str) -> PathBuf {
    let path = plugins_dir().join(format!("{name}.wasm"));
    assert!(
        path.is_file(),
        "{} is missing: run scripts/build-plugins.sh first",
        path.display()
    );
    path
}

/// The test broker; fails (never skips) when it is not configured.
pub fn amqp_url() -> String {
    std::env::var("CARTEIRO_TEST_AMQP_URL").unwrap_or_else(|_| {
        panic!("CARTEIRO_TEST_AMQP_URL is not set: run `scripts/rabbitmq.sh start` and export the URL it prints (scripts/test.sh does both)")
    })
}

/// A unique, readable name for queues and files.
pub fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::now_v7().simple())
}

/// Polls `check` until it returns `Some`, failing after `timeout` with `what`.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out after {timeout:?} waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Writes `toml` into a fresh temp dir and loads it like `carteiro run -c` would.
pub fn load_config(dir: &Path, toml: &str) -> Config {
    let path = dir.join("carteiro.toml");
    std::fs::write(&path, toml).expect("write config");
    config::load(&path).unwrap_or_else(|e| panic!("test config invalid: {e}"))
}
