//! The simulated engine's scheduler: one task per worker runs engine steps on simulated time, as a
//! continuous-batching engine with chunked prefill does (vLLM's scheduler, SGLang's).
//!
//! Every step, the queue is admitted first-in first-out up to `max_batch` running requests (a
//! request whose next prefix block another running request is computing is skipped until that
//! prefill ends, when `wait_for_shared_prefix` is set). Then the step carries one decode token for
//! each running request past its prefill and, in the budget of `chunk_tokens` left by them, prefill
//! chunks of the others in admission order. The step takes [`SimConfig::step_time`]; when it ends,
//! each decoding request gets its token, and a request whose prefill is complete gets its first
//! token and its prompt blocks enter the prefix cache. docs/drill.md, "The model", has the
//! equations.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::{Notify, mpsc};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::cache::PrefixCache;
use crate::sim::SimConfig;

/// What the engine tells a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Event {
    /// Prefill is done and the first token exists (for a zero-token limit: prefill is done);
    /// `cached` prompt tokens came from the prefix cache.
    First {
        /// Prompt tokens served from the prefix cache.
        cached: usize,
    },
    /// One more token was decoded.
    Token,
}

/// A request waiting for admission.
struct Waiting {
    tokens: Arc<[u32]>,
    max_tokens: u32,
    events: mpsc::UnboundedSender<Event>,
}

/// What a running request does in the step being run.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Work {
    Idle,
    Decode,
    Prefill(usize),
}

/// A request in the running batch.
struct Running {
    tokens: Arc<[u32]>,
    /// Its full prompt blocks (the usable chain): running requests that share a prefix hold its
    /// blocks once, as paged attention does.
    chain: Vec<u64>,
    /// Blocks this request computes and others may wait for (its uncached usable blocks).
    computing: Vec<u64>,
    cached: usize,
    /// Prompt tokens still to prefill.
    to_prefill: usize,
    max_tokens: u32,
    produced: u32,
    work: Work,
    events: mpsc::UnboundedSender<Event>,
}

/// The engine's state, behind one lock taken briefly to plan a step and to apply it.
pub(super) struct EngineState {
    pub(super) cache: PrefixCache,
    waiting: VecDeque<Waiting>,
    running: Vec<Running>,
    /// Block hash → running requests computing it.
    computing: HashMap<u64, usize>,
    /// KV blocks the worker has, for the usage gauge (the prefix cache's capacity).
    capacity_blocks: usize,
}

/// Counts a step's work, for its duration.
struct Step {
    decoding: usize,
    prefill_tokens: usize,
}

/// One worker's engine: the state and the signal that wakes an idle engine.
pub(super) struct Engine {
    state: Mutex<EngineState>,
    wake: Notify,
}

/// Gauges the engine keeps current (also the worker's `/metrics`).
pub(super) struct EngineGauges {
    pub(super) running: prometheus_client::metrics::gauge::Gauge,
    pub(super) waiting: prometheus_client::metrics::gauge::Gauge,
    pub(super) prompt_tokens: prometheus_client::metrics::counter::Counter,
    pub(super) cached_tokens: prometheus_client::metrics::counter::Counter,
    /// KV-cache usage, 0 to 1: see [`EngineState::kv_usage`].
    pub(super) kv_usage:
        prometheus_client::metrics::gauge::Gauge<f64, std::sync::atomic::AtomicU64>,
}

impl Engine {
    /// An idle engine with an empty cache of `capacity_blocks` blocks of `block_size` tokens.
    pub(super) fn new(block_size: usize, capacity_blocks: usize) -> Self {
        Self {
            state: Mutex::new(EngineState {
                cache: PrefixCache::new(block_size, capacity_blocks),
                waiting: VecDeque::new(),
                running: Vec::new(),
                computing: HashMap::new(),
                capacity_blocks,
            }),
            wake: Notify::new(),
        }
    }

    /// The state, locked. A panic while holding the lock cannot leave it in a state that matters
    /// for a simulation, so a poisoned lock is reused.
    pub(super) fn lock(&self) -> MutexGuard<'_, EngineState> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Queues a request for `tokens` that stops after `max_tokens` tokens; its events arrive on
    /// the returned channel. Dropping the receiver withdraws the request (queued or running).
    pub(super) fn submit(
        &self,
        tokens: Arc<[u32]>,
        max_tokens: u32,
        gauges: &EngineGauges,
    ) -> mpsc::UnboundedReceiver<Event> {
        let (events, receiver) = mpsc::unbounded_channel();
        {
            let mut state = self.lock();
            state.waiting.push_back(Waiting {
                tokens,
                max_tokens,
                events,
            });
            gauges.waiting.set(state.waiting.len() as i64);
        }
        self.wake.notify_one();
        receiver
    }
}

