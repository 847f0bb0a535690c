//! The server side of a TLS handshake, as every TLS listener runs it on an accepted connection:
//! bounded by `tls_handshake_timeout_ms`, a plain HTTP request answered with a short 400 that
//! says the port speaks TLS (and closed at once, never left to wait out the timeout), and every
//! failure counted by reason (`bch_tls_handshake_failures_total{listener,reason}`) and logged
//! within a line budget.
//!
//! The handshake runs in the connection's own task, after its `max_connections` slot was taken
//! and before any request is read: a slow or failed handshake holds a connection slot for at
//! most the timeout and never a worker.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::registry::Registry;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

use super::certificates::{ServedCertificate, ServedCertificates};
use crate::config::TlsListener;
use crate::log_limit::{Admit, LineBudget, LogLimiter};
use crate::metrics::{LabelValue, Row, counter, gauge};

/// Why a handshake failed, the `reason` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HandshakeFailure {
    /// It did not complete within `tls_handshake_timeout_ms`.
    Timeout,
    /// The client spoke plain HTTP to the TLS port.
    PlainHttp,
    /// Mutual TLS: the client sent no certificate, or one that does not chain to the client CA.
    ClientCertificate,
    /// Any other TLS error (no common version or cipher suite, a malformed record, an alert).
    Protocol,
    /// The client closed or reset the connection mid-handshake.
    Closed,
}

impl LabelValue for HandshakeFailure {
    const ALL: &'static [Self] = &[
        HandshakeFailure::Timeout,
        HandshakeFailure::PlainHttp,
        HandshakeFailure::ClientCertificate,
        HandshakeFailure::Protocol,
        HandshakeFailure::Closed,
    ];

    fn index(self) -> usize {
        Self::ALL.iter().position(|r| *r == self).unwrap_or(0)
    }

    fn as_str(self) -> &'static str {
        match self {
            HandshakeFailure::Timeout => "timeout",
            HandshakeFailure::PlainHttp => "plain_http",
            HandshakeFailure::ClientCertificate => "client_certificate",
            HandshakeFailure::Protocol => "protocol",
            HandshakeFailure::Closed => "closed",
        }
    }
}

const LISTENERS: [TlsListener; 3] = [TlsListener::Data, TlsListener::Control, TlsListener::Picker];

fn listener_index(listener: TlsListener) -> usize {
    LISTENERS.iter().position(|l| *l == listener).unwrap_or(0)
}

/// Handshake failures by listener and reason, and the line budget of their log lines.
pub struct HandshakeFailures {
    counts: [[AtomicU64; 5]; 3],
    log: Mutex<LogLimiter<(TlsListener, HandshakeFailure)>>,
}

impl HandshakeFailures {
    /// No failures yet; log lines limited to `budget` per listener and reason.
    pub fn new(budget: LineBudget) -> Self {
        Self {
            counts: Default::default(),
            log: Mutex::new(LogLimiter::new(budget)),
        }
    }

    /// Failures of `listener` for `reason` so far.
    pub fn count(&self, listener: TlsListener, reason: HandshakeFailure) -> u64 {
        self.counts[listener_index(listener)][reason.index()].load(Ordering::Relaxed)
    }

    fn record(&self, listener: TlsListener, reason: HandshakeFailure, detail: &str) {
        self.counts[listener_index(listener)][reason.index()].fetch_add(1, Ordering::Relaxed);
        // Failed handshakes only: an accepted connection never takes this lock.
        let admit = self
            .log
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .admit(&(listener, reason), Instant::now());
        if let Admit::Log { suppressed } = admit {
            tracing::info!(
                listener = listener.name(),
                reason = reason.as_str(),
                detail,
                suppressed,
                "TLS handshake failed; connection closed"
            );
        }
    }
}

/// What a TLS listener needs to accept a connection: its served certificate, the handshake's
/// time limit and where failures are counted.
#[derive(Clone)]
pub struct TlsAcceptance {
    /// The listener's certificate in force (swapped by a reload).
    pub served: Arc<ServedCertificate>,
    /// `tls_handshake_timeout_ms`.
    pub timeout: Duration,
    /// Where failures are counted.
    pub failures: Arc<HandshakeFailures>,
}

/// The answer to a plain HTTP request on a TLS port (nginx answers 497 in this case; 400 is
/// what every client understands).
const PLAIN_HTTP_ANSWER: &[u8] = b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain\r\n\
Connection: close\r\nContent-Length: 43\r\n\r\nthis port speaks TLS: use https:// instead\n";

