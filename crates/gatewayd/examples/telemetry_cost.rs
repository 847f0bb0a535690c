//! What live telemetry costs a running gatewayd (run by `bench/telemetry.sh`; docs/benchmarks.md).
//!
//! Drives a gatewayd *process* at a fixed request rate (open loop, keyed POSTs over `--keys` keys)
//! and reads the process's CPU time (utime + stime from `/proc/<pid>/stat`) over alternating phases
//! of the same run: no websocket clients, then `--clients` clients connected to `/ws` and reading
//! every frame, then none again, and so on. The difference between the phases is what the clients
//! cost (tick encoding, per-client queues, websocket writes); the aggregator's own bookkeeping runs
//! in both phases.
//!
//! ```text
//! cargo run --release -p gatewayd --example telemetry_cost -- \
//!     --gateway http://127.0.0.1:8080 --control 127.0.0.1:9090 --pid $(pidof gatewayd)
//! ```
//!
//! Prints one line per phase and a JSON summary (also to `--out`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use clap::Parser;
use futures_util::StreamExt as _;
use tokio_util::sync::CancellationToken;

/// Telemetry cost: gatewayd CPU with and without websocket clients, same run.
#[derive(Debug, Parser)]
struct Args {
    /// Data plane base URL.
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    gateway: String,
    /// Control plane address (host:port) serving `/ws`.
    #[arg(long, default_value = "127.0.0.1:9090")]
    control: String,
    /// gatewayd's process id (its CPU time is read from /proc).
    #[arg(long)]
    pid: u32,
    /// Requests per second (open loop).
    #[arg(long, default_value_t = 1000)]
    rate: u64,
    /// Distinct routing keys, used round-robin.
    #[arg(long, default_value_t = 256)]
    keys: usize,
    /// Websocket clients in the "with clients" phases.
    #[arg(long, default_value_t = 10)]
    clients: usize,
    /// Seconds measured per phase.
    #[arg(long, default_value_t = 10.0)]
    phase_secs: f64,
    /// Pairs of phases (without, with).
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Completion tokens per request (the upstream's answer size).
    #[arg(long, default_value_t = 16)]
    max_tokens: u32,
    /// Also write the JSON summary here.
    #[arg(long)]
    out: Option<std::path::PathBuf>,
}

fn cpu_seconds(pid: u32) -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("cannot read /proc/{pid}/stat"))?;
    let after = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .context("malformed stat")?;
    let fields: Vec<&str> = after.split_whitespace().collect();
    // After the command name: state is field 0, utime 11, stime 12 (fields 14 and 15 of stat(5)).
    let utime: f64 = fields.get(11).context("no utime")?.parse()?;
    let stime: f64 = fields.get(12).context("no stime")?.parse()?;
    // USER_HZ is 100 on every Linux this runs on (sysconf(_SC_CLK_TCK)).
    Ok((utime + stime) / 100.0)
}

struct Load {
    sent: AtomicU64,
    ok: AtomicU64,
    failed: AtomicU64,
    /// What the first few failed requests got (a status or a client error), for the final error.
    failures: std::sync::Mutex<Vec<String>>,
}

/// How many failure reasons [`Load::failures`] keeps.
const FAILURES_KEPT: usize = 5;

/// Fires `rate` requests per second until cancelled, each on its own task.
async fn drive(args: Arc<Args>, load: Arc<Load>, stop: CancellationToken) {
    let client = bch_drill::tls::http_client()
        .pool_max_idle_per_host(256)
        .build()
        .expect("client builds");
    let url = format!("{}/v1/chat/completions", args.gateway.trim_end_matches('/'));
    let body = serde_json::json!({
        "model": "bch-sim",
        "max_tokens": args.max_tokens,
        "messages": [{"role": "user", "content": "how much does live telemetry cost the gateway"}],
    })
    .to_string();
    let body = bytes::Bytes::from(body);
    let period = Duration::from_secs_f64(1.0 / args.rate.max(1) as f64);
    let mut ticks = tokio::time::interval(period);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut n: u64 = 0;
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = ticks.tick() => {}
        }
        let key = format!("key-{}", n % args.keys as u64);
        n += 1;
        let request = client
            .post(&url)
            .header("content-type", "application/json")
            .header("x-smg-routing-key", key)
            .body(body.clone());
        let load = Arc::clone(&load);
        load.sent.fetch_add(1, Ordering::Relaxed);
        tokio::spawn(async move {
            let outcome = match request.send().await {
                Ok(response) if !response.status().is_success() => {
                    Err(format!("status {}", response.status()))
                }
                Ok(response) => response
                    .bytes()
                    .await
                    .map(drop)
                    .map_err(|e| format!("body: {e:?}")),
                Err(e) => Err(format!("send: {e:?}")),
            };
            match outcome {
                Ok(()) => {
                    load.ok.fetch_add(1, Ordering::Relaxed);
                }
                Err(reason) => {
                    load.failed.fetch_add(1, Ordering::Relaxed);
                    let mut failures = load.failures.lock().expect("not poisoned");
                    if failures.len() < FAILURES_KEPT {
                        failures.push(reason);
                    }
                }
            }
        });
    }
}

