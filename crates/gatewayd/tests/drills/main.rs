//! Reliability and security drills (docs/reliability.md): faults, bad input and abuse against a real gateway
//! on loopback, with nothing lost. Each drill is bounded in time and asserts the load accounting at
//! the end (every active counter exactly 0) and that nothing panicked.
//!
//! - `fault_storm`: keyed streaming requests to four simulated workers while clients abort
//!   mid-stream, one worker is killed (connections cut) and restarted twice and another answers 500
//!   for a while;
//! - `stalled_upstream_disconnecting_clients`: a client leaves while the worker has not sent a byte,
//!   over and over; the load is released within 100 ms and the upstream connection is closed;
//! - `membership_churn_under_load`: workers added and removed through the admin API during a storm;
//! - `concurrent_threshold_changes`: HTTP and websocket threshold writes during a storm;
//! - `abuse_*`: slow-loris, connection floods, huge and non-UTF-8 headers, malformed websocket
//!   frames, bad tokens and path tricks.
//!
//! `BCH_LONG_DRILLS=1` scales every drill up (see `docs/reliability.md`). Each drill prints one
//! `DRILL <name>: ...` line of figures to stderr; run with `--nocapture` to see them. The drills take
//! a shared lock so they run one at a time (timing bounds stay meaningful on a 2-core machine).

#[path = "../common/mod.rs"]
mod common;

mod abuse;
mod churn;
mod faults;
mod thresholds;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, Once, PoisonError};
use std::time::{Duration, Instant};

use bch_core::telemetry::{ServerFrame, ServerMessage};
use common::*;
use futures_util::StreamExt;
use gatewayd::RunningGateway;
use gatewayd::config::{Config, WorkerConfig};
use tokio_tungstenite::tungstenite::Message;
use tokio_util::sync::CancellationToken;

const ROUTING_KEY: &str = "x-smg-routing-key";

// ---------------------------------------------------------------------------------------------
// Shared machinery: log and panic capture, the drill lock, sizes.

/// Everything the gateway logged (INFO and up) in this test binary.
static LOG: Mutex<Vec<u8>> = Mutex::new(Vec::new());
/// Every panic message seen by the panic hook in this test binary.
static PANICS: Mutex<Vec<String>> = Mutex::new(Vec::new());
/// Drills run one at a time.
static DRILL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

struct LogWriter;

impl std::io::Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        LOG.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Installs the log capture and the panic recorder (once per test binary).
fn capture() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let _ = tracing_subscriber::fmt()
            .with_writer(|| LogWriter)
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .try_init();
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            PANICS
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(info.to_string());
            default(info);
        }));
    });
}

/// Where the log and the panic record stand now; a drill checks only what came after (drills run
/// one at a time, so what came after is theirs).
fn log_len() -> (usize, usize) {
    (
        LOG.lock().unwrap_or_else(PoisonError::into_inner).len(),
        PANICS.lock().unwrap_or_else(PoisonError::into_inner).len(),
    )
}

/// No panic recorded, and none in the log, since `from` (a [`log_len`] taken earlier).
fn assert_no_panic(from: (usize, usize)) {
    let panics = PANICS.lock().unwrap_or_else(PoisonError::into_inner)[from.1..].to_vec();
    assert!(panics.is_empty(), "panics: {panics:?}");
    let log = LOG.lock().unwrap_or_else(PoisonError::into_inner);
    let log = String::from_utf8_lossy(&log[from.0.min(log.len())..]).into_owned();
    assert!(!log.contains("panicked"), "panic in the log:\n{log}");
}

/// `BCH_LONG_DRILLS=1` (or any value but `0`) scales the drills up.
fn long() -> bool {
    std::env::var_os("BCH_LONG_DRILLS").is_some_and(|v| !v.is_empty() && v != "0")
}

fn scaled(default: usize, long_value: usize) -> usize {
    if long() { long_value } else { default }
}

