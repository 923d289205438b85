// Flash attention on Hopper (sm_90a): the jobs of flash_attention.cu's fwd, bwd_dkdv and bwd_dq
// (the deterministic one), with their products on wgmma instead of mma.sync.
//
// Why: with mma.sync each warp owns 16 rows and reads the whole other operand's tile from shared
// memory through ldmatrix for every product (16 FLOPs per byte read): the dK/dV kernel, whose
// warps re-read Q and dO for four products, ran at shared memory's rate (~140 TFLOP/s at the 0.6B
// shape; 285 here). wgmma reads a B tile once for the warpgroup's 64 rows, straight from shared
// memory, and takes A from shared memory too, which frees the registers that held its fragments.
//
// Each kernel is one warpgroup (128 threads) per 64 rows, over tiles double-buffered with
// cp.async into 128-byte-swizzled shared memory (wgmma.h); per tile the score-like products
// (shared × shared), the softmax or its backward in registers, then the products with those as
// register A operands. The accumulator of a 64-row wgmma is, per warp, mma.sync's C fragment, so
// the arithmetic per element is flash_attention.cu's; only the products' summation order differs
// (a different rounding, still bitwise reproducible). Not yet FA3's pipelining: a warpgroup waits
// for each product before its softmax (see docs/benchmarks.md). Built only for compute_90a
// (kernels/build.rs), loaded only on an sm_90 device (kernels/src/gpu/attention.rs).
#include "portable.h"

#if !defined(__HIPCC__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#include "flash.h"
#include "wgmma.h"

