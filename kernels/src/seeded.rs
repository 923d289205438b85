//! Seeded normal draws, the trainer's weight init: value `i` of a tensor is `scale · N(0, 1)`
//! drawn by the SplitMix64 stream whose state is `states[i / block]`, as that stream's draw
//! `j = i % block` (Box–Muller over its calls `2j + 1` and `2j + 2`). SplitMix64 is counter-based:
//! its state after `c` calls is `state + c·γ`, so every value can be computed on its own. On a GPU
//! the whole tensor fills in one launch (`cuda/seeded.cu`) instead of being drawn on the host and
//! copied (an 8B model's 8.2 billion values took 35 s on 16 cores); [`host`] is the reference and
//! the CPU path.
//!
//! The GPU computes the same f64 function; it can differ from the host in the last bit where
//! CUDA's `log`/`cos` round differently from the host's libm (`scripts/gpu-test` bounds it).

use candle_core::{DType, Device, Result, Tensor};

/// SplitMix64's increment (the golden ratio).
pub const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// SplitMix64's output function of a state.
pub fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Uniform in `[0, 1)` from the top 53 bits of a draw.
pub fn unit(x: u64) -> f64 {
    (x >> 11) as f64 / (1u64 << 53) as f64
}

/// A standard normal from two consecutive draws (Box–Muller, the cosine branch).
pub fn box_muller(a: u64, b: u64) -> f64 {
    let (u1, u2) = (1.0 - unit(a), unit(b));
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

/// Draw `j` of the stream whose state is `state`.
fn normal_at(state: u64, j: u64) -> f64 {
    let call = |c: u64| mix(state.wrapping_add(c.wrapping_mul(GAMMA)));
    box_muller(call(2 * j + 1), call(2 * j + 2))
}

/// The `n` values on the host, blocks in parallel.
pub fn host(states: &[u64], block: usize, n: usize, scale: f64) -> Result<Vec<f64>> {
    use rayon::prelude::*;
    check(states, block, n)?;
    let mut v = vec![0f64; n];
    v.par_chunks_mut(block).zip(states).for_each(|(values, &state)| {
        values.iter_mut().enumerate().for_each(|(j, x)| *x = scale * normal_at(state, j as u64));
    });
    Ok(v)
}

/// The `n` values as an f64 tensor `[n]` on `device`: drawn there on a CUDA device, on the host
/// (then copied) elsewhere.
pub fn normal(states: &[u64], block: usize, n: usize, scale: f64, device: &Device) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if device.is_cuda() {
        check(states, block, n)?;
        return crate::gpu::seeded::normal(states, block, n, scale, device);
    }
    Tensor::from_vec(host(states, block, n, scale)?, n, device)
}

/// Inverted dropout's mask of `shape`: value `i` is 0 where draw `i + 1` of the stream whose state
/// is `state` is uniform below `p`, and `1 / (1 − p)` elsewhere: what a sequential generator
/// drawing one value per element gives, computed per element. On a CUDA device it fills in one
/// launch: the mask of one LoRA projection at 4 × 2048 tokens of a 3B model is 21 million
/// values, which drawn on the host and copied made a step 100× slower than the GEMMs.
pub fn dropout_mask(state: u64, p: f64, shape: &[usize], dtype: DType, device: &Device) -> Result<Tensor> {
    if !(0.0..1.0).contains(&p) {
        candle_core::bail!("seeded: dropout probability {p} is outside [0, 1)");
    }
    let n: usize = shape.iter().product();
    let keep = (1.0 / (1.0 - p)) as f32;
    #[cfg(feature = "cuda")]
    if device.is_cuda() {
        return crate::gpu::seeded::dropout_mask(state, n, p, keep, device)?.reshape(shape)?.to_dtype(dtype);
    }
    Tensor::from_vec(dropout_host(state, p, keep, n), shape, device)?.to_dtype(dtype)
}

/// [`dropout_mask`]'s values on the host, in parallel.
pub fn dropout_host(state: u64, p: f64, keep: f32, n: usize) -> Vec<f32> {
    use rayon::prelude::*;
    (0..n as u64)
        .into_par_iter()
        .map(|i| if unit(mix(state.wrapping_add((i + 1).wrapping_mul(GAMMA)))) < p { 0.0 } else { keep })
        .collect()
}

fn check(states: &[u64], block: usize, n: usize) -> Result<()> {
    if block == 0 || states.len() != n.div_ceil(block) {
        candle_core::bail!("seeded: {} stream states for {n} values in blocks of {block}", states.len());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dropout_mask_is_a_sequential_stream_drawn_per_element() {
        let (state, p) = (0x1234_5678_9abc_def0u64, 0.3);
        let got = dropout_mask(state, p, &[3, 1000], DType::F32, &Device::Cpu).unwrap();
        let got = got.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let mut s = state;
        let keep = (1.0 / (1.0 - p)) as f32;
        for (i, g) in got.iter().enumerate() {
            s = s.wrapping_add(GAMMA);
            assert_eq!(*g, if unit(mix(s)) < p { 0.0 } else { keep }, "value {i}");
        }
        let dropped = got.iter().filter(|v| **v == 0.0).count() as f64 / got.len() as f64;
        assert!((dropped - p).abs() < 0.04, "dropped {dropped}");
        assert!(dropout_mask(state, 1.0, &[2], DType::F32, &Device::Cpu).is_err());
    }

    #[test]
    fn each_value_is_its_streams_draw_in_order() {
        // Walk two streams call by call, as a sequential generator would.
        let states = [7u64, u64::MAX - 3];
        let (block, n) = (5, 8);
        let got = host(&states, block, n, 0.5).unwrap();
        for (b, &s0) in states.iter().enumerate() {
            let mut s = s0;
            let mut next = || {
                s = s.wrapping_add(GAMMA);
                mix(s)
            };
            for j in 0..block.min(n - b * block) {
                let (a, c) = (next(), next());
                assert_eq!(got[b * block + j], 0.5 * box_muller(a, c), "value {j} of block {b}");
            }
        }
        assert!(host(&states, block, 11, 0.5).is_err());
        assert!(host(&states, 0, 0, 0.5).is_err());
    }
}
