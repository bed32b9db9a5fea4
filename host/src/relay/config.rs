//! `[relay]`: the outbox relay's window, polling and lease, and the check that concerns only
//! them. (How long published rows are kept is `[outbox] retain_published`, in
//! `housekeeping/config.rs`; `[relay] retention` is its deprecated old name.)

use serde::Deserialize;
use std::time::Duration;

/// `[relay]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RelayConfig {
    /// Run the outbox relay inside `carteiro run`.
    #[serde(default = "default_true")]
    pub enabled: bool,
    /// The relay's window: rows leased and not yet settled (waiting behind their ordering
    /// key, publishing, or confirmed but not yet marked published) at once. Bounds the
    /// rows republished after a crash. A larger window means larger claims (fewer
    /// transactions per row): 1,024 drained PostgreSQL ~1.5x faster than 256 here.
    #[serde(default = "default_max_in_flight")]
    pub max_in_flight: usize,
    /// The relay's window in bytes (payload plus headers of the rows it holds in memory):
    /// a claim takes rows only while they fit, and always at least one row, so the relay
    /// holds at most this much plus one row. Accepts sizes like `64MiB`.
    #[serde(
        default = "default_max_in_flight_bytes",
        with = "crate::common::units::size"
    )]
    pub max_in_flight_bytes: u64,
    /// Backstop poll when no commit woke the relay.
    #[serde(default = "default_poll_interval", with = "humantime_serde")]
    pub poll_interval: Duration,
    /// Deprecated: the old name of `[outbox] retain_published`. Still read: loading the
    /// config logs a warning and moves the value there (a config setting both is refused),
    /// so after loading it is always `None`.
    #[serde(default, with = "humantime_serde")]
    pub retention: Option<Duration>,
    /// How long a claim leases its rows: a relay that stops (crash, SIGSTOP, lost database)
    /// hands its rows to another after this. Never below three publish timeouts.
    #[serde(default = "default_relay_lease", with = "humantime_serde")]
    pub lease: Duration,
}

fn default_true() -> bool {
    true
}
fn default_max_in_flight() -> usize {
    1024
}
fn default_max_in_flight_bytes() -> u64 {
    64 << 20
}
fn default_poll_interval() -> Duration {
    Duration::from_secs(1)
}
fn default_relay_lease() -> Duration {
    Duration::from_secs(30)
}

impl Default for RelayConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            max_in_flight: default_max_in_flight(),
            max_in_flight_bytes: default_max_in_flight_bytes(),
            poll_interval: default_poll_interval(),
            retention: None,
            lease: default_relay_lease(),
        }
    }
}

impl RelayConfig {
    /// `Err((key, message))` with the key under `relay`.
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        if self.max_in_flight_bytes == 0 {
            return Err((
                "max_in_flight_bytes",
                "must be at least 1 byte (a claim always takes one row anyway)".into(),
            ));
        }
        Ok(())
    }
}
