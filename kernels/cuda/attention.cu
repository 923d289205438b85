// Causal GQA attention with a per-document mask (query i sees keys starts[i] ≤ j ≤ i), flash
// style: the T×T scores are never stored. The forward keeps the row log-sum-exp; the backward
// recomputes probabilities from it.
//
// One warp per row (a query row, or in dk/dv a key row): lane l holds elements l, l+WARP, ...
// of the head vectors (hd ≤ MAXC·WARP; lanes past hd hold zeros, so any head size up to 256 runs: Instella's 80 too), so a dot product is a register
// FMA loop plus one warp_sum. No atomics: dq is summed over keys by the query's warp, dk/dv over
// queries (of every head in the group) by the key's warp, so results are deterministic.
// Layouts: q, dout, out [B, H, T, hd]; k, v [B, KV, T, hd]; lse, delta [B, H, T] f32;
// starts [B, T].
#include "portable.h"

#define MAXC 8

template <typename T>
DEV void load(const T* row, float* r, int n, float scale) {
  const int lane = threadIdx.x % WARP;
#pragma unroll
  for (int c = 0; c < MAXC; ++c) r[c] = lane + c * WARP < n ? to_f(row[lane + c * WARP]) * scale : 0.f;
}

template <typename T>
DEV float dot(const float* r, const T* row, int n) {
  const int lane = threadIdx.x % WARP;
  float s = 0.f;
#pragma unroll
  for (int c = 0; c < MAXC; ++c)
    if (lane + c * WARP < n) s += r[c] * to_f(row[lane + c * WARP]);
  return warp_sum(s);
}

template <typename T>
DEV void axpy(float* acc, float a, const T* row, int n) {
  const int lane = threadIdx.x % WARP;
#pragma unroll
  for (int c = 0; c < MAXC; ++c)
    if (lane + c * WARP < n) acc[c] += a * to_f(row[lane + c * WARP]);
}

template <typename T>
DEV void store(T* row, const float* r, int n, float scale) {
  const int lane = threadIdx.x % WARP;
#pragma unroll
  for (int c = 0; c < MAXC; ++c)
    if (lane + c * WARP < n) row[lane + c * WARP] = from_f<T>(r[c] * scale);
}

DEV int warp_in_grid() { return blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP; }

// grid (ceil(T / warps per block), H, B).
#define ATTN_FWD(S, T)                                                                             \
  KERNEL void attn_fwd_##S(const T* q, const T* k, const T* v, const unsigned* starts, T* out,    \
                           float* lse, int H, int KV, int Tn, int hd, float scale) {               \
    const int i = warp_in_grid(), h = blockIdx.y, b = blockIdx.z;                  \
    if (i >= Tn) return;                                                                           \
    const size_t row = ((size_t)b * H + h) * Tn + i;                                               \
    const size_t kv0 = ((size_t)b * KV + h / (H / KV)) * Tn * hd;                                  \
    float qr[MAXC], o[MAXC] = {0.f};                                                               \
    load(q + row * hd, qr, hd, scale);                                                             \
    float m = -INFINITY, l = 0.f;                                                                  \
    for (int j = starts[(size_t)b * Tn + i]; j <= i; ++j) {                                        \
      const float s = dot(qr, k + kv0 + (size_t)j * hd, hd);                                       \
      const float mn = fmaxf(m, s), corr = expf(m - mn), p = expf(s - mn);                         \
      l = l * corr + p;                                                                            \
      _Pragma("unroll") for (int c = 0; c < MAXC; ++c) o[c] *= corr;                               \
      axpy(o, p, v + kv0 + (size_t)j * hd, hd);                                                    \
      m = mn;                                                                                      \
    }                                                                                              \
    store(out + row * hd, o, hd, 1.f / l);                                                         \
    if (threadIdx.x % WARP == 0) lse[row] = m + logf(l);                                           \
  }
FOR_DTYPES(ATTN_FWD)

