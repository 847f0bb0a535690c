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

mod common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Once, PoisonError};
use std::time::{Duration, Instant};

use bch_core::policy::{Branch, PolicyKind, PolicySettings};
use bch_core::router::{Router, WorkerSource, WorkerSpec};
use bch_core::routing_key::{ExplicitKey, RoutingKey};
use bch_core::telemetry::{ServerFrame, ServerMessage, SpillEvent};
use bch_drill::sim::SimConfig;
use bch_drill::worker::{Fault, WorkerHandle, spawn_worker};
use common::*;
use futures_util::{SinkExt, StreamExt};
use gatewayd::RunningGateway;
use gatewayd::config::{Config, WorkerConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
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
    config.server.listen = "127.0.0.1:0".parse().unwrap();
    config.server.control_listen = "127.0.0.1:0".parse().unwrap();
    config.server.shutdown_grace_ms = 2_000;
    config.health.interval_ms = 100;
    config.health.timeout_ms = 500;
    // The drills decide health themselves (stopped workers, passive marking); a worker added
    // mid-drill takes its keys at once, as the placement model expects.
    config.health.wait_for_first_probe = false;
    config.telemetry.interval_ms = 50;
    config.workers = workers
        .iter()
        .map(|(name, url)| WorkerConfig {
            name: Some(name.clone()),
            url: url.clone(),
            ring_id: None,
            health_path: None,
            metrics_path: None,
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

// ---------------------------------------------------------------------------------------------
// Fault storm

/// A TCP front for a worker that can be killed abruptly: the listener closes and every connection
/// through it is cut mid-flight, as when the worker's process dies.
struct Frontend {
    task: tokio::task::JoinHandle<()>,
}

impl Frontend {
    async fn start(addr: SocketAddr, backend: SocketAddr) -> Frontend {
        // The port was ours a moment ago; rebinding it right after a kill may race the old
        // listener's close.
        let start = Instant::now();
        let listener = loop {
            match TcpListener::bind(addr).await {
                Ok(l) => break l,
                Err(e) => {
                    assert!(
                        start.elapsed() < Duration::from_secs(5),
                        "rebind {addr}: {e}"
                    );
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
        };
        let task = tokio::spawn(async move {
            let mut connections = tokio::task::JoinSet::new();
            loop {
                tokio::select! {
                    accepted = listener.accept() => {
                        let Ok((mut inbound, _)) = accepted else { continue };
                        connections.spawn(async move {
                            let Ok(mut outbound) = TcpStream::connect(backend).await else {
                                return;
                            };
                            let _ = inbound.set_nodelay(true);
                            let _ = outbound.set_nodelay(true);
                            let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                        });
                    }
                    Some(_) = connections.join_next(), if !connections.is_empty() => {}
                }
            }
        });
        Frontend { task }
    }

    /// Closes the listener and cuts every connection (dropping the task drops them all).
    async fn kill(self) {
        self.task.abort();
        let _ = self.task.await;
    }
}

/// What one storm request ended as.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Outcome {
    /// 200 and the stream ended with `data: [DONE]`.
    Complete,
    /// 200 and the stream ended with the gateway's `event: error`.
    SseErrorEvent,
    /// A non-200 status with an OpenAI-shaped JSON error body.
    CleanError(u16),
    /// The client left mid-stream on purpose.
    Aborted,
    /// Anything else: a silent cut, a transport error, a malformed error. Never acceptable.
    Broken(String),
}

async fn storm_request(
    client: &reqwest::Client,
    url: &str,
    key: &str,
    i: usize,
    abort_after_chunks: Option<usize>,
) -> Outcome {
    let body = serde_json::json!({
        "model": "bch-sim",
        "messages": [{"role": "user", "content": format!("fault storm request {i} for {key}")}],
        "stream": true,
        "max_tokens": 24,
    });
    let response = match client
        .post(url)
        .header(ROUTING_KEY, key)
        .json(&body)
        .send()
        .await
    {
        Ok(r) => r,
        Err(e) => return Outcome::Broken(format!("send: {e}")),
    };
    let status = response.status().as_u16();
    if status != 200 {
        return match response.bytes().await {
            Ok(body) if is_openai_error(&body) => Outcome::CleanError(status),
            Ok(body) => Outcome::Broken(format!(
                "{status} with body {:?}",
                String::from_utf8_lossy(&body)
            )),
            Err(e) => Outcome::Broken(format!("{status}, body error: {e}")),
        };
    }
    let mut stream = response.bytes_stream();
    let mut seen = Vec::new();
    let mut chunks = 0;
    while let Some(chunk) = stream.next().await {
        match chunk {
            Ok(bytes) => {
                seen.extend_from_slice(&bytes);
                chunks += 1;
                if abort_after_chunks.is_some_and(|n| chunks >= n)
                    && !seen.ends_with(b"data: [DONE]\n\n")
                {
                    return Outcome::Aborted;
                }
            }
            Err(e) => {
                return Outcome::Broken(format!(
                    "stream cut after {:?}: {e}",
                    String::from_utf8_lossy(&seen)
                ));
            }
        }
    }
    let text = String::from_utf8_lossy(&seen);
    if let Some(at) = text.find("event: error\n") {
        if text[at..].ends_with("\n\n") && is_openai_error(error_data(&text[at..]).as_bytes()) {
            return Outcome::SseErrorEvent;
        }
        return Outcome::Broken(format!("malformed error event: {text:?}"));
    }
    if text.ends_with("data: [DONE]\n\n") {
        Outcome::Complete
    } else {
        Outcome::Broken(format!("silent cut: {text:?}"))
    }
}

fn error_data(event: &str) -> String {
    event
        .lines()
        .find_map(|l| l.strip_prefix("data: "))
        .unwrap_or_default()
        .to_owned()
}

fn sim() -> SimConfig {
    SimConfig::default().with_time_scale(0.01)
}

/// Waits until the storm has finished `n` requests (or ended).
async fn progress(done: &AtomicUsize, n: usize, storm_over: &CancellationToken) {
    while done.load(Ordering::SeqCst) < n && !storm_over.is_cancelled() {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

fn worker_healthy(gateway: &RunningGateway, index: usize) -> bool {
    gateway.routing_table().healthy_flags()[index]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_storm() {
    let _drill = DRILL.lock().await;
    capture();
    let log_from = log_len();
    let total = scaled(5_000, 50_000);
    let concurrency = 32;
    let started = Instant::now();

    // Four simulated workers; sim-1 sits behind a front that can be killed abruptly.
    let localhost = SocketAddr::from(([127, 0, 0, 1], 0));
    let mut sims: Vec<Option<WorkerHandle>> = Vec::new();
    for i in 0..4 {
        sims.push(Some(
            spawn_worker(localhost, format!("sim-{i}"), sim())
                .await
                .unwrap(),
        ));
    }
    let backend_1 = sims[1].as_ref().unwrap().local_addr();
    let front_addr = TcpListener::bind(localhost)
        .await
        .unwrap()
        .local_addr()
        .unwrap();
    let front = Frontend::start(front_addr, backend_1).await;
    let urls: Vec<(String, String)> = (0..4)
        .map(|i| {
            let url = if i == 1 {
                format!("http://{front_addr}")
            } else {
                sims[i].as_ref().unwrap().url()
            };
            (format!("sim-{i}"), url)
        })
        .collect();
    let mut config = config_for(&urls);
    config.policy.kind = PolicyKind::BoundedConsistentHashing;
    config.server.first_byte_timeout_ms = 10_000;
    config.server.stream_idle_timeout_ms = 10_000;
    let gateway = Arc::new(start(config).await);

    let done = Arc::new(AtomicUsize::new(0));
    let storm_over = CancellationToken::new();

    // Health watcher: records sim-1's and sim-2's health transitions.
    let watcher = {
        let gateway = Arc::clone(&gateway);
        let stop = storm_over.clone();
        tokio::spawn(async move {
            let mut transitions: Vec<(usize, bool)> = Vec::new();
            let mut last = [true; 4];
            loop {
                let health = gateway.routing_table().healthy_flags().to_vec();
                for (i, h) in health.iter().enumerate() {
                    if *h != last[i] {
                        transitions.push((i, *h));
                        last[i] = *h;
                    }
                }
                if stop.is_cancelled() {
                    return transitions;
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
    };

    // Chaos: kill and restart sim-1 twice; sim-2 answers 500 for a while.
    let chaos = {
        let gateway = Arc::clone(&gateway);
        let done = Arc::clone(&done);
        let storm_over = storm_over.clone();
        let mut backend = sims[1].take();
        let faulty = Arc::new(sims[2].take().unwrap());
        let faulty_in_chaos = Arc::clone(&faulty);
        let task = tokio::spawn(async move {
            let mut front = Some(front);
            let mut figures = BTreeMap::new();
            for round in 0..2 {
                progress(&done, total * (10 + 45 * round) / 100, &storm_over).await;
                front.take().unwrap().kill().await;
                backend.take().unwrap().shutdown().await.unwrap();
                let down = eventually("sim-1 marked down", Duration::from_secs(10), || {
                    !worker_healthy(&gateway, 1)
                })
                .await;
                figures.insert(format!("kill{round}_down_ms"), down.as_millis());
                progress(&done, total * (25 + 45 * round) / 100, &storm_over).await;
                backend = Some(spawn_worker(backend_1, "sim-1", sim()).await.unwrap());
                front = Some(Frontend::start(front_addr, backend_1).await);
                let up = eventually("sim-1 marked up", Duration::from_secs(10), || {
                    worker_healthy(&gateway, 1)
                })
                .await;
                figures.insert(format!("restart{round}_up_ms"), up.as_millis());
                if round == 0 {
                    progress(&done, total * 30 / 100, &storm_over).await;
                    faulty_in_chaos.set_fault(Fault::Status500);
                    progress(&done, total * 45 / 100, &storm_over).await;
                    faulty_in_chaos.set_fault(Fault::None);
                    let up = eventually("sim-2 healthy again", Duration::from_secs(10), || {
                        worker_healthy(&gateway, 2)
                    })
                    .await;
                    figures.insert("sim2_up_after_500s_ms".into(), up.as_millis());
                }
            }
            (front, backend, figures)
        });
        (task, faulty)
    };

    // The storm.
    let client = reqwest::Client::new();
    let url = format!("http://{}/v1/chat/completions", gateway.data_addr);
    let outcomes: Vec<Outcome> = futures_util::stream::iter(0..total)
        .map(|i| {
            let client = client.clone();
            let url = url.clone();
            let done = Arc::clone(&done);
            async move {
                let key = format!("storm-key-{}", mix(i as u64) % 48);
                let r = mix(i as u64 ^ 0xABCD);
                let abort = (r % 100 < 20).then_some(1 + (r >> 8) as usize % 3);
                let outcome = tokio::time::timeout(
                    Duration::from_secs(30),
                    storm_request(&client, &url, &key, i, abort),
                )
                .await
                .unwrap_or_else(|_| Outcome::Broken("no answer within 30 s".into()));
                done.fetch_add(1, Ordering::SeqCst);
                outcome
            }
        })
        .buffer_unordered(concurrency)
        .collect()
        .await;
    let (front, backend, chaos_figures) = chaos.0.await.unwrap();
    storm_over.cancel();
    let transitions = watcher.await.unwrap();
    let storm_time = started.elapsed();

    let mut tally: BTreeMap<String, usize> = BTreeMap::new();
    let mut broken = Vec::new();
    for outcome in &outcomes {
        let label = match outcome {
            Outcome::Complete => "complete".to_owned(),
            Outcome::SseErrorEvent => "sse_error_event".to_owned(),
            Outcome::CleanError(s) => format!("error_{s}"),
            Outcome::Aborted => "aborted".to_owned(),
            Outcome::Broken(why) => {
                broken.push(why.clone());
                "broken".to_owned()
            }
        };
        *tally.entry(label).or_default() += 1;
    }
    let counters = assert_all_idle(&gateway).await;
    let down_up = |w: usize| {
        let t: Vec<bool> = transitions
            .iter()
            .filter(|(i, _)| *i == w)
            .map(|(_, h)| *h)
            .collect();
        t
    };
    eprintln!(
        "DRILL fault_storm: requests={total} concurrency={concurrency} outcomes={tally:?} kills=2 restarts=2 \
         sim1_health={:?} sim2_health={:?} chaos={chaos_figures:?} final_active={counters:?} elapsed_ms={}",
        down_up(1),
        down_up(2),
        storm_time.as_millis()
    );
    assert!(
        broken.is_empty(),
        "{} requests broken, first: {:?}",
        broken.len(),
        &broken[..broken.len().min(5)]
    );
    assert_eq!(outcomes.len(), total);
    // Health marked the dead worker down and back up, twice.
    assert!(
        down_up(1).starts_with(&[false, true, false, true]),
        "sim-1 transitions {:?}",
        down_up(1)
    );
    assert!(
        tally.get("error_500").copied().unwrap_or(0) > 0,
        "the 500 window was seen"
    );
    assert!(tally.get("aborted").copied().unwrap_or(0) > 0);
    assert!(tally.get("complete").copied().unwrap_or(0) > total / 2);
    gateway_is_healthy(&gateway).await;
    assert_no_panic(log_from);

    let gateway = Arc::into_inner(gateway).expect("only owner left");
    gateway.shutdown().await;
    if let Some(front) = front {
        front.kill().await;
    }
    if let Some(backend) = backend {
        backend.shutdown().await.unwrap();
    }
    Arc::into_inner(chaos.1).unwrap().shutdown().await.unwrap();
    for s in sims.into_iter().flatten() {
        s.shutdown().await.unwrap();
    }
}

// ---------------------------------------------------------------------------------------------
// Stalled upstream + disconnecting clients

/// The load must be released within this time of the client's disconnect.
const RELEASE_BOUND: Duration = Duration::from_millis(100);

/// Measures how late the OS wakes a plain thread that sleeps 1 ms at a time: the machine's own
/// scheduling stalls, which no gateway code can beat.
struct LagProbe {
    worst_us: Arc<std::sync::atomic::AtomicU64>,
    stop: Arc<std::sync::atomic::AtomicBool>,
}

impl LagProbe {
    fn start() -> LagProbe {
        let worst_us = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (w, s) = (Arc::clone(&worst_us), Arc::clone(&stop));
        std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                let before = Instant::now();
                std::thread::sleep(Duration::from_millis(1));
                let late = before.elapsed().saturating_sub(Duration::from_millis(1));
                w.fetch_max(late.as_micros() as u64, Ordering::Relaxed);
            }
        });
        LagProbe { worst_us, stop }
    }

    fn reset(&self) {
        self.worst_us.store(0, Ordering::Relaxed);
    }

    fn worst(&self) -> Duration {
        Duration::from_micros(self.worst_us.load(Ordering::Relaxed))
    }
}

impl Drop for LagProbe {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_upstream_disconnecting_clients() {
    let _drill = DRILL.lock().await;
    capture();
    let log_from = log_len();
    let cycles = scaled(1_000, 10_000);
    let worker = fake_worker("stall").await;
    let gateway = start(test_config(&[&worker])).await;
    let stats = Arc::clone(&gateway.routing_table().workers()[0].stats);
    let request = b"POST /stall HTTP/1.1\r\nhost: drill\r\nx-smg-routing-key: stalled\r\ncontent-length: 0\r\n\r\n";
    let mut release = Vec::with_capacity(cycles);
    let mut upstream_closed = Vec::with_capacity(cycles);
    let mut excused = Vec::new();
    let lag = LagProbe::start();
    let started = Instant::now();
    for cycle in 0..cycles {
        let mut stream = TcpStream::connect(gateway.data_addr).await.unwrap();
        stream.write_all(request).await.unwrap();
        wait_for(&worker.state, |s| s.stalled.load(Ordering::SeqCst) == 1).await;
        assert_eq!(stats.active(), 1, "cycle {cycle}: load taken");
        let aborted = Instant::now();
        drop(stream);
        // Read the counter itself with yields (the release is normally well under a millisecond),
        // then 1 ms naps after 5 ms so a spinning reader cannot starve the gateway's threads.
        lag.reset();
        while stats.active() != 0 {
            assert!(
                aborted.elapsed() < Duration::from_secs(2),
                "cycle {cycle}: load not released"
            );
            if aborted.elapsed() < Duration::from_millis(5) {
                tokio::task::yield_now().await;
            } else {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
        let took = aborted.elapsed();
        if took >= RELEASE_BOUND && lag.worst() >= RELEASE_BOUND / 4 {
            // The machine, not the gateway, stalled: a plain thread sleeping 1 ms overslept by a
            // quarter of the bound during this cycle (a 2-core box shared with other jobs). Counted and reported, and bounded below.
            excused.push(took);
        } else {
            release.push(took);
        }
        wait_for(&worker.state, |s| {
            s.cancelled.load(Ordering::SeqCst) == cycle as u64 + 1
        })
        .await;
        upstream_closed.push(aborted.elapsed());
    }
    let elapsed = started.elapsed();
    release.sort_unstable();
    upstream_closed.sort_unstable();
    let pct = |v: &[Duration], p: usize| v[(v.len() - 1) * p / 100].as_micros();
    eprintln!(
        "DRILL stalled_upstream: cycles={cycles} excused_for_machine_stalls={excused:?} release_us p50={} p99={} max={} upstream_closed_us p50={} p99={} max={} \
         worker_requests={} worker_cancelled={} final_active={} elapsed_ms={}",
        pct(&release, 50),
        pct(&release, 99),
        pct(&release, 100),
        pct(&upstream_closed, 50),
        pct(&upstream_closed, 99),
        pct(&upstream_closed, 100),
        worker.state.requests.load(Ordering::SeqCst),
        worker.state.cancelled.load(Ordering::SeqCst),
        stats.active(),
        elapsed.as_millis()
    );
    let worst = *release.last().unwrap();
    assert!(worst < RELEASE_BOUND, "slowest release {worst:?}");
    assert!(
        excused.len() <= cycles / 20,
        "the machine stalled in {} of {cycles} cycles: {excused:?}",
        excused.len()
    );
    assert_eq!(worker.state.cancelled.load(Ordering::SeqCst), cycles as u64);
    assert_eq!(worker.state.stalled.load(Ordering::SeqCst), 0);
    assert_all_idle(&gateway).await;
    assert_no_panic(log_from);
    gateway.shutdown().await;
}

// ---------------------------------------------------------------------------------------------
// Membership churn under load

/// A membership change through the admin API and when it was issued and answered.
struct Change {
    issued: Instant,
    returned: Instant,
    op: String,
    removed: Option<String>,
    added: Option<String>,
    members: Vec<(String, String)>,
}

/// Where each key lands with `members` (strict policy, all healthy), by a fresh core router.
fn placements(members: &[(String, String)], keys: &[String]) -> HashMap<String, String> {
    let specs = members
        .iter()
        .map(|(name, url)| WorkerSpec {
            name: name.clone(),
            url: url.clone(),
            ring_id: None,
            source: WorkerSource::Static,
        })
        .collect();
    let router = Router::new(specs, Config::default().policy_settings()).unwrap();
    let table = router.table();
    keys.iter()
        .map(|key| {
            let decision = table.explain(&RoutingKey::Explicit(
                ExplicitKey::parse(key.as_bytes()).unwrap(),
            ));
            let worker = decision.worker.expect("a worker");
            (key.clone(), table.workers()[worker].spec.name.clone())
        })
        .collect()
}

struct Observed {
    key: String,
    sent: Instant,
    received: Instant,
    status: u16,
    worker: String,
    served_by: String,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn membership_churn_under_load() {
    let _drill = DRILL.lock().await;
    capture();
    let log_from = log_len();
    let rounds = scaled(3, 20);
    let mut fakes = Vec::new();
    for i in 0..5 {
        fakes.push(fake_worker(&format!("w{i}")).await);
    }
    let all: Vec<(String, String)> = fakes
        .iter()
        .map(|f| (f.state.name.clone(), f.url()))
        .collect();
    let mut config = config_for(&all[..4]);
    // Health is not under test here: keep probes out of the way so placement is the ring's alone.
    config.health.interval_ms = 3_600_000;
    let gateway = Arc::new(start(config).await);
    let keys: Vec<String> = (0..120).map(|i| format!("churn-key-{i}")).collect();

    let done = Arc::new(AtomicUsize::new(0));
    let stop = CancellationToken::new();
    let observed = Arc::new(Mutex::new(Vec::<Observed>::new()));
    let mut clients = Vec::new();
    for c in 0..16usize {
        let (gateway, done, stop, observed, keys) = (
            Arc::clone(&gateway),
            Arc::clone(&done),
            stop.clone(),
            Arc::clone(&observed),
            keys.clone(),
        );
        clients.push(tokio::spawn(async move {
            let client = reqwest::Client::new();
            let url = format!("http://{}/v1/churn", gateway.data_addr);
            let mut n = c as u64;
            while !stop.is_cancelled() {
                n += 16;
                let key = &keys[(mix(n) % keys.len() as u64) as usize];
                let sent = Instant::now();
                let response = client
                    .post(&url)
                    .header(ROUTING_KEY, key)
                    .body("{}")
                    .send()
                    .await
                    .expect("gateway answers");
                let received = Instant::now();
                let header = |name: &str| {
                    response
                        .headers()
                        .get(name)
                        .map(|v| v.to_str().unwrap().to_owned())
                        .unwrap_or_default()
                };
                let record = Observed {
                    key: key.clone(),
                    sent,
                    received,
                    status: response.status().as_u16(),
                    worker: header("x-bch-worker"),
                    served_by: header("x-worker-name"),
                };
                let _ = response.bytes().await;
                observed
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(record);
                done.fetch_add(1, Ordering::SeqCst);
            }
        }));
    }

    let http = client();
    let control = format!("http://{}", gateway.control_addr);
    let mut members: Vec<(String, String)> = all[..4].to_vec();
    let mut changes: Vec<Change> = Vec::new();
    let script = ["-w2", "+w4", "+w2", "-w0", "-w4", "+w0"];
    let never = CancellationToken::new();
    for _ in 0..rounds {
        for step in script {
            let next = done.load(Ordering::SeqCst) + 150;
            progress(&done, next, &never).await;
            let name = &step[1..];
            let issued = Instant::now();
            let (removed, added) = if step.starts_with('-') {
                let response = http
                    .delete(format!("{control}/admin/workers/{name}"))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(response.status(), 200, "{step}");
                members.retain(|(n, _)| n != name);
                (Some(name.to_owned()), None)
            } else {
                let url = all.iter().find(|(n, _)| n == name).unwrap().1.clone();
                let response = http
                    .post(format!("{control}/admin/workers"))
                    .json(&serde_json::json!({"name": name, "url": url}))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(response.status(), 201, "{step}");
                members.push((name.to_owned(), url));
                (None, Some(name.to_owned()))
            };
            changes.push(Change {
                issued,
                returned: Instant::now(),
                op: step.to_owned(),
                removed,
                added,
                members: members.clone(),
            });
        }
    }
    let next = done.load(Ordering::SeqCst) + 150;
    progress(&done, next, &never).await;
    stop.cancel();
    for c in clients {
        c.await.unwrap();
    }

    // The model: placements for the initial membership and after each change.
    let mut states = vec![placements(&all[..4], &keys)];
    for change in &changes {
        states.push(placements(&change.members, &keys));
    }
    // Keys move only as the ring says: between two memberships, only keys owned by the worker that
    // left (or taken by the one that joined) change hands.
    let mut moved_per_change = Vec::new();
    for (i, change) in changes.iter().enumerate() {
        let (before, after) = (&states[i], &states[i + 1]);
        let moved: Vec<&String> = keys.iter().filter(|k| before[*k] != after[*k]).collect();
        for key in &moved {
            let involved = change.removed.as_deref() == Some(before[*key].as_str())
                || change.added.as_deref() == Some(after[*key].as_str());
            assert!(
                involved,
                "{}: {key} moved {} -> {}",
                change.op, before[*key], after[*key]
            );
        }
        moved_per_change.push(moved.len());
    }
    let observed = std::mem::take(&mut *observed.lock().unwrap_or_else(PoisonError::into_inner));
    let mut after_removal_checked = 0;
    let mut ambiguous = 0;
    for r in &observed {
        assert_eq!(r.status, 200, "{}", r.key);
        assert_eq!(r.worker, r.served_by, "the named worker served it");
        // Membership i (0 = initial) may be in force from when change i was issued until change
        // i + 1 returned.
        let allowed: Vec<usize> = (0..=changes.len())
            .filter(|&i| {
                let from_ok = i == 0 || changes[i - 1].issued <= r.received;
                let until_ok = i == changes.len() || changes[i].returned >= r.sent;
                from_ok && until_ok
            })
            .collect();
        if allowed.len() > 1 {
            ambiguous += 1;
        }
        assert!(
            allowed.iter().any(|&i| states[i][&r.key] == r.worker),
            "{} went to {} but the ring says {:?}",
            r.key,
            r.worker,
            allowed
                .iter()
                .map(|&i| &states[i][&r.key])
                .collect::<Vec<_>>()
        );
        // No request is routed to a removed worker after the removal returned (until it is re-added).
        for (i, change) in changes.iter().enumerate() {
            let Some(removed) = &change.removed else {
                continue;
            };
            let readded = changes[i + 1..]
                .iter()
                .find(|c| c.added.as_ref() == Some(removed))
                .map(|c| c.issued);
            if r.sent > change.returned && readded.is_none_or(|t| r.received < t) {
                after_removal_checked += 1;
                assert_ne!(&r.worker, removed, "routed to {removed} after its removal");
            }
        }
    }
    let counters = assert_all_idle(&gateway).await;
    eprintln!(
        "DRILL membership_churn: requests={} changes={} keys={} moved_keys_per_change={moved_per_change:?} \
         checked_after_removal={after_removal_checked} in_change_window={ambiguous} final_members={:?} final_active={counters:?}",
        observed.len(),
        changes.len(),
        keys.len(),
        members.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
    );
    assert!(after_removal_checked > 0);
    gateway_is_healthy(&gateway).await;
    assert_no_panic(log_from);
    Arc::into_inner(gateway).unwrap().shutdown().await;
}

// ---------------------------------------------------------------------------------------------
// Concurrent threshold changes

/// The (gap, skew) pairs the writers alternate between. Every gap is distinct, so a decision that
/// mixed two writes (say gap 1 with skew 2.0) shows as a pair not in this list.
const PAIRS: [(u64, f64); 5] = [(0, 1.0), (1, 1.25), (2, 1.5), (3, 2.0), (5, 1.1)];

fn known_pair(gap: u64, skew: f64) -> bool {
    PAIRS.contains(&(gap, skew))
}

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

fn pair_of(policy: &PolicySettings) -> (u64, f64) {
    (policy.min_load_gap, policy.max_load_skew)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_threshold_changes() {
    let _drill = DRILL.lock().await;
    capture();
    let log_from = log_len();
    let writes = scaled(60, 600);
    let (a, b, c) = (
        fake_worker("a").await,
        fake_worker("b").await,
        fake_worker("c").await,
    );
    let mut config = test_config(&[&a, &b, &c]);
    config.policy.kind = PolicyKind::BoundedConsistentHashing;
    config.policy.min_load_gap = 2;
    config.policy.max_load_skew = 1.5;
    let gateway = Arc::new(start(config).await);
    let final_pair = (8, 1.05);

    // Observer: every spill event and policy update until the final write is announced.
    let mut observer_ws = ws_connect(&gateway).await;
    let observer = tokio::spawn(async move {
        let mut spills: Vec<SpillEvent> = Vec::new();
        let mut updates: Vec<(u64, f64)> = Vec::new();
        while let Some(message) = next_message(&mut observer_ws).await {
            match message {
                ServerMessage::Snapshot(s) => spills.extend(s.spills),
                ServerMessage::Tick(t) => spills.extend(t.spills),
                ServerMessage::Policy(p) => {
                    updates.push(pair_of(&p.policy));
                    if pair_of(&p.policy) == final_pair {
                        break;
                    }
                }
                _ => {}
            }
        }
        (spills, updates)
    });

    // Storm keys: two that share a preferred worker and one elsewhere, so that worker carries
    // twice the mean and the bound fires under every pair with skew < 2 (worker ports, hence ring
    // placement, differ from run to run; three arbitrary keys may land on three workers).
    let hot_keys: Arc<Vec<String>> = {
        let mut by_worker: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for i in 0..500 {
            let key = format!("hot-{i}");
            let worker = preferred_worker(&gateway, &key).await;
            by_worker.entry(worker).or_default().push(key);
            if by_worker.len() >= 2 && by_worker.values().any(|keys| keys.len() >= 2) {
                break;
            }
        }
        let pair = by_worker.values().find(|keys| keys.len() >= 2).unwrap();
        let other = by_worker
            .values()
            .find(|keys| !keys.contains(&pair[0]))
            .unwrap();
        Arc::new(vec![pair[0].clone(), pair[1].clone(), other[0].clone()])
    };

    // Storm: hot keys with short streams, so loads pile up and the bound spills.
    let stop = CancellationToken::new();
    let requests = Arc::new(AtomicUsize::new(0));
    let mut storm = Vec::new();
    for i in 0..24u64 {
        let (gateway, stop, requests) = (Arc::clone(&gateway), stop.clone(), Arc::clone(&requests));
        let hot_keys = Arc::clone(&hot_keys);
        storm.push(tokio::spawn(async move {
            let client = reqwest::Client::new();
            let url = format!("http://{}/sse?n=3&gap_ms=3", gateway.data_addr);
            while !stop.is_cancelled() {
                let response = client
                    .get(&url)
                    .header(ROUTING_KEY, hot_keys[i as usize % 3].as_str())
                    .send()
                    .await
                    .expect("gateway answers");
                assert_eq!(response.status(), 200);
                let body = response.bytes().await.expect("whole stream");
                assert!(body.ends_with(b"data: [DONE]\n\n"));
                requests.fetch_add(1, Ordering::SeqCst);
            }
        }));
    }

    // Explain sampler: the bound it reports uses the same pair as the policy it reports.
    let sampler = {
        let (gateway, stop) = (Arc::clone(&gateway), stop.clone());
        tokio::spawn(async move {
            let http = client();
            let mut samples = 0;
            while !stop.is_cancelled() {
                let v: serde_json::Value = http
                    .get(format!(
                        "http://{}/admin/explain?routing_key=hot-0",
                        gateway.control_addr
                    ))
                    .send()
                    .await
                    .unwrap()
                    .json()
                    .await
                    .unwrap();
                let gap = v["bound"]["min_load_gap"].as_u64().unwrap();
                let skew = v["bound"]["max_load_skew"].as_f64().unwrap();
                assert!(known_pair(gap, skew), "explain mixed a pair: {v}");
                assert_eq!(v["policy"]["min_load_gap"].as_u64(), Some(gap));
                assert_eq!(v["policy"]["max_load_skew"].as_f64(), Some(skew));
                samples += 1;
            }
            samples
        })
    };

    // Writers: HTTP and websocket, concurrently, each alternating through the pairs.
    let http_writer = {
        let gateway = Arc::clone(&gateway);
        tokio::spawn(async move {
            let http = client();
            let mut last = None;
            for i in 0..writes {
                let (gap, skew) = PAIRS[i % PAIRS.len()];
                let v: serde_json::Value = http
                    .put(format!("http://{}/admin/policy", gateway.control_addr))
                    .json(&serde_json::json!({"min_load_gap": gap, "max_load_skew": skew}))
                    .send()
                    .await
                    .unwrap()
                    .json()
                    .await
                    .unwrap();
                assert_eq!(v["min_load_gap"].as_u64(), Some(gap), "{v}");
                assert_eq!(v["max_load_skew"].as_f64(), Some(skew), "{v}");
                last = Some((gap, skew));
            }
            last.unwrap()
        })
    };
    let ws_writer = {
        let mut ws = ws_connect(&gateway).await;
        tokio::spawn(async move {
            let mut last = None;
            for i in 0..writes {
                let (gap, skew) = PAIRS[(i + 2) % PAIRS.len()];
                let id = format!("w{i}");
                let command = serde_json::json!({"type": "set_policy", "id": id, "min_load_gap": gap, "max_load_skew": skew});
                ws.send(Message::Text(command.to_string().into()))
                    .await
                    .unwrap();
                loop {
                    match next_message(&mut ws).await.expect("socket open") {
                        ServerMessage::Ack(ack)
                            if serde_json::to_value(&ack.id).unwrap() == serde_json::json!(id) =>
                        {
                            assert_eq!(pair_of(&ack.policy), (gap, skew));
                            break;
                        }
                        ServerMessage::Error(e) => panic!("command refused: {}", e.message),
                        _ => {}
                    }
                }
                last = Some((gap, skew));
            }
            (last.unwrap(), ws)
        })
    };
    let last_http = http_writer.await.unwrap();
    let (last_ws, mut ws) = ws_writer.await.unwrap();
    stop.cancel();
    for task in storm {
        task.await.unwrap();
    }
    let samples = sampler.await.unwrap();

    // After concurrent writers, the policy is the last write of one of them.
    let policy: PolicySettings = client()
        .get(format!("http://{}/admin/policy", gateway.control_addr))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(
        pair_of(&policy) == last_http || pair_of(&policy) == last_ws,
        "{policy:?} is neither {last_http:?} nor {last_ws:?}"
    );
    // Sequential writes through both paths: the last one written is the one in force.
    let put = |gap: u64, skew: f64| {
        let url = format!("http://{}/admin/policy", gateway.control_addr);
        async move {
            let response = client()
                .put(url)
                .json(&serde_json::json!({"min_load_gap": gap, "max_load_skew": skew}))
                .send()
                .await
                .unwrap();
            assert_eq!(response.status(), 200);
        }
    };
    put(7, 2.5).await;
    ws.send(Message::Text(
        r#"{"type":"set_policy","id":"final","min_load_gap":6,"max_load_skew":1.3}"#.into(),
    ))
    .await
    .unwrap();
    loop {
        if let ServerMessage::Ack(ack) = next_message(&mut ws).await.unwrap() {
            assert_eq!(pair_of(&ack.policy), (6, 1.3));
            break;
        }
    }
    let now: PolicySettings = client()
        .get(format!("http://{}/admin/policy", gateway.control_addr))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(pair_of(&now), (6, 1.3));
    put(final_pair.0, final_pair.1).await;
    let (spills, updates) = observer.await.unwrap();
    assert_eq!(updates.last(), Some(&final_pair));
    assert_eq!(pair_of(gateway.routing_table().policy()), final_pair);

    let mut by_pair: BTreeMap<String, usize> = BTreeMap::new();
    for event in &spills {
        assert!(
            known_pair(event.min_load_gap, event.max_load_skew),
            "decision with a mixed pair: {event:?}"
        );
        // The numbers behind the decision satisfy the rule with that very pair.
        assert!(
            event.preferred_load.saturating_sub(event.min_load) > event.min_load_gap
                && event.preferred_load as f64 > event.mean_load * event.max_load_skew,
            "{event:?}"
        );
        assert!(matches!(
            event.branch,
            Branch::ExplicitRoutingKeySpillover | Branch::ExplicitRoutingKeyNoEligibleCandidate
        ));
        *by_pair
            .entry(format!("{}/{}", event.min_load_gap, event.max_load_skew))
            .or_default() += 1;
    }
    let distinct: HashSet<(u64, u64)> = spills
        .iter()
        .map(|e| (e.min_load_gap, e.max_load_skew.to_bits()))
        .collect();
    let counters = assert_all_idle(&gateway).await;
    eprintln!(
        "DRILL thresholds: requests={} writes_http={writes} writes_ws={writes} explain_samples={samples} \
         spill_events={} by_pair={by_pair:?} policy_updates_seen={} final={final_pair:?} final_active={counters:?}",
        requests.load(Ordering::SeqCst),
        spills.len(),
        updates.len(),
    );
    assert!(!spills.is_empty(), "the storm produced spills");
    assert!(
        distinct.len() >= 2,
        "spills under at least two pairs: {by_pair:?}"
    );
    gateway_is_healthy(&gateway).await;
    assert_no_panic(log_from);
    Arc::into_inner(gateway).unwrap().shutdown().await;
}

// ---------------------------------------------------------------------------------------------
// Abuse

/// What a raw exchange got back.
#[derive(Debug)]
struct RawReply {
    /// Status of the first response, if one arrived.
    status: Option<u16>,
    /// Everything read (lossy text).
    text: String,
    /// The server closed the connection (EOF or reset) within the time limit.
    closed: bool,
}

impl RawReply {
    fn body(&self) -> &str {
        self.text.split_once("\r\n\r\n").map_or("", |(_, b)| b)
    }
}

/// Reads whatever the server sends until it closes (or `limit`); tolerant of a reset after data.
async fn read_reply(stream: &mut TcpStream, limit: Duration) -> RawReply {
    let mut seen = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    let closed = tokio::time::timeout(limit, async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => seen.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await
    .is_ok();
    let text = String::from_utf8_lossy(&seen).into_owned();
    let status = text
        .strip_prefix("HTTP/1.1 ")
        .and_then(|rest| rest.get(..3))
        .and_then(|code| code.parse().ok());
    RawReply {
        status,
        text,
        closed,
    }
}

/// Sends `request` verbatim (writing errors ignored: the server may close early) and reads the reply.
async fn raw_exchange(addr: SocketAddr, request: &[u8]) -> RawReply {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let (mut reader, mut writer) = stream.split();
    let write = async {
        let _ = writer.write_all(request).await;
    };
    let mut seen = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    let read = async {
        tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                match reader.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => seen.extend_from_slice(&buf[..n]),
                }
            }
        })
        .await
        .is_ok()
    };
    let ((), closed) = tokio::join!(write, read);
    let text = String::from_utf8_lossy(&seen).into_owned();
    let status = text
        .strip_prefix("HTTP/1.1 ")
        .and_then(|rest| rest.get(..3))
        .and_then(|code| code.parse().ok());
    RawReply {
        status,
        text,
        closed,
    }
}

fn rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}

fn metric(gateway: &RunningGateway, name: &str) -> f64 {
    let text = gateway.metrics_text();
    // Sum over every label set of the family.
    text.lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with(' ') || rest.starts_with('{'))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abuse_slow_loris() {
    let _drill = DRILL.lock().await;
    capture();
    let log_from = log_len();
    let worker = fake_worker("w").await;
    let mut config = test_config(&[&worker]);
    config.server.header_read_timeout_ms = 300;
    let gateway = start(config).await;
    let addr = gateway.data_addr;
    let slow = scaled(16, 200);
    let mut tasks = Vec::new();
    for i in 0..slow {
        tasks.push(tokio::spawn(async move {
            let mut stream = TcpStream::connect(addr).await.unwrap();
            let start = Instant::now();
            // Half say nothing at all; half drip a request head one byte at a time.
            let drip: &[u8] = b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nx-smg-routing-key: loris\r\nx-pad: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
            let mut sent = 0;
            let mut buf = [0u8; 1024];
            let mut got = Vec::new();
            let deadline = Duration::from_secs(5);
            loop {
                assert!(
                    start.elapsed() < deadline,
                    "slow client {i} still connected after {deadline:?}"
                );
                tokio::select! {
                    read = stream.read(&mut buf) => match read {
                        Ok(0) | Err(_) => break,
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                    },
                    () = tokio::time::sleep(Duration::from_millis(20)), if i % 2 == 1 => {
                        if sent < drip.len() {
                            if stream.write_all(&drip[sent..=sent]).await.is_err() {
                                break;
                            }
                            sent += 1;
                        }
                    }
                }
            }
            (start.elapsed(), String::from_utf8_lossy(&got).into_owned())
        }));
    }
    // Meanwhile, normal clients are served.
    let mut served = 0;
    for _ in 0..20 {
        let response = client()
            .post(format!("http://{addr}/v1/chat/completions"))
            .header(ROUTING_KEY, "normal")
            .body("{}")
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        served += 1;
    }
    let mut closed_after = Vec::new();
    for task in tasks {
        let (elapsed, got) = task.await.unwrap();
        assert!(
            got.is_empty() || got.starts_with("HTTP/1.1 408"),
            "slow client got {got:?}"
        );
        closed_after.push(elapsed.as_millis());
    }
    closed_after.sort_unstable();
    assert_all_idle(&gateway).await;
    gateway_is_healthy(&gateway).await;
    eprintln!(
        "DRILL abuse_slow_loris: slow_clients={slow} header_read_timeout_ms=300 closed_after_ms min={} max={} normal_requests_served={served}",
        closed_after[0],
        closed_after[closed_after.len() - 1]
    );
    assert_no_panic(log_from);
    gateway.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abuse_connection_flood() {
    let _drill = DRILL.lock().await;
    capture();
    let log_from = log_len();
    let worker = fake_worker("w").await;
    let mut config = test_config(&[&worker]);
    config.server.max_connections = 16;
    config.server.header_read_timeout_ms = 60_000;
    let gateway = start(config).await;
    let addr = gateway.data_addr;
    // Fill every slot with an idle connection.
    let mut held = Vec::new();
    for _ in 0..16 {
        held.push(TcpStream::connect(addr).await.unwrap());
    }
    let flood = scaled(2_000, 20_000);
    let batch = 100;
    // Warm-up batch (allocator arenas, task slabs), then measure.
    let rss_before = rss_kib();
    let mut answered = 0usize;
    let mut bodies_ok = 0usize;
    let mut i = 0;
    while i < flood {
        let n = batch.min(flood - i);
        let replies = futures_util::future::join_all((0..n).map(|_| async move {
            let mut stream = TcpStream::connect(addr).await.unwrap();
            read_reply(&mut stream, Duration::from_secs(5)).await
        }))
        .await;
        for reply in replies {
            assert!(reply.closed, "over-capacity connection left open");
            assert_eq!(reply.status, Some(503), "{reply:?}");
            answered += 1;
            let body: serde_json::Value = serde_json::from_str(reply.body()).expect("JSON body");
            assert_eq!(body["error"]["code"], "too_many_connections");
            bodies_ok += 1;
        }
        i += n;
    }
    let rss_after = rss_kib();
    // A real client that sends its request at once also gets the 503 (or, at worst, a reset: never
    // a hang).
    let with_request = raw_exchange(
        addr,
        b"GET /v1/models HTTP/1.1\r\nhost: x\r\nx-smg-routing-key: k\r\n\r\n",
    )
    .await;
    assert!(with_request.closed);
    let rejected = metric(&gateway, "bch_rejected_connections_total");
    // Free the slots: the gateway serves again.
    drop(held);
    let start = Instant::now();
    loop {
        let reply = raw_exchange(
            addr,
            b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
        )
        .await;
        if reply.status == Some(200) {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "slots never freed: {reply:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    gateway_is_healthy(&gateway).await;
    assert_all_idle(&gateway).await;
    let growth_kib = match (rss_before, rss_after) {
        (Some(b), Some(a)) => a.saturating_sub(b),
        _ => 0,
    };
    eprintln!(
        "DRILL abuse_connection_flood: max_connections=16 held=16 flood={flood} answered_503={answered} json_bodies={bodies_ok} \
         rejected_metric={rejected} request_first_client={:?} rss_growth_kib={growth_kib}",
        with_request.status
    );
    assert!(rejected >= flood as f64);
    assert!(
        growth_kib < 32 * 1024,
        "memory grew by {growth_kib} KiB over {flood} rejected connections"
    );
    assert_no_panic(log_from);
    gateway.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abuse_huge_and_invalid_headers() {
    let _drill = DRILL.lock().await;
    capture();
    let log_from = log_len();
    let worker = fake_worker("w").await;
    let token_file = std::env::temp_dir().join(format!("bch-drill-token-{}", std::process::id()));
    std::fs::write(&token_file, "drill-token\n").unwrap();
    let mut config = test_config(&[&worker]);
    config.server.admin_token_file = Some(token_file.clone());
    let gateway = start(config).await;
    let (data, control) = (gateway.data_addr, gateway.control_addr);
    let mut figures = Vec::new();

    // 1 MiB header values, on both planes and in every header the gateway reads.
    let huge = "a".repeat(1 << 20);
    for (plane, addr) in [("data", data), ("control", control)] {
        for name in [
            "x-smg-routing-key",
            "x-smg-target-worker",
            "authorization",
            "cookie",
            "x-padding",
        ] {
            let request = format!(
                "GET /admin/policy HTTP/1.1\r\nhost: x\r\n{name}: {huge}\r\nconnection: close\r\n\r\n"
            );
            let reply = raw_exchange(addr, request.as_bytes()).await;
            assert!(reply.closed, "{plane} {name}: connection left open");
            assert!(
                matches!(reply.status, Some(400 | 431)) || reply.text.is_empty(),
                "{plane} {name}: {:?}",
                &reply.text[..reply.text.len().min(200)]
            );
            figures.push(format!("{plane}/{name}:{:?}", reply.status));
        }
    }

    // Invalid UTF-8 wherever a header is read. Each gets an answer with a status; gateway answers
    // are OpenAI-shaped JSON.
    let bad = b"\xff\xfe\xc3\x28 \x80";
    let data_cases: [(&str, &[u16]); 9] = [
        ("x-smg-routing-key", &[200]),
        ("x-smg-target-worker", &[503]),
        ("authorization", &[200]),
        ("x-forwarded-for", &[200]),
        ("cookie", &[200]),
        ("connection", &[200]),
        ("content-type", &[200]),
        ("host", &[200, 400]),
        ("content-length", &[400]),
    ];
    let ignored_before = metric(&gateway, "bch_ignored_routing_keys_total");
    for (name, expected) in data_cases {
        let mut request = b"POST /v1/chat/completions HTTP/1.1\r\nconnection: close\r\n".to_vec();
        if name != "host" {
            request.extend_from_slice(b"host: x\r\n");
        }
        if name != "content-length" {
            request.extend_from_slice(b"content-length: 2\r\n");
        }
        request.extend_from_slice(format!("{name}: ").as_bytes());
        request.extend_from_slice(bad);
        request.extend_from_slice(b"\r\n\r\n{}");
        let reply = raw_exchange(data, &request).await;
        let status = reply.status.unwrap_or_else(|| panic!("{name}: no answer"));
        assert!(
            expected.contains(&status),
            "{name}: {status} {}",
            reply.text
        );
        if status == 503 {
            assert!(is_openai_error(reply.body().as_bytes()), "{}", reply.text);
        }
        figures.push(format!("utf8/{name}:{status}"));
    }
    let control_cases: [(&[u8], u16); 5] = [
        (b"GET /admin/policy HTTP/1.1\r\nhost: x\r\nauthorization: Bearer \xff\xfe\r\nconnection: close\r\n\r\n", 401),
        (b"GET /admin/policy HTTP/1.1\r\nhost: x\r\nauthorization: \xff\xfe drill-token\r\nconnection: close\r\n\r\n", 401),
        // Decoded to bytes that are not UTF-8: refused, as the data plane ignores such a key header.
        (b"GET /admin/explain?routing_key=%FF%FE HTTP/1.1\r\nhost: x\r\nauthorization: Bearer drill-token\r\nconnection: close\r\n\r\n", 400),
        (b"DELETE /admin/workers/%FF%FE HTTP/1.1\r\nhost: x\r\nauthorization: Bearer drill-token\r\nconnection: close\r\n\r\n", 400),
        // The key is only hashed into Sec-WebSocket-Accept, so any bytes upgrade (the client then
        // fails the handshake check); what matters is a well-formed answer.
        (b"GET /ws HTTP/1.1\r\nhost: x\r\nauthorization: Bearer drill-token\r\nconnection: upgrade\r\nupgrade: websocket\r\nsec-websocket-version: 13\r\nsec-websocket-key: \xff\xfe\xfd\r\n\r\n", 101),
    ];
    for (request, expected) in control_cases {
        let reply = raw_exchange(control, request).await;
        let first_line = reply.text.lines().next().unwrap_or_default().to_owned();
        assert!(
            reply
                .status
                .is_some_and(|s| s == expected || (400..500).contains(&s)),
            "{:?}: {first_line}",
            String::from_utf8_lossy(request)
        );
        figures.push(format!("control:{}", first_line));
    }
    let ignored_after = metric(&gateway, "bch_ignored_routing_keys_total");
    assert_all_idle(&gateway).await;
    gateway_is_healthy(&gateway).await;
    // The gateway still routes keyed requests.
    let response = client()
        .post(format!("http://{data}/v1/chat/completions"))
        .header(ROUTING_KEY, "after-abuse")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    eprintln!(
        "DRILL abuse_headers: {} ignored_keys_metric {ignored_before}->{ignored_after}",
        figures.join(" ")
    );
    assert_no_panic(log_from);
    gateway.shutdown().await;
    let _ = std::fs::remove_file(token_file);
}

/// Writes raw bytes on an upgraded websocket and reports whether the server closed it in time.
async fn ws_raw_abuse(gateway: &RunningGateway, bytes: &[u8]) -> bool {
    let mut ws = ws_connect(gateway).await;
    let tokio_tungstenite::MaybeTlsStream::Plain(stream) = ws.get_mut() else {
        panic!("plain TCP expected");
    };
    let _ = stream.write_all(bytes).await;
    read_reply(stream, Duration::from_secs(5)).await.closed
}

/// A masked client frame header (mask key zero, so the payload is sent as is).
fn frame(first: u8, payload_len: usize) -> Vec<u8> {
    let mut f = vec![first];
    match payload_len {
        0..=125 => f.push(0x80 | payload_len as u8),
        126..=0xFFFF => {
            f.push(0x80 | 126);
            f.extend_from_slice(&(payload_len as u16).to_be_bytes());
        }
        _ => {
            f.push(0x80 | 127);
            f.extend_from_slice(&(payload_len as u64).to_be_bytes());
        }
    }
    f.extend_from_slice(&[0, 0, 0, 0]);
    f
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abuse_malformed_websocket() {
    let _drill = DRILL.lock().await;
    capture();
    let log_from = log_len();
    let (a, b) = (fake_worker("a").await, fake_worker("b").await);
    let gateway = start(test_config(&[&a, &b])).await;
    let with_payload = |mut head: Vec<u8>, payload: &[u8]| {
        head.extend_from_slice(payload);
        head
    };
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("garbage", vec![0xFF; 64]),
        ("unmasked_text", b"\x81\x05hello".to_vec()),
        ("reserved_opcode", frame(0x83, 0)),
        ("rsv_bits", with_payload(frame(0xC1, 2), b"{}")),
        ("fragmented_ping", frame(0x09, 0)),
        ("long_ping", with_payload(frame(0x89, 200), &[b'p'; 200])),
        ("length_2_63", frame(0x81, 1 << 63)),
        (
            "frame_over_16k",
            with_payload(frame(0x81, 20_000), &[b'x'; 20_000]),
        ),
        (
            "invalid_utf8_text",
            with_payload(frame(0x81, 4), b"\xff\xfe\xfd\xfc"),
        ),
        (
            "continuation_without_start",
            with_payload(frame(0x80, 2), b"{}"),
        ),
        (
            "bad_close_code",
            with_payload(frame(0x88, 2), &[0x00, 0x01]),
        ),
    ];
    let mut closed = Vec::new();
    for (name, bytes) in &cases {
        assert!(
            ws_raw_abuse(&gateway, bytes).await,
            "{name}: connection not closed"
        );
        closed.push(*name);
    }
    // An oversized message made of small fragments (each frame under the limit, the message over).
    let mut fragments = with_payload(frame(0x01, 8_000), &[b'x'; 8_000]);
    for _ in 0..2 {
        fragments.extend(with_payload(frame(0x00, 8_000), &[b'x'; 8_000]));
    }
    fragments.extend(with_payload(frame(0x80, 10), &[b'x'; 10]));
    assert!(
        ws_raw_abuse(&gateway, &fragments).await,
        "fragmented oversize"
    );
    closed.push("fragmented_24k_message");
    // An oversized message from a well-behaved client library.
    let mut ws = ws_connect(&gateway).await;
    let _ = ws.send(Message::Text("x".repeat(64 * 1024).into())).await;
    let end = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match ws.next().await {
                None | Some(Err(_)) | Some(Ok(Message::Close(_))) => return,
                Some(Ok(_)) => {}
            }
        }
    })
    .await;
    assert!(end.is_ok(), "64 KiB message: connection not closed");
    closed.push("client_64k_message");

    // Unaffected: a fresh client gets its snapshot and commands still work.
    let mut ws = ws_connect(&gateway).await;
    assert!(matches!(
        next_message(&mut ws).await,
        Some(ServerMessage::Snapshot(_))
    ));
    ws.send(Message::Text(
        r#"{"type":"set_policy","id":1,"min_load_gap":3}"#.into(),
    ))
    .await
    .unwrap();
    loop {
        match next_message(&mut ws).await.unwrap() {
            ServerMessage::Ack(ack) => {
                assert_eq!(ack.policy.min_load_gap, 3);
                break;
            }
            ServerMessage::Error(e) => panic!("{}", e.message),
            _ => {}
        }
    }
    gateway_is_healthy(&gateway).await;
    eprintln!(
        "DRILL abuse_websocket: closed={} cases={closed:?}; fresh client served",
        closed.len()
    );
    assert_no_panic(log_from);
    gateway.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abuse_tokens_and_path_traversal() {
    let _drill = DRILL.lock().await;
    capture();
    let log_from = log_len();
    let (a, b) = (fake_worker("a").await, fake_worker("b").await);
    let token = "s3cret-drill-token";
    let token_file = std::env::temp_dir().join(format!("bch-drill-token2-{}", std::process::id()));
    std::fs::write(&token_file, format!("{token}\n")).unwrap();
    let mut config = test_config(&[&a, &b]);
    config.server.admin_token_file = Some(token_file.clone());
    let gateway = start(config).await;
    let control = gateway.control_addr;
    let policy_before = gateway.routing_table().policy().to_owned();

    let endpoints = [
        ("GET", "/metrics"),
        ("GET", "/admin/workers"),
        ("POST", "/admin/workers"),
        ("DELETE", "/admin/workers/a"),
        ("GET", "/admin/policy"),
        ("PUT", "/admin/policy"),
        ("GET", "/admin/explain?routing_key=k"),
        ("POST", "/admin/reload"),
        ("GET", "/ws"),
        ("GET", "/nope"),
    ];
    let bad_auth: [Option<String>; 9] = [
        None,
        Some(String::new()),
        Some("Bearer".into()),
        Some("Bearer ".into()),
        Some("Bearer wrong".into()),
        Some(format!("Bearer {token}x")),
        Some(format!("Bearer {}", &token[..token.len() - 1])),
        Some(format!("Basic {token}")),
        Some(format!("Bearer  {token}")),
    ];
    let mut refused = 0;
    for (method, path) in endpoints {
        for auth in &bad_auth {
            let mut request =
                format!("{method} {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n");
            if let Some(auth) = auth {
                request.push_str(&format!("authorization: {auth}\r\n"));
            }
            let body = r#"{"name":"evil","url":"http://127.0.0.1:1","min_load_gap":9}"#;
            request.push_str(&format!(
                "content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            ));
            let reply = raw_exchange(control, request.as_bytes()).await;
            assert_eq!(
                reply.status,
                Some(401),
                "{method} {path} {auth:?}: {}",
                reply.text
            );
            assert!(
                reply
                    .text
                    .to_ascii_lowercase()
                    .contains("www-authenticate: bearer")
            );
            assert!(is_openai_error(reply.body().as_bytes()), "{}", reply.text);
            refused += 1;
        }
    }
    // Path tricks, with the right token: a clear 4xx and nothing changes.
    let tricks = [
        "GET /../../etc/passwd",
        "GET /admin/../../etc/passwd",
        "GET /%2e%2e/%2e%2e/etc/passwd",
        "GET /admin/%2e%2e/%2e%2e/etc/passwd",
        "GET //admin/policy/..",
        "PUT /admin/./policy",
        "PUT /admin/policy/",
        "PUT /admin/policy/..",
        "PUT /admin/policy%2F..",
        "DELETE /admin/workers/..%2F..%2Fetc%2Fpasswd",
        "DELETE /admin/workers/%2e%2e%2fa",
        "DELETE /admin/workers/a%00",
        "DELETE /admin/workers/a/..",
        "DELETE /admin/workers/.%2e/policy",
        "POST /admin/workers/..",
        "GET /ws/../admin/policy",
        "GET /admin/workers%5c..%5cpolicy",
        "DELETE /admin\\workers\\a",
    ];
    let mut tricks_refused = 0;
    for trick in tricks {
        let (method, path) = trick.split_once(' ').unwrap();
        let body = r#"{"min_load_gap":9,"kind":"round_robin"}"#;
        let request = format!(
            "{method} {path} HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {token}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        let reply = raw_exchange(control, request.as_bytes()).await;
        let status = reply.status.unwrap_or_else(|| panic!("{trick}: no answer"));
        assert!((400..500).contains(&status), "{trick}: {}", reply.text);
        assert!(!reply.text.contains("root:"), "{trick}");
        tricks_refused += 1;
    }
    // The data plane has no admin paths: such requests go to a worker, never to the control plane.
    let via_data = client()
        .put(format!("http://{}/admin/policy", gateway.data_addr))
        .header("authorization", format!("Bearer {token}"))
        .body(r#"{"min_load_gap":9}"#)
        .send()
        .await
        .unwrap();
    assert!(via_data.headers().contains_key("x-worker-name"));
    let table = gateway.routing_table();
    assert_eq!(*table.policy(), policy_before);
    let names: Vec<&str> = table
        .workers()
        .iter()
        .map(|w| w.spec.name.as_str())
        .collect();
    assert_eq!(names, ["a", "b"]);
    // The right token still works.
    let ok = client()
        .get(format!("http://{control}/admin/policy"))
        .header("authorization", format!("bearer {token}"))
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status(), 200);
    gateway_is_healthy(&gateway).await;
    eprintln!(
        "DRILL abuse_control: unauthorised_refused={refused} ({} endpoints x {} bad credentials) path_tricks_refused={tricks_refused}; state unchanged",
        endpoints.len(),
        bad_auth.len()
    );
    assert_no_panic(log_from);
    gateway.shutdown().await;
    let _ = std::fs::remove_file(token_file);
}
