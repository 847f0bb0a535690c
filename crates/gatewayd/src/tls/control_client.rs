//! The TLS client side of gatewayd's own commands that call a running gateway's control plane
//! (`gatewayd reload`): whom to trust and which certificate to present, built once from the
//! command's flags, and the reqwest client made with it.

use std::path::Path;

use rustls::RootCertStore;

use super::pem::{self, PemError};

/// Why the TLS flags could not be used.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ClientTlsError {
    /// A file named by a flag could not be used; the error names it.
    #[error(transparent)]
    Pem(#[from] PemError),
    /// A client certificate without its key, or a key without its certificate.
    #[error("--client-cert and --client-key go together")]
    HalfIdentity,
    /// rustls refused the certificate and key as an identity (a key that is not the
    /// certificate's, an unsupported key type).
    #[error("client certificate and key: {0}")]
    Identity(rustls::Error),
}

/// A reqwest client builder for a control plane: trust from `ca_file` (`None`: the system's
/// roots), and with `client_cert` and `client_key` that identity for a control plane that
/// requires client certificates. Plain http URLs are unaffected.
///
/// reqwest is built without a crypto provider of its own, so every client of the process is made
/// here, with rustls' `ring` provider ready-made.
///
/// # Errors
///
/// [`ClientTlsError`].
pub(crate) fn http_client(
    ca_file: Option<&Path>,
    client_cert: Option<&Path>,
    client_key: Option<&Path>,
) -> Result<reqwest::ClientBuilder, ClientTlsError> {
    let roots = match ca_file {
        Some(path) => pem::trust_store(path)?,
        None => {
            let mut store = RootCertStore::empty();
            store.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
            store
        }
    };
    let builder = rustls::ClientConfig::builder_with_provider(super::provider())
        .with_safe_default_protocol_versions()
        .expect("the ring provider offers TLS 1.2 and 1.3")
        .with_root_certificates(roots);
    let mut config = match (client_cert, client_key) {
        (None, None) => builder.with_no_client_auth(),
        (Some(cert), Some(key)) => builder
            .with_client_auth_cert(pem::certificates(cert)?, pem::private_key(key)?)
            .map_err(ClientTlsError::Identity)?,
        _ => return Err(ClientTlsError::HalfIdentity),
    };
    // The control plane speaks HTTP/1.1.
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    #[allow(clippy::disallowed_methods)]
    let builder = reqwest::Client::builder();
    Ok(builder.use_preconfigured_tls(config))
}

/// What went wrong in TLS, in words an operator acts on, when `error` or one of its causes is a
/// TLS failure; `None` for any other failure.
pub(crate) fn tls_failure(error: &(dyn std::error::Error + 'static)) -> Option<String> {
    use rustls::{CertificateError, Error};
    let tls = find_rustls(error)?;
    let what = match tls {
        Error::InvalidCertificate(
            CertificateError::UnknownIssuer | CertificateError::BadSignature,
        ) => "server certificate not trusted (check --ca-file)",
        Error::InvalidCertificate(
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
        ) => "server certificate name mismatch",
        Error::InvalidCertificate(
            CertificateError::Expired | CertificateError::ExpiredContext { .. },
        ) => "server certificate expired",
        Error::AlertReceived(_) => {
            "the server ended the handshake (a client certificate required or refused?)"
        }
        _ => "handshake failed",
    };
    Some(format!("TLS: {what} ({tls})"))
}

/// The rustls error in `error` or its causes. Looks inside I/O errors, whose `source` skips what
/// they wrap (tokio-rustls hands a failed handshake over as one).
fn find_rustls<'a>(error: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
    if let Some(tls) = error.downcast_ref::<rustls::Error>() {
        return Some(tls);
    }
    let inner: Option<&(dyn std::error::Error + 'static)> = error
        .downcast_ref::<std::io::Error>()
        .and_then(|io| io.get_ref())
        .map(|inner| inner as _);
    inner
        .and_then(find_rustls)
        .or_else(|| error.source().and_then(find_rustls))
}
