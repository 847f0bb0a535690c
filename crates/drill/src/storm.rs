//! The storm: groups of concurrent sibling requests sharing a routing key and a long prompt prefix.
//!
//! The default shape is the frozen eight-sibling pattern of the original bounded-policy A/B: 400 groups
//! of 8 siblings over 8 routing keys. Group `g` uses key `g mod keys`; its 8 siblings go out at once,
//! all with the key's long common prefix (`prefix_tokens` tokens) followed by a short suffix of their
//! own (`suffix_tokens` tokens). `concurrency` groups are in flight at a time; a new group starts when
//! one finishes. With strict consistent hashing all siblings pile onto the key's worker, where the
//! prefix is cached; a bounded policy may spill some of them to a worker where it is not.
//!
//! Requests go to `POST {gateway}/v1/chat/completions` with the key in `routing_key_header`. Each
//! response's `x-bch-worker` and `x-bch-branch` headers give placement and branch (`unknown` when
//! absent, e.g. when pointing the storm straight at a worker).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use futures_util::StreamExt as _;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use rand::{Rng as _, SeedableRng as _};
use rand_chacha::ChaCha8Rng;
use reqwest::Url;
use reqwest::header::{HeaderName, HeaderValue};
use serde::Serialize;
use serde_json::{Value, json};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use bch_core::policy::Branch;
use bch_core::routing_key::{BRANCH_HEADER, WORKER_HEADER};

use crate::control::{ControlClient, DrainCheck};
use crate::sim::{filler_text, fnv1a_extend};
use crate::stats::{mean, percentile};

/// Placement and branch name used when a response lacks the header.
pub const UNKNOWN: &str = "unknown";

/// What a storm fires and where.
#[derive(Clone, Debug)]
pub struct StormConfig {
    /// Data-plane base URL of the gateway (or of a single worker).
    pub gateway: Url,
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
    /// Header carrying the routing key. Default `X-SMG-Routing-Key`.
    pub routing_key_header: String,
    /// Model name sent in requests. Default `bch-sim`.
    pub model: String,
    /// Control-plane URL; when set, the report says whether every worker's `active` returned to 0.
    pub control: Option<Url>,
    /// Bearer token for the control plane.
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
            groups: 400,
            siblings: 8,
            keys: 8,
            concurrency: 4,
            stream: true,
            prefix_tokens: 1024,
            suffix_tokens: 32,
            max_tokens: 32,
            routing_key_header: "X-SMG-Routing-Key".to_owned(),
            model: "bch-sim".to_owned(),
            control: None,
            control_token: None,
            seed: 0,
            drain_timeout: Duration::from_secs(2),
            request_timeout: Duration::from_secs(300),
            progress: true,
        }
    }
}

/// The routing key of key index `k`: stable names, so placements are comparable across runs.
pub fn routing_key(k: usize) -> String {
    format!("storm-key-{k}")
}

/// How TTFT was measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TtftBasis {
    /// Streaming: from just before the request is sent until the first SSE `data:` line arrives
    /// (not the response headers, which servers send before queueing and prefill).
    FirstSseData,
    /// Non-streaming: the full response time, request sent to last body byte.
    FullResponse,
}

/// TTFT over successful requests, in milliseconds.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TtftSummary {
    /// How it was measured.
    pub basis: TtftBasis,
    /// Requests measured.
    pub samples: usize,
    /// Mean.
    pub mean_ms: f64,
    /// Median (nearest rank).
    pub p50_ms: f64,
    /// 99th percentile (nearest rank).
    pub p99_ms: f64,
}

/// The storm's shape, echoed in the report.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StormShape {
    /// Gateway URL.
    pub gateway: String,
    /// Groups fired.
    pub groups: usize,
    /// Siblings per group.
    pub siblings: usize,
    /// Routing keys.
    pub keys: usize,
    /// Groups in flight.
    pub concurrency: usize,
    /// Streaming or not.
    pub stream: bool,
    /// Shared prefix tokens per key.
    pub prefix_tokens: usize,
    /// Distinct suffix tokens per request.
    pub suffix_tokens: usize,
    /// `max_tokens` per request.
    pub max_tokens: u32,
    /// Prompt seed.
    pub seed: u64,
}

