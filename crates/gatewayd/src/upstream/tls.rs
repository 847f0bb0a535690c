//! TLS toward `https://` workers: one rustls client configuration built from `[upstream.tls]`,
//! shared by the data plane, the health prober and the load scraper and swapped whole on reload,
//! the stream a worker connection runs on (plain TCP for `http://` workers: they pay no TLS cost),
//! and what a failed handshake says about the worker ([`TlsProblem`]).

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use arc_swap::ArcSwap;
use http::Uri;
use hyper_util::client::legacy::connect::{Connected, Connection, HttpConnector};
use hyper_util::rt::TokioIo;
use rustls::{CertificateError, ClientConfig, Error as RustlsError, RootCertStore};
use rustls_pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;
use tower::ServiceExt;

use super::body::BoxError;
use crate::config::UpstreamTlsConfig;
use crate::tls::pem::{self, PemError};

/// Why `[upstream.tls]` gives no client configuration; the message names the file or key.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    /// A CA, certificate or key file that cannot be used.
    #[error(transparent)]
    Pem(#[from] PemError),
    /// The client certificate and key do not belong together, or rustls refused them.
    #[error("client_cert_file and client_key_file: {0}")]
    Identity(String),
}

impl SetupError {
    /// The error as a configuration problem of `upstream.tls`.
    pub fn field_error(&self) -> crate::config::FieldError {
        crate::config::FieldError::new("upstream.tls", self.to_string())
    }
}

/// The rustls client configuration for `https://` workers out of `settings`: trust from `ca_file`
/// (else the system's roots), the client certificate when one is set, TLS 1.2 and 1.3, ALPN
/// `http/1.1`. Reads every file; errors name the one at fault.
pub fn client_config(settings: &UpstreamTlsConfig) -> Result<ClientConfig, SetupError> {
    let roots = match settings.ca_file() {
        Some(path) => pem::trust_store(path)?,
        None => system_roots(),
    };
    let builder = ClientConfig::builder_with_provider(crate::tls::provider())
        .with_safe_default_protocol_versions()
        .map_err(|error| SetupError::Identity(error.to_string()))?
        .with_root_certificates(roots);
    let mut config = match settings.client_identity() {
        Some((cert_file, key_file)) => {
            let chain = pem::certificates(cert_file)?;
            let key = pem::private_key(key_file)?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|error| SetupError::Identity(error.to_string()))?
        }
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// A warning when `settings`' client certificate has expired (workers that require mutual TLS
/// will refuse it); `None` when there is none, it is valid, or it cannot be read (an error of
/// [`client_config`] then).
pub fn expired_client_certificate(settings: &UpstreamTlsConfig) -> Option<String> {
    let (cert_file, _) = settings.client_identity()?;
    let chain = pem::certificates(cert_file).ok()?;
    let (not_after, _) = crate::tls::certificates::leaf_validity(chain.first()?).ok()?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .ok()?
        .as_secs();
    (not_after < i64::try_from(now).ok()?).then(|| {
        format!(
            "upstream.tls: client certificate {} has expired: workers that require mutual TLS will refuse it",
            cert_file.display()
        )
    })
}

/// The system's trust roots; certificates the store holds but rustls cannot use are skipped (a
/// worker whose chain needed one fails as not trusted, with that reason).
fn system_roots() -> RootCertStore {
    let found = rustls_native_certs::load_native_certs();
    for error in &found.errors {
        tracing::warn!(%error, "reading the system's trust roots for https workers");
    }
    let mut roots = RootCertStore::empty();
    roots.add_parsable_certificates(found.certs);
    roots
}

/// The client configuration in force, shared by every connection to `https://` workers; a
/// reload swaps it whole (connections open keep theirs).
pub struct WorkerTls {
    config: ArcSwap<ClientConfig>,
}

impl WorkerTls {
    /// `config` (built by [`client_config`]) in force.
    pub fn from_config(config: ClientConfig) -> Self {
        Self {
            config: ArcSwap::from_pointee(config),
        }
    }

    /// Puts `config` (a reload's, built by [`client_config`]) in force for new connections;
    /// connections open keep the one they were made with.
    pub fn replace(&self, config: ClientConfig) {
        self.config.store(Arc::new(config));
    }

    /// Opens a connection to the worker at `uri` (scheme and authority): TCP through `http`, then,
    /// for `https`, a TLS handshake checking the certificate against `server_name` (else the
    /// URI's host) within `handshake_timeout`. A failed handshake is a [`WorkerTlsError`].
    pub async fn connect(
        &self,
        http: &HttpConnector,
        uri: &Uri,
        server_name: Option<&ServerName<'static>>,
        handshake_timeout: Duration,
    ) -> Result<WorkerStream, BoxError> {
        let tcp = http.clone().oneshot(uri.clone()).await?.into_inner();
        if uri.scheme() != Some(&http::uri::Scheme::HTTPS) {
            return Ok(WorkerStream::Plain(tcp));
        }
        let name: ServerName<'static> = match server_name {
            Some(name) => name.clone(),
            None => {
                let host = uri.host().unwrap_or_default();
                ServerName::try_from(host.trim_start_matches('[').trim_end_matches(']'))
                    .map_err(|error| error.to_string())?
                    .to_owned()
            }
        };
        // Unsized, not boxed again: `tls_problem` finds the error by its type.
        self.handshake(tcp, name, handshake_timeout)
            .await
            .map_err(|error| error as BoxError)
    }

    /// The TLS handshake on `tcp`, the worker's certificate checked against `name`, within
    /// `handshake_timeout`. A failed handshake is a [`WorkerTlsError`].
    pub async fn handshake(
        &self,
        tcp: TcpStream,
        name: ServerName<'static>,
        handshake_timeout: Duration,
    ) -> Result<WorkerStream, Box<WorkerTlsError>> {
        let connector = TlsConnector::from(self.config.load_full());
        match tokio::time::timeout(handshake_timeout, connector.connect(name, tcp)).await {
            Ok(Ok(stream)) => Ok(WorkerStream::Tls(Box::new(stream))),
            Ok(Err(error)) => Err(Box::new(WorkerTlsError {
                problem: problem_of_io(&error).unwrap_or(TlsProblem::Handshake),
                detail: error.to_string(),
            })),
            Err(_) => Err(Box::new(WorkerTlsError {
                problem: TlsProblem::Handshake,
                detail: "the TLS handshake timed out".into(),
            })),
        }
    }
}