namespace {

using namespace flash;

constexpr int BK = 64, BQ = 64;

// The dynamic shared memory, its tiles 1024-byte aligned (the launch asks for 1 KB more).
DEV bf16* aligned_smem() {
  extern __shared__ __align__(16) unsigned char dyn[];
  return reinterpret_cast<bf16*>(dyn + ((1024 - (smem_addr(dyn) & 1023)) & 1023));
}

// Starts loading the next tile (when there is one) and waits for this one: cp.async groups
// complete in order, so the next one's may stay in flight. Then the tensor cores may read it.
template <typename Load> DEV void await_tile(bool more, Load load_next) {
  if (more) {
    load_next();
    cp_wait<1>();
  } else {
    cp_wait<0>();
  }
  wg::fence_async_smem();
  BARRIER();
}

// x = A·Bᵀ over HD for swizzled tiles A (M = 64 rows) and B (8·NT rows, x's width), K-major.
template <int HD, int M, int NT> DEV void issue_scores(float (&x)[NT][4], const bf16* a, const bf16* b) {
#pragma unroll
  for (int kk = 0; kk < HD / 16; ++kk) wg::wgmma_ss(x, wg::desc_k<M>(a, kk), wg::desc_k<NT * 8>(b, kk), kk);
}

// x = A₁·B₁ᵀ and y = A₂·B₂ᵀ (each as issue_scores), issued together and waited for.
template <int HD, int M, int NT>
DEV void score_pair(float (&x)[NT][4], const bf16* a1, const bf16* b1, float (&y)[NT][4], const bf16* a2,
                    const bf16* b2) {
  wg::fence();
  issue_scores<HD, M>(x, a1, b1);
  issue_scores<HD, M>(y, a2, b2);
  wg::commit();
  wg::wait<0>();
}

// Issues acc += C·tile: C is this warp's part of a 64 × ROWS product (accumulator fragments),
// rounded to bf16 as the register A operand; the tile's ROWS rows are K, its 8·NT columns N.
// The caller waits (ptxas keeps C's registers until the product has read them).
template <int ROWS, int NT>
DEV void issue_from_registers(float (&acc)[NT][4], const float (&c)[ROWS / 8][4], const bf16* tile) {
  unsigned a[ROWS / 16][4];
#pragma unroll
  for (int kk = 0; kk < ROWS / 16; ++kk) c_to_a(a[kk], c[2 * kk], c[2 * kk + 1]);
  wg::fence();
#pragma unroll
  for (int kk = 0; kk < ROWS / 16; ++kk) wg::wgmma_rs_t(acc, a[kk], wg::desc_mn<ROWS>(tile, kk));
  wg::commit();
}

// dK, dV: one block per 64 keys of one kv head; query tiles of 64 rows of every head of the group
// that can see the block, each staged with its rows' lse, D and first visible key. Per tile:
// Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ, then Pᵀ = exp(Sᵀ·scale − lse) (masked as in bwd_dkdv), dV += Pᵀ·dO
// issued while dSᵀ = Pᵀ∘(dPᵀ − D) is formed, then dK += dSᵀ·Q.
//
// Shared memory: K, V and two stages of Q and dO (swizzled 64-row tiles), two stages of
// (lse, D, first key) for 64 rows, and 1 KB to align the tiles to 1024 bytes.
template <int HD> constexpr int dkdv_smem_bytes() { return 6 * 64 * HD * 2 + 2 * 3 * 64 * 4 + 1024; }

template <int HD>
DEV void bwd_dkdv(const bf16* dout, const bf16* q, const bf16* k, const bf16* v, const unsigned* starts,
                  const float* lse, const float* delta, bf16* dk, bf16* dv, int H, int KV, int qld, int kld,
                  int Tn, float scale) {
  constexpr int TILE = 64 * HD;  // elements
  bf16* base = aligned_smem();
  bf16 *sk = base, *sv = base + TILE;
  auto q_stage = [&](int s) { return base + (2 + 2 * s) * TILE; };
  auto do_stage = [&](int s) { return base + (3 + 2 * s) * TILE; };
  float* aux = reinterpret_cast<float*>(base + 6 * TILE);  // per stage: lse[64], D[64], first[64]
  const int w = threadIdx.x / 32, t4 = threadIdx.x % 4;
  const int kb = blockIdx.x * BK, kh = blockIdx.y, b = blockIdx.z, group = H / KV;
  const size_t kvoff = Heads<HD>{KV, kld}.base(b, kh, Tn);
  const unsigned* st = starts + (size_t)b * Tn;
  const int kmax = min(kb + BK, Tn) - 1;

  wg::load_sw<BK, HD, THREADS>(sk, k + kvoff, kb, Tn, kld);
  wg::load_sw<BK, HD, THREADS>(sv, v + kvoff, kb, Tn, kld);
  cp_commit();

  const QueryTiles tiles{st, Tn, kb, kmax, BQ};
  auto stage = [&](int hh, int qs, int s) {
    const int head = kh * group + hh;
    const size_t qoff = Heads<HD>{H, qld}.base(b, head, Tn);
    wg::load_sw<BQ, HD, THREADS>(q_stage(s), q + qoff, qs, Tn, qld);
    wg::load_sw<BQ, HD, THREADS>(do_stage(s), dout + qoff, qs, Tn, qld);
    if (threadIdx.x < BQ) {
      const int r = qs + threadIdx.x;
      const bool ok = r < Tn;
      const size_t row = ((size_t)b * H + head) * Tn + (ok ? r : 0);
      float* a = aux + s * 3 * BQ + threadIdx.x;
      wg::cp4(a, lse + row, ok);
      wg::cp4(a + BQ, delta + row, ok);
      wg::cp4(a + 2 * BQ, st + (ok ? r : 0), ok);
    }
    cp_commit();
  };

  float dka[HD / 8][4] = {}, dva[HD / 8][4] = {};
  const float c = scale * LOG2E;
  int key[2];
  lane_rows(key, kb + w * 16);
  int hh = 0, qs = kb, s = 0;
  stage(hh, qs, s);
  while (hh < group) {
    int nh = hh, nq = qs;
    const bool more = tiles.next(nh, nq, group);
    await_tile(more, [&] { stage(nh, nq, s ^ 1); });
    const bf16 *tq = q_stage(s), *tdo = do_stage(s);
    float sc[BQ / 8][4], dp[BQ / 8][4];
    score_pair<HD, BK>(sc, sk, tq, dp, sv, tdo);
    const float* sl = aux + s * 3 * BQ;
    const unsigned* sfirst = reinterpret_cast<const unsigned*>(sl + 2 * BQ);
#pragma unroll
    for (int nt = 0; nt < BQ / 8; ++nt)
#pragma unroll
      for (int e2 = 0; e2 < 2; ++e2) {
        const int col = nt * 8 + 2 * t4 + e2, qi = qs + col;
        const bool ok = qi < Tn;
        const float l2 = sl[col] * LOG2E, dl = sl[BQ + col];
        const int firstq = ok ? (int)sfirst[col] : Tn;
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const int e = 2 * i + e2;
          const bool seen = ok && key[i] <= qi && key[i] >= firstq && key[i] < Tn;
          sc[nt][e] = seen ? exp2f(sc[nt][e] * c - l2) : 0.f;
          dp[nt][e] -= dl;
        }
      }
    // dV's product runs on the tensor cores while dSᵀ = Pᵀ∘(dPᵀ − D) is formed.
    issue_from_registers<BQ>(dva, sc, tdo);
#pragma unroll
    for (int nt = 0; nt < BQ / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) dp[nt][e] *= sc[nt][e];  // dSᵀ, unscaled
    issue_from_registers<BQ>(dka, dp, tq);
    wg::wait<0>();
    BARRIER();  // the stage's buffers are free for the load two tiles on
    hh = nh;
    qs = nq;
    s ^= 1;
  }
  const float mk[2] = {scale, scale}, mv[2] = {1.f, 1.f};
  store_rows<HD>(dk + kvoff, kld, dka, kb + w * 16, Tn, mk);
  store_rows<HD>(dv + kvoff, kld, dva, kb + w * 16, Tn, mv);
}

