//! Near-duplicate removal (`data.dedupe.near_threshold`): an example whose Jaccard similarity to
//! an earlier kept example is at least the threshold is dropped; the first of a group, in file
//! order, is kept.
//!
//! Similarity is that of shingle sets ([`shingles`]): word 5-grams of the example's text after
//! lowercasing and splitting on whitespace, as datatrove's and text-dedup's MinHash pipelines
//! cut them. MinHash LSH only proposes candidates: each example's signature (`bands × rows`
//! seeded permutations) is cut into bands, and kept examples that share a band with it are
//! candidates. Every candidate is then compared by the **exact** Jaccard of the two shingle
//! sets, so a false candidate costs one comparison and never drops an example: a dropped example
//! really is at least `threshold` similar to a kept one. What LSH can do is miss a pair; the
//! bands and rows are chosen from the threshold so that a pair exactly at it is found with
//! probability ≥ 99% ([`MISS_AT_THRESHOLD`]), and pairs above it more surely still.
//!
//! Memory stays within the dataset's streaming design: per kept example, one entry per band in
//! the band tables (a 4-byte key, a 4-byte id and the chain link, ~20 bytes with the tables'
//! slack) and the 8-byte end of its shingles, which are kept as sorted 64-bit hashes in
//! [`store::ShingleStore`] — the newest 1 MiB in memory, the rest in an unlinked temporary
//! file — and read back only for candidates.

mod shingles;
mod store;

use std::collections::HashMap;

use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::{RngCore, SeedableRng};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use super::error::DataError;
use super::example::Example;
pub use shingles::{SHINGLE, SHINGLE_WORDS, jaccard, shingles};
use store::{ShingleStore, TAIL};

/// Permutations the signature may use; the threshold decides how many of them form the bands.
pub const PERMUTATIONS: u32 = 128;

/// The most a pair exactly at the threshold may be missed by LSH, when [`PERMUTATIONS`] allow it
/// (every threshold from 0.04 up).
pub const MISS_AT_THRESHOLD: f64 = 0.01;

/// The Mersenne prime 2^61 − 1: permutations are `(a·x + b) mod p`, as datasketch's MinHash.
const MERSENNE: u64 = (1 << 61) - 1;

/// What the manifest records of a near-dedupe pass: enough to redo it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NearDedupeParams {
    pub threshold: f64,
    /// How text is cut into shingles ([`SHINGLE`]).
    pub shingle: String,
    /// Signature length: `bands × rows`.
    pub permutations: u32,
    pub bands: u32,
    pub rows: u32,
}

/// An example's shingles and the keys of its signature's bands.
struct Sketch {
    shingles: Vec<u64>,
    keys: Vec<u32>,
}

/// The streaming near-dedupe pass: examples come in file order, block by block ([`NearDedupe::filter`]).
pub struct NearDedupe {
    threshold: f64,
    bands: usize,
    rows: usize,
    /// `(a, b)` of each permutation, fixed by a constant seed: the same data keeps the same set.
    coefficients: Vec<(u64, u64)>,
    /// Per band: key → the latest kept example with that key.
    tables: Vec<HashMap<u32, u32>>,
    /// `chain[id × bands + band]`: the kept example before `id` with the same key in `band`.
    chain: Vec<u32>,
    store: ShingleStore,
    removed: u64,
}

const NO_EXAMPLE: u32 = u32::MAX;

impl NearDedupe {
    pub fn new(threshold: f64) -> NearDedupe {
        let (bands, rows) = bands_and_rows(threshold);
        let mut key = [0u8; 32];
        key.copy_from_slice(blake3::Hasher::new_derive_key("mindxtrain near-dedupe v1").finalize().as_bytes());
        let mut rng = ChaCha8Rng::from_seed(key);
        let coefficients =
            (0..bands * rows).map(|_| (1 + rng.next_u64() % (MERSENNE - 1), rng.next_u64() % MERSENNE)).collect();
        NearDedupe {
            threshold,
            bands,
            rows,
            coefficients,
            tables: vec![HashMap::new(); bands],
            chain: Vec::new(),
            store: ShingleStore::new(TAIL),
            removed: 0,
        }
    }

    pub fn params(&self) -> NearDedupeParams {
        NearDedupeParams {
            threshold: self.threshold,
            shingle: SHINGLE.to_owned(),
            permutations: (self.bands * self.rows) as u32,
            bands: self.bands as u32,
            rows: self.rows as u32,
        }
    }

    /// Examples dropped so far.
    pub fn removed(&self) -> u64 {
        self.removed
    }

    /// Which of `examples` (the next ones in file order) are kept: not near duplicates of an
    /// example kept before them. Sketches are computed on the rayon pool; the decisions are
    /// taken in order, so they do not depend on how the examples were cut into blocks.
    pub fn filter(&mut self, examples: &[&Example]) -> Result<Vec<bool>, DataError> {
        let sketches: Vec<Sketch> = examples.par_iter().map(|e| self.sketch(e)).collect();
        sketches.into_iter().map(|s| self.admit(s)).collect()
    }

