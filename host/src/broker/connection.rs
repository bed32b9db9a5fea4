//! Opening a connection to RabbitMQ.

use std::time::Duration;

use lapin::{Connection, ConnectionProperties, uri::AMQPUri};

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
}

impl Default for ConnectOptions {
    fn default() -> Self {
        Self {
            heartbeat: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(10),
            connection_name: "carteiro".to_owned(),
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
    match tokio::time::timeout(opts.connect_timeout, Connection::connect_uri(uri, props)).await {
        Ok(Ok(conn)) => Ok(conn),
        Ok(Err(err)) => Err(BrokerError::Connect {
            reason: scrub(&err.to_string(), url),
            url: redacted,
        }),
        Err(_) => Err(BrokerError::ConnectTimeout {
            url: redacted,
            timeout: opts.connect_timeout,
        }),
    }
}

/// Returns `url` with the password replaced by `***`: `amqp://user:***@host:port/vhost`.
///
/// Works on text, not a parsed URL, so that even a URL lapin rejects can be shown. The
/// credentials end at the last `@`, so a password with a raw `@` or `/` is still hidden
/// (at worst a little of the host is hidden too).
pub fn redact_url(url: &str) -> String {
    let (scheme, rest) = match url.find("://") {
        Some(i) => url.split_at(i + 3),
        None => ("", url),
    };
    let Some(at) = rest.rfind('@') else {
        return url.to_owned();
    };
    let userinfo = &rest[..at];
    match userinfo.find(':') {
        Some(colon) => format!("{scheme}{}:***@{}", &userinfo[..colon], &rest[at + 1..]),
        None => url.to_owned(),
    }
}

/// `::1` from `amqp://u:p@[::1]:5672/v`.
fn ipv6_host(url: &str) -> Option<String> {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let rest = rest.rfind('@').map_or(rest, |at| &rest[at + 1..]);
    let inner = rest.strip_prefix('[')?;
    Some(inner[..inner.find(']')?].to_owned())
}

/// Removes the URL's password (raw and percent-decoded) from any error text.
fn scrub(text: &str, url: &str) -> String {
    let mut out = text.to_owned();
    if let Some(password) = password_of(url) {
        let decoded = percent_decode(&password);
        for secret in [password, decoded] {
            if !secret.is_empty() {
                out = out.replace(&secret, "***");
            }
        }
    }
    out
}

fn password_of(url: &str) -> Option<String> {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let userinfo = &rest[..rest.rfind('@')?];
    userinfo.split_once(':').map(|(_, p)| p.to_owned())
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok());
        match (bytes[i], hex.and_then(|h| u8::from_str_radix(h, 16).ok())) {
            (b'%', Some(b)) => {
                out.push(b);
                i += 3;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::broker::testing::test_url;

    #[test]
    fn redact_url_hides_the_password() {
        let cases = [
            (
                "amqp://guest:s3cret@127.0.0.1:5673/%2f",
                "amqp://guest:***@127.0.0.1:5673/%2f",
            ),
            (
                "amqps://u:p%40ss@host/vh?heartbeat=5",
                "amqps://u:***@host/vh?heartbeat=5",
            ),
            ("amqp://u:pa@ss/w@rd@host:1/v", "amqp://u:***@host:1/v"),
            ("amqp://host:5672/%2f", "amqp://host:5672/%2f"),
            ("amqp://user@host/v", "amqp://user@host/v"),
            ("u:topsecret@host", "u:***@host"),
        ];
        for (url, want) in cases {
            assert_eq!(redact_url(url), want, "redacting {url}");
        }
        for secret in ["s3cret", "p%40ss", "pa@ss/w@rd", "topsecret"] {
            for (url, _) in cases {
                assert!(
                    !redact_url(url).contains(secret),
                    "{secret} leaked from {url}"
                );
            }
        }
    }

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
