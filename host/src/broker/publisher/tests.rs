//! Against a real RabbitMQ (see `crate::broker::testing`).

use super::*;
use crate::broker::testing::{declare_exchange, test_connection, unique_name};
use crate::topology::queue_state;
use lapin::{
    Channel, ExchangeKind,
    options::{ExchangeDeclareOptions, QueueDeclareOptions},
    types::FieldTable,
};
use std::collections::HashMap;

const WAIT: Duration = Duration::from_secs(10);

async fn setup() -> (ConfirmedPublisher, Channel, String) {
    let conn = Arc::new(test_connection().await);
    let admin = conn.create_channel().await.expect("channel");
    let queue = unique_name("pub");
    // x-expires: the broker removes the queue a minute after the test stops using it.
    let mut args = FieldTable::default();
    args.insert(
        "x-expires".into(),
        lapin::types::AMQPValue::LongLongInt(60_000),
    );
    admin
        .queue_declare(queue.as_str().into(), QueueDeclareOptions::default(), args)
        .await
        .expect("declare queue");
    let publisher = ConfirmedPublisher::open(conn, PublisherOptions::default())
        .await
        .expect("publisher");
    (publisher, admin, queue)
}

fn to(exchange: &str, routing_key: &str, body: &[u8]) -> Outgoing {
    Outgoing {
        exchange: exchange.to_owned(),
        routing_key: routing_key.to_owned(),
        body: body.to_vec(),
        mandatory: true,
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unroutable_mandatory_publish_is_returned() {
    let (publisher, admin, queue) = setup().await;
    let exchange = unique_name("ex");
    let auto_delete = ExchangeDeclareOptions {
        auto_delete: true,
        ..Default::default()
    };
    declare_exchange(&admin, &exchange, ExchangeKind::Direct, auto_delete).await;

    let err = publisher
        .publish(to(&exchange, "nobody-binds-this", b"x"), WAIT)
        .await;
    match err {
        Err(PublishError::Returned {
            reply_code,
            reply_text,
        }) => {
            assert_eq!((reply_code, reply_text.as_str()), (312, "NO_ROUTE"));
        }
        other => panic!("expected Returned, got {other:?}"),
    }
    let err = publisher
        .publish(to("", &unique_name("no-such-queue"), b"x"), WAIT)
        .await;
    assert!(matches!(err, Err(PublishError::Returned { .. })), "{err:?}");
    // Still usable, and routable messages are confirmed.
    publisher
        .publish(to("", &queue, b"ok"), WAIT)
        .await
        .expect("routable");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_exchange_fails_only_that_publish() {
    let (publisher, _admin, queue) = setup().await;
    let err = publisher
        .publish(to(&unique_name("absent"), "k", b"x"), WAIT)
        .await;
    match err {
        Err(PublishError::ChannelClosed(text)) => assert!(text.contains("NOT_FOUND"), "{text}"),
        other => panic!("expected ChannelClosed, got {other:?}"),
    }
    publisher
        .publish(to("", &queue, b"ok"), WAIT)
        .await
        .expect("lane reopened");
    assert!(publisher.is_connected());
}

/// Distinct ids: the messages share batches, and returns are matched by id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_publishes_with_ids_each_get_their_own_confirm() {
    concurrent_publishes(true).await;
}

/// Without ids every message goes alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_publishes_without_ids_each_get_their_own_confirm() {
    concurrent_publishes(false).await;
}

async fn concurrent_publishes(with_ids: bool) {
    let (publisher, admin, queue) = setup().await;
    let missing = unique_name("nowhere");
    let tasks: Vec<_> = (0..200)
        .map(|i| {
            let publisher = publisher.clone();
            // Every fifth message is unroutable: only those may come back as Returned.
            let target = if i % 5 == 0 {
                missing.clone()
            } else {
                queue.clone()
            };
            tokio::spawn(async move {
                let body = format!("message {i}").into_bytes();
                let mut msg = to("", &target, &body);
                if with_ids {
                    msg.properties = msg
                        .properties
                        .with_message_id(uuid::Uuid::now_v7().to_string().into());
                }
                (i, publisher.publish(msg, Duration::from_secs(30)).await)
            })
        })
        .collect();
    for task in tasks {
        let (i, result) = task.await.expect("task");
        match (i % 5 == 0, result) {
            (true, Err(PublishError::Returned { .. })) | (false, Ok(())) => {}
            (unroutable, other) => {
                panic!("message {i} (unroutable: {unroutable}) got {other:?}")
            }
        }
    }
    let q = queue_state(&admin, &queue).await.expect("passive declare");
    assert_eq!(q.message_count(), 160);
}

/// Runs of several keys at once, each run in order on its own channel: every key's
/// messages reach the queue in order, and one returned message in the middle of a run
/// fails alone (the rest of its run is confirmed, the caller decides what that means).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_published_in_order_arrive_in_order_with_their_own_outcomes() {
    let (publisher, admin, queue) = setup().await;
    let missing = unique_name("nowhere");
    let tasks: Vec<_> = (0..6)
        .map(|key| {
            let publisher = publisher.clone();
            let (queue, missing) = (queue.clone(), missing.clone());
            tokio::spawn(async move {
                let mut outcomes = Vec::new();
                // 150 messages per key in runs of 50: each run waits for the one before.
                for run in 0..3 {
                    let msgs = (0..50)
                        .map(|i| {
                            let seq = run * 50 + i;
                            // Key 0's 75th message routes nowhere.
                            let target = if key == 0 && seq == 75 {
                                &missing
                            } else {
                                &queue
                            };
                            let mut msg = to("", target, format!("{key}/{seq}").as_bytes());
                            msg.properties = msg
                                .properties
                                .with_message_id(uuid::Uuid::now_v7().to_string().into());
                            msg
                        })
                        .collect();
                    outcomes.extend(publisher.publish_in_order(msgs, WAIT).await);
                }
                (key, outcomes)
            })
        })
        .collect();
    for task in tasks {
        let (key, outcomes) = task.await.expect("task");
        assert_eq!(outcomes.len(), 150);
        for (seq, outcome) in outcomes.into_iter().enumerate() {
            match (key == 0 && seq == 75, outcome) {
                (true, Err(PublishError::Returned { .. })) | (false, Ok(())) => {}
                (returned, other) => {
                    panic!("{key}/{seq} (unroutable: {returned}) got {other:?}")
                }
            }
        }
    }
    let mut last: HashMap<String, i64> = HashMap::new();
    let mut count = 0;
    while let Some(m) = admin
        .basic_get(
            queue.as_str().into(),
            lapin::options::BasicGetOptions { no_ack: true },
        )
        .await
        .expect("get")
    {
        let text = String::from_utf8(m.delivery.data.clone()).expect("utf-8");
        let (key, seq) = text.split_once('/').expect("key/seq");
        let seq: i64 = seq.parse().expect("seq");
        let before = last.insert(key.to_owned(), seq).unwrap_or(-1);
        assert!(seq > before, "{key}/{seq} arrived after {key}/{before}");
        count += 1;
    }
    assert_eq!(count, 6 * 150 - 1);
}

