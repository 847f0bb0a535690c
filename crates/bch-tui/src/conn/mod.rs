//! The connection to gatewayd's telemetry websocket: the network task ([`task`]), the status and
//! events it reports ([`status`]); TLS for `wss://` gateways is bch-tls's (`ClientTls`, and a failed
//! handshake in words).
//!
//! The network runs in its own task and talks to the UI only over channels, so a slow or dead
//! gateway never delays a key press. The task owns the backoff; the UI only learns *when* the next
//! attempt is due ([`ConnStatus::Reconnecting::retry_at`]) and counts down to it on its own tick, so
//! neither key presses nor redraws can restart the timer.

mod status;
mod task;

pub use self::status::{ConnEvent, ConnStatus};
pub use self::task::{ConnConfig, ConnHandle};
