//! The background storm of `gatewayd --demo`: a gentle, endless trickle of groups in which a few hot
//! keys take most of the traffic, so a bounded policy has something to spill while someone watches.
//! It never fails on a request: a demo keeps going while workers are removed, faulted or restarted.

use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Duration;

use bch_core::routing_key::DEFAULT_ROUTING_KEY_HEADER;
use rand::{Rng as _, SeedableRng as _};
use rand_chacha::ChaCha8Rng;
use reqwest::Url;
use serde::Serialize;
use tokio::task::{JoinError, JoinSet};
use tokio_util::sync::CancellationToken;

use super::prompts::{PrefixScope, Prompts};
use super::shooter::{Outcome, Shooter};
use crate::sim::DEFAULT_MODEL;
use crate::tls::ClientTls;

/// Prompt tokens of each request's own suffix: short, so the hot keys' prefixes dominate.
const SUFFIX_TOKENS: usize = 16;
/// A request of the background storm that takes longer than this is abandoned.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// A gentle, endless storm for demos: a few hot keys take most groups, so a bounded policy has
/// something to spill.
#[derive(Clone, Debug)]
pub struct BackgroundStormConfig {
    /// Data-plane base URL of the gateway.
    pub gateway: Url,
    /// Keys named `hot-0`, `hot-1`, … Default 2.
    pub hot_keys: usize,
    /// Keys named `cold-0`, `cold-1`, … Default 6.
    pub cold_keys: usize,
    /// Share of groups, 0 to 1, that use a hot key. Default 0.7.
    pub hot_share: f64,
    /// Concurrent sibling requests per group. Default 6.
    pub siblings: usize,
    /// Time between group starts. Default 300 ms.
    pub group_interval: Duration,
    /// Groups in flight at most; a tick is skipped while this many are running. Default 4.
    pub max_groups_in_flight: usize,
    /// Prompt tokens shared by every request of a key. Default 512.
    pub prefix_tokens: usize,
    /// `max_tokens` per request. Default 24.
    pub max_tokens: u32,
    /// Stream responses (SSE). Default true.
    pub stream: bool,
    /// Header carrying the routing key. Default `x-smg-routing-key`, the gateway's default.
    pub routing_key_header: String,
    /// Seed of key choice and prompts. Default 0.
    pub seed: u64,
    /// Stop after this many groups, once they have finished. Default `None`: run until cancelled.
    pub max_groups: Option<u64>,
}

impl BackgroundStormConfig {
    /// Defaults aimed at `gateway`: a group of 6 siblings every 300 ms (at most 20 requests per
    /// second), 70% of the groups on the two hot keys.
    pub fn new(gateway: Url) -> Self {
        Self {
            gateway,
            hot_keys: 2,
            cold_keys: 6,
            hot_share: 0.7,
            siblings: 6,
            group_interval: Duration::from_millis(300),
            max_groups_in_flight: 4,
            prefix_tokens: 512,
            max_tokens: 24,
            stream: true,
            routing_key_header: DEFAULT_ROUTING_KEY_HEADER.to_owned(),
            seed: 0,
            max_groups: None,
        }
    }
}

/// Counters of a background storm, returned when it stops.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct BackgroundSummary {
    /// Groups started.
    pub groups: u64,
    /// Requests completed (any status, or failed).
    pub requests: u64,
    /// Requests answered 2xx and read to completion.
    pub ok: u64,
}

/// Runs a gentle storm until `cancel` fires (then abandons in-flight requests and returns), or until
/// `max_groups` groups have finished.
///
/// Failures are logged at debug level and otherwise ignored: a demo keeps going while workers are
/// removed, faulted or restarted.
///
/// # Errors
///
/// Only at the start: when the config names no key at all or the routing key header is not a
/// header name.
pub async fn background_storm(
    config: BackgroundStormConfig,
    cancel: CancellationToken,
) -> anyhow::Result<BackgroundSummary> {
    let mut storm = Storm::new(config)?;
    let mut tick = tokio::time::interval(storm.config.group_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = cancel.cancelled() => break,
            Some(done) = storm.in_flight.join_next() => storm.finished(done),
            _ = tick.tick() => {
                if storm.tick().is_break() {
                    break;
                }
            }
        }
    }
    storm.in_flight.shutdown().await;
    Ok(storm.summary)
}

/// A running background storm: what it fires and what it has counted.
struct Storm {
    config: BackgroundStormConfig,
    keys: Vec<String>,
    shooter: Arc<Shooter>,
    prompts: Prompts,
    rng: ChaCha8Rng,
    summary: BackgroundSummary,
    in_flight: JoinSet<Vec<Outcome>>,
}

impl Storm {
    fn new(config: BackgroundStormConfig) -> anyhow::Result<Self> {
        let keys: Vec<String> = (0..config.hot_keys)
            .map(|k| format!("hot-{k}"))
            .chain((0..config.cold_keys).map(|k| format!("cold-{k}")))
            .collect();
        anyhow::ensure!(
            !keys.is_empty(),
            "a background storm needs at least one key"
        );
        let shooter = Shooter::new(
            [&config.gateway],
            &config.routing_key_header,
            config.stream,
            config.max_tokens,
            DEFAULT_MODEL,
            REQUEST_TIMEOUT,
            // The demo's storm reaches its own gateway over loopback, in plain HTTP.
            &ClientTls::system(),
        )?;
        let prompts = Prompts::new(
            config.seed,
            keys.len(),
            PrefixScope::Key,
            config.prefix_tokens,
            SUFFIX_TOKENS,
        );
        Ok(Self {
            rng: ChaCha8Rng::seed_from_u64(config.seed),
            shooter: Arc::new(shooter),
            prompts,
            summary: BackgroundSummary::default(),
            in_flight: JoinSet::new(),
            keys,
            config,
        })
    }

    /// Counts a finished group; a group whose task panicked or was aborted counts nothing.
    fn finished(&mut self, done: Result<Vec<Outcome>, JoinError>) {
        if let Ok(outcomes) = done {
            self.summary.requests += outcomes.len() as u64;
            self.summary.ok += outcomes.iter().filter(|o| o.ok()).count() as u64;
            for e in outcomes.iter().filter_map(|o| o.error.as_ref()) {
                tracing::debug!(error = %e, "background storm request failed");
            }
        }
    }

    /// Starts a group unless too many are in flight; breaks once `max_groups` have started and
    /// finished.
    fn tick(&mut self) -> ControlFlow<()> {
        if self
            .config
            .max_groups
            .is_some_and(|max| self.summary.groups >= max)
        {
            return if self.in_flight.is_empty() {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            };
        }
        if self.in_flight.len() < self.config.max_groups_in_flight.max(1) {
            self.start_group();
        }
        ControlFlow::Continue(())
    }

    fn start_group(&mut self) {
        let key = self.pick_key();
        let group = self.summary.groups as usize;
        self.summary.groups += 1;
        let shooter = self.shooter.clone();
        let key_name = self.keys[key].clone();
        let prompts = self.prompts.group(key, group, self.config.siblings.max(1));
        self.in_flight
            .spawn(async move { shooter.fire_group(prompts, &key_name).await });
    }

    /// A hot key with probability `hot_share`, else a cold one (always hot without cold keys and
    /// always cold without hot ones).
    fn pick_key(&mut self) -> usize {
        let c = &self.config;
        if c.cold_keys == 0 || (c.hot_keys > 0 && self.rng.random_bool(c.hot_share.clamp(0.0, 1.0)))
        {
            self.rng.random_range(0..c.hot_keys)
        } else {
            c.hot_keys + self.rng.random_range(0..c.cold_keys)
        }
    }
}
