//! Sending storm requests and reading their answers, shared by the measured storm and the background
//! storm: one chat completion per request, the routing key in a header, and an [`Outcome`] noting
//! status, placement, branch, time to first token and token usage.

use std::time::Duration;

use anyhow::Context as _;
use bch_core::routing_key::{BRANCH_HEADER, WORKER_HEADER};
use futures_util::StreamExt as _;
use reqwest::Url;
use reqwest::header::{HeaderName, HeaderValue};
use serde_json::{Value, json};
use tokio::time::Instant;

/// One request's result.
#[derive(Debug, Default)]
pub(super) struct Outcome {
    /// HTTP status, when a response arrived.
    pub(super) status: Option<u16>,
    /// Why the request has no complete answer: transport error, timeout, broken stream.
    pub(super) error: Option<String>,
    /// The `x-bch-worker` response header.
    pub(super) worker: Option<String>,
    /// The `x-bch-branch` response header.
    pub(super) branch: Option<String>,
    /// Time to the first SSE data line, or to the whole body when not streaming.
    pub(super) ttft: Option<Duration>,
    pub(super) prompt_tokens: u64,
    pub(super) cached_tokens: u64,
    pub(super) completion_tokens: u64,
    /// The answer said how many prompt tokens were cached (servers that do not report them leave
    /// `cached_tokens` at 0 without this).
    pub(super) cached_reported: bool,
}

impl Outcome {
    /// A 2xx answer read to completion.
    pub(super) fn ok(&self) -> bool {
        self.error.is_none() && self.status.is_some_and(|s| (200..300).contains(&s))
    }
}

/// Sends storm requests to one gateway, or round-robin to several replicas.
pub(super) struct Shooter {
    http: reqwest::Client,
    endpoints: Vec<String>,
    next: std::sync::atomic::AtomicUsize,
    key_header: HeaderName,
    stream: bool,
    max_tokens: u32,
    model: String,
}

impl Shooter {
    /// A shooter at `{gateway}/v1/chat/completions` of each of `gateways` in turn, the routing key
    /// in `key_header`, each request given up after `timeout` (headers to last byte).
    ///
    /// # Errors
    ///
    /// When `key_header` is not a valid header name, or `gateways` is empty.
    pub(super) fn new<'a>(
        gateways: impl IntoIterator<Item = &'a Url>,
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
        let endpoints: Vec<String> = gateways
            .into_iter()
            .map(|g| format!("{}/v1/chat/completions", g.as_str().trim_end_matches('/')))
            .collect();
        anyhow::ensure!(!endpoints.is_empty(), "no gateway to send requests to");
        Ok(Self {
            http,
            endpoints,
            next: std::sync::atomic::AtomicUsize::new(0),
            key_header,
            stream,
            max_tokens,
            model: model.to_owned(),
        })
    }

    /// Fires one group: one concurrent request per prompt, all with the routing key `key_name`,
    /// and waits for every answer.
    pub(super) async fn fire_group(&self, prompts: Vec<String>, key_name: &str) -> Vec<Outcome> {
        let requests = prompts
            .into_iter()
            .map(|prompt| async move { self.fire(key_name, &prompt).await });
        futures_util::future::join_all(requests).await
    }

    /// The next gateway in turn.
    fn endpoint(&self) -> &str {
        let turn = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        &self.endpoints[turn % self.endpoints.len()]
    }

    /// Sends one request and reads its answer.
    async fn fire(&self, key: &str, prompt: &str) -> Outcome {
        let mut outcome = Outcome::default();
        let body = self.body(prompt);
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
            .post(self.endpoint())
            .header(&self.key_header, key)
            .json(&body)
            .send()
            .await;
        match sent {
            Ok(response) => self.read_answer(response, start, &mut outcome).await,
            Err(e) => outcome.error = Some(describe(e)),
        }
        outcome
    }

    fn body(&self, prompt: &str) -> Value {
        let mut body = json!({
            "model": self.model,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": self.max_tokens,
            "stream": self.stream,
        });
        // Without it a stream carries no usage, and the cached-token fraction would read 0.
        if self.stream {
            body["stream_options"] = json!({"include_usage": true});
        }
        body
    }

    async fn read_answer(
        &self,
        response: reqwest::Response,
        start: Instant,
        outcome: &mut Outcome,
    ) {
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
            return;
        }
        if self.stream {
            read_stream(response, start, outcome).await;
        } else {
            read_whole(response, start, outcome).await;
        }
    }
}

/// An HTTP error with its whole cause chain on one line ("error sending request: ...: connection
/// refused"): reqwest's own message alone rarely says what went wrong.
fn describe(error: reqwest::Error) -> String {
    format!("{:#}", anyhow::Error::from(error))
}

/// Token counts from an answer or a stream chunk: `usage` as OpenAI and vLLM send it, and the cached
/// tokens from `usage.prompt_tokens_details.cached_tokens` or, from llama.cpp's `llama-server`,
/// `timings.cache_n`.
fn take_usage(v: &Value, outcome: &mut Outcome) {
    if let Some(usage) = v.get("usage").filter(|u| u.is_object()) {
        let n = |p: &str| usage.pointer(p).and_then(Value::as_u64);
        outcome.prompt_tokens = n("/prompt_tokens").unwrap_or(0);
        outcome.completion_tokens = n("/completion_tokens").unwrap_or(0);
        if let Some(cached) = n("/prompt_tokens_details/cached_tokens") {
            outcome.cached_tokens = cached;
            outcome.cached_reported = true;
        }
    }
    if let Some(cached) = v.pointer("/timings/cache_n").and_then(Value::as_u64) {
        outcome.cached_tokens = cached;
        outcome.cached_reported = true;
    }
}

/// Reads a whole JSON body; its arrival is the "first token" of a non-streamed request.
async fn read_whole(response: reqwest::Response, start: Instant, outcome: &mut Outcome) {
    match response.bytes().await {
        Ok(bytes) => {
            outcome.ttft = Some(start.elapsed());
            match serde_json::from_slice::<Value>(&bytes) {
                Ok(v) => take_usage(&v, outcome),
                Err(e) => outcome.error = Some(format!("invalid JSON response: {e}")),
            }
        }
        Err(e) => outcome.error = Some(describe(e)),
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