impl TlsAcceptance {
    /// Runs the handshake on `tcp`, wrapped by `wrap` (the data plane's write-stall guard) once
    /// it is known to be TLS; `None` when it failed (counted, logged, the connection closed).
    pub async fn handshake<IO>(
        &self,
        tcp: TcpStream,
        wrap: impl FnOnce(TcpStream) -> IO,
    ) -> Option<TlsStream<IO>>
    where
        IO: AsyncRead + AsyncWrite + Unpin,
    {
        let listener = self.served.listener;
        let acceptor = TlsAcceptor::from(self.served.config());
        let deadline = tokio::time::Instant::now() + self.timeout;
        let mut first = [0u8; 1];
        // A TLS client's first byte is a handshake record (22); an HTTP request starts with a
        // method's capital letter.
        match tokio::time::timeout_at(deadline, tcp.peek(&mut first)).await {
            Err(_) => {
                self.failures
                    .record(listener, HandshakeFailure::Timeout, "nothing sent");
                return None;
            }
            Ok(Ok(0) | Err(_)) => {
                self.failures
                    .record(listener, HandshakeFailure::Closed, "closed before a hello");
                return None;
            }
            Ok(Ok(_)) if first[0].is_ascii_uppercase() => {
                self.failures.record(
                    listener,
                    HandshakeFailure::PlainHttp,
                    "plain HTTP on a TLS port",
                );
                answer_plain_http(tcp).await;
                return None;
            }
            Ok(Ok(_)) => {}
        }
        match tokio::time::timeout_at(deadline, acceptor.accept(wrap(tcp))).await {
            Ok(Ok(stream)) => Some(stream),
            Ok(Err(error)) => {
                let reason = classify(&error);
                self.failures.record(listener, reason, &error.to_string());
                None
            }
            Err(_) => {
                self.failures
                    .record(listener, HandshakeFailure::Timeout, "handshake incomplete");
                None
            }
        }
    }
}

/// Answers a plain HTTP client and closes; its request is read and dropped (bounded), so the
/// close is a FIN the client reads after the answer, not a reset that may destroy it.
async fn answer_plain_http(mut tcp: TcpStream) {
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        let _ = tcp.write_all(PLAIN_HTTP_ANSWER).await;
        let _ = tcp.shutdown().await;
        let mut sink = [0u8; 4096];
        let mut left = 64 * 1024usize;
        while left > 0 {
            match tcp.read(&mut sink).await {
                Ok(0) | Err(_) => break,
                Ok(n) => left = left.saturating_sub(n),
            }
        }
    })
    .await;
}

/// The reason label of a failed handshake's error.
fn classify(error: &io::Error) -> HandshakeFailure {
    match error
        .get_ref()
        .and_then(|e| e.downcast_ref::<rustls::Error>())
    {
        Some(rustls::Error::NoCertificatesPresented | rustls::Error::InvalidCertificate(_)) => {
            HandshakeFailure::ClientCertificate
        }
        Some(_) => HandshakeFailure::Protocol,
        None => HandshakeFailure::Closed,
    }
}

/// `bch_tls_certificate_expiry_seconds{listener}` and `bch_tls_handshake_failures_total`.
pub fn register(
    registry: &mut Registry,
    served: Arc<ServedCertificates>,
    failures: Arc<HandshakeFailures>,
) {
    registry.register_collector(Box::new(TlsCollector { served, failures }));
}

#[derive(Clone)]
struct TlsCollector {
    served: Arc<ServedCertificates>,
    failures: Arc<HandshakeFailures>,
}

impl std::fmt::Debug for TlsCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TlsCollector")
    }
}

impl Collector for TlsCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let expiry: Vec<Row<i64>> = self
            .served
            .all()
            .iter()
            .map(|served| {
                (
                    vec![("listener", served.listener.name().to_owned())],
                    served.not_after(),
                )
            })
            .collect();
        gauge(
            &mut encoder,
            "bch_tls_certificate_expiry_seconds",
            "When the certificate a TLS listener serves expires (its notAfter), Unix seconds; alert on it minus time()",
            expiry,
        )?;
        let failures = self.served.all().iter().flat_map(|served| {
            let listener = served.listener;
            HandshakeFailure::ALL.iter().map(move |reason| {
                (
                    vec![
                        ("listener", listener.name().to_owned()),
                        ("reason", reason.as_str().to_owned()),
                    ],
                    self.failures.count(listener, *reason),
                )
            })
        });
        counter(
            &mut encoder,
            "bch_tls_handshake_failures",
            "TLS handshakes that failed on a listener, by reason (timeout, plain_http, client_certificate, protocol, closed)",
            failures,
        )
    }
}
