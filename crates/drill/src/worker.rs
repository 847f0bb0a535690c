//! Simulated OpenAI-compatible inference workers.
//!
//! Each worker is an axum server with the routes of a vLLM/SGLang server:
//!
//! | route | answer |
//! | --- | --- |
//! | `POST /v1/chat/completions` | OpenAI chat completion; SSE chunks with `"stream": true` |
//! | `POST /v1/completions` | OpenAI text completion; SSE chunks with `"stream": true` |
//! | `POST /generate` | SGLang native: `{"text", "sampling_params": {"max_new_tokens"}, "stream"}` |
//! | `GET /health` | 200 with an empty body |
//! | `GET /v1/models` | the one model, [`SimConfig::model`] |
//! | `GET /metrics` | Prometheus/OpenMetrics text with vLLM's metric names |
//!
//! A request's life follows [`crate::sim`]: wait in the FIFO queue for one of `max_batch` slots, look
//! its prompt up in the worker's [`PrefixCache`], prefill the uncached tokens, then produce one token per
//! decode step whose duration grows with the running batch. Time to first token is therefore queueing
//! plus prefill of the uncached tokens. Responses report `usage.prompt_tokens`,
//! `usage.completion_tokens` and `usage.prompt_tokens_details.cached_tokens` as vLLM does; streams send
//! a final usage chunk when asked with `"stream_options": {"include_usage": true}` and always end with
//! `data: [DONE]`.
//!
//! Faults for tests are switched at run time with [`WorkerHandle::set_fault`].

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::serve::ListenerExt as _;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use serde::Serialize;
use serde_json::{Value, json};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::cache::PrefixCache;
use crate::sim::{OutputWords, SimConfig, tokenize};

/// A fault a worker injects into its answers, switchable at run time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Fault {
    /// Healthy: answer normally.
    #[default]
    None,
    /// Every route except `/metrics` answers `500` with an OpenAI error body, as a crashed engine
    /// behind a live HTTP front end does.
    Status500,
    /// Inference routes send nothing at all (no status line, no headers) until the fault is cleared or
    /// the worker shuts down; then they proceed (or answer 503 on shutdown). `/health` still answers:
    /// this is a wedged engine behind a live HTTP server, the case a first-byte timeout exists for.
    StallFirstByte,
}

/// Counters of one worker since it started.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct SimStats {
    /// Inference requests received, including those answered by a fault.
    pub requests_total: u64,
    /// Inference requests whose last token was produced.
    pub completed_total: u64,
    /// Prompt tokens of admitted requests.
    pub prompt_tokens_total: u64,
    /// Prompt tokens served from the prefix cache.
    pub cached_tokens_total: u64,
    /// Completion tokens produced.
    pub completion_tokens_total: u64,
    /// Requests holding a batch slot now.
    pub running: u64,
    /// Requests queued for a batch slot now.
    pub waiting: u64,
    /// Blocks in the prefix cache now.
    pub cached_blocks: usize,
}

/// The metrics a worker exports; they are also its live state (the gauges are the batch occupancy).
struct WorkerMetrics {
    running: Gauge,
    waiting: Gauge,
    requests: Counter,
    success: Counter,
    prompt_tokens: Counter,
    cached_tokens: Counter,
    generation_tokens: Counter,
    registry: Registry,
}

impl WorkerMetrics {
    fn new() -> Self {
        let mut m = Self {
            running: Gauge::default(),
            waiting: Gauge::default(),
            requests: Counter::default(),
            success: Counter::default(),
            prompt_tokens: Counter::default(),
            cached_tokens: Counter::default(),
            generation_tokens: Counter::default(),
            registry: Registry::default(),
        };
        // vLLM's names, so dashboards and gateways that scrape vLLM read the simulator unchanged.
        // Counters get their `_total` suffix from the encoder.
        let r = &mut m.registry;
        r.register(
            "vllm:num_requests_running",
            "Requests in the running batch",
            m.running.clone(),
        );
        r.register(
            "vllm:num_requests_waiting",
            "Requests waiting for a batch slot",
            m.waiting.clone(),
        );
        r.register(
            "bch_sim:requests",
            "Inference requests received",
            m.requests.clone(),
        );
        r.register(
            "vllm:request_success",
            "Requests finished",
            m.success.clone(),
        );
        r.register(
            "vllm:prompt_tokens",
            "Prompt tokens of admitted requests",
            m.prompt_tokens.clone(),
        );
        r.register(
            "vllm:prefix_cache_hits",
            "Prompt tokens served from the prefix cache (cached tokens)",
            m.cached_tokens.clone(),
        );
        r.register(
            "vllm:generation_tokens",
            "Completion tokens produced",
            m.generation_tokens.clone(),
        );
        m
    }
}

