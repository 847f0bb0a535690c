//! A worker's prefix (KV) cache: hash-chained token blocks with LRU eviction.
//!
//! As in vLLM's automatic prefix caching and SGLang's paged radix cache, a prompt is cut into blocks of
//! `block_size` tokens and each *full* block is identified by a hash of its tokens chained with the hash
//! of the block before it. A block hash therefore names the whole prefix up to that block: two prompts
//! share a cached block only if they share everything before it too. A lookup walks the prompt's blocks
//! from the start and stops at the first miss.

use std::num::NonZeroUsize;

use lru::LruCache;

use crate::sim::{fnv1a, fnv1a_extend};

/// Bounded LRU cache of token-block hashes.
pub(crate) struct PrefixCache {
    block_size: usize,
    /// `None` when the capacity is 0: caching disabled.
    blocks: Option<LruCache<u64, ()>>,
}

impl PrefixCache {
    /// A cache of at most `capacity_blocks` blocks of `block_size` tokens (`block_size` ≥ 1).
    pub(crate) fn new(block_size: usize, capacity_blocks: usize) -> Self {
        assert!(block_size > 0, "block_size must be at least 1");
        Self {
            block_size,
            blocks: NonZeroUsize::new(capacity_blocks).map(LruCache::new),
        }
    }

    /// Blocks currently cached.
    pub(crate) fn len(&self) -> usize {
        self.blocks.as_ref().map_or(0, LruCache::len)
    }

    /// Chained hashes of the full blocks of `tokens`; a trailing partial block has none.
    fn block_hashes(&self, tokens: &[u32]) -> Vec<u64> {
        chain_hashes(self.block_size, tokens)
    }

    /// Tokens of `tokens` already cached: the longest run of leading cached blocks, in tokens.
    ///
    /// Like vLLM, at most `len - 1` tokens count as a hit: the engine must compute the last prompt token
    /// itself to get the logits of the first output token. The blocks hit are marked recently used.
    pub(crate) fn lookup(&mut self, tokens: &[u32]) -> usize {
        let hashes = self.usable_chain(tokens);
        self.hit(&hashes) * self.block_size
    }

    /// Chained hashes of the full blocks a lookup of `tokens` may hit: those within the first
    /// `len - 1` tokens.
    pub(crate) fn usable_chain(&self, tokens: &[u32]) -> Vec<u64> {
        let usable = tokens.len().saturating_sub(1);
        chain_hashes(self.block_size, &tokens[..usable])
    }

    /// Leading blocks of `chain` that are cached, without refreshing them.
    pub(crate) fn peek(&self, chain: &[u64]) -> usize {
        match self.blocks.as_ref() {
            Some(blocks) => chain.iter().take_while(|h| blocks.contains(h)).count(),
            None => 0,
        }
    }

    /// Leading blocks of `chain` that are cached, refreshed as used.
    pub(crate) fn hit(&mut self, chain: &[u64]) -> usize {
        let hits = self.peek(chain);
        if let Some(blocks) = self.blocks.as_mut() {
            // Refresh in reverse so the first block ends up the most recently used: a chain is
            // useless without its head, so eviction must take tails first (vLLM frees blocks in
            // reverse for the same reason).
            for hash in chain[..hits].iter().rev() {
                blocks.promote(hash);
            }
        }
        hits
    }

    /// Tokens per block.
    pub(crate) fn block_size(&self) -> usize {
        self.block_size
    }

    /// Caches every full block of `tokens` (after their prefill), evicting least recently used blocks
    /// beyond capacity.
    pub(crate) fn insert(&mut self, tokens: &[u32]) {
        let hashes = self.block_hashes(tokens);
        let Some(blocks) = self.blocks.as_mut() else {
            return;
        };
        // Reverse order, as in `lookup`: if the prompt alone exceeds the capacity, its head survives.
        for hash in hashes.into_iter().rev() {
            blocks.put(hash, ());
        }
    }
}

/// What the tests inspect, beyond what the worker needs.
#[cfg(test)]
impl PrefixCache {
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// True when the block with this chained hash is cached (does not refresh it).
    fn contains(&self, hash: u64) -> bool {
        self.blocks.as_ref().is_some_and(|b| b.contains(&hash))
    }
}

