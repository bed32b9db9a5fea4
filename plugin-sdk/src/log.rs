//! Structured logging into the host's tracing, tagged with the plugin's name.
//!
//! Use the functions ([`info`], [`warn`], ...) with a ready string, or the formatting
//! macros [`info!`](crate::info), [`warn!`](crate::warn), ... like `format!`.

use crate::host;

/// Severity of a log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Level {
    /// Very detailed tracing.
    Trace,
    /// Debugging detail.
    Debug,
    /// Normal operation.
    Info,
    /// Something unexpected the handler recovered from.
    Warn,
    /// Something failed.
    Error,
}

/// Logs `message` at `level`.
pub fn log(level: Level, message: &str) {
    host::log(level, message);
}

/// Logs at trace level.
pub fn trace(message: &str) {
    log(Level::Trace, message);
}

/// Logs at debug level.
pub fn debug(message: &str) {
    log(Level::Debug, message);
}

/// Logs at info level.
pub fn info(message: &str) {
    log(Level::Info, message);
}

/// Logs at warn level.
pub fn warn(message: &str) {
    log(Level::Warn, message);
}

/// Logs at error level.
pub fn error(message: &str) {
    log(Level::Error, message);
}

/// Logs a `format!`-style message at trace level.
#[macro_export]
macro_rules! trace {
    ($($arg:tt)+) => { $crate::log::log($crate::log::Level::Trace, &::std::format!($($arg)+)) };
}

/// Logs a `format!`-style message at debug level.
#[macro_export]
macro_rules! debug {
    ($($arg:tt)+) => { $crate::log::log($crate::log::Level::Debug, &::std::format!($($arg)+)) };
}

/// Logs a `format!`-style message at info level.
#[macro_export]
macro_rules! info {
    ($($arg:tt)+) => { $crate::log::log($crate::log::Level::Info, &::std::format!($($arg)+)) };
}

/// Logs a `format!`-style message at warn level.
#[macro_export]
macro_rules! warn {
    ($($arg:tt)+) => { $crate::log::log($crate::log::Level::Warn, &::std::format!($($arg)+)) };
}

/// Logs a `format!`-style message at error level.
#[macro_export]
macro_rules! error {
    ($($arg:tt)+) => { $crate::log::log($crate::log::Level::Error, &::std::format!($($arg)+)) };
}
