//! bch's TLS, written once for gatewayd, the console (`bch-tui`) and the drill: rustls with the
//! `ring` provider ([`provider`]; no aws-lc, no OpenSSL), PEM certificate, key and CA files
//! ([`pem`]), the client side ([`client`]: whom to trust, which certificate to present, and with the
//! `reqwest` feature the reqwest client built on it), a failed handshake in words an operator acts
//! on ([`failure`]), a server configuration from PEM files ([`server`], for simulated https workers
//! and test servers), and with the `test-pki` feature the rcgen certificates tests share
//! (`test_pki`).
//!
//! Dependencies point one way: `client` and `server` use `pem` and `crypto` (the provider);
//! `failure`, `pem`, `crypto` and `test_pki` use nothing of the crate.
#![forbid(unsafe_code)]

pub mod client;
mod crypto;
pub mod failure;
pub mod pem;
pub mod server;
#[cfg(feature = "test-pki")]
pub mod test_pki;

pub use client::{ClientTls, ClientTlsError};
pub use crypto::provider;
pub use failure::tls_failure;
