//! TLS for gatewayd's listeners (docs/tls.md). `certificates` builds each TLS listener's rustls
//! configuration and swaps it on a reload; `accept` runs a listener's handshake (timeout, plain
//! HTTP detection, failure counts, the TLS metrics); `incoming` hands completed handshakes to
//! tonic. The crypto provider and the reading of PEM files are bch-tls's, shared with the
//! connections to https workers and with the console and the drill; re-exported here so that
//! gatewayd's modules name them in one place.

pub(crate) mod accept;
pub(crate) mod certificates;
pub(crate) mod incoming;

pub(crate) use bch_tls::{pem, provider};
