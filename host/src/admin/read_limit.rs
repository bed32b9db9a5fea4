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
    /// `/metrics`' own permit when the pool has room for it, else the requests' permits.
    scrape: Arc<Semaphore>,
}

impl ReadLimit {
    /// [`AT_ONCE`], or less so that the requests and one scrape together use at most half of
    /// the store's pool (at least one; a pool of fewer than 4 connections has no room for a
    /// scrape's own permit, and a scrape then tries the requests' one).
    pub fn for_pool(max_connections: Option<u32>) -> Self {
        let half = max_connections.map_or(AT_ONCE + 1, |n| usize::try_from(n / 2).unwrap_or(1));
        let size = AT_ONCE.min(half.saturating_sub(1)).max(1);
        let permits = Arc::new(Semaphore::new(size));
        let scrape = if half > size {
            Arc::new(Semaphore::new(1))
        } else {
            permits.clone()
        };
        Self {
            permits,
            size,
            scrape,
        }
    }
}

/// Requests that never touch the store: probes, the console's assets, and a reload (the
/// gateway's supervisor runs it; the request only waits for its report). Such a request must
/// never queue behind reads anyone on loopback can make.
fn exempt(path: &str) -> bool {
    matches!(
        path,
        "/healthz" | "/readyz" | "/console.js" | "/console.css" | "/login" | "/admin/reload"
    )
}

/// Whether a `/metrics` request may read the store (the outbox gauges): it had a permit at
/// once. A scrape never waits for one: without it, the gauges keep their last values.
#[derive(Debug, Clone, Copy)]
pub struct StoreTurn(pub bool);

/// The middleware: one permit per request, held until its response is built; `/metrics` takes
/// its own permit if it is free, and never waits ([`StoreTurn`]).
pub async fn limit(
    State(limit): State<Arc<ReadLimit>>,
    mut request: Request,
    next: Next,
) -> Response {
    let path = request.uri().path();
    if exempt(path) {
        return next.run(request).await;
    }
    if path == "/metrics" {
        let turn = limit.scrape.clone().try_acquire_owned().ok();
        request.extensions_mut().insert(StoreTurn(turn.is_some()));
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
    use axum::Router;
    use axum::extract::Extension;
    use axum::routing::{get, post};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[test]
    fn the_share_is_small_and_never_zero() {
        let sizes = |n| {
            let limit = ReadLimit::for_pool(n);
            (limit.size, Arc::ptr_eq(&limit.permits, &limit.scrape))
        };
        assert_eq!(sizes(None), (AT_ONCE, false));
        assert_eq!(sizes(Some(8)), (AT_ONCE, false));
        assert_eq!(sizes(Some(4)), (1, false));
        assert_eq!(sizes(Some(2)), (1, true));
        assert_eq!(sizes(Some(1)), (1, true));
    }

    /// The status of `method path` on the server at `port`, bounded (the wait for a permit
    /// is 5 s).
    async fn status(port: u16, method: &str, path: &str) -> String {
        let ask = async {
            let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
            let request = format!(
                "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\n\
                 Connection: close\r\n\r\n"
            );
            stream.write_all(request.as_bytes()).await?;
            let mut response = String::new();
            stream.read_to_string(&mut response).await?;
            std::io::Result::Ok(response)
        };
        let response = tokio::time::timeout(Duration::from_secs(30), ask)
            .await
            .expect("an answer within 30 s")
            .expect("an HTTP exchange");
        let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
        let status = head.split(' ').nth(1).unwrap_or("?");
        format!("{status} {}", body.trim())
    }

    /// With every request permit held (reads anyone on loopback can make), a reload and a
    /// scrape are still answered at once; a read waits and gets 503. A second scrape while
    /// one holds the scrape permit is answered too, without reading the store.
    #[tokio::test]
    async fn scrapes_and_reloads_do_not_wait_for_reads() {
        let limit = Arc::new(ReadLimit::for_pool(Some(8)));
        let turn = |Extension(StoreTurn(turn)): Extension<StoreTurn>| async move {
            if turn {
                "metrics read the store"
            } else {
                "metrics kept last values"
            }
        };
        let app = Router::new()
            .route("/metrics", get(turn))
            .route("/admin/reload", post(|| async { "reloaded" }))
            .route("/dlq", get(|| async { "read" }))
            .layer(axum::middleware::from_fn_with_state(
                limit.clone(),
                limit_fn,
            ));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = tokio::spawn(async move { axum::serve(listener, app).await });

        let held = limit
            .permits
            .clone()
            .acquire_many_owned(AT_ONCE as u32)
            .await;
        assert_eq!(status(port, "POST", "/admin/reload").await, "200 reloaded");
        assert_eq!(
            status(port, "GET", "/metrics").await,
            "200 metrics read the store"
        );
        let scraping = limit.scrape.clone().try_acquire_owned().unwrap();
        assert_eq!(
            status(port, "GET", "/metrics").await,
            "200 metrics kept last values"
        );
        drop(scraping);
        assert!(status(port, "GET", "/dlq").await.starts_with("503 "));
        drop(held);
        assert_eq!(status(port, "GET", "/dlq").await, "200 read");
        server.abort();
    }

    /// [`limit`] as a middleware function of the test router.
    async fn limit_fn(state: State<Arc<ReadLimit>>, request: Request, next: Next) -> Response {
        limit(state, request, next).await
    }
}
