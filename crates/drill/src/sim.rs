//! The simulated engine's model: tokenizer, timing and deterministic output.
//!
//! The model is deliberately small. What matters for routing experiments is that
//!
//! - a prompt whose prefix is already in the worker's prefix cache starts faster (TTFT is queueing plus
//!   prefill of the *uncached* tokens only), so keeping a routing key on one worker pays;
//! - a worker gets slower per token as its running batch grows, so piling every request on one worker
//!   costs, which is what a spill trades against cache locality;
//! - a worker runs at most `max_batch` requests and queues the rest first-in first-out.
//!
//! All durations below are *simulated* and multiplied by [`SimConfig::time_scale`] before sleeping.

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
    /// Fixed per-request overhead before prefill (scheduling, tokenisation), in milliseconds. Default 1.
    pub prefill_base_ms: f64,
    /// Prefill cost per uncached prompt token, in microseconds. Default 100 (10,000 tokens/s).
    pub prefill_us_per_token: f64,
    /// Decode step time of a lone request, in milliseconds. Default 10.
    pub decode_step_base_ms: f64,
    /// Extra decode step time per running request (including itself beyond the first), in
    /// milliseconds. Default 0.5: a full batch of 32 steps at 25.5 ms.
    pub decode_step_per_running_ms: f64,
    /// Requests decoded at once; later arrivals wait in a FIFO queue. Default 32.
    pub max_batch: usize,
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
            prefill_base_ms: 1.0,
            prefill_us_per_token: 100.0,
            decode_step_base_ms: 10.0,
            decode_step_per_running_ms: 0.5,
            max_batch: 32,
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
    /// When `block_size` or `max_batch` is 0, or a duration or the time scale is negative or not
    /// finite; the message names the field.
    pub fn validate(&self) -> anyhow::Result<()> {
        anyhow::ensure!(self.block_size > 0, "block_size must be at least 1");
        anyhow::ensure!(self.max_batch > 0, "max_batch must be at least 1");
        for (name, value) in [
            ("time_scale", self.time_scale),
            ("prefill_base_ms", self.prefill_base_ms),
            ("prefill_us_per_token", self.prefill_us_per_token),
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

    /// Simulated (unscaled) prefill time for `uncached_tokens` tokens.
    pub(crate) fn prefill_time(&self, uncached_tokens: usize) -> Duration {
        millis(self.prefill_base_ms + self.prefill_us_per_token * uncached_tokens as f64 / 1000.0)
    }

    /// Simulated (unscaled) time of one decode step while `running` requests share the batch.
    ///
    /// Linear in the batch size: real engines are memory-bound at small batches, so the step cost grows
    /// slowly but steadily with every sequence whose KV cache must be read.
    pub(crate) fn decode_step_time(&self, running: usize) -> Duration {
        let others = running.saturating_sub(1) as f64;
        millis(self.decode_step_base_ms + self.decode_step_per_running_ms * others)
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
    fn prefill_cost_is_linear_in_uncached_tokens() {
        let c = SimConfig::default();
        assert_eq!(c.prefill_time(0), Duration::from_millis(1));
        assert_eq!(c.prefill_time(1000), Duration::from_millis(101));
    }

    #[test]
    fn decode_step_grows_with_the_running_batch() {
        let c = SimConfig::default();
        assert_eq!(c.decode_step_time(1), Duration::from_millis(10));
        assert!(c.decode_step_time(8) > c.decode_step_time(1));
        assert!(c.decode_step_time(32) > c.decode_step_time(8));
        assert_eq!(c.decode_step_time(32), Duration::from_micros(25_500));
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
