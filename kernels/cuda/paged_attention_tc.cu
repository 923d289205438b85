// Paged attention on the tensor cores, bf16 (CPU reference: kernels/src/paged_attention.rs; the
// CUDA-core kernel of paged_attention.cu serves f32, head size 256 and unaligned caches).
//
// Why: the CUDA-core kernel scores one key per lane with a dot product out of shared memory. A
// prefill of 16 prompts of 512 tokens is ~1.2 TFLOP of attention an 8B step, which that kernel
// runs at CUDA-core speed (a third of the step); at 64 decoding sequences its shared-memory reads,
// not DRAM, were the bound. Here scores and P·V are m16n8k16 MMAs (mma.h) over K/V tiles staged
// with cp.async two tiles deep, so the next tile streams in while this one is computed.
//
// One thread block (4 warps) per (work item, kv head, split). A work item is rows of one
// sequence; its units are (row, query head of the kv head's group), unit u = row·g + head, so a
// row's group heads are adjacent in q and share each K/V tile (GQA). A warp owns 16 units (the
// MMA's rows) and, with KP key phases, the keys [kp·64/KP, (kp+1)·64/KP) of every 64-key tile:
//   KP = 1: prefill items of up to 64 units (4 warps × 16), each warp over the whole tile;
//   KP = 4: decode items (one row: g ≤ 16 units), the four warps over a quarter of the tile each,
//           their softmax states merged through shared memory at the end (a decode row would
//           otherwise leave three warps idle).
// The online softmax runs in log2 units (exp2 is one instruction). Split-K as the CUDA-core
// kernel (the same near-equal cut, paged.h): one split writes the normalised output, several
// leave (max in natural-log units, sum, unnormalised output) for paged_reduce in
// paged_attention.cu. (A version whose last split merged the others, found by a counter per
// item, saved that launch but timed no faster on the H200: its merge is a chain of L2 round
// trips at the end of the launch.)
#include "paged.h"

#if !defined(__HIPCC__)
#include "mma.h"

