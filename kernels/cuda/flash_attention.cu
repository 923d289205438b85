// Causal GQA flash attention on the tensor cores: bf16 q, k, v, f32 accumulation, head sizes 64,
// 80, 128 and 256 (see `held` for how 256 differs), the per-document mask of attention.cu (query i sees keys starts[i] ≤ j ≤ i). No T×T
// matrix exists anywhere: scores live in registers, one tile at a time.
//
// The building block is the warp-wide m16n8k16 bf16 MMA. A warp owns 16 rows of the tile's
// left-hand side; K, V, Q and dO tiles are staged in shared memory with cp.async (rows padded by
// 16 bytes so ldmatrix reads are bank-conflict free) and read into MMA fragments with ldmatrix
// (.trans where the tile is the right-hand side along its rows). The C fragment of one MMA is
// laid out as the A fragment of the next, which is how probabilities feed P·V without going
// through memory.
//
// Backward is two kernels: dK/dV per key block over every query (of every head in the group) that
// sees it, dQ per query block over its keys. D = rowsum(dO∘O) comes first from attn_bwd_delta.
// The deterministic dQ gives each query block to one thread block, so results are bitwise
// reproducible. The split dQ divides a block's keys among `splits` thread blocks that add their
// parts into an f32 buffer with atomics (the order of those adds varies from run to run), which
// evens out the causal triangle's long and short rows; flash_dq_finish rounds the sum to bf16.
//
// Layouts: q, dout, out, dq [B, H, T, hd] or [B, T, H, hd] (one of the two for all four: the model's
// projections give the second, so no transpose runs on either side of attention); k, v, dk, dv
// likewise [B, KV, T, hd] or [B, T, KV, hd]; the row stride `ld` (hd or heads·hd elements) tells
// the two apart (see `Heads`). lse, delta [B, H, T] f32 (natural log); starts [B, T]. Every row is
// 16-byte aligned (hd·2 bytes each).
//
// mma.sync, ldmatrix and cp.async are NVIDIA (sm_80+) instructions: under HIP this file is empty
// and the portable warp-per-row kernels of attention.cu serve (see docs/benchmarks.md).
#include "portable.h"

#if !defined(__HIPCC__)
#include "flash.h"

