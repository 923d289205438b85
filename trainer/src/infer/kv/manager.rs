//! Blocks per sequence: prefix hits on admission, growth as a sequence computes more tokens,
//! registration of its full blocks in the prefix cache, and release when it ends; for a model
//! with recurrent layers also a state slot per sequence, taken on admission and given back with
//! its blocks. Plain data: block ids, hashes and slot numbers, no tensors (the runner owns those).

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
    /// Its recurrent state's slot, when the model keeps states.
    state_slot: Option<u32>,
}

#[derive(Debug)]
pub struct KvManager {
    pool: BlockPool,
    block_size: usize,
    prefix_caching: bool,
    held: HashMap<SeqId, Held>,
    /// Free recurrent state slots (the lowest first), when the model keeps states; `None` for
    /// an attention-only model.
    free_slots: Option<Vec<u32>>,
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
        KvManager { pool: BlockPool::new(blocks), block_size, prefix_caching, held: HashMap::new(), free_slots: None }
    }

    /// Also hands each admitted sequence one of `slots` recurrent state slots (a model with
    /// recurrent layers): no more sequences than that hold blocks at once. A prefix of cached
    /// blocks cannot stand in for a recurrent state, so prefix caching is off.
    pub fn with_state_slots(mut self, slots: usize) -> KvManager {
        self.free_slots = Some((0..u32::try_from(slots).unwrap_or(u32::MAX)).rev().collect());
        self.prefix_caching = false;
        self
    }

    /// Whether cached prefixes are reused.
    pub fn prefix_caching(&self) -> bool {
        self.prefix_caching
    }

    /// `seq`'s recurrent state slot, if the model keeps states and `seq` holds one.
    pub fn state_slot(&self, seq: SeqId) -> Option<u32> {
        self.held.get(&seq)?.state_slot
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
        if self.pool.free() < fresh + hits_on_free || self.free_slots.as_ref().is_some_and(Vec::is_empty) {
            return false;
        }
        for &b in &hit.blocks {
            self.pool.take(b);
        }
        let state_slot = self.free_slots.as_mut().and_then(Vec::pop);
        let mut held = Held { blocks: hit.blocks, hashes: hit.hashes, state_slot };
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
            if let (Some(free), Some(slot)) = (self.free_slots.as_mut(), held.state_slot) {
                free.push(slot);
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
        if let Some(free) = &self.free_slots {
            let mut slots: Vec<u32> =
                self.held.values().filter_map(|h| h.state_slot).chain(free.iter().copied()).collect();
            let total = slots.len();
            slots.sort_unstable();
            slots.dedup();
            if slots.len() != total || self.held.values().any(|h| h.state_slot.is_none()) {
                return Err("a state slot is held twice, or a sequence holds none".into());
            }
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
    fn each_sequence_holds_its_own_state_slot_and_the_slots_bound_admission() {
        let mut kv = KvManager::new(16, 4, true).with_state_slots(2);
        assert!(!kv.prefix_caching(), "a recurrent state cannot be rebuilt from cached blocks");
        assert!(kv.admit(1, Hit::default(), 5));
        assert!(kv.admit(2, Hit::default(), 5));
        let (a, b) = (kv.state_slot(1).unwrap(), kv.state_slot(2).unwrap());
        assert_ne!(a, b);
        // Blocks are free, but no slot is.
        assert!(!kv.admit(3, Hit::default(), 1));
        assert!(!kv.holds(3));
        kv.free(1);
        assert!(kv.admit(3, Hit::default(), 1));
        assert_eq!(kv.state_slot(3), Some(a), "the freed slot goes to the next sequence");
        kv.check().unwrap();
        assert_eq!(KvManager::new(16, 4, true).state_slot(1), None);
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
