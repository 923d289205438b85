//! A small seeded generator (SplitMix64) for weight init and dropout masks: the same seed
//! gives the same numbers on every platform and thread count, and streams are derived from
//! `(seed, purpose)` so a recomputed forward (activation checkpointing) draws the same mask.

use mindxtrain_kernels::seeded;

pub struct SplitMix64(u64);

impl SplitMix64 {
    #[cfg_attr(not(test), allow(dead_code))]
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    /// An independent stream for one use of one seed (e.g. one layer's dropout in one step).
    pub fn derive(seed: u64, parts: &[u64]) -> Self {
        let mut s = SplitMix64(seed);
        let mut h = s.next_u64();
        for &p in parts {
            h = SplitMix64(h ^ p.wrapping_mul(seeded::GAMMA)).next_u64();
        }
        SplitMix64(h)
    }

    /// The state: the stream as `mindxtrain_kernels::seeded` draws it (on the device, too).
    pub fn state(&self) -> u64 {
        self.0
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(seeded::GAMMA);
        seeded::mix(self.0)
    }

    /// Uniform in `[0, 1)` with 53 random bits.
    pub fn unit(&mut self) -> f64 {
        seeded::unit(self.next_u64())
    }

    /// Standard normal (Box–Muller over two draws, as `seeded` draws the weight init; the tests
    /// walk streams with it).
    #[cfg_attr(not(test), allow(dead_code))]
    pub fn normal(&mut self) -> f64 {
        let a = self.next_u64();
        seeded::box_muller(a, self.next_u64())
    }
}

/// A string as a stream id (FNV-1a), so streams can be named by parameter.
pub fn name_id(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x0100_0000_01b3))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_are_reproducible_and_distinct() {
        let a: Vec<u64> = (0..4).map(|_| SplitMix64::derive(7, &[1, 2]).next_u64()).collect();
        assert!(a.windows(2).all(|w| w[0] == w[1]));
        assert_ne!(SplitMix64::derive(7, &[1, 2]).next_u64(), SplitMix64::derive(7, &[2, 1]).next_u64());
        let mut r = SplitMix64::new(3);
        let xs: Vec<f64> = (0..20_000).map(|_| r.normal()).collect();
        let mean = xs.iter().sum::<f64>() / xs.len() as f64;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / xs.len() as f64;
        assert!(mean.abs() < 0.03 && (var - 1.0).abs() < 0.05, "{mean} {var}");
    }
}
