//! The first two tests run anywhere: the embedded code objects hold every kernel for every
//! target, and a machine without an AMD GPU gets a typed error. The others run the kernels on an
//! AMD GPU (ignored here, where there is none: `scripts/hip-test` runs them on one) against the
//! crate's CPU kernels and references in f64, on inputs rounded through the kernel's type so both
//! sides see the same values, element by element with [`assert_close`]: f32 arithmetic within
//! 1e-4, bf16 storage within 1e-2. Outputs are NaN-poisoned before each launch
//! (`HipDevice::alloc` under cfg(test)), and NaN fails every comparison.

use super::module::{ATTENTION, CROSS_ENTROPY, ELEMENTWISE, Image, NF4, RMSNORM};
use super::{DeviceBuffer, Elem, Error, HipDevice, adamw, attention, cross_entropy, elementwise, nf4, rmsnorm};
use crate::gradcheck::{assert_close, random};
use candle_core::{DType, Device, Tensor, WithDType};

type Outcome<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

const F32_TOL: f64 = 1e-4;
const BF16_TOL: f64 = 1e-2;

#[test]
fn every_code_object_holds_its_kernels_for_every_target() {
    let images: [(&Image, &[&str]); 5] = [
        (&RMSNORM, &["rmsnorm_fwd", "add_rmsnorm_fwd", "rmsnorm_bwd", "rmsnorm_dw_partial", "sum_blocks"]),
        (&ELEMENTWISE, &["swiglu_fwd", "swiglu_bwd", "rope", "adamw"]),
        (&CROSS_ENTROPY, &["row_lse", "ce_chunk_grad"]),
        (&ATTENTION, &["attn_fwd", "attn_bwd_dq", "attn_bwd_dkdv"]),
        (&NF4, &["nf4_dequant"]),
    ];
    let targets: Vec<&str> = env!("MINDXTRAIN_HIP_TARGETS").split_whitespace().collect();
    assert!(!targets.is_empty());
    for (image, kernels) in images {
        let bytes = image.bytes();
        assert_eq!(bytes.as_ptr() as usize % 4096, 0, "{} is not page-aligned", image.name);
        let bundle = bundle_entries(bytes).unwrap_or_else(|| panic!("{} is not an offload bundle", image.name));
        for target in &targets {
            let id = format!("hipv4-amdgcn-amd-amdhsa--{target}");
            let (_, elf) = bundle.iter().find(|(i, _)| *i == id).unwrap_or_else(|| panic!("{}: no {id}", image.name));
            assert!(elf.starts_with(b"\x7fELF"), "{} {target}: not an ELF code object", image.name);
            for name in kernels.iter().flat_map(|k| [f32::kernel(k), half::bf16::kernel(k)]) {
                // Each kernel has a descriptor symbol `{name}.kd` in the code object.
                let symbol = format!("{name}.kd");
                let found = elf.windows(symbol.len()).any(|w| w == symbol.as_bytes());
                assert!(found, "{} {target}: no kernel {name}", image.name);
            }
        }
    }
}

/// The entries (target id, bytes) of a clang offload bundle: the magic, an entry count, then per
/// entry its offset, size, id length and id, all little-endian u64.
fn bundle_entries(bytes: &[u8]) -> Option<Vec<(&str, &[u8])>> {
    let rest = bytes.strip_prefix(b"__CLANG_OFFLOAD_BUNDLE__")?;
    let u64_at =
        |pos: usize| -> Option<usize> { Some(u64::from_le_bytes(rest.get(pos..pos + 8)?.try_into().ok()?) as usize) };
    let mut pos = 8;
    let mut entries = Vec::new();
    for _ in 0..u64_at(0)? {
        let (offset, size, id_len) = (u64_at(pos)?, u64_at(pos + 8)?, u64_at(pos + 16)?);
        let id = std::str::from_utf8(rest.get(pos + 24..pos + 24 + id_len)?).ok()?;
        entries.push((id, bytes.get(offset..offset + size)?));
        pos += 24 + id_len;
    }
    Some(entries)
}

#[test]
fn without_an_amd_gpu_opening_a_device_is_a_typed_error() {
    // /dev/kfd is the AMD GPU driver's device: without it there is no AMD GPU to open.
    if std::path::Path::new("/dev/kfd").exists() {
        return;
    }
    match HipDevice::new(0) {
        Err(Error::Hip(e)) => {
            assert_ne!(e.code, 0);
            assert!(!e.message.is_empty());
            assert!(e.to_string().starts_with(&format!("{} failed: ", e.call)), "{e}");
        }
        Err(other) => panic!("not a HIP runtime error: {other}"),
        Ok(_) => panic!("opened a HIP device without /dev/kfd"),
    }
}

fn gpu() -> Outcome<HipDevice> {
    Ok(HipDevice::new(0)?)
}

