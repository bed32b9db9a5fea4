//! The one `wit_bindgen::generate!` of the SDK, generated from `plugin-sdk/wit`.
//!
//! Nothing here is part of the public API: the author-facing modules convert to and from
//! these types, and [`export_handler!`](crate::export_handler) expands to the generated
//! `export!` macro. Kept public (and hidden) only because that macro expands in the
//! author's crate.

#![allow(missing_docs, clippy::all)]

wit_bindgen::generate!({
    world: "handler",
    path: "wit",
    // The export macro expands in the handler author's crate, which reaches the runtime
    // through the SDK's re-export instead of depending on `wit-bindgen` itself.
    runtime_path: "carteiro_sdk::wit_bindgen::rt",
    pub_export_macro: true,
    export_macro_name: "export",
    default_bindings_module: "carteiro_sdk::bindings",
});

/// The `batch-handler` world: the same interfaces (`with`, so a message is one type), plus
/// the `batch` import and the `handle-batch` export that
/// [`export_batch_handler!`](crate::export_batch_handler) fills in. Its custom section lists
/// imports only (the exports come with the export macro), so a plain handler built with the
/// SDK does not become a batch handler.
pub mod batch_world {
    wit_bindgen::generate!({
        world: "batch-handler",
        path: "wit",
        with: {
            "carteiro:handler/types@0.1.0": crate::bindings::carteiro::handler::types,
            "carteiro:handler/kv@0.1.0": crate::bindings::carteiro::handler::kv,
            "carteiro:handler/outbox@0.1.0": crate::bindings::carteiro::handler::outbox,
            "carteiro:handler/log@0.1.0": crate::bindings::carteiro::handler::log,
            "carteiro:handler/config@0.1.0": crate::bindings::carteiro::handler::config,
        },
        runtime_path: "carteiro_sdk::wit_bindgen::rt",
        pub_export_macro: true,
        export_macro_name: "export_batch",
        default_bindings_module: "carteiro_sdk::bindings::batch_world",
    });
}
