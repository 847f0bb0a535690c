//! Process signals: SIGTERM and SIGINT start a graceful shutdown; SIGHUP reloads the configuration
//! file through the admin owner.

use std::sync::Arc;

use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

use crate::admin::Admin;

/// Registers the handlers before returning (not inside the spawned tasks), so a signal sent as soon
/// as the start-up banner is out is handled instead of killing the process.
pub fn install(admin: Arc<Admin>, shutdown: CancellationToken) -> std::io::Result<()> {
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let mut hup = signal(SignalKind::hangup())?;
    let stop = shutdown.clone();
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
            _ = stop.cancelled() => return,
        }
        tracing::info!("shutting down: no new connections; draining in-flight requests");
        stop.cancel();
    });
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                received = hup.recv() => {
                    if received.is_none() {
                        return;
                    }
                    if let Err(error) = admin.reload() {
                        tracing::error!(error = %format!("{:#}", anyhow::Error::from(error)), "reload failed; configuration unchanged");
                    }
                }
            }
        }
    });
    Ok(())
}