struct Shared {
    name: String,
    config: SimConfig,
    cache: Mutex<PrefixCache>,
    batch: Arc<Semaphore>,
    metrics: WorkerMetrics,
    fault: watch::Sender<Fault>,
    cancel: CancellationToken,
    next_id: AtomicU64,
}

impl Shared {
    fn cache(&self) -> MutexGuard<'_, PrefixCache> {
        // A panic while holding the lock cannot leave the LRU half-updated in a way that matters for a
        // simulation, so a poisoned lock is simply reused.
        self.cache
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn stats(&self) -> SimStats {
        let m = &self.metrics;
        SimStats {
            requests_total: m.requests.get(),
            completed_total: m.success.get(),
            prompt_tokens_total: m.prompt_tokens.get(),
            cached_tokens_total: m.cached_tokens.get(),
            completion_tokens_total: m.generation_tokens.get(),
            running: m.running.get().max(0) as u64,
            waiting: m.waiting.get().max(0) as u64,
            cached_blocks: self.cache().len(),
        }
    }
}

/// A running simulated worker. Dropping the handle stops accepting connections; [`shutdown`] also
/// waits for in-flight responses to finish.
///
/// [`shutdown`]: WorkerHandle::shutdown
pub struct WorkerHandle {
    shared: Arc<Shared>,
    addr: SocketAddr,
    task: Option<JoinHandle<std::io::Result<()>>>,
}

impl WorkerHandle {
    /// The worker's name (as given to [`spawn_worker`]).
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// The address the worker listens on (with the real port when bound to port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Base URL, e.g. `http://127.0.0.1:8001`, without a trailing slash.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The model parameters this worker runs with.
    pub fn config(&self) -> &SimConfig {
        &self.shared.config
    }

    /// Switches the injected fault; takes effect for requests that arrive afterwards, and releases
    /// requests stalled by [`Fault::StallFirstByte`].
    pub fn set_fault(&self, fault: Fault) {
        self.shared.fault.send_replace(fault);
    }

    /// The fault currently injected.
    pub fn fault(&self) -> Fault {
        *self.shared.fault.borrow()
    }

    /// Counters since start.
    pub fn stats(&self) -> SimStats {
        self.shared.stats()
    }

    /// Stops accepting connections, releases stalled requests, and waits until in-flight responses
    /// (including streams) have finished.
    pub async fn shutdown(mut self) -> anyhow::Result<()> {
        self.shared.cancel.cancel();
        if let Some(task) = self.task.take() {
            task.await
                .context("worker task panicked")?
                .with_context(|| format!("worker {} failed", self.shared.name))?;
        }
        Ok(())
    }
}

impl Drop for WorkerHandle {
    fn drop(&mut self) {
        self.shared.cancel.cancel();
    }
}