/// Everything a storm measured.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StormReport {
    /// What was fired.
    pub shape: StormShape,
    /// Requests sent.
    pub requests: u64,
    /// Requests answered 2xx and read to completion (streams up to `data: [DONE]`).
    pub ok: u64,
    /// Responses per HTTP status.
    pub status_counts: BTreeMap<u16, u64>,
    /// Requests that failed without a complete answer: transport errors, timeouts, broken streams.
    pub errors: u64,
    /// Up to five distinct error messages.
    pub error_samples: Vec<String>,
    /// Wall time of the whole storm, in seconds.
    pub duration_s: f64,
    /// `ok / duration_s`: completed requests per second.
    pub throughput_rps: f64,
    /// Time to first token.
    pub ttft: TtftSummary,
    /// Per routing key: worker (from `x-bch-worker`) → responses.
    pub placement: BTreeMap<String, BTreeMap<String, u64>>,
    /// Per worker: responses.
    pub per_worker: BTreeMap<String, u64>,
    /// Largest share of responses served by one worker (1/workers is perfectly even).
    pub hottest_worker_share: f64,
    /// Per branch (from `x-bch-branch`): responses.
    pub branches: BTreeMap<String, u64>,
    /// Share of responses whose branch is `explicit_routing_key_spillover`.
    pub spill_fraction: f64,
    /// Sum of `usage.prompt_tokens`.
    pub prompt_tokens: u64,
    /// Sum of `usage.prompt_tokens_details.cached_tokens`.
    pub cached_tokens: u64,
    /// Sum of `usage.completion_tokens`.
    pub completion_tokens: u64,
    /// `cached_tokens / prompt_tokens`.
    pub cached_token_fraction: f64,
    /// Whether every worker's `active` returned to 0 (only with a control URL).
    pub drain: Option<DrainCheck>,
}

/// One request's result.
#[derive(Debug, Default)]
struct Outcome {
    key: usize,
    status: Option<u16>,
    error: Option<String>,
    worker: Option<String>,
    branch: Option<String>,
    ttft: Option<Duration>,
    prompt_tokens: u64,
    cached_tokens: u64,
    completion_tokens: u64,
}

impl Outcome {
    fn ok(&self) -> bool {
        self.error.is_none() && self.status.is_some_and(|s| (200..300).contains(&s))
    }
}

/// Sends storm requests; shared by [`run_storm`] and [`background_storm`].
struct Shooter {
    http: reqwest::Client,
    endpoint: String,
    key_header: HeaderName,
    stream: bool,
    max_tokens: u32,
    model: String,
}

impl Shooter {
    fn new(
        gateway: &Url,
        key_header: &str,
        stream: bool,
        max_tokens: u32,
        model: &str,
        timeout: Duration,
    ) -> anyhow::Result<Self> {
        let key_header = HeaderName::try_from(key_header)
            .with_context(|| format!("invalid routing key header name {key_header:?}"))?;
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .build()
            .context("building the HTTP client")?;
        Ok(Self {
            http,
            endpoint: format!(
                "{}/v1/chat/completions",
                gateway.as_str().trim_end_matches('/')
            ),
            key_header,
            stream,
            max_tokens,
            model: model.to_owned(),
        })
    }

    async fn fire(&self, key_index: usize, key: &str, prompt: &str) -> Outcome {
        let mut outcome = Outcome {
            key: key_index,
            ..Outcome::default()
        };
        let mut body = json!({
            "model": self.model,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": self.max_tokens,
            "stream": self.stream,
        });
        if self.stream {
            body["stream_options"] = json!({"include_usage": true});
        }
        let key = match HeaderValue::from_str(key) {
            Ok(key) => key,
            Err(e) => {
                outcome.error = Some(format!("routing key {key:?} is not a header value: {e}"));
                return outcome;
            }
        };
        let start = Instant::now();
        let sent = self
            .http
            .post(&self.endpoint)
            .header(&self.key_header, key)
            .json(&body)
            .send()
            .await;
        let response = match sent {
            Ok(response) => response,
            Err(e) => {
                outcome.error = Some(describe(e));
                return outcome;
            }
        };
        outcome.status = Some(response.status().as_u16());
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        outcome.worker = header(WORKER_HEADER);
        outcome.branch = header(BRANCH_HEADER);
        if !response.status().is_success() {
            // Drain the error body so the connection can be reused; its content is not needed.
            let _ = response.bytes().await;
            return outcome;
        }
        if self.stream {
            read_stream(response, start, &mut outcome).await;
        } else {
            match response.bytes().await {
                Ok(bytes) => {
                    outcome.ttft = Some(start.elapsed());
                    match serde_json::from_slice::<Value>(&bytes) {
                        Ok(v) => take_usage(&v, &mut outcome),
                        Err(e) => outcome.error = Some(format!("invalid JSON response: {e}")),
                    }
                }
                Err(e) => outcome.error = Some(describe(e)),
            }
        }
        outcome
    }
}

