//! Property: whatever header table and body a publisher sends, every message ends acked with
//! its effects, archived with a reason, or still in the broker; no delivery task panics; no
//! message runs the handler more than a small bound of times.
//!
//! The tables vary names (Carteiro's own `x-carteiro-*`, `x-death`, random ones), values
//! (any bytes with NUL and invalid UTF-8, numbers, nested tables and arrays, up to about
//! 100 KiB) and counts (0 to 2,000 entries). Cases come from `proptest` strategies with a
//! seed printed first (`CARTEIRO_PROPTEST_SEED=N` replays a run); the real gateway, broker
//! and SQLite do the rest. Bounded: 48 messages a run.

use crate::support::{Route, unique, wait_for};
use carteiro::store::DeadLetterFilter;
use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldArray, FieldTable, LongString, ShortString};
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use std::collections::HashSet;
use std::time::Duration;

const MESSAGES: usize = 48;
const MAX_ATTEMPTS: u64 = 2;

fn name() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("x-carteiro-attempt".to_owned()),
        Just("x-carteiro-seal".to_owned()),
        Just("x-carteiro-reason".to_owned()),
        Just("x-carteiro-original-exchange".to_owned()),
        Just("x-carteiro-first-failure-at".to_owned()),
        Just("x-death".to_owned()),
        Just("x-first-death-reason".to_owned()),
        Just("traceparent".to_owned()),
        vec(any::<char>(), 1..40).prop_map(|c| c.into_iter().collect::<String>()),
        vec(any::<char>(), 1..20)
            .prop_map(|c| format!("x-carteiro-{}", c.into_iter().collect::<String>())),
    ]
    .prop_map(|n| {
        // A short string holds at most 255 bytes.
        let mut end = n.len().min(255);
        while !n.is_char_boundary(end) {
            end -= 1;
        }
        n[..end].to_owned()
    })
}

/// Any bytes, with NUL in plenty (every byte below 16 becomes one).
fn bytes(max: usize) -> impl Strategy<Value = Vec<u8>> {
    vec(any::<u8>(), 0..max).prop_map(|mut b| {
        b.iter_mut().filter(|c| **c < 16).for_each(|c| *c = 0);
        b
    })
}

fn leaf(max_text: usize) -> impl Strategy<Value = AMQPValue> {
    prop_oneof![
        bytes(max_text).prop_map(|b| AMQPValue::LongString(LongString::from(b))),
        any::<i64>().prop_map(AMQPValue::LongLongInt),
        any::<i32>().prop_map(AMQPValue::LongInt),
        any::<bool>().prop_map(AMQPValue::Boolean),
        any::<f64>().prop_map(AMQPValue::Double),
        Just(AMQPValue::Void),
    ]
}

fn value() -> impl Strategy<Value = AMQPValue> {
    leaf(4096).prop_recursive(3, 32, 8, |inner| {
        prop_oneof![
            vec(inner.clone(), 0..8).prop_map(|v| AMQPValue::FieldArray(FieldArray::from(v))),
            vec((name(), inner), 0..8).prop_map(|pairs| {
                let mut t = FieldTable::default();
                for (k, v) in pairs {
                    t.insert(ShortString::from(k), v);
                }
                AMQPValue::FieldTable(t)
            }),
        ]
    })
}

/// A header table: few entries of any kind, or up to 2,000 small ones, cut to keep the
/// header frame inside the broker's 128 KiB.
fn table() -> impl Strategy<Value = FieldTable> {
    prop_oneof![
        vec((name(), value()), 0..24),
        vec((name(), leaf(24)), 0..2000),
    ]
    .prop_map(|pairs| {
        let size = |t: FieldTable| {
            carteiro::broker::outgoing::header_frame_size(
                &BasicProperties::default().with_headers(t),
            )
        };
        let empty = size(FieldTable::default());
        let (mut table, mut total) = (FieldTable::default(), empty);
        for (k, v) in pairs {
            let mut one = FieldTable::default();
            one.insert(ShortString::from(k.as_str()), v.clone());
            total += size(one) - empty;
            if total > 100_000 {
                break;
            }
            table.insert(ShortString::from(k), v);
        }
        table
    })
}

