//! What a measured storm fires and where: [`StormConfig`] with the frozen eight-sibling defaults, and
//! the stable routing key names.

use std::time::Duration;

use bch_core::routing_key::DEFAULT_ROUTING_KEY_HEADER;
use reqwest::Url;

use crate::sim::DEFAULT_MODEL;

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
    /// Tokens of the prefix shared by every request of a key. Default 1024.
    pub prefix_tokens: usize,
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
    /// Seed of the prompt text; routing keys themselves do not depend on it. Default 0.
    pub seed: u64,
    /// How long to wait for every worker's `active` to return to 0 after the storm. Default 2 s.
    pub drain_timeout: Duration,
    /// Per-request timeout, headers to last byte. Default 300 s.
    pub request_timeout: Duration,
    /// Show a progress bar on stderr (it stays hidden when stderr is not a terminal). Default true.
    pub progress: bool,
}

impl Default for StormConfig {
    fn default() -> Self {
        Self {
            gateway: Url::parse("http://127.0.0.1:8080").expect("static URL"),
            replicas: Vec::new(),
            groups: 400,
            siblings: 8,
            keys: 8,
            concurrency: 4,
            stream: true,
            prefix_tokens: 1024,
            suffix_tokens: 32,
            max_tokens: 32,
            routing_key_header: DEFAULT_ROUTING_KEY_HEADER.to_owned(),
            model: DEFAULT_MODEL.to_owned(),
            control: None,
            replica_controls: Vec::new(),
            control_token: None,
            seed: 0,
            drain_timeout: Duration::from_secs(2),
            request_timeout: Duration::from_secs(300),
            progress: true,
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
    pub(super) fn check(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.groups > 0 && self.siblings > 0,
            "groups and siblings must be at least 1"
        );
        anyhow::ensure!(self.keys > 0, "keys must be at least 1");
        anyhow::ensure!(self.concurrency > 0, "concurrency must be at least 1");
        Ok(())
    }
}

/// The routing key of key index `k`, `storm-key-{k}`: stable names, so placements are comparable
/// across runs and seeds.
pub(super) fn routing_key(k: usize) -> String {
    format!("storm-key-{k}")
}
