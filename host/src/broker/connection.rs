//! Opening a connection to RabbitMQ.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use lapin::{
    Connection, ConnectionProperties,
    uri::{AMQPScheme, AMQPUri},
};

use super::tls::{self, BrokerTlsConfig, TlsFailure};

pub use crate::redact::redact_url;
use crate::redact::scrub;

/// How to open a broker connection.
#[derive(Debug, Clone)]
pub struct ConnectOptions {
    /// Heartbeat interval proposed to the broker (the lower of both sides wins; zero asks
    /// for none, but the broker's own value then applies). A dead peer is noticed after
    /// about two missed heartbeats.
    pub heartbeat: Duration,
    /// Bound on TCP connect plus the AMQP handshake.
    pub connect_timeout: Duration,
    /// Shown as `connection_name` in RabbitMQ's management UI and `rabbitmqctl`.
    pub connection_name: String,
    /// `[broker.tls]`: the CA, server name and client certificate of `amqps://` connections.
    /// When set, a plain `amqp://` URL is refused rather than used in clear.
    pub tls: Option<BrokerTlsConfig>,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        Self {
            heartbeat: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(10),
            connection_name: "carteiro".to_owned(),
            tls: None,
        }
    }
}

/// Failure to reach or talk to the broker. Every URL inside is redacted.
#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    /// The URL does not parse; fix the `broker.url` setting.
    #[error("invalid broker URL {url}: {reason}; expected amqp://user:password@host:port/vhost")]
    InvalidUrl {
        /// The URL with its password replaced by `***`.
        url: String,
        /// Why it did not parse.
        reason: String,
    },
    /// TCP connect plus handshake took longer than `connect_timeout`.
    #[error(
        "no answer from the broker at {url} within {timeout:?}; is RabbitMQ running and reachable \
         (locally: scripts/rabbitmq.sh start)?"
    )]
    ConnectTimeout {
        /// The URL with its password replaced by `***`.
        url: String,
        /// The bound that expired.
        timeout: Duration,
    },
    /// The broker refused or dropped the connection (wrong credentials, unknown vhost,
    /// connection refused, ...).
    #[error("cannot connect to the broker at {url}: {reason}")]
    Connect {
        /// The URL with its password replaced by `***`.
        url: String,
        /// lapin's reason, with the password scrubbed.
        reason: String,
    },
    /// The TLS handshake failed: the broker's certificate is not signed by a trusted CA or
    /// does not carry the expected name, the broker refused Carteiro's client certificate, or
    /// the port does not speak TLS.
    #[error(
        "TLS handshake with the broker at {url} failed: {reason}; check [broker.tls] ca_file \
         (the CA that signed the broker's certificate), server_name (a name the certificate \
         carries) and that the URL's port is the broker's TLS listener"
    )]
    Tls {
        /// The URL with its password replaced by `***`.
        url: String,
        /// rustls's reason.
        reason: String,
    },
    /// `[broker.tls]` is set but the URL is plain `amqp://`: refused, never sent in clear.
    #[error(
        "refusing plain AMQP to {url}: [broker.tls] is set, so every broker URL must be amqps://"
    )]
    PlainRefused {
        /// The URL with its password replaced by `***`.
        url: String,
    },
    /// Opening or configuring a channel failed on an established connection.
    #[error("broker channel error: {0}")]
    Channel(String),
}

