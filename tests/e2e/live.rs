//! Issue 14, changing handlers live, with the real binary, broker and store:
//! - `reload`: SIGHUP and `POST /admin/reload` — a plugin swapped under load with nothing
//!   lost or run twice; broken configs and mismatched digests refused while the old version
//!   keeps serving; routes added and removed.
//! - `shadow_replay`: `dlq replay --shadow` over dead letters of a buggy version reports exactly what
//!   the fixed one acks and changes nothing; `--only-acked-by` replays exactly those.
//! - `canary`: a canary failing a fifth of its deliveries rolls back by itself; a healthy
//!   one takes its share by key hash and is promoted by `carteiro canary promote`.
//! - `traffic`: a live shadow counts agreements and disagreements by kind on a known mix.
//!
//! Helpers: plugin versions that differ only in their bytes (a custom section appended, so
//! the digest differs and the behaviour does not), a free admin port, a minimal HTTP client,
//! and the per-delivery log lines (`delivery settled`, JSON) that name the digest each
//! delivery ran with.

mod canary;
mod reload;
mod shadow_replay;
mod traffic;

use crate::resilience::{Running, carteiro};
use crate::support::http_exchange;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Copies the built plugin `name` to `dir/file`, with a custom section named `label`
/// appended when given (a valid component with another digest, same behaviour).
pub fn plugin_version(name: &str, dir: &Path, file: &str, label: Option<&str>) -> PathBuf {
    let mut bytes = std::fs::read(crate::support::plugin(name)).expect("read plugin");
    if let Some(label) = label {
        let mut section = Vec::new();
        leb128(&mut section, label.len());
        section.extend_from_slice(label.as_bytes());
        section.extend_from_slice(b"a different build of the same handler");
        bytes.push(0);
        leb128(&mut bytes, section.len());
        bytes.extend_from_slice(&section);
    }
    let path = dir.join(file);
    std::fs::write(&path, bytes).expect("write plugin version");
    path
}

fn leb128(out: &mut Vec<u8>, mut n: usize) {
    loop {
        let byte = (n & 0x7f) as u8;
        n >>= 7;
        if n == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

/// SHA-256 of a file (hex).
pub fn sha256_of(path: &Path) -> String {
    hex::encode(Sha256::digest(std::fs::read(path).expect("read")))
}

/// A loopback port nobody listens on (bound and released).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// The admin token the live tests' configs set (`[admin] token`); [`http`] sends it.
pub const ADMIN_TOKEN: &str = "e2e-admin-token";

/// One HTTP/1.1 request without a body, with the tests' bearer token; returns the status
/// and the body.
pub async fn http(port: u16, method: &str, path: &str) -> (u16, String) {
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {ADMIN_TOKEN}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    );
    let what = format!("{method} {path}");
    let (status, _, body) = http_exchange(port, &request, Duration::from_secs(120), &what).await;
    (status, body)
}

/// `carteiro --log-json run -c CONFIG` with per-delivery debug lines from the pipeline.
pub fn spawn_gateway(config: &Path) -> Running {
    let mut cmd = carteiro();
    cmd.env("CARTEIRO_LOG", "info,carteiro::pipeline::process=debug")
        .args(["--log-json", "run", "-c"])
        .arg(config);
    Running::spawn(cmd)
}

/// From the gateway's JSON log: for each message id, the sha256 of every `delivery
/// settled` line (one per settled delivery) and its outcome.
pub fn settled(stderr: &str) -> BTreeMap<String, Vec<(String, String)>> {
    let mut out: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
    for line in stderr.lines() {
        let Ok(value) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if value["fields"]["message"] != "delivery settled" {
            continue;
        }
        let id = value["span"]["messaging.message.id"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let sha = value["fields"]["sha256"].as_str().unwrap_or_default();
        let outcome = value["fields"]["outcome"].as_str().unwrap_or_default();
        out.entry(id)
            .or_default()
            .push((sha.to_owned(), outcome.to_owned()));
    }
    out
}

/// The value of the Prometheus sample `name{labels}` (labels in exposition order), 0 if
/// absent.
pub fn sample(metrics: &str, name_and_labels: &str) -> f64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name_and_labels)?.trim().parse().ok())
        .unwrap_or(0.0)
}
