//! What the connection reports to the rest of the console: the [`ConnStatus`] the header shows, the
//! [`ConnEvent`]s the network task sends, and the [`Backoff`] that spaces reconnect attempts.
//!
//! Pure data and arithmetic, no I/O: the state machine in `task.rs` produces these values and the
//! state consumes them, so both can be tested without a socket.

use std::time::Duration;

use bch_core::telemetry::{ClientCommand, ServerFrame};
use tokio::time::Instant;

/// First reconnect delay after a failed attempt or a lost connection.
const BACKOFF_INITIAL: Duration = Duration::from_millis(250);
/// The delay never grows past this, so a gateway that comes back is picked up within seconds.
const BACKOFF_CAP: Duration = Duration::from_secs(5);

/// Capped exponential backoff: 250 ms, 500 ms, 1 s, 2 s, 4 s, 5 s, 5 s, …
#[derive(Debug, Clone)]
pub(crate) struct Backoff {
    initial: Duration,
    cap: Duration,
    next: Duration,
    attempt: u32,
}

impl Backoff {
    /// A backoff starting at `initial` and doubling up to `cap`.
    pub(crate) fn new(initial: Duration, cap: Duration) -> Self {
        Self {
            initial,
            cap,
            next: initial,
            attempt: 0,
        }
    }

    /// The delay before the next attempt; each call doubles the following one, up to the cap.
    pub(crate) fn next_delay(&mut self) -> Duration {
        let delay = self.next;
        self.next = (self.next * 2).min(self.cap);
        self.attempt += 1;
        delay
    }

    /// How many delays were handed out since the last reset.
    pub(crate) fn attempt(&self) -> u32 {
        self.attempt
    }

    /// Called after a successful connect, so a later drop retries quickly again.
    pub(crate) fn reset(&mut self) {
        self.next = self.initial;
        self.attempt = 0;
    }
}

impl Default for Backoff {
    fn default() -> Self {
        Self::new(BACKOFF_INITIAL, BACKOFF_CAP)
    }
}

/// Where the connection stands, as shown in the header.
#[derive(Debug, Clone, PartialEq)]
pub enum ConnStatus {
    /// The first attempt (or an attempt after the backoff expired) is in progress.
    Connecting,
    /// The websocket is open; frames flow and commands can be sent.
    Connected,
    /// The last attempt failed or the connection dropped; the next attempt starts at `retry_at`.
    Reconnecting {
        /// When the next attempt starts, on tokio's clock (so paused-time tests can step it).
        retry_at: Instant,
        /// Consecutive failed attempts since the last successful connect.
        attempt: u32,
        /// Why the last attempt failed or the connection ended.
        reason: String,
    },
}

impl ConnStatus {
    /// The status word shown in the header, with the countdown computed against `now` (passed in so
    /// rendering stays deterministic in tests).
    pub fn label(&self, now: Instant) -> String {
        match self {
            ConnStatus::Connecting => "CONNECTING…".to_owned(),
            ConnStatus::Connected => "CONNECTED".to_owned(),
            ConnStatus::Reconnecting { retry_at, .. } => {
                format!("RECONNECTING IN {}s", countdown_secs(*retry_at, now))
            }
        }
    }

    /// True while the header shows a countdown that needs a redraw on the UI tick.
    pub fn is_counting_down(&self) -> bool {
        matches!(self, ConnStatus::Reconnecting { .. })
    }
}

/// Whole seconds left until `retry_at`, rounded up so "0s" never shows while still waiting.
fn countdown_secs(retry_at: Instant, now: Instant) -> u64 {
    let left = retry_at.saturating_duration_since(now);
    let millis = left.as_millis() as u64;
    millis.div_ceil(1000)
}

/// What the network task tells the UI.
#[derive(Debug, Clone, PartialEq)]
pub enum ConnEvent {
    /// The connection state changed; the header shows the new one.
    Status(ConnStatus),
    /// A telemetry frame arrived and parsed.
    Frame(Box<ServerFrame>),
    /// A text frame arrived that is not a valid telemetry frame (shown, then ignored).
    BadFrame(String),
    /// A command could not be sent because there was no open connection.
    NotSent(ClientCommand),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_the_cap_and_resets() {
        let mut b = Backoff::default();
        let delays: Vec<u64> = (0..8).map(|_| b.next_delay().as_millis() as u64).collect();
        assert_eq!(delays, [250, 500, 1000, 2000, 4000, 5000, 5000, 5000]);
        assert_eq!(b.attempt(), 8);
        b.reset();
        assert_eq!(b.attempt(), 0);
        assert_eq!(b.next_delay(), Duration::from_millis(250));
    }

    #[test]
    fn countdown_rounds_up_and_stops_at_zero() {
        let now = Instant::now();
        let at = now + Duration::from_millis(4_200);
        assert_eq!(countdown_secs(at, now), 5);
        assert_eq!(countdown_secs(at, now + Duration::from_millis(1_200)), 3);
        assert_eq!(countdown_secs(at, now + Duration::from_millis(4_200)), 0);
        assert_eq!(countdown_secs(at, now + Duration::from_secs(9)), 0);
        let status = ConnStatus::Reconnecting {
            retry_at: at,
            attempt: 3,
            reason: "refused".into(),
        };
        assert_eq!(status.label(now), "RECONNECTING IN 5s");
        assert_eq!(
            status.label(now + Duration::from_millis(3_500)),
            "RECONNECTING IN 1s"
        );
    }
}
