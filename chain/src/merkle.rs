//! RFC 6962-shaped Merkle trees with BLAKE3.
//!
//! The same tree serves the event log (leaves = event hashes) and batch anchoring
//! (leaves = manifest digests and log checkpoints), so one proof format covers both.
//!
//! * leaf hash: `BLAKE3(0x00 ‖ item)` where `item` is the 32-byte digest being logged;
//! * interior node: `BLAKE3(0x01 ‖ left ‖ right)`;
//! * the tree of `n` leaves splits at `k`, the largest power of two below `n`
//!   (RFC 6962 §2.1), so every size has exactly one shape.
//!
//! Proof verification follows RFC 9162 §2.1.3.2 (inclusion) and §2.1.4.2
//! (consistency), which work with `index`/`size` arithmetic alone.
//!
//! ```
//! use mindxtrain_chain::merkle::{leaf_hash, root, inclusion_proof, verify_inclusion};
//! let leaves: Vec<[u8; 32]> = (0u8..5).map(|i| leaf_hash(&[i; 32])).collect();
//! let r = root(&leaves);
//! let proof = inclusion_proof(&leaves, 3).unwrap();
//! assert!(verify_inclusion(&leaves[3], 3, 5, &proof, &r).is_ok());
//! ```

use thiserror::Error;

/// A 32-byte BLAKE3 digest.
pub type Hash = [u8; 32];

/// Why a proof could not be built or did not verify.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum ProofError {
    #[error("index {index} is outside a tree of size {size}")]
    IndexOutOfRange { index: u64, size: u64 },
    #[error("consistency needs 0 < old size ({old}) <= new size ({new})")]
    BadSizes { old: u64, new: u64 },
    #[error("proof has {got} hashes, a tree of this shape needs {want}")]
    WrongLength { got: usize, want: usize },
    #[error("recomputed root {computed} does not match expected root {expected}")]
    RootMismatch { computed: String, expected: String },
}

/// `BLAKE3(0x00 ‖ item)`: the hash of one logged item.
pub fn leaf_hash(item: &[u8]) -> Hash {
    let mut h = blake3::Hasher::new();
    h.update(&[0x00]);
    h.update(item);
    *h.finalize().as_bytes()
}

/// `BLAKE3(0x01 ‖ left ‖ right)`.
pub fn node_hash(left: &Hash, right: &Hash) -> Hash {
    let mut buf = [0u8; 65];
    buf[0] = 0x01;
    buf[1..33].copy_from_slice(left);
    buf[33..].copy_from_slice(right);
    *blake3::hash(&buf).as_bytes()
}

/// Root of the empty tree: `BLAKE3("")`, as RFC 6962 defines MTH({}).
pub fn empty_root() -> Hash {
    *blake3::hash(b"").as_bytes()
}

/// Largest power of two strictly below `n` (n ≥ 2).
fn split(n: usize) -> usize {
    debug_assert!(n >= 2);
    1 << (usize::BITS - 1 - (n - 1).leading_zeros())
}

/// Merkle tree head over already leaf-hashed items.
///
/// Runs bottom-up in one pass without recursion, so large logs need no stack depth;
/// the pairing order reproduces RFC 6962's left-heavy split exactly.
pub fn root(leaves: &[Hash]) -> Hash {
    if leaves.is_empty() {
        return empty_root();
    }
    // Stack of (subtree size, hash); merging equal sizes left to right builds the
    // complete subtrees, and folding what remains right to left yields the RFC shape.
    let mut stack: Vec<(usize, Hash)> = Vec::with_capacity(64);
    for leaf in leaves {
        let mut cur = (1usize, *leaf);
        while let Some(&(size, ref h)) = stack.last() {
            if size != cur.0 {
                break;
            }
            cur = (size * 2, node_hash(h, &cur.1));
            stack.pop();
        }
        stack.push(cur);
    }
    let mut acc = stack.pop().expect("non-empty").1;
    while let Some((_, h)) = stack.pop() {
        acc = node_hash(&h, &acc);
    }
    acc
}

/// Audit path for `index` in the tree over `leaves` (RFC 6962 PATH(m, D[n])), leaf
/// side first.
pub fn inclusion_proof(leaves: &[Hash], index: u64) -> Result<Vec<Hash>, ProofError> {
    let size = leaves.len() as u64;
    if index >= size {
        return Err(ProofError::IndexOutOfRange { index, size });
    }
    let mut proof = Vec::new();
    path(leaves, index as usize, &mut proof);
    Ok(proof)
}

