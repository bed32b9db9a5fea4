//! The host side of the wasi:messaging imports (`types`, `producer`) for one delivery. The
//! two resources are host data in the instance's resource table; every call counts against
//! the plugin's host-call cap, and the bytes a guest hands over (message data, metadata,
//! content types, topics) against the delivery's event total, exactly like carteiro:handler's
//! `outbox::emit`. `producer.send` records an outbox event in the delivery's `Effects`: it
//! commits with the delivery's inbox record, or not at all.

use super::bindings::{producer, types};
pub use super::resources::{ClientData, MessageData};

/// The longest client name `client.connect` accepts (an AMQP short string).
const MAX_CLIENT_NAME_BYTES: usize = 255;
use super::resources::is_own_header;
use crate::runtime::effects::EmittedEvent;
use crate::runtime::host::{HostCalls, HostState, MAX_EVENT_PAYLOAD_BYTES};
use carteiro_sdk::rules::event_problem;
use wasmtime::component::{HasData, Resource, ResourceTable};

/// What the standard imports act on: the instance's resource table and the delivery's
/// host-call state (the same `HostCalls` the carteiro:handler imports use).
pub struct StandardHost<'a> {
    table: &'a mut ResourceTable,
    calls: &'a mut HostCalls,
}

/// The `HasData` of the standard imports in the shared linker.
pub struct StandardData;

impl HasData for StandardData {
    type Data<'a> = StandardHost<'a>;
}

/// The standard imports' view of a store's state.
pub fn view(state: &mut HostState) -> StandardHost<'_> {
    let (table, calls) = state.parts();
    StandardHost { table, calls }
}

impl StandardHost<'_> {
    /// A host call that reads a `field` of `message`.
    fn read<T: Clone>(
        &mut self,
        message: &Resource<MessageData>,
        field: impl FnOnce(&MessageData) -> &T,
    ) -> wasmtime::Result<T> {
        self.calls.count_call()?;
        Ok(field(self.table.get(message)?).clone())
    }

    /// A host call that hands over `bytes` (counted against the event total) and makes a
    /// `change` to `message` with them.
    fn write(
        &mut self,
        message: &Resource<MessageData>,
        bytes: usize,
        change: impl FnOnce(&mut MessageData),
    ) -> wasmtime::Result<()> {
        self.calls.count_call()?;
        self.calls.spend("event", bytes)?;
        change(self.message_mut(message)?);
        Ok(())
    }

    fn message_mut(
        &mut self,
        message: &Resource<MessageData>,
    ) -> wasmtime::Result<&mut MessageData> {
        Ok(self.table.get_mut(message)?)
    }
}

impl types::Host for StandardHost<'_> {}

impl types::HostClient for StandardHost<'_> {
    async fn connect(
        &mut self,
        name: String,
    ) -> wasmtime::Result<Result<Resource<ClientData>, types::Error>> {
        self.calls.count_call()?;
        let plugin = self.calls.plugin();
        if plugin.standard_exchange.is_none() {
            return Ok(Err(types::Error::PermissionDenied(format!(
                "plugin `{}` may not send: the operator sets [plugins.{}] standard_exchange",
                plugin.name, plugin.name
            ))));
        }
        if name.len() > MAX_CLIENT_NAME_BYTES || name.contains('\0') {
            return Ok(Err(types::Error::Other(format!(
                "a client name is at most {MAX_CLIENT_NAME_BYTES} bytes, without NUL"
            ))));
        }
        Ok(Ok(self.table.push(ClientData { name })?))
    }

    async fn disconnect(
        &mut self,
        client: Resource<ClientData>,
    ) -> wasmtime::Result<Result<(), types::Error>> {
        self.calls.count_call()?;
        // Nothing to close: sends are outbox rows, published by the relay after commit.
        self.table.get(&client)?;
        Ok(Ok(()))
    }

    async fn drop(&mut self, client: Resource<ClientData>) -> wasmtime::Result<()> {
        self.table.delete(client)?;
        Ok(())
    }
}

