//! The second `bindgen!` of the host: the world `messaging-core` of the vendored
//! `wasi:messaging@0.2.0-draft` (its own folder, so the `carteiro:handler` bindings in
//! `runtime::bindings` never see this package). Every import is async and trappable, like
//! carteiro:handler's: the host-call cap and the per-delivery totals trap. The two resources
//! are host data kept in the store's resource table (`runtime::standard::host`).

wasmtime::component::bindgen!({
    path: "../plugin-sdk/wit/wasi-messaging-0.2.0-draft",
    world: "messaging-core",
    imports: { default: async | trappable },
    exports: { default: async },
    with: {
        "wasi:messaging/types.client": crate::runtime::standard::resources::ClientData,
        "wasi:messaging/types.message": crate::runtime::standard::resources::MessageData,
    },
});

pub use self::wasi::messaging::{producer, types};
