//! GEMMs over every expert at once, rows sorted by expert ([`Groups`]): expert `e`'s rows
//! `offsets[e]..offsets[e+1]` meet its own weight `w[e]` (`w` stacked `[E, out, in]`, each
//! `[out, in]` as a PyTorch linear weight). One call covers all experts: on a GPU one launch per
//! product, each thread block finding its expert from the offsets on the device.
//!
//! * [`forward_sum`]: `y[p, col..col + out] += x_p · w[e]ᵀ` for each [`Term`] (a projection
//!   and its LoRA branches into one output, the gate and up projections side by side);
//! * [`input_grad_sum`]: `dx[p] += dy[p, col..col + out] · w[e]` for each [`GradTerm`];
//! * [`weight_grad`]: `dw[e] = Σ_{p of e} dy[p, col..col + out]ᵀ · x_p`.
//!
//! `x_p` is row `p` of `x` when `x` is already sorted (`[N·k, in]`), or token `rows[p]` of
//! `x` (`[N, in]`) when the term is `gathered`: the CPU kernels gather as they read the rows;
//! on a GPU (f32/bf16, `gpu::grouped`) the rows are gathered once and each term is one
//! cuBLAS grouped GEMM over every expert.

use candle_core::{Result, Tensor};

use super::Groups;
use super::cpu;
use crate::KernelConfig;

/// One product of [`forward_sum`].
#[derive(Debug, Clone, Copy)]
pub struct Term<'a> {
    /// `[N, in]` token rows (`gathered`) or `[N·k, in]` sorted rows.
    pub x: &'a Tensor,
    pub gathered: bool,
    /// `[E, out, in]`.
    pub w: &'a Tensor,
    /// First output column.
    pub col: usize,
}

/// One product of [`input_grad_sum`].
#[derive(Debug, Clone, Copy)]
pub struct GradTerm<'a> {
    /// `[N·k, ≥ col + out]` sorted output gradient.
    pub dy: &'a Tensor,
    /// First column of `dy` this weight produced.
    pub col: usize,
    /// `[E, out, in]`.
    pub w: &'a Tensor,
}