namespace {

using namespace mma16;
using namespace flash;

// Forward: one block per 64 query rows of one head; warps own 16 rows each, over key tiles of
// BC (32 or 64: the plan's choice; smaller tiles mask less of the diagonal and use fewer registers,
// larger ones issue fewer barriers). K and V tiles are loaded one stage apart so the next K
// streams in during softmax and P·V.
// Dynamic shared memory: none where Q's fragments are held (static tiles), else Q, K and V tiles.
template <int HD, int BC> constexpr int fwd_smem_bytes() { return held(HD) ? 0 : (64 + 2 * BC) * (HD + PAD) * 2; }

template <int HD, int BC>
DEV void fwd(const bf16* q, const bf16* k, const bf16* v, const unsigned* starts, bf16* out, float* lse,
             int H, int KV, int qld, int kld, int Tn, float scale) {
  constexpr int BR = 64, LD = HD + PAD;
  constexpr bool HELD = held(HD);
  bf16 *sq, *sk, *sv;
  if constexpr (HELD) {
    // Q is staged through sk before the first K tile, so sk holds at least BR rows.
    __shared__ __align__(16) bf16 tk[(BC > BR ? BC : BR) * LD], tv[BC * LD];
    sq = sk = tk;
    sv = tv;
  } else {
    extern __shared__ __align__(16) bf16 dyn[];  // fwd_smem_bytes
    sq = dyn;
    sk = sq + BR * LD;
    sv = sk + BC * LD;
  }
  const int w = threadIdx.x / 32, l = threadIdx.x % 32, g = l / 4, t4 = l % 4;
  const int q0 = blockIdx.x * BR, h = blockIdx.y, b = blockIdx.z;
  const size_t qoff = Heads<HD>{H, qld}.base(b, h, Tn), kvoff = Heads<HD>{KV, kld}.base(b, h / (H / KV), Tn);
  const unsigned* st = starts + (size_t)b * Tn;

  load_tile<BR, HD>(sq, q + qoff, q0, Tn, qld);
  cp_commit();
  cp_wait<0>();
  BARRIER();
  RowFrags<HD, HELD> qa;
  qa.load(sq, w * 16);
  BARRIER();

  int row[2], first[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    row[i] = q0 + w * 16 + g + 8 * i;
    first[i] = row[i] < Tn ? (int)st[row[i]] : 0;
  }
  const float c = scale * LOG2E;  // scores in log2 units: exp2 is one instruction
  float m[2] = {-INFINITY, -INFINITY}, sum[2] = {0.f, 0.f};
  float o[HD / 8][4] = {};
  const int last = min(q0 + BR, Tn) - 1, kfirst = (int)st[q0] / BC * BC;
  load_tile<BC, HD>(sk, k + kvoff, kfirst, Tn, kld);
  cp_commit();
  load_tile<BC, HD>(sv, v + kvoff, kfirst, Tn, kld);
  cp_commit();
  for (int kb = kfirst; kb <= last; kb += BC) {
    const bool more = kb + BC <= last;
    cp_wait<1>();
    BARRIER();
    float s[BC / 8][4] = {};
    qa.template times_t<BC / 8>(s, sk);
    BARRIER();
    if (more) {
      load_tile<BC, HD>(sk, k + kvoff, kb + BC, Tn, kld);
      cp_commit();
    }
    softmax_tile<BC / 8, HD>(s, m, sum, o, c, [&](int i, int col) {
      const int key = kb + col;
      return key <= row[i] && key >= first[i] && key < Tn;
    });
    if (more)
      cp_wait<1>();
    else
      cp_wait<0>();
    BARRIER();
    mma_cols<HD, BC / 8>(o, s, sv, 0);
    BARRIER();
    if (more) {
      load_tile<BC, HD>(sv, v + kvoff, kb + BC, Tn, kld);
      cp_commit();
    }
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

// dQ: one block per 64 query rows of one head (SPLIT: per part of them, `splits` parts), over key
// tiles of 32. Q and dO fragments stay in registers; K and V tiles are staged together.
// Dynamic shared memory: none where Q's and dO's fragments are held, else Q, dO, K and V tiles.
template <int HD> constexpr int dq_smem_bytes() { return held(HD) ? 0 : (2 * 64 + 2 * 32) * (HD + PAD) * 2; }

template <int HD, bool SPLIT>
DEV void bwd_dq(const bf16* dout, const bf16* q, const bf16* k, const bf16* v, const unsigned* starts,
                const float* lse, const float* delta, bf16* dq, float* dq_sum, int splits, int H, int KV,
                int qld, int kld, int Tn, float scale) {
  constexpr int BR = 64, BC = 32, LD = HD + PAD;
  constexpr bool HELD = held(HD);
  bf16 *sq, *sdo, *sk, *sv;
  if constexpr (HELD) {
    // K and V (2 × 32 rows), or while staging Q and dO, one 64-row tile.
    __shared__ __align__(16) bf16 smem[2 * BC * LD];
    sq = sdo = sk = smem;
    sv = smem + BC * LD;
  } else {
    extern __shared__ __align__(16) bf16 dyn[];  // dq_smem_bytes
    sq = dyn;
    sdo = sq + BR * LD;
    sk = sdo + BR * LD;
    sv = sk + BC * LD;
  }
  const int w = threadIdx.x / 32, l = threadIdx.x % 32, g = l / 4, t4 = l % 4;
  const int part = SPLIT ? blockIdx.x % splits : 0;
  const int q0 = (SPLIT ? blockIdx.x / splits : blockIdx.x) * BR, h = blockIdx.y, b = blockIdx.z;
  const size_t qoff = Heads<HD>{H, qld}.base(b, h, Tn), kvoff = Heads<HD>{KV, kld}.base(b, h / (H / KV), Tn);
  const unsigned* st = starts + (size_t)b * Tn;
  // This part's key tiles: an even share of the block's, in order.
  const int last = min(q0 + BR, Tn) - 1, kfirst = (int)st[q0] / BC * BC;
  const int tiles = (last - kfirst) / BC + 1, per = (tiles + splits - 1) / splits;
  const int kbegin = kfirst + part * per * BC, kend = min(last, kfirst + (part + 1) * per * BC - 1);
  if (kbegin > kend) return;  // the whole block: no barrier is pending

  RowFrags<HD, HELD> qa, da;
  load_tile<BR, HD>(sq, q + qoff, q0, Tn, qld);
  cp_commit();
  cp_wait<0>();
  BARRIER();
  qa.load(sq, w * 16);
  BARRIER();
  load_tile<BR, HD>(sdo, dout + qoff, q0, Tn, qld);
  cp_commit();
  cp_wait<0>();
  BARRIER();
  da.load(sdo, w * 16);

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
  for (int kb = kbegin; kb <= kend; kb += BC) {
    BARRIER();
    load_tile<BC, HD>(sk, k + kvoff, kb, Tn, kld);
    load_tile<BC, HD>(sv, v + kvoff, kb, Tn, kld);
    cp_commit();
    cp_wait<0>();
    BARRIER();
    float s[BC / 8][4] = {}, dp[BC / 8][4] = {};
    qa.template times_t<BC / 8>(s, sk);
    da.template times_t<BC / 8>(dp, sv);
#pragma unroll
    for (int nt = 0; nt < BC / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = e / 2, key = kb + nt * 8 + 2 * t4 + e % 2;
        const bool seen = key <= row[i] && key >= first[i] && key < Tn;
        const float p = seen ? exp2f(s[nt][e] * c - l2[i]) : 0.f;
        s[nt][e] = p * (dp[nt][e] - d[i]);  // dS, unscaled
      }
    mma_cols<HD, BC / 8>(acc, s, sk, 0);
  }
  if (SPLIT) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      if (row[i] >= Tn) continue;
      float* out = dq_sum + qoff + (size_t)row[i] * qld + 2 * t4;
#pragma unroll
      for (int nt = 0; nt < HD / 8; ++nt) {
        atomicAdd(out + nt * 8, acc[nt][2 * i] * scale);
        atomicAdd(out + nt * 8 + 1, acc[nt][2 * i + 1] * scale);
      }
    }
  } else {
    const float mul[2] = {scale, scale};
    store_rows<HD>(dq + qoff, qld, acc, q0 + w * 16, Tn, mul);
  }
}

// dK, dV: one block per 64 keys of one kv head (and per `dkdv_cols` columns of them: wide heads
// have two blocks per key block, each computing the scores again); warps own 16 keys each and hold
// their dK and dV columns in registers over every query tile (32 rows, double-buffered) of every
// head of the group that can see the block. Shared memory: K, V (64 rows each) and two stages of
// Q and dO (32 rows each).
template <int HD> constexpr int dkdv_smem_bytes() { return (2 * 64 + 4 * 32) * (HD + PAD) * 2; }

template <int HD>
DEV void bwd_dkdv(const bf16* dout, const bf16* q, const bf16* k, const bf16* v, const unsigned* starts,
                  const float* lse, const float* delta, bf16* dk, bf16* dv, int H, int KV, int qld, int kld,
                  int Tn, float scale) {
  constexpr int BK = 64, BQ = 32, LD = HD + PAD, DC = dkdv_cols(HD), PARTS = HD / DC;
  extern __shared__ __align__(16) bf16 dyn[];
  bf16 *sk = dyn, *sv = sk + BK * LD, *sq = sv + BK * LD;  // then sq[2], sdo[2]
  auto q_stage = [&](int s) { return sq + s * BQ * LD; };
  auto do_stage = [&](int s) { return sq + (2 + s) * BQ * LD; };
  const int w = threadIdx.x / 32, t4 = threadIdx.x % 4;
  const int kb = blockIdx.x / PARTS * BK, c0 = blockIdx.x % PARTS * DC, kh = blockIdx.y, b = blockIdx.z, group = H / KV;
  const size_t kvoff = Heads<HD>{KV, kld}.base(b, kh, Tn);
  const unsigned* st = starts + (size_t)b * Tn;
  const int kmax = min(kb + BK, Tn) - 1;

  load_tile<BK, HD>(sk, k + kvoff, kb, Tn, kld);
  load_tile<BK, HD>(sv, v + kvoff, kb, Tn, kld);
  cp_commit();

  const QueryTiles tiles{st, Tn, kb, kmax, BQ};
  auto stage = [&](int hh, int qs, int s) {
    const size_t qoff = Heads<HD>{H, qld}.base(b, kh * group + hh, Tn);
    load_tile<BQ, HD>(q_stage(s), q + qoff, qs, Tn, qld);
    load_tile<BQ, HD>(do_stage(s), dout + qoff, qs, Tn, qld);
    cp_commit();
  };

  float dka[DC / 8][4] = {}, dva[DC / 8][4] = {};
  const float c = scale * LOG2E;
  int key[2];
  lane_rows(key, kb + w * 16);
  int hh = 0, qs = kb, s = 0;
  stage(hh, qs, s);
  while (hh < group) {
    int nh = hh, nq = qs;
    const bool more = tiles.next(nh, nq, group);
    if (more) {
      stage(nh, nq, s ^ 1);
      cp_wait<1>();
    } else {
      cp_wait<0>();
    }
    BARRIER();
    const bf16 *tq = q_stage(s), *tdo = do_stage(s);
    const size_t rows = ((size_t)b * H + kh * group + hh) * Tn;
    float sc[BQ / 8][4] = {}, dp[BQ / 8][4] = {};
    {
      RowFrags<HD, held(HD)> a;
      a.load(sk, w * 16);
      a.template times_t<BQ / 8>(sc, tq);
      a.load(sv, w * 16);
      a.template times_t<BQ / 8>(dp, tdo);
    }
#pragma unroll
    for (int nt = 0; nt < BQ / 8; ++nt)
#pragma unroll
      for (int e2 = 0; e2 < 2; ++e2) {
        const int qi = qs + nt * 8 + 2 * t4 + e2;
        const bool ok = qi < Tn;
        const float l2 = ok ? lse[rows + qi] * LOG2E : 0.f, dl = ok ? delta[rows + qi] : 0.f;
        const int firstq = ok ? (int)st[qi] : Tn;
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const int e = 2 * i + e2;
          const bool seen = ok && key[i] <= qi && key[i] >= firstq && key[i] < Tn;
          const float p = seen ? exp2f(sc[nt][e] * c - l2) : 0.f;
          sc[nt][e] = p;
          dp[nt][e] = p * (dp[nt][e] - dl);  // dSᵀ, unscaled
        }
      }
    mma_cols<DC, BQ / 8>(dva, sc, tdo, 0, LD, c0);
    mma_cols<DC, BQ / 8>(dka, dp, tq, 0, LD, c0);
    BARRIER();
    hh = nh;
    qs = nq;
    s ^= 1;
  }
  const float mk[2] = {scale, scale}, mv[2] = {1.f, 1.f};
  store_rows<DC>(dk + kvoff + c0, kld, dka, kb + w * 16, Tn, mk);
  store_rows<DC>(dv + kvoff + c0, kld, dva, kb + w * 16, Tn, mv);
}

}  // namespace

