//! Sending storm requests and reading their answers, shared by the measured storm and the background
//! storm: one chat completion per request, the routing key in a header, and an [`Outcome`] noting
//! status, placement, branch, time to first token and token usage, or why no answer came.
//!
//! With several replicas the requests go round-robin; a shooter that ejects refused replicas stops
//! sending to a replica once a connection to it is refused, and sends the refused request to the
//! next replica instead, as an L4 balancer does (nothing was sent, so nothing is repeated).

use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use bch_core::routing_key::{BRANCH_HEADER, WORKER_HEADER};
use futures_util::StreamExt as _;
use reqwest::Url;
use reqwest::header::{HeaderName, HeaderValue, RETRY_AFTER};
use serde_json::{Value, json};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::tls::{ClientTls, tls_failure};

/// The header in which a gateway names why it refused a request (`worker_overload_protection_shed`
/// for a shed), as SMG does.
pub(super) const ERROR_CODE_HEADER: &str = "x-smg-error-code";

/// The header in which the gateway says how long it held a request in its admission queue, in
/// milliseconds.
pub(super) const QUEUE_WAIT_HEADER: &str = "x-bch-queue-wait-ms";

/// Why a request got no response at all (no status line).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum NoResponse {
    /// The connection was refused: nothing was sent.
    Refused,
    /// No response within the request timeout.
    TimedOut,
    /// Any other failure before a response: reset, closed, unreachable host.
    Transport,
    /// Never sent: the request could not be built, or every replica was ejected.
    NotSent,
}

/// One request's result.
#[derive(Debug, Default)]
pub(super) struct Outcome {
    /// HTTP status, when a response arrived.
    pub(super) status: Option<u16>,
    /// Why the request has no complete answer: transport error, timeout, broken stream.
    pub(super) error: Option<String>,
    /// Without a status: why no response came.
    pub(super) no_response: Option<NoResponse>,
    /// Index of the gateway (in the order given) that had the request last; `None` when it was
    /// never sent.
    pub(super) replica: Option<usize>,
    /// Replicas that refused this request's connection before it was sent to another one (only
    /// when refused replicas are ejected), in order.
    pub(super) refused_by: Vec<usize>,
    /// Sent, then abandoned unfinished because the storm was stopped (Ctrl-C); whatever had
    /// arrived of its answer does not count.
    pub(super) interrupted: bool,
    /// The `x-bch-worker` response header.
    pub(super) worker: Option<String>,
    /// The `x-bch-branch` response header.
    pub(super) branch: Option<String>,
    /// Time to the first SSE data line, or to the whole body when not streaming.
    pub(super) ttft: Option<Duration>,
    /// When the first attempt started.
    pub(super) sent: Option<Instant>,
    /// Open loop: how long after its scheduled time the request went out (set by the measured
    /// storm only, which the background storm builds without).
    #[cfg_attr(not(feature = "harness"), allow(dead_code))]
    pub(super) late: Option<Duration>,
    /// Time from the first attempt to the end of the answer (its last byte, or the failure).
    pub(super) total: Option<Duration>,
    /// The answer carried a `Retry-After` header (a clean shed carries one).
    pub(super) retry_after: bool,
    /// The `X-SMG-Error-Code` response header, when the answer is an error that names its cause.
    pub(super) error_code: Option<String>,
    /// The `x-bch-queue-wait-ms` response header: how long the gateway held the request before
    /// admitting or shedding it, in milliseconds.
    pub(super) queue_wait_ms: Option<f64>,
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
    next: AtomicUsize,
    /// Stop sending to a replica that refused a connection, and resend the request elsewhere.
    eject_refused: bool,
    /// Per replica: when it was ejected, in seconds since the shooter was built.
    ejected: Vec<OnceLock<f64>>,
    start: Instant,
    /// Abandons every request in flight when cancelled.
    stop: CancellationToken,
    key_header: HeaderName,
    stream: bool,
    max_tokens: u32,
    model: String,
}