/// What went wrong in TLS with a worker, short enough for a metric's reason and a status line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsProblem {
    /// The worker's certificate does not chain to a trusted CA.
    Untrusted,
    /// The worker's certificate (or one of its chain) is expired or not yet valid.
    Expired,
    /// The worker's certificate does not name the worker's host (or its `server_name`).
    WrongName,
    /// The worker's certificate was refused for another reason (bad encoding, revoked, ...).
    BadCertificate,
    /// The worker refused the handshake: it wants a client certificate, or refused ours.
    ClientCertificateRefused,
    /// Any other handshake failure (no common protocol, not TLS at all, timed out).
    Handshake,
}

impl TlsProblem {
    /// The reason as an operator reads it: `tls: certificate not trusted (UnknownIssuer)`.
    pub fn as_str(self) -> &'static str {
        match self {
            TlsProblem::Untrusted => "tls: certificate not trusted (UnknownIssuer)",
            TlsProblem::Expired => "tls: certificate expired or not yet valid",
            TlsProblem::WrongName => "tls: certificate not valid for the worker's name",
            TlsProblem::BadCertificate => "tls: certificate refused",
            TlsProblem::ClientCertificateRefused => {
                "tls: the worker refused the handshake (client certificate missing or not accepted)"
            }
            TlsProblem::Handshake => "tls: handshake failed",
        }
    }
}

impl std::fmt::Display for TlsProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A TLS handshake with a worker that failed: the [`TlsProblem`] and rustls' words.
#[derive(Debug, thiserror::Error)]
#[error("{problem}: {detail}")]
pub struct WorkerTlsError {
    /// What kind of failure.
    pub problem: TlsProblem,
    /// rustls' message.
    pub detail: String,
}