impl types::HostMessage for StandardHost<'_> {
    async fn new(&mut self, data: Vec<u8>) -> wasmtime::Result<Resource<MessageData>> {
        self.calls.count_call()?;
        self.calls.spend("event", data.len())?;
        Ok(self.table.push(MessageData {
            data,
            ..MessageData::default()
        })?)
    }

    async fn topic(&mut self, message: Resource<MessageData>) -> wasmtime::Result<Option<String>> {
        self.read(&message, |m| &m.topic)
    }

    async fn content_type(
        &mut self,
        message: Resource<MessageData>,
    ) -> wasmtime::Result<Option<String>> {
        self.read(&message, |m| &m.content_type)
    }

    async fn set_content_type(
        &mut self,
        message: Resource<MessageData>,
        content_type: String,
    ) -> wasmtime::Result<()> {
        self.write(&message, content_type.len(), |m| {
            m.content_type = Some(content_type);
        })
    }

    async fn data(&mut self, message: Resource<MessageData>) -> wasmtime::Result<Vec<u8>> {
        self.read(&message, |m| &m.data)
    }

    async fn set_data(
        &mut self,
        message: Resource<MessageData>,
        data: Vec<u8>,
    ) -> wasmtime::Result<()> {
        self.write(&message, data.len(), |m| m.data = data)
    }

    async fn metadata(
        &mut self,
        message: Resource<MessageData>,
    ) -> wasmtime::Result<Option<types::Metadata>> {
        self.read(&message, |m| &m.metadata)
    }

    async fn add_metadata(
        &mut self,
        message: Resource<MessageData>,
        key: String,
        value: String,
    ) -> wasmtime::Result<()> {
        self.write(&message, key.len() + value.len(), |m| {
            let entries = m.metadata.get_or_insert_default();
            // Overwrites an existing value for the key, as the WIT says.
            entries.retain(|(k, _)| *k != key);
            entries.push((key, value));
        })
    }

    async fn set_metadata(
        &mut self,
        message: Resource<MessageData>,
        meta: types::Metadata,
    ) -> wasmtime::Result<()> {
        let bytes = meta.iter().map(|(k, v)| k.len() + v.len()).sum();
        self.write(&message, bytes, |m| m.metadata = Some(meta))
    }

    async fn remove_metadata(
        &mut self,
        message: Resource<MessageData>,
        key: String,
    ) -> wasmtime::Result<()> {
        self.calls.count_call()?;
        if let Some(entries) = self.message_mut(&message)?.metadata.as_mut() {
            entries.retain(|(k, _)| *k != key);
        }
        Ok(())
    }

    async fn drop(&mut self, message: Resource<MessageData>) -> wasmtime::Result<()> {
        self.table.delete(message)?;
        Ok(())
    }
}

impl producer::Host for StandardHost<'_> {
    async fn send(
        &mut self,
        client: Resource<ClientData>,
        topic: String,
        message: Resource<MessageData>,
    ) -> wasmtime::Result<Result<(), types::Error>> {
        self.calls.count_call()?;
        // The message is the guest's to give (`own`): it is gone after this call, sent or not.
        let message = self.table.delete(message)?;
        self.table.get(&client)?;
        let plugin = self.calls.plugin();
        let Some(exchange) = plugin.standard_exchange.clone() else {
            return Ok(Err(types::Error::PermissionDenied(format!(
                "plugin `{}` may not send: the operator sets [plugins.{}] standard_exchange",
                plugin.name, plugin.name
            ))));
        };
        let max_events = plugin.max_events;
        let event = match standard_event(exchange, topic, message) {
            Ok(event) => event,
            Err(why) => return Ok(Err(types::Error::Other(why.to_string()))),
        };
        if self.calls.effects.events.len() as u32 >= max_events {
            return Ok(Err(types::Error::Other(format!(
                "this delivery already sent {max_events} messages, the most one may"
            ))));
        }
        // The data and metadata were counted when the guest handed them over.
        self.calls
            .spend("event", event.exchange.len() + event.routing_key.len())?;
        self.calls.effects.events.push(event);
        Ok(Ok(()))
    }
}

