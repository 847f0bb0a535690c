//! TLS for `wss://` gateways: the one rustls client configuration of the console, built from
//! `--ca-file`, `--client-cert` and `--client-key` (rustls with the `ring` provider), and the words
//! the replica's status shows when a handshake fails ("certificate not trusted", "name mismatch",
//! "certificate expired") rather than a generic connection error.

use std::path::Path;
use std::sync::{Arc, OnceLock};

use anyhow::Context as _;
use rustls::RootCertStore;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// The console's TLS client configuration: trust from `ca_file` (every PEM certificate in it;
/// `None`: the system's trust roots) and, with `client_cert` and `client_key`, that identity for
/// control planes that require client certificates (mutual TLS). One is built per console and
/// shared by every replica's connection.
///
/// # Errors
///
/// A file that cannot be read or holds nothing of its kind, a CA certificate rustls refuses, a
/// key that does not suit the certificate, or only one of the pair. Each error names the file.
pub fn client_config(
    ca_file: Option<&Path>,
    client_cert: Option<&Path>,
    client_key: Option<&Path>,
) -> anyhow::Result<Arc<rustls::ClientConfig>> {
    let roots = match ca_file {
        Some(path) => {
            let mut store = RootCertStore::empty();
            for anchor in certificates(path).context("--ca-file")? {
                store.add(anchor).with_context(|| {
                    format!("--ca-file {}: not usable as a trust anchor", path.display())
                })?;
            }
            store
        }
        None => {
            // Unreadable system certificates are left out: a console for a private CA gives
            // --ca-file and never needs them.
            let mut store = RootCertStore::empty();
            store.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
            store
        }
    };
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .context("the TLS provider offers no protocol version")?
        .with_root_certificates(roots);
    let mut config = match (client_cert, client_key) {
        (None, None) => builder.with_no_client_auth(),
        (Some(cert), Some(key)) => {
            let chain = certificates(cert).context("--client-cert")?;
            let key = PrivateKeyDer::from_pem_file(key)
                .with_context(|| format!("--client-key {}", key.display()))?;
            builder
                .with_client_auth_cert(chain, key)
                .context("--client-cert and --client-key do not make an identity")?
        }
        _ => anyhow::bail!("--client-cert and --client-key go together"),
    };
    // The websocket upgrade is an HTTP/1.1 request.
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// The system's trust roots and no client certificate: what a [`super::ConnConfig`] without its
/// own configuration uses for a `wss://` URL. Built once per process.
pub(super) fn system_config() -> Arc<rustls::ClientConfig> {
    static SYSTEM: OnceLock<Arc<rustls::ClientConfig>> = OnceLock::new();
    Arc::clone(SYSTEM.get_or_init(|| {
        client_config(None, None, None)
            .expect("the system roots without a client certificate build")
    }))
}

/// What went wrong in TLS, in words an operator acts on, when `error` or one of its causes is a
/// TLS failure; `None` for any other failure.
pub(super) fn tls_failure(error: &(dyn std::error::Error + 'static)) -> Option<String> {
    find_rustls(error).map(describe)
}

/// One rustls error as `TLS: <what> (<rustls' words>)`.
pub(super) fn describe(error: &rustls::Error) -> String {
    use rustls::{AlertDescription, CertificateError, Error};
    let what = match error {
        Error::InvalidCertificate(
            CertificateError::UnknownIssuer | CertificateError::BadSignature,
        ) => "certificate not trusted (check --ca-file)",
        Error::InvalidCertificate(
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
        ) => "certificate name mismatch",
        Error::InvalidCertificate(
            CertificateError::Expired | CertificateError::ExpiredContext { .. },
        ) => "certificate expired",
        Error::InvalidCertificate(_) => "certificate invalid",
        Error::AlertReceived(
            AlertDescription::CertificateRequired
            | AlertDescription::BadCertificate
            | AlertDescription::UnknownCA
            | AlertDescription::CertificateUnknown
            | AlertDescription::CertificateExpired
            // A client certificate whose signature does not verify against the server's CA.
            | AlertDescription::DecryptError
            | AlertDescription::AccessDenied,
        ) => "client certificate refused (check --client-cert)",
        _ => "handshake failed",
    };
    format!("TLS: {what} ({error})")
}

/// rustls' `ring` provider, chosen explicitly (no process default is installed or needed).
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    static PROVIDER: OnceLock<Arc<rustls::crypto::CryptoProvider>> = OnceLock::new();
    Arc::clone(PROVIDER.get_or_init(|| Arc::new(rustls::crypto::ring::default_provider())))
}

/// Every certificate of a PEM file.
fn certificates(path: &Path) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let certificates = CertificateDer::pem_file_iter(path)
        .and_then(|items| items.collect::<Result<Vec<_>, _>>())
        .with_context(|| format!("{}", path.display()))?;
    anyhow::ensure!(
        !certificates.is_empty(),
        "{} holds no certificate in PEM form",
        path.display()
    );
    Ok(certificates)
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