    fn sketch(&self, example: &Example) -> Sketch {
        let shingles = shingles(example);
        let keys = self.signature(&shingles).chunks(self.rows).map(band_key).collect();
        Sketch { shingles, keys }
    }

    /// The MinHash signature: each permutation's least image of a shingle (`u64::MAX` for none).
    fn signature(&self, shingles: &[u64]) -> Vec<u64> {
        let reduced: Vec<u64> = shingles.iter().map(|&x| x % MERSENNE).collect();
        self.coefficients
            .iter()
            .map(|&(a, b)| reduced.iter().map(|&x| permute(a, b, x)).min().unwrap_or(u64::MAX))
            .collect()
    }

    /// Keeps `sketch`'s example (and indexes it) unless it is a near duplicate of a kept one.
    fn admit(&mut self, sketch: Sketch) -> Result<bool, DataError> {
        if self.is_near_duplicate(&sketch)? {
            self.removed += 1;
            return Ok(false);
        }
        let id = self.store.len();
        for (band, key) in sketch.keys.iter().enumerate() {
            let before = self.tables[band].insert(*key, id).unwrap_or(NO_EXAMPLE);
            self.chain.push(before);
        }
        self.store.push(&sketch.shingles)?;
        Ok(true)
    }

    fn is_near_duplicate(&self, sketch: &Sketch) -> Result<bool, DataError> {
        if self.threshold <= 0.0 {
            // Every pair is at least 0 similar (LSH cannot find pairs that share nothing).
            return Ok(self.store.len() > 0);
        }
        let mut candidates = Vec::new();
        for (band, key) in sketch.keys.iter().enumerate() {
            let mut id = self.tables[band].get(key).copied().unwrap_or(NO_EXAMPLE);
            while id != NO_EXAMPLE {
                candidates.push(id);
                id = self.chain[id as usize * self.bands + band];
            }
        }
        candidates.sort_unstable();
        candidates.dedup();
        let mut scratch = Vec::new();
        for id in candidates {
            // |a ∩ b| / |a ∪ b| ≤ min / max: a much shorter or longer set is not read back.
            // (Divided as in `jaccard`: rounding keeps the bound, so no pair at the threshold is
            // skipped.)
            let (a, b) = (sketch.shingles.len(), self.store.count(id));
            if a.max(b) > 0 && (a.min(b) as f64 / a.max(b) as f64) < self.threshold {
                continue;
            }
            if jaccard(&sketch.shingles, self.store.get(id, &mut scratch)?) >= self.threshold {
                return Ok(true);
            }
        }
        Ok(false)
    }
}

/// `(a·x + b) mod 2^61 − 1` for `x` below the prime.
fn permute(a: u64, b: u64, x: u64) -> u64 {
    let v = u128::from(a) * u128::from(x) + u128::from(b);
    let folded = (v & u128::from(MERSENNE)) + (v >> 61);
    let r = ((folded & u128::from(MERSENNE)) + (folded >> 61)) as u64;
    if r >= MERSENNE { r - MERSENNE } else { r }
}

/// One band of a signature as a table key. Keys are 32 bits: two bands that collide by chance
/// only add a candidate, which the exact comparison then turns down.
fn band_key(band: &[u64]) -> u32 {
    let mut bytes = [0u8; 8 * PERMUTATIONS as usize];
    for (chunk, v) in bytes.chunks_exact_mut(8).zip(band) {
        chunk.copy_from_slice(&v.to_le_bytes());
    }
    twox_hash::XxHash3_64::oneshot(&bytes[..8 * band.len()]) as u32
}

/// Bands × rows for `threshold`: the most rows per band (the fewest false candidates) whose
/// fewest bands still find a pair at the threshold with probability ≥ 1 − [`MISS_AT_THRESHOLD`]
/// within [`PERMUTATIONS`]. text-dedup's search weighs false positives against false negatives;
/// here the exact comparison removes every false positive, so only the misses are bounded. The
/// powers are taken by repeated multiplication, so the choice is the same on every machine.
/// Below ~0.036 no choice reaches the bound, and every permutation is its own band.
pub fn bands_and_rows(threshold: f64) -> (usize, usize) {
    let budget = PERMUTATIONS as usize;
    for rows in (1..=budget).rev() {
        let one_band = (0..rows).fold(1.0, |p, _| p * threshold);
        let mut missed = 1.0;
        for bands in 1..=budget / rows {
            missed *= 1.0 - one_band;
            if missed <= MISS_AT_THRESHOLD {
                return (bands, rows);
            }
        }
    }
    (budget, 1)
}

#[cfg(test)]
mod tests;