impl Shooter {
    /// A shooter at `{gateway}/v1/chat/completions` of each of `gateways` in turn, the routing key
    /// in `key_header`, each request given up after `timeout` (headers to last byte), https
    /// gateways reached with `tls`.
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
        tls: &ClientTls,
    ) -> anyhow::Result<Self> {
        let key_header = HeaderName::try_from(key_header)
            .with_context(|| format!("invalid routing key header name {key_header:?}"))?;
        let http = tls
            .http_client()
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
            ejected: endpoints.iter().map(|_| OnceLock::new()).collect(),
            endpoints,
            next: AtomicUsize::new(0),
            eject_refused: false,
            start: Instant::now(),
            stop: CancellationToken::new(),
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

    // Only the measured storm (feature "harness") ejects replicas and stops on Ctrl-C.
    #[cfg_attr(not(feature = "harness"), allow(dead_code))]
    /// Stop sending to a replica whose connections are refused, and send a refused request to
    /// the next replica instead.
    pub(super) fn ejecting_refused(mut self, eject: bool) -> Self {
        self.eject_refused = eject;
        self
    }

    // Only the measured storm (feature "harness") ejects replicas and stops on Ctrl-C.
    #[cfg_attr(not(feature = "harness"), allow(dead_code))]
    /// Abandon every request in flight once `stop` is cancelled: each then ends at once, counted
    /// as interrupted (or not sent, when no replica had been chosen for it yet).
    pub(super) fn stopping_on(mut self, stop: CancellationToken) -> Self {
        self.stop = stop;
        self
    }

    /// Takes replica `replica` out of the rotation (the first call counts; later ones change
    /// nothing).
    pub(super) fn eject(&self, replica: usize) {
        let _ = self.ejected[replica].set(self.start.elapsed().as_secs_f64());
    }

    // Only the measured storm (feature "harness") ejects replicas and stops on Ctrl-C.
    #[cfg_attr(not(feature = "harness"), allow(dead_code))]
    /// Per replica, in the order given: when it was ejected, in seconds since the shooter was
    /// built; `None` for a replica still in the rotation.
    pub(super) fn ejections(&self) -> Vec<Option<f64>> {
        self.ejected.iter().map(|e| e.get().copied()).collect()
    }

    /// The next replica in turn that is not ejected; `None` once every one is.
    fn next_replica(&self) -> Option<usize> {
        let turn = self.next.fetch_add(1, Ordering::Relaxed);
        let n = self.endpoints.len();
        (0..n)
            .map(|step| (turn + step) % n)
            .find(|&replica| self.ejected[replica].get().is_none())
    }

    /// Sends one request and reads its answer. A refused connection, when refused replicas are
    /// ejected, ejects the replica and sends the request to the next one. When the shooter's stop
    /// token fires first, the request is abandoned and says so.
    pub(super) async fn fire(&self, key: &str, prompt: &str) -> Outcome {
        let mut outcome = Outcome::default();
        let body = self.body(prompt);
        let key = match HeaderValue::from_str(key) {
            Ok(key) => key,
            Err(e) => {
                outcome.error = Some(format!("routing key {key:?} is not a header value: {e}"));
                outcome.no_response = Some(NoResponse::NotSent);
                return outcome;
            }
        };
        // From the first attempt: a resent request's client waited through the refusal too.
        let start = Instant::now();
        outcome.sent = Some(start);
        let finished = tokio::select! {
            () = self.attempt(&key, &body, start, &mut outcome) => true,
            () = self.stop.cancelled() => false,
        };
        outcome.total = Some(start.elapsed());
        if !finished {
            if outcome.replica.is_some() {
                outcome.interrupted = true;
                outcome.error = Some("interrupted: the storm was stopped".to_owned());
            } else {
                outcome.no_response = Some(NoResponse::NotSent);
                outcome.error = Some("not sent: the storm was stopped".to_owned());
            }
        }
        outcome
    }

    /// Sends the request to the next replica in turn and reads its answer into `outcome`; with
    /// ejection of refused replicas, a refused connection ejects the replica and the request goes
    /// to the next one.
    async fn attempt(
        &self,
        key: &HeaderValue,
        body: &Value,
        start: Instant,
        outcome: &mut Outcome,
    ) {
        loop {
            let Some(replica) = self.next_replica() else {
                outcome.error =
                    Some("not sent: every replica refused connections and was ejected".to_owned());
                outcome.no_response = Some(NoResponse::NotSent);
                return;
            };
            outcome.replica = Some(replica);
            let sent = self
                .http
                .post(&self.endpoints[replica])
                .header(&self.key_header, key.clone())
                .json(body)
                .send()
                .await;
            match sent {
                Ok(response) => {
                    self.read_answer(response, start, outcome).await;
                    return;
                }
                Err(e) => {
                    let kind = no_response(&e);
                    if kind == NoResponse::Refused && self.eject_refused {
                        self.eject(replica);
                        if self.next_replica_exists() {
                            outcome.refused_by.push(replica);
                            continue;
                        }
                    }
                    outcome.error = Some(describe(e));
                    outcome.no_response = Some(kind);
                    return;
                }
            }
        }
    }

    /// Whether any replica is still in the rotation.
    fn next_replica_exists(&self) -> bool {
        self.ejected.iter().any(|e| e.get().is_none())
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
        outcome.retry_after = response.headers().contains_key(RETRY_AFTER);
        outcome.error_code = header(ERROR_CODE_HEADER);
        outcome.queue_wait_ms = header(QUEUE_WAIT_HEADER).and_then(|v| v.trim().parse().ok());
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

/// Why a request that failed before its response got none: a refused connection (an I/O error
/// of kind `ConnectionRefused` anywhere in the cause chain), a timeout, or anything else.
pub(super) fn no_response(error: &reqwest::Error) -> NoResponse {
    if refused(error) {
        NoResponse::Refused
    } else if error.is_timeout() {
        NoResponse::TimedOut
    } else {
        NoResponse::Transport
    }
}

/// Whether `error` is a refused connection: nothing reached the server.
pub(super) fn refused(error: &reqwest::Error) -> bool {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(e) = cause {
        if e.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::ConnectionRefused)
        {
            return true;
        }
        cause = e.source();
    }
    false
}

/// An HTTP error with its whole cause chain on one line ("error sending request: ...: connection
/// refused"): reqwest's own message alone rarely says what went wrong. A TLS failure leads with
/// what it was ("TLS: server certificate not trusted ..."), which the chain buries.
pub(super) fn describe(error: reqwest::Error) -> String {
    match tls_failure(&error) {
        Some(tls) => format!("{tls}: {:#}", anyhow::Error::from(error)),
        None => format!("{:#}", anyhow::Error::from(error)),
    }
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
