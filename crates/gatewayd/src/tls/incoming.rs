//! TLS connections as a stream, for a server (tonic's, the picker's) that takes its connections
//! from one: every accepted connection's handshake runs in its own task, so a client that never
//! finishes its handshake delays no other, and only completed handshakes reach the server.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures_util::Stream;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::server::TlsStream;
use tokio_util::sync::CancellationToken;
use tonic::transport::server::{Connected, TcpConnectInfo};

use super::accept::TlsAcceptance;

/// A server-side TLS connection that tonic can serve (it names its peer like a TCP one).
pub struct TlsConnection(TlsStream<TcpStream>);

impl Connected for TlsConnection {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        let tcp = self.0.get_ref().0;
        TcpConnectInfo {
            local_addr: tcp.local_addr().ok(),
            remote_addr: tcp.peer_addr().ok(),
        }
    }
}

impl AsyncRead for TlsConnection {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_read(cx, buf)
    }
}

impl AsyncWrite for TlsConnection {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_shutdown(cx)
    }
}

/// Accepts on `listener` until `shutdown`, handshakes each connection in its own task, and
/// yields the completed ones (`TCP_NODELAY` set). Accept errors are logged and retried after a
/// short pause.
pub fn tls_incoming(
    listener: TcpListener,
    tls: TlsAcceptance,
    shutdown: CancellationToken,
) -> impl Stream<Item = Result<TlsConnection, io::Error>> + Send + 'static {
    let (completed, receiver) = mpsc::channel::<TlsConnection>(64);
    tokio::spawn(async move {
        loop {
            let accepted: io::Result<(TcpStream, SocketAddr)> = tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = completed.closed() => return,
                accepted = listener.accept() => accepted,
            };
            let tcp = match accepted {
                Ok((tcp, _)) => tcp,
                Err(error) => {
                    tracing::warn!(%error, plane = "picker", "accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            };
            let _ = tcp.set_nodelay(true);
            let (tls, completed) = (tls.clone(), completed.clone());
            tokio::spawn(async move {
                if let Some(stream) = tls.handshake(tcp, |tcp| tcp).await {
                    let _ = completed.send(TlsConnection(stream)).await;
                }
            });
        }
    });
    futures_util::stream::unfold(receiver, |mut receiver| async move {
        let connection = receiver.recv().await?;
        Some((Ok(connection), receiver))
    })
}
