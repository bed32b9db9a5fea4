//! Per-delivery resource limits: linear memory and tables via `ResourceLimiter`, and the
//! error types that let the pipeline classify a limit hit instead of a generic trap.

use wasmtime::ResourceLimiter;

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

/// Caps memory and table growth for one store.
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