/// A deterministic pseudo-random number for `i` (SplitMix64).
fn mix(i: u64) -> u64 {
    let mut z = i.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Polls `cond` until it holds; panics with `what` after `limit`.
async fn eventually(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    loop {
        if cond() {
            return start.elapsed();
        }
        assert!(start.elapsed() < limit, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Every worker's active load, read from the router in-process.
fn active_counters(gateway: &RunningGateway) -> Vec<(String, u64)> {
    gateway
        .routing_table()
        .workers()
        .iter()
        .map(|w| (w.spec.name.clone(), w.stats.active()))
        .collect()
}

/// Waits (bounded) until every active counter is 0 and asserts it; returns the counters.
async fn assert_all_idle(gateway: &RunningGateway) -> Vec<(String, u64)> {
    let _ = tokio::time::timeout(Duration::from_secs(5), async {
        while active_counters(gateway).iter().any(|(_, n)| *n != 0) {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await;
    let counters = active_counters(gateway);
    assert!(
        counters.iter().all(|(_, n)| *n == 0),
        "active counters not back to 0: {counters:?}"
    );
    // The admin API agrees with the router (when it needs no token).
    if !gateway.requires_token() {
        assert!(
            active_loads(gateway).await.iter().all(|(_, n)| *n == 0),
            "admin API shows load"
        );
    }
    counters
}

fn config_for(workers: &[(String, String)]) -> Config {
    let mut config = Config::default();
    config.server.listeners.listen = "127.0.0.1:0".parse().unwrap();
    config.server.listeners.control_listen = "127.0.0.1:0".parse().unwrap();
    config.server.timeouts.shutdown_grace = Duration::from_millis(2_000);
    config.health.interval = Duration::from_millis(100);
    config.health.timeout = Duration::from_millis(500);
    // The drills decide health themselves (stopped workers, passive marking); a worker added
    // mid-drill takes its keys at once, as the placement model expects.
    config.health.wait_for_first_probe = false;
    config.telemetry.interval = Duration::from_millis(50);
    config.workers = workers
        .iter()
        .map(|(name, url)| WorkerConfig {
            name: Some(name.clone()),
            url: url.clone(),
            ring_id: None,
            health_path: None,
            metrics_path: None,
            max_in_flight: None,
            server_name: None,
            models: Vec::new(),
        })
        .collect();
    config
}

async fn gateway_is_healthy(gateway: &RunningGateway) {
    let health = client()
        .get(format!("http://{}/health", gateway.data_addr))
        .send()
        .await
        .expect("data plane answers");
    assert_eq!(health.status(), 200);
    let policy = client()
        .get(format!("http://{}/admin/policy", gateway.control_addr))
        .send()
        .await
        .expect("control plane answers");
    assert!(
        policy.status() == 200 || policy.status() == 401,
        "{}",
        policy.status()
    );
}

fn is_openai_error(body: &[u8]) -> bool {
    serde_json::from_slice::<serde_json::Value>(body)
        .is_ok_and(|v| v["error"]["message"].is_string())
}

/// Waits until the storm has finished `n` requests (or ended).
async fn progress(done: &AtomicUsize, n: usize, storm_over: &CancellationToken) {
    while done.load(Ordering::SeqCst) < n && !storm_over.is_cancelled() {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// A telemetry websocket client.
type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

async fn ws_connect(gateway: &RunningGateway) -> Ws {
    tokio_tungstenite::connect_async(format!("ws://{}/ws", gateway.control_addr))
        .await
        .expect("websocket upgrade")
        .0
}

async fn next_message(ws: &mut Ws) -> Option<ServerMessage> {
    loop {
        let message = tokio::time::timeout(Duration::from_secs(10), ws.next())
            .await
            .expect("a frame within 10 s")?
            .ok()?;
        if let Message::Text(text) = message {
            let frame: ServerFrame = serde_json::from_str(&text).expect("frame parses");
            return Some(frame.message);
        }
    }
}
