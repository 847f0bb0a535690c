//! What every request of one worker shares: its configuration, prefix cache, batch slots and fault
//! switch, and the vLLM-named metrics that double as its live state; plus [`SimStats`], the snapshot
//! of those numbers that a worker's owner reads.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use serde::Serialize;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use super::engine::{Engine, EngineGauges};
use super::faults::FaultSwitch;
use crate::sim::SimConfig;

/// A snapshot of one simulated worker: counters since it started and the batch and cache as they are
/// now. Token counts are in simulated tokens (see docs/drill.md, "The model").
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

/// The metrics a worker exports on `/metrics`; they are also its live state (the gauges are the batch
/// occupancy that decode steps read).
pub(super) struct WorkerMetrics {
    pub(super) running: Gauge,
    pub(super) waiting: Gauge,
    /// KV-cache usage, 0 to 1 (engine mode; 0 in instant mode, where nothing holds blocks over
    /// time).
    pub(super) kv_usage: Gauge<f64, AtomicU64>,
    pub(super) requests: Counter,
    pub(super) success: Counter,
    pub(super) prompt_tokens: Counter,
    pub(super) cached_tokens: Counter,
    pub(super) generation_tokens: Counter,
    pub(super) registry: Registry,
}

impl WorkerMetrics {
    fn new() -> Self {
        let mut m = Self {
            running: Gauge::default(),
            waiting: Gauge::default(),
            kv_usage: Gauge::default(),
            requests: Counter::default(),
            success: Counter::default(),
            prompt_tokens: Counter::default(),
            cached_tokens: Counter::default(),
            generation_tokens: Counter::default(),
            registry: Registry::default(),
        };
        m.register();
        m
    }

    /// vLLM's names, so dashboards and gateways that scrape vLLM read the simulator unchanged.
    /// Counters get their `_total` suffix from the encoder.
    fn register(&mut self) {
        let r = &mut self.registry;
        r.register(
            "vllm:num_requests_running",
            "Requests in the running batch",
            self.running.clone(),
        );
        r.register(
            "vllm:num_requests_waiting",
            "Requests waiting for a batch slot",
            self.waiting.clone(),
        );
        r.register(
            "vllm:kv_cache_usage_perc",
            "KV-cache usage: blocks held by running requests over the cache's blocks, 0 to 1",
            self.kv_usage.clone(),
        );
        r.register(
            "bch_sim:requests",
            "Inference requests received",
            self.requests.clone(),
        );
        r.register(
            "vllm:request_success",
            "Requests finished",
            self.success.clone(),
        );
        r.register(
            "vllm:prompt_tokens",
            "Prompt tokens of admitted requests",
            self.prompt_tokens.clone(),
        );
        r.register(
            "vllm:prefix_cache_hits",
            "Prompt tokens served from the prefix cache (cached tokens)",
            self.cached_tokens.clone(),
        );
        r.register(
            "vllm:generation_tokens",
            "Completion tokens produced",
            self.generation_tokens.clone(),
        );
    }
}

/// One worker's state, behind an `Arc` held by its handle, its router and every request in flight.
pub(super) struct Shared {
    pub(super) name: String,
    pub(super) config: SimConfig,
    /// The scheduler and the prefix cache (the cache is used by instant mode too).
    pub(super) engine: Arc<Engine>,
    /// Instant mode only, where no engine task runs: `max_batch` permits, holding one is being in
    /// the running batch.
    pub(super) batch: Arc<Semaphore>,
    pub(super) metrics: WorkerMetrics,
    pub(super) fault: FaultSwitch,
    /// Fired on shutdown: stops the server and releases stalled requests.
    pub(super) cancel: CancellationToken,
    /// Numbers response ids, so every response of a worker has its own.
    pub(super) next_id: AtomicU64,
}

impl Shared {
    /// Fresh state for a worker named `name`: empty cache, idle batch, no fault.
    pub(super) fn new(name: String, config: SimConfig) -> Self {
        Self {
            engine: Arc::new(Engine::new(config.block_size, config.cache_capacity_blocks)),
            batch: Arc::new(Semaphore::new(config.max_batch)),
            metrics: WorkerMetrics::new(),
            fault: FaultSwitch::new(),
            cancel: CancellationToken::new(),
            next_id: AtomicU64::new(0),
            name,
            config,
        }
    }

    /// The gauges and counters the engine keeps current.
    pub(super) fn engine_gauges(&self) -> EngineGauges {
        let m = &self.metrics;
        EngineGauges {
            running: m.running.clone(),
            waiting: m.waiting.clone(),
            prompt_tokens: m.prompt_tokens.clone(),
            cached_tokens: m.cached_tokens.clone(),
            kv_usage: m.kv_usage.clone(),
        }
    }

    /// The numbers behind [`SimStats`], read now.
    pub(super) fn stats(&self) -> SimStats {
        let m = &self.metrics;
        SimStats {
            requests_total: m.requests.get(),
            completed_total: m.success.get(),
            prompt_tokens_total: m.prompt_tokens.get(),
            cached_tokens_total: m.cached_tokens.get(),
            completion_tokens_total: m.generation_tokens.get(),
            running: m.running.get().max(0) as u64,
            waiting: m.waiting.get().max(0) as u64,
            cached_blocks: self.engine.lock().cache.len(),
        }
    }
}
