//! The crypto provider: rustls' `ring`, one per process.

use std::sync::{Arc, OnceLock};

use rustls::crypto::CryptoProvider;

/// The one crypto provider every TLS configuration of the process is built with: rustls' `ring`
/// provider, chosen explicitly rather than installed as the process default so that a library
/// that installs another cannot change what is negotiated. Built once per process.
pub fn provider() -> Arc<CryptoProvider> {
    static PROVIDER: OnceLock<Arc<CryptoProvider>> = OnceLock::new();
    Arc::clone(PROVIDER.get_or_init(|| Arc::new(rustls::crypto::ring::default_provider())))
}
