//! The admin server's share of the store: at most a few of its requests use the store at
//! once, whatever arrives, so a flood of page loads or JSON reads (the dead-letter groups
//! are a GROUP BY over the archive) can never hold the pool's connections the pipeline
//! commits with. A request that waits too long for its turn gets `503` with `Retry-After`.

use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;

/// Admin requests served at once, at most (and at most half of `[store] max_connections`).
pub const AT_ONCE: usize = 2;
/// How long a request waits for its turn before `503`.
const WAIT: Duration = Duration::from_secs(5);

/// The permits of the admin server's requests.
pub struct ReadLimit {
    permits: Arc<Semaphore>,
    size: usize,
}

impl ReadLimit {
    /// [`AT_ONCE`], or half of the store's pool when that is smaller (at least one).
    pub fn for_pool(max_connections: Option<u32>) -> Self {
        let half = max_connections.map_or(AT_ONCE, |n| usize::try_from(n / 2).unwrap_or(1));
        let size = AT_ONCE.min(half).max(1);
        Self {
            permits: Arc::new(Semaphore::new(size)),
            size,
        }
    }
}

/// Requests that never touch the store: probes and the console's assets.
fn exempt(path: &str) -> bool {
    matches!(
        path,
        "/healthz" | "/readyz" | "/console.js" | "/console.css" | "/login"
    )
}

/// The middleware: one permit per request, held until its response is built.
pub async fn limit(State(limit): State<Arc<ReadLimit>>, request: Request, next: Next) -> Response {
    if exempt(request.uri().path()) {
        return next.run(request).await;
    }
    match tokio::time::timeout(WAIT, limit.permits.clone().acquire_owned()).await {
        Ok(Ok(_permit)) => next.run(request).await,
        _ => (
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::RETRY_AFTER, "2")],
            format!(
                "503 Service Unavailable: the admin server is busy ({} requests on the store at \
                 once at most, so that the pipeline always has connections); retry shortly\n",
                limit.size
            ),
        )
            .into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_share_is_small_and_never_zero() {
        assert_eq!(ReadLimit::for_pool(None).size, AT_ONCE);
        assert_eq!(ReadLimit::for_pool(Some(8)).size, AT_ONCE);
        assert_eq!(ReadLimit::for_pool(Some(2)).size, 1);
        assert_eq!(ReadLimit::for_pool(Some(1)).size, 1);
    }
}