/// Starts a simulated worker on `addr` (port 0 picks a free port) and returns once it accepts
/// connections.
pub async fn spawn_worker(
    addr: SocketAddr,
    name: impl Into<String>,
    config: SimConfig,
) -> anyhow::Result<WorkerHandle> {
    let name = name.into();
    config
        .validate()
        .with_context(|| format!("invalid simulator config for {name}"))?;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot bind worker {name} to {addr}"))?;
    let addr = listener.local_addr()?;
    let shared = Arc::new(Shared {
        cache: Mutex::new(PrefixCache::new(
            config.block_size,
            config.cache_capacity_blocks,
        )),
        batch: Arc::new(Semaphore::new(config.max_batch)),
        metrics: WorkerMetrics::new(),
        fault: watch::Sender::new(Fault::None),
        cancel: CancellationToken::new(),
        next_id: AtomicU64::new(0),
        name,
        config,
    });
    let app = router(shared.clone());
    let cancel = shared.cancel.clone();
    let task = tokio::spawn(async move {
        // TCP_NODELAY, as vLLM's and SGLang's servers (uvicorn/asyncio) have it: a stream's chunks
        // are small writes, and with Nagle each keep-alive stream's tail would wait for the
        // client's delayed ACK (~40 ms on Linux) — a stall no real engine has.
        let listener = listener.tap_io(|tcp| {
            let _ = tcp.set_nodelay(true);
        });
        axum::serve(listener, app)
            .with_graceful_shutdown(cancel.cancelled_owned())
            .await
    });
    tracing::debug!(worker = %shared.name, %addr, "simulated worker listening");
    Ok(WorkerHandle {
        shared,
        addr,
        task: Some(task),
    })
}

/// Starts `count` workers named `sim-0`, `sim-1`, … on 127.0.0.1, at ports `base_port`,
/// `base_port + 1`, … or on free ports when `base_port` is 0.
pub async fn spawn_workers(
    count: usize,
    base_port: u16,
    config: SimConfig,
) -> anyhow::Result<Vec<WorkerHandle>> {
    let mut workers = Vec::with_capacity(count);
    for i in 0..count {
        let port = if base_port == 0 {
            0
        } else {
            u16::try_from(usize::from(base_port) + i)
                .ok()
                .with_context(|| format!("port {base_port} + {i} is out of range"))?
        };
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        workers.push(spawn_worker(addr, format!("sim-{i}"), config.clone()).await?);
    }
    Ok(workers)
}

fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .route("/generate", post(generate))
        .route("/health", get(health))
        .route("/v1/models", get(models))
        .route("/metrics", get(metrics))
        .with_state(shared)
}

/// The three request shapes the worker understands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Api {
    Chat,
    Completion,
    Generate,
}

/// What a request asks for, whatever its shape.
#[derive(Debug)]
struct Job {
    api: Api,
    prompt: String,
    max_tokens: u32,
    stream: bool,
    include_usage: bool,
}

fn parse_job(api: Api, body: &[u8], default_max_tokens: u32) -> Result<Job, String> {
    let v: Value = serde_json::from_slice(body).map_err(|e| format!("invalid JSON body: {e}"))?;
    let stream = v.get("stream").and_then(Value::as_bool).unwrap_or(false);
    let include_usage = v
        .pointer("/stream_options/include_usage")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let limit = |v: Option<&Value>| -> Result<u32, String> {
        match v {
            None | Some(Value::Null) => Ok(default_max_tokens),
            Some(n) => n
                .as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| format!("token limit must be a non-negative integer, got {n}")),
        }
    };
    let (prompt, max_tokens) = match api {
        Api::Chat => {
            let messages = v
                .get("messages")
                .and_then(Value::as_array)
                .ok_or("`messages` must be an array")?;
            // The prompt is the messages' text joined by newlines: a chat template would add a few
            // tokens per message, which does not change anything the simulation is for.
            let mut prompt = String::new();
            for m in messages {
                let text = match m.get("content") {
                    Some(Value::String(s)) => s.clone(),
                    Some(Value::Array(parts)) => parts
                        .iter()
                        .filter_map(|p| p.get("text").and_then(Value::as_str))
                        .collect::<Vec<_>>()
                        .join("\n"),
                    _ => String::new(),
                };
                if !prompt.is_empty() {
                    prompt.push('\n');
                }
                prompt.push_str(&text);
            }
            let max = v
                .get("max_completion_tokens")
                .or_else(|| v.get("max_tokens"));
            (prompt, limit(max)?)
        }
        Api::Completion => {
            let prompt = match v.get("prompt") {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Array(items)) => items
                    .iter()
                    .filter_map(Value::as_str)
                    .collect::<Vec<_>>()
                    .join("\n"),
                _ => return Err("`prompt` must be a string".into()),
            };
            (prompt, limit(v.get("max_tokens"))?)
        }
        Api::Generate => {
            let text = v
                .get("text")
                .and_then(Value::as_str)
                .ok_or("`text` must be a string")?;
            (
                text.to_owned(),
                limit(v.pointer("/sampling_params/max_new_tokens"))?,
            )
        }
    };
    Ok(Job {
        api,
        prompt,
        max_tokens,
        stream,
        include_usage,
    })
}