// Forward: one block (one warpgroup) per 64 query rows of one head, over the key tiles of BC (32
// or 64: the plan's key tile) its rows may see, double-buffered with cp.async. S = Q·Kᵀ with Q and K in shared memory, the online
// softmax of mma.h on S's accumulator (the same arithmetic as flash_attention.cu's fwd), then
// O += P·V with P as the register A operand.
template <int HD, int BC> constexpr int fwd_smem_bytes() { return (64 + 4 * BC) * HD * 2 + 1024; }

template <int HD, int BC>
DEV void fwd(const bf16* q, const bf16* k, const bf16* v, const unsigned* starts, bf16* out, float* lse, int H,
             int KV, int qld, int kld, int Tn, float scale) {
  constexpr int BR = 64;
  bf16* base = aligned_smem();
  bf16* sq = base;
  auto k_stage = [&](int s) { return base + BR * HD + 2 * s * BC * HD; };
  auto v_stage = [&](int s) { return base + BR * HD + (2 * s + 1) * BC * HD; };
  const int w = threadIdx.x / 32, l = threadIdx.x % 32, g = l / 4, t4 = l % 4;
  const int q0 = blockIdx.x * BR, h = blockIdx.y, b = blockIdx.z;
  const size_t qoff = Heads<HD>{H, qld}.base(b, h, Tn), kvoff = Heads<HD>{KV, kld}.base(b, h / (H / KV), Tn);
  const unsigned* st = starts + (size_t)b * Tn;
  const int last = min(q0 + BR, Tn) - 1, kfirst = (int)st[q0] / BC * BC;

  wg::load_sw<BR, HD, THREADS>(sq, q + qoff, q0, Tn, qld);
  auto stage = [&](int kb, int s) {
    wg::load_sw<BC, HD, THREADS>(k_stage(s), k + kvoff, kb, Tn, kld);
    wg::load_sw<BC, HD, THREADS>(v_stage(s), v + kvoff, kb, Tn, kld);
    cp_commit();
  };
  stage(kfirst, 0);  // one group with Q

  int row[2], first[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    row[i] = q0 + w * 16 + g + 8 * i;
    first[i] = row[i] < Tn ? (int)st[row[i]] : 0;
  }
  const float c = scale * LOG2E;  // scores in log2 units
  float m[2] = {-INFINITY, -INFINITY}, sum[2] = {0.f, 0.f};
  float o[HD / 8][4] = {};
  int s = 0;
  for (int kb = kfirst; kb <= last; kb += BC) {
    const bool more = kb + BC <= last;
    await_tile(more, [&] { stage(kb + BC, s ^ 1); });
    const bf16 *tk = k_stage(s), *tv = v_stage(s);
    float sc[BC / 8][4];
    wg::fence();
    issue_scores<HD, BR>(sc, sq, tk);
    wg::commit();
    wg::wait<0>();
    softmax_tile<BC / 8, HD>(sc, m, sum, o, c, [&](int i, int col) {
      const int key = kb + col;
      return key <= row[i] && key >= first[i] && key < Tn;
    });
    issue_from_registers<BC>(o, sc, tv);
    wg::wait<0>();
    BARRIER();  // the stage's buffers are free for the load two tiles on
    s ^= 1;
  }
  float inv[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    sum[i] = quad_sum(sum[i]);
    inv[i] = 1.f / sum[i];
    if (t4 == 0 && row[i] < Tn) lse[((size_t)b * H + h) * Tn + row[i]] = (m[i] + log2f(sum[i])) * LN2;
  }
  store_rows<HD>(out + qoff, qld, o, q0 + w * 16, Tn, inv);
}

