//! What a measured storm fires and where: [`StormConfig`] with the frozen eight-sibling defaults, and
//! the stable routing key names.

use std::time::Duration;

use bch_core::routing_key::DEFAULT_ROUTING_KEY_HEADER;
use reqwest::Url;

use super::arrivals::OpenLoop;
use super::prompts::{PrefixScope, mix};
use crate::sim::DEFAULT_MODEL;
use crate::tls::ClientTls;

/// What a measured storm fires and where. `Default` is the frozen eight-sibling pattern: 400 groups
/// of 8 siblings over 8 keys, 4 groups in flight, streaming, 1,024-token shared prefixes.
#[derive(Clone, Debug)]
pub struct StormConfig {
    /// Data-plane base URL of the gateway (or of a single worker, for a baseline without routing).
    pub gateway: Url,
    /// Data-plane URLs of further gateway replicas in front of the same fleet. Requests go
    /// round-robin over `gateway` and these, one request each in turn, as an L4 balancer spreads
    /// them. Default none.
    pub replicas: Vec<Url>,
    /// Stop sending to a replica whose connection is refused, and send the refused request to the
    /// next replica instead, as an L4 balancer does (nothing reached the refusing replica, so
    /// nothing is sent twice). An ejected replica stays out until the storm ends; a replica that
    /// refuses the preflight is ejected before the first request. Default false: every replica
    /// keeps its turn, and each refused request is counted as refused.
    pub eject_refused_replicas: bool,
    /// Groups to fire. Default 400.
    pub groups: usize,
    /// Concurrent sibling requests per group. Default 8.
    pub siblings: usize,
    /// Distinct routing keys; groups cycle over them. Default 8.
    pub keys: usize,
    /// Groups in flight at once. Default 4 (32 requests with 8 siblings).
    pub concurrency: usize,
    /// Stream responses (SSE) and measure TTFT to the first data chunk. Default true.
    pub stream: bool,
    /// Tokens of the shared prompt prefix. Default 1024.
    pub prefix_tokens: usize,
    /// Who shares the prefix: every group of a key (`Key`, the default: long-lived sessions) or only
    /// the siblings of one group (`Group`: each group brings a new prefix).
    pub prefix_scope: PrefixScope,
    /// Hot keys: 0 (the default) cycles the groups over the keys in turn; `n > 0` sends a share
    /// `hot_share` of the groups to the first `n` keys (`storm-key-0`…) and the rest to the others,
    /// each group's key drawn from the seed.
    pub hot_keys: usize,
    /// Share of groups, 0 to 1, on the hot keys when `hot_keys > 0`. Default 0.8.
    pub hot_share: f64,
    /// Tokens of each request's own suffix. Default 32.
    pub suffix_tokens: usize,
    /// `max_tokens` of every request. Default 32.
    pub max_tokens: u32,
    /// Header carrying the routing key. Default `x-smg-routing-key`, the gateway's default.
    pub routing_key_header: String,
    /// Model name sent in requests. Default `bch-sim`.
    pub model: String,
    /// Control-plane URL; when set, the report says whether every worker's `active` returned to 0.
    pub control: Option<Url>,
    /// Control planes of the replicas, checked for the drain like `control`. Default none.
    pub replica_controls: Vec<Url>,
    /// Bearer token for the control plane, when it requires one.
    pub control_token: Option<String>,
    /// Trust and client certificate for https gateways and control planes. Default: the
    /// system's trust roots, no client certificate.
    pub tls: ClientTls,
    /// Seed of the prompt text; routing keys themselves do not depend on it. Default 0.
    pub seed: u64,
    /// How long to wait for every worker's `active` to return to 0 after the storm. Default 2 s.
    pub drain_timeout: Duration,
    /// Per-request timeout, headers to last byte. Default 300 s.
    pub request_timeout: Duration,
    /// Show a progress bar on stderr (it stays hidden when stderr is not a terminal). Default true.
    pub progress: bool,
    /// Send open-loop at a rate instead (one request per arrival; `groups`, `siblings` and
    /// `concurrency` then do not apply). Default `None`: the closed-loop storm.
    pub open_loop: Option<OpenLoop>,
    /// TTFT objective: the report counts the answers within it as goodput. Default none.
    pub slo_ttft: Option<Duration>,
}

impl Default for StormConfig {
    fn default() -> Self {
        Self {
            gateway: Url::parse("http://127.0.0.1:8080").expect("static URL"),
            replicas: Vec::new(),
            eject_refused_replicas: false,
            groups: 400,
            siblings: 8,
            keys: 8,
            concurrency: 4,
            stream: true,
            prefix_tokens: 1024,
            prefix_scope: PrefixScope::Key,
            hot_keys: 0,
            hot_share: 0.8,
            suffix_tokens: 32,
            max_tokens: 32,
            routing_key_header: DEFAULT_ROUTING_KEY_HEADER.to_owned(),
            model: DEFAULT_MODEL.to_owned(),
            control: None,
            replica_controls: Vec::new(),
            control_token: None,
            tls: ClientTls::default(),
            seed: 0,
            drain_timeout: Duration::from_secs(2),
            request_timeout: Duration::from_secs(300),
            progress: true,
            open_loop: None,
            slo_ttft: None,
        }
    }
}