fn error_response(status: StatusCode, message: &str) -> Response {
    let body = json!({
        "error": {
            "message": message,
            "type": if status.is_server_error() { "server_error" } else { "invalid_request_error" },
            "code": status.as_u16(),
        }
    });
    (status, axum::Json(body)).into_response()
}

async fn chat_completions(State(shared): State<Arc<Shared>>, body: Bytes) -> Response {
    serve_inference(shared, Api::Chat, body).await
}

async fn completions(State(shared): State<Arc<Shared>>, body: Bytes) -> Response {
    serve_inference(shared, Api::Completion, body).await
}

async fn generate(State(shared): State<Arc<Shared>>, body: Bytes) -> Response {
    serve_inference(shared, Api::Generate, body).await
}

async fn health(State(shared): State<Arc<Shared>>) -> Response {
    if *shared.fault.borrow() == Fault::Status500 {
        return error_response(
            StatusCode::INTERNAL_SERVER_ERROR,
            "injected fault: engine is down",
        );
    }
    StatusCode::OK.into_response()
}

async fn models(State(shared): State<Arc<Shared>>) -> Response {
    if *shared.fault.borrow() == Fault::Status500 {
        return error_response(
            StatusCode::INTERNAL_SERVER_ERROR,
            "injected fault: engine is down",
        );
    }
    axum::Json(json!({
        "object": "list",
        "data": [{"id": shared.config.model, "object": "model", "created": 0, "owned_by": "bch-drill"}],
    }))
    .into_response()
}

async fn metrics(State(shared): State<Arc<Shared>>) -> Response {
    let mut text = String::new();
    if let Err(e) = prometheus_client::encoding::text::encode(&mut text, &shared.metrics.registry) {
        return error_response(
            StatusCode::INTERNAL_SERVER_ERROR,
            &format!("encoding metrics: {e}"),
        );
    }
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

/// Applies the injected fault: `Some(response)` answers the request, `None` lets it proceed.
async fn injected_fault(shared: &Shared) -> Option<Response> {
    let mut fault = shared.fault.subscribe();
    loop {
        match *fault.borrow_and_update() {
            Fault::None => return None,
            Fault::Status500 => {
                return Some(error_response(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "injected fault: engine is down",
                ));
            }
            Fault::StallFirstByte => {}
        }
        tokio::select! {
            () = shared.cancel.cancelled() => {
                return Some(error_response(StatusCode::SERVICE_UNAVAILABLE, "worker shutting down"));
            }
            changed = fault.changed() => {
                // The sender lives in `shared`, so this cannot fail while we hold `shared`.
                if changed.is_err() {
                    return None;
                }
            }
        }
    }
}

async fn serve_inference(shared: Arc<Shared>, api: Api, body: Bytes) -> Response {
    shared.metrics.requests.inc();
    if let Some(response) = injected_fault(&shared).await {
        return response;
    }
    let job = match parse_job(api, &body, shared.config.default_max_tokens) {
        Ok(job) => job,
        Err(message) => return error_response(StatusCode::BAD_REQUEST, &message),
    };
    let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
    let generation = Generation::new(shared, &job.prompt, job.max_tokens);
    let ids = ResponseIds::new(api, &generation.shared, id);
    if job.stream {
        stream_response(generation, job, ids)
    } else {
        full_response(generation, job, ids).await
    }
}

/// Holds a `waiting` gauge increment for as long as a request is queued, even if it is cancelled.
struct Queued<'a>(&'a Gauge);

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// A batch slot: the semaphore permit plus the `running` gauge, released together on drop (also when
/// the client disconnects mid-stream and the body is dropped).
struct BatchSlot {
    _permit: OwnedSemaphorePermit,
    running: Gauge,
}

impl Drop for BatchSlot {
    fn drop(&mut self) {
        self.running.dec();
    }
}