namespace {

using namespace mma16;

constexpr int THREADS = 128;
constexpr int WARPS = THREADS / 32;
constexpr int BC = 64;  // keys per staged tile

// Keys [tile, tile + BC) of one kv head into shared K and V tiles (row stride HD + PAD); keys at
// or past k1 read as zeros, so masked probabilities (exactly 0) multiply finite values. `kb`/`vb`:
// the caches at this thread's column of the kv head (`cache + kvh·HD + col`), `stride` elements
// from one slot to the next. Blocks hold 1 << bshift ≥ 8 keys (the host sends other block sizes to
// the CUDA-core kernel), and a thread copies PER ≤ 8 consecutive keys of one column, aligned as
// tiles are: they lie in one block, found with one table lookup and a shift, and step one slot
// apart. (ncu, H200, 64 decode rows: with a lookup and a division by the block size per key this
// loop was issue-bound, 886 instructions a tile a warp, 0.46 issued a cycle per scheduler, DRAM at
// 61%.)
template <int HD>
DEV void stage_kv(bf16* sk, bf16* sv, const bf16* kb, const bf16* vb, const unsigned* table, int tile, int k1,
                  unsigned bshift, unsigned stride) {
  constexpr int CH = HD / 8, PER = BC * CH / THREADS;
  static_assert(BC * CH % THREADS == 0 && THREADS % CH == 0 && PER <= 8, "a thread's keys lie in one block");
  const unsigned r0 = threadIdx.x / CH * PER, col = (threadIdx.x % CH) * 8;
  const unsigned key0 = (unsigned)tile + r0, end = (unsigned)k1;
  bf16* dk = sk + r0 * (HD + PAD) + col;
  bf16* dv = sv + r0 * (HD + PAD) + col;
  // Slots number fewer than 2^32 (the cache's rows); offsets are wide products.
  const unsigned slot = key0 < end ? (__ldg(table + (key0 >> bshift)) << bshift) | (key0 & ((1u << bshift) - 1u)) : 0u;
  const size_t at = (size_t)slot * stride;
#pragma unroll
  for (int i = 0; i < PER; ++i) {
    const bool ok = key0 + i < end;
    const size_t off = ok ? at + (size_t)i * stride : 0;
    cp16(dk + i * (HD + PAD), kb + off, ok);
    cp16(dv + i * (HD + PAD), vb + off, ok);
  }
}

// Folds the softmax states of warps kp > 0 into warp kp = 0 of the same unit group, through
// shared memory (the stages are free by then). Returns false for the warps whose part is done.
template <int HD, int KP, int UG, int HALVES>
DEV bool merge_phases(unsigned char* smem, int ug, int kp, float (&m)[2], float (&sum)[2], float (&o)[HD / 8][4]) {
  constexpr int REGS = HD / 2;  // o's registers per lane
  const int l = threadIdx.x % 32;
  float* xo = reinterpret_cast<float*>(smem);     // [KP - 1][UG][REGS][32]
  float* xs = xo + (KP - 1) * UG * REGS * 32;     // [KP - 1][UG][4][32]: m0, m1, sum0, sum1
  BARRIER();  // every warp is done reading the stages
  if (kp > 0) {
    const int at = (kp - 1) * UG + ug;
#pragma unroll
    for (int nt = 0; nt < HD / 8; ++nt)
#pragma unroll
      for (int j = 0; j < 2 * HALVES; ++j) xo[(at * REGS + nt * 4 + j) * 32 + l] = o[nt][j];
#pragma unroll
    for (int i = 0; i < HALVES; ++i) {
      xs[(at * 4 + i) * 32 + l] = m[i];
      xs[(at * 4 + 2 + i) * 32 + l] = sum[i];
    }
  }
  BARRIER();
  if (kp > 0) return false;
#pragma unroll
  for (int i = 0; i < HALVES; ++i) {
    float mx = m[i];
    for (int p = 1; p < KP; ++p) mx = fmaxf(mx, xs[(((p - 1) * UG + ug) * 4 + i) * 32 + l]);
    const float base = mx == -INFINITY ? 0.f : mx;
    const float w0 = exp2f(m[i] - base);
    sum[i] *= w0;
#pragma unroll
    for (int nt = 0; nt < HD / 8; ++nt) {
      o[nt][2 * i] *= w0;
      o[nt][2 * i + 1] *= w0;
    }
    for (int p = 1; p < KP; ++p) {
      const int at = (p - 1) * UG + ug;
      const float w = exp2f(xs[(at * 4 + i) * 32 + l] - base);
      sum[i] += w * xs[(at * 4 + 2 + i) * 32 + l];
#pragma unroll
      for (int nt = 0; nt < HD / 8; ++nt) {
        o[nt][2 * i] += w * xo[(at * REGS + nt * 4 + 2 * i) * 32 + l];
        o[nt][2 * i + 1] += w * xo[(at * REGS + nt * 4 + 2 * i + 1) * 32 + l];
      }
    }
    m[i] = mx;
  }
  return true;
}

template <int HD, int KP, int HALVES>
DEV void paged_attn_tc(const bf16* q, const bf16* kc, const bf16* vc, const unsigned* query_starts,
                       const unsigned* context_lens, const unsigned* tables, const Item* items,
                       bf16* out, float* part_m, float* part_l, float* part_acc, int heads,
                       int kvh_count, int bshift, int max_blocks, int splits, float scale) {
  constexpr int LD = HD + PAD, UG = WARPS / KP, NK = BC / KP, STAGE = 2 * BC * LD;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* stages = reinterpret_cast<bf16*>(smem_raw);  // [2][K tile, V tile]
  const Item it = items[blockIdx.x];
  const int kvh = blockIdx.y, split = blockIdx.z;
  const int g = heads / kvh_count, units = it.rows * g;
  const int w = threadIdx.x / 32, l = threadIdx.x % 32, r4 = l / 4, t4 = l % 4;
  const int ug = w % UG, kp = w / UG;
  const unsigned stride = (unsigned)(kvh_count * HD);
  const bf16* kb = kc + (size_t)kvh * HD + (threadIdx.x % (HD / 8)) * 8;
  const bf16* vb = vc + (size_t)kvh * HD + (threadIdx.x % (HD / 8)) * 8;
  const ItemKeys keys = item_keys(it, query_starts, context_lens, tables, max_blocks, BC, split, splits);
  const int first = keys.first, t = keys.t, ctx = keys.ctx, k0 = keys.k0, k1 = keys.k1;

  // Q of every unit (zeros past the item's), through the second stage into A fragments, while
  // the first K/V tile streams into the first stage (the loop's first prefetch refills the
  // second only after the barrier below).
  constexpr int QCH = HD / 8;
  bf16* qstage = stages + STAGE;
  for (int c = threadIdx.x; c < UG * 16 * QCH; c += THREADS) {
    const int u = c / QCH, col = (c % QCH) * 8;
    const bool ok = u < units;
    const size_t at = ok ? ((size_t)(first + it.row0 + u / g) * heads + kvh * g + u % g) * HD + col : 0;
    cp16(qstage + u * LD + col, q + at, ok);
  }
  cp_commit();
  if (k0 < k1) stage_kv<HD>(stages, stages + BC * LD, kb, vb, keys.table, k0, k1, bshift, stride);
  cp_commit();
  cp_wait<1>();
  BARRIER();
  unsigned qa[HD / 16][4];
  load_a<HD>(qa, qstage, ug * 16);
  BARRIER();

  // The lane's two MMA rows: units ug·16 + r4 and + 8; a unit's row sees keys up to `last`
  // (its causal limit and the split's end in one bound, hoisted out of the tile loop).
  int last[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int u = ug * 16 + r4 + 8 * i;
    last[i] = u < units ? min(ctx - t + it.row0 + u / g, k1 - 1) : -1;
  }
  const float c = scale * LOG2E;
  float m[2] = {-INFINITY, -INFINITY}, sum[2] = {0.f, 0.f};
  float o[HD / 8][4] = {};
  int buf = 0;
  for (int tile = k0; tile < k1; tile += BC, buf ^= 1) {
    // The next tile streams into the other stage while this one is computed (the barrier at
    // the end of the last trip freed it).
    bf16* next = stages + (buf ^ 1) * STAGE;
    if (tile + BC < k1)
      stage_kv<HD>(next, next + BC * LD, kb, vb, keys.table, tile + BC, k1, bshift, stride);
    cp_commit();
    cp_wait<1>();
    BARRIER();
    const bf16* sk = stages + buf * STAGE + kp * NK * LD;
    const bf16* sv = sk + BC * LD;
    float s[NK / 8][4] = {};
    mma_rows<HD / 16, NK / 8>(s, qa, sk, LD, 0);
    softmax_tile<NK / 8, HD, HALVES>(s, m, sum, o, c,
                                     [&](int i, int col) { return tile + kp * NK + col <= last[i]; });
    mma_cols<HD, NK / 8>(o, s, sv, 0);
    BARRIER();
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) sum[i] = quad_sum(sum[i]);
  if constexpr (KP > 1) {
    if (!merge_phases<HD, KP, UG, HALVES>(smem_raw, ug, kp, m, sum, o)) return;
  }
#pragma unroll
  for (int i = 0; i < HALVES; ++i) {
    const int u = ug * 16 + r4 + 8 * i;
    if (u >= units) continue;
    const size_t rh = (size_t)(first + it.row0 + u / g) * heads + kvh * g + u % g;
    if (splits == 1) {
      const float inv = sum[i] > 0.f ? 1.f / sum[i] : 0.f;
      bf16* dst = out + rh * HD + 2 * t4;
#pragma unroll
      for (int nt = 0; nt < HD / 8; ++nt)
        *reinterpret_cast<__nv_bfloat162*>(dst + nt * 8) =
            __floats2bfloat162_rn(o[nt][2 * i] * inv, o[nt][2 * i + 1] * inv);
    } else {
      const size_t at = rh * splits + split;
      if (t4 == 0) {
        part_m[at] = m[i] * LN2;  // paged_reduce weighs splits by e^{m − M}
        part_l[at] = sum[i];
      }
      float* dst = part_acc + at * HD + 2 * t4;
#pragma unroll
      for (int nt = 0; nt < HD / 8; ++nt) {
        dst[nt * 8] = o[nt][2 * i];
        dst[nt * 8 + 1] = o[nt][2 * i + 1];
      }
    }
  }
}

}  // namespace

