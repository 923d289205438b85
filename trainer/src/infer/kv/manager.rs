//! Blocks per sequence: prefix hits on admission, growth as a sequence computes more tokens,
//! registration of its full blocks in the prefix cache, and release when it ends. Plain data:
//! block ids and hashes, no tensors (the runner owns those).

use std::collections::HashMap;

use super::hash::BlockHash;
use super::pool::{BlockId, BlockPool};

/// Who holds blocks: the scheduler's id of a sequence.
pub type SeqId = u64;

#[derive(Debug, Default)]
struct Held {
    blocks: Vec<BlockId>,
    /// Hashes of the leading full blocks already registered in the prefix cache.
    hashes: Vec<BlockHash>,
}

#[derive(Debug)]
pub struct KvManager {
    pool: BlockPool,
    block_size: usize,
    prefix_caching: bool,
    held: HashMap<SeqId, Held>,
}

/// A prefix found in the cache: its blocks and how many tokens they hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Hit {
    pub blocks: Vec<BlockId>,
    pub hashes: Vec<BlockHash>,
    pub tokens: usize,
}

impl KvManager {
    pub fn new(blocks: usize, block_size: usize, prefix_caching: bool) -> KvManager {
        KvManager { pool: BlockPool::new(blocks), block_size, prefix_caching, held: HashMap::new() }
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn total_blocks(&self) -> usize {
        self.pool.total()
    }

    /// Blocks held by some sequence.
    pub fn used_blocks(&self) -> usize {
        self.pool.total() - self.pool.free()
    }

    /// Blocks that cover `tokens`.
    pub fn blocks_for(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.block_size)
    }

    /// The longest cached prefix of `tokens` under `adapter`, in whole blocks, leaving at least
    /// the last token to compute (its logits are what the request waits for).
    pub fn cached_prefix(&self, tokens: &[u32], adapter: u64) -> Hit {
        let mut hit = Hit::default();
        if !self.prefix_caching || tokens.is_empty() {
            return hit;
        }
        let usable = (tokens.len() - 1) / self.block_size * self.block_size;
        for hash in BlockHash::chain(&tokens[..usable], self.block_size, adapter) {
            match self.pool.lookup(&hash) {
                Some(b) => {
                    hit.blocks.push(b);
                    hit.hashes.push(hash);
                }
                None => break,
            }
        }
        hit.tokens = hit.blocks.len() * self.block_size;
        hit
    }

    /// Gives a new sequence the hit's blocks and enough fresh ones for `tokens` in all; `false`
    /// (and nothing held) when the pool cannot.
    pub fn admit(&mut self, seq: SeqId, hit: Hit, tokens: usize) -> bool {
        let fresh = self.blocks_for(tokens).saturating_sub(hit.blocks.len());
        let hits_on_free = hit.blocks.iter().filter(|&&b| self.pool.is_free(b)).count();
        if self.pool.free() < fresh + hits_on_free {
            return false;
        }
        for &b in &hit.blocks {
            self.pool.take(b);
        }
        let mut held = Held { blocks: hit.blocks, hashes: hit.hashes };
        for _ in 0..fresh {
            held.blocks.push(self.pool.allocate().expect("free blocks were counted"));
        }
        self.held.insert(seq, held);
        true
    }

    /// Makes `seq`'s blocks cover `tokens`; `false` (nothing changed) when the pool cannot.
    pub fn grow(&mut self, seq: SeqId, tokens: usize) -> bool {
        let need = self.blocks_for(tokens);
        let Some(held) = self.held.get_mut(&seq) else { return false };
        let more = need.saturating_sub(held.blocks.len());
        if self.pool.free() < more {
            return false;
        }
        for _ in 0..more {
            held.blocks.push(self.pool.allocate().expect("free blocks were counted"));
        }
        true
    }

    /// Registers `seq`'s full blocks whose tokens are all computed (the first `computed` of
    /// `tokens`), so later requests with the same prefix can reuse them.
    pub fn commit(&mut self, seq: SeqId, tokens: &[u32], computed: usize, adapter: u64) {
        if !self.prefix_caching {
            return;
        }
        let Some(held) = self.held.get_mut(&seq) else { return };
        let full = (computed.min(tokens.len()) / self.block_size).min(held.blocks.len());
        while held.hashes.len() < full {
            let i = held.hashes.len();
            let hash =
                BlockHash::of(held.hashes.last(), adapter, &tokens[i * self.block_size..(i + 1) * self.block_size]);
            self.pool.register(held.blocks[i], hash);
            held.hashes.push(hash);
        }
    }

    /// Releases every block of `seq`, its last blocks first (the least shareable are evicted
    /// first). Unknown sequences are ignored.
    pub fn free(&mut self, seq: SeqId) {
        if let Some(held) = self.held.remove(&seq) {
            for &b in held.blocks.iter().rev() {
                self.pool.release(b);
            }
        }
    }

    /// `seq`'s block table.
    pub fn table(&self, seq: SeqId) -> &[BlockId] {
        self.held.get(&seq).map_or(&[], |h| &h.blocks)
    }

    pub fn holds(&self, seq: SeqId) -> bool {
        self.held.contains_key(&seq)
    }

    /// Every count is explained by the tables that hold the block, and the pool is consistent.
    pub fn check(&self) -> Result<(), String> {
        self.pool.check()?;
        let mut counted = vec![0u32; self.pool.total()];
        for h in self.held.values() {
            for &b in &h.blocks {
                counted[b as usize] += 1;
            }
        }
        if counted != self.pool.refs() {
            return Err("block reference counts differ from the block tables".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shared_prefix_is_held_once_and_survives_its_first_owner() {
        let mut kv = KvManager::new(8, 4, true);
        let prompt: Vec<u32> = (0..10).collect();
        assert!(kv.admit(1, Hit::default(), 10));
        assert_eq!(kv.used_blocks(), 3);
        kv.commit(1, &prompt, 10, 0);
        // Two full blocks are cached; a request with the same 10 tokens reuses them both.
        let hit = kv.cached_prefix(&prompt, 0);
        assert_eq!((hit.tokens, &hit.blocks[..]), (8, &kv.table(1)[..2]));
        assert!(kv.admit(2, hit, 11));
        assert_eq!(kv.used_blocks(), 4, "one fresh block for tokens 8..11");
        kv.free(1);
        kv.free(2);
        assert_eq!(kv.used_blocks(), 0);
        // Freed, the prefix is still cached; another adapter misses it.
        assert_eq!(kv.cached_prefix(&prompt, 0).tokens, 8);
        assert_eq!(kv.cached_prefix(&prompt, 7).tokens, 0);
        // A prompt of exactly two blocks reuses only the first: its last token must be computed.
        assert_eq!(kv.cached_prefix(&prompt[..8], 0).tokens, 4);
        kv.check().unwrap();
    }

    #[test]
    fn admission_and_growth_refuse_what_the_pool_cannot_hold_and_change_nothing() {
        let mut kv = KvManager::new(3, 4, false);
        assert!(kv.admit(1, Hit::default(), 8));
        assert!(!kv.admit(2, Hit::default(), 5));
        assert!(!kv.holds(2));
        assert!(!kv.grow(1, 13));
        assert_eq!(kv.table(1).len(), 2);
        assert!(kv.grow(1, 12));
        assert_eq!(kv.used_blocks(), 3);
        kv.check().unwrap();
    }
}
