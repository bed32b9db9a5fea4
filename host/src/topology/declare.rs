//! The declarations themselves, each on a channel of its own.

use lapin::{
    Channel, Connection, ExchangeKind,
    options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions},
    types::{AMQPValue, FieldTable, LongString, ShortString},
};

use super::error::{Entity, classify};
use super::{
    DeclaredRoute, QueueType, RouteTopology, TopologyError, dlq_name, dlx_name, parked_name,
    retry_queue_name,
};

/// RabbitMQ rejects a message TTL above 2^32 - 1 ms.
const MAX_TTL_MS: u128 = u32::MAX as u128;
/// The least `x-delivery-limit` set on a quorum queue: redeliveries after crashes and broker
/// trouble count, store outages do not (deliveries wait for the store instead of going back).
pub const MIN_QUORUM_DELIVERY_LIMIT: i64 = 20;

/// Declares (or verifies) everything `t` needs. Safe to call at every start and after every
/// reconnect: declaring what already exists identically is a no-op.
pub async fn declare_route(
    conn: &Connection,
    t: &RouteTopology,
) -> Result<DeclaredRoute, TopologyError> {
    let q = t.queue.as_str();
    let invalid = |reason: String| TopologyError::Invalid {
        queue: q.to_owned(),
        reason,
    };
    if q.is_empty() {
        return Err(invalid("the queue name is empty".to_owned()));
    }
    if t.max_attempts == 0 {
        return Err(invalid("max_attempts must be at least 1".to_owned()));
    }
    let mut delays = t.retry_delays.clone();
    delays.sort();
    delays.dedup_by_key(|d| d.as_millis());
    let mut retry_queues = Vec::with_capacity(delays.len());
    for delay in delays {
        let ms = delay.as_millis();
        if ms == 0 || ms > MAX_TTL_MS {
            return Err(invalid(format!(
                "retry delay {delay:?} must be between 1 ms and {MAX_TTL_MS} ms"
            )));
        }
        retry_queues.push((delay, retry_queue_name(q, delay)));
    }
    let (dlx, dlq, parked) = (dlx_name(q), dlq_name(q), parked_name(q));
    // Checked up front so no half-declared route is left behind by an over-long name.
    for name in [q, dlx.as_str(), dlq.as_str(), parked.as_str()]
        .into_iter()
        .chain(retry_queues.iter().map(|(_, n)| n.as_str()))
    {
        short(name).map_err(|_| {
            invalid(format!(
                "'{name}' is longer than AMQP's 255 bytes; shorten the queue name"
            ))
        })?;
    }
    for b in &t.bindings {
        for (what, name) in [("exchange", &b.exchange), ("binding key", &b.routing_key)] {
            if name.len() > 255 {
                return Err(invalid(format!(
                    "a binding's {what} is longer than AMQP's 255 bytes"
                )));
            }
        }
    }

    // Dead-letter targets first, so nothing the work queue dead-letters is ever dropped.
    let limit = delivery_limit(t.max_attempts);
    let parked = match t.queue_type {
        // A quorum DLQ's delivery limit would otherwise drop a dead letter whose archiving
        // keeps failing; past it, the broker parks the message instead.
        QueueType::Quorum => {
            declare_queue(conn, &parked, parked_args()).await?;
            Some(parked)
        }
        QueueType::Classic => None,
    };
    declare_exchange(conn, &dlx, ExchangeKind::Fanout).await?;
    let mut dlq_args = queue_args(t.queue_type, limit);
    if let Some(parked) = &parked {
        dlq_args = dead_lettering(dlq_args, t.queue_type);
        put(&mut dlq_args, "x-dead-letter-exchange", string(""));
        put(&mut dlq_args, "x-dead-letter-routing-key", string(parked));
    }
    declare_queue(conn, &dlq, dlq_args).await?;
    bind(conn, &dlq, &dlx, "").await?;

    let mut args = dead_lettering(queue_args(t.queue_type, limit), t.queue_type);
    put(&mut args, "x-dead-letter-exchange", string(&dlx));
    if let Some(ttl) = t.message_ttl {
        let ms = ttl.as_millis();
        if ms > MAX_TTL_MS {
            return Err(invalid(format!(
                "message_ttl {ttl:?} exceeds {MAX_TTL_MS} ms"
            )));
        }
        put(
            &mut args,
            "x-message-ttl",
            AMQPValue::LongLongInt(ms as i64),
        );
    }
    if let Some(max) = t.max_length {
        let max =
            i64::try_from(max).map_err(|_| invalid(format!("max_length {max} is too large")))?;
        put(&mut args, "x-max-length", AMQPValue::LongLongInt(max));
    }
    declare_queue(conn, q, args).await?;

    for b in &t.bindings {
        if b.exchange.is_empty() {
            return Err(invalid("a binding names the default exchange \"\", which routes by queue name on its own; remove it".to_owned()));
        }
        declare_exchange(conn, &b.exchange, exchange_kind(&b.exchange_type)).await?;
        bind(conn, q, &b.exchange, &b.routing_key).await?;
    }

    for (delay, name) in &retry_queues {
        let mut args = dead_lettering(queue_args(t.queue_type, limit), t.queue_type);
        put(
            &mut args,
            "x-message-ttl",
            AMQPValue::LongLongInt(delay.as_millis() as i64),
        );
        // Expired messages go back to Q through the default exchange, which routes by name.
        put(&mut args, "x-dead-letter-exchange", string(""));
        put(&mut args, "x-dead-letter-routing-key", string(q));
        declare_queue(conn, name, args).await?;
    }

    Ok(DeclaredRoute {
        queue: q.to_owned(),
        retry_queues,
        dlx,
        dlq,
        parked,
    })
}