/// Connects `count` websocket clients that read every frame until cancelled.
async fn clients(
    control: &str,
    count: usize,
    frames: Arc<AtomicU64>,
    stop: CancellationToken,
) -> anyhow::Result<Vec<tokio::task::JoinHandle<()>>> {
    let mut handles = Vec::with_capacity(count);
    for _ in 0..count {
        let (mut ws, _) = tokio_tungstenite::connect_async(format!("ws://{control}/ws"))
            .await
            .with_context(|| format!("cannot open ws://{control}/ws"))?;
        let frames = Arc::clone(&frames);
        let stop = stop.clone();
        handles.push(tokio::spawn(async move {
            loop {
                tokio::select! {
                    () = stop.cancelled() => {
                        let _ = ws.close(None).await;
                        return;
                    }
                    message = ws.next() => match message {
                        Some(Ok(_)) => { frames.fetch_add(1, Ordering::Relaxed); }
                        _ => return,
                    },
                }
            }
        }));
    }
    Ok(handles)
}

#[derive(serde::Serialize)]
struct Phase {
    clients: usize,
    seconds: f64,
    cpu_seconds: f64,
    /// CPU seconds per second: 0.05 = 5 % of one core.
    cores: f64,
    requests_ok: u64,
    requests_failed: u64,
    frames: u64,
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n == 0 {
        return 0.0;
    }
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Arc::new(Args::parse());
    cpu_seconds(args.pid)?;
    let load = Arc::new(Load {
        sent: AtomicU64::new(0),
        ok: AtomicU64::new(0),
        failed: AtomicU64::new(0),
        failures: std::sync::Mutex::new(Vec::new()),
    });
    let stop_load = CancellationToken::new();
    let driver = tokio::spawn(drive(
        Arc::clone(&args),
        Arc::clone(&load),
        stop_load.clone(),
    ));
    // Warm-up: connections pooled, every key tracked by the aggregator.
    tokio::time::sleep(Duration::from_secs(2)).await;

    let mut phases = Vec::new();
    for round in 0..args.rounds {
        for with_clients in [false, true] {
            let count = if with_clients { args.clients } else { 0 };
            let frames = Arc::new(AtomicU64::new(0));
            let stop = CancellationToken::new();
            let handles = if count > 0 {
                let handles =
                    clients(&args.control, count, Arc::clone(&frames), stop.clone()).await?;
                // Let the snapshots go out before measuring the steady state.
                tokio::time::sleep(Duration::from_millis(500)).await;
                handles
            } else {
                Vec::new()
            };
            let (ok0, failed0, frames0) = (
                load.ok.load(Ordering::Relaxed),
                load.failed.load(Ordering::Relaxed),
                frames.load(Ordering::Relaxed),
            );
            let cpu0 = cpu_seconds(args.pid)?;
            let t0 = Instant::now();
            tokio::time::sleep(Duration::from_secs_f64(args.phase_secs)).await;
            let cpu = cpu_seconds(args.pid)? - cpu0;
            let seconds = t0.elapsed().as_secs_f64();
            let phase = Phase {
                clients: count,
                seconds,
                cpu_seconds: cpu,
                cores: cpu / seconds,
                requests_ok: load.ok.load(Ordering::Relaxed) - ok0,
                requests_failed: load.failed.load(Ordering::Relaxed) - failed0,
                frames: frames.load(Ordering::Relaxed) - frames0,
            };
            eprintln!(
                "round {}: {:>2} clients: gatewayd CPU {:.3} s in {:.1} s = {:.2} % of a core; {} ok, {} failed requests ({:.0}/s); {} frames read",
                round + 1,
                phase.clients,
                phase.cpu_seconds,
                phase.seconds,
                phase.cores * 100.0,
                phase.requests_ok,
                phase.requests_failed,
                phase.requests_ok as f64 / phase.seconds,
                phase.frames,
            );
            stop.cancel();
            for handle in handles {
                let _ = handle.await;
            }
            phases.push(phase);
        }
    }
    stop_load.cancel();
    let _ = driver.await;

    let without = median(
        phases
            .iter()
            .filter(|p| p.clients == 0)
            .map(|p| p.cores)
            .collect(),
    );
    let with = median(
        phases
            .iter()
            .filter(|p| p.clients > 0)
            .map(|p| p.cores)
            .collect(),
    );
    let failed: u64 = phases.iter().map(|p| p.requests_failed).sum();
    let summary = serde_json::json!({
        "rate": args.rate,
        "keys": args.keys,
        "clients": args.clients,
        "phase_secs": args.phase_secs,
        "rounds": args.rounds,
        "median_core_fraction_without_clients": without,
        "median_core_fraction_with_clients": with,
        "telemetry_clients_core_fraction": with - without,
        "requests_failed": failed,
        "phases": phases,
    });
    eprintln!(
        "median gatewayd CPU: {:.2} % of a core without clients, {:.2} % with {} clients: the clients cost {:.2} % of one core",
        without * 100.0,
        with * 100.0,
        args.clients,
        (with - without) * 100.0
    );
    let text = serde_json::to_string_pretty(&summary)?;
    println!("{text}");
    if let Some(path) = &args.out {
        std::fs::write(path, format!("{text}\n"))
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    if failed > 0 {
        let failures = load.failures.lock().expect("not poisoned").join("; ");
        bail!("{failed} requests failed during the measurement; the first: {failures}");
    }
    Ok(())
}