fn path(leaves: &[Hash], m: usize, out: &mut Vec<Hash>) {
    let n = leaves.len();
    if n <= 1 {
        return;
    }
    let k = split(n);
    if m < k {
        path(&leaves[..k], m, out);
        out.push(root(&leaves[k..]));
    } else {
        path(&leaves[k..], m - k, out);
        out.push(root(&leaves[..k]));
    }
}

/// Checks that `leaf` sits at `index` of the tree of `size` leaves whose head is `root`.
pub fn verify_inclusion(
    leaf: &Hash,
    index: u64,
    size: u64,
    proof: &[Hash],
    expected_root: &Hash,
) -> Result<(), ProofError> {
    if index >= size {
        return Err(ProofError::IndexOutOfRange { index, size });
    }
    let computed = root_from_inclusion(leaf, index, size, proof)?;
    check_root(&computed, expected_root)
}

/// The root implied by an inclusion proof (RFC 9162 §2.1.3.2), without comparing it.
pub fn root_from_inclusion(leaf: &Hash, index: u64, size: u64, proof: &[Hash]) -> Result<Hash, ProofError> {
    if index >= size {
        return Err(ProofError::IndexOutOfRange { index, size });
    }
    let (mut fnode, mut snode) = (index, size - 1);
    let mut r = *leaf;
    for p in proof {
        if snode == 0 {
            return Err(ProofError::WrongLength { got: proof.len(), want: proof.len() - 1 });
        }
        if fnode & 1 == 1 || fnode == snode {
            r = node_hash(p, &r);
            while fnode & 1 == 0 && fnode != 0 {
                fnode >>= 1;
                snode >>= 1;
            }
        } else {
            r = node_hash(&r, p);
        }
        fnode >>= 1;
        snode >>= 1;
    }
    if snode != 0 {
        return Err(ProofError::WrongLength { got: proof.len(), want: proof.len() + 1 });
    }
    Ok(r)
}

/// Consistency proof between the tree of the first `old_size` leaves and the tree of
/// all `leaves` (RFC 6962 PROOF(m, D[n])).
pub fn consistency_proof(leaves: &[Hash], old_size: u64) -> Result<Vec<Hash>, ProofError> {
    let new = leaves.len() as u64;
    if old_size == 0 || old_size > new {
        return Err(ProofError::BadSizes { old: old_size, new });
    }
    let mut out = Vec::new();
    if old_size < new {
        subproof(old_size as usize, leaves, true, &mut out);
    }
    Ok(out)
}

fn subproof(m: usize, leaves: &[Hash], complete: bool, out: &mut Vec<Hash>) {
    let n = leaves.len();
    if m == n {
        if !complete {
            out.push(root(leaves));
        }
        return;
    }
    let k = split(n);
    if m <= k {
        subproof(m, &leaves[..k], complete, out);
        out.push(root(&leaves[k..]));
    } else {
        subproof(m - k, &leaves[k..], false, out);
        out.push(root(&leaves[..k]));
    }
}

/// Checks that the tree of `new_size` with head `new_root` extends the tree of
/// `old_size` with head `old_root` (RFC 9162 §2.1.4.2).
pub fn verify_consistency(
    old_size: u64,
    new_size: u64,
    old_root: &Hash,
    new_root: &Hash,
    proof: &[Hash],
) -> Result<(), ProofError> {
    if old_size == 0 || old_size > new_size {
        return Err(ProofError::BadSizes { old: old_size, new: new_size });
    }
    if old_size == new_size {
        if !proof.is_empty() {
            return Err(ProofError::WrongLength { got: proof.len(), want: 0 });
        }
        check_root(old_root, new_root)?;
        return Ok(());
    }
    // When old_size is a power of two the old root itself starts the path.
    let mut path: Vec<Hash> = Vec::with_capacity(proof.len() + 1);
    if old_size.is_power_of_two() {
        path.push(*old_root);
    }
    path.extend_from_slice(proof);
    if path.is_empty() {
        return Err(ProofError::WrongLength { got: 0, want: 1 });
    }
    let (mut fnode, mut snode) = (old_size - 1, new_size - 1);
    while fnode & 1 == 1 {
        fnode >>= 1;
        snode >>= 1;
    }
    let mut fr = path[0];
    let mut sr = path[0];
    for c in &path[1..] {
        if snode == 0 {
            return Err(ProofError::WrongLength { got: proof.len(), want: proof.len() - 1 });
        }
        if fnode & 1 == 1 || fnode == snode {
            fr = node_hash(c, &fr);
            sr = node_hash(c, &sr);
            while fnode & 1 == 0 && fnode != 0 {
                fnode >>= 1;
                snode >>= 1;
            }
        } else {
            sr = node_hash(&sr, c);
        }
        fnode >>= 1;
        snode >>= 1;
    }
    if snode != 0 {
        return Err(ProofError::WrongLength { got: proof.len(), want: proof.len() + 1 });
    }
    check_root(&fr, old_root)?;
    check_root(&sr, new_root)
}

