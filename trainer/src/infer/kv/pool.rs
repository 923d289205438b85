//! The block pool: reference counts, the free list in least-recently-used order, and the
//! table of cached blocks by prefix hash.
//!
//! A block is *free* when no sequence holds it (count 0). A free block may still hold a cached
//! prefix: it stays findable by its hash until it is handed out again, and the free list hands
//! out the block freed longest ago first, so the prefixes used last survive longest (vLLM's
//! "evictor"). Taking a cached block back (a prefix hit) removes it from the free list.

use std::collections::{BTreeMap, HashMap};

use super::hash::BlockHash;

/// A block's index in the cache tensors.
pub type BlockId = u32;

#[derive(Debug)]
pub struct BlockPool {
    refs: Vec<u32>,
    hashes: Vec<Option<BlockHash>>,
    /// Free blocks by the time they were freed (oldest first); `freed_at` is the inverse.
    free: BTreeMap<u64, BlockId>,
    freed_at: Vec<Option<u64>>,
    cached: HashMap<BlockHash, BlockId>,
    clock: u64,
}

impl BlockPool {
    pub fn new(blocks: usize) -> BlockPool {
        let ids = 0..blocks as BlockId;
        BlockPool {
            refs: vec![0; blocks],
            hashes: vec![None; blocks],
            free: ids.clone().map(|b| (u64::from(b), b)).collect(),
            freed_at: ids.map(|b| Some(u64::from(b))).collect(),
            cached: HashMap::new(),
            clock: blocks as u64,
        }
    }

    pub fn total(&self) -> usize {
        self.refs.len()
    }

    /// Blocks no sequence holds (cached ones included: they can be handed out).
    pub fn free(&self) -> usize {
        self.free.len()
    }

    /// Hands out the block freed longest ago, forgetting the prefix it held.
    pub fn allocate(&mut self) -> Option<BlockId> {
        let (_, block) = self.free.pop_first()?;
        self.freed_at[block as usize] = None;
        if let Some(h) = self.hashes[block as usize].take()
            && self.cached.get(&h) == Some(&block)
        {
            self.cached.remove(&h);
        }
        self.refs[block as usize] = 1;
        Some(block)
    }

    /// The block holding the prefix `hash`, if cached.
    pub fn lookup(&self, hash: &BlockHash) -> Option<BlockId> {
        self.cached.get(hash).copied()
    }

    /// Whether `block` is free (so taking it costs a free block).
    pub fn is_free(&self, block: BlockId) -> bool {
        self.refs[block as usize] == 0
    }

    /// One more holder of `block` (a prefix hit).
    pub fn take(&mut self, block: BlockId) {
        let b = block as usize;
        if self.refs[b] == 0
            && let Some(at) = self.freed_at[b].take()
        {
            self.free.remove(&at);
        }
        self.refs[b] += 1;
    }

    /// One holder fewer; the last one puts the block at the young end of the free list.
    pub fn release(&mut self, block: BlockId) {
        let b = block as usize;
        debug_assert!(self.refs[b] > 0, "block {block} released more often than taken");
        self.refs[b] = self.refs[b].saturating_sub(1);
        if self.refs[b] == 0 {
            self.clock += 1;
            self.free.insert(self.clock, block);
            self.freed_at[b] = Some(self.clock);
        }
    }

    /// Records that `block` holds the prefix `hash`. A prefix already cached in another block
    /// keeps that block (two sequences computed the same prefix at once).
    pub fn register(&mut self, block: BlockId, hash: BlockHash) {
        if self.hashes[block as usize].is_some() {
            return;
        }
        self.hashes[block as usize] = Some(hash);
        self.cached.entry(hash).or_insert(block);
    }

    /// Blocks that hold a cached prefix.
    pub fn cached(&self) -> usize {
        self.cached.len()
    }

    /// The holders of every block (for invariant checks).
    pub fn refs(&self) -> &[u32] {
        &self.refs
    }

    /// Internal consistency: the free list is exactly the blocks with no holder, and every
    /// cached hash points at a block that carries it.
    pub fn check(&self) -> Result<(), String> {
        let unheld = self.refs.iter().filter(|&&r| r == 0).count();
        if unheld != self.free.len() {
            return Err(format!("{unheld} blocks have no holder but {} are on the free list", self.free.len()));
        }
        for (&at, &b) in &self.free {
            if self.freed_at[b as usize] != Some(at) || self.refs[b as usize] != 0 {
                return Err(format!("free list entry {at} → block {b} is stale"));
            }
        }
        for (h, &b) in &self.cached {
            if self.hashes[b as usize] != Some(*h) {
                return Err(format!("cached block {b} does not carry its hash"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_freed_last_are_evicted_last_and_hits_leave_the_free_list() {
        let mut p = BlockPool::new(3);
        let (a, b, c) = (p.allocate().unwrap(), p.allocate().unwrap(), p.allocate().unwrap());
        assert!(p.allocate().is_none());
        let (ha, hb) = (BlockHash::of(None, 0, &[1]), BlockHash::of(None, 0, &[2]));
        p.register(a, ha);
        p.register(b, hb);
        p.release(a);
        p.release(b);
        assert_eq!((p.free(), p.cached()), (2, 2));
        // A hit on b takes it off the free list; the next allocation evicts a (freed first).
        assert_eq!(p.lookup(&hb), Some(b));
        p.take(b);
        assert_eq!(p.allocate(), Some(a));
        assert_eq!(p.lookup(&ha), None, "a's prefix was evicted with it");
        assert_eq!(p.lookup(&hb), Some(b), "b's survives");
        p.release(b);
        p.release(c);
        p.release(a);
        assert_eq!(p.free(), 3);
        p.check().unwrap();
    }
}