/// An HTTP error with its whole cause chain on one line ("error sending request: ...: connection
/// refused"): reqwest's own message alone rarely says what went wrong.
fn describe(error: reqwest::Error) -> String {
    format!("{:#}", anyhow::Error::from(error))
}

fn take_usage(v: &Value, outcome: &mut Outcome) {
    if let Some(usage) = v.get("usage").filter(|u| u.is_object()) {
        let n = |p: &str| usage.pointer(p).and_then(Value::as_u64).unwrap_or(0);
        outcome.prompt_tokens = n("/prompt_tokens");
        outcome.completion_tokens = n("/completion_tokens");
        outcome.cached_tokens = n("/prompt_tokens_details/cached_tokens");
    }
}

/// Reads an SSE body line by line (tolerating `\r\n`), noting the first `data:` line's arrival, the
/// usage chunk, and whether the stream reached `data: [DONE]`.
async fn read_stream(response: reqwest::Response, start: Instant, outcome: &mut Outcome) {
    let mut body = response.bytes_stream();
    let mut pending: Vec<u8> = Vec::new();
    let mut done = false;
    while let Some(chunk) = body.next().await {
        let chunk = match chunk {
            Ok(chunk) => chunk,
            Err(e) => {
                outcome.error = Some(format!("stream broken: {}", describe(e)));
                return;
            }
        };
        pending.extend_from_slice(&chunk);
        while let Some(end) = pending.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = pending.drain(..=end).collect();
            let line = line.strip_suffix(b"\n").unwrap_or(&line);
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            let Some(data) = line.strip_prefix(b"data:") else {
                continue;
            };
            if outcome.ttft.is_none() {
                outcome.ttft = Some(start.elapsed());
            }
            let data = data.strip_prefix(b" ").unwrap_or(data);
            if data == b"[DONE]" {
                done = true;
            } else if let Ok(v) = serde_json::from_slice::<Value>(data) {
                take_usage(&v, outcome);
            }
        }
    }
    if !done {
        outcome.error = Some("stream ended without data: [DONE]".to_owned());
    }
}

/// Prompt text for each key and request, derived from the seed.
struct Prompts {
    seed: u64,
    prefixes: Vec<String>,
    suffix_tokens: usize,
}

impl Prompts {
    fn new(seed: u64, keys: usize, prefix_tokens: usize, suffix_tokens: usize) -> Self {
        let prefixes = (0..keys)
            .map(|k| filler_text(mix(seed, &[k as u64]), prefix_tokens))
            .collect();
        Self {
            seed,
            prefixes,
            suffix_tokens,
        }
    }

    fn prompt(&self, key: usize, group: usize, sibling: usize) -> String {
        let suffix = filler_text(
            mix(self.seed, &[u64::MAX, group as u64, sibling as u64]),
            self.suffix_tokens,
        );
        format!("{}\n{suffix}", self.prefixes[key])
    }
}

fn mix(seed: u64, parts: &[u64]) -> u64 {
    parts.iter().fold(
        fnv1a_extend(0xcbf2_9ce4_8422_2325, &seed.to_le_bytes()),
        |h, p| fnv1a_extend(h, &p.to_le_bytes()),
    )
}

/// Checks that the gateway answers at all, so an unreachable URL is one clear error rather than
/// thousands of failed requests.
async fn preflight(gateway: &Url) -> anyhow::Result<()> {
    let url = format!("{}/health", gateway.as_str().trim_end_matches('/'));
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()?;
    client
        .get(&url)
        .send()
        .await
        .with_context(|| format!("gateway {gateway} is unreachable"))?;
    Ok(())
}