/// `Q.dlq.parked`: a quorum queue nothing consumes on its own, so it has no delivery limit
/// to spend; an explicit `-1` would be refused by RabbitMQ 3.x, which has no default limit.
fn parked_args() -> FieldTable {
    let mut args = FieldTable::default();
    put(
        &mut args,
        "x-queue-type",
        string(QueueType::Quorum.as_str()),
    );
    args
}

/// The delivery limit of a route's quorum queues.
pub fn delivery_limit(max_attempts: u32) -> i64 {
    (i64::from(max_attempts) + 2).max(MIN_QUORUM_DELIVERY_LIMIT)
}

fn queue_args(queue_type: QueueType, delivery_limit: i64) -> FieldTable {
    let mut args = FieldTable::default();
    // Classic is the default: leaving the argument out keeps queues created by other tools
    // (without x-queue-type) equivalent.
    if queue_type == QueueType::Quorum {
        put(&mut args, "x-queue-type", string(queue_type.as_str()));
        // Explicit on every quorum queue: RabbitMQ 4 would otherwise apply its own 20.
        put(
            &mut args,
            "x-delivery-limit",
            AMQPValue::LongLongInt(delivery_limit),
        );
    }
    args
}

/// Quorum queues that dead-letter (the work queue, to `Q.dlx`; the retry tiers, back to
/// `Q`) do so at least once: the message leaves only once the target confirmed it. That
/// needs `reject-publish` overflow. Classic queues dead-letter at most once (README).
fn dead_lettering(mut args: FieldTable, queue_type: QueueType) -> FieldTable {
    if queue_type == QueueType::Quorum {
        put(&mut args, "x-dead-letter-strategy", string("at-least-once"));
        put(&mut args, "x-overflow", string("reject-publish"));
    }
    args
}

fn exchange_kind(name: &str) -> ExchangeKind {
    match name {
        "topic" => ExchangeKind::Topic,
        "direct" => ExchangeKind::Direct,
        "fanout" => ExchangeKind::Fanout,
        "headers" => ExchangeKind::Headers,
        other => ExchangeKind::Custom(other.to_owned()),
    }
}