/// Token usage in the shape OpenAI and vLLM report.
#[derive(Clone, Copy, Debug, Serialize)]
struct Usage {
    prompt_tokens: usize,
    completion_tokens: u32,
    total_tokens: usize,
    prompt_tokens_details: PromptTokensDetails,
}

#[derive(Clone, Copy, Debug, Serialize)]
struct PromptTokensDetails {
    cached_tokens: usize,
}

/// One request moving through the simulated engine.
struct Generation {
    shared: Arc<Shared>,
    tokens: Vec<u32>,
    max_tokens: u32,
    produced: u32,
    words: OutputWords,
    text: String,
    cached_tokens: usize,
    slot: Option<BatchSlot>,
    /// Where simulated time has got to. Sleeping *until* this deadline, rather than *for* each step,
    /// keeps timer rounding (tokio rounds up to 1 ms) from accumulating over many short scaled steps.
    clock: Instant,
}

impl Generation {
    fn new(shared: Arc<Shared>, prompt: &str, max_tokens: u32) -> Self {
        let tokens = tokenize(prompt);
        let words = OutputWords::new(shared.config.seed, &tokens);
        Self {
            shared,
            tokens,
            max_tokens,
            produced: 0,
            words,
            text: String::new(),
            cached_tokens: 0,
            slot: None,
            clock: Instant::now(),
        }
    }

    async fn advance(&mut self, simulated: Duration) {
        if let Some(wall) = self.shared.config.scaled(simulated) {
            self.clock += wall;
            tokio::time::sleep_until(self.clock).await;
        }
    }

    /// Queues for a batch slot, then prefills the uncached part of the prompt.
    async fn admit(&mut self) {
        let shared = self.shared.clone();
        let metrics = &shared.metrics;
        let permit = {
            metrics.waiting.inc();
            let _queued = Queued(&metrics.waiting);
            // tokio's semaphore is fair: slots go to waiters in arrival order, the FIFO queue.
            shared
                .batch
                .clone()
                .acquire_owned()
                .await
                .expect("the batch semaphore is never closed")
        };
        metrics.running.inc();
        self.slot = Some(BatchSlot {
            _permit: permit,
            running: metrics.running.clone(),
        });
        self.clock = Instant::now();

        self.cached_tokens = shared.cache().lookup(&self.tokens);
        metrics.prompt_tokens.inc_by(self.tokens.len() as u64);
        metrics.cached_tokens.inc_by(self.cached_tokens as u64);
        let uncached = self.tokens.len() - self.cached_tokens;
        self.advance(shared.config.prefill_time(uncached)).await;
        // Blocks become reusable once computed, as in SGLang's radix cache: concurrent siblings that
        // were admitted during this prefill do not hit them.
        shared.cache().insert(&self.tokens);
    }

    /// The next token: the first comes right after prefill, each later one after a decode step whose
    /// length depends on the running batch at that moment.
    async fn next_token(&mut self) -> Option<&'static str> {
        if self.produced >= self.max_tokens {
            return None;
        }
        if self.produced > 0 {
            let running = self.shared.metrics.running.get().max(1) as usize;
            self.advance(self.shared.config.decode_step_time(running))
                .await;
        }
        self.produced += 1;
        self.shared.metrics.generation_tokens.inc();
        let word = self.words.next_word();
        if !self.text.is_empty() {
            self.text.push(' ');
        }
        self.text.push_str(word);
        Some(word)
    }

    /// Releases the batch slot and counts the request as completed.
    fn finish(&mut self) {
        self.slot = None;
        self.shared.metrics.success.inc();
    }

    fn usage(&self) -> Usage {
        Usage {
            prompt_tokens: self.tokens.len(),
            completion_tokens: self.produced,
            total_tokens: self.tokens.len() + self.produced as usize,
            prompt_tokens_details: PromptTokensDetails {
                cached_tokens: self.cached_tokens,
            },
        }
    }

    /// SGLang's `meta_info` for `/generate`.
    fn meta_info(&self, id: &str, finished: bool) -> Value {
        json!({
            "id": id,
            "prompt_tokens": self.tokens.len(),
            "completion_tokens": self.produced,
            "cached_tokens": self.cached_tokens,
            "finish_reason": if finished {
                json!({"type": "length", "length": self.produced})
            } else {
                Value::Null
            },
        })
    }
}

