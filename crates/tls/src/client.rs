//! The client side: whom to trust on https and wss connections (a CA file, or the system's trust
//! roots) and which certificate to present to servers that require one (mutual TLS), built once
//! into a rustls configuration that every connection of a process shares.

use std::path::Path;
use std::sync::{Arc, OnceLock};

use rustls::RootCertStore;

use crate::pem::{self, PemError};

/// Why the TLS files of a client could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ClientTlsError {
    /// A file could not be used; the error names it and says why.
    #[error(transparent)]
    Pem(#[from] PemError),
    /// A client certificate without its key, or a key without its certificate.
    #[error("--client-cert and --client-key go together")]
    HalfIdentity,
    /// rustls refused the certificate and key as an identity (a key that is not the
    /// certificate's, an unsupported key type).
    #[error("--client-cert and --client-key do not make an identity: {0}")]
    Identity(rustls::Error),
}

/// Whom a client trusts and which certificate it presents. Cheap to clone: the rustls
/// configuration is built once and shared. ALPN offers `http/1.1` only: every client of bch
/// (reqwest here, the console's websocket upgrade) speaks HTTP/1.1, and saying so lets a server
/// that also offers h2 pick 1.1.
#[derive(Clone, Debug)]
pub struct ClientTls {
    config: Arc<rustls::ClientConfig>,
}

impl ClientTls {
    /// Trust from `ca_file` (every PEM certificate in it; `None`: the system's trust roots) and,
    /// with `client_cert` and `client_key` (PEM chain, PEM private key), that identity for
    /// servers that require client certificates (mutual TLS).
    ///
    /// # Errors
    ///
    /// [`ClientTlsError`]: a file that cannot be read or holds nothing of its kind, a CA
    /// certificate rustls refuses (each naming the file), only one of `client_cert` and
    /// `client_key`, or a key that does not suit the certificate.
    pub fn from_files(
        ca_file: Option<&Path>,
        client_cert: Option<&Path>,
        client_key: Option<&Path>,
    ) -> Result<Self, ClientTlsError> {
        let roots = match ca_file {
            Some(path) => pem::trust_store(path)?,
            None => system_roots(),
        };
        let builder = rustls::ClientConfig::builder_with_provider(crate::crypto::provider())
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
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Self {
            config: Arc::new(config),
        })
    }

    /// The system's trust roots and no client certificate: what a client without a CA file
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

    /// The rustls configuration, shared (for tokio-rustls and tokio-tungstenite connectors).
    pub fn config(&self) -> Arc<rustls::ClientConfig> {
        Arc::clone(&self.config)
    }

    /// A reqwest client builder using this trust and identity for https URLs (plain http URLs
    /// are unaffected). reqwest is built without a crypto provider of its own, so a client built
    /// any other way panics for want of one: this is every crate's one way to make one.
    #[cfg(feature = "reqwest")]
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

/// The system's trust roots; those that cannot be read are left out (a client of a private CA
/// gives a CA file and never needs them).
fn system_roots() -> RootCertStore {
    let mut store = RootCertStore::empty();
    store.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
    store
}