/// Why a `producer.send` cannot be recorded as an outbox event.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unsendable {
    /// AMQP cannot carry it (the rule's own text).
    #[error("{0}")]
    Amqp(String),
    /// Its data, in bytes, is over [`MAX_EVENT_PAYLOAD_BYTES`].
    #[error("the message's data is {0} bytes; the most is {MAX_EVENT_PAYLOAD_BYTES}")]
    TooLarge(usize),
}

/// The outbox event a `producer.send` of `message` to `topic` records: the plugin's
/// `standard_exchange`, the topic as routing key, metadata (Carteiro's own headers left
/// out) as headers. `Err`: why AMQP could not carry it.
pub fn standard_event(
    exchange: String,
    topic: String,
    message: MessageData,
) -> Result<EmittedEvent, Unsendable> {
    let headers: Vec<(String, String)> = message
        .metadata
        .unwrap_or_default()
        .into_iter()
        .filter(|(name, _)| !is_own_header(name))
        .collect();
    let shown = headers.iter().map(|(n, v)| (n.as_str(), v.as_str()));
    if let Some(why) = event_problem(&exchange, &topic, message.content_type.as_deref(), shown) {
        return Err(Unsendable::Amqp(why));
    }
    if message.data.len() > MAX_EVENT_PAYLOAD_BYTES {
        return Err(Unsendable::TooLarge(message.data.len()));
    }
    Ok(EmittedEvent {
        event_id: uuid::Uuid::now_v7(),
        exchange,
        routing_key: topic,
        headers,
        content_type: message.content_type,
        payload: message.data,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::bindings::types::{Header, Message};

    fn header(name: &str, value: &str) -> Header {
        Header {
            name: name.into(),
            value: value.into(),
        }
    }

    fn delivery() -> Message {
        Message {
            id: Some("m-1".into()),
            exchange: "orders".into(),
            routing_key: "order.created".into(),
            headers: vec![
                header("tenant", "acme"),
                header("x-carteiro-attempt", "3"),
                header("X-Carteiro-Seal", "forged"),
            ],
            content_type: Some("application/json".into()),
            body: b"{}".to_vec(),
            attempt: 3,
            redelivered: false,
        }
    }

    #[test]
    fn a_delivery_becomes_a_message_without_carteiros_headers() {
        let message = MessageData::incoming(&delivery());
        assert_eq!(message.topic.as_deref(), Some("order.created"));
        assert_eq!(message.content_type.as_deref(), Some("application/json"));
        assert_eq!(message.data, b"{}");
        assert_eq!(
            message.metadata,
            Some(vec![("tenant".to_owned(), "acme".to_owned())])
        );
    }

    #[test]
    fn a_sent_message_becomes_an_event_with_the_topic_as_routing_key() {
        let message = MessageData {
            topic: Some("ignored".into()),
            content_type: Some("text/plain".into()),
            data: b"done".to_vec(),
            metadata: Some(vec![
                ("tenant".into(), "acme".into()),
                ("x-carteiro-attempt".into(), "1".into()),
            ]),
        };
        let event = standard_event("sink".into(), "standard.done".into(), message).expect("valid");
        assert_eq!(event.exchange, "sink");
        assert_eq!(event.routing_key, "standard.done");
        assert_eq!(
            event.headers,
            vec![("tenant".to_owned(), "acme".to_owned())]
        );
        assert_eq!(event.content_type.as_deref(), Some("text/plain"));
        assert_eq!(event.payload, b"done");
    }

    #[test]
    fn a_message_amqp_cannot_carry_is_refused_with_the_reason() {
        let long_topic = "t".repeat(256);
        let why = standard_event("sink".into(), long_topic, MessageData::default())
            .expect_err("too long")
            .to_string();
        assert!(why.contains("routing key"), "{why}");
        let big = MessageData {
            data: vec![0; MAX_EVENT_PAYLOAD_BYTES + 1],
            ..MessageData::default()
        };
        let why = standard_event("sink".into(), "t".into(), big)
            .expect_err("too big")
            .to_string();
        assert!(why.contains("bytes"), "{why}");
    }
}
