//! The simulated engine's model: tokenizer, timing and deterministic output.
//!
//! The model is deliberately small. What matters for routing experiments is that
//!
//! - a prompt whose prefix is already in the worker's prefix cache starts faster (TTFT is queueing plus
//!   prefill of the *uncached* tokens only), so keeping a routing key on one worker pays;
//! - a worker's prefill throughput (tokens/s) is shared by the prefills running at once, and decode
//!   steps of running requests wait while a prefill chunk runs, as in an engine step of vLLM or
//!   SGLang with chunked prefill: piling every request on one worker costs, which is what a spill
//!   trades against cache locality;
//! - a worker runs at most `max_batch` requests and queues the rest first-in first-out.
//!
//! The engine steps themselves run in `worker::engine`; this module holds the parameters, the step
//! time, the tokenizer and the output text. All durations are *simulated* and multiplied by
//! [`SimConfig::time_scale`] before sleeping. The equations and the calibration of the defaults are
//! in docs/drill.md, "The model".

use std::time::Duration;

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

/// Model id of a simulated worker unless its [`SimConfig::model`] says otherwise; the storms ask for
/// it too.
pub const DEFAULT_MODEL: &str = "bch-sim";

/// Parameters of a simulated worker. Every field has a default, so a partial TOML/JSON document works.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SimConfig {
    /// Model id reported by `GET /v1/models` and echoed in responses. Default `"bch-sim"`.
    pub model: String,
    /// Tokens per prefix-cache block. Only full blocks are cached, as in vLLM and SGLang's paged
    /// caches. Default 16.
    pub block_size: usize,
    /// Prefix-cache capacity in blocks; the least recently used block is evicted beyond it.
    /// 0 disables the cache. Default 4096 blocks (65,536 tokens).
    pub cache_capacity_blocks: usize,
    /// Prefill throughput of the worker, in uncached prompt tokens per second, shared by every
    /// prefill in an engine step (a chunk of `n` tokens adds `n / prefill_tokens_per_s` to the
    /// step). Positive; `inf` makes prefill free. Default 10,000 (Llama-3.1-8B on one A100 at 50%
    /// of its dense BF16 peak; docs/drill.md).
    pub prefill_tokens_per_s: f64,
    /// Prompt tokens one engine step may carry, decode tokens included (vLLM's
    /// `max_num_batched_tokens`, SGLang's `--chunked-prefill-size`): a longer prefill is split into
    /// chunks over several steps, and every running decode takes one token of the budget. Keep it at
    /// least `max_batch` (vLLM requires that): when decodes fill the budget, prefill advances by one
    /// token a step. Unused in instant mode. Default 2048.
    pub chunk_tokens: usize,
    /// Time of an engine step with one decoding request, in milliseconds: reading the weights.
    /// Default 10 (16 GB of Llama-3.1-8B weights at 80% of an A100's 2,039 GB/s).
    pub decode_step_base_ms: f64,
    /// Extra step time per further decoding request, in milliseconds: reading its KV cache.
    /// Default 0.1 (a 1,056-token context of Llama-3.1-8B, 128 KiB a token, at 80% of 2,039 GB/s):
    /// a full batch of 32 steps at 13.1 ms.
    pub decode_step_per_running_ms: f64,
    /// Requests running at once (prefilling or decoding); later arrivals wait in a FIFO queue.
    /// Default 32.
    pub max_batch: usize,
    /// A request whose next prefix block another running request is computing waits in the queue
    /// until that prefill ends, then hits the cache, as SGLang's scheduler defers in-batch
    /// duplicates; `false` computes the prefix again alongside. Default true.
    pub wait_for_shared_prefix: bool,
    /// Completion tokens when the request names no limit. Default 16.
    pub default_max_tokens: u32,
    /// Multiplies every simulated duration. 1.0 is "real time", 0.01 runs 100× faster, and 0 is instant
    /// mode: no timer is ever armed, for proxy benchmarks that need the fastest possible upstream.
    /// Default 1.0.
    pub time_scale: f64,
    /// Seed of the output text. The same seed and prompt always give the same completion, whichever
    /// worker serves it. Default 0.
    pub seed: u64,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            model: DEFAULT_MODEL.to_owned(),
            block_size: 16,
            cache_capacity_blocks: 4096,
            prefill_tokens_per_s: 10_000.0,
            chunk_tokens: 2048,
            decode_step_base_ms: 10.0,
            decode_step_per_running_ms: 0.1,
            max_batch: 32,
            wait_for_shared_prefix: true,
            default_max_tokens: 16,
            time_scale: 1.0,
            seed: 0,
        }
    }
}

