//! The prompt text of a storm, derived from its seed: one long prefix per routing key, shared by every
//! request of that key, followed by a short suffix of each request's own.

use crate::sim::{filler_text, fnv1a_extend};

/// Prompt text for each key and request.
pub(super) struct Prompts {
    seed: u64,
    prefixes: Vec<String>,
    suffix_tokens: usize,
}

impl Prompts {
    /// Prompts for `keys` keys: `prefix_tokens` tokens per key, then `suffix_tokens` per request.
    pub(super) fn new(seed: u64, keys: usize, prefix_tokens: usize, suffix_tokens: usize) -> Self {
        let prefixes = (0..keys)
            .map(|k| filler_text(mix(seed, &[k as u64]), prefix_tokens))
            .collect();
        Self {
            seed,
            prefixes,
            suffix_tokens,
        }
    }

    /// The prompt of sibling `sibling` in group `group`, which uses key index `key`.
    pub(super) fn prompt(&self, key: usize, group: usize, sibling: usize) -> String {
        let suffix = filler_text(
            mix(self.seed, &[u64::MAX, group as u64, sibling as u64]),
            self.suffix_tokens,
        );
        format!("{}\n{suffix}", self.prefixes[key])
    }
}

/// A seed for one piece of text; `u64::MAX` in the parts keeps suffix seeds apart from prefix seeds.
fn mix(seed: u64, parts: &[u64]) -> u64 {
    parts.iter().fold(
        fnv1a_extend(0xcbf2_9ce4_8422_2325, &seed.to_le_bytes()),
        |h, p| fnv1a_extend(h, &p.to_le_bytes()),
    )
}
