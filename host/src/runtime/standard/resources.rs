//! The two wasi:messaging resources as host data (`bindgen!`'s `with` maps them here, below
//! both the bindings and the imports that act on them).

use crate::runtime::bindings::types::Message;

/// Carteiro's own AMQP headers: never shown to a standard component as metadata, and never
/// taken from its metadata when it sends.
const OWN_HEADER_PREFIX: &str = "x-carteiro-";

/// A `wasi:messaging/types.message`: the delivery handed to `handle`, or one the guest built.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MessageData {
    pub topic: Option<String>,
    pub content_type: Option<String>,
    pub data: Vec<u8>,
    pub metadata: Option<Vec<(String, String)>>,
}

impl MessageData {
    /// The delivery as a standard message: routing key as topic, headers (Carteiro's own
    /// excluded) as metadata, content type and body.
    pub fn incoming(message: &Message) -> Self {
        let metadata: Vec<(String, String)> = message
            .headers
            .iter()
            .filter(|h| !is_own_header(&h.name))
            .map(|h| (h.name.clone(), h.value.clone()))
            .collect();
        Self {
            topic: Some(message.routing_key.clone()),
            content_type: message.content_type.clone(),
            data: message.body.clone(),
            metadata: Some(metadata),
        }
    }
}

/// A `wasi:messaging/types.client`. Every client of a plugin sends to the plugin's
/// `standard_exchange`; the name is the guest's label for it (logs only).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientData {
    pub name: String,
}

pub(super) fn is_own_header(name: &str) -> bool {
    name.as_bytes()
        .get(..OWN_HEADER_PREFIX.len())
        .is_some_and(|start| start.eq_ignore_ascii_case(OWN_HEADER_PREFIX.as_bytes()))
}
