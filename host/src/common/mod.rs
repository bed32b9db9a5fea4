//! Small pieces shared by the pipeline, the relay, the dead-letter tools and housekeeping,
//! kept below all of them so none imports another for a utility: time, an alert's
//! raise/remind/clear cycle ([`alert`]), test-only fault injection, Carteiro's own AMQP
//! header names ([`header_names`]), the labels deliveries and retention purges are counted
//! by ([`labels`]), the attempt history a message carries on its copies ([`journey`]), PEM
//! files for TLS ([`pem`]), units in config and on the command line ([`units`]: sizes like
//! `64MiB`, durations), file permissions of secrets, and the one retry vocabulary every
//! retrying site names its policy from ([`retry`]).

pub mod alert;
pub mod header_names;
pub mod journey;
pub mod labels;
pub mod pem;
pub mod retry;
pub mod units;

/// Makes aws-lc-rs the process's rustls crypto provider, once (later calls do nothing).
/// lapin and sqlx use it; the CDC relay's replication client also compiles ring into rustls,
/// and with two providers rustls panics at the first TLS connection that names none
/// (sqlx's does). Called where TLS may start: `main`, and before every store connection.
pub fn use_aws_lc_rs() {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
}

/// Milliseconds since the Unix epoch (this process's clock).
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// `2026-12-02T10:00:00Z`: milliseconds since the epoch, to the second, for people.
pub fn rfc3339(ms: i64) -> String {
    let at =
        std::time::UNIX_EPOCH + std::time::Duration::from_millis(u64::try_from(ms).unwrap_or(0));
    humantime::format_rfc3339_seconds(at).to_string()
}

use std::path::Path;

/// The permission bits of `path` when its group or others may read or write it (Unix).
pub fn loose_permissions(path: &Path) -> Option<u32> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(path).ok()?.permissions().mode() & 0o777;
        (mode & 0o077 != 0).then_some(mode)
    }
    #[cfg(not(unix))]
    {
        let _ = path;
        None
    }
}

/// Test-only fault points (`CARTEIRO_FAULT`), used by the crash tests: the process stops
/// dead (no ack, no cleanup) at a chosen point, or panics on chosen messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultPoint {
    /// Before the commit of the first delivery.
    HangBeforeCommit,
    /// After the commit of the first delivery, before its ack.
    HangAfterCommit,
    /// A `[[dead_letter_queues]]` archiver stops after its first row's commit, before its ack.
    DlqHangAfterCommit,
    /// The relay stops after a row's confirm, before marking it published.
    RelayHangAfterConfirm,
    /// Processing panics for deliveries whose body starts with `panic`.
    PanicOnBody,
}

impl FaultPoint {
    pub fn from_env() -> Option<Self> {
        match std::env::var("CARTEIRO_FAULT").ok()?.as_str() {
            "hang-before-commit" => Some(Self::HangBeforeCommit),
            "hang-after-commit" => Some(Self::HangAfterCommit),
            "relay-hang-after-confirm" => Some(Self::RelayHangAfterConfirm),
            "dlq-hang-after-commit" => Some(Self::DlqHangAfterCommit),
            "panic-on-body" => Some(Self::PanicOnBody),
            _ => None,
        }
    }
}

/// Test-only: stop here forever so the test can SIGKILL the process at this exact point.
pub async fn hang_if(fault: Option<FaultPoint>, point: FaultPoint) {
    if fault == Some(point) {
        tracing::warn!(?point, "fault injection: hanging until killed");
        std::future::pending::<()>().await;
    }
}
