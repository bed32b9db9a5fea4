//! # Carteiro
//!
//! A RabbitMQ message-processing gateway whose handlers are sandboxed WebAssembly
//! components. See `../shared/DESIGN.md` and the README for the whole picture.
//!
//! # Layout
//! - [`config`]: the operator's TOML — types, validation, `${VAR}` interpolation.
//! - [`cli`]: the `carteiro` command line.
//! - [`runtime`]: the wasmtime sandbox — engine, limits, host imports, one call of `handle`.

pub mod cli;
pub mod config;
pub mod runtime;