/// Hash of each full block chained with the hash of the block before it.
fn chain_hashes(block_size: usize, tokens: &[u32]) -> Vec<u64> {
    let mut parent = 0x6263_685f_626c_6b73_u64; // "bch_blks": the root of every chain
    tokens
        .chunks_exact(block_size)
        .map(|block| {
            let mut hash = fnv1a(&parent.to_le_bytes());
            for token in block {
                hash = fnv1a_extend(hash, &token.to_le_bytes());
            }
            parent = hash;
            hash
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prompt(start: u32, len: usize) -> Vec<u32> {
        (start..start + len as u32).collect()
    }

    #[test]
    fn only_full_blocks_are_cached_and_the_last_token_is_never_a_hit() {
        let mut cache = PrefixCache::new(4, 100);
        let p = prompt(0, 10);
        assert_eq!(cache.lookup(&p), 0);
        cache.insert(&p);
        assert_eq!(cache.len(), 2);
        assert_eq!(cache.lookup(&p), 8);
        // Exactly two blocks long: the last token must be recomputed, so only one block hits.
        let exact = prompt(0, 8);
        assert_eq!(cache.lookup(&exact), 4);
    }

    #[test]
    fn blocks_are_chained_so_a_shared_block_after_a_different_prefix_misses() {
        let mut cache = PrefixCache::new(4, 100);
        let a: Vec<u32> = [1, 2, 3, 4, 9, 9, 9, 9, 0].to_vec();
        let b: Vec<u32> = [5, 6, 7, 8, 9, 9, 9, 9, 0].to_vec();
        cache.insert(&a);
        assert_eq!(cache.lookup(&b), 0);
        let a_longer: Vec<u32> = [1, 2, 3, 4, 9, 9, 9, 9, 7, 7, 7, 7, 0].to_vec();
        assert_eq!(cache.lookup(&a_longer), 8);
    }

    #[test]
    fn eviction_at_capacity_drops_the_least_recently_used_prompt() {
        // Room for two prompts of 2 full blocks each.
        let mut cache = PrefixCache::new(4, 4);
        let a = prompt(0, 9);
        let b = prompt(100, 9);
        let c = prompt(200, 9);
        cache.insert(&a);
        cache.insert(&b);
        assert_eq!(cache.len(), 4);
        // Touch a: b becomes the least recently used.
        assert_eq!(cache.lookup(&a), 8);
        cache.insert(&c);
        assert_eq!(cache.len(), 4, "capacity is a hard bound");
        assert_eq!(cache.lookup(&b), 0, "b was least recently used");
        assert_eq!(cache.lookup(&a), 8);
        assert_eq!(cache.lookup(&c), 8);
    }

    #[test]
    fn a_prompt_larger_than_the_cache_keeps_its_head() {
        let mut cache = PrefixCache::new(4, 2);
        let long = prompt(0, 41);
        cache.insert(&long);
        assert_eq!(cache.len(), 2);
        let hashes = cache.block_hashes(&long);
        assert!(cache.contains(hashes[0]) && cache.contains(hashes[1]));
        assert_eq!(cache.lookup(&long), 8);
    }

    #[test]
    fn partial_eviction_evicts_tails_first() {
        let mut cache = PrefixCache::new(4, 4);
        let a = prompt(0, 13); // 3 full blocks
        cache.insert(&a);
        let b = prompt(100, 9); // 2 full blocks: one of a's must go
        cache.insert(&b);
        let hashes = cache.block_hashes(&a);
        assert!(
            cache.contains(hashes[0]) && cache.contains(hashes[1]),
            "head survives"
        );
        assert!(!cache.contains(hashes[2]), "tail evicted");
        assert_eq!(cache.lookup(&a), 8);
    }

    #[test]
    fn zero_capacity_disables_caching() {
        let mut cache = PrefixCache::new(4, 0);
        let p = prompt(0, 40);
        cache.insert(&p);
        assert_eq!(cache.lookup(&p), 0);
        assert!(cache.is_empty());
    }
}
