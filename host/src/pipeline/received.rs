//! What a delivery says, once its Carteiro headers are checked: believed only on a copy
//! sealed for this route (see `broker::seal`), renamed `x-untrusted-carteiro-*` otherwise.

use super::context::RouteContext;
use crate::broker::headers::{header_int, header_text, to_text_pairs};
use crate::broker::seal;
use crate::common::headers as h;
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
    /// 1 unless a trusted `x-carteiro-attempt` says otherwise.
    pub attempt: u32,
    /// Where the message was first published (trusted headers, else the delivery's own).
    pub exchange: String,
    pub routing_key: String,
    pub message_id: Option<String>,
    pub content_type: Option<String>,
    pub body_len: u64,
}

impl Received {
    pub fn new(ctx: &RouteContext, delivery: &Delivery) -> Self {
        let props = &delivery.properties;
        let original = props.headers().clone().unwrap_or_default();
        let trusted = seal::has_ours(props) && ctx.seal.verify(&ctx.queue, props, &delivery.data);
        if seal::has_ours(props) && !trusted {
            tracing::warn!(
                "delivery carries x-carteiro-* headers without a valid seal for this route; \
                 they are kept as x-untrusted-carteiro-* and not believed"
            );
        }
        let table = seal::sanitize(&original, trusted);
        let attempt = header_int(Some(&table), h::ATTEMPT)
            .and_then(|n| u32::try_from(n).ok())
            .unwrap_or(1)
            .max(1);
        let exchange = header_text(Some(&table), h::ORIGINAL_EXCHANGE)
            .unwrap_or_else(|| delivery.exchange.as_str().to_owned());
        let routing_key = header_text(Some(&table), h::ORIGINAL_ROUTING_KEY)
            .unwrap_or_else(|| delivery.routing_key.as_str().to_owned());
        Self {
            headers: to_text_pairs(&table),
            table,
            attempt,
            exchange,
            routing_key,
            message_id: props.message_id().as_ref().map(|s| s.as_str().to_owned()),
            content_type: props.content_type().as_ref().map(|s| s.as_str().to_owned()),
            body_len: delivery.data.len() as u64,
        }
    }

    /// Why the route refuses this delivery before any plugin code runs, if it does.
    pub fn guard(&self, ctx: &RouteContext) -> Option<String> {
        let size = self.body_len;
        if size > ctx.max_body_size {
            return Some(format!(
                "body of {size} bytes exceeds the route's max_body_size of {}",
                ctx.max_body_size
            ));
        }
        if let Some(required) = &ctx.content_type
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
            attempt: self.attempt,
            redelivered: delivery.redelivered,
        }
    }
}
