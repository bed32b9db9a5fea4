//! TLS to PostgreSQL, set the way libpq users expect: `sslmode`, `sslrootcert`, `sslcert` and
//! `sslkey` in the `[store] url` query (sqlx reads them there, and so does every connection
//! the gateway opens: the pool, the migrations' own, the relay's `LISTEN`). This module only
//! checks them before anything connects, so a typo is a config error naming the parameter,
//! not a connection that quietly falls back to plain text.

use std::path::{Path, PathBuf};

use crate::common::pem::{PemError, read_certs, read_key};

/// The modes this build implements. libpq's `allow` (plain first, TLS if the server insists)
/// is not one: sqlx would treat it as `disable`.
const MODES: [&str; 5] = ["disable", "prefer", "require", "verify-ca", "verify-full"];

/// Why the TLS parameters of a PostgreSQL store URL are refused. Never quotes the URL (it
/// may hold a password).
#[derive(Debug, thiserror::Error)]
pub enum StoreTlsError {
    /// The URL does not parse.
    #[error("not a valid PostgreSQL URL ({0})")]
    Url(#[from] url::ParseError),
    /// An `sslmode` this build does not implement.
    #[error("sslmode={0} is not supported; use one of {modes}", modes = MODES.join(", "))]
    Mode(String),
    /// `sslrootcert`, `sslcert` or `sslkey` names a file that is not usable.
    #[error("{param}: {error}")]
    File {
        /// The libpq name of the parameter.
        param: &'static str,
        #[source]
        error: PemError,
    },
    /// Only one of `sslcert` and `sslkey` is set.
    #[error(
        "sslcert and sslkey go together: set both (the client certificate and its private \
         key) or neither"
    )]
    CertWithoutKey,
}

/// Checks the TLS parameters of a PostgreSQL store URL and returns the URL to use:
/// relative certificate paths resolved against `base_dir` (the config file's folder), and
/// `sslmode=require` with an `sslrootcert` raised to `verify-ca`, as libpq does. Other URLs
/// come back as they are. Errors never quote the URL (it may hold a password).
pub fn check_tls_params(store_url: &str, base_dir: &Path) -> Result<String, StoreTlsError> {
    let is_postgres =
        store_url.starts_with("postgres://") || store_url.starts_with("postgresql://");
    if !is_postgres || !store_url.contains('?') {
        return Ok(store_url.to_owned());
    }
    let mut url = url::Url::parse(store_url)?;
    let mut pairs: Vec<(String, String)> = url.query_pairs().into_owned().collect();
    let mut changed = false;
    let (mut mode, mut root, mut cert, mut key) = (None, None, None, None);
    for (name, value) in &mut pairs {
        match canonical(name) {
            Some("sslmode") => {
                if !MODES.contains(&value.as_str()) {
                    return Err(StoreTlsError::Mode(value.clone()));
                }
                mode = Some(value.clone());
            }
            Some(param) => {
                let path = PathBuf::from(&*value);
                let path = if path.is_relative() {
                    changed = true;
                    let joined = base_dir.join(path);
                    std::path::absolute(&joined).unwrap_or(joined)
                } else {
                    path
                };
                let checked = if param == "sslkey" {
                    read_key(&path).map(|_| ())
                } else {
                    read_certs(&path).map(|_| ())
                };
                checked.map_err(|error| StoreTlsError::File { param, error })?;
                *value = path.display().to_string();
                match param {
                    "sslrootcert" => root = Some(()),
                    "sslcert" => cert = Some(()),
                    _ => key = Some(()),
                }
            }
            None => {}
        }
    }
    if cert.is_some() != key.is_some() {
        return Err(StoreTlsError::CertWithoutKey);
    }
    if mode.as_deref() == Some("require") && root.is_some() {
        for (name, value) in &mut pairs {
            if canonical(name) == Some("sslmode") {
                *value = "verify-ca".into();
            }
        }
        changed = true;
    }
    if !changed {
        return Ok(store_url.to_owned());
    }
    // Only what would change the query's meaning is encoded, so file paths stay readable
    // in logs and errors (`sslrootcert=/etc/ca.pem`, not `%2Fetc%2Fca.pem`).
    let query: Vec<String> = pairs
        .iter()
        .map(|(k, v)| format!("{}={}", encode(k), encode(v)))
        .collect();
    url.set_query(Some(&query.join("&")));
    Ok(url.to_string())
}

/// Characters a query value cannot hold as they are.
const QUERY_VALUE: &percent_encoding::AsciiSet = &percent_encoding::CONTROLS
    .add(b' ')
    .add(b'"')
    .add(b'#')
    .add(b'%')
    .add(b'&')
    .add(b'+')
    .add(b'<')
    .add(b'=')
    .add(b'>');

fn encode(text: &str) -> String {
    percent_encoding::utf8_percent_encode(text, QUERY_VALUE).to_string()
}

/// The libpq name of a TLS parameter, under any spelling sqlx accepts.
fn canonical(name: &str) -> Option<&'static str> {
    match name {
        "sslmode" | "ssl-mode" => Some("sslmode"),
        "sslrootcert" | "ssl-root-cert" | "ssl-ca" => Some("sslrootcert"),
        "sslcert" | "ssl-cert" => Some("sslcert"),
        "sslkey" | "ssl-key" => Some("sslkey"),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CERT: &str = "-----BEGIN CERTIFICATE-----\nMAA=\n-----END CERTIFICATE-----\n";

    #[test]
    fn modes_and_files_are_checked_and_relative_paths_resolved() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("ca.pem"), CERT).expect("write");
        let base = dir.path();
        let url = "postgres://u:pw@db/c?sslmode=verify-full&sslrootcert=ca.pem";
        let out = check_tls_params(url, base).expect("valid");
        assert!(out.contains("sslmode=verify-full"), "{out}");
        assert!(
            out.contains(&format!("sslrootcert={}", base.join("ca.pem").display())),
            "{out}"
        );
        let parsed = url::Url::parse(&out).expect("a URL");
        let root = parsed.query_pairs().find(|(k, _)| k == "sslrootcert");
        let want = base.join("ca.pem").display().to_string();
        assert_eq!(root.map(|(_, v)| v.into_owned()), Some(want), "{out}");
        assert!(out.starts_with("postgres://u:pw@db/c?"), "{out}");

        let err = check_tls_params("postgres://u:pw@db/c?sslmode=allow", base)
            .unwrap_err()
            .to_string();
        assert!(err.contains("sslmode=allow is not supported"), "{err}");
        assert!(!err.contains("pw"), "{err}");

        let err = check_tls_params("postgres://db/c?sslmode=require&sslrootcert=no.pem", base)
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("sslrootcert: cannot read"), "{err}");

        let err = check_tls_params("postgres://db/c?sslcert=ca.pem", base)
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "sslcert and sslkey go together: set both (the client certificate and its private \
             key) or neither"
        );

        let out =
            check_tls_params("postgres://db/c?sslmode=require&ssl-ca=ca.pem", base).expect("valid");
        assert!(
            out.contains("sslmode=verify-ca"),
            "libpq raises require with a CA: {out}"
        );

        let plain = "postgres://db/c?sslmode=disable";
        assert_eq!(check_tls_params(plain, base).expect("valid"), plain);
        let sqlite = "sqlite:///x.db?mode=rwc";
        assert_eq!(check_tls_params(sqlite, base).expect("valid"), sqlite);
    }
}
