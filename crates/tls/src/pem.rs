//! Reading PEM files: a certificate chain, a private key and a set of trusted CA certificates,
//! with errors that name the file and say what was wrong with it (an operator reads them in
//! `gatewayd check-config` and in the log of a refused reload).

use std::path::{Path, PathBuf};

use rustls::RootCertStore;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// Why a PEM file could not be used. Every variant names the file.
#[derive(Debug, thiserror::Error)]
pub enum PemError {
    /// The file could not be read (missing, permissions) or is not PEM.
    #[error("{kind} file {path}: {reason}")]
    Unreadable {
        /// What the file was meant to hold: "certificate", "private key" or "CA".
        kind: &'static str,
        /// The path as configured.
        path: PathBuf,
        /// The reader's or parser's message.
        reason: String,
    },
    /// The file was read but holds no item of the kind asked for (a key file given as a
    /// certificate, an empty file).
    #[error("{kind} file {path} holds no {} in PEM form", item_of(kind))]
    Empty {
        /// What the file was meant to hold.
        kind: &'static str,
        /// The path as configured.
        path: PathBuf,
    },
    /// A CA certificate the trust store refused (not a valid X.509 certificate).
    #[error("CA file {path}: a certificate is not usable as a trust anchor: {reason}")]
    BadAnchor {
        /// The path as configured.
        path: PathBuf,
        /// rustls' message.
        reason: String,
    },
}

/// What a file of `kind` holds: a CA file holds CA certificates.
fn item_of(kind: &str) -> &str {
    match kind {
        "CA" => "CA certificate",
        other => other,
    }
}

/// Every certificate in the PEM file at `path`, in file order (for a chain: the leaf first, then
/// its intermediates). Errors: unreadable or not PEM; no certificate in it.
pub fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, PemError> {
    let kind = "certificate";
    let certificates = CertificateDer::pem_file_iter(path)
        .and_then(|items| items.collect::<Result<Vec<_>, _>>())
        .map_err(|error| PemError::Unreadable {
            kind,
            path: path.to_owned(),
            reason: error.to_string(),
        })?;
    if certificates.is_empty() {
        return Err(PemError::Empty {
            kind,
            path: path.to_owned(),
        });
    }
    Ok(certificates)
}

/// The first private key (PKCS#8, PKCS#1 or SEC1) in the PEM file at `path`. Errors: unreadable,
/// not PEM, or no key in it.
pub fn private_key(path: &Path) -> Result<PrivateKeyDer<'static>, PemError> {
    let kind = "private key";
    PrivateKeyDer::from_pem_file(path).map_err(|error| match error {
        rustls_pki_types::pem::Error::NoItemsFound => PemError::Empty {
            kind,
            path: path.to_owned(),
        },
        other => PemError::Unreadable {
            kind,
            path: path.to_owned(),
            reason: other.to_string(),
        },
    })
}

/// A trust store holding every certificate of the PEM file at `path`. Errors: those of
/// [`certificates`] (with kind "CA"), or a certificate rustls cannot use as a trust anchor.
pub fn trust_store(path: &Path) -> Result<RootCertStore, PemError> {
    let anchors = certificates(path).map_err(|error| match error {
        PemError::Unreadable { path, reason, .. } => PemError::Unreadable {
            kind: "CA",
            path,
            reason,
        },
        PemError::Empty { path, .. } => PemError::Empty { kind: "CA", path },
        other => other,
    })?;
    let mut store = RootCertStore::empty();
    for anchor in anchors {
        store.add(anchor).map_err(|error| PemError::BadAnchor {
            path: path.to_owned(),
            reason: error.to_string(),
        })?;
    }
    Ok(store)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &tempfile::TempDir, name: &str, text: &str) -> PathBuf {
        let path = dir.path().join(name);
        std::fs::write(&path, text).expect("write test file");
        path
    }

    /// A self-signed certificate for `localhost` and its key, written to `dir`: their paths.
    fn self_signed(dir: &tempfile::TempDir) -> (PathBuf, PathBuf) {
        let made =
            rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).expect("certificate");
        let cert = write(dir, "tls.crt", &made.cert.pem());
        let key = write(dir, "tls.key", &made.signing_key.serialize_pem());
        (cert, key)
    }

    /// The kind of an [`PemError::Empty`]; `None` for any other error.
    fn empty_kind(error: &PemError) -> Option<&'static str> {
        match error {
            PemError::Empty { kind, .. } => Some(kind),
            _ => None,
        }
    }

    #[test]
    fn a_certificate_and_its_key_are_read_and_a_ca_becomes_a_trust_store() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (cert, key) = self_signed(&dir);
        assert_eq!(certificates(&cert).expect("chain").len(), 1);
        assert!(matches!(private_key(&key), Ok(PrivateKeyDer::Pkcs8(_))));
        assert_eq!(trust_store(&cert).expect("store").len(), 1);
    }

    #[test]
    fn errors_name_the_file_and_what_was_wrong() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (cert, key) = self_signed(&dir);
        let missing = dir.path().join("absent.crt");

        let error = certificates(&missing).expect_err("missing file");
        assert!(matches!(
            error,
            PemError::Unreadable {
                kind: "certificate",
                ..
            }
        ));
        assert!(error.to_string().contains("absent.crt"), "{error}");

        // A key file given where a certificate belongs holds no certificate.
        let error = certificates(&key).expect_err("key as certificate");
        assert_eq!(empty_kind(&error), Some("certificate"), "{error}");
        let error = private_key(&cert).expect_err("certificate as key");
        assert_eq!(empty_kind(&error), Some("private key"), "{error}");
        let error = trust_store(&key).expect_err("key as CA");
        assert_eq!(empty_kind(&error), Some("CA"), "{error}");
        assert!(error.to_string().starts_with("CA file"), "{error}");
        assert!(
            error
                .to_string()
                .ends_with("tls.key holds no CA certificate in PEM form"),
            "{error}"
        );
    }
}