impl EngineState {
    /// Admits queued requests, first come first served, up to `max_batch` running; skips (and keeps
    /// queued) one whose next block a running request is computing, when the config says to wait.
    fn admit(&mut self, config: &SimConfig, gauges: &EngineGauges) {
        self.waiting.retain(|w| !w.events.is_closed());
        let mut index = 0;
        while index < self.waiting.len() && self.running.len() < config.max_batch {
            let chain = self.cache.usable_chain(&self.waiting[index].tokens);
            let hits = self.cache.peek(&chain);
            let shared_in_flight = chain
                .get(hits)
                .is_some_and(|next| self.computing.contains_key(next));
            if config.wait_for_shared_prefix && shared_in_flight {
                index += 1;
                continue;
            }
            let waiting = self.waiting.remove(index).expect("index is in range");
            let hits = self.cache.hit(&chain);
            let cached = hits * self.cache.block_size();
            let computing = chain[hits..].to_vec();
            let chain_blocks = chain;
            for block in &computing {
                *self.computing.entry(*block).or_insert(0) += 1;
            }
            gauges.prompt_tokens.inc_by(waiting.tokens.len() as u64);
            gauges.cached_tokens.inc_by(cached as u64);
            self.running.push(Running {
                to_prefill: waiting.tokens.len() - cached,
                tokens: waiting.tokens,
                chain: chain_blocks,
                computing,
                cached,
                max_tokens: waiting.max_tokens,
                produced: 0,
                work: Work::Idle,
                events: waiting.events,
            });
        }
        gauges.waiting.set(self.waiting.len() as i64);
        gauges.running.set(self.running.len() as i64);
        gauges.kv_usage.set(self.kv_usage());
    }

    /// KV-cache usage, 0 to 1: the blocks the running requests hold (their prompts and the tokens
    /// decoded so far, a shared prefix counted once) over the cache's capacity, as vLLM's
    /// `kv_cache_usage_perc` counts them. Cached blocks no running request holds count as free,
    /// as in vLLM, where they are evictable; with the cache disabled (capacity 0), 0.
    pub(super) fn kv_usage(&self) -> f64 {
        if self.capacity_blocks == 0 {
            return 0.0;
        }
        let block = self.cache.block_size();
        let mut shared = std::collections::HashSet::new();
        let mut own = 0;
        for request in &self.running {
            shared.extend(request.chain.iter().copied());
            let held = (request.tokens.len() + request.produced as usize).div_ceil(block);
            own += held.saturating_sub(request.chain.len());
        }
        ((shared.len() + own) as f64 / self.capacity_blocks as f64).min(1.0)
    }

    /// Decides what each running request does in the next step; `None` when nothing runs.
    fn plan(&mut self, config: &SimConfig) -> Option<Step> {
        if self.running.is_empty() {
            return None;
        }
        let decoding = self.running.iter().filter(|r| r.to_prefill == 0).count();
        // Decodes first, as vLLM and SGLang schedule them; should they fill the budget (a
        // `chunk_tokens` below `max_batch`), prefill still advances a token a step.
        let mut budget = config.chunk_tokens.saturating_sub(decoding).max(1);
        let mut prefill_tokens = 0;
        for request in &mut self.running {
            request.work = if request.to_prefill == 0 {
                Work::Decode
            } else {
                let chunk = request.to_prefill.min(budget);
                budget -= chunk;
                prefill_tokens += chunk;
                if chunk == 0 {
                    Work::Idle
                } else {
                    Work::Prefill(chunk)
                }
            };
        }
        Some(Step {
            decoding,
            prefill_tokens,
        })
    }

    /// Applies the step just run: tokens to decoders, first tokens (and cache blocks) to finished
    /// prefills; retires requests that are done or whose client has gone.
    fn apply(&mut self, gauges: &EngineGauges) {
        let mut index = 0;
        while index < self.running.len() {
            let keep = self.advance(index);
            if keep {
                index += 1;
            } else {
                // `remove`, not `swap_remove`: the running order is the admission order, which
                // decides who gets prefill budget first.
                let done = self.running.remove(index);
                self.stop_computing(&done.computing);
            }
        }
        gauges.running.set(self.running.len() as i64);
        gauges.kv_usage.set(self.kv_usage());
    }

