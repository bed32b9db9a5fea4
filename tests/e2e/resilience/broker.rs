//! The broker misbehaving: restarted under load, and dead-lettering messages on its own.

use super::{Rabbit, counter_value, queue_depth, topology_of};
use crate::support::{
    Client, Gateway, amqp_url, dead_letters, json_props, load_config, route_config, unique,
    wait_for,
};
use carteiro::store::DeadLetterFilter;
use std::collections::BTreeSet;
use std::time::Duration;

/// Publishes `ids` (confirmed, persistent) to `exchange`.
async fn publish_all(client: &Client, exchange: &str, ids: &[String]) {
    for id in ids {
        client
            .publish(exchange, "k", json_props(id), id.as_bytes())
            .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_restart_mid_flow_loses_nothing_and_applies_each_effect_once() {
    let rabbit = Rabbit::start().await;
    let url = rabbit.url();
    let (queue, exchange, events) = (unique("restart"), unique("in"), unique("events"));
    let client = Client::connect_to(&url).await;
    let events_queue = client.sink(&events).await;
    let vars = format!("out_exchange = \"{events}\"");
    let config = route_config(&queue, "counter", &exchange, &vars, "").replace(&amqp_url(), &url);
    let gw = Gateway::start(&config).await;
    client.wait_for_consumer(&queue).await;

    // Enough that the broker's (graceful, seconds-long) stop lands mid-flow.
    let before: Vec<String> = (0..1000).map(|i| format!("before-{i}")).collect();
    publish_all(&client, &exchange, &before).await;
    wait_for("the first commits", Duration::from_secs(30), || async {
        (counter_value(&gw.store, "runs").await >= 10).then_some(())
    })
    .await;
    drop(client); // its connection dies with the broker
    rabbit.stop().await;
    let at_stop = counter_value(&gw.store, "runs").await;
    assert!(
        at_stop < 1000,
        "the broker must go down mid-flow, but all 1000 messages were already processed"
    );
    rabbit.start_again().await;

    let client = Client::connect_to(&url).await;
    let after: Vec<String> = (0..100).map(|i| format!("after-{i}")).collect();
    publish_all(&client, &exchange, &after).await;
    let total = (before.len() + after.len()) as u64;
    let runs = wait_for(
        "every message processed after the restart",
        Duration::from_secs(120),
        || async {
            let runs = counter_value(&gw.store, "runs").await;
            (runs >= total).then_some(runs)
        },
    )
    .await;
    eprintln!("processed {at_stop} of 1000 before the broker stopped; {runs} in all");

    // Exactly once: one handler commit per message, each message's own counter at 1.
    for id in before.iter().chain(&after) {
        assert_eq!(
            counter_value(&gw.store, &format!("seen/{id}")).await,
            1,
            "{id}"
        );
        assert!(
            gw.store.inbox_contains(&queue, id).await.expect("inbox"),
            "{id}"
        );
    }
    assert_eq!(runs, total, "handler effects committed more than once");
    assert_eq!(queue_depth(&client, &queue).await, 0, "work queue drained");
    let filter = DeadLetterFilter {
        route: Some(queue.clone()),
        ..Default::default()
    };
    let dead = gw.store.dead_letters_list(&filter).await.expect("dlq");
    assert!(dead.is_empty(), "nothing dead-lettered: {dead:?}");

    // Every committed event reaches the broker (G3), across the restart.
    wait_for("the outbox relayed", Duration::from_secs(60), || async {
        let status = gw.store.outbox_status().await.ok()?;
        (status.pending == 0).then_some(())
    })
    .await;
    let mut relayed = BTreeSet::new();
    for m in client.drain(&events_queue).await {
        let event: serde_json::Value = serde_json::from_slice(&m.delivery.data).expect("json");
        if let Some(id) = event["message_id"].as_str() {
            relayed.insert(id.to_owned());
        }
    }
    let published: BTreeSet<String> = before.iter().chain(&after).cloned().collect();
    assert_eq!(relayed, published, "every message's event was relayed");
    gw.stop().await;
}

#[tokio::test]
async fn messages_the_broker_dead_letters_are_archived_with_its_reason() {
    let queue = unique("native-dl");
    let exchange = unique("in");
    let extra = "message_ttl = \"1s\"\nmax_length = 1";
    let toml = route_config(&queue, "counter", &exchange, "", extra);

    // Declare the route's queues before any gateway consumes them.
    let dir = tempfile::tempdir().expect("tempdir");
    let config = load_config(
        dir.path(),
        &toml.replace("{dir}", &dir.path().display().to_string()),
    );
    let client = Client::connect().await;
    carteiro::topology::declare_route(&client.conn, &topology_of(&config.routes[0]))
        .await
        .expect("declare the route");

    // Two messages into a queue of length 1: the older one overflows, the other expires.
    client
        .publish(&exchange, "k", json_props("overflowed"), b"{}")
        .await;
    client
        .publish(&exchange, "k", json_props("expired"), b"{}")
        .await;
    let dlq = carteiro::topology::dlq_name(&queue);
    wait_for(
        "both messages dead-lettered by the broker",
        Duration::from_secs(30),
        || async { (queue_depth(&client, &dlq).await == 2).then_some(()) },
    )
    .await;
    assert_eq!(queue_depth(&client, &queue).await, 0);

    let gw = Gateway::start(&toml).await;
    let rows = dead_letters(&gw.store, &queue, 2).await;
    assert_eq!(rows.len(), 2, "{rows:?}");
    let reason_of = |id: &str| {
        rows.iter()
            .find(|r| {
                r.letter
                    .headers
                    .iter()
                    .any(|(k, v)| k == ":message-id" && v == id)
            })
            .map(|r| r.letter.reason.clone())
            .unwrap_or_else(|| panic!("no dead letter for {id}: {rows:?}"))
    };
    let overflowed = reason_of("overflowed");
    assert!(
        overflowed.contains("queue length limit exceeded") && overflowed.contains(&queue),
        "{overflowed}"
    );
    let expired = reason_of("expired");
    assert!(
        expired.contains("message TTL expired") && expired.contains(&queue),
        "{expired}"
    );
    assert!(
        rows.iter().all(|r| r.letter.queue == queue),
        "x-first-death-queue recorded: {rows:?}"
    );
    wait_for("the DLQ emptied", Duration::from_secs(10), || async {
        (queue_depth(&client, &dlq).await == 0).then_some(())
    })
    .await;
    // The handler never saw either message.
    assert_eq!(counter_value(&gw.store, "runs").await, 0);
    gw.stop().await;
}