impl SimConfig {
    /// A config with every duration scaled by `time_scale` (see [`SimConfig::time_scale`]).
    pub fn with_time_scale(mut self, time_scale: f64) -> Self {
        self.time_scale = time_scale;
        self
    }

    /// Checks the values a worker cannot run with.
    ///
    /// # Errors
    ///
    /// When `block_size`, `max_batch` or `chunk_tokens` is 0, `prefill_tokens_per_s` is not positive, or a duration or the time scale is negative or not
    /// finite; the message names the field.
    pub fn validate(&self) -> anyhow::Result<()> {
        anyhow::ensure!(self.block_size > 0, "block_size must be at least 1");
        anyhow::ensure!(self.max_batch > 0, "max_batch must be at least 1");
        anyhow::ensure!(self.chunk_tokens > 0, "chunk_tokens must be at least 1");
        anyhow::ensure!(
            self.prefill_tokens_per_s > 0.0,
            "prefill_tokens_per_s must be a number > 0 (inf for free prefill), got {}",
            self.prefill_tokens_per_s
        );
        for (name, value) in [
            ("time_scale", self.time_scale),
            ("decode_step_base_ms", self.decode_step_base_ms),
            (
                "decode_step_per_running_ms",
                self.decode_step_per_running_ms,
            ),
        ] {
            anyhow::ensure!(
                value.is_finite() && value >= 0.0,
                "{name} must be a finite number >= 0, got {value}"
            );
        }
        Ok(())
    }

    /// True when no simulated duration is ever slept (`time_scale == 0`).
    pub(crate) fn is_instant(&self) -> bool {
        self.time_scale == 0.0
    }

    /// Simulated (unscaled) time of one engine step that decodes one token for each of `decoding`
    /// requests and prefills `prefill_tokens` prompt tokens:
    ///
    /// `decode_step_base_ms + decode_step_per_running_ms × max(decoding − 1, 0)
    ///  + 1000 × prefill_tokens / prefill_tokens_per_s` (ms).
    ///
    /// The decode part is memory-bound (weights once, then each sequence's KV cache); the prefill
    /// part is compute-bound and adds to it, so a running prefill chunk delays every decode of the
    /// step and concurrent prefills share the throughput.
    pub(crate) fn step_time(&self, decoding: usize, prefill_tokens: usize) -> Duration {
        let others = decoding.saturating_sub(1) as f64;
        millis(
            self.decode_step_base_ms
                + self.decode_step_per_running_ms * others
                + 1000.0 * prefill_tokens as f64 / self.prefill_tokens_per_s,
        )
    }

    /// The wall-clock duration to sleep for a simulated duration, or `None` in instant mode.
    pub(crate) fn scaled(&self, simulated: Duration) -> Option<Duration> {
        if self.is_instant() {
            None
        } else {
            Some(simulated.mul_f64(self.time_scale))
        }
    }
}

fn millis(ms: f64) -> Duration {
    Duration::from_secs_f64(ms.max(0.0) / 1000.0)
}

/// The longest piece of a word that counts as one token.
pub(crate) const TOKEN_CHARS: usize = 4;

