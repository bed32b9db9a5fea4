//! Per-delivery resource limits: linear memory and tables via `ResourceLimiter`, and the
//! error types that let the pipeline classify a limit hit instead of a generic trap.

use std::time::Duration;
use wasmtime::ResourceLimiter;

/// The delivery's wall-clock budget ran out while the guest ran (the epoch callback).
#[derive(Debug, thiserror::Error)]
#[error("deadline of {0:?} reached")]
pub struct DeadlineReached(pub Duration);

/// The plugin tried to grow its memory past its cap.
#[derive(Debug, thiserror::Error)]
#[error("memory limit of {limit} bytes exceeded (tried to grow to {desired} bytes)")]
pub struct MemoryLimitExceeded {
    pub limit: usize,
    pub desired: usize,
}

/// The plugin made more host calls than one delivery may.
#[derive(Debug, thiserror::Error)]
#[error("host-call limit of {0} per delivery exceeded")]
pub struct HostCallLimitExceeded(pub u32);

/// Totals one delivery may hand the host, whatever the number of calls: each kv value and
/// event is capped on its own too, but without totals 10,000 host calls of 4 MiB each would
/// make the host hold about 40 GiB.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeliveryTotals {
    /// Bytes of kv keys and values written (overwrites count again).
    pub kv_bytes: u64,
    /// Bytes of outbox events emitted: payload, headers, exchange, routing key, content type.
    pub event_bytes: u64,
    /// Bytes of log messages.
    pub log_bytes: u64,
}

impl Default for DeliveryTotals {
    fn default() -> Self {
        Self {
            kv_bytes: 16 << 20,
            event_bytes: 16 << 20,
            log_bytes: 1 << 20,
        }
    }
}

/// The plugin handed the host more than one delivery's total allows.
#[derive(Debug, thiserror::Error)]
#[error("{what} total of {limit} bytes per delivery exceeded")]
pub struct TotalExceeded {
    pub what: &'static str,
    pub limit: u64,
}

/// Caps memory and table growth for one store: an instance's linear memory, which a reused
/// instance keeps from one delivery to the next, never grows past `memory_bytes`.
pub struct Limiter {
    pub memory_bytes: usize,
    pub table_elements: usize,
}

impl ResourceLimiter for Limiter {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.memory_bytes {
            // Trap with a typed error rather than failing the grow: a Rust guest would abort
            // with an opaque `unreachable` and the operator would not learn why.
            return Err(wasmtime::Error::new(MemoryLimitExceeded {
                limit: self.memory_bytes,
                desired,
            }));
        }
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= self.table_elements)
    }
}
