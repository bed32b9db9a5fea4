//! One dispatch — instance + `handle` + verdict — for the no-op plugin and for the
//! enrollment handler in Rust, Python and JavaScript with a 1 KB body. Reports medians and
//! p99 over many iterations, each plugin's load time with an empty and with a warm compile
//! cache, and this process's resident memory after each plugin ran. Each plugin is measured
//! twice: through `Plugin::handle` as the pipeline calls it (the guest runs on a compute
//! thread: one wake-up there and one back per call), and in place (`handle_in_place`: the
//! instance, the call and the teardown alone). And each plugin twice over: with a fresh
//! instance per call (`isolation = "per-delivery"`, the default) and with one instance
//! reused for `BENCH_REUSE` calls (`"per-batch"`, default 64), row beside row.
//!
//! Run: `scripts/build-plugins.sh && scripts/build-lang-plugins.sh &&
//! cargo bench -p carteiro --bench dispatch` (`DISPATCH_ITERATIONS`, default 5,000; the
//! Python and JS rows use a tenth of that; `DISPATCH_PLUGINS=noop,enrollment` picks plugins,
//! `DISPATCH_ISOLATION=per-batch` one isolation, `BENCH_REUSE=N` the calls per instance).

use carteiro::cli::MemoryKv;
use carteiro::runtime::{Isolation, Message, Plugin, PluginLimits, Runtime};
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

/// Median and p99 of `iterations` calls; `in_place`: [`Plugin::handle_in_place`] (the
/// instance alone, on this thread) instead of [`Plugin::handle`] (what the pipeline calls:
/// a hop to a compute thread and back).
async fn measure(
    plugin: &Plugin,
    msg: &Message,
    iterations: usize,
    in_place: bool,
) -> (Duration, Duration) {
    let kv: Arc<MemoryKv> = Arc::new(MemoryKv::default());
    let call = |kv: Arc<MemoryKv>| async move {
        if in_place {
            plugin.handle_in_place(msg, kv).await
        } else {
            plugin.handle(msg, kv).await
        }
    };
    for _ in 0..200 {
        let _ = call(kv.clone()).await;
    }
    let mut samples = Vec::with_capacity(iterations);
    for _ in 0..iterations {
        let started = Instant::now();
        let out = call(kv.clone()).await;
        samples.push(started.elapsed());
        assert!(out.is_ok(), "dispatch failed: {out:?}");
    }
    samples.sort();
    (percentile(&samples, 0.5), percentile(&samples, 0.99))
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/plugins");
    let cache = tempfile::tempdir().expect("cache dir");
    let limits = PluginLimits {
        timeout: Duration::from_secs(5),
        memory_bytes: 64 << 20,
        max_host_calls: 10_000,
        max_events: 100,
        totals: carteiro::runtime::DeliveryTotals::default(),
        max_concurrency: None,
        isolation: Some(Isolation::PerDelivery),
    };
    let iterations = std::env::var("DISPATCH_ITERATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5_000);
    let reuse = std::env::var("BENCH_REUSE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64);
    // DISPATCH_ISOLATION: `per-delivery`, `per-batch` or both (default), comma-separated.
    let wanted_isolation = std::env::var("DISPATCH_ISOLATION").ok();
    let isolations: Vec<(String, Isolation)> = [
        ("per-delivery".to_owned(), Isolation::PerDelivery),
        (format!("per-batch/{reuse}"), Isolation::PerBatch { reuse }),
    ]
    .into_iter()
    .filter(|(label, _)| {
        wanted_isolation
            .as_deref()
            .is_none_or(|w| w.split(',').any(|n| label.starts_with(n.trim())))
    })
    .collect();
    println!("dispatch: instance + handle + verdict (per-batch/N: one instance for N calls)");
    let plugins = [
        ("noop", b"{}".to_vec(), iterations),
        ("enrollment", enrollment_body(), iterations),
        ("enrollment-py", enrollment_body(), iterations / 10),
        ("enrollment-js", enrollment_body(), iterations / 10),
    ];
    // DISPATCH_PLUGINS: a comma-separated subset of the names above (default: all).
    let wanted = std::env::var("DISPATCH_PLUGINS").ok();
    for (name, body, iterations) in plugins {
        if wanted
            .as_deref()
            .is_some_and(|w| !w.split(',').any(|n| n.trim() == name))
        {
            continue;
        }
        let path = dir.join(format!("{name}.wasm"));
        if !path.is_file() {
            println!(
                "{name:<14} missing: run scripts/build-plugins.sh and scripts/build-lang-plugins.sh"
            );
            continue;
        }
        // Load time as a gateway start sees it: compile into an empty cache, then reuse it.
        let load = |runtime: &Arc<Runtime>, isolation: Isolation| {
            let limits = PluginLimits {
                isolation: Some(isolation),
                ..limits.clone()
            };
            let started = Instant::now();
            let plugin = Plugin::load(runtime, name, &path, None, limits, BTreeMap::new())
                .unwrap_or_else(|e| panic!("{e}"));
            (plugin, started.elapsed())
        };
        let cold_runtime = Runtime::with_compile_cache(16, Some(cache.path())).expect("runtime");
        let (_, cold) = load(&cold_runtime, Isolation::PerDelivery);
        drop(cold_runtime);
        let runtime = Runtime::with_compile_cache(16, Some(cache.path())).expect("runtime");
        let msg = message(body);
        for (label, isolation) in &isolations {
            let (plugin, warm) = load(&runtime, *isolation);
            let (median, p99) = measure(&plugin, &msg, iterations.max(100), false).await;
            let (here, here_p99) = measure(&plugin, &msg, iterations.max(100), true).await;
            let row = format!("{name} {label}");
            println!(
                "{row:<28} body {:>5} B  median {:>8.2} µs  p99 {:>8.2} µs  in place {:>7.2} / {:>8.2} µs  load {:>6.2} s cold, {:>5.3} s warm  rss {:>4} MiB",
                msg.body.len(),
                median.as_secs_f64() * 1e6,
                p99.as_secs_f64() * 1e6,
                here.as_secs_f64() * 1e6,
                here_p99.as_secs_f64() * 1e6,
                cold.as_secs_f64(),
                warm.as_secs_f64(),
                resident_mib(),
            );
        }
    }
}

/// This process's resident set now (`VmRSS`), in MiB.
fn resident_mib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kib| kib >> 10)
}