/// `[N·k, width]`: the sum of every term's product in its columns (zeros elsewhere).
pub fn forward_sum(cfg: &KernelConfig, groups: &Groups, terms: &[Term<'_>], width: usize) -> Result<Tensor> {
    let first = terms.first().ok_or_else(|| candle_core::Error::Msg("moe grouped: no terms".into()))?;
    let _profile = crate::profile::scope("moe grouped fwd", first.x.device());
    for t in terms {
        check_term(groups, t, width)?;
    }
    let tensors: Vec<&Tensor> = terms.iter().flat_map(|t| [t.x, t.w]).collect();
    match crate::cpu::dtype_of(&tensors) {
        Some(candle_core::DType::F32) => cpu::grouped_forward::<f32>(cfg, groups, terms, width),
        Some(candle_core::DType::F64) => cpu::grouped_forward::<f64>(cfg, groups, terms, width),
        _ => {
            #[cfg(feature = "cuda")]
            if let Some(y) = crate::gpu::grouped::forward_sum(groups, terms, width)? {
                return Ok(y);
            }
            reference::forward_sum(groups, terms, width)
        }
    }
}

/// `[N·k, in]`: the input gradient of every term's product.
pub fn input_grad_sum(cfg: &KernelConfig, groups: &Groups, terms: &[GradTerm<'_>]) -> Result<Tensor> {
    let first = terms.first().ok_or_else(|| candle_core::Error::Msg("moe grouped: no terms".into()))?;
    let _profile = crate::profile::scope("moe grouped dx", first.dy.device());
    let d_in = first.w.dim(2)?;
    for t in terms {
        check_grad_term(groups, t, d_in)?;
    }
    let tensors: Vec<&Tensor> = terms.iter().flat_map(|t| [t.dy, t.w]).collect();
    match crate::cpu::dtype_of(&tensors) {
        Some(candle_core::DType::F32) => cpu::grouped_input_grad::<f32>(cfg, groups, terms),
        Some(candle_core::DType::F64) => cpu::grouped_input_grad::<f64>(cfg, groups, terms),
        _ => {
            #[cfg(feature = "cuda")]
            if let Some(dx) = crate::gpu::grouped::input_grad_sum(groups, terms)? {
                return Ok(dx);
            }
            reference::input_grad_sum(groups, terms)
        }
    }
}

/// `[E, out, in]`: each expert's weight gradient from the columns `col..col + out` of `dy` and
/// its rows of `x`. An expert without rows gets zeros.
pub fn weight_grad(
    cfg: &KernelConfig,
    groups: &Groups,
    dy: &Tensor,
    col: usize,
    out: usize,
    x: &Tensor,
    gathered: bool,
) -> Result<Tensor> {
    let _profile = crate::profile::scope("moe grouped dW", dy.device());
    let (m, dy_w) = dy.dims2()?;
    let rows = x.dim(0)?;
    if m != groups.len() || col + out > dy_w || rows != if gathered { groups.tokens } else { groups.len() } {
        candle_core::bail!(
            "moe grouped dW: dy {:?} (columns {col}..{}) and x {:?} (gathered: {gathered}) for {} tokens × {}",
            dy.dims(),
            col + out,
            x.dims(),
            groups.tokens,
            groups.k
        );
    }
    match crate::cpu::dtype_of(&[dy, x]) {
        Some(candle_core::DType::F32) => cpu::grouped_weight_grad::<f32>(cfg, groups, dy, col, out, x, gathered),
        Some(candle_core::DType::F64) => cpu::grouped_weight_grad::<f64>(cfg, groups, dy, col, out, x, gathered),
        _ => {
            #[cfg(feature = "cuda")]
            if let Some(dw) = crate::gpu::grouped::weight_grad(groups, dy, col, out, x, gathered)? {
                return Ok(dw);
            }
            reference::weight_grad(groups, dy, col, out, x, gathered)
        }
    }
}

fn check_term(groups: &Groups, t: &Term<'_>, width: usize) -> Result<()> {
    let (rows, d_in) = t.x.dims2()?;
    let (e, out, w_in) = t.w.dims3()?;
    let want_rows = if t.gathered { groups.tokens } else { groups.len() };
    if e != groups.num_experts || w_in != d_in || rows != want_rows || t.col + out > width {
        candle_core::bail!(
            "moe grouped: x {:?} (gathered: {}), w {:?} into columns {}..{} of {width}, for {} tokens × {} of {} experts",
            t.x.dims(),
            t.gathered,
            t.w.dims(),
            t.col,
            t.col + out,
            groups.tokens,
            groups.k,
            groups.num_experts
        );
    }
    Ok(())
}

fn check_grad_term(groups: &Groups, t: &GradTerm<'_>, d_in: usize) -> Result<()> {
    let (m, dy_w) = t.dy.dims2()?;
    let (e, out, w_in) = t.w.dims3()?;
    if e != groups.num_experts || m != groups.len() || t.col + out > dy_w || w_in != d_in {
        candle_core::bail!(
            "moe grouped dx: dy {:?} (columns {}..{}) against w {:?} (input {d_in}) for {} rows of {} experts",
            t.dy.dims(),
            t.col,
            t.col + out,
            t.w.dims(),
            groups.len(),
            groups.num_experts
        );
    }
    Ok(())
}

/// The composed form, expert by expert with candle ops (any device, any dtype).
pub mod reference {
    use super::*;

    /// Expert `e`'s rows of `x` (gathered through `rows` or sliced).
    fn rows_of(groups: &Groups, x: &Tensor, gathered: bool, p0: usize, len: usize) -> Result<Tensor> {
        if gathered { x.index_select(&groups.rows.narrow(0, p0, len)?, 0) } else { x.narrow(0, p0, len) }
    }

    /// Each expert's `f(e, p0, len)` stacked in sorted order (`[N·k, cols]`).
    fn by_expert(
        groups: &Groups,
        cols: usize,
        like: &Tensor,
        f: impl Fn(usize, usize, usize) -> Result<Tensor>,
    ) -> Result<Tensor> {
        let offsets = groups.host()?.offsets.clone();
        let mut parts = Vec::new();
        for e in 0..groups.num_experts {
            let (p0, len) = (offsets[e], offsets[e + 1] - offsets[e]);
            if len > 0 {
                parts.push(f(e, p0, len)?);
            }
        }
        if parts.is_empty() {
            return Tensor::zeros((0, cols), like.dtype(), like.device());
        }
        Tensor::cat(&parts, 0)
    }

    pub fn forward_sum(groups: &Groups, terms: &[Term<'_>], width: usize) -> Result<Tensor> {
        let like = terms[0].x;
        let mut y = Tensor::zeros((groups.len(), width), like.dtype(), like.device())?;
        for t in terms {
            let out = t.w.dim(1)?;
            let part = by_expert(groups, out, like, |e, p0, len| {
                rows_of(groups, t.x, t.gathered, p0, len)?.matmul(&t.w.get(e)?.t()?)
            })?;
            y = (y + part.pad_with_zeros(1, t.col, width - t.col - out)?)?;
        }
        Ok(y)
    }

    pub fn input_grad_sum(groups: &Groups, terms: &[GradTerm<'_>]) -> Result<Tensor> {
        let mut dx: Option<Tensor> = None;
        for t in terms {
            let (out, d_in) = (t.w.dim(1)?, t.w.dim(2)?);
            let part = by_expert(groups, d_in, t.dy, |e, p0, len| {
                t.dy.narrow(0, p0, len)?.narrow(1, t.col, out)?.matmul(&t.w.get(e)?)
            })?;
            dx = Some(match dx {
                Some(acc) => (acc + part)?,
                None => part,
            });
        }
        dx.ok_or_else(|| candle_core::Error::Msg("moe grouped: no terms".into()))
    }

    pub fn weight_grad(
        groups: &Groups,
        dy: &Tensor,
        col: usize,
        out: usize,
        x: &Tensor,
        gathered: bool,
    ) -> Result<Tensor> {
        let offsets = groups.host()?.offsets.clone();
        let d_in = x.dim(1)?;
        let mut parts = Vec::with_capacity(groups.num_experts);
        for e in 0..groups.num_experts {
            let (p0, len) = (offsets[e], offsets[e + 1] - offsets[e]);
            parts.push(if len == 0 {
                Tensor::zeros((out, d_in), x.dtype(), x.device())?
            } else {
                let dy_e = dy.narrow(0, p0, len)?.narrow(1, col, out)?;
                dy_e.t()?.matmul(&rows_of(groups, x, gathered, p0, len)?)?
            });
        }
        Tensor::stack(&parts, 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gradcheck::{assert_close, check, random};
    use crate::moe::{ExpertOrder, GroupedTile, MoeKernels};
    use candle_core::{DType, Device};

    /// A routing of `n` tokens to `k` of `e` experts, uneven on purpose (expert 0 heavy, the
    /// last expert empty).
    fn groups(n: usize, k: usize, e: usize, seed: u64) -> Result<Groups> {
        let mut state = seed;
        let mut ids = Vec::with_capacity(n * k);
        for _ in 0..n {
            let mut row: Vec<u32> = Vec::new();
            while row.len() < k {
                state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                let r = (state >> 33) as usize % (2 * (e - 1));
                let pick = if r >= e - 1 { 0 } else { r } as u32;
                if !row.contains(&pick) {
                    row.push(pick);
                }
            }
            ids.extend(row);
        }
        Groups::new(&Tensor::from_vec(ids, (n, k), &Device::Cpu)?, e)
    }

    fn configs() -> Vec<KernelConfig> {
        [
            MoeKernels::default(),
            MoeKernels { tile: GroupedTile::M128N64, order: ExpertOrder::LargestFirst },
            MoeKernels { tile: GroupedTile::Simt, order: ExpertOrder::ById },
        ]
        .into_iter()
        .map(|m| KernelConfig::default().with_moe(m))
        .collect()
    }

    #[test]
    fn fused_kernels_match_the_reference_under_every_tiling_and_any_thread_count() -> Result<()> {
        let dev = Device::Cpu;
        let (n, k, e, h, f, r) = (150, 2, 5, 12, 10, 3);
        let g = groups(n, k, e, 1)?;
        assert_eq!(g.counts()?[e - 1], 0, "an expert without rows is part of the test");
        let x = random(&[n, h], 2, &dev)?;
        let w = random(&[e, 2 * f, h], 3, &dev)?;
        let xa = random(&[n * k, r], 4, &dev)?;
        let b = random(&[e, f, r], 5, &dev)?;
        let dy = random(&[n * k, 2 * f], 6, &dev)?;
        let terms = [Term { x: &x, gathered: true, w: &w, col: 0 }, Term { x: &xa, gathered: false, w: &b, col: f }];
        let y_ref = reference::forward_sum(&g, &terms, 2 * f)?;
        let gterms = [GradTerm { dy: &dy, col: 0, w: &w }];
        let dx_ref = reference::input_grad_sum(&g, &gterms)?;
        let dw_ref = reference::weight_grad(&g, &dy, 0, 2 * f, &x, true)?;
        let db_ref = reference::weight_grad(&g, &dy, f, f, &xa, false)?;
        for cfg in configs() {
            for (dt, tol) in [(DType::F64, 1e-12), (DType::F32, 2e-5)] {
                let c = |t: &Tensor| t.to_dtype(dt);
                let (x, w, xa, b, dy) = (c(&x)?, c(&w)?, c(&xa)?, c(&b)?, c(&dy)?);
                let terms =
                    [Term { x: &x, gathered: true, w: &w, col: 0 }, Term { x: &xa, gathered: false, w: &b, col: f }];
                let y = forward_sum(&cfg, &g, &terms, 2 * f)?;
                let dx = input_grad_sum(&cfg, &g, &[GradTerm { dy: &dy, col: 0, w: &w }])?;
                let dw = weight_grad(&cfg, &g, &dy, 0, 2 * f, &x, true)?;
                let db = weight_grad(&cfg, &g, &dy, f, f, &xa, false)?;
                assert_close(&y, &y_ref, tol)?;
                assert_close(&dx, &dx_ref, tol)?;
                assert_close(&dw, &dw_ref, tol)?;
                assert_close(&db, &db_ref, tol)?;
                if dt == DType::F64 {
                    // The same plan gives the same bits on any number of threads.
                    let now = [&y, &dx, &dw, &db].map(|t| t.flatten_all().and_then(|t| t.to_vec1::<f64>()));
                    let pool =
                        rayon::ThreadPoolBuilder::new().num_threads(3).build().map_err(candle_core::Error::wrap)?;
                    let again = pool.install(|| -> Result<Vec<Vec<f64>>> {
                        let y = forward_sum(&cfg, &g, &terms, 2 * f)?;
                        let dx = input_grad_sum(&cfg, &g, &[GradTerm { dy: &dy, col: 0, w: &w }])?;
                        let dw = weight_grad(&cfg, &g, &dy, 0, 2 * f, &x, true)?;
                        let db = weight_grad(&cfg, &g, &dy, f, f, &xa, false)?;
                        [y, dx, dw, db].iter().map(|t| t.flatten_all()?.to_vec1::<f64>()).collect()
                    })?;
                    for (a, b) in now.into_iter().zip(again) {
                        assert!(a? == b, "a fixed plan must give the same bits on any thread count");
                    }
                }
            }
        }
        Ok(())
    }

    #[test]
    fn gradients_match_finite_differences() -> Result<()> {
        let dev = Device::Cpu;
        let (n, k, e, h, o) = (6, 2, 3, 4, 5);
        let g = groups(n, k, e, 9)?;
        let x = random(&[n, h], 1, &dev)?;
        let w = random(&[e, o, h], 2, &dev)?;
        let dy = random(&[n * k, o], 3, &dev)?;
        let cfg = KernelConfig::default();
        let f = |t: &[Tensor]| forward_sum(&cfg, &g, &[Term { x: &t[0], gathered: true, w: &t[1], col: 0 }], o);
        // The gathered input's gradient is the sorted one summed back over each token's rows.
        let dxs = input_grad_sum(&cfg, &g, &[GradTerm { dy: &dy, col: 0, w: &w }])?;
        let dx = crate::moe::combine::scatter_sum(&dxs, &g)?;
        let dw = weight_grad(&cfg, &g, &dy, 0, o, &x, true)?;
        check(f, &[x, w], &dy, &[dx, dw])
    }

    #[test]
    fn shapes_that_do_not_fit_are_refused() -> Result<()> {
        let dev = Device::Cpu;
        let g = groups(4, 1, 3, 1)?;
        let cfg = KernelConfig::default();
        let (x, w) = (random(&[4, 3], 1, &dev)?, random(&[3, 2, 3], 2, &dev)?);
        assert!(forward_sum(&cfg, &g, &[Term { x: &x, gathered: true, w: &w, col: 1 }], 2).is_err());
        assert!(
            forward_sum(&cfg, &g, &[Term { x: &x, gathered: false, w: &random(&[2, 2, 3], 2, &dev)?, col: 0 }], 2)
                .is_err()
        );
        assert!(weight_grad(&cfg, &g, &random(&[4, 2], 3, &dev)?, 1, 2, &x, true).is_err());
        assert!(forward_sum(&cfg, &g, &[], 2).is_err());
        Ok(())
    }
}
