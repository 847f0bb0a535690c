//! The connection to gatewayd's telemetry websocket: a state machine that connects, forwards frames,
//! sends commands and reconnects with a capped exponential backoff, plus the status it reports.
//!
//! The network runs in its own task and talks to the UI only over channels, so a slow or dead
//! gateway never delays a key press. The task owns the backoff; the UI only learns *when* the next
//! attempt is due ([`ConnStatus::Reconnecting::retry_at`]) and counts down to it on its own tick, so
//! neither key presses nor redraws can restart the timer.

use std::time::Duration;

use bch_core::telemetry::{ClientCommand, ServerFrame};
use futures_util::{SinkExt, StreamExt};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::{self, Message};

/// First reconnect delay after a failed attempt or a lost connection.
pub const BACKOFF_INITIAL: Duration = Duration::from_millis(250);
/// The delay never grows past this, so a gateway that comes back is picked up within seconds.
pub const BACKOFF_CAP: Duration = Duration::from_secs(5);
/// A connect attempt (TCP + websocket upgrade) that takes longer than this counts as failed;
/// without it a black-holed address would leave the console "connecting" forever.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Capped exponential backoff: 250 ms, 500 ms, 1 s, 2 s, 4 s, 5 s, 5 s, …
#[derive(Debug, Clone)]
pub struct Backoff {
    initial: Duration,
    cap: Duration,
    next: Duration,
    attempt: u32,
}

impl Backoff {
    /// A backoff starting at `initial` and doubling up to `cap`.
    pub fn new(initial: Duration, cap: Duration) -> Self {
        Self {
            initial,
            cap,
            next: initial,
            attempt: 0,
        }
    }

    /// The delay before the next attempt; each call doubles the following one, up to the cap.
    pub fn next_delay(&mut self) -> Duration {
        let delay = self.next;
        self.next = (self.next * 2).min(self.cap);
        self.attempt += 1;
        delay
    }

