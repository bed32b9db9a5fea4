//! How loading a plugin or one delivery's call of it fails: the errors an operator reads,
//! and the classification of a guest's trap, timeout or limit (with the reason the guest
//! printed to stderr).

use std::time::Duration;

use wasmtime::Trap;

use crate::common::labels::FailureKind;
use crate::runtime::WorldProblem;
use crate::runtime::limits::{
    DeadlineReached, HostCallLimitExceeded, MemoryLimitExceeded, TotalExceeded,
};

/// Why a plugin could not be loaded. The message says which file and what to do.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("cannot read plugin `{name}` from {path}: {source}")]
    Read {
        name: String,
        path: String,
        source: std::io::Error,
    },
    #[error(
        "plugin `{name}` ({path}) has sha256 {actual}, but the config pins {expected}; \
         rebuild the plugin or update `sha256` if the new file is trusted"
    )]
    DigestMismatch {
        name: String,
        path: String,
        expected: String,
        actual: String,
    },
    #[error(
        "plugin `{name}` ({path}) is not a WebAssembly component: {detail}. Build it with \
         `cargo build --target wasm32-wasip2` (core modules are not accepted)"
    )]
    NotAComponent {
        name: String,
        path: String,
        detail: String,
    },
    #[error(
        "plugin `{name}` ({path}) is not a handler Carteiro runs: {detail}. Build it against \
         carteiro-sdk and export a handler with `export_handler!` or `export_batch_handler!` \
         (the carteiro:handler@0.1.0 worlds `handler` and `batch-handler`), or against \
         wasi:messaging@0.2.0-draft (world `messaging-core`, WIT in \
         plugin-sdk/wit/wasi-messaging-0.2.0-draft)"
    )]
    WrongWorld {
        name: String,
        path: String,
        detail: String,
    },
    #[error(
        "plugin `{name}` ({path}) is a wasi:messaging component Carteiro cannot run: {problem}"
    )]
    UnsupportedImport {
        name: String,
        path: String,
        problem: WorldProblem,
    },
}

/// A classified failure of one delivery's plugin call. The host stays healthy.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PluginFailure {
    #[error("plugin trapped: {0}")]
    Trap(String),
    #[error("plugin exceeded its timeout of {0:?}")]
    Timeout(Duration),
    #[error("plugin exceeded its memory limit: {0}")]
    Memory(String),
    #[error("plugin exceeded its host-call limit of {0}")]
    HostCallLimit(u32),
    #[error("plugin exceeded a per-delivery limit: {0}")]
    ResourceLimit(String),
    #[error("plugin could not be instantiated: {0}")]
    Instantiate(String),
}

impl PluginFailure {
    /// What kind of failure, for metrics and the `x-carteiro-failure` header.
    pub fn kind(&self) -> FailureKind {
        match self {
            Self::Trap(_) => FailureKind::Trap,
            Self::Timeout(_) => FailureKind::Timeout,
            Self::Memory(_) => FailureKind::Memory,
            Self::HostCallLimit(_) => FailureKind::HostCallLimit,
            Self::ResourceLimit(_) => FailureKind::ResourceLimit,
            Self::Instantiate(_) => FailureKind::Instantiate,
        }
    }
}

/// Maps a wasmtime error to the failure the route policy understands.
pub(super) fn classify(error: wasmtime::Error, timeout: Duration, stderr: &str) -> PluginFailure {
    if error.downcast_ref::<DeadlineReached>().is_some() {
        return PluginFailure::Timeout(timeout);
    }
    if let Some(limit) = error.downcast_ref::<MemoryLimitExceeded>() {
        return PluginFailure::Memory(limit.to_string());
    }
    if let Some(limit) = error.downcast_ref::<HostCallLimitExceeded>() {
        return PluginFailure::HostCallLimit(limit.0);
    }
    if let Some(total) = error.downcast_ref::<TotalExceeded>() {
        return PluginFailure::ResourceLimit(total.to_string());
    }
    let mut message = match error.downcast_ref::<Trap>() {
        Some(Trap::Interrupt) => return PluginFailure::Timeout(timeout),
        Some(Trap::StackOverflow) => "stack overflow".to_owned(),
        // Rust guests keep their stack in linear memory: overflowing it usually shows up as
        // an out-of-bounds access rather than a wasm stack overflow.
        Some(Trap::MemoryOutOfBounds) => {
            "out of bounds memory access (often a stack overflow in the guest)".to_owned()
        }
        Some(trap) => trap.to_string(),
        None => format!("{error:#}"),
    };
    // A Rust guest prints its panic message to stderr before trapping: that is the reason
    // an operator needs.
    // It reads `thread '..' panicked at FILE:LINE:COL:` and then the panic message.
    let lines: Vec<&str> = stderr.lines().collect();
    if let Some(at) = lines.iter().rposition(|l| l.contains("panicked")) {
        let location = lines[at].trim();
        match lines
            .get(at + 1)
            .map(|l| l.trim())
            .filter(|l| !l.is_empty())
        {
            Some(what) => message = format!("{message} ({location} {what})"),
            None => message = format!("{message} ({location})"),
        }
    } else {
        // Other guests (Python, JavaScript) print a traceback or stack: its last lines name
        // the error and where it was raised.
        let last: Vec<&str> = lines
            .iter()
            .map(|l| l.trim())
            .filter(|l| !l.is_empty())
            .rev()
            .take(3)
            .collect();
        if !last.is_empty() {
            let tail: Vec<&str> = last.into_iter().rev().collect();
            message = format!("{message} (stderr: {})", tail.join(" | "));
        }
    }
    PluginFailure::Trap(message)
}

/// Sends the guest's captured output to tracing under the plugin's name; returns stderr.
pub(super) fn forward_output(plugin: &str, stdout: &[u8], stderr: &[u8]) -> String {
    if stdout.is_empty() && stderr.is_empty() {
        return String::new();
    }
    let out = String::from_utf8_lossy(stdout);
    for line in out.lines().filter(|l| !l.is_empty()) {
        tracing::info!(plugin, stream = "stdout", "{line}");
    }
    let err = String::from_utf8_lossy(stderr).into_owned();
    for line in err.lines().filter(|l| !l.is_empty()) {
        tracing::warn!(plugin, stream = "stderr", "{line}");
    }
    err
}