// dQ: one block (one warpgroup) per 64 query rows of one head, over the key tiles of BC (32 or 64,
// as the forward) its rows may see, double-buffered with cp.async. Q and dO stay in shared memory as the A operand
// of S = Q·Kᵀ and dP = dO·Vᵀ; then P = exp(S·scale − lse), dS = P∘(dP − D) in registers (masked
// as in flash_attention.cu's bwd_dq) and dQ += dS·K with dS as the register A operand. One block
// a query tile: bitwise reproducible, like the mma.sync kernel it replaces.
template <int HD, int BC> constexpr int dq_smem_bytes() { return (2 * 64 + 4 * BC) * HD * 2 + 1024; }

template <int HD, int BC>
DEV void bwd_dq(const bf16* dout, const bf16* q, const bf16* k, const bf16* v, const unsigned* starts,
                const float* lse, const float* delta, bf16* dq, int H, int KV, int qld, int kld, int Tn,
                float scale) {
  constexpr int BR = 64;
  bf16* base = aligned_smem();
  bf16 *sq = base, *sdo = base + BR * HD;
  auto k_stage = [&](int s) { return base + 2 * BR * HD + 2 * s * BC * HD; };
  auto v_stage = [&](int s) { return base + 2 * BR * HD + (2 * s + 1) * BC * HD; };
  const int w = threadIdx.x / 32, l = threadIdx.x % 32, g = l / 4, t4 = l % 4;
  const int q0 = blockIdx.x * BR, h = blockIdx.y, b = blockIdx.z;
  const size_t qoff = Heads<HD>{H, qld}.base(b, h, Tn), kvoff = Heads<HD>{KV, kld}.base(b, h / (H / KV), Tn);
  const unsigned* st = starts + (size_t)b * Tn;
  const int last = min(q0 + BR, Tn) - 1, kfirst = (int)st[q0] / BC * BC;

  wg::load_sw<BR, HD, THREADS>(sq, q + qoff, q0, Tn, qld);
  wg::load_sw<BR, HD, THREADS>(sdo, dout + qoff, q0, Tn, qld);
  auto stage = [&](int kb, int s) {
    wg::load_sw<BC, HD, THREADS>(k_stage(s), k + kvoff, kb, Tn, kld);
    wg::load_sw<BC, HD, THREADS>(v_stage(s), v + kvoff, kb, Tn, kld);
    cp_commit();
  };
  stage(kfirst, 0);  // one group with Q and dO

  int row[2], first[2];
  float l2[2], d[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    row[i] = q0 + w * 16 + g + 8 * i;
    const bool ok = row[i] < Tn;
    first[i] = ok ? (int)st[row[i]] : 0;
    l2[i] = ok ? lse[((size_t)b * H + h) * Tn + row[i]] * LOG2E : 0.f;
    d[i] = ok ? delta[((size_t)b * H + h) * Tn + row[i]] : 0.f;
  }
  const float c = scale * LOG2E;
  float acc[HD / 8][4] = {};
  int s = 0;
  for (int kb = kfirst; kb <= last; kb += BC) {
    const bool more = kb + BC <= last;
    await_tile(more, [&] { stage(kb + BC, s ^ 1); });
    const bf16 *tk = k_stage(s), *tv = v_stage(s);
    float sc[BC / 8][4], dp[BC / 8][4];
    score_pair<HD, BR>(sc, sq, tk, dp, sdo, tv);
#pragma unroll
    for (int nt = 0; nt < BC / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = e / 2, key = kb + nt * 8 + 2 * t4 + e % 2;
        const bool seen = key <= row[i] && key >= first[i] && key < Tn;
        const float p = seen ? exp2f(sc[nt][e] * c - l2[i]) : 0.f;
        sc[nt][e] = p * (dp[nt][e] - d[i]);  // dS, unscaled
      }
    issue_from_registers<BC>(acc, sc, tk);
    wg::wait<0>();
    BARRIER();  // the stage's buffers are free for the load two tiles on
    s ^= 1;
  }
  const float mul[2] = {scale, scale};
  store_rows<HD>(dq + qoff, qld, acc, q0 + w * 16, Tn, mul);
}

}  // namespace

