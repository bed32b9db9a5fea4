//! Reading PEM certificates and keys for TLS (the broker's `[broker.tls]` and the store's
//! `sslrootcert`/`sslcert`/`sslkey`), with errors that name the file and what it lacked.

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use std::path::{Path, PathBuf};

/// Why a PEM file could not be used: names the file and what it lacked, never its contents.
#[derive(Debug, thiserror::Error)]
pub enum PemError {
    /// The file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The file is not PEM.
    #[error("{path} is not valid PEM: {source}")]
    Invalid {
        path: PathBuf,
        source: rustls_pki_types::pem::Error,
    },
    /// The file holds no certificate.
    #[error("no PEM certificate (-----BEGIN CERTIFICATE-----) in {path}")]
    NoCertificate { path: PathBuf },
    /// The file holds no private key Carteiro can use.
    #[error("no unencrypted PEM private key in {path} ({source})")]
    NoKey {
        path: PathBuf,
        source: rustls_pki_types::pem::Error,
    },
}

/// Every certificate of a PEM file; an error when there is none.
pub fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, PemError> {
    let pem = std::fs::read(path).map_err(|source| PemError::Read {
        path: path.to_owned(),
        source,
    })?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| PemError::Invalid {
            path: path.to_owned(),
            source,
        })?;
    if certs.is_empty() {
        return Err(PemError::NoCertificate {
            path: path.to_owned(),
        });
    }
    Ok(certs)
}

/// The private key of a PEM file (PKCS#8, PKCS#1 or SEC1, unencrypted).
pub fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, PemError> {
    let pem = std::fs::read(path).map_err(|source| PemError::Read {
        path: path.to_owned(),
        source,
    })?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|source| PemError::NoKey {
        path: path.to_owned(),
        source,
    })
}
