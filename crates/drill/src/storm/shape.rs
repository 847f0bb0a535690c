//! The storm's shape as configured ([`StormShape`]), echoed in every report so a JSON file says
//! what produced it.

use std::fmt;

use reqwest::Url;
use serde::Serialize;

use super::arrivals::OpenLoop;
use super::config::StormConfig;
use super::prompts::PrefixScope;

/// The storm's shape as configured, echoed in the report so a JSON file says what produced it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StormShape {
    /// Data-plane URL the storm was aimed at (every replica's, comma-separated, when several).
    pub gateway: String,
    /// Gateway replicas the requests were spread over, round-robin (1 for a single gateway).
    pub replicas: usize,
    /// Groups fired.
    pub groups: usize,
    /// Concurrent sibling requests per group.
    pub siblings: usize,
    /// Distinct routing keys the groups cycled over.
    pub keys: usize,
    /// Groups in flight at once.
    pub concurrency: usize,
    /// True when responses were streamed (SSE), which decides the
    /// [`TtftBasis`](super::TtftBasis).
    pub stream: bool,
    /// Prompt tokens of the shared prefix.
    pub prefix_tokens: usize,
    /// Who shares the prefix: every group of a key, or the siblings of one group.
    pub prefix_scope: PrefixScope,
    /// Hot keys (0: groups cycle over the keys in turn).
    pub hot_keys: usize,
    /// Share of groups on the hot keys (meaningful when `hot_keys > 0`).
    pub hot_share: f64,
    /// Prompt tokens distinct to each request.
    pub suffix_tokens: usize,
    /// `max_tokens` of each request.
    pub max_tokens: u32,
    /// Seed of the prompt text.
    pub seed: u64,
    /// Open loop: the rate, arrival process and duration (groups, siblings and concurrency then
    /// do not apply: one request per arrival). `None` for the closed-loop storm.
    pub open_loop: Option<OpenLoop>,
}

impl fmt::Display for StormShape {
    /// `400 groups x 8 siblings over 8 keys (2 hot, 80%), group prefixes of 1024 + 32 tokens, 4
    /// groups in flight, streaming`.
    /// Open loop: `open loop at 40.0 req/s (poisson) for 60 s over 8 keys, ...`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.open_loop {
            Some(o) => write!(
                f,
                "open loop at {:.1} req/s ({}) for {:.0} s over {} keys",
                o.rate,
                o.arrival.as_str(),
                o.duration.as_secs_f64(),
                self.keys
            )?,
            None => write!(
                f,
                "{} groups x {} siblings over {} keys",
                self.groups, self.siblings, self.keys
            )?,
        }
        if self.hot_keys > 0 {
            write!(
                f,
                " ({} hot, {:.0}%)",
                self.hot_keys,
                self.hot_share * 100.0
            )?;
        }
        let scope = match self.prefix_scope {
            PrefixScope::Key => "key",
            PrefixScope::Group => "group",
        };
        write!(
            f,
            ", {scope} prefixes of {} + {} tokens, ",
            self.prefix_tokens, self.suffix_tokens,
        )?;
        if self.open_loop.is_none() {
            write!(f, "{} groups in flight, ", self.concurrency)?;
        }
        f.write_str(if self.stream {
            "streaming"
        } else {
            "non-streaming"
        })
    }
}

impl StormShape {
    /// The shape of a storm fired with `config`.
    pub(crate) fn of(config: &StormConfig) -> Self {
        Self {
            gateway: config
                .gateways()
                .map(Url::as_str)
                .collect::<Vec<_>>()
                .join(","),
            replicas: config.gateways().count(),
            groups: config.groups,
            siblings: config.siblings,
            keys: config.keys,
            concurrency: config.concurrency,
            stream: config.stream,
            prefix_tokens: config.prefix_tokens,
            prefix_scope: config.prefix_scope,
            hot_keys: config.hot_keys,
            hot_share: config.hot_share,
            suffix_tokens: config.suffix_tokens,
            max_tokens: config.max_tokens,
            seed: config.seed,
            open_loop: config.open_loop,
        }
    }
}