/// Fires the storm described by `config` and measures it.
pub async fn run_storm(config: &StormConfig) -> anyhow::Result<StormReport> {
    anyhow::ensure!(
        config.groups > 0 && config.siblings > 0,
        "groups and siblings must be at least 1"
    );
    anyhow::ensure!(config.keys > 0, "keys must be at least 1");
    anyhow::ensure!(config.concurrency > 0, "concurrency must be at least 1");
    preflight(&config.gateway).await?;
    let shooter = Arc::new(Shooter::new(
        &config.gateway,
        &config.routing_key_header,
        config.stream,
        config.max_tokens,
        &config.model,
        config.request_timeout,
    )?);
    let prompts = Arc::new(Prompts::new(
        config.seed,
        config.keys,
        config.prefix_tokens,
        config.suffix_tokens,
    ));
    let keys: Vec<String> = (0..config.keys).map(routing_key).collect();

    let total = (config.groups * config.siblings) as u64;
    let progress = if config.progress {
        ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr())
    } else {
        ProgressBar::hidden()
    };
    progress.set_style(
        ProgressStyle::with_template("storm {bar:40} {pos}/{len} requests  {per_sec}  eta {eta}")
            .expect("static template"),
    );

    let start = Instant::now();
    let mut outcomes = Vec::with_capacity(total as usize);
    let groups = futures_util::stream::iter(0..config.groups)
        .map(|group| {
            let key = group % config.keys;
            let (shooter, prompts, key_name) =
                (shooter.clone(), prompts.clone(), keys[key].clone());
            let siblings = config.siblings;
            async move {
                let requests = (0..siblings).map(|s| {
                    let prompt = prompts.prompt(key, group, s);
                    let shooter = shooter.clone();
                    let key_name = key_name.clone();
                    async move { shooter.fire(key, &key_name, &prompt).await }
                });
                futures_util::future::join_all(requests).await
            }
        })
        .buffer_unordered(config.concurrency);
    futures_util::pin_mut!(groups);
    // Aggregation happens here, in the one task that owns the results, never in request futures.
    while let Some(group) = groups.next().await {
        progress.inc(group.len() as u64);
        outcomes.extend(group);
    }
    let duration = start.elapsed();
    progress.finish_and_clear();

    let drain = match &config.control {
        Some(control) => Some(
            ControlClient::new(control, config.control_token.clone())
                .wait_drained(config.drain_timeout)
                .await
                .context("checking that every worker's active load returned to 0")?,
        ),
        None => None,
    };

    let shape = StormShape {
        gateway: config.gateway.to_string(),
        groups: config.groups,
        siblings: config.siblings,
        keys: config.keys,
        concurrency: config.concurrency,
        stream: config.stream,
        prefix_tokens: config.prefix_tokens,
        suffix_tokens: config.suffix_tokens,
        max_tokens: config.max_tokens,
        seed: config.seed,
    };
    Ok(summarise(shape, &keys, &outcomes, duration, drain))
}

fn summarise(
    shape: StormShape,
    keys: &[String],
    outcomes: &[Outcome],
    duration: Duration,
    drain: Option<DrainCheck>,
) -> StormReport {
    let mut status_counts = BTreeMap::new();
    let mut placement: BTreeMap<String, BTreeMap<String, u64>> = BTreeMap::new();
    let mut per_worker = BTreeMap::new();
    let mut branches = BTreeMap::new();
    let mut error_samples: Vec<String> = Vec::new();
    let (mut ok, mut errors, mut responses, mut spilled) = (0u64, 0u64, 0u64, 0u64);
    let (mut prompt_tokens, mut cached_tokens, mut completion_tokens) = (0u64, 0u64, 0u64);
    let mut ttfts = Vec::with_capacity(outcomes.len());
    for o in outcomes {
        if let Some(status) = o.status {
            responses += 1;
            *status_counts.entry(status).or_insert(0) += 1;
            let worker = o.worker.clone().unwrap_or_else(|| UNKNOWN.to_owned());
            *placement
                .entry(keys[o.key].clone())
                .or_default()
                .entry(worker.clone())
                .or_insert(0) += 1;
            *per_worker.entry(worker).or_insert(0) += 1;
            let branch = o.branch.as_deref().unwrap_or(UNKNOWN);
            if branch == Branch::ExplicitRoutingKeySpillover.as_str() {
                spilled += 1;
            }
            *branches.entry(branch.to_owned()).or_insert(0) += 1;
        }
        if let Some(e) = &o.error {
            errors += 1;
            if error_samples.len() < 5 && !error_samples.contains(e) {
                error_samples.push(e.clone());
            }
        }
        if o.ok() {
            ok += 1;
            ttfts.extend(o.ttft.map(|t| t.as_secs_f64() * 1000.0));
            prompt_tokens += o.prompt_tokens;
            cached_tokens += o.cached_tokens;
            completion_tokens += o.completion_tokens;
        }
    }
    ttfts.sort_by(f64::total_cmp);
    let ratio = |a: u64, b: u64| if b == 0 { 0.0 } else { a as f64 / b as f64 };
    let seconds = duration.as_secs_f64();
    StormReport {
        requests: outcomes.len() as u64,
        ok,
        status_counts,
        errors,
        error_samples,
        duration_s: seconds,
        throughput_rps: if seconds > 0.0 {
            ok as f64 / seconds
        } else {
            0.0
        },
        ttft: TtftSummary {
            basis: if shape.stream {
                TtftBasis::FirstSseData
            } else {
                TtftBasis::FullResponse
            },
            samples: ttfts.len(),
            mean_ms: mean(&ttfts),
            p50_ms: percentile(&ttfts, 50.0),
            p99_ms: percentile(&ttfts, 99.0),
        },
        placement,
        hottest_worker_share: ratio(per_worker.values().copied().max().unwrap_or(0), responses),
        per_worker,
        branches,
        spill_fraction: ratio(spilled, responses),
        prompt_tokens,
        cached_tokens,
        completion_tokens,
        cached_token_fraction: ratio(cached_tokens, prompt_tokens),
        drain,
        shape,
    }
}