    /// How many delays were handed out since the last reset.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// Called after a successful connect, so a later drop retries quickly again.
    pub fn reset(&mut self) {
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
    /// The websocket is open.
    Connected,
    /// The last attempt failed or the connection dropped; the next attempt starts at `retry_at`.
    Reconnecting {
        /// When the next attempt starts.
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
pub fn countdown_secs(retry_at: Instant, now: Instant) -> u64 {
    let left = retry_at.saturating_duration_since(now);
    let millis = left.as_millis() as u64;
    millis.div_ceil(1000)
}

/// What the network task tells the UI.
#[derive(Debug, Clone, PartialEq)]
pub enum ConnEvent {
    /// The connection state changed.
    Status(ConnStatus),
    /// A telemetry frame arrived.
    Frame(Box<ServerFrame>),
    /// A text frame arrived that is not a valid telemetry frame (shown, then ignored).
    BadFrame(String),
    /// A command could not be sent because there was no open connection.
    NotSent(ClientCommand),
}

/// How to reach the gateway.
#[derive(Debug, Clone)]
pub struct ConnConfig {
    /// Websocket URL, e.g. `ws://127.0.0.1:9090/ws`.
    pub url: String,
    /// Bearer token sent as `Authorization: Bearer <token>` on the upgrade, if the control plane
    /// requires one.
    pub token: Option<String>,
    /// Reconnect backoff.
    pub backoff: Backoff,
}

impl ConnConfig {
    /// A config for `url` without a token and with the default backoff.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            token: None,
            backoff: Backoff::default(),
        }
    }
}

/// The UI's ends of the network task's channels.
#[derive(Debug)]
pub struct ConnHandle {
    /// Commands to send to the gateway. Dropping it stops the task.
    pub commands: mpsc::UnboundedSender<ClientCommand>,
    /// Events from the task.
    pub events: mpsc::UnboundedReceiver<ConnEvent>,
    /// The task itself.
    pub task: tokio::task::JoinHandle<()>,
}

/// Starts the network task on the current tokio runtime.
pub fn spawn(config: ConnConfig) -> ConnHandle {
    let (cmd_tx, cmd_rx) = mpsc::unbounded_channel();
    let (ev_tx, ev_rx) = mpsc::unbounded_channel();
    let task = tokio::spawn(run(config, cmd_rx, ev_tx));
    ConnHandle {
        commands: cmd_tx,
        events: ev_rx,
        task,
    }
}

/// Why one connection ended.
enum Ended {
    /// The UI went away: stop for good.
    Shutdown,
    /// The connection failed or closed: reconnect.
    Lost(String),
}

/// The connection state machine: connect → forward → (lost) → wait backoff → connect …
///
/// Runs until the UI drops its command sender or event receiver.
pub async fn run(
    mut config: ConnConfig,
    mut commands: mpsc::UnboundedReceiver<ClientCommand>,
    events: mpsc::UnboundedSender<ConnEvent>,
) {
    loop {
        if events
            .send(ConnEvent::Status(ConnStatus::Connecting))
            .is_err()
        {
            return;
        }
        let reason = match connect(&config).await {
            Ok(ws) => {
                config.backoff.reset();
                if events
                    .send(ConnEvent::Status(ConnStatus::Connected))
                    .is_err()
                {
                    return;
                }
                match forward(ws, &mut commands, &events).await {
                    Ended::Shutdown => return,
                    Ended::Lost(reason) => reason,
                }
            }
            Err(reason) => reason,
        };
        let delay = config.backoff.next_delay();
        let retry_at = Instant::now() + delay;
        let status = ConnStatus::Reconnecting {
            retry_at,
            attempt: config.backoff.attempt(),
            reason,
        };
        if events.send(ConnEvent::Status(status)).is_err() {
            return;
        }
        // Commands typed while disconnected are answered at once rather than queued: replaying
        // stale threshold changes minutes later, after the operator moved on, would surprise them.
        let sleep = tokio::time::sleep_until(retry_at);
        tokio::pin!(sleep);
        loop {
            tokio::select! {
                _ = &mut sleep => break,
                cmd = commands.recv() => match cmd {
                    Some(cmd) => {
                        if events.send(ConnEvent::NotSent(cmd)).is_err() {
                            return;
                        }
                    }
                    None => return,
                },
            }
        }
    }
}

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

async fn connect(config: &ConnConfig) -> Result<Ws, String> {
    let mut request = config
        .url
        .as_str()
        .into_client_request()
        .map_err(|e| format!("bad url {}: {e}", config.url))?;
    if let Some(token) = &config.token {
        let value = HeaderValue::from_str(&format!("Bearer {token}"))
            .map_err(|_| "token file holds characters not allowed in a header".to_owned())?;
        request.headers_mut().insert("authorization", value);
    }
    match tokio::time::timeout(CONNECT_TIMEOUT, tokio_tungstenite::connect_async(request)).await {
        Ok(Ok((ws, _response))) => Ok(ws),
        Ok(Err(e)) => Err(describe(&e)),
        Err(_) => Err(format!("connect timed out after {CONNECT_TIMEOUT:?}")),
    }
}

/// A short reason for the header; a rejected token is the common case worth spelling out.
fn describe(e: &tungstenite::Error) -> String {
    match e {
        tungstenite::Error::Http(resp) if resp.status() == 401 || resp.status() == 403 => {
            format!("{} (check --token-file)", resp.status())
        }
        tungstenite::Error::Http(resp) => format!("HTTP {}", resp.status()),
        tungstenite::Error::Io(io) => io.to_string(),
        other => other.to_string(),
    }
}

async fn forward(
    ws: Ws,
    commands: &mut mpsc::UnboundedReceiver<ClientCommand>,
    events: &mpsc::UnboundedSender<ConnEvent>,
) -> Ended {
    let (mut sink, mut stream) = ws.split();
    loop {
        tokio::select! {
            msg = stream.next() => {
                let event = match msg {
                    Some(Ok(Message::Text(text))) => match serde_json::from_str::<ServerFrame>(&text) {
                        Ok(frame) => ConnEvent::Frame(Box::new(frame)),
                        Err(e) => ConnEvent::BadFrame(e.to_string()),
                    },
                    Some(Ok(Message::Close(frame))) => {
                        let why = frame.map(|f| f.reason.to_string()).filter(|r| !r.is_empty());
                        return Ended::Lost(why.unwrap_or_else(|| "gateway closed the connection".to_owned()));
                    }
                    // tungstenite answers pings itself; binary frames are not part of protocol v1.
                    Some(Ok(_)) => continue,
                    Some(Err(e)) => return Ended::Lost(describe(&e)),
                    None => return Ended::Lost("connection closed".to_owned()),
                };
                if events.send(event).is_err() {
                    return Ended::Shutdown;
                }
            }
            cmd = commands.recv() => {
                let Some(cmd) = cmd else {
                    let _ = sink.send(Message::Close(None)).await;
                    return Ended::Shutdown;
                };
                let json = match serde_json::to_string(&cmd) {
                    Ok(json) => json,
                    Err(e) => return Ended::Lost(format!("cannot encode command: {e}")),
                };
                if let Err(e) = sink.send(Message::text(json)).await {
                    // The command never left: tell the UI so it does not wait for an ack forever.
                    let _ = events.send(ConnEvent::NotSent(cmd));
                    return Ended::Lost(describe(&e));
                }
            }
        }
    }
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