/// Random values in `[-scale, scale)` rounded through `T`: on the device, and in f64 on the CPU.
fn input<T: Elem + WithDType>(
    dev: &HipDevice,
    shape: &[usize],
    seed: u64,
    scale: f64,
) -> Outcome<(DeviceBuffer<T>, Tensor)> {
    let x = (random(shape, seed, &Device::Cpu)? * scale)?.to_dtype(T::DTYPE)?;
    Ok((dev.upload(&x.flatten_all()?.to_vec1::<T>()?)?, x.to_dtype(DType::F64)?))
}

/// A CPU tensor's values as `T`, on the device.
fn upload<T: Elem + WithDType>(dev: &HipDevice, t: &Tensor) -> Outcome<DeviceBuffer<T>> {
    Ok(dev.upload(&t.to_dtype(T::DTYPE)?.flatten_all()?.to_vec1::<T>()?)?)
}

/// Checks a device result against `want` (same element count, f64 on the CPU).
fn expect<T: Elem + WithDType>(what: &str, got: &DeviceBuffer<T>, want: &Tensor, tol: f64) -> Outcome {
    let got = Tensor::from_vec(got.to_vec()?, want.dims(), &Device::Cpu)?.to_dtype(DType::F64)?;
    assert_close(&got, want, tol).map_err(|e| format!("{what} ({}): {e}", T::SUFFIX))?;
    Ok(())
}

/// Runs `case` for f32 and bf16 with their tolerances.
macro_rules! both_types {
    ($case:ident) => {{
        let dev = gpu()?;
        $case::<f32>(&dev, F32_TOL)?;
        $case::<half::bf16>(&dev, BF16_TOL)
    }};
}

fn rmsnorm_case<T: Elem + WithDType>(dev: &HipDevice, tol: f64) -> Outcome {
    // d = 100 (not a multiple of the wavefront), 128, 4096; rows past several dw blocks.
    for (rows, d) in [(3 * 256 + 17, 100), (2000, 128), (600, 4096)] {
        let ((x, xr), (w, wr)) = (input::<T>(dev, &[rows, d], 1, 2.0)?, input::<T>(dev, &[d], 2, 1.0)?);
        let (dy, dyr) = input::<T>(dev, &[rows, d], 3, 1.0)?;
        let (y, rstd) = rmsnorm::forward(dev, &x, &w, 1e-6)?;
        let (y_ref, rstd_ref) = crate::rmsnorm::forward(&xr, &wr, 1e-6)?;
        expect("rmsnorm y", &y, &y_ref, tol)?;
        expect("rmsnorm rstd", &rstd, &rstd_ref, F32_TOL)?;
        let (dx, dw) = rmsnorm::backward(dev, &dy, &x, &w, &rstd, true)?;
        let (dx_ref, dw_ref) = crate::rmsnorm::backward(&dyr, &xr, &wr, &rstd_ref, true)?;
        expect("rmsnorm dx", &dx, &dx_ref, tol)?;
        let dw = dw.ok_or("no dw")?;
        expect("rmsnorm dw", &dw, &dw_ref.ok_or("no reference dw")?, tol)?;
        // No atomics: a second run gives the same bits.
        let again = rmsnorm::backward(dev, &dy, &x, &w, &rstd, true)?.1.ok_or("no dw")?;
        assert!(dw.to_vec()?.iter().zip(again.to_vec()?).all(|(a, b)| a.to_f64().to_bits() == b.to_f64().to_bits()));

        let (r, rr) = input::<T>(dev, &[rows, d], 4, 1.0)?;
        let (s, y, _) = rmsnorm::add_forward(dev, &x, &r, &w, 1e-6)?;
        // The kernel stores the sum in T, as a separate add would.
        let s_ref = (&xr + &rr)?.to_dtype(T::DTYPE)?.to_dtype(DType::F64)?;
        expect("add+rmsnorm s", &s, &s_ref, tol)?;
        expect("add+rmsnorm y", &y, &crate::rmsnorm::forward(&s_ref, &wr, 1e-6)?.0, tol)?;
    }
    Ok(())
}

#[test]
#[ignore = "needs an AMD GPU: run scripts/hip-test on one"]
fn rmsnorm_matches_the_cpu_kernels() -> Outcome {
    both_types!(rmsnorm_case)
}

