//! What a delivery says, once its Carteiro headers are checked: believed only on a copy
//! sealed for this route (see `broker::seal`), renamed `x-untrusted-carteiro-*` otherwise.

use super::context::RouteContext;
use crate::broker::field_table::{header_int, header_text, to_text_pairs};
use crate::common::header_names as h;
use crate::runtime::{Header, Message};
use lapin::message::Delivery;
use lapin::types::FieldTable;

/// The facts of one delivery, from trusted sources only.
#[derive(Debug, Clone)]
pub struct Received {
    /// The delivery's headers: Carteiro's own kept if sealed for this route, renamed if not;
    /// the seal itself removed.
    pub table: FieldTable,
    /// `table` as text pairs (what the plugin and key extraction see).
    pub headers: Vec<(String, String)>,
    /// The attempt this delivery counts as towards the route's limit: a trusted
    /// `x-carteiro-attempt`, else (see [`unsealed_from_own_tier`]) the copy's own, else 1.
    pub attempt: u32,
    /// The attempt the plugin is told: only a trusted `x-carteiro-attempt`, else 1.
    pub sealed_attempt: u32,
    /// When the message first failed, from a trusted `x-carteiro-first-failure-at` (only a
    /// sealed copy still has one: others were renamed).
    pub first_failure_at: Option<i64>,
    /// Where the message was first published (trusted headers, else the delivery's own).
    pub exchange: String,
    /// The routing key it was first published with (likewise).
    pub routing_key: String,
    /// The AMQP `message_id`, a possible idempotency key.
    pub message_id: Option<String>,
    /// The AMQP `content_type`, checked by the route's guard.
    pub content_type: Option<String>,
    /// The body's size in bytes, checked against the route's `max_body_size`.
    pub body_len: u64,
    /// Why the route refuses this delivery before any plugin code runs (docs/architecture.md,
    /// "One delivery", step 1: body size, content type), if it does.
    pub refused: Option<String>,
}

/// `x-carteiro-attempt` of `table`, when it holds a usable one.
fn attempt_in(table: &FieldTable) -> Option<u32> {
    header_int(Some(table), h::ATTEMPT)
        .and_then(|n| u32::try_from(n).ok())
        .map(|n| n.max(1))
}

/// The attempt of an unsealed copy that comes back from one of `queue`'s own retry tiers
/// (the broker's `x-first-death-*` say so): a seal that does not verify (a key rotated past
/// its window, two stores behind one broker) must never make retries unbounded, so its own
/// attempt header still counts towards the limit. A publisher who forges all of this only
/// gets fewer retries for its own message.
fn unsealed_from_own_tier(queue: &str, original: &FieldTable) -> Option<u32> {
    let died_in = header_text(Some(original), "x-first-death-queue")?;
    let expired = header_text(Some(original), "x-first-death-reason")? == "expired";
    let own_tier = died_in
        .strip_prefix(queue)
        .is_some_and(|rest| rest.starts_with(".retry."));
    (expired && own_tier)
        .then(|| attempt_in(original))
        .flatten()
}

impl Received {
    pub fn new(ctx: &RouteContext, delivery: &Delivery) -> Self {
        let props = &delivery.properties;
        let original = props.headers().clone().unwrap_or_default();
        let checked = ctx
            .deps
            .seal
            .check(&ctx.settings.queue, props, &delivery.data);
        let (table, trusted) = (checked.table, checked.trusted);
        if checked.unsealed {
            tracing::warn!(
                "delivery carries x-carteiro-* headers without a valid seal for this route; \
                 they are kept as x-untrusted-carteiro-* and not believed"
            );
        }
        let sealed_attempt = attempt_in(&table).unwrap_or(1);
        let attempt = match trusted {
            true => sealed_attempt,
            false => unsealed_from_own_tier(&ctx.settings.queue, &original).unwrap_or(1),
        };
        let exchange = header_text(Some(&table), h::ORIGINAL_EXCHANGE)
            .unwrap_or_else(|| delivery.exchange.as_str().to_owned());
        let routing_key = header_text(Some(&table), h::ORIGINAL_ROUTING_KEY)
            .unwrap_or_else(|| delivery.routing_key.as_str().to_owned());
        let mut received = Self {
            headers: to_text_pairs(&table),
            first_failure_at: header_int(Some(&table), h::FIRST_FAILURE_AT),
            table,
            attempt,
            sealed_attempt,
            exchange,
            routing_key,
            message_id: props.message_id().as_ref().map(|s| s.as_str().to_owned()),
            content_type: props.content_type().as_ref().map(|s| s.as_str().to_owned()),
            body_len: delivery.data.len() as u64,
            refused: None,
        };
        received.refused = received.guard(ctx);
        received
    }

    /// Why the route refuses this delivery before any plugin code runs, if it does.
    fn guard(&self, ctx: &RouteContext) -> Option<String> {
        let size = self.body_len;
        if size > ctx.settings.max_body_size {
            return Some(format!(
                "body of {size} bytes exceeds the route's max_body_size of {}",
                ctx.settings.max_body_size
            ));
        }
        if let Some(required) = &ctx.settings.content_type
            && self.content_type.as_deref() != Some(required.as_str())
        {
            return Some(format!(
                "content type {:?} is not the route's required `{required}`",
                self.content_type
            ));
        }
        None
    }

    /// The WIT message the plugin sees.
    pub fn message(&self, delivery: &Delivery) -> Message {
        Message {
            id: self.message_id.clone(),
            exchange: self.exchange.clone(),
            routing_key: self.routing_key.clone(),
            headers: self
                .headers
                .iter()
                .map(|(name, value)| Header {
                    name: name.clone(),
                    value: value.clone(),
                })
                .collect(),
            content_type: self.content_type.clone(),
            body: delivery.data.clone(),
            attempt: self.sealed_attempt,
            redelivered: delivery.redelivered,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::broker::outgoing::{set_int, set_text};

    fn from_tier(tier: &str, attempt: i64) -> FieldTable {
        let mut t = FieldTable::default();
        set_int(&mut t, "x-carteiro-attempt", attempt);
        set_text(&mut t, "x-first-death-queue", tier);
        set_text(&mut t, "x-first-death-reason", "expired");
        t
    }

    #[test]
    fn an_unsealed_copy_from_the_routes_own_tier_keeps_counting() {
        let t = from_tier("orders.retry.500ms", 4);
        assert_eq!(unsealed_from_own_tier("orders", &t), Some(4));
        // Another route's tier, another reason, or no attempt: not counted.
        assert_eq!(unsealed_from_own_tier("payments", &t), None);
        assert_eq!(
            unsealed_from_own_tier("orders", &from_tier("orders-eu.retry.5ms", 4)),
            None
        );
        let mut rejected = t.clone();
        set_text(&mut rejected, "x-first-death-reason", "rejected");
        assert_eq!(unsealed_from_own_tier("orders", &rejected), None);
        let mut plain = FieldTable::default();
        set_text(&mut plain, "x-first-death-queue", "orders.retry.500ms");
        set_text(&mut plain, "x-first-death-reason", "expired");
        assert_eq!(unsealed_from_own_tier("orders", &plain), None);
    }
}
