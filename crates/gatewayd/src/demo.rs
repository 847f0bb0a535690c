//! `gatewayd --demo`: embedded simulated workers plus a gentle background storm, so a newcomer sees
//! the whole system (routing, spills, telemetry, the console) with nothing else installed. Built
//! only with the `demo` cargo feature (on by default), which is what links the simulator.

use anyhow::Context;
use bch_drill::sim::SimConfig;
use bch_drill::storm::{BackgroundStormConfig, background_storm};
use bch_drill::worker::spawn_workers;
use tokio_util::sync::CancellationToken;

use crate::app::{StartError, StartOptions};
use crate::config::WorkerConfig;

/// Runs the demo until SIGINT/SIGTERM: `workers` simulated workers on free loopback ports, pinned
/// (a reload keeps them), the gateway of `options` and a background storm with a few hot keys.
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
    let options = options.pin_more_workers(simulated.iter().map(|w| WorkerConfig {
        name: Some(w.name().to_owned()),
        url: w.url(),
        ring_id: None,
        health_path: None,
        metrics_path: None,
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
    let storm_cancel = CancellationToken::new();
    let gateway_url: reqwest::Url = format!("http://{}", running.data_addr).parse()?;
    let storm = tokio::spawn(background_storm(
        BackgroundStormConfig::new(gateway_url),
        storm_cancel.clone(),
    ));
    let policy = *running.routing_table().policy();
    if banner {
        print_banner(workers, &running, &policy);
    }
    running.run_until_stopped().await;
    storm_cancel.cancel();
    let _ = storm.await;
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
         bch demo: {workers} simulated workers, policy {} (min_load_gap {}, max_load_skew {}), gentle storm on keys hot-0, hot-1, cold-0..5\n\
         \n  data plane     http://{data}\n  control plane  http://{control}   (GET /admin/workers, /admin/policy, /metrics)\n  telemetry      ws://{control}/ws\n\
         \n  watch it:      cargo run --release -p bch-tui -- --url ws://{control}/ws\n  try a request: curl -s http://{data}/v1/chat/completions -H 'X-SMG-Routing-Key: my-session' \\\n                   -H 'content-type: application/json' -d '{{\"messages\":[{{\"role\":\"user\",\"content\":\"hello\"}}],\"max_tokens\":8}}' -i\n\
         \nCtrl-C stops everything.\n",
        policy.kind,
        policy.min_load_gap,
        policy.max_load_skew,
        data = running.data_addr,
        control = running.control_addr,
    ));
}