fn swiglu_case<T: Elem + WithDType>(dev: &HipDevice, tol: f64) -> Outcome {
    // Gates over ±12 so both tails of the sigmoid are exercised; an odd size.
    let shape = [777, 3001];
    let ((g, gr), (u, ur)) = (input::<T>(dev, &shape, 5, 12.0)?, input::<T>(dev, &shape, 6, 1.0)?);
    let (dh, dhr) = input::<T>(dev, &shape, 7, 1.0)?;
    expect("swiglu h", &elementwise::swiglu_forward(dev, &g, &u)?, &crate::swiglu::forward(&gr, &ur)?, tol)?;
    let (dg, du) = elementwise::swiglu_backward(dev, &dh, &g, &u)?;
    let (dg_ref, du_ref) = crate::swiglu::backward(&dhr, &gr, &ur)?;
    expect("swiglu dgate", &dg, &dg_ref, tol)?;
    expect("swiglu dup", &du, &du_ref, tol)
}

#[test]
#[ignore = "needs an AMD GPU: run scripts/hip-test on one"]
fn swiglu_matches_the_cpu_kernels() -> Outcome {
    both_types!(swiglu_case)
}

fn rope_case<T: Elem + WithDType>(dev: &HipDevice, tol: f64) -> Outcome {
    let (tokens, heads, hd) = (1000, 16, 128);
    let positions: Vec<u32> = (0..tokens as u32).map(|p| (p * 7919) % 4096).collect();
    let (cos, sin) = crate::rope::tables(&positions, hd, 1e6, DType::F64, &Device::Cpu)?;
    let round = |t: &Tensor| -> candle_core::Result<Tensor> { t.to_dtype(T::DTYPE)?.to_dtype(DType::F64) };
    let (cos_r, sin_r) = (round(&cos)?.reshape((tokens, 1, hd))?, round(&sin)?.reshape((tokens, 1, hd))?);
    let (cos, sin) = (upload::<T>(dev, &cos_r)?, upload::<T>(dev, &sin_r)?);
    let ((x, xr), (dy, dyr)) =
        (input::<T>(dev, &[tokens, heads, hd], 8, 1.0)?, input::<T>(dev, &[tokens, heads, hd], 9, 1.0)?);
    let y = elementwise::rope_forward(dev, &x, &cos, &sin, hd)?;
    expect("rope y", &y, &crate::rope::forward(&xr, &cos_r, &sin_r)?, tol)?;
    let dx = elementwise::rope_backward(dev, &dy, &cos, &sin, hd)?;
    expect("rope dx", &dx, &crate::rope::backward(&dyr, &cos_r, &sin_r)?, tol)
}

#[test]
#[ignore = "needs an AMD GPU: run scripts/hip-test on one"]
fn rope_matches_the_cpu_kernels() -> Outcome {
    both_types!(rope_case)
}

fn adamw_case<T: Elem + WithDType>(dev: &HipDevice, tol: f64) -> Outcome {
    let n = [1000, 333];
    let ((p, pr), (g, gr)) = (input::<T>(dev, &n, 10, 1.0)?, input::<T>(dev, &n, 11, 0.1)?);
    // Moments as after some steps: m of either sign, v positive.
    let (m, mr) = input::<f32>(dev, &n, 12, 0.01)?;
    let vr = mr.sqr()?.affine(3.0, 1e-6)?.to_dtype(DType::F32)?.to_dtype(DType::F64)?;
    let v = upload::<f32>(dev, &vr)?;
    for (step, decay) in [(1, true), (7, false)] {
        // lr 1e-2: steps of ~1e-2, far above the rounding of p, so a wrong update shows.
        let k = crate::adamw::Coefficients::new([0.9, 0.999], 1e-8, 0.01, 1e-2, step);
        let (p1, m1, v1) = adamw::step(dev, &k, decay, &p, &g, &m, &v)?;
        // The CPU update in f32 on the same values is the reference.
        let f32_of = |t: &Tensor| t.to_dtype(DType::F32);
        let (p_ref, m_ref, v_ref) =
            crate::adamw::step(&k, decay, &f32_of(&pr)?, &f32_of(&gr)?, &f32_of(&mr)?, &f32_of(&vr)?)?;
        let f64_of = |t: Tensor| t.to_dtype(DType::F64);
        expect("adamw m", &m1, &f64_of(m_ref)?, F32_TOL)?;
        expect("adamw v", &v1, &f64_of(v_ref)?, F32_TOL)?;
        expect("adamw p", &p1, &f64_of(p_ref)?, tol)?;
    }
    Ok(())
}

#[test]
#[ignore = "needs an AMD GPU: run scripts/hip-test on one"]
fn adamw_matches_the_cpu_update() -> Outcome {
    both_types!(adamw_case)
}

