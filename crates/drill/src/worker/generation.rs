//! One request's life inside the simulated engine: submitted to the worker's engine (which queues,
//! looks the prompt up in the prefix cache, prefills it in chunks and decodes one token per step,
//! on simulated time; docs/drill.md, "The model"), then read token by token by the response. In
//! instant mode there is no engine task: admission, lookup and generation happen at once.

use std::sync::Arc;

use prometheus_client::metrics::gauge::Gauge;
use serde::Serialize;
use tokio::sync::{OwnedSemaphorePermit, mpsc};

use super::engine::Event;
use super::state::Shared;
use crate::sim::{OutputWords, tokenize};

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

/// Token usage of one request, in tokens, serialised in the shape OpenAI and vLLM report.
#[derive(Clone, Copy, Debug, Serialize)]
pub(super) struct Usage {
    pub(super) prompt_tokens: usize,
    pub(super) completion_tokens: u32,
    pub(super) total_tokens: usize,
    pub(super) prompt_tokens_details: PromptTokensDetails,
}

/// `usage.prompt_tokens_details`: how much of the prompt the prefix cache served.
#[derive(Clone, Copy, Debug, Serialize)]
pub(super) struct PromptTokensDetails {
    pub(super) cached_tokens: usize,
}

/// One request moving through the simulated engine.
pub(super) struct Generation {
    shared: Arc<Shared>,
    tokens: Arc<[u32]>,
    max_tokens: u32,
    produced: u32,
    words: OutputWords,
    text: String,
    cached_tokens: usize,
    /// Engine mode: the engine's events for this request, once submitted.
    events: Option<mpsc::UnboundedReceiver<Event>>,
    /// Instant mode: the batch slot held.
    slot: Option<BatchSlot>,
}

impl Generation {
    /// A request for `prompt` that will stop after `max_tokens` tokens; nothing happens until
    /// [`Generation::admit`].
    pub(super) fn new(shared: Arc<Shared>, prompt: &str, max_tokens: u32) -> Self {
        let tokens: Arc<[u32]> = tokenize(prompt).into();
        let words = OutputWords::new(shared.config.seed, &tokens);
        Self {
            shared,
            tokens,
            max_tokens,
            produced: 0,
            words,
            text: String::new(),
            cached_tokens: 0,
            events: None,
            slot: None,
        }
    }

    /// The completion so far, words separated by spaces.
    pub(super) fn text(&self) -> &str {
        &self.text
    }

    /// Waits until the prompt is prefilled: queued for the running batch, looked up in the prefix
    /// cache, and its uncached tokens computed by the engine's steps. In instant mode all of that
    /// happens at once.
    pub(super) async fn admit(&mut self) {
        if self.shared.config.is_instant() {
            self.admit_instantly().await;
            return;
        }
        let gauges = self.shared.engine_gauges();
        let mut events = self
            .shared
            .engine
            .submit(self.tokens.clone(), self.max_tokens, &gauges);
        // The engine only stops sending by finishing the request; a worker shutting down lets
        // in-flight requests run to the end.
        if let Some(Event::First { cached }) = events.recv().await {
            self.cached_tokens = cached;
        }
        self.events = Some(events);
    }

    /// Instant mode: a FIFO wait for a batch slot, the lookup and the cache insert, no time.
    async fn admit_instantly(&mut self) {
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
        let mut engine = shared.engine.lock();
        self.cached_tokens = engine.cache.lookup(&self.tokens);
        metrics.prompt_tokens.inc_by(self.tokens.len() as u64);
        metrics.cached_tokens.inc_by(self.cached_tokens as u64);
        engine.cache.insert(&self.tokens);
    }

    /// The next token: the first comes with the end of prefill, each later one with an engine step.
    pub(super) async fn next_token(&mut self) -> Option<&'static str> {
        if self.produced >= self.max_tokens {
            return None;
        }
        if self.produced > 0
            && let Some(events) = self.events.as_mut()
        {
            events.recv().await?;
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
    pub(super) fn finish(&mut self) {
        self.slot = None;
        self.events = None;
        self.shared.metrics.success.inc();
    }

    /// Tokens of the prompt, of the cache hit and of the completion so far.
    pub(super) fn usage(&self) -> Usage {
        Usage {
            prompt_tokens: self.tokens.len(),
            completion_tokens: self.produced,
            total_tokens: self.tokens.len() + self.produced as usize,
            prompt_tokens_details: PromptTokensDetails {
                cached_tokens: self.cached_tokens,
            },
        }
    }
}
