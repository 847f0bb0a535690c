//! Keyed-request latency while DNS discovery refreshes a 1,000-worker fleet (run by
//! `bench/discovery.sh`; docs/benchmarks.md).
//!
//! Drives a gatewayd *process* at a fixed request rate (open loop, keyed POSTs, latency measured
//! from each request's scheduled send time) over alternating phases of one run, switched by
//! rewriting gatewayd's configuration file and `POST /admin/reload`:
//!
//! - `none`: the 1,000-record SRV source re-resolves once an hour (no refreshes);
//! - `refresh`: it re-resolves every 100 ms; each answer (1,000 records, about 20 KB over TCP) is
//!   parsed and compared with the set in force, which it equals;
//! - `refresh+change`: as `refresh`, plus a second source (one A record) whose answer this program
//!   flips every 100 ms (hosts file + SIGHUP to dnsmasq), so the membership changes between 1,000
//!   and 1,001 workers and the ring (150,000 points) is rebuilt on every flip.
//!
//! Prints one line per phase and a JSON summary (also to `--out`).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use clap::Parser;
use futures_util::StreamExt as _;
use tokio_util::sync::CancellationToken;

/// Discovery refreshes vs keyed-request latency, same run.
#[derive(Debug, Parser)]
struct Args {
    /// Data plane base URL.
    #[arg(long)]
    gateway: String,
    /// Control plane address (host:port).
    #[arg(long)]
    control: String,
    /// gatewayd's configuration file; each phase rewrites it and reloads.
    #[arg(long)]
    config: std::path::PathBuf,
    /// The configuration without `[[discovery]]` entries; each phase appends its own.
    #[arg(long)]
    base_config: std::path::PathBuf,
    /// dnsmasq's address (IP:PORT).
    #[arg(long)]
    resolver: String,
    /// dnsmasq's process id (SIGHUP re-reads the hosts file).
    #[arg(long)]
    dnsmasq_pid: u32,
    /// dnsmasq's hosts file, holding the flapping A record.
    #[arg(long)]
    hosts: std::path::PathBuf,
    /// The SRV name with the 1,000 records.
    #[arg(long, default_value = "_llm._tcp.bench.test")]
    srv: String,
    /// The A name that flips in the `refresh+change` phases.
    #[arg(long, default_value = "flap.bench.test")]
    flap: String,
    /// Port of the flapping worker.
    #[arg(long)]
    flap_port: u16,
    /// Requests per second (open loop).
    #[arg(long, default_value_t = 400)]
    rate: u64,
    /// Distinct routing keys, used round-robin.
    #[arg(long, default_value_t = 4096)]
    keys: usize,
    /// Seconds measured per phase (after one second of settling).
    #[arg(long, default_value_t = 10.0)]
    phase_secs: f64,
    /// Rounds of the three phases.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Also write the JSON summary here.
    #[arg(long)]
    out: Option<std::path::PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Mode {
    None,
    Refresh,
    RefreshChange,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::None => "none",
            Mode::Refresh => "refresh",
            Mode::RefreshChange => "refresh+change",
        }
    }
}

/// Latencies (ms) and failures of the requests scheduled while `recording` is set.
#[derive(Default)]
struct Samples {
    recording: bool,
    latencies_ms: Vec<f64>,
    failed: u64,
}

