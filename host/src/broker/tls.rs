//! TLS to the broker (`amqps://` with `[broker.tls]`): which CA to trust, which name the
//! broker's certificate must carry, and the client certificate Carteiro presents (RabbitMQ's
//! `EXTERNAL` mechanism logs in with it).
//!
//! lapin's own `amqps://` path trusts the platform store plus extra roots and checks the URL's
//! host only. With `[broker.tls]` the gateway hands lapin a connector of its own instead
//! (`Connection::connector`): rustls with exactly the configured CA (or the platform store
//! when none is set), the configured server name, and the client certificate. Files are read
//! on every connect, so certificates rotated on disk are used by the next reconnect.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use lapin::tcp::{AsyncTcpStream, RustlsConnector, RustlsConnectorConfig};
use lapin::uri::AMQPUri;
use lapin::{Connection, ConnectionProperties};
use rustls_pki_types::ServerName;
use serde::Deserialize;

use crate::common::pem::{PemError, read_certs, read_key};

/// Why no TLS connector could be built from `[broker.tls]` (the files are read on every
/// connect, so one may have changed since start-up).
#[derive(Debug, thiserror::Error)]
pub enum BrokerTlsError {
    /// `ca_file`, `cert_file` or `key_file` is not usable.
    #[error("[broker.tls] {key}: {error}")]
    File {
        /// The key under `[broker.tls]`.
        key: &'static str,
        #[source]
        error: PemError,
    },
    /// rustls refused the certificates or the key.
    #[error("cannot set up TLS from [broker.tls]: {0}")]
    Setup(#[source] io::Error),
}

/// `[broker.tls]`: how an `amqps://` connection checks the broker and proves who Carteiro is.
/// Every URL of `[broker]` must then be `amqps://`; nothing is ever sent in clear.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BrokerTlsConfig {
    /// PEM file with the CA certificate(s) that signed the broker's certificate (relative to
    /// the config file). When set, only these are trusted; unset, the system trust store is.
    pub ca_file: Option<PathBuf>,
    /// The name the broker's certificate must carry (a DNS name or an IP address). Default:
    /// the host of the URL being connected to.
    pub server_name: Option<String>,
    /// PEM file with the client certificate (and its chain) Carteiro presents, for brokers
    /// that verify peers (`ssl_options.verify = verify_peer`) and for `?auth_mechanism=external`
    /// in the URL. Needs `key_file`.
    pub cert_file: Option<PathBuf>,
    /// PEM file with the private key of `cert_file` (PKCS#8, PKCS#1 or SEC1, unencrypted).
    pub key_file: Option<PathBuf>,
}

impl BrokerTlsConfig {
    /// Resolves relative paths against `base_dir` and checks every file and name, so a bad
    /// setting stops `carteiro check`/`run` before any connection. `Err((key, message))`,
    /// with the key under `broker.tls`.
    pub fn validate(&mut self, base_dir: &Path) -> Result<(), (&'static str, String)> {
        for path in [&mut self.ca_file, &mut self.cert_file, &mut self.key_file]
            .into_iter()
            .flatten()
        {
            if path.is_relative() {
                *path = base_dir.join(&*path);
            }
        }
        if let Some(ca) = &self.ca_file {
            read_certs(ca).map_err(|m| ("ca_file", m.to_string()))?;
        }
        match (&self.cert_file, &self.key_file) {
            (Some(cert), Some(key)) => {
                read_certs(cert).map_err(|m| ("cert_file", m.to_string()))?;
                read_key(key).map_err(|m| ("key_file", m.to_string()))?;
            }
            (Some(_), None) => {
                return Err((
                    "key_file",
                    "missing: `cert_file` needs its `key_file`".into(),
                ));
            }
            (None, Some(_)) => {
                return Err((
                    "cert_file",
                    "missing: `key_file` needs its `cert_file`".into(),
                ));
            }
            (None, None) => {}
        }
        if let Some(name) = &self.server_name {
            ServerName::try_from(name.as_str()).map_err(|_| {
                (
                    "server_name",
                    format!("`{name}` is neither a DNS name nor an IP address"),
                )
            })?;
        }
        Ok(())
    }

