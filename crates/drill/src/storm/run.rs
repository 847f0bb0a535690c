//! Firing a measured storm: a preflight check of the gateway, `concurrency` groups in flight with a
//! progress bar, then the drain check and the report.
//!
//! Nothing that happens after the preflight stops the storm or loses its report: failed requests
//! are counted, a control plane that cannot be asked for the drain check is named in it, and a
//! storm stopped early ([`run_storm_until`], Ctrl-C in `bch-drill storm`) reports the requests it
//! started.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt as _;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use reqwest::Url;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::config::{StormConfig, routing_key};
use super::open_loop::fire_open_loop;
use super::prompts::Prompts;
use super::report::{Observed, StormReport, summarise};
use super::shape::StormShape;
use super::shooter::{Outcome, Shooter, describe, refused};
use crate::control::{ControlClient, DrainCheck};
use crate::tls::ClientTls;

/// Fires the storm described by `config` and measures it.
///
/// # Errors
///
/// When the shape fires nothing (zero groups, siblings, keys or concurrency), a gateway does not
/// answer `GET /health` at all (with `eject_refused_replicas`, only a gateway that fails otherwise
/// than by refusing the connection, or every one), or the routing key header is not a header name.
/// Failed requests are not errors: the report counts them. Nor is a control plane that cannot be
/// asked for the drain check: the report names it.
pub async fn run_storm(config: &StormConfig) -> anyhow::Result<StormReport> {
    run_storm_until(config, &CancellationToken::new()).await
}

/// [`run_storm`], stopped early when `stop` is cancelled (Ctrl-C): no group starts after it, every
/// request in flight is abandoned and counted as interrupted, the drain check runs as usual, and
/// the report covers the requests started, with [`StormReport::interrupted`] set.
///
/// # Errors
///
/// As [`run_storm`]; being stopped is not an error.
pub async fn run_storm_until(
    config: &StormConfig,
    stop: &CancellationToken,
) -> anyhow::Result<StormReport> {
    config.check()?;
    let mut refused_at_start = Vec::new();
    for (replica, gateway) in config.gateways().enumerate() {
        match preflight(gateway, &config.tls).await {
            Ok(()) => {}
            Err(e) if config.eject_refused_replicas && refused(&e) => {
                tracing::warn!(%gateway, "the replica refuses connections: ejected before the storm");
                refused_at_start.push(replica);
            }
            Err(e) => {
                anyhow::bail!("gateway {gateway} is unreachable: {}", describe(e))
            }
        }
    }
    anyhow::ensure!(
        refused_at_start.len() < config.gateways().count(),
        "every gateway refuses connections"
    );
    let shooter = Arc::new(
        Shooter::new(
            config.gateways(),
            &config.routing_key_header,
            config.stream,
            config.max_tokens,
            &config.model,
            config.request_timeout,
            &config.tls,
        )?
        .ejecting_refused(config.eject_refused_replicas)
        .stopping_on(stop.clone()),
    );
    for replica in refused_at_start {
        shooter.eject(replica);
    }
    let prompts = Prompts::new(
        config.seed,
        config.keys,
        config.prefix_scope,
        config.prefix_tokens,
        config.suffix_tokens,
    );
    let keys: Vec<String> = (0..config.keys).map(routing_key).collect();
    let progress = progress_bar(config);
    let start = Instant::now();
    let (outcomes, open_loop) = match &config.open_loop {
        None => (
            fire_groups(config, &shooter, &prompts, &keys, &progress, stop).await,
            None,
        ),
        Some(open_loop) => {
            let run = fire_open_loop(
                config,
                open_loop,
                shooter.clone(),
                &prompts,
                &keys,
                &progress,
                stop,
            )
            .await;
            (
                run.outcomes,
                Some((*open_loop, run.window, run.peak_in_flight)),
            )
        }
    };
    let duration = start.elapsed();
    progress.finish_and_clear();
    let drain = check_drain(config).await;
    let observed = Observed {
        gateways: config.gateways().map(|g| g.as_str().to_owned()).collect(),
        ejections: shooter.ejections(),
        interrupted: stop.is_cancelled(),
        duration,
        drain,
        start,
        slo_ttft: config.slo_ttft,
        open_loop,
    };
    Ok(summarise(
        StormShape::of(config),
        &keys,
        &outcomes,
        observed,
    ))
}

/// Checks that the gateway answers at all, so an unreachable URL is one clear error rather than
/// thousands of failed requests.
async fn preflight(gateway: &Url, tls: &ClientTls) -> Result<(), reqwest::Error> {
    let url = format!("{}/health", gateway.as_str().trim_end_matches('/'));
    let client = tls.http_client().timeout(Duration::from_secs(5)).build()?;
    client.get(&url).send().await?;
    Ok(())
}

fn progress_bar(config: &StormConfig) -> ProgressBar {
    let total = (config.groups * config.siblings) as u64;
    let progress = if config.progress {
        ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr())
    } else {
        ProgressBar::hidden()
    };
    progress.set_style(
        ProgressStyle::with_template(if config.open_loop.is_some() {
            "storm {bar:40} {pos}/{len} requests sent  {per_sec}  eta {eta}"
        } else {
            "storm {bar:40} {pos}/{len} requests  {per_sec}  eta {eta}"
        })
        .expect("static template"),
    );
    progress
}

/// Fires every group, `concurrency` at a time: group `g` uses key [`StormConfig::key_of`]`(g)`, and a
/// new group starts as soon as one finishes, until `stop` fires. Each outcome comes with the index
/// of its key.
async fn fire_groups(
    config: &StormConfig,
    shooter: &Shooter,
    prompts: &Prompts,
    keys: &[String],
    progress: &ProgressBar,
    stop: &CancellationToken,
) -> Vec<(usize, Outcome)> {
    let mut outcomes = Vec::with_capacity(config.groups * config.siblings);
    let groups = futures_util::stream::iter(0..config.groups)
        .take_until(stop.cancelled())
        .map(|group| {
            let key = config.key_of(group);
            let fired = shooter.fire_group(prompts.group(key, group, config.siblings), &keys[key]);
            async move { (key, fired.await) }
        })
        .buffer_unordered(config.concurrency);
    futures_util::pin_mut!(groups);
    // Aggregation happens here, in the one task that owns the results, never in request futures.
    while let Some((key, group)) = groups.next().await {
        progress.inc(group.len() as u64);
        outcomes.extend(group.into_iter().map(|o| (key, o)));
    }
    outcomes
}

/// Asks every control plane whether its workers' load returned to 0; `None` without one. A control
/// plane that cannot be asked is a finding in the check, not an error.
async fn check_drain(config: &StormConfig) -> Option<DrainCheck> {
    let clients: Vec<ControlClient> = config
        .controls()
        .map(|control| ControlClient::new(control, config.control_token.clone(), &config.tls))
        .collect();
    if clients.is_empty() {
        return None;
    }
    Some(ControlClient::wait_all_drained(&clients, config.drain_timeout).await)
}
