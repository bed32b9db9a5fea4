//! The replication connection's settings, from the store URL: the same host, role, password,
//! database and TLS (`sslmode`, `sslrootcert`, `sslcert`, `sslkey`, as `[store] url` holds
//! them after `check_tls_params`), so the relay reads the slot of the database it writes.

use std::path::PathBuf;
use std::time::Duration;

use pgwire_replication::{ReplicationConfig, SslMode, TlsConfig};

/// Why the store URL cannot open a replication connection.
#[derive(Debug, thiserror::Error)]
pub enum ReplicationUrlError {
    #[error("[store] url is not a valid PostgreSQL URL ({0})")]
    Url(#[from] url::ParseError),
    #[error("[store] url has no host; the CDC relay connects over TCP")]
    NoHost,
    #[error("[store] url has sslmode={0}, which the CDC relay does not support")]
    Mode(String),
}

/// How often the relay tells the slot how far it is done: the longest a confirmed and
/// marked row stays re-readable after a crash beyond the in-flight window.
pub const STATUS_INTERVAL: Duration = Duration::from_secs(1);

/// Messages the replication client reads ahead of the relay. Each is one row (or a
/// transaction's begin or commit), and a row's bytea payload arrives as hex text, twice its
/// size: with 8, rows of 512 KiB held 8 MiB more beyond the window (24 MiB of peak RSS
/// growth measured for one 80 MiB commit, against 13–14 MiB with 2).
const READ_AHEAD: usize = 2;

/// The replication session for `slot` and `publication` on the store at `store_url`.
pub fn replication_config(
    store_url: &str,
    slot: &str,
    publication: &str,
) -> Result<ReplicationConfig, ReplicationUrlError> {
    let url = url::Url::parse(store_url)?;
    let host = url
        .host_str()
        .ok_or(ReplicationUrlError::NoHost)?
        .to_owned();
    let decode = |s: &str| {
        percent_encoding::percent_decode_str(s)
            .decode_utf8_lossy()
            .into_owned()
    };
    let user = match url.username() {
        "" => "postgres".to_owned(),
        u => decode(u),
    };
    let password = url.password().map(decode).unwrap_or_default();
    let database = match url.path().trim_start_matches('/') {
        "" => user.clone(),
        d => decode(d),
    };
    // libpq's default is `prefer`, and so is sqlx's.
    let mut tls = TlsConfig {
        mode: SslMode::Prefer,
        ..TlsConfig::default()
    };
    for (name, value) in url.query_pairs() {
        match name.as_ref() {
            "sslmode" | "ssl-mode" => {
                tls.mode = match value.as_ref() {
                    "disable" => SslMode::Disable,
                    "prefer" => SslMode::Prefer,
                    "require" => SslMode::Require,
                    "verify-ca" => SslMode::VerifyCa,
                    "verify-full" => SslMode::VerifyFull,
                    other => return Err(ReplicationUrlError::Mode(other.to_owned())),
                }
            }
            "sslrootcert" | "ssl-root-cert" | "ssl-ca" => {
                tls.ca_pem_path = Some(PathBuf::from(value.as_ref()))
            }
            "sslcert" | "ssl-cert" => {
                tls.client_cert_pem_path = Some(PathBuf::from(value.as_ref()))
            }
            "sslkey" | "ssl-key" => tls.client_key_pem_path = Some(PathBuf::from(value.as_ref())),
            _ => {}
        }
    }
    Ok(
        ReplicationConfig::new(host, user, password, database, slot, publication)
            .with_port(url.port().unwrap_or(5432))
            .with_tls(tls)
            .with_status_interval(STATUS_INTERVAL)
            .with_wakeup_interval(Duration::from_secs(5))
            // Bounded: a relay whose window is full stops reading, and the walsender waits.
            // Counted in messages, not bytes, so kept small: READ_AHEAD rows of the largest
            // size are what the relay may hold beyond its window.
            .with_buffer_size(READ_AHEAD)
            .with_application_name("carteiro cdc relay"),
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn the_store_url_gives_host_role_database_and_tls() {
        let c = replication_config(
            "postgres://app:p%40ss@db.internal:6543/carteiro?sslmode=verify-full&sslrootcert=/etc/ca.pem&sslcert=/c.pem&sslkey=/k.pem",
            "carteiro_outbox",
            "carteiro_outbox",
        )
        .unwrap();
        assert_eq!(
            (
                c.host.as_str(),
                c.port,
                c.user.as_str(),
                c.password.as_str()
            ),
            ("db.internal", 6543, "app", "p@ss")
        );
        assert_eq!(c.database, "carteiro");
        assert_eq!(c.slot, "carteiro_outbox");
        assert_eq!(c.tls.mode, SslMode::VerifyFull);
        assert_eq!(c.tls.ca_pem_path, Some(PathBuf::from("/etc/ca.pem")));
        assert!(c.tls.is_mtls());

        let plain = replication_config("postgres://127.0.0.1/x", "s", "p").unwrap();
        assert_eq!((plain.port, plain.user.as_str()), (5432, "postgres"));
        assert_eq!(plain.tls.mode, SslMode::Prefer, "libpq's default");
        assert!(matches!(
            replication_config("postgres://h/x?sslmode=allow", "s", "p"),
            Err(ReplicationUrlError::Mode(_))
        ));
    }
}
