//! The network task: the state machine that connects to gatewayd's telemetry websocket, forwards
//! frames to the UI and commands to the gateway, and reconnects with a capped exponential backoff.
//!
//! It owns the socket and the backoff; the UI only sees the [`ConnEvent`]s it sends, so a slow or
//! dead gateway never delays a key press.

use std::sync::Arc;
use std::time::Duration;

use bch_core::telemetry::{ClientCommand, ServerFrame};
use futures_util::{SinkExt, StreamExt};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_tungstenite::Connector;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::{self, Message};

use super::status::{Backoff, ConnEvent, ConnStatus};

/// A connect attempt (TCP + websocket upgrade) that takes longer than this counts as failed;
/// without it a black-holed address would leave the console "connecting" forever.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How to reach the gateway: where, with which token, and how to space reconnect attempts.
#[derive(Debug, Clone)]
pub struct ConnConfig {
    /// Websocket URL, e.g. `ws://127.0.0.1:9090/ws` or `wss://gw.example:9090/ws`.
    pub url: String,
    /// TLS for a `wss://` URL (from `bch_tls::ClientTls::config`); `None`: the system's trust roots,
    /// no client certificate. Unused for `ws://`.
    pub tls: Option<Arc<rustls::ClientConfig>>,
    /// Bearer token sent as `Authorization: Bearer <token>` on the upgrade, if the control plane
    /// requires one.
    pub token: Option<String>,
    /// Spacing of reconnect attempts; reset by every successful connect.
    backoff: Backoff,
}

impl ConnConfig {
    /// A config for `url` without a token, with the system's trust roots and the default backoff.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            token: None,
            tls: None,
            backoff: Backoff::default(),
        }
    }
}

/// The UI's ends of the network task's channels, and the task.
#[derive(Debug)]
pub struct ConnHandle {
    /// Commands to send to the gateway. Dropping it stops the task.
    pub commands: mpsc::UnboundedSender<ClientCommand>,
    /// Status changes, frames and unsent commands from the task, in the order they happened.
    pub events: mpsc::UnboundedReceiver<ConnEvent>,
    /// The task itself, to abort it on the way out or to await its end in tests.
    pub task: tokio::task::JoinHandle<()>,
}

impl ConnHandle {
    /// Starts the network task on the current tokio runtime. It connects at once, and keeps
    /// reconnecting until the returned `commands` sender or `events` receiver is dropped.
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
async fn run(
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
        let Some(reason) = session(&mut config, &mut commands, &events).await else {
            return;
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
        if !refuse_until(retry_at, &mut commands, &events).await {
            return;
        }
    }
}

/// One connect attempt and, if it succeeds, the life of that connection. Returns why it ended, or
/// `None` when the UI went away.
async fn session(
    config: &mut ConnConfig,
    commands: &mut mpsc::UnboundedReceiver<ClientCommand>,
    events: &mpsc::UnboundedSender<ConnEvent>,
) -> Option<String> {
    let ws = match connect(config).await {
        Ok(ws) => ws,
        Err(reason) => return Some(reason),
    };
    config.backoff.reset();
    events.send(ConnEvent::Status(ConnStatus::Connected)).ok()?;
    match forward(ws, commands, events).await {
        Ended::Shutdown => None,
        Ended::Lost(reason) => Some(reason),
    }
}

/// Waits until `retry_at`, answering every command that arrives meanwhile with
/// [`ConnEvent::NotSent`]. Returns `false` when the UI went away.
///
/// Commands typed while disconnected are answered at once rather than queued: replaying stale
/// threshold changes minutes later, after the operator moved on, would surprise them.
async fn refuse_until(
    retry_at: Instant,
    commands: &mut mpsc::UnboundedReceiver<ClientCommand>,
    events: &mpsc::UnboundedSender<ConnEvent>,
) -> bool {
    let sleep = tokio::time::sleep_until(retry_at);
    tokio::pin!(sleep);
    loop {
        tokio::select! {
            _ = &mut sleep => return true,
            cmd = commands.recv() => match cmd {
                Some(cmd) => {
                    if events.send(ConnEvent::NotSent(cmd)).is_err() {
                        return false;
                    }
                }
                None => return false,
            },
        }
    }
}

/// `url` asking for the newest telemetry protocol (`v=2`: no ring arcs, membership deltas), unless
/// the operator's URL already names a version. A gateway that predates version 2 ignores the
/// query and sends version 1 frames, which the console reads as well.
fn versioned(url: &str) -> String {
    let version = bch_core::telemetry::PROTOCOL_VERSION;
    match url.split_once('?') {
        Some((_, query)) if query.split('&').any(|pair| pair.starts_with("v=")) => url.to_owned(),
        Some(_) => format!("{url}&v={version}"),
        None => format!("{url}?v={version}"),
    }
}

/// The websocket as tokio-tungstenite hands it over: plain TCP for `ws://`, TLS for `wss://`.
type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// Opens the websocket, with the bearer token if there is one, within [`CONNECT_TIMEOUT`]; the
/// error is the reason the header shows.
async fn connect(config: &ConnConfig) -> Result<Ws, String> {
    let mut request = versioned(&config.url)
        .into_client_request()
        .map_err(|e| format!("bad url {}: {e}", config.url))?;
    if let Some(token) = &config.token {
        let value = HeaderValue::from_str(&format!("Bearer {token}"))
            .map_err(|_| "token file holds characters not allowed in a header".to_owned())?;
        request.headers_mut().insert("authorization", value);
    }
    let tls = config
        .tls
        .clone()
        .unwrap_or_else(|| bch_tls::ClientTls::system().config());
    let connecting = tokio_tungstenite::connect_async_tls_with_config(
        request,
        None,
        false,
        Some(Connector::Rustls(tls)),
    );
    match tokio::time::timeout(CONNECT_TIMEOUT, connecting).await {
        Ok(Ok((ws, _response))) => Ok(ws),
        Ok(Err(e)) => Err(describe(&e)),
        Err(_) => Err(format!("connect timed out after {CONNECT_TIMEOUT:?}")),
    }
}

/// A short reason for the header; a rejected token is the common case worth spelling out, and a
/// TLS failure says what failed (an untrusted or expired certificate, a name mismatch).
fn describe(e: &tungstenite::Error) -> String {
    if let tungstenite::Error::Tls(tungstenite::error::TlsError::Rustls(tls)) = e {
        return bch_tls::failure::describe(tls);
    }
    if let Some(tls) = bch_tls::tls_failure(e) {
        return tls;
    }
    match e {
        tungstenite::Error::Http(resp) if resp.status() == 401 || resp.status() == 403 => {
            format!("{} (check --token-file)", resp.status())
        }
        tungstenite::Error::Http(resp) => format!("HTTP {}", resp.status()),
        tungstenite::Error::Io(io) => io.to_string(),
        other => other.to_string(),
    }
}

/// Forwards frames to the UI and commands to the gateway until the connection ends (`Lost`, with
/// a reason for the header) or the UI goes away (`Shutdown`).
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