/// Fires `rate` keyed requests per second until cancelled, each on its own task.
async fn drive(args: Arc<Args>, samples: Arc<Mutex<Samples>>, stop: CancellationToken) {
    let client = bch_drill::tls::http_client()
        .pool_max_idle_per_host(256)
        .build()
        .expect("client builds");
    let url = format!("{}/v1/chat/completions", args.gateway.trim_end_matches('/'));
    let body = bytes::Bytes::from(
        serde_json::json!({"max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]})
            .to_string(),
    );
    let mut ticks = tokio::time::interval(Duration::from_secs_f64(1.0 / args.rate.max(1) as f64));
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    for n in 0u64.. {
        let scheduled = tokio::select! {
            () = stop.cancelled() => return,
            at = ticks.tick() => at.into_std(),
        };
        let request = client
            .post(&url)
            .header("content-type", "application/json")
            .header(
                "x-smg-routing-key",
                format!("session-{}", n % args.keys as u64),
            )
            .body(body.clone());
        let samples = Arc::clone(&samples);
        tokio::spawn(async move {
            let ok = match request.send().await {
                Ok(response) => response.status().is_success() && response.bytes().await.is_ok(),
                Err(_) => false,
            };
            let latency = scheduled.elapsed().as_secs_f64() * 1e3;
            let mut samples = samples.lock().unwrap();
            if samples.recording {
                if ok {
                    samples.latencies_ms.push(latency);
                } else {
                    samples.failed += 1;
                }
            }
        });
    }
}

/// The configuration of a phase: the base file plus its discovery entries.
fn phase_config(args: &Args, base: &str, mode: Mode) -> String {
    let interval = if mode == Mode::None { 3_600_000 } else { 100 };
    let mut text = format!(
        "{base}\n[[discovery]]\ndns = \"{}\"\nresolver = \"{}\"\ninterval_ms = {interval}\n",
        args.srv, args.resolver
    );
    if mode == Mode::RefreshChange {
        text.push_str(&format!(
            "\n[[discovery]]\ndns = \"{}\"\nport = {}\nresolver = \"{}\"\ninterval_ms = 100\nempty_after_ms = 0\n",
            args.flap, args.flap_port, args.resolver
        ));
    }
    text
}

async fn reload(
    client: &reqwest::Client,
    args: &Args,
    base: &str,
    mode: Mode,
) -> anyhow::Result<()> {
    std::fs::write(&args.config, phase_config(args, base, mode))?;
    let response = client
        .post(format!("http://{}/admin/reload", args.control))
        .send()
        .await?;
    if !response.status().is_success() {
        bail!("reload failed: {}", response.text().await?);
    }
    Ok(())
}

/// Flips the flapping A record every 100 ms until cancelled.
async fn flap(args: Arc<Args>, stop: CancellationToken) {
    let mut every = tokio::time::interval(Duration::from_millis(100));
    for up in [true, false].into_iter().cycle() {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = every.tick() => {}
        }
        let line = if up {
            format!("127.0.0.1 {}\n", args.flap)
        } else {
            String::new()
        };
        let _ = std::fs::write(&args.hosts, line);
        let _ = tokio::process::Command::new("kill")
            .args(["-HUP", &args.dnsmasq_pid.to_string()])
            .status()
            .await;
    }
}

/// Counts `ring` frames (membership changes) on the telemetry websocket.
async fn count_rings(
    control: String,
    rings: Arc<Mutex<u64>>,
    stop: CancellationToken,
) -> anyhow::Result<()> {
    let (mut ws, _) = tokio_tungstenite::connect_async(format!("ws://{control}/ws")).await?;
    loop {
        tokio::select! {
            () = stop.cancelled() => return Ok(()),
            message = ws.next() => match message {
                Some(Ok(tokio_tungstenite::tungstenite::Message::Text(text))) => {
                    if text.contains("\"type\":\"ring\"") {
                        *rings.lock().unwrap() += 1;
                    }
                }
                Some(Ok(_)) => {}
                _ => return Ok(()),
            },
        }
    }
}

async fn refreshes(client: &reqwest::Client, args: &Args) -> anyhow::Result<f64> {
    let text = client
        .get(format!("http://{}/metrics", args.control))
        .send()
        .await?
        .text()
        .await?;
    let prefix = format!(
        "bch_discovery_refreshes_total{{source=\"dns:{}\"}}",
        args.srv
    );
    Ok(text
        .lines()
        .find(|l| l.starts_with(&prefix))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0.0))
}

#[derive(serde::Serialize)]
struct Phase {
    mode: &'static str,
    seconds: f64,
    requests: usize,
    failed: u64,
    p50_ms: f64,
    p99_ms: f64,
    p999_ms: f64,
    refreshes_per_s: f64,
    ring_rebuilds: u64,
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() as f64 * q) as usize).min(sorted.len() - 1)]
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(0.0)
}

async fn measure(
    args: &Args,
    client: &reqwest::Client,
    samples: &Mutex<Samples>,
    rings: &Mutex<u64>,
    mode: Mode,
) -> anyhow::Result<Phase> {
    let (refreshes0, rings0) = (refreshes(client, args).await?, *rings.lock().unwrap());
    {
        let mut s = samples.lock().unwrap();
        s.latencies_ms.clear();
        s.failed = 0;
        s.recording = true;
    }
    let t0 = Instant::now();
    tokio::time::sleep(Duration::from_secs_f64(args.phase_secs)).await;
    let (mut latencies, failed) = {
        let mut s = samples.lock().unwrap();
        s.recording = false;
        (std::mem::take(&mut s.latencies_ms), s.failed)
    };
    let seconds = t0.elapsed().as_secs_f64();
    latencies.sort_by(f64::total_cmp);
    Ok(Phase {
        mode: mode.name(),
        seconds,
        requests: latencies.len(),
        failed,
        p50_ms: quantile(&latencies, 0.50),
        p99_ms: quantile(&latencies, 0.99),
        p999_ms: quantile(&latencies, 0.999),
        refreshes_per_s: (refreshes(client, args).await? - refreshes0) / seconds,
        ring_rebuilds: *rings.lock().unwrap() - rings0,
    })
}