fn put(args: &mut FieldTable, key: &'static str, value: AMQPValue) {
    args.insert(ShortString::from(key), value);
}

fn string(s: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(s))
}

fn short(name: &str) -> Result<ShortString, TopologyError> {
    ShortString::try_new(name).map_err(|e| TopologyError::Invalid {
        queue: name.to_owned(),
        reason: e.to_string(),
    })
}

/// A 406 PRECONDITION_FAILED closes the channel it happened on, so every declaration gets a
/// fresh one and one failure cannot poison the next.
async fn fresh_channel(conn: &Connection, entity: Entity<'_>) -> Result<Channel, TopologyError> {
    conn.create_channel()
        .await
        .map_err(|e| classify(entity, &e))
}

async fn finish(
    channel: Channel,
    entity: Entity<'_>,
    result: lapin::Result<()>,
) -> Result<(), TopologyError> {
    match result {
        Ok(()) => {
            // Best effort: a channel that fails to close is dropped (and closed) anyway.
            let _ = channel.close(200, "declared".into()).await;
            Ok(())
        }
        Err(e) => Err(classify(entity, &e)),
    }
}

async fn declare_queue(
    conn: &Connection,
    name: &str,
    args: FieldTable,
) -> Result<(), TopologyError> {
    let entity = Entity::Queue(name);
    let channel = fresh_channel(conn, entity).await?;
    let opts = QueueDeclareOptions {
        durable: true,
        ..Default::default()
    };
    let result = channel
        .queue_declare(short(name)?, opts, args)
        .await
        .map(drop);
    finish(channel, entity, result).await
}

async fn declare_exchange(
    conn: &Connection,
    name: &str,
    kind: ExchangeKind,
) -> Result<(), TopologyError> {
    let entity = Entity::Exchange(name);
    let channel = fresh_channel(conn, entity).await?;
    // amq.* names are reserved: the broker predeclares them and refuses to create more, so
    // only check that they exist.
    let passive = name.starts_with("amq.");
    let opts = ExchangeDeclareOptions {
        durable: true,
        passive,
        ..Default::default()
    };
    let result = channel
        .exchange_declare(short(name)?, kind, opts, FieldTable::default())
        .await;
    finish(channel, entity, result).await
}

/// Checks that exchange `name` exists (a passive declare): the broker answers `NOT_FOUND`
/// for one that does not.
pub async fn check_exchange(conn: &Connection, name: &str) -> Result<(), TopologyError> {
    if name.is_empty() {
        return Ok(()); // The default exchange always exists.
    }
    let entity = Entity::Exchange(name);
    let channel = fresh_channel(conn, entity).await?;
    let opts = ExchangeDeclareOptions {
        passive: true,
        ..Default::default()
    };
    let result = channel
        .exchange_declare(
            short(name)?,
            ExchangeKind::Direct,
            opts,
            FieldTable::default(),
        )
        .await;
    finish(channel, entity, result).await
}

async fn bind(
    conn: &Connection,
    queue: &str,
    exchange: &str,
    key: &str,
) -> Result<(), TopologyError> {
    let entity = Entity::Binding { queue, exchange };
    let channel = fresh_channel(conn, entity).await?;
    let result = channel
        .queue_bind(
            short(queue)?,
            short(exchange)?,
            short(key)?,
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await;
    finish(channel, entity, result).await
}

/// The queue `name` as the broker has it now, by a passive declare: its ready messages and
/// consumers. A queue that does not exist is an error (`NOT_FOUND`), which closes `channel`.
pub async fn queue_state(channel: &Channel, name: &str) -> lapin::Result<lapin::Queue> {
    let passive = QueueDeclareOptions {
        passive: true,
        ..Default::default()
    };
    channel
        .queue_declare(name.into(), passive, FieldTable::default())
        .await
}