fn body() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        vec(any::<u8>(), 0..512),
        Just(b"trap".to_vec()),
        Just(b"retry-until-5".to_vec()),
        Just(b"{\"deep\":[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}".to_vec()),
    ]
}

fn seed() -> u64 {
    std::env::var("CARTEIRO_PROPTEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_headers_and_bodies_never_lose_stall_or_panic() {
    let seed = seed();
    eprintln!("property seed: CARTEIRO_PROPTEST_SEED={seed}");
    let mut bytes = [0u8; 32];
    bytes[..8].copy_from_slice(&seed.to_le_bytes());
    let mut runner = TestRunner::new_with_rng(
        Config::default(),
        TestRng::from_seed(RngAlgorithm::ChaCha, &bytes),
    );
    let cases = vec((table(), body()), MESSAGES)
        .new_tree(&mut runner)
        .expect("generate cases")
        .current();

    let extra = format!("[routes.retry]\nmax_attempts = {MAX_ATTEMPTS}\nbackoff = [\"100ms\"]");
    let metrics = std::sync::Arc::new(carteiro::metrics::Metrics::default());
    let route = Route::start_with_metrics("props", "fixture-mixed", &extra, metrics.clone()).await;
    let mut ids = Vec::new();
    for (i, (t, body)) in cases.into_iter().enumerate() {
        let id = unique(&format!("p{i}"));
        let props = BasicProperties::default()
            .with_message_id(id.as_str().into())
            .with_headers(t);
        route.publish(props, &body).await;
        ids.push(id);
    }

    // Every message accounted for: committed (kv done/<id>), or archived with a reason.
    let filter = DeadLetterFilter {
        route: Some(route.queue.clone()),
        limit: Some(10_000),
        ..Default::default()
    };
    let (done, dead) = wait_for(
        "every message settled",
        Duration::from_secs(120),
        || async {
            let mut done = HashSet::new();
            for id in &ids {
                if route
                    .gw
                    .store
                    .kv_get("fixture-mixed", &format!("done/{id}"))
                    .await
                    .ok()
                    .flatten()
                    .is_some()
                {
                    done.insert(id.clone());
                }
            }
            let rows = route.gw.store.dead_letters_list(&filter).await.ok()?;
            let dead: Vec<_> = rows
                .into_iter()
                .filter_map(|d| {
                    let id = d
                        .letter
                        .headers
                        .iter()
                        .find(|(k, _)| k == ":message-id")
                        .map(|(_, v)| v.clone())?;
                    Some((id, d.letter.reason))
                })
                .collect();
            (done.len() + dead.len() >= ids.len()).then_some((done, dead))
        },
    )
    .await;
    for (id, reason) in &dead {
        assert!(!reason.is_empty(), "{id} archived without a reason");
        assert!(!done.contains(id), "{id} both committed and dead-lettered");
    }
    let dead_ids: HashSet<_> = dead.iter().map(|(id, _)| id.clone()).collect();
    assert_eq!(
        dead_ids.len(),
        dead.len(),
        "a message archived twice: {dead:?}"
    );
    for id in &ids {
        assert!(
            done.contains(id) || dead_ids.contains(id),
            "{id} lost (seed {seed})"
        );
    }
    assert_eq!(
        metrics.panics(&route.queue),
        0,
        "a delivery task panicked (seed {seed})"
    );
    // Each message runs at most MAX_ATTEMPTS times (a forged attempt never adds runs).
    let runs = metrics.handler_runs(&route.queue);
    assert!(
        runs <= ids.len() as u64 * MAX_ATTEMPTS,
        "{runs} handler runs for {} messages (seed {seed})",
        ids.len()
    );
    route.gw.stop().await;
}
