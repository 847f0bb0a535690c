//! Accept loops for both listeners: connection limit, header read timeout and graceful shutdown.
//!
//! Connections are served by hyper directly (HTTP/1.1) rather than `axum::serve` because the data
//! plane needs a connection cap with a clean 503 and a header read timeout (slow-loris protection),
//! and both planes need to drain in-flight requests on shutdown.

use std::sync::Arc;
use std::time::Duration;

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::task::TaskTracker;

use crate::config::Config;
use crate::gateway::Gateway;

/// Per-listener connection settings.
#[derive(Debug, Clone)]
pub struct Limits {
    max_connections: usize,
    header_read_timeout: Duration,
}

impl Limits {
    /// From `[server]`.
    pub fn from_config(config: &Config) -> Self {
        Self {
            max_connections: config.server.max_connections,
            header_read_timeout: Duration::from_millis(config.server.header_read_timeout_ms),
        }
    }
}

const OVER_CAPACITY_BODY: &str = r#"{"error":{"message":"gateway connection limit reached","type":"gateway_error","code":"too_many_connections"}}"#;

/// The whole 503 answer to a connection over `max_connections`, written raw: such a connection is
/// never handed to hyper, so it costs no task beyond this write.
fn over_capacity_response() -> String {
    format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{}",
        OVER_CAPACITY_BODY.len(),
        OVER_CAPACITY_BODY
    )
}

fn http1_builder(limits: &Limits) -> http1::Builder {
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .keep_alive(true);
    builder
}

/// Serves the data plane until shutdown.
pub async fn serve_data_plane(
    listener: TcpListener,
    gateway: Arc<Gateway>,
    limits: Limits,
    tasks: TaskTracker,
) {
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    let builder = http1_builder(&limits);
    while let Some(stream) = next_connection(&listener, &gateway, "data").await {
        let _ = stream.set_nodelay(true);
        let Ok(permit) = Arc::clone(&permits).try_acquire_owned() else {
            gateway.metrics.record_rejected_connection();
            tasks.spawn(async move {
                let mut stream = stream;
                let _ = tokio::time::timeout(Duration::from_secs(1), async {
                    let _ = stream.write_all(over_capacity_response().as_bytes()).await;
                    let _ = stream.shutdown().await;
                })
                .await;
            });
            continue;
        };
        let gateway = Arc::clone(&gateway);
        let builder = builder.clone();
        tasks.spawn(async move {
            let shutdown = gateway.shutdown.clone();
            let service = service_fn(move |request| {
                // Boxed per request: hyper keeps one slot the size of the handler's future for
                // the connection's whole life, and the proxy's future is ~3.5 KiB. A box
                // that is freed once the response head is out costs a held stream nothing.
                Box::pin(crate::proxy::handle(Arc::clone(&gateway), request))
            });
            let io = TokioIo::new(stream);
            let connection = builder.serve_connection(io, service);
            tokio::pin!(connection);
            tokio::select! {
                result = connection.as_mut() => log_connection_error(result),
                _ = shutdown.cancelled() => {
                    connection.as_mut().graceful_shutdown();
                    log_connection_error(connection.await);
                }
            }
            drop(permit);
        });
    }
}

/// Serves the control plane (axum router, with websocket upgrades) until shutdown.
pub async fn serve_control_plane(
    listener: TcpListener,
    gateway: Arc<Gateway>,
    limits: Limits,
    tasks: TaskTracker,
) {
    let app = crate::control::router(Arc::clone(&gateway));
    let builder = http1_builder(&limits);
    while let Some(stream) = next_connection(&listener, &gateway, "control").await {
        let service = TowerToHyperService::new(app.clone());
        let builder = builder.clone();
        let shutdown = gateway.shutdown.clone();
        tasks.spawn(async move {
            let connection = builder
                .serve_connection(TokioIo::new(stream), service)
                .with_upgrades();
            tokio::pin!(connection);
            tokio::select! {
                result = connection.as_mut() => log_connection_error(result),
                _ = shutdown.cancelled() => {
                    connection.as_mut().graceful_shutdown();
                    log_connection_error(connection.await);
                }
            }
        });
    }
}

/// The next accepted connection, or `None` once shutdown starts. Accept errors (EMFILE and friends)
/// are logged and retried after a short pause instead of spinning.
async fn next_connection(
    listener: &TcpListener,
    gateway: &Gateway,
    plane: &'static str,
) -> Option<tokio::net::TcpStream> {
    loop {
        tokio::select! {
            _ = gateway.shutdown.cancelled() => return None,
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => return Some(stream),
                Err(error) => {
                    tracing::warn!(%error, plane, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
        }
    }
}

fn log_connection_error(result: Result<(), hyper::Error>) {
    if let Err(error) = result {
        if error.is_timeout() {
            tracing::debug!("client too slow to send its request headers; closed");
        } else if !error.is_incomplete_message() && !error.is_canceled() {
            tracing::debug!(%error, "connection ended with an error");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn over_capacity_answer_is_well_formed_http() {
        let response = over_capacity_response();
        let (head, body) = response.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 503 "));
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length: "))
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(length, body.len());
        let json: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(json["error"]["code"], "too_many_connections");
    }
}
