//! The campaign's own AMQP connections (publisher, sink, drain): first node that answers.

use std::time::Duration;

use lapin::options::QueueDeclareOptions;
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{Channel, Connection, ConnectionProperties};

/// Connects to the first of `urls` that answers within 3 s.
pub async fn connect(urls: &[String]) -> anyhow::Result<Connection> {
    let mut last = anyhow::anyhow!("no broker URL");
    for url in urls {
        let attempt = Connection::connect(url, ConnectionProperties::default());
        match tokio::time::timeout(Duration::from_secs(3), attempt).await {
            Ok(Ok(conn)) => return Ok(conn),
            Ok(Err(e)) => last = e.into(),
            Err(_) => last = anyhow::anyhow!("connect to {url} timed out"),
        }
    }
    Err(last)
}

/// Declares a durable queue of the campaign (quorum on a cluster, so it survives a node).
pub async fn declare_queue(ch: &Channel, name: &str, quorum: bool) -> anyhow::Result<()> {
    let mut args = FieldTable::default();
    if quorum {
        args.insert(
            ShortString::from("x-queue-type"),
            AMQPValue::LongString(LongString::from("quorum")),
        );
    }
    let opts = QueueDeclareOptions {
        durable: true,
        ..QueueDeclareOptions::default()
    };
    ch.queue_declare(name.into(), opts, args).await?;
    Ok(())
}

/// Messages ready in `queue` (a passive declare), or `None` when it does not exist or the
/// broker cannot be asked.
pub async fn depth(ch: &Channel, queue: &str) -> Option<u32> {
    let opts = QueueDeclareOptions {
        passive: true,
        ..QueueDeclareOptions::default()
    };
    let ask = ch.queue_declare(queue.into(), opts, FieldTable::default());
    match tokio::time::timeout(Duration::from_secs(5), ask).await {
        Ok(Ok(q)) => Some(q.message_count()),
        _ => None,
    }
}
