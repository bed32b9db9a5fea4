//! Reading PEM certificates and keys for TLS (the broker's `[broker.tls]` and the store's
//! `sslrootcert`/`sslcert`/`sslkey`), with errors that name the file and what it lacked.

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use std::path::Path;

/// Every certificate of a PEM file; an error when there is none.
pub fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let pem = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{} is not valid PEM: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!(
            "no PEM certificate (-----BEGIN CERTIFICATE-----) in {}",
            path.display()
        ));
    }
    Ok(certs)
}

/// The private key of a PEM file (PKCS#8, PKCS#1 or SEC1, unencrypted).
pub fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, String> {
    let pem = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    PrivateKeyDer::from_pem_slice(&pem)
        .map_err(|e| format!("no unencrypted PEM private key in {} ({e})", path.display()))
}