/// Waits (up to a minute) until the SRV name's workers are in the membership and have passed
/// their first probe (new workers take no traffic before it).
async fn wait_for_fleet(client: &reqwest::Client, args: &Args) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let body: serde_json::Value = client
            .get(format!("http://{}/admin/workers", args.control))
            .send()
            .await?
            .json()
            .await?;
        let count = body["workers"].as_array().map_or(0, |workers| {
            workers.iter().filter(|w| w["healthy"] == true).count()
        });
        if count >= 1000 {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("only {count} healthy workers discovered after a minute");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Arc::new(Args::parse());
    let base = std::fs::read_to_string(&args.base_config)
        .with_context(|| format!("cannot read {}", args.base_config.display()))?;
    let client = bch_drill::tls::http_client().build().unwrap();
    let samples = Arc::new(Mutex::new(Samples::default()));
    let rings = Arc::new(Mutex::new(0u64));
    let stop = CancellationToken::new();
    tokio::spawn(count_rings(
        args.control.clone(),
        Arc::clone(&rings),
        stop.clone(),
    ));
    let driver = tokio::spawn(drive(Arc::clone(&args), Arc::clone(&samples), stop.clone()));
    // The fleet first: the first reload resolves the name and builds the 1,000-worker ring.
    reload(&client, &args, &base, Mode::None).await?;
    wait_for_fleet(&client, &args).await?;
    let mut phases = Vec::new();
    for round in 0..args.rounds {
        for mode in [Mode::None, Mode::Refresh, Mode::RefreshChange] {
            reload(&client, &args, &base, mode).await?;
            let flapping = CancellationToken::new();
            if mode == Mode::RefreshChange {
                tokio::spawn(flap(Arc::clone(&args), flapping.clone()));
            }
            // Settle: the reload's own first resolutions, pooled connections.
            tokio::time::sleep(Duration::from_secs(1)).await;
            let phase = measure(&args, &client, &samples, &rings, mode).await?;
            flapping.cancel();
            eprintln!(
                "round {}: {:<14} p50 {:.2} ms  p99 {:.2} ms  p99.9 {:.2} ms  ({} requests, {} failed; {:.1} refreshes/s of the 1,000-record name, {} ring rebuilds)",
                round + 1,
                phase.mode,
                phase.p50_ms,
                phase.p99_ms,
                phase.p999_ms,
                phase.requests,
                phase.failed,
                phase.refreshes_per_s,
                phase.ring_rebuilds,
            );
            phases.push(phase);
        }
    }
    stop.cancel();
    let _ = driver.await;
    let p99 = |mode: Mode| {
        median(
            phases
                .iter()
                .filter(|p| p.mode == mode.name())
                .map(|p| p.p99_ms)
                .collect(),
        )
    };
    let (none, refresh, change) = (
        p99(Mode::None),
        p99(Mode::Refresh),
        p99(Mode::RefreshChange),
    );
    let failed: u64 = phases.iter().map(|p| p.failed).sum();
    let summary = serde_json::json!({
        "rate": args.rate, "keys": args.keys, "phase_secs": args.phase_secs, "rounds": args.rounds,
        "median_p99_ms": {"none": none, "refresh": refresh, "refresh+change": change},
        "p99_ratio_refresh_to_none": refresh / none,
        "p99_ratio_refresh_change_to_none": change / none,
        "requests_failed": failed,
        "phases": phases,
    });
    eprintln!(
        "median p99: {none:.2} ms without refreshes, {refresh:.2} ms refreshing every 100 ms ({:.2}x), {change:.2} ms refreshing with a ring rebuild each flip ({:.2}x)",
        refresh / none,
        change / none
    );
    let text = serde_json::to_string_pretty(&summary)?;
    println!("{text}");
    if let Some(path) = &args.out {
        std::fs::write(path, format!("{text}\n"))?;
    }
    if failed > 0 {
        bail!("{failed} requests failed during the measurement");
    }
    Ok(())
}
