//! TLS for gatewayd's sockets (docs/tls.md): one crypto provider (rustls with `ring`) and the
//! reading of PEM certificate and key files that the listeners (server side) and the connections
//! to https workers (client side) share. `certificates` builds each TLS listener's rustls
//! configuration and swaps it on a reload; `accept` runs a listener's handshake (timeout, plain
//! HTTP detection, failure counts, the TLS metrics); `control_client` is the client side of
//! gatewayd's own commands that call a control plane (`gatewayd reload`).

pub(crate) mod accept;
pub(crate) mod certificates;
pub(crate) mod control_client;
pub(crate) mod incoming;
pub(crate) mod pem;

use std::sync::{Arc, OnceLock};

use rustls::crypto::CryptoProvider;

/// The one crypto provider every TLS configuration of the process is built with: rustls' `ring`
/// provider, chosen explicitly rather than installed as the process default so that a library
/// that installs another cannot change what gatewayd negotiates.
pub(crate) fn provider() -> Arc<CryptoProvider> {
    static PROVIDER: OnceLock<Arc<CryptoProvider>> = OnceLock::new();
    Arc::clone(PROVIDER.get_or_init(|| Arc::new(rustls::crypto::ring::default_provider())))
}
