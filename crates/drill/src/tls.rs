//! The drill's HTTP clients and their TLS: one [`ClientTls`] (whom to trust, which certificate to
//! present; bch-tls's) built once from the command line's files, and [`ClientTls::http_client`]
//! the one way reqwest clients are made, so that the data plane, the control plane and the
//! simulated workers' config are all reached with the same trust.
//!
//! reqwest is built without a crypto provider of its own (no aws-lc, no OpenSSL), so a reqwest
//! client built any other way panics for want of one. [`http_client`] and [`get`] are the
//! plain-defaults entries for code that has no files to give.

pub use bch_tls::{ClientTls, ClientTlsError, tls_failure};

/// A reqwest client builder with the system's trust roots: for callers with no TLS files to give
/// (tests, tools). Same as `ClientTls::system().http_client()`.
pub fn http_client() -> reqwest::ClientBuilder {
    ClientTls::system().http_client()
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
