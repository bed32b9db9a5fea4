//! Against a real RabbitMQ (see `crate::broker::testing`).

use std::time::Duration;

use lapin::{
    BasicProperties, Connection, ExchangeKind,
    options::{
        BasicGetOptions, ExchangeDeclareOptions, ExchangeDeleteOptions, QueueDeclareOptions,
        QueueDeleteOptions,
    },
    types::FieldTable,
};

use super::*;
use crate::broker::testing::{declare_exchange, test_connection, unique_name};

fn route(queue: &str, queue_type: QueueType) -> RouteTopology {
    RouteTopology {
        queue: queue.to_owned(),
        queue_type,
        bindings: vec![Binding::topic(format!("{queue}.events"), "order.*")],
        retry_delays: vec![
            Duration::from_secs(5),
            Duration::from_millis(500),
            Duration::from_secs(5),
        ],
        max_attempts: 5,
        message_ttl: None,
        max_length: Some(10_000),
    }
}

/// Best effort: tests must not leave queues behind on a developer's broker.
async fn remove(conn: &Connection, d: &DeclaredRoute, exchanges: &[String]) {
    let Ok(ch) = conn.create_channel().await else {
        return;
    };
    let queues = [&d.queue, &d.dlq]
        .into_iter()
        .chain(&d.parked)
        .chain(d.retry_queues.iter().map(|(_, q)| q));
    for q in queues {
        let _ = ch
            .queue_delete(q.as_str().into(), QueueDeleteOptions::default())
            .await;
    }
    for x in exchanges.iter().chain([&d.dlx]) {
        let _ = ch
            .exchange_delete(x.as_str().into(), ExchangeDeleteOptions::default())
            .await;
    }
}

/// Takes the next message of `queue` (acked on delivery), polling every `poll` until it comes;
/// past `deadline` the test fails saying `missing`.
async fn next_message(
    ch: &lapin::Channel,
    queue: &str,
    deadline: tokio::time::Instant,
    poll: Duration,
    missing: &str,
) -> lapin::message::BasicGetMessage {
    loop {
        let got = ch
            .basic_get(queue.into(), BasicGetOptions { no_ack: true })
            .await
            .expect("basic.get");
        if let Some(message) = got {
            return message;
        }
        assert!(tokio::time::Instant::now() < deadline, "{missing}");
        tokio::time::sleep(poll).await;
    }
}

async fn queue_exists(conn: &Connection, name: &str) -> bool {
    let ch = conn.create_channel().await.expect("channel");
    queue_state(&ch, name).await.is_ok()
}

#[tokio::test]
async fn declare_route_is_idempotent() {
    let conn = test_connection().await;
    for queue_type in [QueueType::Classic, QueueType::Quorum] {
        let q = unique_name("orders");
        let t = route(&q, queue_type);
        let first = declare_route(&conn, &t).await.expect("first declare");
        let second = declare_route(&conn, &t)
            .await
            .expect("second declare is a no-op");
        assert_eq!(first, second);
        assert_eq!(first.dlx, format!("{q}.dlx"));
        assert_eq!(first.dlq, format!("{q}.dlq"));
        let tiers: Vec<_> = first.retry_queues.iter().map(|(_, n)| n.clone()).collect();
        assert_eq!(
            tiers,
            [format!("{q}.retry.500ms"), format!("{q}.retry.5000ms")]
        );
        for name in [&q, &first.dlq].into_iter().chain(&tiers) {
            assert!(
                queue_exists(&conn, name).await,
                "{name} missing ({queue_type:?})"
            );
        }
        assert_eq!(
            first.retry_queue_for(Duration::from_secs(1)),
            Some(tiers[1].as_str())
        );
        assert_eq!(
            first.retry_queue_for(Duration::from_secs(60)),
            Some(tiers[1].as_str())
        );
        remove(&conn, &first, &[format!("{q}.events")]).await;
    }
}

#[tokio::test]
async fn changed_arguments_are_a_mismatch_naming_queue_and_argument() {
    let conn = test_connection().await;
    let q = unique_name("mismatch");
    let mut t = route(&q, QueueType::Classic);
    let declared = declare_route(&conn, &t).await.expect("declare");

    t.message_ttl = Some(Duration::from_secs(60));
    match declare_route(&conn, &t).await {
        Err(TopologyError::Mismatch {
            queue,
            argument,
            detail,
        }) => {
            assert_eq!(
                (queue.as_str(), argument.as_str()),
                (q.as_str(), "x-message-ttl")
            );
            assert!(detail.contains("60000"), "{detail}");
        }
        other => panic!("expected a mismatch, got {other:?}"),
    }
    // The broker closed only the declaring channel; the queue and connection are intact.
    assert!(conn.status().connected());
    assert!(queue_exists(&conn, &q).await);

    let mut t = route(&q, QueueType::Quorum);
    t.bindings.clear();
    let err = declare_route(&conn, &t)
        .await
        .expect_err("classic DLQ cannot become quorum");
    let text = err.to_string();
    // Whichever differing argument the broker names first (the quorum DLQ also parks).
    assert!(
        text.contains(&format!("'{q}.dlq'"))
            && (text.contains("x-queue-type") || text.contains("x-dead-letter-exchange")),
        "{text}"
    );
    assert!(err.is_permanent());
    remove(&conn, &declared, &[format!("{q}.events")]).await;
}

