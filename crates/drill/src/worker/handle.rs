//! Starting simulated workers, and the handle their owner keeps: address, fault switch, counters
//! and a graceful shutdown.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context as _;
use axum::serve::ListenerExt as _;
use tokio::task::JoinHandle;

use super::api::router;
use super::engine;
use super::faults::Fault;
use super::state::{Shared, SimStats};
use crate::sim::SimConfig;

/// A running simulated worker. Dropping the handle stops accepting connections; [`shutdown`] also
/// waits for in-flight responses to finish.
///
/// [`shutdown`]: WorkerHandle::shutdown
pub struct WorkerHandle {
    shared: Arc<Shared>,
    addr: SocketAddr,
    /// Served over TLS ([`spawn_https_worker`]).
    https: bool,
    task: Option<JoinHandle<std::io::Result<()>>>,
}

impl WorkerHandle {
    /// The worker's name (as given to [`spawn_worker`]).
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// The address the worker listens on (with the real port when bound to port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Base URL, e.g. `http://127.0.0.1:8001` (`https://` for a worker served over TLS), without
    /// a trailing slash.
    pub fn url(&self) -> String {
        let scheme = if self.https { "https" } else { "http" };
        format!("{scheme}://{}", self.addr)
    }

    /// The model parameters this worker runs with.
    pub fn config(&self) -> &SimConfig {
        &self.shared.config
    }

    /// Switches the injected fault; takes effect for requests that arrive afterwards, and releases
    /// requests stalled by [`Fault::StallFirstByte`].
    pub fn set_fault(&self, fault: Fault) {
        self.shared.fault.set(fault);
    }

    /// The fault currently injected.
    pub fn fault(&self) -> Fault {
        self.shared.fault.current()
    }

    /// The worker's counters since start and its batch and cache now.
    pub fn stats(&self) -> SimStats {
        self.shared.stats()
    }

    /// Stops accepting connections, releases stalled requests, and waits until in-flight responses
    /// (including streams) have finished.
    ///
    /// # Errors
    ///
    /// When the server task panicked or its accept loop failed.
    pub async fn shutdown(mut self) -> anyhow::Result<()> {
        self.shared.cancel.cancel();
        if let Some(task) = self.task.take() {
            task.await
                .context("worker task panicked")?
                .with_context(|| format!("worker {} failed", self.shared.name))?;
        }
        Ok(())
    }
}

impl Drop for WorkerHandle {
    fn drop(&mut self) {
        self.shared.cancel.cancel();
    }
}

/// Starts a simulated worker on `addr` (port 0 picks a free port) and returns once it accepts
/// connections.
///
/// # Errors
///
/// When `config` fails [`SimConfig::validate`] or `addr` cannot be bound; both name the worker.
pub async fn spawn_worker(
    addr: SocketAddr,
    name: impl Into<String>,
    config: SimConfig,
) -> anyhow::Result<WorkerHandle> {
    spawn(addr, name.into(), config, None).await
}

/// [`spawn_worker`], served over TLS with `tls` (see
/// [`server_tls_config`](super::server_tls_config); with a client CA it requires client
/// certificates): its [`url`](WorkerHandle::url) is `https://`.
///
/// # Errors
///
/// As [`spawn_worker`].
pub async fn spawn_https_worker(
    addr: SocketAddr,
    name: impl Into<String>,
    config: SimConfig,
    tls: Arc<rustls::ServerConfig>,
) -> anyhow::Result<WorkerHandle> {
    spawn(addr, name.into(), config, Some(tls)).await
}

async fn spawn(
    addr: SocketAddr,
    name: String,
    config: SimConfig,
    tls: Option<Arc<rustls::ServerConfig>>,
) -> anyhow::Result<WorkerHandle> {
    config
        .validate()
        .with_context(|| format!("invalid simulator config for {name}"))?;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot bind worker {name} to {addr}"))?;
    let addr = listener.local_addr()?;
    let shared = Arc::new(Shared::new(name, config));
    if !shared.config.is_instant() {
        tokio::spawn(engine::run(
            shared.engine.clone(),
            shared.config.clone(),
            shared.engine_gauges(),
            shared.cancel.clone(),
        ));
    }
    let app = router(shared.clone());
    let cancel = shared.cancel.clone();
    let https = tls.is_some();
    let task = tokio::spawn(async move {
        if let Some(tls) = tls {
            return super::tls::serve(listener, app, tls, cancel).await;
        }
        // TCP_NODELAY, as vLLM's and SGLang's servers (uvicorn/asyncio) have it: a stream's chunks
        // are small writes, and with Nagle each keep-alive stream's tail would wait for the
        // client's delayed ACK (~40 ms on Linux) — a stall no real engine has.
        let listener = listener.tap_io(|tcp| {
            let _ = tcp.set_nodelay(true);
        });
        axum::serve(listener, app)
            .with_graceful_shutdown(cancel.cancelled_owned())
            .await
    });
    tracing::debug!(worker = %shared.name, %addr, "simulated worker listening");
    Ok(WorkerHandle {
        shared,
        addr,
        https,
        task: Some(task),
    })
}

/// Starts `count` workers named `sim-0`, `sim-1`, … on 127.0.0.1, at ports `base_port`,
/// `base_port + 1`, … or on free ports when `base_port` is 0.
///
/// # Errors
///
/// When a port would pass 65535, or as [`spawn_worker`]; workers already started are stopped by
/// dropping their handles.
pub async fn spawn_workers(
    count: usize,
    base_port: u16,
    config: SimConfig,
) -> anyhow::Result<Vec<WorkerHandle>> {
    let mut workers = Vec::with_capacity(count);
    for i in 0..count {
        let port = if base_port == 0 {
            0
        } else {
            u16::try_from(usize::from(base_port) + i)
                .ok()
                .with_context(|| format!("port {base_port} + {i} is out of range"))?
        };
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        workers.push(spawn_worker(addr, format!("sim-{i}"), config.clone()).await?);
    }
    Ok(workers)
}