// `base`: the launch's first item (decode items and prefill items are one list, two launches).
// Decode blocks are capped at the registers of three a multiprocessor, as many as their shared
// memory allows (ptxas otherwise chose 192 at head size 128, which fits two). A decode row of a
// GQA group of at most 8 heads (every Qwen3 model) fills the MMA's rows 0–7 only: its `_g8`
// kernels leave rows 8–15 out of the softmax, the merge and the store (a tile's loop 534 → 368
// instructions a warp with the staging above, by nvdisasm; the 64-stream load +0.5–1%, H200).
// They round differently from the full kernel somewhere (the 64-stream load's greedy tokens
// differ; the staging alone keeps them), within the reference's tolerance (`scripts/gpu-test`).
#define PAGED_ATTN_TC(HD, KP, HALVES, MIN_BLOCKS, NAME)                                                   \
  KERNEL void __launch_bounds__(THREADS, MIN_BLOCKS) NAME(                                                \
      const bf16* q, const bf16* kc, const bf16* vc, const unsigned* qs, const unsigned* cl,             \
      const unsigned* tables, const Item* items, int base, bf16* out, float* pm, float* pl, float* pacc, \
      int heads, int kvh, int bshift, int max_blocks, int splits, float scale) {                         \
    paged_attn_tc<HD, KP, HALVES>(q, kc, vc, qs, cl, tables, items + base, out, pm, pl, pacc, heads, kvh, \
                                  bshift, max_blocks, splits, scale);                                    \
  }
PAGED_ATTN_TC(64, 1, 2, 1, paged_attn_tc_hd64_kp1)
PAGED_ATTN_TC(64, 4, 2, 3, paged_attn_tc_hd64_kp4)
PAGED_ATTN_TC(64, 4, 1, 3, paged_attn_tc_hd64_kp4_g8)
PAGED_ATTN_TC(128, 1, 2, 1, paged_attn_tc_hd128_kp1)
PAGED_ATTN_TC(128, 4, 2, 3, paged_attn_tc_hd128_kp4)
PAGED_ATTN_TC(128, 4, 1, 3, paged_attn_tc_hd128_kp4_g8)

#endif
