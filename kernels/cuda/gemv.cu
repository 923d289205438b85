// The few-row product of a decode step: y[M, N] = x[M, K]·W[N, K]ᵀ for bf16 x and W, M ≤ 8,
// f32 accumulation, bf16 y (CPU reference: the composed x·Wᵀ of kernels/src/linear.rs). At M of a
// few rows every weight is read once per step and the product is bound by that read alone, so the
// kernel streams W once, 16 bytes a lane, and uses each load for every row of x.
//
// Arithmetic goes through the m16n8k16 bf16 MMA with x as A and W as B (8 columns per tile). A's
// rows past M repeat row M−1 and its rows 9–16 repeat rows 1–8: an MMA's output row depends only on
// its own A row, and those rows are never stored. A dot product may visit k in any order,
// so a lane's 16-byte chunk of 8 consecutive k stands for two MMAs' k-slots {2q, 2q+1, 2q+8,
// 2q+9} (q = lane % 4) in x and in W alike: a lane multiplies exactly the chunks it loaded, with no
// shuffles and no shared memory between load and MMA. Plain FMAs would need 8·M per 16 bytes a lane
// (at M = 8 ~2 ms of issue per step of an 8B model, half its whole read); the MMA needs two
// instructions, whatever M.
//
// A block owns NT tiles of 8 columns; its warps split K in steps of 32 (a step: 4 lanes × 8 k per
// row), so a layer's narrow projections (N = 1024) still fill the GPU. Partial sums meet in shared
// memory and are added in warp order: no atomics, the same bits every run. (Loading x's rows 9–16
// into A's second half served 16 rows, but that second load of x made 16 rows slower than cuBLAS:
// H200, docs/benchmarks.md.)
//
// Loads go straight to registers, a group of 8 / NT steps at once: 4 KiB of W in flight per warp.
// A version that streamed W through a 96 KiB cp.async ring in shared memory (more bytes in
// flight, fewer registers) timed as fast or faster alone but made a decode step 2–4% slower than
// this one (H200, same call), presumably because each of its launches has the multiprocessors'
// shared memory re-carved around the small kernels between them.
//
// mma.sync is an NVIDIA (sm_80+) instruction: under HIP this file is empty (the GEMV is CUDA-only,
// kernels/src/gpu/gemv.rs) and the GEMM path serves every product.
#include "portable.h"

#if !defined(__HIPCC__)

namespace {

// d += a·b for a 16×16 A (row-major fragment) and a 16×8 B (column-major fragment), f32 d.
DEV void mma(float (&d)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0, unsigned b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// W is read once: keep it out of L1, which holds x for the block's other warps.
DEV uint4 load_stream(const bf16* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

DEV uint4 load_cached(const bf16* p) { return __ldg(reinterpret_cast<const uint4*>(p)); }

DEV uint4 keep(bool ok, uint4 v) { return ok ? v : make_uint4(0, 0, 0, 0); }

template <int NT, int WARPS> DEV void gemv(const bf16* x, const bf16* w, bf16* y, int m, int n, int k) {
  constexpr int U = 8 / NT;  // steps per group
  __shared__ __align__(16) float partial[WARPS][NT * 32 * 4];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int g = lane / 4, q = lane % 4;
  const int col0 = blockIdx.x * 8 * NT;
  // Rows past the end are clamped to the last one: their results are never stored, and an MMA's
  // output row (column) depends only on its own A row (B column).
  const bf16* xr = x + (size_t)min(g, m - 1) * k + q * 8;
  const bf16* wr[NT];
#pragma unroll
  for (int t = 0; t < NT; ++t) wr[t] = w + (size_t)min(col0 + t * 8 + g, n - 1) * k + q * 8;

  float acc[NT][4] = {};
  const int steps = (k + 31) / 32;
  for (int s0 = warp; s0 < steps; s0 += WARPS * U) {
    uint4 wv[U][NT], xv[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      // K is a multiple of 8, so a lane's 8 k are all in range or all out. Out of range, the lane
      // loads k 0..8 and zeroes it after, so that no branch separates the loads of a group.
      const int kk = (s0 + u * WARPS) * 32;
      const bool ok = kk + q * 8 < k;
      const int at = ok ? kk : 0;
      xv[u] = keep(ok, load_cached(xr + at));
#pragma unroll
      for (int t = 0; t < NT; ++t) wv[u][t] = keep(ok, load_stream(wr[t] + at));
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        mma(acc[t], xv[u].x, xv[u].x, xv[u].y, xv[u].y, wv[u][t].x, wv[u][t].y);
        mma(acc[t], xv[u].z, xv[u].z, xv[u].w, xv[u].w, wv[u][t].z, wv[u][t].w);
      }
    }
  }

#pragma unroll
  for (int t = 0; t < NT; ++t) {
    float4 c = make_float4(acc[t][0], acc[t][1], acc[t][2], acc[t][3]);
    *reinterpret_cast<float4*>(&partial[warp][(t * 32 + lane) * 4]) = c;
  }
  BARRIER();
  // One thread per accumulator of the block: c0, c1 are (row g, columns 2q, 2q+1); c2, c3 (rows
  // g + 8) are never stored.
  const int i = threadIdx.x;
  if (i >= NT * 32 * 4 || i % 4 >= 2) return;
  float sum = 0.f;
#pragma unroll
  for (int v = 0; v < WARPS; ++v) sum += partial[v][i];
  const int t = i / 128, l = (i / 4) % 32;
  const int row = l / 4, col = col0 + t * 8 + 2 * (l % 4) + i % 2;
  if (row < m && col < n) y[(size_t)row * n + col] = from_f<bf16>(sum);
}

}  // namespace

// gemv_bf16_t1: one tile of 8 columns per block and 16 warps, for narrow W (N = 1024: 128 blocks,
// each warp's share of K = 4096 one group of loads); gemv_bf16_t2: two tiles and 8 warps (x read
// half as often, two blocks per multiprocessor). The register caps (128) let ptxas issue a
// group's loads together; for full occupancy it interleaves each load with its MMA, one load in
// flight a lane.
KERNEL void __launch_bounds__(512, 1) gemv_bf16_t1(const bf16* x, const bf16* w, bf16* y, int m, int n, int k) {
  gemv<1, 16>(x, w, y, m, n, k);
}
KERNEL void __launch_bounds__(256, 2) gemv_bf16_t2(const bf16* x, const bf16* w, bf16* y, int m, int n, int k) {
  gemv<2, 8>(x, w, y, m, n, k);
}

#endif
