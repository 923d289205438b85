//! Prefix hashes: a full block of tokens is named by the BLAKE3 of its parent block's hash, the
//! adapter that computed it, and its tokens, so one hash names the whole prefix up to the block
//! end. Keys and values depend on every earlier token and on the adapter (its k/v projections
//! differ), so both are in the name.

/// The name of a full block of tokens and everything before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BlockHash([u8; 32]);

impl BlockHash {
    /// `adapter`: 0 for the base model, else the served adapter's load id (never reused, so an
    /// adapter loaded in place of another cannot hit its predecessor's blocks).
    pub fn of(parent: Option<&BlockHash>, adapter: u64, tokens: &[u32]) -> BlockHash {
        let mut h = blake3::Hasher::new();
        h.update(parent.map_or(&[0u8; 32], |p| &p.0));
        h.update(&adapter.to_le_bytes());
        for t in tokens {
            h.update(&t.to_le_bytes());
        }
        BlockHash(*h.finalize().as_bytes())
    }

    /// The hashes of the full blocks of `tokens`, in order.
    pub fn chain(tokens: &[u32], block_size: usize, adapter: u64) -> Vec<BlockHash> {
        let mut out: Vec<BlockHash> = Vec::with_capacity(tokens.len() / block_size.max(1));
        for block in tokens.chunks_exact(block_size.max(1)) {
            out.push(BlockHash::of(out.last(), adapter, block));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_hash_names_its_whole_prefix_and_its_adapter() {
        let a = BlockHash::chain(&[1, 2, 3, 4, 5, 6, 7], 2, 0);
        assert_eq!(a.len(), 3);
        let b = BlockHash::chain(&[1, 2, 3, 4, 9, 9], 2, 0);
        assert_eq!(a[..2], b[..2]);
        assert_ne!(a[2], b[2]);
        // Same block tokens after another prefix, or under another adapter: other names.
        assert_ne!(BlockHash::chain(&[0, 0, 3, 4], 2, 0)[1], a[1]);
        assert_ne!(BlockHash::chain(&[1, 2], 2, 1)[0], a[0]);
    }
}
