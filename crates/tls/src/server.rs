//! A plain server configuration from PEM files: what bch-drill's simulated https workers serve
//! with, and what tests put in front of a client under test. gatewayd's own listeners build
//! theirs with more (per-listener ALPN, reloads, check-config findings) and do not use it.

use std::path::Path;
use std::sync::Arc;

use rustls::server::WebPkiClientVerifier;

use crate::pem::{self, PemError};

/// Why a server configuration could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ServerTlsError {
    /// A file could not be used; the error names it and says why.
    #[error(transparent)]
    Pem(#[from] PemError),
    /// rustls refused the client CA for verifying client certificates.
    #[error("client CA file {path}: {reason}")]
    ClientCa {
        /// The path as given.
        path: String,
        /// rustls' message.
        reason: String,
    },
    /// rustls refused the certificate and key (a key that is not the certificate's).
    #[error("{cert} and {key} do not make an identity: {reason}")]
    Identity {
        /// The certificate file as given.
        cert: String,
        /// The key file as given.
        key: String,
        /// rustls' message.
        reason: rustls::Error,
    },
}

/// A server configuration serving the chain in `cert_file` with the key in `key_file`, and with
/// `client_ca` requiring client certificates signed by a CA in that file (mutual TLS). ALPN
/// `http/1.1`; TLS 1.2 and 1.3.
///
/// # Errors
///
/// [`ServerTlsError`]: a file that cannot be read or holds nothing of its kind, a client CA
/// rustls cannot verify with, or a key that does not match its certificate.
pub fn server_config(
    cert_file: &Path,
    key_file: &Path,
    client_ca: Option<&Path>,
) -> Result<Arc<rustls::ServerConfig>, ServerTlsError> {
    let chain = pem::certificates(cert_file)?;
    let key = pem::private_key(key_file)?;
    let builder = rustls::ServerConfig::builder_with_provider(crate::crypto::provider())
        .with_safe_default_protocol_versions()
        .expect("the ring provider offers TLS 1.2 and 1.3");
    let builder = match client_ca {
        Some(ca_file) => {
            let roots = Arc::new(pem::trust_store(ca_file)?);
            let verifier =
                WebPkiClientVerifier::builder_with_provider(roots, crate::crypto::provider())
                    .build()
                    .map_err(|error| ServerTlsError::ClientCa {
                        path: ca_file.display().to_string(),
                        reason: error.to_string(),
                    })?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config =
        builder
            .with_single_cert(chain, key)
            .map_err(|reason| ServerTlsError::Identity {
                cert: cert_file.display().to_string(),
                key: key_file.display().to_string(),
                reason,
            })?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}