/// Opens one connection, bounded by `opts.connect_timeout`.
///
/// lapin's own reconnection ("auto recover") stays off: the gateway's supervisors reconnect,
/// redeclare and resubscribe themselves, so they know when consumption stopped.
pub async fn connect(url: &str, opts: &ConnectOptions) -> Result<Connection, BrokerError> {
    let redacted = redact_url(url);
    let mut uri: AMQPUri = url
        .parse()
        .map_err(|reason: String| BrokerError::InvalidUrl {
            url: redacted.clone(),
            reason: scrub(&reason.replace(url, &redacted), url),
        })?;
    // amq-protocol-uri 10.6 turns an IPv6 literal host into "localhost"; put it back.
    if let Some(host) = ipv6_host(url) {
        uri.authority.host = host;
    }
    // The URI's query is the only place lapin 4 takes a client heartbeat from.
    uri.query.heartbeat = Some(u16::try_from(opts.heartbeat.as_secs()).unwrap_or(u16::MAX));
    uri.query.connection_timeout = Some(
        opts.connect_timeout
            .as_millis()
            .try_into()
            .unwrap_or(u64::MAX),
    );
    let props =
        ConnectionProperties::default().with_connection_name(opts.connection_name.clone().into());
    let scheme = uri.scheme.clone();
    let connecting = async {
        match (&opts.tls, scheme) {
            (Some(tls), AMQPScheme::AMQPS) => tls::connect(uri, props, tls).await,
            (Some(_), AMQPScheme::AMQP) => Err(TlsFailure::PlainRefused),
            // lapin's own amqps:// path (system trust store): its handshake errors read the same.
            (None, _) => Connection::connect_uri(uri, props).await.map_err(|e| {
                if is_tls_error(&e) {
                    TlsFailure::Handshake(e.to_string())
                } else {
                    TlsFailure::Other(e.to_string())
                }
            }),
        }
    };
    match tokio::time::timeout(opts.connect_timeout, connecting).await {
        Ok(Ok(conn)) => Ok(conn),
        Ok(Err(TlsFailure::Handshake(reason))) => Err(BrokerError::Tls {
            reason: scrub(&reason, url),
            url: redacted,
        }),
        Ok(Err(TlsFailure::PlainRefused)) => Err(BrokerError::PlainRefused { url: redacted }),
        Ok(Err(TlsFailure::Other(reason))) => Err(BrokerError::Connect {
            reason: scrub(&reason, url),
            url: redacted,
        }),
        Err(_) => Err(BrokerError::ConnectTimeout {
            url: redacted,
            timeout: opts.connect_timeout,
        }),
    }
}

/// Whether lapin failed in the TLS handshake (rustls's error inside its I/O error).
fn is_tls_error(e: &lapin::Error) -> bool {
    matches!(e.kind(), lapin::ErrorKind::IOError(io)
        if io.get_ref().is_some_and(|inner| inner.is::<rustls::Error>()))
}

/// Where the next [`connect_any`] starts, so reconnects after a node loss do not all try
/// the dead node first.
static NEXT_ADDRESS: AtomicUsize = AtomicUsize::new(0);

/// Opens one connection to the first of `urls` that answers, starting one further along the
/// list on every call (a cluster's nodes; one URL behaves like [`connect`]). The error is the
/// last node's, naming how many were tried.
pub async fn connect_any(
    urls: &[String],
    opts: &ConnectOptions,
) -> Result<Connection, BrokerError> {
    let Some(first) = urls.first() else {
        return Err(BrokerError::InvalidUrl {
            url: String::new(),
            reason: "no broker URL configured".into(),
        });
    };
    if urls.len() == 1 {
        return connect(first, opts).await;
    }
    let start = NEXT_ADDRESS.fetch_add(1, Ordering::Relaxed);
    let mut last = None;
    for i in 0..urls.len() {
        let url = &urls[(start + i) % urls.len()];
        match connect(url, opts).await {
            Ok(conn) => return Ok(conn),
            Err(BrokerError::InvalidUrl { url, reason }) => {
                return Err(BrokerError::InvalidUrl { url, reason });
            }
            Err(e) => {
                tracing::warn!(error = %e, "broker node unreachable; trying the next");
                last = Some(e);
            }
        }
    }
    Err(last.map_or_else(
        || BrokerError::Channel("no broker node answered".into()),
        |e| BrokerError::Connect {
            url: format!("all {} nodes", urls.len()),
            reason: e.to_string(),
        },
    ))
}

