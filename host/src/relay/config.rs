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
    /// Immediate dispatch (`poll` mode, inside `carteiro run`): the rows a commit writes go
    /// to this process's relay in memory, leased to it in their own transaction, instead of
    /// being claimed back out of the table. The table stays the path for rows of a crashed
    /// or other process. See docs/relay.md.
    #[serde(default = "default_true")]
    pub immediate: bool,
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
    /// How the relay finds committed rows: `poll` (claim them from the table, any store) or
    /// `cdc` (read them from a PostgreSQL logical replication slot; needs
    /// `wal_level = logical`). See docs/relay.md.
    #[serde(default)]
    pub mode: RelayMode,
    /// `cdc`: the replication slot the relays read (created if missing). One relay reads it
    /// at a time; the others stand by.
    #[serde(default = "default_slot")]
    pub slot: String,
    /// `cdc`: the publication on the outbox table (created if missing, inserts only).
    #[serde(default = "default_slot")]
    pub publication: String,
    /// `cdc`: above this much WAL held back by the slot (the broker down, no relay active),
    /// the relay logs an ERROR and raises `carteiro_relay_cdc_slot_lag_alert`. Sizes like
    /// `1GiB`. PostgreSQL's own bound is `max_slot_wal_keep_size`.
    #[serde(default = "default_max_slot_lag", with = "crate::common::units::size")]
    pub max_slot_lag: u64,
}

/// `[relay] mode`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RelayMode {
    /// Claim unpublished rows from the table (leases, `LISTEN/NOTIFY`, poll interval).
    #[default]
    Poll,
    /// Read inserted rows from a logical replication slot (PostgreSQL only).
    Cdc,
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
fn default_slot() -> String {
    "carteiro_outbox".to_owned()
}
fn default_max_slot_lag() -> u64 {
    1 << 30
}

impl Default for RelayConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            max_in_flight: default_max_in_flight(),
            max_in_flight_bytes: default_max_in_flight_bytes(),
            immediate: true,
            poll_interval: default_poll_interval(),
            retention: None,
            lease: default_relay_lease(),
            mode: RelayMode::Poll,
            slot: default_slot(),
            publication: default_slot(),
            max_slot_lag: default_max_slot_lag(),
        }
    }
}

/// A name PostgreSQL takes unquoted as a slot, a publication or a `NOTIFY` channel: 1 to 63
/// lower-case letters, digits and `_`.
pub(super) fn plain_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
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
        for (key, name) in [("slot", &self.slot), ("publication", &self.publication)] {
            if !plain_name(name) {
                return Err((
                    key,
                    format!("`{name}`: use 1 to 63 lower-case letters, digits and `_`"),
                ));
            }
        }
        Ok(())
    }

    /// `mode = "cdc"` needs PostgreSQL. `Err((key, message))` with the key under `relay`.
    pub fn validate_for_store(&self, store_url: &str) -> Result<(), (&'static str, String)> {
        let postgres =
            store_url.starts_with("postgres://") || store_url.starts_with("postgresql://");
        if self.mode == RelayMode::Cdc && !postgres {
            return Err((
                "mode",
                "\"cdc\" reads a PostgreSQL replication slot and [store] url is not PostgreSQL; \
                 use mode = \"poll\" with SQLite"
                    .into(),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn cdc_needs_postgres_and_plain_slot_names() {
        let cdc: RelayConfig = toml::from_str("mode = \"cdc\"\nmax_slot_lag = \"2GiB\"").unwrap();
        assert_eq!(cdc.mode, RelayMode::Cdc);
        assert_eq!(cdc.max_slot_lag, 2 << 30);
        assert_eq!(cdc.slot, "carteiro_outbox");
        let (key, why) = cdc.validate_for_store("sqlite:///tmp/x.db").unwrap_err();
        assert_eq!(key, "mode");
        assert!(why.contains("not PostgreSQL"), "{why}");
        assert!(cdc.validate_for_store("postgres://h/db").is_ok());
        assert!(
            RelayConfig::default()
                .validate_for_store("sqlite:///x")
                .is_ok()
        );
        let bad: RelayConfig = toml::from_str("slot = \"My-Slot\"").unwrap();
        assert_eq!(bad.validate().unwrap_err().0, "slot");
    }
}