// grid (ceil(T / 64), H, B), 128 threads, fwd_smem_bytes / dq_smem_bytes dynamic shared memory;
// qld, kld: the row strides of q (and out, dout, dq) and of k (and v, dk, dv), in elements.
#define FLASH_FWD(HD, BC)                                                                          \
  KERNEL void __launch_bounds__(THREADS)                                                           \
      flash_fwd_hd##HD##_k##BC(const bf16* q, const bf16* k, const bf16* v, const unsigned* starts, \
                               bf16* out, float* lse, int H, int KV, int qld, int kld, int Tn,     \
                               float scale) {                                                      \
    fwd<HD, BC>(q, k, v, starts, out, lse, H, KV, qld, kld, Tn, scale);                            \
  }
#define FLASH(HD)                                                                                  \
  FLASH_FWD(HD, 32)                                                                                \
  FLASH_FWD(HD, 64)                                                                                \
  KERNEL void __launch_bounds__(THREADS)                                                           \
      flash_bwd_dq_hd##HD(const bf16* dout, const bf16* q, const bf16* k, const bf16* v,           \
                          const unsigned* starts, const float* lse, const float* delta, bf16* dq,  \
                          int H, int KV, int qld, int kld, int Tn, float scale) {                  \
    bwd_dq<HD, false>(dout, q, k, v, starts, lse, delta, dq, nullptr, 1, H, KV, qld, kld, Tn, scale); \
  }                                                                                                \
  /* grid (ceil(T / 64) · splits, H, B); dq_sum zeroed first */                                   \
  KERNEL void __launch_bounds__(THREADS)                                                           \
      flash_bwd_dq_split_hd##HD(const bf16* dout, const bf16* q, const bf16* k, const bf16* v,     \
                                const unsigned* starts, const float* lse, const float* delta,      \
                                float* dq_sum, int splits, int H, int KV, int qld, int kld, int Tn, \
                                float scale) {                                                     \
    bwd_dq<HD, true>(dout, q, k, v, starts, lse, delta, nullptr, dq_sum, splits, H, KV, qld, kld, Tn, \
                     scale);                                                                       \
  }                                                                                                \
  /* grid (ceil(T / 64) · HD / dkdv_cols(HD), KV, B), 128 threads, dkdv_smem_bytes<HD>() */       \
  KERNEL void __launch_bounds__(THREADS)                                                           \
      flash_bwd_dkdv_hd##HD(const bf16* dout, const bf16* q, const bf16* k, const bf16* v,         \
                            const unsigned* starts, const float* lse, const float* delta,          \
                            bf16* dk, bf16* dv, int H, int KV, int qld, int kld, int Tn,           \
                            float scale) {                                                         \
    bwd_dkdv<HD>(dout, q, k, v, starts, lse, delta, dk, dv, H, KV, qld, kld, Tn, scale);           \
  }