impl StormConfig {
    /// Every gateway the storm spreads requests over: `gateway`, then the replicas.
    pub fn gateways(&self) -> impl Iterator<Item = &Url> {
        std::iter::once(&self.gateway).chain(&self.replicas)
    }

    /// Every control plane the drain check asks: `control`, then the replicas'.
    pub fn controls(&self) -> impl Iterator<Item = &Url> {
        self.control.iter().chain(&self.replica_controls)
    }

    /// Refuses a storm that would fire nothing or never finish.
    pub(crate) fn check(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.groups > 0 && self.siblings > 0,
            "groups and siblings must be at least 1"
        );
        anyhow::ensure!(self.keys > 0, "keys must be at least 1");
        if let Some(open_loop) = &self.open_loop {
            open_loop.check()?;
        }
        anyhow::ensure!(self.concurrency > 0, "concurrency must be at least 1");
        anyhow::ensure!(
            self.hot_keys <= self.keys,
            "hot keys ({}) must not exceed keys ({})",
            self.hot_keys,
            self.keys
        );
        anyhow::ensure!(
            (0.0..=1.0).contains(&self.hot_share),
            "hot share must be between 0 and 1, got {}",
            self.hot_share
        );
        // A replica named twice would take two turns of the round-robin, and its control plane
        // would be asked twice, its load counted double, while the report said every replica
        // drained.
        named_once("--gateway", self.gateways())?;
        named_once("--control", self.controls())
    }

    /// The key index of group `group`: in turn without hot keys; with them, a hot key for a share
    /// `hot_share` of the groups, drawn from the seed (so the sequence varies with the seed, and
    /// the key names do not).
    pub(super) fn key_of(&self, group: usize) -> usize {
        if self.hot_keys == 0 {
            return group % self.keys;
        }
        let draw = |salt: u64| mix(self.seed, &[u64::MAX - 2, salt, group as u64]);
        // 53 random bits: a uniform number in [0, 1).
        let uniform = (draw(0) >> 11) as f64 / (1u64 << 53) as f64;
        let cold = self.keys - self.hot_keys;
        if cold == 0 || uniform < self.hot_share {
            (draw(1) % self.hot_keys as u64) as usize
        } else {
            self.hot_keys + (draw(2) % cold as u64) as usize
        }
    }
}

/// The routing key of key index `k`, `storm-key-{k}`: stable names, so placements are comparable
/// across runs and seeds.
pub(super) fn routing_key(k: usize) -> String {
    format!("storm-key-{k}")
}

/// Refuses a list of URLs (`option` names it) that names one URL twice, a trailing `/` or not.
fn named_once<'a>(option: &str, urls: impl Iterator<Item = &'a Url>) -> anyhow::Result<()> {
    let mut seen = std::collections::BTreeSet::new();
    for url in urls {
        anyhow::ensure!(
            seen.insert(url.as_str().trim_end_matches('/')),
            "{option} names {url} twice: name each replica once"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hot_keys_take_their_share_of_the_groups_and_no_hot_keys_means_in_turn() {
        let plain = StormConfig::default();
        assert_eq!(
            (0..10).map(|g| plain.key_of(g)).collect::<Vec<_>>(),
            [0, 1, 2, 3, 4, 5, 6, 7, 0, 1]
        );
        let hot = StormConfig {
            keys: 64,
            hot_keys: 2,
            hot_share: 0.8,
            seed: 9,
            ..StormConfig::default()
        };
        let keys: Vec<usize> = (0..10_000).map(|g| hot.key_of(g)).collect();
        let on_hot = keys.iter().filter(|&&k| k < 2).count() as f64 / keys.len() as f64;
        assert!((on_hot - 0.8).abs() < 0.02, "{on_hot}");
        assert!(keys.iter().all(|&k| k < 64));
        assert!(keys.contains(&0) && keys.contains(&1) && keys.contains(&63));
        let other_seed = StormConfig {
            seed: 10,
            ..hot.clone()
        };
        assert_ne!(
            keys[..50],
            (0..50).map(|g| other_seed.key_of(g)).collect::<Vec<_>>()
        );
        assert!(
            StormConfig {
                hot_keys: 65,
                ..hot.clone()
            }
            .check()
            .is_err()
        );
        assert!(
            StormConfig {
                hot_share: 1.5,
                ..hot
            }
            .check()
            .is_err()
        );
    }
}