/// Splits text into simulated token ids.
///
/// The text is split on whitespace, and each word into pieces of at most [`TOKEN_CHARS`] characters;
/// each piece is one token whose id is a stable hash of the piece. "the quick brownish fox" is 6 tokens:
/// `the`, `quic`, `k`, `brow`, `nish`, `fox`. That is close enough to a BPE tokenizer's 4 characters per
/// token for English, costs no vocabulary file, and makes token counts easy to predict in tests.
pub(crate) fn tokenize(text: &str) -> Vec<u32> {
    let mut tokens = Vec::with_capacity(text.len() / 3 + 1);
    for word in text.split_whitespace() {
        let mut start = 0;
        let mut chars = 0;
        for (index, _) in word.char_indices() {
            if chars == TOKEN_CHARS {
                tokens.push(fnv1a(&word.as_bytes()[start..index]) as u32);
                start = index;
                chars = 0;
            }
            chars += 1;
        }
        tokens.push(fnv1a(&word.as_bytes()[start..]) as u32);
    }
    tokens
}

/// 64-bit FNV-1a: tiny, fast on the short inputs here, and stable across Rust releases (unlike
/// `DefaultHasher`), so outputs stay deterministic for a seed.
pub(crate) fn fnv1a(bytes: &[u8]) -> u64 {
    fnv1a_extend(0xcbf2_9ce4_8422_2325, bytes)
}

/// Continues an FNV-1a hash from `state`, for hash chains.
pub(crate) fn fnv1a_extend(mut state: u64, bytes: &[u8]) -> u64 {
    for &byte in bytes {
        state ^= u64::from(byte);
        state = state.wrapping_mul(0x0000_0100_0000_01b3);
    }
    state
}

/// Words the simulated model "generates". Each is at most [`TOKEN_CHARS`] characters, so one output
/// word is exactly one token, and `usage.completion_tokens` equals the words produced.
const VOCABULARY: &[&str] = &[
    "the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "with", "was", "on", "be",
    "at", "by", "this", "had", "not", "are", "but", "from", "or", "have", "an", "they", "one",
    "you", "were", "her", "all", "she", "ring", "node", "key", "load", "gate", "hash", "warm",
    "cold", "fast", "slow", "GPU", "KV", "rust", "byte", "link", "next",
];

/// Deterministic word source for one request: seeded by the worker seed and the prompt tokens.
pub(crate) struct OutputWords {
    rng: ChaCha8Rng,
}

impl OutputWords {
    /// Output for `prompt_tokens` under `seed`.
    pub(crate) fn new(seed: u64, prompt_tokens: &[u32]) -> Self {
        let mut state = fnv1a_extend(fnv1a(&seed.to_le_bytes()), b"prompt");
        for token in prompt_tokens {
            state = fnv1a_extend(state, &token.to_le_bytes());
        }
        Self {
            rng: ChaCha8Rng::seed_from_u64(state),
        }
    }

    /// The next generated word.
    pub(crate) fn next_word(&mut self) -> &'static str {
        use rand::Rng;
        VOCABULARY[self.rng.random_range(0..VOCABULARY.len())]
    }
}

