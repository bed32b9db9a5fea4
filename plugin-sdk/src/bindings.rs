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