/// Identity fields shared by every chunk of one response.
struct ResponseIds {
    id: String,
    created: u64,
    model: String,
}

impl ResponseIds {
    fn new(api: Api, shared: &Shared, n: u64) -> Self {
        let prefix = match api {
            Api::Chat => "chatcmpl",
            Api::Completion => "cmpl",
            Api::Generate => "gen",
        };
        Self {
            id: format!("{prefix}-{}-{n}", shared.name),
            created: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            model: shared.config.model.clone(),
        }
    }
}

/// Every completion stops at its token limit: the simulated model never emits an end-of-sequence.
const FINISH_REASON: &str = "length";

async fn full_response(mut generation: Generation, job: Job, ids: ResponseIds) -> Response {
    generation.admit().await;
    while generation.next_token().await.is_some() {}
    generation.finish();
    let usage = generation.usage();
    let body = match job.api {
        Api::Chat => json!({
            "id": ids.id,
            "object": "chat.completion",
            "created": ids.created,
            "model": ids.model,
            "choices": [{
                "index": 0,
                "message": {"role": "assistant", "content": generation.text},
                "finish_reason": FINISH_REASON,
            }],
            "usage": usage,
        }),
        Api::Completion => json!({
            "id": ids.id,
            "object": "text_completion",
            "created": ids.created,
            "model": ids.model,
            "choices": [{
                "index": 0,
                "text": generation.text,
                "logprobs": null,
                "finish_reason": FINISH_REASON,
            }],
            "usage": usage,
        }),
        Api::Generate => json!({
            "text": generation.text,
            "meta_info": generation.meta_info(&ids.id, true),
        }),
    };
    axum::Json(body).into_response()
}

/// Where a stream is.
enum Phase {
    /// Queue and prefill, then the first token.
    Start,
    /// One decode step per chunk.
    Decode,
    /// The usage chunk (only when requested).
    Usage,
    /// `data: [DONE]`.
    Done,
    /// Nothing more.
    End,
}

struct StreamState {
    generation: Generation,
    job: Job,
    ids: ResponseIds,
    phase: Phase,
}

fn sse(value: &Value) -> Bytes {
    let mut frame = Vec::with_capacity(256);
    frame.extend_from_slice(b"data: ");
    // Serialising a `Value` cannot fail.
    serde_json::to_writer(&mut frame, value).expect("JSON value serialises");
    frame.extend_from_slice(b"\n\n");
    Bytes::from(frame)
}

impl StreamState {
    fn token_chunk(&self, piece: &str, first: bool) -> Bytes {
        let ids = &self.ids;
        match self.job.api {
            Api::Chat => {
                let delta = if first {
                    json!({"role": "assistant", "content": piece})
                } else {
                    json!({"content": piece})
                };
                sse(&json!({
                    "id": ids.id, "object": "chat.completion.chunk", "created": ids.created,
                    "model": ids.model,
                    "choices": [{"index": 0, "delta": delta, "finish_reason": null}],
                }))
            }
            Api::Completion => sse(&json!({
                "id": ids.id, "object": "text_completion", "created": ids.created, "model": ids.model,
                "choices": [{"index": 0, "text": piece, "logprobs": null, "finish_reason": null}],
            })),
            // SGLang streams the cumulative text in every chunk.
            Api::Generate => sse(&json!({
                "text": self.generation.text,
                "meta_info": self.generation.meta_info(&ids.id, false),
            })),
        }
    }

    fn finish_chunk(&self) -> Bytes {
        let ids = &self.ids;
        match self.job.api {
            Api::Chat => sse(&json!({
                "id": ids.id, "object": "chat.completion.chunk", "created": ids.created,
                "model": ids.model,
                "choices": [{"index": 0, "delta": {}, "finish_reason": FINISH_REASON}],
            })),
            Api::Completion => sse(&json!({
                "id": ids.id, "object": "text_completion", "created": ids.created, "model": ids.model,
                "choices": [{"index": 0, "text": "", "logprobs": null, "finish_reason": FINISH_REASON}],
            })),
            Api::Generate => sse(&json!({
                "text": self.generation.text,
                "meta_info": self.generation.meta_info(&ids.id, true),
            })),
        }
    }