    /// Advances running request `index` by its step; false when it is finished or abandoned.
    fn advance(&mut self, index: usize) -> bool {
        let request = &mut self.running[index];
        match request.work {
            Work::Idle => !request.events.is_closed(),
            Work::Decode => {
                request.produced += 1;
                let sent = request.events.send(Event::Token).is_ok();
                sent && request.produced < request.max_tokens
            }
            Work::Prefill(chunk) => {
                request.to_prefill -= chunk;
                if request.to_prefill > 0 {
                    return !request.events.is_closed();
                }
                // Blocks become reusable once computed, as in SGLang's radix cache.
                let tokens = request.tokens.clone();
                let computing = std::mem::take(&mut request.computing);
                let cached = request.cached;
                let sent = request.events.send(Event::First { cached }).is_ok();
                request.produced = request.max_tokens.min(1);
                let more = request.produced < request.max_tokens;
                self.cache.insert(&tokens);
                self.stop_computing(&computing);
                sent && more
            }
        }
    }

    fn stop_computing(&mut self, blocks: &[u64]) {
        for block in blocks {
            if let Some(count) = self.computing.get_mut(block) {
                *count -= 1;
                if *count == 0 {
                    self.computing.remove(block);
                }
            }
        }
    }
}

/// Runs the engine of one worker until `cancel` fires and nothing is left to run.
///
/// Time: each step's simulated duration, scaled, is added to a clock that starts when an idle
/// engine gets work, and the task sleeps until the clock (absolute deadlines, so timer rounding does
/// not accumulate over many short steps). Never called in instant mode.
pub(super) async fn run(
    engine: Arc<Engine>,
    config: SimConfig,
    gauges: EngineGauges,
    cancel: CancellationToken,
) {
    let mut clock = Instant::now();
    let mut idle = true;
    loop {
        let step = {
            let mut state = engine.lock();
            state.admit(&config, &gauges);
            state.plan(&config)
        };
        let Some(step) = step else {
            if cancel.is_cancelled() {
                return;
            }
            idle = true;
            tokio::select! {
                () = engine.wake.notified() => {}
                () = cancel.cancelled() => {}
            }
            continue;
        };
        if idle {
            clock = Instant::now();
            idle = false;
        }
        let simulated = config.step_time(step.decoding, step.prefill_tokens);
        if let Some(wall) = config.scaled(simulated) {
            clock += wall;
            tokio::time::sleep_until(clock).await;
        }
        engine.lock().apply(&gauges);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::metrics::counter::Counter;
    use prometheus_client::metrics::gauge::Gauge;

    fn gauges() -> EngineGauges {
        EngineGauges {
            running: Gauge::default(),
            waiting: Gauge::default(),
            prompt_tokens: Counter::default(),
            cached_tokens: Counter::default(),
            kv_usage: Gauge::default(),
        }
    }

    fn prompt(first: u32, len: usize) -> Arc<[u32]> {
        (first..first + len as u32).collect::<Vec<_>>().into()
    }

    /// Plans, "runs" and applies one step without a clock; answers the step's work.
    fn step(state: &mut EngineState, config: &SimConfig, gauges: &EngineGauges) -> (usize, usize) {
        state.admit(config, gauges);
        let step = state.plan(config).expect("work to do");
        state.apply(gauges);
        (step.decoding, step.prefill_tokens)
    }

    #[test]
    fn a_long_prefill_is_chunked_and_decodes_ride_along() {
        let config = SimConfig {
            chunk_tokens: 100,
            max_batch: 4,
            block_size: 4,
            ..SimConfig::default()
        };
        let engine = Engine::new(4, 1000);
        let g = gauges();
        let mut short = engine.submit(prompt(0, 10), 5, &g);
        let mut state = engine.lock();
        assert_eq!(step(&mut state, &config, &g), (0, 10));
        assert_eq!(short.try_recv(), Ok(Event::First { cached: 0 }));
        drop(state);
        let mut long = engine.submit(prompt(1000, 250), 2, &g);
        let mut state = engine.lock();
        // The short request decodes one token a step; the long one gets the rest of the budget.
        assert_eq!(step(&mut state, &config, &g), (1, 99));
        assert_eq!(step(&mut state, &config, &g), (1, 99));
        assert!(long.try_recv().is_err(), "still prefilling");
        assert_eq!(step(&mut state, &config, &g), (1, 52));
        assert_eq!(long.try_recv(), Ok(Event::First { cached: 0 }));
        assert_eq!(
            (0..3)
                .map(|_| short.try_recv().unwrap())
                .collect::<Vec<_>>(),
            [Event::Token; 3]
        );
        assert_eq!(step(&mut state, &config, &g), (2, 0));
        // The short request has its five tokens and left; the long one its two.
        assert_eq!(short.try_recv(), Ok(Event::Token));
        assert_eq!(long.try_recv(), Ok(Event::Token));
        assert!(state.plan(&config).is_none());
        assert_eq!((g.running.get(), g.waiting.get()), (0, 0));
    }

    #[test]
    fn a_sibling_waits_for_the_prefix_being_computed_then_hits_it() {
        let config = SimConfig {
            block_size: 4,
            ..SimConfig::default()
        };
        let engine = Engine::new(4, 1000);
        let g = gauges();
        let shared: Vec<u32> = (0..40).collect();
        let sibling = |tail: u32| -> Arc<[u32]> {
            shared
                .iter()
                .copied()
                .chain([tail, tail + 1])
                .collect::<Vec<_>>()
                .into()
        };
        let mut a = engine.submit(sibling(100), 1, &g);
        let mut b = engine.submit(sibling(200), 1, &g);
        let mut state = engine.lock();
        // Only the first computes the shared 40 tokens; the second waits in the queue.
        assert_eq!(step(&mut state, &config, &g), (0, 42));
        assert_eq!(a.try_recv(), Ok(Event::First { cached: 0 }));
        assert!(b.try_recv().is_err());
        // Then the second hits all ten shared blocks and prefills its own two tokens.
        assert_eq!(step(&mut state, &config, &g), (0, 2));
        assert_eq!(b.try_recv(), Ok(Event::First { cached: 40 }));
        assert_eq!((g.prompt_tokens.get(), g.cached_tokens.get()), (84, 40));

        // Without waiting, both compute the prefix in the same step and neither hits.
        let config = SimConfig {
            wait_for_shared_prefix: false,
            ..config
        };
        let engine = Engine::new(4, 1000);
        let mut a = engine.submit(sibling(300), 1, &g);
        let mut b = engine.submit(sibling(400), 1, &g);
        drop(state);
        let mut state = engine.lock();
        assert_eq!(step(&mut state, &config, &g), (0, 84));
        assert_eq!(a.try_recv(), Ok(Event::First { cached: 0 }));
        assert_eq!(b.try_recv(), Ok(Event::First { cached: 0 }));
    }

    #[test]
    fn a_gone_client_frees_its_slot() {
        let config = SimConfig {
            max_batch: 1,
            ..SimConfig::default()
        };
        let engine = Engine::new(16, 100);
        let g = gauges();
        let first = engine.submit(prompt(0, 8), 100, &g);
        let mut second = engine.submit(prompt(50, 8), 1, &g);
        let mut state = engine.lock();
        assert_eq!(step(&mut state, &config, &g), (0, 8));
        assert_eq!((g.running.get(), g.waiting.get()), (1, 1));
        drop(first);
        assert_eq!(step(&mut state, &config, &g), (1, 0));
        assert_eq!(step(&mut state, &config, &g), (0, 8));
        assert_eq!(second.try_recv(), Ok(Event::First { cached: 0 }));
    }

    #[test]
    fn kv_usage_counts_the_running_blocks_a_shared_prefix_once_and_frees_them_at_the_end() {
        let config = SimConfig {
            block_size: 4,
            wait_for_shared_prefix: false,
            ..SimConfig::default()
        };
        let engine = Engine::new(4, 20);
        let g = gauges();
        let sibling =
            |tail: u32| -> Arc<[u32]> { (0..8).chain([tail]).collect::<Vec<u32>>().into() };
        let _a = engine.submit(sibling(100), 3, &g);
        let _b = engine.submit(sibling(200), 3, &g);
        let mut state = engine.lock();
        // Prefilled, first token out: the two shared 4-token blocks once, and each request's
        // last prompt token and first output token in a block of its own: 4 of 20 blocks.
        step(&mut state, &config, &g);
        assert_eq!(g.kv_usage.get(), 0.2);
        // A decoded token more each, in the same blocks; the third retires both.
        step(&mut state, &config, &g);
        assert_eq!(g.kv_usage.get(), 0.2);
        step(&mut state, &config, &g);
        assert_eq!((g.running.get(), g.kv_usage.get()), (0, 0.0));
        // The cache keeps their blocks, but no running request holds them: free, as in vLLM.
        assert_ne!(state.cache.len(), 0);
        assert_eq!(state.kv_usage(), 0.0);
    }
}