/// `::1` from `amqp://u:p@[::1]:5672/v`.
fn ipv6_host(url: &str) -> Option<String> {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let rest = rest.rfind('@').map_or(rest, |at| &rest[at + 1..]);
    let inner = rest.strip_prefix('[')?;
    Some(inner[..inner.find(']')?].to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::broker::testing::test_url;

    #[test]
    fn ipv6_literal_hosts_survive() {
        assert_eq!(
            ipv6_host("amqp://u:p@[::1]:5672/%2f").as_deref(),
            Some("::1")
        );
        assert_eq!(ipv6_host("amqp://[fe80::1]/v").as_deref(), Some("fe80::1"));
        assert_eq!(ipv6_host("amqp://u:p@127.0.0.1:5672/%2f"), None);
    }

    #[test]
    fn scrub_removes_raw_and_decoded_password() {
        let url = "amqp://u:p%40ss@host/v";
        assert_eq!(scrub("bad p@ss and p%40ss", url), "bad *** and ***");
    }

    #[tokio::test]
    async fn connect_errors_never_show_the_password() {
        let good = test_url();
        let bad = good.replacen("guest:guest@", "guest:Wr0ngPassw0rd@", 1);
        assert_ne!(good, bad, "test URL must carry guest:guest credentials");
        let err = connect(&bad, &ConnectOptions::default())
            .await
            .expect_err("wrong password");
        let text = format!("{err} {err:?}");
        assert!(!text.contains("Wr0ngPassw0rd"), "password leaked: {text}");
        assert!(
            text.contains("guest:***@"),
            "URL should be shown redacted: {text}"
        );

        let err = connect(
            "amqp://guest:Wr0ngPassw0rd@127.0.0.1:1/%2f",
            &ConnectOptions::default(),
        )
        .await
        .expect_err("nothing listens on port 1");
        assert!(!format!("{err} {err:?}").contains("Wr0ngPassw0rd"));

        let err = connect("amqp//guest:Wr0ngPassw0rd@", &ConnectOptions::default())
            .await
            .expect_err("not a URL");
        assert!(matches!(err, BrokerError::InvalidUrl { .. }));
        assert!(!format!("{err} {err:?}").contains("Wr0ngPassw0rd"));
    }

    #[tokio::test]
    async fn connect_any_fails_over_past_a_dead_node_and_names_all_when_none_answers() {
        let opts = ConnectOptions {
            connect_timeout: Duration::from_secs(3),
            ..Default::default()
        };
        let dead = "amqp://guest:s3cretpw@127.0.0.1:1/%2f".to_owned();
        let urls = [dead.clone(), test_url()];
        // Whichever node the rotation starts at, the live one is reached.
        for _ in 0..2 {
            let conn = connect_any(&urls, &opts).await.expect("fail over");
            assert!(conn.status().connected());
        }
        let err = connect_any(&[dead.clone(), dead], &opts)
            .await
            .expect_err("no node answers")
            .to_string();
        assert!(err.contains("all 2 nodes"), "{err}");
        assert!(!err.contains("s3cretpw"), "{err}");
    }

    #[tokio::test]
    async fn tls_settings_refuse_a_plain_url() {
        let opts = ConnectOptions {
            tls: Some(BrokerTlsConfig::default()),
            ..Default::default()
        };
        let err = connect(&test_url(), &opts)
            .await
            .expect_err("plain refused");
        assert!(matches!(err, BrokerError::PlainRefused { .. }), "{err}");
        assert!(err.to_string().contains("must be amqps://"), "{err}");
    }

    #[tokio::test]
    async fn connect_negotiates_the_heartbeat() {
        let opts = ConnectOptions {
            heartbeat: Duration::from_secs(7),
            ..Default::default()
        };
        let conn = connect(&test_url(), &opts).await.expect("connect");
        assert_eq!(conn.configuration().heartbeat(), 7);
        assert!(conn.status().connected());
    }
}