    fn usage_chunk(&self) -> Bytes {
        let ids = &self.ids;
        let object = match self.job.api {
            Api::Chat => "chat.completion.chunk",
            _ => "text_completion",
        };
        sse(&json!({
            "id": ids.id, "object": object, "created": ids.created, "model": ids.model,
            "choices": [], "usage": self.generation.usage(),
        }))
    }

    /// The next SSE frame, or `None` at the end of the stream.
    async fn next_frame(&mut self) -> Option<Bytes> {
        match self.phase {
            Phase::Start => {
                self.generation.admit().await;
                self.phase = Phase::Decode;
                // The first chunk goes out right after prefill, even for a zero-token limit, so the
                // client sees TTFT = queueing + prefill.
                let word = self.generation.next_token().await.unwrap_or("");
                Some(self.token_chunk(word, true))
            }
            Phase::Decode => match self.generation.next_token().await {
                Some(word) => Some(self.token_chunk(&format!(" {word}"), false)),
                None => {
                    self.generation.finish();
                    let wants_usage = self.job.include_usage && self.job.api != Api::Generate;
                    self.phase = if wants_usage {
                        Phase::Usage
                    } else {
                        Phase::Done
                    };
                    Some(self.finish_chunk())
                }
            },
            Phase::Usage => {
                self.phase = Phase::Done;
                Some(self.usage_chunk())
            }
            Phase::Done => {
                self.phase = Phase::End;
                Some(Bytes::from_static(b"data: [DONE]\n\n"))
            }
            Phase::End => None,
        }
    }
}

fn stream_response(generation: Generation, job: Job, ids: ResponseIds) -> Response {
    let state = StreamState {
        generation,
        job,
        ids,
        phase: Phase::Start,
    };
    // Headers go out at once, as vLLM's streaming responses do; queueing and prefill happen while the
    // client already holds a 200, so TTFT is the first data chunk, not the headers.
    let frames = futures_util::stream::unfold(state, |mut state| async move {
        let frame = state.next_frame().await?;
        Some((Ok::<_, Infallible>(frame), state))
    });
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(frames))
        .expect("static response parts are valid")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chat_prompt_joins_message_contents() {
        let body = br#"{"messages":[{"role":"system","content":"be brief"},
            {"role":"user","content":[{"type":"text","text":"hello"},{"type":"text","text":"there"}]}],
            "max_tokens": 3, "stream": true, "stream_options": {"include_usage": true}}"#;
        let job = parse_job(Api::Chat, body, 16).unwrap();
        assert_eq!(job.prompt, "be brief\nhello\nthere");
        assert_eq!(job.max_tokens, 3);
        assert!(job.stream && job.include_usage);
    }

    #[test]
    fn generate_reads_sglang_sampling_params() {
        let body = br#"{"text":"abc","sampling_params":{"max_new_tokens":5}}"#;
        let job = parse_job(Api::Generate, body, 16).unwrap();
        assert_eq!(
            (job.prompt.as_str(), job.max_tokens, job.stream),
            ("abc", 5, false)
        );
        let job = parse_job(Api::Generate, br#"{"text":"abc"}"#, 16).unwrap();
        assert_eq!(job.max_tokens, 16);
    }

    #[test]
    fn bad_bodies_are_rejected_with_a_reason() {
        assert!(
            parse_job(Api::Chat, b"{", 16)
                .unwrap_err()
                .contains("invalid JSON")
        );
        assert!(
            parse_job(Api::Chat, b"{}", 16)
                .unwrap_err()
                .contains("messages")
        );
        assert!(
            parse_job(Api::Completion, b"{}", 16)
                .unwrap_err()
                .contains("prompt")
        );
        let neg = br#"{"prompt":"x","max_tokens":-1}"#;
        assert!(
            parse_job(Api::Completion, neg, 16)
                .unwrap_err()
                .contains("token limit")
        );
    }
}
