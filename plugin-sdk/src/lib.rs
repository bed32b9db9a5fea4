//! # carteiro-sdk
//!
//! Write [Carteiro](https://example.invalid/carteiro) message handlers as WebAssembly
//! components. A complete handler:
//!
//! ```
//! use carteiro_sdk::{export_handler, kv, outbox, Message, Verdict};
//!
//! fn handle(msg: Message) -> Verdict {
//!     let Ok(order) = msg.json::<serde_json::Value>() else {
//!         return Verdict::dead_letter("body is not JSON");
//!     };
//!     if let Err(e) = kv::incr("orders", 1) {
//!         return e.into(); // unavailable => retry, otherwise dead-letter
//!     }
//!     match outbox::emit_json("carteiro.events", "order.seen", &order) {
//!         Ok(_) => Verdict::Ack,
//!         Err(e) => e.into(),
//!     }
//! }
//!
//! export_handler!(handle);
//! ```
//!
//! Build it with `cargo build --release --target wasm32-wasip2` (crate type `cdylib`);
//! unit-test it natively with plain `cargo test` and [`testing`].
//!
//! # Layout
//! - [`Message`], [`Header`] (`message.rs`): the delivery, with `json`, `text`, `header`.
//! - [`Verdict`] (`verdict.rs`): ack, retry (optionally after a delay), dead-letter.
//! - [`kv`]: per-plugin key-value state inside the message's transaction.
//! - [`outbox`]: events published after the message commits.
//! - [`log`]: logging into the host's tracing, plus the `trace!`..`error!` macros.
//! - [`config`]: the plugin's variables from the operator's TOML.
//! - [`KvError`], [`OutboxError`] (`error.rs`): typed host errors, convertible to a
//!   [`Verdict`].
//! - [`export_handler!`]: exports a `fn(Message) -> Verdict` as the component's `handle`.
//! - [`export_batch_handler!`], [`Batch`] (`batch.rs`): exports a `fn(Batch) -> Vec<Verdict>`
//!   as `handle-batch` (and `handle`, a batch of one), for routes with `batch`.
//! - `host/`: the backend — real imports on wasm32 (`host/wasm.rs`), an in-memory mock
//!   everywhere else (`host/mock.rs`).
//! - [`testing`] (native only): drive the mock host from unit tests.
//! - `bindings.rs`: the single `wit_bindgen::generate!`, hidden from authors.
#![deny(missing_docs)]

// Lets the generated bindings name the runtime as `carteiro_sdk::wit_bindgen` both here and
// in the handler author's crate, where the export macro expands.
extern crate self as carteiro_sdk;

/// The `wit-bindgen` version the SDK was built with, so authors never pin it themselves.
pub use wit_bindgen;

mod batch;
#[doc(hidden)]
pub mod bindings;
pub mod config;
mod error;
mod host;
pub mod kv;
pub mod log;
mod message;
pub mod outbox;
pub mod rules;
#[cfg(not(target_arch = "wasm32"))]
pub mod testing;
mod verdict;

pub use batch::Batch;
pub use error::{KvError, OutboxError};
pub use message::{BodyError, Header, JsonError, Message};
pub use outbox::{Event, EventId};
pub use verdict::Verdict;

/// Exports `handler` — any `fn(Message) -> Verdict` — as the component's `handle` function.
///
/// Use it once per crate, at module level:
///
/// ```
/// use carteiro_sdk::{Message, Verdict};
///
/// fn handle(_msg: Message) -> Verdict {
///     Verdict::Ack
/// }
///
/// carteiro_sdk::export_handler!(handle);
/// ```
///
/// A handler with another signature is a compile error pointing at the handler:
///
/// ```compile_fail
/// fn handle(_msg: &str) -> bool {
///     true
/// }
///
/// carteiro_sdk::export_handler!(handle);
/// ```
///
/// Off wasm32 the macro only checks the signature; unit tests call the handler through
/// [`testing::run`].
#[macro_export]
macro_rules! export_handler {
    ($handler:path $(,)?) => {
        const _: () = {
            /// The handler, coerced to the one signature Carteiro accepts.
            const HANDLER: fn($crate::Message) -> $crate::Verdict = $handler;
            // Off wasm32 nothing calls the handler outside tests; this keeps it "used".
            let _ = HANDLER;

            #[cfg(target_arch = "wasm32")]
            struct CarteiroHandler;

            #[cfg(target_arch = "wasm32")]
            impl $crate::bindings::Guest for CarteiroHandler {
                fn handle(message: $crate::bindings::Message) -> $crate::bindings::Verdict {
                    $crate::__private::dispatch(HANDLER, message)
                }
            }

            #[cfg(target_arch = "wasm32")]
    $crate::bindings::export!(CarteiroHandler with_types_in $crate::bindings);
        };
    };
}