/// The TLS problem in `error` or one of its causes: a failed handshake, or (TLS 1.3 tells a client
/// whose certificate the worker refuses only after the handshake) an alert on the first read.
pub fn tls_problem(error: &(dyn std::error::Error + 'static)) -> Option<TlsProblem> {
    let mut cause = Some(error);
    while let Some(error) = cause {
        if let Some(tls) = error.downcast_ref::<WorkerTlsError>() {
            return Some(tls.problem);
        }
        if let Some(problem) = error.downcast_ref::<io::Error>().and_then(problem_of_io) {
            return Some(problem);
        }
        if let Some(rustls) = error.downcast_ref::<RustlsError>() {
            return Some(problem_of(rustls));
        }
        cause = error.source();
    }
    None
}

fn problem_of_io(error: &io::Error) -> Option<TlsProblem> {
    let inner = error.get_ref()?;
    inner.downcast_ref::<RustlsError>().map(problem_of)
}

fn problem_of(error: &RustlsError) -> TlsProblem {
    match error {
        RustlsError::InvalidCertificate(certificate) => match certificate {
            CertificateError::UnknownIssuer => TlsProblem::Untrusted,
            CertificateError::Expired
            | CertificateError::ExpiredContext { .. }
            | CertificateError::NotValidYet
            | CertificateError::NotValidYetContext { .. } => TlsProblem::Expired,
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. } => {
                TlsProblem::WrongName
            }
            _ => TlsProblem::BadCertificate,
        },
        RustlsError::AlertReceived(_) => TlsProblem::ClientCertificateRefused,
        _ => TlsProblem::Handshake,
    }
}

/// A connection to a worker: plain TCP for `http://`, TLS over TCP for `https://`.
pub enum WorkerStream {
    /// An `http://` worker's socket.
    Plain(TcpStream),
    /// An `https://` worker's TLS session (boxed: it is large, and rarer).
    Tls(Box<TlsStream<TcpStream>>),
}

impl AsyncRead for WorkerStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            WorkerStream::Plain(stream) => Pin::new(stream).poll_read(cx, buf),
            WorkerStream::Tls(stream) => Pin::new(stream.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for WorkerStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            WorkerStream::Plain(stream) => Pin::new(stream).poll_write(cx, buf),
            WorkerStream::Tls(stream) => Pin::new(stream.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            WorkerStream::Plain(stream) => Pin::new(stream).poll_write_vectored(cx, bufs),
            WorkerStream::Tls(stream) => Pin::new(stream.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            WorkerStream::Plain(stream) => stream.is_write_vectored(),
            WorkerStream::Tls(stream) => stream.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            WorkerStream::Plain(stream) => Pin::new(stream).poll_flush(cx),
            WorkerStream::Tls(stream) => Pin::new(stream.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            WorkerStream::Plain(stream) => Pin::new(stream).poll_shutdown(cx),
            WorkerStream::Tls(stream) => Pin::new(stream.as_mut()).poll_shutdown(cx),
        }
    }
}

impl Connection for WorkerStream {
    fn connected(&self) -> Connected {
        Connected::new()
    }
}

/// A connector for hyper-util's pooled client (the health prober's): [`WorkerTls::connect`] with
/// the server name of each worker's authority, as the prober last published them.
#[derive(Clone)]
pub struct WorkerConnector {
    http: HttpConnector,
    tls: Arc<WorkerTls>,
    handshake_timeout: Duration,
    /// `host:port` → the server name its certificate is checked against, for the workers whose
    /// name is not their URL's host.
    names: Arc<ArcSwap<std::collections::HashMap<String, ServerName<'static>>>>,
}

impl WorkerConnector {
    /// Connects through `http` (which must not refuse `https` URIs) and `tls`.
    pub fn new(mut http: HttpConnector, tls: Arc<WorkerTls>, handshake_timeout: Duration) -> Self {
        http.enforce_http(false);
        Self {
            http,
            tls,
            handshake_timeout,
            names: Arc::default(),
        }
    }

    /// Makes `names` (`host:port` → server name) the overrides new connections use.
    pub fn set_server_names(&self, names: std::collections::HashMap<String, ServerName<'static>>) {
        self.names.store(Arc::new(names));
    }
}

impl tower::Service<Uri> for WorkerConnector {
    type Response = TokioIo<WorkerStream>;
    type Error = BoxError;
    type Future =
        Pin<Box<dyn std::future::Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            let names = this.names.load();
            let name = uri.authority().and_then(|a| names.get(a.as_str()));
            let stream = this
                .tls
                .connect(&this.http, &uri, name, this.handshake_timeout)
                .await?;
            Ok(TokioIo::new(stream))
        })
    }
}