// dq_i = scale·Σ_j p_ij (dp_ij − D_i) k_j with dp_ij = dout_i·v_j and D_i = Σ_j p_ij dp_ij,
// accumulated in one pass as scale·(Σ p·dp·k − D·Σ p·k). D goes to `delta` for the dk/dv pass.
#define ATTN_BWD_DQ(S, T)                                                                          \
  KERNEL void attn_bwd_dq_##S(const T* dout, const T* q, const T* k, const T* v,                  \
                              const unsigned* starts, const float* lse, T* dq, float* delta,       \
                              int H, int KV, int Tn, int hd, float scale) {                        \
    const int i = warp_in_grid(), h = blockIdx.y, b = blockIdx.z;                  \
    if (i >= Tn) return;                                                                           \
    const size_t row = ((size_t)b * H + h) * Tn + i;                                               \
    const size_t kv0 = ((size_t)b * KV + h / (H / KV)) * Tn * hd;                                  \
    float qr[MAXC], dor[MAXC], a[MAXC] = {0.f}, pk[MAXC] = {0.f};                                  \
    load(q + row * hd, qr, hd, scale);                                                             \
    load(dout + row * hd, dor, hd, 1.f);                                                           \
    const float li = lse[row];                                                                     \
    float d = 0.f;                                                                                 \
    for (int j = starts[(size_t)b * Tn + i]; j <= i; ++j) {                                        \
      const T* kj = k + kv0 + (size_t)j * hd;                                                      \
      const float p = expf(dot(qr, kj, hd) - li);                                                  \
      const float dp = dot(dor, v + kv0 + (size_t)j * hd, hd);                                     \
      d += p * dp;                                                                                 \
      axpy(a, p * dp, kj, hd);                                                                     \
      axpy(pk, p, kj, hd);                                                                         \
    }                                                                                              \
    _Pragma("unroll") for (int c = 0; c < MAXC; ++c) a[c] -= d * pk[c];                            \
    store(dq + row * hd, a, hd, scale);                                                            \
    if (threadIdx.x % WARP == 0) delta[row] = d;                                                   \
  }
FOR_DTYPES(ATTN_BWD_DQ)

// One warp per key row j of kv head kh: dv_j = Σ p_ij dout_i, dk_j = scale·Σ p_ij (dp_ij − D_i) q_i
// over every query head of the group and every query i that sees j (i ≥ j while starts[i] ≤ j:
// starts never decrease along a row, so the loop stops at the first query of a later document).
// grid (ceil(T / warps per block), KV, B).
#define ATTN_BWD_DKDV(S, T)                                                                        \
  KERNEL void attn_bwd_dkdv_##S(const T* dout, const T* q, const T* k, const T* v,                \
                                const unsigned* starts, const float* lse, const float* delta,      \
                                T* dk, T* dv, int H, int KV, int Tn, int hd, float scale) {        \
    const int j = warp_in_grid(), kh = blockIdx.y, b = blockIdx.z, g = H / KV;     \
    if (j >= Tn) return;                                                                           \
    const size_t krow = ((size_t)b * KV + kh) * Tn + j;                                            \
    float kr[MAXC], vr[MAXC], dkr[MAXC] = {0.f}, dvr[MAXC] = {0.f};                                \
    load(k + krow * hd, kr, hd, scale);                                                            \
    load(v + krow * hd, vr, hd, 1.f);                                                              \
    const unsigned* st = starts + (size_t)b * Tn;                                                  \
    for (int hh = 0; hh < g; ++hh) {                                                               \
      const size_t q0 = ((size_t)b * H + kh * g + hh) * Tn;                                        \
      for (int i = j; i < Tn && st[i] <= (unsigned)j; ++i) {                                       \
        const T* qi = q + (q0 + i) * hd;                                                           \
        const T* doi = dout + (q0 + i) * hd;                                                       \
        const float p = expf(dot(kr, qi, hd) - lse[q0 + i]);                                       \
        const float ds = p * (dot(vr, doi, hd) - delta[q0 + i]);                                   \
        axpy(dvr, p, doi, hd);                                                                     \
        axpy(dkr, ds, qi, hd);                                                                     \
      }                                                                                            \
    }                                                                                              \
    store(dk + krow * hd, dkr, hd, scale);                                                         \
    store(dv + krow * hd, dvr, hd, 1.f);                                                           \
  }
FOR_DTYPES(ATTN_BWD_DKDV)