#[tokio::test]
async fn existing_exchange_of_another_type_is_reported() {
    let conn = test_connection().await;
    let q = unique_name("xtype");
    let exchange = format!("{q}.events");
    let ch = conn.create_channel().await.expect("channel");
    let durable = ExchangeDeclareOptions {
        durable: true,
        ..Default::default()
    };
    // A direct exchange where the route wants a topic one.
    declare_exchange(&ch, &exchange, ExchangeKind::Direct, durable).await;
    match declare_route(&conn, &route(&q, QueueType::Classic)).await {
        Err(TopologyError::ExchangeMismatch {
            exchange: x,
            argument,
            ..
        }) => {
            assert_eq!((x.as_str(), argument.as_str()), (exchange.as_str(), "type"));
        }
        other => panic!("expected an exchange mismatch, got {other:?}"),
    }
    let mut t = route(&q, QueueType::Classic);
    t.bindings.clear();
    let declared = declare_route(&conn, &t)
        .await
        .expect("declare without the binding");
    remove(&conn, &declared, &[exchange]).await;
}

#[tokio::test]
async fn invalid_settings_are_refused_before_declaring_anything() {
    let conn = test_connection().await;
    let q = unique_name("invalid");
    let mut t = route(&q, QueueType::Classic);
    t.retry_delays = vec![Duration::ZERO];
    assert!(matches!(
        declare_route(&conn, &t).await,
        Err(TopologyError::Invalid { .. })
    ));
    let t = route(&"q".repeat(250), QueueType::Classic);
    assert!(matches!(
        declare_route(&conn, &t).await,
        Err(TopologyError::Invalid { .. })
    ));
    assert!(!queue_exists(&conn, &q).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_retry_message_returns_to_the_work_queue() {
    let conn = test_connection().await;
    let q = unique_name("retry");
    let mut t = route(&q, QueueType::Classic);
    t.retry_delays = vec![Duration::from_millis(300)];
    let declared = declare_route(&conn, &t).await.expect("declare");
    let (_, tier) = &declared.retry_queues[0];

    let ch = conn.create_channel().await.expect("channel");
    let props = BasicProperties::default().with_message_id("m-1".into());
    ch.basic_publish(
        "".into(),
        tier.as_str().into(),
        Default::default(),
        b"again",
        props,
    )
    .await
    .expect("publish to the retry tier");

    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    let missing = format!("message never came back from {tier}");
    let message = next_message(&ch, &q, deadline, Duration::from_millis(100), &missing).await;
    assert_eq!(message.delivery.data, b"again");
    assert_eq!(
        message
            .delivery
            .properties
            .message_id()
            .as_ref()
            .map(|s| s.as_str()),
        Some("m-1")
    );
    let headers = message.delivery.properties.headers().clone();
    let death =
        crate::broker::field_table::header_text(headers.as_ref(), "x-death").unwrap_or_default();
    assert!(
        death.contains("expired") && death.contains(tier.as_str()),
        "x-death: {death}"
    );
    remove(&conn, &declared, &[format!("{q}.events")]).await;
}

/// Redeclares `queue` with `args` on a fresh channel: the broker's answer tells whether the
/// arguments match what the topology declared.
async fn redeclare(conn: &Connection, queue: &str, args: FieldTable) -> lapin::Result<()> {
    let ch = conn.create_channel().await.expect("channel");
    let opts = QueueDeclareOptions {
        durable: true,
        ..Default::default()
    };
    ch.queue_declare(queue.into(), opts, args).await.map(drop)
}

#[tokio::test]
async fn quorum_queues_dead_letter_at_least_once_with_an_explicit_delivery_limit() {
    use lapin::types::{AMQPValue, LongString};
    let conn = test_connection().await;
    let q = unique_name("qdl");
    let t = route(&q, QueueType::Quorum);
    let declared = declare_route(&conn, &t)
        .await
        .expect("declare quorum route");
    let text = |s: &str| AMQPValue::LongString(LongString::from(s));
    // What makes a quorum queue dead-letter at least once (and refuse publishes when full).
    let at_least_once = |args: &mut FieldTable| {
        args.insert("x-dead-letter-strategy".into(), text("at-least-once"));
        args.insert("x-overflow".into(), text("reject-publish"));
    };
    let limit = AMQPValue::LongLongInt(declare::delivery_limit(t.max_attempts));
    assert_eq!(
        declare::delivery_limit(5),
        declare::MIN_QUORUM_DELIVERY_LIMIT
    );

    // Exactly the arguments Carteiro declared: accepted as equivalent.
    let mut dlq_args = FieldTable::default();
    dlq_args.insert("x-queue-type".into(), text("quorum"));
    dlq_args.insert("x-delivery-limit".into(), limit.clone());
    let parked = declared.parked.clone().expect("a quorum route parks");
    assert_eq!(parked, format!("{q}.dlq.parked"));
    let mut dlq_own = dlq_args.clone();
    dlq_own.insert("x-dead-letter-exchange".into(), text(""));
    dlq_own.insert("x-dead-letter-routing-key".into(), text(&parked));
    at_least_once(&mut dlq_own);
    redeclare(&conn, &declared.dlq, dlq_own.clone())
        .await
        .expect("Q.dlq has an explicit delivery limit and parks past it");
    let mut other = dlq_own;
    other.insert("x-delivery-limit".into(), AMQPValue::LongLongInt(3));
    let err = redeclare(&conn, &declared.dlq, other)
        .await
        .expect_err("limit differs");
    assert!(err.to_string().contains("x-delivery-limit"), "{err}");

    let mut work = dlq_args.clone();
    work.insert("x-dead-letter-exchange".into(), text(&declared.dlx));
    work.insert("x-max-length".into(), AMQPValue::LongLongInt(10_000));
    at_least_once(&mut work);
    redeclare(&conn, &declared.queue, work.clone())
        .await
        .expect("work queue dead-letters at least once");
    let mut at_most_once = work;
    at_most_once.insert("x-dead-letter-strategy".into(), text("at-most-once"));
    let err = redeclare(&conn, &declared.queue, at_most_once)
        .await
        .expect_err("strategy differs");
    assert!(err.to_string().contains("x-dead-letter-strategy"), "{err}");

    for (delay, tier) in &declared.retry_queues {
        let mut args = dlq_args.clone();
        args.insert(
            "x-message-ttl".into(),
            AMQPValue::LongLongInt(delay.as_millis() as i64),
        );
        args.insert("x-dead-letter-exchange".into(), text(""));
        args.insert("x-dead-letter-routing-key".into(), text(&q));
        at_least_once(&mut args);
        redeclare(&conn, tier, args)
            .await
            .expect("retry tier dead-letters back at least once");
    }
    remove(&conn, &declared, &[format!("{q}.events")]).await;
}

/// A dead letter whose archiving keeps failing is handed back to `Q.dlq` again and again;
/// past the DLQ's delivery limit the broker must park it, never drop it.
#[tokio::test]
async fn a_quorum_dlq_parks_a_dead_letter_past_its_delivery_limit() {
    use lapin::options::{BasicNackOptions, BasicPublishOptions};
    let conn = test_connection().await;
    let q = unique_name("qpark");
    let t = route(&q, QueueType::Quorum);
    let declared = declare_route(&conn, &t).await.expect("declare");
    let parked = declared.parked.clone().expect("quorum routes park");
    let ch = conn.create_channel().await.expect("channel");
    ch.confirm_select(Default::default())
        .await
        .expect("confirms");
    ch.basic_publish(
        declared.dlx.as_str().into(),
        "".into(),
        BasicPublishOptions::default(),
        b"a dead letter",
        Default::default(),
    )
    .await
    .expect("publish")
    .await
    .expect("confirm");
    let limit = declare::delivery_limit(t.max_attempts);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let mut returned = 0;
    // What an archiver facing a failing store used to do: nack with requeue, over and over.
    while returned <= limit {
        assert!(
            tokio::time::Instant::now() < deadline,
            "requeue loop took too long"
        );
        let got = ch
            .basic_get(declared.dlq.as_str().into(), BasicGetOptions::default())
            .await
            .expect("get");
        let Some(message) = got else {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        };
        let requeue = BasicNackOptions {
            requeue: true,
            ..Default::default()
        };
        message.delivery.acker.nack(requeue).await.expect("nack");
        returned += 1;
    }
    let missing = format!("the dead letter was dropped, not parked in {parked}");
    let found = next_message(&ch, &parked, deadline, Duration::from_millis(50), &missing).await;
    assert_eq!(found.delivery.data, b"a dead letter");
    remove(&conn, &declared, &[format!("{q}.events")]).await;
}
