//! The paged key/value cache's bookkeeping: a pool of fixed-size blocks with reference counts
//! and an LRU free list ([`pool`]), prefix hashes ([`hash`]), the blocks of each sequence
//! ([`manager`]), and how many blocks fit in the device's memory ([`sizing`]). Plain data: the
//! cache tensors themselves belong to the runner.

pub mod hash;
pub mod manager;
pub mod pool;
pub mod sizing;

pub use hash::BlockHash;
pub use manager::{Hit, KvManager, SeqId};
pub use pool::{BlockId, BlockPool};
pub use sizing::KvBlocks;