FLASH(64)
FLASH(80)  // Instella-3B
FLASH(128)
FLASH(256)  // Qwen3.5/3.6's gated attention layers

// The split dQ's f32 sums rounded to bf16.
KERNEL void flash_dq_finish(const float* sum, bf16* dq, size_t n) {
  for (size_t i = global_index(); i < n; i += global_stride()) dq[i] = __float2bfloat16(sum[i]);
}

// D = rowsum(dO ∘ O) per query row, in f32: one warp per row, rows in [B, H, T] order; dout and
// out lie as the flash kernels' q (row stride ld).
KERNEL void attn_bwd_delta_bf16(const bf16* dout, const bf16* out, float* delta, int rows, int hd, int H,
                                int Tn, int ld) {
  const int r = blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP, lane = threadIdx.x % WARP;
  if (r >= rows) return;
  const int t = r % Tn, h = r / Tn % H, b = r / Tn / H;
  const size_t at = (size_t)b * H * Tn * hd + (size_t)h * (ld == hd ? (size_t)Tn * hd : hd) + (size_t)t * ld;
  float s = 0.f;
  for (int i = lane; i < hd; i += WARP) s += to_f(dout[at + i]) * to_f(out[at + i]);
  s = warp_sum(s);
  if (lane == 0) delta[r] = s;
}

#endif
