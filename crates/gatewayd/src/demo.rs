//! `gatewayd --demo`: embedded simulated workers plus a gentle background storm, so a newcomer sees
//! the whole system (routing, spills, telemetry, the console) with nothing else installed. Built
//! only with the `demo` cargo feature (on by default), which is what links the simulator.
//!
//! The traffic shows what the bounded policy is for: two hot keys arrive in bursts of six
//! concurrent requests, which push their preferred worker past both bounds, so part of each burst
//! spills; six cold keys arrive one request at a time, which never overloads anyone, so they stay
//! on their preferred worker (unless one of them lands there in the moment a hot burst holds it
//! over the bounds: then it spills too, as it should). Traffic starts once the health prober's
//! first round is applied, so the first requests find the workers routable.

use std::time::Duration;

use anyhow::Context;
use bch_drill::sim::SimConfig;
use bch_drill::storm::{BackgroundStormConfig, background_storm};
use bch_drill::worker::spawn_workers;
use tokio_util::sync::CancellationToken;

use crate::app::{StartError, StartOptions};
use crate::config::WorkerConfig;

/// The hot keys' traffic: a burst of six concurrent same-key requests every second, on `hot-0` or
/// `hot-1` drawn at random (each key about 3 requests a second, against a cold key's 0.8). Six in
/// flight on one idle fleet's worker exceed the default `min_load_gap` of 2, so about half of each
/// burst spills. Short answers (16 tokens) keep a burst's worker over the bounds only briefly, and
/// one burst at a time never stacks two: a cold key sharing that worker rarely meets a burst.
fn hot_traffic(gateway: reqwest::Url) -> BackgroundStormConfig {
    BackgroundStormConfig {
        hot_keys: 2,
        cold_keys: 0,
        hot_share: 1.0,
        siblings: 6,
        group_interval: Duration::from_millis(1000),
        max_groups_in_flight: 1,
        max_tokens: 16,
        ..BackgroundStormConfig::new(gateway)
    }
}

/// The cold keys' traffic: `cold-0` … `cold-5`, one request at a time, one every 200 ms across
/// the six (each key about 0.8 requests a second): never enough to overload a worker, so each
/// stays on its preferred worker.
fn cold_traffic(gateway: reqwest::Url) -> BackgroundStormConfig {
    BackgroundStormConfig {
        hot_keys: 0,
        cold_keys: 6,
        siblings: 1,
        group_interval: Duration::from_millis(200),
        max_groups_in_flight: 4,
        seed: 1,
        ..BackgroundStormConfig::new(gateway)
    }
}

/// Runs the demo until SIGINT/SIGTERM: `workers` simulated workers on free loopback ports, pinned
/// (a reload keeps them), the gateway of `options` and a background storm of hot and cold keys.
/// With `fallback_ports`, busy listen addresses (the defaults, when the operator chose none) are
/// replaced by free ports instead of failing. `banner` prints the human welcome (not in JSON log
/// mode, where the `gatewayd started` line says where everything is).
pub async fn run(
    options: StartOptions,
    workers: usize,
    fallback_ports: bool,
    banner: bool,
) -> anyhow::Result<()> {
    anyhow::ensure!(
        (1..=64).contains(&workers),
        "--demo-workers must be between 1 and 64"
    );
    let simulated = spawn_workers(workers, 0, SimConfig::default())
        .await
        .context("cannot start the simulated workers")?;
    // Ring ids by name, not by the random port: every demo places every key on the same worker
    // (hot-0 on sim-1, hot-1 on sim-0, the cold keys two each on sim-2 and sim-3 and one each on
    // the hot keys' workers, with four workers), so what one run shows, the next shows too.
    let options = options.pin_more_workers(simulated.iter().map(|w| WorkerConfig {
        name: Some(w.name().to_owned()),
        url: w.url(),
        ring_id: Some(w.name().to_owned()),
        health_path: None,
        metrics_path: None,
        max_in_flight: None,
        server_name: None,
        models: Vec::new(),
    }));
    // The default ports may be taken (another gatewayd, a previous demo): fall back to free ones
    // rather than failing a newcomer's first command.
    let running = match crate::app::start(options.clone()).await {
        Ok(running) => running,
        Err(error @ StartError::Bind { .. }) if fallback_ports => {
            tracing::warn!(%error, "default ports busy; using free ports");
            crate::app::start(options.free_ports()).await?
        }
        Err(error) => return Err(error.into()),
    };
    // Traffic before the first probes would find no worker routable yet (503s, or every key on
    // the one worker probed first): wait for them.
    running.first_probes_applied().await;
    let storm_cancel = CancellationToken::new();
    let gateway_url: reqwest::Url = format!("http://{}", running.data_addr).parse()?;
    let storms = [hot_traffic(gateway_url.clone()), cold_traffic(gateway_url)]
        .map(|traffic| tokio::spawn(background_storm(traffic, storm_cancel.clone())));
    let policy = *running.routing_table().policy();
    if banner {
        print_banner(workers, &running, &policy);
    }
    running.run_until_stopped().await;
    storm_cancel.cancel();
    for storm in storms {
        let _ = storm.await;
    }
    for worker in simulated {
        let _ = worker.shutdown().await;
    }
    Ok(())
}

fn print_banner(
    workers: usize,
    running: &crate::app::RunningGateway,
    policy: &bch_core::policy::PolicySettings,
) {
    crate::app::terminal::print_err(format_args!(
        "\n\
         bch demo: {workers} simulated workers, policy {} (min_load_gap {}, max_load_skew {})\n\
         traffic: hot-0 and hot-1 in bursts of six (they spill), cold-0..5 one request at a time (they stay home, unless one arrives while a burst holds their worker)\n\
         \n  data plane     http://{data}\n  control plane  http://{control}   (GET /admin/workers, /admin/policy, /metrics)\n  telemetry      ws://{control}/ws\n\
         \n  watch it:      cargo run --release -p bch-tui -- --url ws://{control}/ws\n\
         \x20                in the Keys panel, `spills` and `home` show the difference: press `o` until the\n\
         \x20                sort says spills (hot keys on top), or `/` and type cold to see only the cold keys\n  try a request: curl -s http://{data}/v1/chat/completions -H 'X-SMG-Routing-Key: my-session' \\\n                   -H 'content-type: application/json' -d '{{\"messages\":[{{\"role\":\"user\",\"content\":\"hello\"}}],\"max_tokens\":8}}' -i\n\
         \nCtrl-C stops everything.\n",
        policy.kind,
        policy.min_load_gap,
        policy.max_load_skew,
        data = running.data_addr,
        control = running.control_addr,
    ));
}
