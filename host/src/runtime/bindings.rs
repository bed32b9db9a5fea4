//! The one `bindgen!` of the host, generated from the SDK's WIT folder (single source of truth).
//! Every import is async (kv reads hit the database) and trappable (host-call caps trap).

wasmtime::component::bindgen!({
    path: "../plugin-sdk/wit",
    world: "handler",
    imports: { default: async | trappable },
    exports: { default: async },
});

pub use self::carteiro::handler::{config, kv, log, outbox, types};

/// The `batch-handler` world (a handler that also exports `handle-batch`), generated from the
/// same WIT folder. Its interfaces shared with `handler` are the ones above (`with`), so a
/// message, a verdict and the host traits are one type whichever world a component has; only
/// the `batch` import is new.
pub mod batch_world {
    wasmtime::component::bindgen!({
        path: "../plugin-sdk/wit",
        world: "batch-handler",
        imports: { default: async | trappable },
        exports: { default: async },
        with: {
            "carteiro:handler/types@0.1.0": crate::runtime::bindings::carteiro::handler::types,
            "carteiro:handler/kv@0.1.0": crate::runtime::bindings::carteiro::handler::kv,
            "carteiro:handler/outbox@0.1.0": crate::runtime::bindings::carteiro::handler::outbox,
            "carteiro:handler/log@0.1.0": crate::runtime::bindings::carteiro::handler::log,
            "carteiro:handler/config@0.1.0": crate::runtime::bindings::carteiro::handler::config,
        },
    });

    pub use self::carteiro::handler::batch;
}
