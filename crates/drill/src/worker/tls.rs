//! A simulated worker served over https: the rustls server configuration out of PEM files (with
//! `ring`, as gatewayd builds its own), optionally requiring client certificates from a CA (mutual
//! TLS), and the accept loop that runs the worker's routes over each TLS session.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context as _;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::RootCertStore;
use rustls::server::WebPkiClientVerifier;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt as _;

/// The TLS a worker serves with: its certificate chain and key, and, with `client_ca`, client
/// certificates required and checked against that CA. ALPN `http/1.1`; TLS 1.2 and 1.3.
///
/// # Errors
///
/// A file that cannot be read or holds no certificate or key (the message names it), a key that
/// does not match its certificate, or a CA file rustls cannot use.
pub fn server_tls_config(
    cert_file: &Path,
    key_file: &Path,
    client_ca: Option<&Path>,
) -> anyhow::Result<Arc<rustls::ServerConfig>> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let chain = certificates(cert_file)?;
    let key = PrivateKeyDer::from_pem_file(key_file)
        .with_context(|| format!("private key file {}", key_file.display()))?;
    let builder = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()?;
    let builder = match client_ca {
        Some(ca_file) => {
            let mut roots = RootCertStore::empty();
            for anchor in certificates(ca_file)? {
                roots
                    .add(anchor)
                    .with_context(|| format!("CA file {}", ca_file.display()))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .context("client certificate verifier")?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder
        .with_single_cert(chain, key)
        .with_context(|| format!("{} and {}", cert_file.display(), key_file.display()))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

fn certificates(path: &Path) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let chain = CertificateDer::pem_file_iter(path)
        .and_then(|items| items.collect::<Result<Vec<_>, _>>())
        .with_context(|| format!("certificate file {}", path.display()))?;
    anyhow::ensure!(!chain.is_empty(), "{} holds no certificate", path.display());
    Ok(chain)
}

/// Serves `app` over TLS on `listener` until `cancel`: each connection's handshake and requests in
/// a task of its own (a client that never finishes its handshake holds nobody else up); on
/// `cancel` connections finish their response in flight and close, and this returns once they
/// have. A failed handshake is logged and closes that connection only.
pub(super) async fn serve(
    listener: TcpListener,
    app: axum::Router,
    tls: Arc<rustls::ServerConfig>,
    cancel: CancellationToken,
) -> std::io::Result<()> {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let connections = TaskTracker::new();
    loop {
        let (tcp, peer) = tokio::select! {
            _ = cancel.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                // A full file table or a connection reset before accept: the next may work.
                Err(error) => {
                    tracing::debug!(%error, "accept failed");
                    continue;
                }
            },
        };
        let _ = tcp.set_nodelay(true);
        let (acceptor, app, cancel) = (acceptor.clone(), app.clone(), cancel.clone());
        connections.spawn(async move {
            let stream = tokio::select! {
                _ = cancel.cancelled() => return,
                handshake = acceptor.accept(tcp) => match handshake {
                    Ok(stream) => stream,
                    Err(error) => {
                        tracing::debug!(%peer, %error, "TLS handshake refused");
                        return;
                    }
                },
            };
            let service = hyper::service::service_fn(move |request| app.clone().oneshot(request));
            let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            let connection = builder.serve_connection(TokioIo::new(stream), service);
            let mut connection = std::pin::pin!(connection);
            tokio::select! {
                _ = connection.as_mut() => {}
                _ = cancel.cancelled() => {
                    connection.as_mut().graceful_shutdown();
                    let _ = connection.await;
                }
            }
        });
    }
    connections.close();
    connections.wait().await;
    Ok(())
}
