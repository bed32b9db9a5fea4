//! The one `bindgen!` of the host, generated from the SDK's WIT folder (single source of truth).
//! Every import is async (kv reads hit the database) and trappable (host-call caps trap).

wasmtime::component::bindgen!({
    path: "../plugin-sdk/wit",
    world: "handler",
    imports: { default: async | trappable },
    exports: { default: async },
});

pub use self::carteiro::handler::{config, kv, log, outbox, types};
