//! A simulated worker served over https: the rustls server configuration out of PEM files
//! (bch-tls's, with `ring` as gatewayd's own), optionally requiring client certificates from a CA
//! (mutual TLS), and the accept loop that runs the worker's routes over each TLS session.

use std::sync::Arc;

use hyper_util::rt::{TokioExecutor, TokioIo};
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
pub use bch_tls::server::server_config as server_tls_config;

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
