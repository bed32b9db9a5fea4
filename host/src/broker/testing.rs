//! Helpers for tests that run against a real RabbitMQ.

use rand::Rng;

/// The broker tests talk to. Fails (never skips) when unset, so a missing broker in CI is
/// a red build rather than a silently green one.
pub(crate) fn test_url() -> String {
    match std::env::var("CARTEIRO_TEST_AMQP_URL") {
        Ok(url) if !url.is_empty() => url,
        _ => panic!(
            "CARTEIRO_TEST_AMQP_URL is not set. These tests need a real RabbitMQ: run \
             `scripts/rabbitmq.sh start` and export CARTEIRO_TEST_AMQP_URL=\"$(scripts/rabbitmq.sh url)\""
        ),
    }
}

/// A queue or exchange name no other test (or earlier run) uses.
pub(crate) fn unique_name(prefix: &str) -> String {
    format!("test.{prefix}.{:016x}", rand::rng().random::<u64>())
}

pub(crate) async fn test_connection() -> lapin::Connection {
    let opts = super::ConnectOptions {
        connection_name: "carteiro-tests".to_owned(),
        ..Default::default()
    };
    match super::connect(&test_url(), &opts).await {
        Ok(conn) => conn,
        Err(err) => panic!("{err}"),
    }
}

/// Declares an exchange for a test (the test fails if the broker refuses).
pub(crate) async fn declare_exchange(
    channel: &lapin::Channel,
    name: &str,
    kind: lapin::ExchangeKind,
    options: lapin::options::ExchangeDeclareOptions,
) {
    channel
        .exchange_declare(
            name.into(),
            kind,
            options,
            lapin::types::FieldTable::default(),
        )
        .await
        .expect("declare exchange");
}
