//! The drill's HTTP clients and their TLS: one [`ClientTls`] (whom to trust, which certificate to
//! present) built once from the command line's files, and the one place reqwest clients are made
//! ([`ClientTls::http_client`]), so that the data plane, the control plane and the simulated
//! workers' config are all reached with the same trust.
//!
//! rustls with the `ring` provider, handed to reqwest ready-made: reqwest is built without a
//! provider of its own (no aws-lc, no OpenSSL), so a reqwest client built any other way panics for
//! want of one. [`http_client`] is the plain-defaults entry for code that has no files to give.

use std::path::Path;
use std::sync::{Arc, OnceLock};

use anyhow::Context as _;
use rustls::RootCertStore;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// Whom the drill trusts and which certificate it presents on https connections (to gateways,
/// control planes and simulated workers alike). Cheap to clone: the rustls configuration is built
/// once and shared.
#[derive(Clone, Debug)]
pub struct ClientTls {
    config: Arc<rustls::ClientConfig>,
}

impl ClientTls {
    /// Trust from `ca_file` (every PEM certificate in it; `None`: the system's trust roots) and,
    /// with `client_cert` and `client_key` (PEM chain, PEM private key), that identity for
    /// control planes and gateways that require client certificates (mutual TLS).
    ///
    /// # Errors
    ///
    /// A file that cannot be read or holds nothing of its kind, a CA certificate rustls refuses, a
    /// key that does not suit the certificate, or only one of `client_cert` and `client_key`.
    /// Each error names the flag's file.
    pub fn from_files(
        ca_file: Option<&Path>,
        client_cert: Option<&Path>,
        client_key: Option<&Path>,
    ) -> anyhow::Result<Self> {
        let roots = match ca_file {
            Some(path) => ca_store(path)?,
            None => system_roots(),
        };
        let builder = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .context("the TLS provider offers no protocol version")?
            .with_root_certificates(roots);
        let mut config = match (client_cert, client_key) {
            (None, None) => builder.with_no_client_auth(),
            (Some(cert), Some(key)) => {
                let chain = certificates(cert)?;
                let key = PrivateKeyDer::from_pem_file(key)
                    .with_context(|| format!("client key file {}", key.display()))?;
                builder
                    .with_client_auth_cert(chain, key)
                    .context("the client certificate and key do not make an identity")?
            }
            _ => anyhow::bail!("a client certificate needs its key, and a key its certificate"),
        };
        // reqwest here speaks HTTP/1.1 only; saying so lets a server that offers h2 pick 1.1.
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Self {
            config: Arc::new(config),
        })
    }

    /// The system's trust roots and no client certificate: what a drill without `--ca-file`
    /// uses. Built once per process.
    pub fn system() -> Self {
        static SYSTEM: OnceLock<ClientTls> = OnceLock::new();
        SYSTEM
            .get_or_init(|| {
                Self::from_files(None, None, None)
                    .expect("the system roots with no client certificate always build")
            })
            .clone()
    }

    /// A reqwest client builder using this trust and identity for https URLs (plain http URLs
    /// are unaffected). The crate's one way to make an HTTP client.
    #[allow(clippy::disallowed_methods)]
    pub fn http_client(&self) -> reqwest::ClientBuilder {
        reqwest::Client::builder().use_preconfigured_tls(rustls::ClientConfig::clone(&self.config))
    }
}

impl Default for ClientTls {
    /// [`ClientTls::system`].
    fn default() -> Self {
        Self::system()
    }
}

/// A reqwest client builder with the system's trust roots: for callers with no TLS files to give
/// (tests, tools). Same as `ClientTls::system().http_client()`.
pub fn http_client() -> reqwest::ClientBuilder {
    ClientTls::system().http_client()
}

/// What went wrong in TLS, in words an operator acts on ("certificate not trusted", "name
/// mismatch", "certificate expired", "client certificate refused"), when `error` or one of its
/// causes is a TLS failure; `None` for any other failure.
pub fn tls_failure(error: &(dyn std::error::Error + 'static)) -> Option<String> {
    find_rustls(error).map(describe_tls)
}

/// One rustls error as `TLS: <what> (<rustls' words>)`.
fn describe_tls(error: &rustls::Error) -> String {
    use rustls::{AlertDescription, CertificateError, Error};
    let what = match error {
        Error::InvalidCertificate(
            CertificateError::UnknownIssuer | CertificateError::BadSignature,
        ) => "server certificate not trusted (check --ca-file)",
        Error::InvalidCertificate(
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
        ) => "server certificate name mismatch",
        Error::InvalidCertificate(
            CertificateError::Expired | CertificateError::ExpiredContext { .. },
        ) => "server certificate expired",
        Error::InvalidCertificate(_) => "server certificate invalid",
        Error::AlertReceived(
            AlertDescription::CertificateRequired
            | AlertDescription::BadCertificate
            | AlertDescription::UnknownCA
            | AlertDescription::CertificateUnknown
            | AlertDescription::CertificateExpired
            // A client certificate whose signature does not verify against the server's CA.
            | AlertDescription::DecryptError
            | AlertDescription::AccessDenied,
        ) => "the server refused the client certificate (check --client-cert)",
        _ => "handshake failed",
    };
    format!("TLS: {what} ({error})")
}

/// rustls' `ring` provider, chosen explicitly for every configuration.
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    static PROVIDER: OnceLock<Arc<rustls::crypto::CryptoProvider>> = OnceLock::new();
    Arc::clone(PROVIDER.get_or_init(|| Arc::new(rustls::crypto::ring::default_provider())))
}

/// Every certificate of a PEM file.
fn certificates(path: &Path) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let certificates = CertificateDer::pem_file_iter(path)
        .and_then(|items| items.collect::<Result<Vec<_>, _>>())
        .with_context(|| format!("certificate file {}", path.display()))?;
    anyhow::ensure!(
        !certificates.is_empty(),
        "certificate file {} holds no certificate in PEM form",
        path.display()
    );
    Ok(certificates)
}

/// A trust store of every certificate in the PEM file at `path`.
fn ca_store(path: &Path) -> anyhow::Result<RootCertStore> {
    let mut store = RootCertStore::empty();
    for anchor in certificates(path).context("CA")? {
        store
            .add(anchor)
            .with_context(|| format!("CA file {}: not usable as a trust anchor", path.display()))?;
    }
    Ok(store)
}

/// The system's trust roots; those it cannot read are left out (a drill against a gateway with a
/// private CA gives `--ca-file` and never needs them).
fn system_roots() -> RootCertStore {
    let mut store = RootCertStore::empty();
    let found = rustls_native_certs::load_native_certs();
    store.add_parsable_certificates(found.certs);
    store
}

/// `GET url` with [`http_client`]'s defaults: the drop-in for `reqwest::get`, which would build a
/// client without a crypto provider.
///
/// # Errors
///
/// reqwest's: the request could not be sent or no answer came.
pub async fn get(url: impl reqwest::IntoUrl) -> reqwest::Result<reqwest::Response> {
    http_client().build()?.get(url).send().await
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
