//! The relay's byte window (`[relay] max_in_flight_bytes`): with rows much larger than the
//! window's share, claims stop at the byte budget (one row at least) and the relay claims
//! again as bytes free up, without waiting for the poll interval, so everything is published
//! in key order.

use crate::support::{
    Client, amqp_url, load_config, migrated_store, receive, spawn_relay, sqlite_url, stop_relay,
    unique, wait_published,
};
use carteiro::store::{CommitRequest, NewOutboxRow};
use std::collections::BTreeMap;
use std::time::Duration;

const ROWS: usize = 24;
const KEYS: usize = 3;
const PAYLOAD: usize = 256 << 10;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_rows_flow_through_a_small_byte_window_in_key_order() {
    let client = Client::connect().await;
    let exchange = unique("bigrows");
    let sink = client.sink(&exchange).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let url = sqlite_url(dir.path());
    let store = migrated_store(&url).await;
    let batch: Vec<CommitRequest> = (0..ROWS)
        .map(|i| CommitRequest {
            route: "seed".into(),
            inbox_key: format!("seed-{i}"),
            namespace: "seed".into(),
            reads: Vec::new(),
            writes: Vec::new(),
            outbox: vec![NewOutboxRow {
                event_id: uuid::Uuid::now_v7().to_string(),
                route: "seed".into(),
                plugin: "seed".into(),
                exchange: exchange.clone(),
                routing_key: "big".into(),
                headers: vec![
                    ("x-key".into(), format!("key-{}", i % KEYS)),
                    ("x-seq".into(), (i / KEYS).to_string()),
                ],
                content_type: None,
                payload: vec![b'x'; PAYLOAD],
                ordering_key: format!("key-{}", i % KEYS),
            }],
        })
        .collect();
    store.commit_batch(&batch).await.expect("seed");

    // The window holds about four rows; the poll interval is far longer than the test, so
    // only claims re-started as bytes free up can drain the outbox in time.
    let config = load_config(
        dir.path(),
        &format!(
            "version = 1\n[broker]\nurl = \"{}\"\n[store]\nurl = \"{url}\"\n[relay]\npoll_interval = \"10m\"\nmax_in_flight_bytes = \"1MiB\"\n",
            amqp_url()
        ),
    );
    let relay = spawn_relay(&config, store.clone());
    wait_published("every row published", &store, Duration::from_secs(60)).await;
    stop_relay(relay).await;

    let got = receive(&client, &sink, ROWS, Duration::from_secs(30)).await;
    assert_eq!(got.len(), ROWS);
    let mut per_key: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for m in &got {
        assert_eq!(m.delivery.data.len(), PAYLOAD);
        let headers = m.delivery.properties.headers().clone().unwrap_or_default();
        let pairs = carteiro::broker::field_table::to_text_pairs(&headers);
        let get = |name: &str| {
            pairs
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
                .unwrap_or_default()
        };
        per_key
            .entry(get("x-key"))
            .or_default()
            .push(get("x-seq").parse().unwrap_or(-1));
    }
    assert_eq!(per_key.len(), KEYS);
    for (key, seqs) in per_key {
        let expected: Vec<i64> = (0..(ROWS / KEYS) as i64).collect();
        assert_eq!(
            seqs, expected,
            "{key}: published once each, in commit order"
        );
    }
}
