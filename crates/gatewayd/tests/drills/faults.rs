//! Faults: the fault storm (clients abort mid-stream, a worker is killed and restarted, another
//! answers 500 for a while) and a stalled upstream with disconnecting clients.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::common::*;
use bch_core::policy::PolicyKind;
use bch_drill::sim::SimConfig;
use bch_drill::worker::{Fault, WorkerHandle, spawn_worker};
use futures_util::StreamExt;
use gatewayd::RunningGateway;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use super::*;

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
    config.server.timeouts.first_byte = Duration::from_millis(10_000);
    config.server.timeouts.stream_idle = Duration::from_millis(10_000);
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
    let client = bch_drill::tls::http_client().build().unwrap();
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
