//! A TCP proxy in front of a server that can stop forwarding (a blackholed network):
//! connections stay open and nothing answers. Shared by the e2e tests and the store's unit
//! tests (`host/src/store/tests/faults.rs` includes this file by path).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

pub struct Blackhole {
    /// The proxy's port on 127.0.0.1.
    pub port: u16,
    closed: Arc<AtomicBool>,
}

impl Blackhole {
    /// A proxy to `127.0.0.1:target`, forwarding until [`close`](Self::close).
    pub async fn start(target: u16) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let closed = Arc::new(AtomicBool::new(false));
        let hole = closed.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let hole = hole.clone();
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(("127.0.0.1", target)).await else {
                        return;
                    };
                    let (cr, cw) = client.into_split();
                    let (sr, sw) = server.into_split();
                    tokio::spawn(pump(cr, sw, hole.clone()));
                    tokio::spawn(pump(sr, cw, hole));
                });
            }
        });
        Self { port, closed }
    }

    /// A proxy in front of the server that `url` names (`scheme://...:port/...`), and `url`
    /// through it.
    pub async fn in_front_of(url: &str) -> (Self, String) {
        let port: u16 = url
            .rsplit_once(':')
            .and_then(|(_, rest)| rest.split('/').next())
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("no port in {url}"));
        let hole = Self::start(port).await;
        let proxied = url.replacen(&format!(":{port}/"), &format!(":{}/", hole.port), 1);
        assert_ne!(proxied, url, "the proxied URL names the proxy");
        (hole, proxied)
    }

    /// Holds every byte from now on; connections stay open.
    pub fn close(&self) {
        self.closed.store(true, Ordering::Relaxed);
    }

    /// Forwards again, held bytes first.
    pub fn open(&self) {
        self.closed.store(false, Ordering::Relaxed);
    }
}

/// Copies bytes while the hole is open; holds them while it is closed.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    hole: Arc<AtomicBool>,
) {
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(n) if n > 0 => n,
            // The end of a connection is held too: nothing crosses a blackholed network.
            _ => {
                while hole.load(Ordering::Relaxed) {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                return;
            }
        };
        while hole.load(Ordering::Relaxed) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