fn check_root(computed: &Hash, expected: &Hash) -> Result<(), ProofError> {
    if computed == expected {
        Ok(())
    } else {
        Err(ProofError::RootMismatch { computed: hex::encode(computed), expected: hex::encode(expected) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn leaves(n: usize) -> Vec<Hash> {
        (0..n).map(|i| leaf_hash(&(i as u64).to_le_bytes())).collect()
    }

    /// Textbook recursive MTH, the reference the iterative `root` must equal.
    fn reference_root(l: &[Hash]) -> Hash {
        match l.len() {
            0 => empty_root(),
            1 => l[0],
            n => {
                let k = split(n);
                node_hash(&reference_root(&l[..k]), &reference_root(&l[k..]))
            }
        }
    }

    #[test]
    fn iterative_root_matches_recursive_definition() {
        for n in 0..130 {
            let l = leaves(n);
            assert_eq!(root(&l), reference_root(&l), "n={n}");
        }
    }

    #[test]
    fn domain_separation_distinguishes_leaf_and_node() {
        let a = [7u8; 32];
        let mut two = [0u8; 64];
        two[..32].copy_from_slice(&a);
        two[32..].copy_from_slice(&a);
        assert_ne!(leaf_hash(&two), node_hash(&a, &a));
    }

    #[test]
    fn every_inclusion_proof_verifies_and_tampering_fails() {
        for n in 1..70usize {
            let l = leaves(n);
            let r = root(&l);
            for i in 0..n {
                let p = inclusion_proof(&l, i as u64).unwrap();
                verify_inclusion(&l[i], i as u64, n as u64, &p, &r).unwrap();
                // A wrong leaf, index or flipped proof hash must fail.
                let other = leaf_hash(b"other");
                assert!(verify_inclusion(&other, i as u64, n as u64, &p, &r).is_err());
                if n > 1 {
                    let j = (i + 1) % n;
                    assert!(verify_inclusion(&l[i], j as u64, n as u64, &p, &r).is_err());
                }
                for k in 0..p.len() {
                    let mut bad = p.clone();
                    bad[k][0] ^= 1;
                    assert!(verify_inclusion(&l[i], i as u64, n as u64, &bad, &r).is_err());
                }
            }
        }
    }

    #[test]
    fn every_consistency_proof_verifies_and_tampering_fails() {
        for n in 1..60usize {
            let l = leaves(n);
            let new_root = root(&l);
            for m in 1..=n {
                let old_root = root(&l[..m]);
                let p = consistency_proof(&l, m as u64).unwrap();
                verify_consistency(m as u64, n as u64, &old_root, &new_root, &p).unwrap();
                let mut wrong_old = old_root;
                wrong_old[3] ^= 0x10;
                assert!(verify_consistency(m as u64, n as u64, &wrong_old, &new_root, &p).is_err());
                for k in 0..p.len() {
                    let mut bad = p.clone();
                    bad[k][31] ^= 1;
                    assert!(verify_consistency(m as u64, n as u64, &old_root, &new_root, &bad).is_err());
                }
            }
        }
    }

    #[test]
    fn out_of_range_is_a_typed_error() {
        let l = leaves(3);
        assert_eq!(inclusion_proof(&l, 3), Err(ProofError::IndexOutOfRange { index: 3, size: 3 }));
        assert!(consistency_proof(&l, 0).is_err());
        assert!(consistency_proof(&l, 4).is_err());
    }

    proptest! {
        #[test]
        fn random_proofs_never_panic(
            index in 0u64..1000, size in 0u64..1000,
            hashes in proptest::collection::vec(any::<[u8; 32]>(), 0..12),
            old in 0u64..1000, new in 0u64..1000,
        ) {
            let leaf = [1u8; 32];
            let _ = verify_inclusion(&leaf, index, size, &hashes, &[2u8; 32]);
            let _ = verify_consistency(old, new, &[3u8; 32], &[4u8; 32], &hashes);
        }
    }
}