/// A deterministic filler text of exactly `tokens` tokens (one word of at most four characters each),
/// seeded by `seed`: used by the storm for shared prompt prefixes.
pub fn filler_text(seed: u64, tokens: usize) -> String {
    let mut words = OutputWords::new(seed, &[]);
    let mut text = String::with_capacity(tokens * 4);
    for i in 0..tokens {
        if i > 0 {
            text.push(' ');
        }
        text.push_str(words.next_word());
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokenizer_splits_words_into_four_character_pieces() {
        assert_eq!(tokenize("the quick brownish fox").len(), 6);
        assert_eq!(tokenize("").len(), 0);
        assert_eq!(tokenize("  a \n b\t").len(), 2);
        // Pieces are characters, not bytes: four multi-byte characters are one token.
        assert_eq!(tokenize("żółw").len(), 1);
        assert_eq!(tokenize("abcd"), tokenize("abcd"));
        assert_ne!(tokenize("abcd"), tokenize("abce"));
        // Same piece, same id, wherever it appears.
        let t = tokenize("quic quick");
        assert_eq!(t[0], t[1]);
    }

    #[test]
    fn filler_text_has_the_requested_token_count() {
        for n in [0, 1, 17, 1024] {
            assert_eq!(tokenize(&filler_text(7, n)).len(), n);
        }
        assert_eq!(filler_text(7, 50), filler_text(7, 50));
        assert_ne!(filler_text(7, 50), filler_text(8, 50));
    }

    #[test]
    fn prefill_adds_its_tokens_at_the_worker_throughput() {
        let c = SimConfig::default();
        // 1,000 tokens at 10,000 tokens/s on top of a one-sequence step.
        assert_eq!(c.step_time(0, 1000), Duration::from_millis(110));
        assert_eq!(c.step_time(1, 1000), Duration::from_millis(110));
        // Two prefills of 500 in one step cost what one of 1,000 does: the throughput is shared.
        assert_eq!(c.step_time(0, 500 + 500), c.step_time(0, 1000));
        let free = SimConfig {
            prefill_tokens_per_s: f64::INFINITY,
            ..SimConfig::default()
        };
        assert_eq!(free.step_time(1, 100_000), Duration::from_millis(10));
    }

    #[test]
    fn a_step_grows_with_the_decoding_batch_and_with_prefill() {
        let c = SimConfig::default();
        assert_eq!(c.step_time(1, 0), Duration::from_millis(10));
        assert!(c.step_time(8, 0) > c.step_time(1, 0));
        assert!(c.step_time(32, 0) > c.step_time(8, 0));
        assert_eq!(c.step_time(32, 0), Duration::from_micros(13_100));
        // A 2,048-token chunk in the step holds every decode for 204.8 ms more.
        assert_eq!(
            c.step_time(8, 2048) - c.step_time(8, 0),
            Duration::from_micros(204_800)
        );
    }

    #[test]
    fn instant_mode_never_sleeps_and_scale_multiplies() {
        let c = SimConfig::default().with_time_scale(0.0);
        assert_eq!(c.scaled(Duration::from_secs(5)), None);
        let c = SimConfig::default().with_time_scale(0.5);
        assert_eq!(
            c.scaled(Duration::from_secs(5)),
            Some(Duration::from_millis(2500))
        );
    }

    #[test]
    fn validate_names_the_bad_field() {
        let bad = SimConfig {
            time_scale: f64::NAN,
            ..SimConfig::default()
        };
        assert!(
            bad.validate()
                .unwrap_err()
                .to_string()
                .contains("time_scale")
        );
        let bad = SimConfig {
            max_batch: 0,
            ..SimConfig::default()
        };
        assert!(
            bad.validate()
                .unwrap_err()
                .to_string()
                .contains("max_batch")
        );
        let bad = SimConfig {
            chunk_tokens: 0,
            ..SimConfig::default()
        };
        assert!(
            bad.validate()
                .unwrap_err()
                .to_string()
                .contains("chunk_tokens")
        );
        let bad = SimConfig {
            prefill_tokens_per_s: 0.0,
            ..SimConfig::default()
        };
        assert!(
            bad.validate()
                .unwrap_err()
                .to_string()
                .contains("prefill_tokens_per_s")
        );
        SimConfig::default().validate().unwrap();
    }

    #[test]
    fn output_depends_only_on_seed_and_prompt() {
        let prompt = tokenize("hello there");
        let take = |seed| {
            let mut w = OutputWords::new(seed, &prompt);
            (0..20).map(|_| w.next_word()).collect::<Vec<_>>()
        };
        assert_eq!(take(1), take(1));
        assert_ne!(take(1), take(2));
    }
}