    /// The rustls connector for these settings (reads the files now).
    fn connector(&self) -> Result<RustlsConnector, BrokerTlsError> {
        let file = |key: &'static str| move |error: PemError| BrokerTlsError::File { key, error };
        let config = match &self.ca_file {
            Some(ca) => RustlsConnectorConfig::default()
                .with_parsable_certificates(read_certs(ca).map_err(file("ca_file"))?),
            None => RustlsConnectorConfig::new_with_platform_verifier(),
        };
        let built = match (&self.cert_file, &self.key_file) {
            (Some(cert), Some(key)) => config.connector_with_single_cert(
                read_certs(cert).map_err(file("cert_file"))?,
                read_key(key).map_err(file("key_file"))?,
            ),
            _ => config.connector_with_no_client_auth(),
        };
        built.map_err(BrokerTlsError::Setup)
    }
}

/// Why a TLS connection did not come up.
pub(super) enum TlsFailure {
    /// The handshake failed (an untrusted certificate, a name mismatch, a refused client
    /// certificate, a peer that does not speak TLS).
    Handshake(String),
    /// `[broker.tls]` is set and the URL is plain `amqp://`.
    PlainRefused,
    /// Anything else: the files, TCP, or the AMQP handshake after TLS (e.g. credentials).
    Other(String),
}

/// Opens `uri` (an `amqps://` URI) over TLS set up from `tls`.
pub(super) async fn connect(
    uri: AMQPUri,
    props: ConnectionProperties,
    tls: &BrokerTlsConfig,
) -> Result<Connection, TlsFailure> {
    let connector = tls
        .connector()
        .map_err(|e| TlsFailure::Other(e.to_string()))?;
    let server_name = tls
        .server_name
        .clone()
        .unwrap_or_else(|| uri.authority.host.clone());
    let runtime =
        lapin::runtime::default_runtime().map_err(|e| TlsFailure::Other(e.to_string()))?;
    // The connector reports through lapin's error type; keep the handshake's own words.
    let handshake_error = Arc::new(Mutex::new(None::<String>));
    let slot = Arc::clone(&handshake_error);
    let result = Connection::connector(
        uri,
        runtime,
        async move |uri, runtime| {
            let (host, port) = (uri.authority.host.clone(), uri.authority.port);
            let addrs: Vec<_> = tokio::net::lookup_host((host.as_str(), port))
                .await?
                .collect();
            let stream = AsyncTcpStream::connect(&runtime, addrs).await?;
            match stream.into_rustls(&connector, &server_name).await {
                Ok(stream) => Ok(stream),
                Err(e) => {
                    if let Ok(mut slot) = slot.lock() {
                        *slot = Some(e.to_string());
                    }
                    Err(io::Error::new(e.kind(), e.to_string()).into())
                }
            }
        },
        props,
    )
    .await;
    result.map_err(|e| {
        let handshake = handshake_error.lock().ok().and_then(|mut s| s.take());
        match handshake {
            Some(why) => TlsFailure::Handshake(why),
            None => TlsFailure::Other(e.to_string()),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_names_the_key_of_a_missing_or_empty_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("empty.pem"), "not a certificate\n").expect("write");
        // The key and message `validate` refuses `settings` with (`what` is wrong there).
        let refused = |settings: &str, what: &str| {
            let mut tls: BrokerTlsConfig = toml::from_str(settings).expect(settings);
            tls.validate(dir.path()).expect_err(what)
        };
        let (key, message) = refused(r#"ca_file = "nope.pem""#, "missing CA");
        assert_eq!(key, "ca_file");
        assert!(message.contains("nope.pem"), "{message}");
        let (key, message) = refused(r#"ca_file = "empty.pem""#, "no certificate");
        assert_eq!(key, "ca_file");
        assert!(message.contains("no PEM certificate"), "{message}");
        assert_eq!(
            refused(r#"cert_file = "empty.pem""#, "no key").0,
            "key_file"
        );
        assert_eq!(
            refused(r#"server_name = "not a name""#, "bad name").0,
            "server_name"
        );
    }
}