fn cross_entropy_case<T: Elem + WithDType>(dev: &HipDevice, tol: f64) -> Outcome {
    use crate::lm_head_ce::reference;
    let (rows, cols, v0) = (300, 1536, 3072);
    let (logits, lr) = input::<T>(dev, &[rows, cols], 13, 8.0)?;
    let lse_ref = reference::row_lse(&lr)?;
    let lse = cross_entropy::row_lse(dev, &logits, cols)?;
    expect("row_lse", &lse, &lse_ref, F32_TOL)?;
    // Targets inside and outside the chunk.
    let targets: Vec<u32> =
        (0..rows as u32).map(|r| if r % 3 == 0 { v0 as u32 + r * 5 % cols as u32 } else { r * 41 }).collect();
    let (weight, wr) = input::<f32>(dev, &[rows, 1], 14, 1.0)?;
    let t_ref = Tensor::from_vec(targets.clone(), (rows, 1), &Device::Cpu)?;
    let want = reference::chunk_grad(&lr, &lse_ref, &wr, &t_ref, v0)?;
    let got = cross_entropy::chunk_grad(dev, &logits, cols, &lse, &weight, &dev.upload(&targets)?, v0)?;
    expect("ce_chunk_grad", &got, &want, tol)
}

#[test]
#[ignore = "needs an AMD GPU: run scripts/hip-test on one"]
fn cross_entropy_chunks_match_the_reference() -> Outcome {
    both_types!(cross_entropy_case)
}

fn attention_case<T: Elem + WithDType>(dev: &HipDevice, tol: f64) -> Outcome {
    use crate::attention::Mask;
    // GQA 8 over 2; batch row 1 packs three documents, row 0 one.
    let (batch, heads, kv_heads, tokens) = (2, 8, 2, 200);
    let segments: Vec<u32> =
        (0..batch * tokens).map(|i| if i < tokens { 0 } else { 1 + ((i - tokens) / 70) as u32 }).collect();
    let mask = Mask::new(&segments, batch, tokens)?;
    for head_dim in [64, 128] {
        let shape = attention::Shape { batch, heads, kv_heads, tokens, head_dim };
        let scale = 1.0 / (head_dim as f64).sqrt();
        let (qs, ks) = ([batch, heads, tokens, head_dim], [batch, kv_heads, tokens, head_dim]);
        let ((q, qr), (k, kr)) = (input::<T>(dev, &qs, 15, 2.0)?, input::<T>(dev, &ks, 16, 2.0)?);
        let ((v, vr), (dout, dor)) = (input::<T>(dev, &ks, 17, 1.0)?, input::<T>(dev, &qs, 18, 1.0)?);
        let (out, lse) = attention::forward(dev, shape, &q, &k, &v, &mask, scale as f32)?;
        let (out_ref, lse_ref) = crate::attention::forward(&qr, &kr, &vr, &mask, scale)?;
        expect("attention out", &out, &out_ref, tol)?;
        expect("attention lse", &lse, &lse_ref, F32_TOL)?;
        let (dq, dk, dv) = attention::backward(dev, shape, &dout, &q, &k, &v, &lse, &mask, scale as f32)?;
        let (dq_ref, dk_ref, dv_ref) =
            crate::attention::backward(&dor, &qr, &kr, &vr, &out_ref, &lse_ref, &mask, scale)?;
        expect("attention dq", &dq, &dq_ref, tol)?;
        expect("attention dk", &dk, &dk_ref, tol)?;
        expect("attention dv", &dv, &dv_ref, tol)?;
    }
    Ok(())
}

#[test]
#[ignore = "needs an AMD GPU: run scripts/hip-test on one"]
fn attention_matches_the_cpu_kernels() -> Outcome {
    both_types!(attention_case)
}

fn nf4_case<T: Elem + WithDType>(dev: &HipDevice, tol: f64) -> Outcome {
    use crate::nf4::{BLOCK, Nf4Weight};
    // An odd element count (the last code byte half used), a partial last scale block.
    let (rows, cols, r0, n): (usize, usize, usize, usize) = (999, 257, 100, 555);
    let len = rows * cols;
    let codes: Vec<u8> = (0..len.div_ceil(2)).map(|i| (i as u64).wrapping_mul(0x9E37_79B9) as u8).collect();
    let scales: Vec<f32> = (0..len.div_ceil(BLOCK)).map(|b| 0.01 + (b % 100) as f32 * 1e-3).collect();
    let host = Nf4Weight::new(
        Tensor::new(codes.as_slice(), &Device::Cpu)?,
        Tensor::new(scales.as_slice(), &Device::Cpu)?,
        rows,
        cols,
    )?;
    let want = host.dequantize_rows(r0, n, DType::F64)?;
    let got = nf4::dequantize::<T>(dev, &dev.upload(&codes)?, &dev.upload(&scales)?, r0 * cols, n * cols)?;
    // Levels × f32 scales are exact in f32; bf16 rounds each value once.
    expect("nf4", &got, &want, if T::SUFFIX == "f32" { 0.0 } else { tol })
}

#[test]
#[ignore = "needs an AMD GPU: run scripts/hip-test on one"]
fn nf4_dequantisation_matches_the_host() -> Outcome {
    both_types!(nf4_case)
}