impl std::fmt::Display for StormReport {
    /// A readable summary: totals, TTFT, cache, spill, placement and drain.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = &self.shape;
        writeln!(
            f,
            "storm: {} requests to {} ({} groups x {} siblings over {} keys, {} groups in flight, {})",
            self.requests,
            s.gateway,
            s.groups,
            s.siblings,
            s.keys,
            s.concurrency,
            if s.stream {
                "streaming"
            } else {
                "non-streaming"
            },
        )?;
        let statuses: Vec<String> = self
            .status_counts
            .iter()
            .map(|(k, v)| format!("{k}: {v}"))
            .collect();
        writeln!(
            f,
            "  status        {}   errors: {}",
            statuses.join(", "),
            self.errors
        )?;
        for e in &self.error_samples {
            writeln!(f, "    error: {e}")?;
        }
        writeln!(
            f,
            "  duration      {:.2} s   throughput {:.1} req/s",
            self.duration_s, self.throughput_rps
        )?;
        let basis = match self.ttft.basis {
            TtftBasis::FirstSseData => "first SSE data chunk",
            TtftBasis::FullResponse => "full response, non-streaming",
        };
        writeln!(
            f,
            "  TTFT          mean {:.1} ms   p50 {:.1} ms   p99 {:.1} ms   ({basis})",
            self.ttft.mean_ms, self.ttft.p50_ms, self.ttft.p99_ms
        )?;
        writeln!(
            f,
            "  cached tokens {:.1}% of {} prompt tokens",
            self.cached_token_fraction * 100.0,
            self.prompt_tokens
        )?;
        let branches: Vec<String> = self
            .branches
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        writeln!(
            f,
            "  spill         {:.1}% of responses   branches: {}",
            self.spill_fraction * 100.0,
            branches.join(", ")
        )?;
        let total: u64 = self.per_worker.values().sum();
        let workers: Vec<String> = self
            .per_worker
            .iter()
            .map(|(w, n)| format!("{w} {n} ({:.1}%)", 100.0 * *n as f64 / total.max(1) as f64))
            .collect();
        writeln!(f, "  per worker    {}", workers.join("   "))?;
        writeln!(f, "  placement per key:")?;
        for (key, workers) in &self.placement {
            let cells: Vec<String> = workers.iter().map(|(w, n)| format!("{w}:{n}")).collect();
            writeln!(f, "    {key:<14} {}", cells.join("  "))?;
        }
        match &self.drain {
            None => writeln!(f, "  drain         not checked (no --control)")?,
            Some(d) if d.all_zero => {
                writeln!(
                    f,
                    "  drain         every worker back to 0 active (after {:.0} ms)",
                    d.waited_ms
                )?;
            }
            Some(d) => {
                let busy: Vec<String> = d
                    .active
                    .iter()
                    .filter(|(_, a)| **a > 0)
                    .map(|(w, a)| format!("{w}={a}"))
                    .collect();
                writeln!(
                    f,
                    "  drain         NOT DRAINED after {:.0} ms: {}",
                    d.waited_ms,
                    busy.join(" ")
                )?;
            }
        }
        Ok(())
    }
}

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
    /// Share of groups that use a hot key. Default 0.7.
    pub hot_share: f64,
    /// Concurrent siblings per group. Default 6.
    pub siblings: usize,
    /// Time between group starts. Default 300 ms.
    pub group_interval: Duration,
    /// Groups in flight at most; a tick is skipped while this many are running. Default 4.
    pub max_groups_in_flight: usize,
    /// Shared prefix tokens per key. Default 512.
    pub prefix_tokens: usize,
    /// `max_tokens` per request. Default 24.
    pub max_tokens: u32,
    /// Stream responses. Default true.
    pub stream: bool,
    /// Header carrying the routing key. Default `X-SMG-Routing-Key`.
    pub routing_key_header: String,
    /// Seed of key choice and prompts. Default 0.
    pub seed: u64,
    /// Stop after this many groups, once they have finished. Default `None`: run until cancelled.
    pub max_groups: Option<u64>,
}

