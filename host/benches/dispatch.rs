//! One dispatch — fresh instance + `handle` + verdict — for the no-op plugin and for
//! `enrollment` with a 1 KB body. Reports medians and p99 over many iterations.
//!
//! Run: `scripts/build-plugins.sh && cargo bench -p carteiro --bench dispatch`

use carteiro::cli::MemoryKv;
use carteiro::runtime::{Message, Plugin, PluginLimits, Runtime};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn message(body: Vec<u8>) -> Message {
    Message {
        id: Some("bench".into()),
        exchange: "matriculas".into(),
        routing_key: "matricula.confirmada".into(),
        headers: Vec::new(),
        content_type: Some("application/json".into()),
        body,
        attempt: 1,
        redelivered: false,
    }
}

fn enrollment_body() -> Vec<u8> {
    // Pad the ids so the JSON body is about 1 KB, as in the issue's benchmark.
    let pad = "x".repeat(300);
    format!(r#"{{"matricula_id":"M-{pad}","usuario_id":"U-{pad}","curso_id":"C-{pad}"}}"#)
        .into_bytes()
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}

async fn measure(plugin: &Plugin, msg: &Message, iterations: usize) -> (Duration, Duration) {
    let kv: Arc<MemoryKv> = Arc::new(MemoryKv::default());
    for _ in 0..200 {
        let _ = plugin.handle(msg, kv.clone()).await;
    }
    let mut samples = Vec::with_capacity(iterations);
    for _ in 0..iterations {
        let started = Instant::now();
        let out = plugin.handle(msg, kv.clone()).await;
        samples.push(started.elapsed());
        assert!(out.is_ok(), "dispatch failed: {out:?}");
    }
    samples.sort();
    (percentile(&samples, 0.5), percentile(&samples, 0.99))
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/plugins");
    let runtime = Runtime::new(16).expect("runtime");
    let limits = PluginLimits {
        timeout: Duration::from_secs(5),
        memory_bytes: 64 << 20,
        max_host_calls: 10_000,
        max_events: 100,
        totals: carteiro::runtime::DeliveryTotals::default(),
    };
    let iterations = std::env::var("DISPATCH_ITERATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5_000);
    println!("dispatch: fresh instance + handle + verdict, {iterations} iterations each");
    for (name, body) in [("noop", b"{}".to_vec()), ("enrollment", enrollment_body())] {
        let path = dir.join(format!("{name}.wasm"));
        let plugin = Plugin::load(&runtime, name, &path, None, limits.clone(), BTreeMap::new())
            .unwrap_or_else(|e| panic!("{e} (run scripts/build-plugins.sh)"));
        let msg = message(body);
        let (median, p99) = measure(&plugin, &msg, iterations).await;
        println!(
            "{name:<12} body {:>5} B  median {:>8.2} µs  p99 {:>8.2} µs",
            msg.body.len(),
            median.as_secs_f64() * 1e6,
            p99.as_secs_f64() * 1e6
        );
    }
}