// grid (ceil(T / 64), H, B), 128 threads, fwd_smem_bytes<HD, BC>() dynamic shared memory;
// arguments as flash_fwd_hd*_k* in flash_attention.cu.
#define FLASH_FWD_WG(HD, BC)                                                                        \
  KERNEL void __launch_bounds__(THREADS)                                                            \
      flash_fwd_wg_hd##HD##_k##BC(const bf16* q, const bf16* k, const bf16* v,                       \
                                  const unsigned* starts, bf16* out, float* lse, int H, int KV,      \
                                  int qld, int kld, int Tn, float scale) {                           \
    fwd<HD, BC>(q, k, v, starts, out, lse, H, KV, qld, kld, Tn, scale);                              \
  }
// grid (ceil(T / 64), H, B), 128 threads, dq_smem_bytes<HD, BC>() dynamic shared memory; arguments
// as flash_bwd_dq_hd* in flash_attention.cu.
#define FLASH_DQ_WG(HD, BC)                                                                         \
  KERNEL void __launch_bounds__(THREADS)                                                            \
      flash_bwd_dq_wg_hd##HD##_k##BC(const bf16* dout, const bf16* q, const bf16* k, const bf16* v,  \
                                     const unsigned* starts, const float* lse, const float* delta,   \
                                     bf16* dq, int H, int KV, int qld, int kld, int Tn,              \
                                     float scale) {                                                  \
    bwd_dq<HD, BC>(dout, q, k, v, starts, lse, delta, dq, H, KV, qld, kld, Tn, scale);               \
  }
#define FLASH_WG(HD) FLASH_FWD_WG(HD, 32) FLASH_FWD_WG(HD, 64) FLASH_DQ_WG(HD, 32) FLASH_DQ_WG(HD, 64)
FLASH_WG(64)
FLASH_WG(128)

// grid (ceil(T / 64), KV, B), 128 threads, dkdv_smem_bytes<HD>() dynamic shared memory; arguments
// as flash_bwd_dkdv_hd* in flash_attention.cu.
#define FLASH_DKDV_WG(HD)                                                                           \
  KERNEL void __launch_bounds__(THREADS)                                                            \
      flash_bwd_dkdv_wg_hd##HD(const bf16* dout, const bf16* q, const bf16* k, const bf16* v,        \
                               const unsigned* starts, const float* lse, const float* delta,         \
                               bf16* dk, bf16* dv, int H, int KV, int qld, int kld, int Tn,          \
                               float scale) {                                                        \
    bwd_dkdv<HD>(dout, q, k, v, starts, lse, delta, dk, dv, H, KV, qld, kld, Tn, scale);             \
  }
FLASH_DKDV_WG(64)
FLASH_DKDV_WG(128)

#endif