impl BackgroundStormConfig {
    /// Defaults aimed at `gateway`.
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
            routing_key_header: "X-SMG-Routing-Key".to_owned(),
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
    /// Requests completed (any status).
    pub requests: u64,
    /// Requests answered 2xx and read to completion.
    pub ok: u64,
}

/// Runs a gentle storm until `cancel` fires (then abandons in-flight requests and returns), or until
/// `max_groups` groups have finished.
///
/// Failures are logged at debug level and otherwise ignored: a demo keeps going while workers are
/// removed, faulted or restarted.
pub async fn background_storm(
    config: BackgroundStormConfig,
    cancel: CancellationToken,
) -> anyhow::Result<BackgroundSummary> {
    let keys: Vec<String> = (0..config.hot_keys)
        .map(|k| format!("hot-{k}"))
        .chain((0..config.cold_keys).map(|k| format!("cold-{k}")))
        .collect();
    anyhow::ensure!(
        !keys.is_empty(),
        "a background storm needs at least one key"
    );
    let shooter = Arc::new(Shooter::new(
        &config.gateway,
        &config.routing_key_header,
        config.stream,
        config.max_tokens,
        "bch-sim",
        Duration::from_secs(60),
    )?);
    let prompts = Arc::new(Prompts::new(
        config.seed,
        keys.len(),
        config.prefix_tokens,
        16,
    ));
    let mut rng = ChaCha8Rng::seed_from_u64(config.seed);
    let mut summary = BackgroundSummary::default();
    let mut in_flight = tokio::task::JoinSet::new();
    let mut tick = tokio::time::interval(config.group_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = cancel.cancelled() => break,
            Some(done) = in_flight.join_next() => {
                if let Ok(outcomes) = done {
                    let outcomes: Vec<Outcome> = outcomes;
                    summary.requests += outcomes.len() as u64;
                    summary.ok += outcomes.iter().filter(|o| o.ok()).count() as u64;
                    for e in outcomes.iter().filter_map(|o| o.error.as_ref()) {
                        tracing::debug!(error = %e, "background storm request failed");
                    }
                }
            }
            _ = tick.tick() => {
                if config.max_groups.is_some_and(|max| summary.groups >= max) {
                    if in_flight.is_empty() {
                        break;
                    }
                    continue;
                }
                if in_flight.len() >= config.max_groups_in_flight.max(1) {
                    continue;
                }
                let key = if config.cold_keys == 0 || (config.hot_keys > 0 && rng.random_bool(config.hot_share.clamp(0.0, 1.0))) {
                    rng.random_range(0..config.hot_keys)
                } else {
                    config.hot_keys + rng.random_range(0..config.cold_keys)
                };
                let group = summary.groups as usize;
                summary.groups += 1;
                let (shooter, prompts, key_name) = (shooter.clone(), prompts.clone(), keys[key].clone());
                let siblings = config.siblings.max(1);
                in_flight.spawn(async move {
                    let requests = (0..siblings).map(|s| {
                        let prompt = prompts.prompt(key, group, s);
                        let (shooter, key_name) = (shooter.clone(), key_name.clone());
                        async move { shooter.fire(key, &key_name, &prompt).await }
                    });
                    futures_util::future::join_all(requests).await
                });
            }
        }
    }
    in_flight.shutdown().await;
    Ok(summary)
}