/// Exports `handler` — any `fn(Batch) -> Vec<Verdict>` — as the component's `handle-batch`
/// (world `batch-handler`), and as its `handle` too (a batch of one), so the plugin also
/// serves routes without `batch`.
///
/// Return one verdict per message, in order; the gateway retries every message of a batch
/// answered with another number. Each message's kv writes and events are its own (see
/// [`Batch`]), committed only if its verdict is ack.
///
/// ```
/// use carteiro_sdk::{kv, Batch, Message, Verdict};
///
/// fn handle_one(msg: Message) -> Verdict {
///     match kv::incr(&format!("seen/{}", msg.routing_key), 1) {
///         Ok(_) => Verdict::Ack,
///         Err(e) => e.into(),
///     }
/// }
///
/// fn handle_batch(batch: Batch) -> Vec<Verdict> {
///     batch.map(handle_one).collect()
/// }
///
/// carteiro_sdk::export_batch_handler!(handle_batch);
/// ```
///
/// A handler with another signature is a compile error pointing at the handler:
///
/// ```compile_fail
/// fn handle(_msg: carteiro_sdk::Message) -> carteiro_sdk::Verdict {
///     carteiro_sdk::Verdict::Ack
/// }
///
/// carteiro_sdk::export_batch_handler!(handle);
/// ```
///
/// Off wasm32 the macro only checks the signature; unit tests call the handler through
/// [`testing::run_batch`].
#[macro_export]
macro_rules! export_batch_handler {
    ($handler:path $(,)?) => {
        const _: () = {
            /// The handler, coerced to the one batch signature Carteiro accepts.
            const HANDLER: fn($crate::Batch) -> ::std::vec::Vec<$crate::Verdict> = $handler;
            let _ = HANDLER;

            #[cfg(target_arch = "wasm32")]
            struct CarteiroBatchHandler;

            #[cfg(target_arch = "wasm32")]
            impl $crate::bindings::batch_world::Guest for CarteiroBatchHandler {
                fn handle(
                    message: $crate::bindings::batch_world::Message,
                ) -> $crate::bindings::batch_world::Verdict {
                    $crate::__private::dispatch_one(HANDLER, message)
                }

                fn handle_batch(
                    messages: ::std::vec::Vec<$crate::bindings::batch_world::Message>,
                ) -> ::std::vec::Vec<$crate::bindings::batch_world::Verdict> {
                    $crate::__private::dispatch_batch(HANDLER, messages)
                }
            }

            #[cfg(target_arch = "wasm32")]
    $crate::bindings::batch_world::export_batch!(CarteiroBatchHandler with_types_in $crate::bindings::batch_world);
        };
    };
}

#[doc(hidden)]
pub mod __private {
    //! Glue used by [`export_handler!`](crate::export_handler); not a public API.

    use crate::bindings::carteiro::handler::types as wit;
    use crate::{Batch, Header, Message, Verdict};

    /// Converts the WIT message, runs the handler, converts its verdict back.
    pub fn dispatch(handler: fn(Message) -> Verdict, message: wit::Message) -> wit::Verdict {
        to_wit(handler(from_wit(message)))
    }

    /// Runs a batch handler on the messages of a `handle-batch` call.
    pub fn dispatch_batch(
        handler: fn(Batch) -> Vec<Verdict>,
        messages: Vec<wit::Message>,
    ) -> Vec<wit::Verdict> {
        let batch = Batch::new(messages.into_iter().map(from_wit).collect());
        handler(batch).into_iter().map(to_wit).collect()
    }

    /// Runs a batch handler on the one message of a `handle` call (a route without `batch`).
    pub fn dispatch_one(handler: fn(Batch) -> Vec<Verdict>, message: wit::Message) -> wit::Verdict {
        let mut verdicts = handler(Batch::single(from_wit(message)));
        match (verdicts.pop(), verdicts.is_empty()) {
            (Some(verdict), true) => to_wit(verdict),
            (popped, _) => to_wit(Verdict::retry(format!(
                "the batch handler returned {} verdicts for 1 message",
                verdicts.len() + usize::from(popped.is_some())
            ))),
        }
    }

    fn from_wit(m: wit::Message) -> Message {
        Message {
            id: m.id,
            exchange: m.exchange,
            routing_key: m.routing_key,
            headers: m
                .headers
                .into_iter()
                .map(|h| Header {
                    name: h.name,
                    value: h.value,
                })
                .collect(),
            content_type: m.content_type,
            body: m.body,
            attempt: m.attempt,
            redelivered: m.redelivered,
        }
    }

    fn to_wit(v: Verdict) -> wit::Verdict {
        match v {
            Verdict::Ack => wit::Verdict::Ack,
            Verdict::Retry { delay, reason } => wit::Verdict::Retry(wit::RetryRequest {
                delay_ms: delay.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
                reason,
            }),
            Verdict::DeadLetter { reason } => wit::Verdict::DeadLetter(reason),
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;
        use std::time::Duration;

        #[test]
        fn verdicts_convert_to_wit() {
            let retry = to_wit(Verdict::retry_after(Duration::from_millis(1500), "later"));
            assert!(matches!(
                retry,
                wit::Verdict::Retry(wit::RetryRequest { delay_ms: Some(1500), ref reason })
                    if reason == "later"
            ));
            assert!(matches!(
                to_wit(Verdict::retry_after(Duration::MAX, "x")),
                wit::Verdict::Retry(wit::RetryRequest {
                    delay_ms: Some(u64::MAX),
                    ..
                })
            ));
            assert!(matches!(to_wit(Verdict::Ack), wit::Verdict::Ack));
        }

        #[test]
        fn messages_convert_from_wit() {
            let m = from_wit(wit::Message {
                id: Some("m-1".into()),
                exchange: "ex".into(),
                routing_key: "rk".into(),
                headers: vec![wit::Header {
                    name: "h".into(),
                    value: "v".into(),
                }],
                content_type: None,
                body: b"{}".to_vec(),
                attempt: 3,
                redelivered: true,
            });
            assert_eq!(m.header("h"), Some("v"));
            assert_eq!(m.attempt, 3);
            assert!(m.redelivered);
        }
    }
}