/// A run one batch cannot carry (a repeated id) goes out one message after another,
/// stopping at the first failure; an invalid message ends a run with its own error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_that_cannot_share_a_batch_go_one_by_one_and_stop_at_a_failure() {
    let (publisher, _admin, queue) = setup().await;
    let same = |body: &[u8]| {
        let mut msg = to("", &queue, body);
        msg.properties = msg.properties.with_message_id("same-id".into());
        msg
    };
    let out = publisher
        .publish_in_order(vec![same(b"a"), same(b"b")], WAIT)
        .await;
    assert!(out.iter().all(Result::is_ok), "{out:?}");
    assert_eq!(out.len(), 2);
    let mut bad = to("", &queue, b"x");
    bad.routing_key = "r".repeat(300);
    let out = publisher
        .publish_in_order(vec![same(b"c"), bad, same(b"d")], WAIT)
        .await;
    assert_eq!(out.len(), 2, "{out:?}");
    assert!(out[0].is_ok());
    assert!(matches!(out[1], Err(PublishError::Invalid(_))), "{out:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeout_and_invalid_names_are_reported() {
    let (publisher, _admin, queue) = setup().await;
    let err = publisher
        .publish(to("", &queue, b"x"), Duration::ZERO)
        .await;
    assert!(matches!(err, Err(PublishError::Timeout)), "{err:?}");
    let err = publisher
        .publish(to("", &"k".repeat(256), b"x"), WAIT)
        .await;
    assert!(matches!(err, Err(PublishError::Invalid(_))), "{err:?}");
    publisher
        .publish(to("", &queue, b"ok"), WAIT)
        .await
        .expect("still works");
}
