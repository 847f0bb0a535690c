//! One request's life inside the simulated engine, on simulated time: a FIFO wait for one of
//! `max_batch` slots, the prefix-cache lookup, prefill of the uncached tokens, then one token per
//! decode step whose length grows with the running batch (docs/drill.md, "The model").

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::metrics::gauge::Gauge;
use serde::Serialize;
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Instant;

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
    /// A request for `prompt` that will stop after `max_tokens` tokens; nothing happens until
    /// [`Generation::admit`].
    pub(super) fn new(shared: Arc<Shared>, prompt: &str, max_tokens: u32) -> Self {
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

    /// The completion so far, words separated by spaces.
    pub(super) fn text(&self) -> &str {
        &self.text
    }

    async fn advance(&mut self, simulated: Duration) {
        if let Some(wall) = self.shared.config.scaled(simulated) {
            self.clock += wall;
            tokio::time::sleep_until(self.clock).await;
        }
    }

    /// Queues for a batch slot, then prefills the uncached part of the prompt.
    pub(super) async fn admit(&mut self) {
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
    pub(super) async fn next_token(&mut self) -> Option<&'static str> {
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
    pub(super) fn finish(&mut self) {
        self.slot = None;
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
