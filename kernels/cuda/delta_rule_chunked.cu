// The gated delta rule's training forward in chunked form (flash-linear-attention's
// chunk_gated_delta_rule; kernels/src/delta_rule/chunked.rs derives it and checks it in f64):
// the per-token chain of the fused-recurrent kernel (delta_rule.cu) becomes a chain of one step
// per 64-token chunk, and everything inside a chunk is matrix products, parallel over chunks.
//
// Three kernels, f32 arithmetic on the CUDA cores (the products are staged in shared memory; the
// tensor-core version of the same three stages is the next step):
//   delta_chunk_wy     grid (B·H, chunks): per chunk the cumulative log-decay G, the decay- and
//                      document-masked A = β·(k kᵀ)·e^{G_i−G_j} (strictly lower), and the WY
//                      solve U = (I + A)⁻¹ β v, W = (I + A)⁻¹ β e^G carry k by forward
//                      substitution, one right-hand-side column a thread, in registers.
//   delta_chunk_state  grid (B·H, value-column tiles of 32): the only sequential part, over
//                      chunks: keep h (the checkpoint), δ = U − W h, h ← e^{G_last}·carry·h
//                      + Σ_j e^{G_last−G_j} k_j δ_jᵀ (j in the last token's document).
//   delta_chunk_out    grid (B·H, chunks): o = scale·(e^G carry q h + (q kᵀ ⊙ decay mask) δ).
// carry_i (token i's document began before the chunk, or is the row's first) says whether h
// reaches token i: a document start inside a chunk only zeroes masks, exactly as the recurrence
// restarts its state there. Rows past T are zeros and stay out of every sum.
//
// Scratch (f32, rows padded to whole chunks, Tp = 64·chunks): U, δ [B·H, Tp, d_v], W (each
// chunk's transposed, [d_k][64]) [B·H, Tp, d_k], G [B·H, Tp]. Predicted at the Qwen3.6-27B layer (B = 2, T = 4096, 48 value heads of
// 128×128, bf16): ~0.6 GB of scratch; delta_chunk_wy ~0.8 G FMA-with-shared-load (~0.7 ms),
// delta_chunk_state ~13 G (~2 ms: shared-memory bound), delta_chunk_out ~11 G (~1.5 ms): ~4 ms
// against the fused-recurrent forward's 6.6 ms.
#include "portable.h"

#define CH 64
#define THREADS 256
#define STATE_COLS 32
#define OUT_COLS 64

struct Dims {
  int b, t, hk, h, dk, dv, chunks;
  DEV_MEMBER int tp() const { return chunks * CH; }
};

// Token c0 + i's index in [B, T, H] for head bh = b·H + h, and its q/k row.
struct Head {
  int b, h, hq;
  DEV_MEMBER Head(const Dims& d, int bh) : b(bh / d.h), h(bh % d.h), hq(bh % d.h / (d.h / d.hk)) {}
  DEV_MEMBER size_t at(const Dims& d, int t) const { return ((size_t)b * d.t + t) * d.h + h; }
  DEV_MEMBER size_t qk(const Dims& d, int t) const { return (((size_t)b * d.t + t) * d.hk + hq) * d.dk; }
};

// The chunk's per-token scalars in shared memory: the first token of each token's document, the
// cumulative log-decay, β and carry (0 past the row's end).
struct ChunkTokens {
  int* start;
  float *gc, *beta, *carry;
};

// Loads starts and β, and G (computed from g when `g` is given, else read from `gbuf`). Every
// thread of the block calls it; ends with a barrier.
DEV void load_tokens(const ChunkTokens& s, const Dims& d, const Head& hd, int c0, const unsigned* starts,
                     const float* beta, const float* g, const float* gbuf) {
  const int n = min(CH, d.t - c0), i = threadIdx.x;
  if (i < CH) {
    const bool ok = i < n;
    const int st = ok ? (int)starts[(size_t)hd.b * d.t + c0 + i] : c0 + i;
    s.start[i] = st;
    s.carry[i] = ok && (st == 0 || st < c0) ? 1.f : 0.f;
    s.beta[i] = ok && beta ? beta[hd.at(d, c0 + i)] : 0.f;
    if (!g) s.gc[i] = gbuf[i];
  }
  if (g) {
    float* raw = s.gc + CH;  // the raw gates first, summed in token order (as the f64 form)
    if (i < CH) raw[i] = i < n ? g[hd.at(d, c0 + i)] : 0.f;
    BARRIER();
    float acc = 0.f;
    if (i < CH)
      for (int j = 0; j <= i; ++j) acc += raw[j];
    BARRIER();
    if (i < CH) s.gc[i] = acc;
  }
  BARRIER();
}

// Rows c0.. of a [.., d_k] operand of head hq into `dst` (row stride ld), zeros past T.
template <typename T> DEV void load_qk(float* dst, int ld, const T* x, const Dims& d, const Head& hd, int c0) {
  const int n = min(CH, d.t - c0);
  for (int e = threadIdx.x; e < CH * d.dk; e += blockDim.x) {
    const int i = e / d.dk, r = e % d.dk;
    dst[i * ld + r] = i < n ? to_f(x[hd.qk(d, c0 + i) + r]) : 0.f;
  }
}

// Whether token c0 + j is in token c0 + i's document and not after it.
DEV bool same_doc(const ChunkTokens& s, int c0, int i, int j) { return j <= i && c0 + j >= s.start[i]; }

// ---- delta_chunk_wy ----

template <typename T>
DEV void chunk_wy(const T* k, const T* v, const float* beta, const float* g, const unsigned* starts, float* U,
                  float* W, float* G, Dims d) {
  extern __shared__ __align__(16) float smem[];
  const int ld = d.dk + 1;  // odd stride: column reads of K hit distinct banks
  float *ks = smem, *a = ks + CH * ld, *tokf = a + CH * (CH + 1);
  const ChunkTokens s{(int*)(tokf + 4 * CH), tokf, tokf + 2 * CH, tokf + 3 * CH};
  const int bh = blockIdx.x, c = blockIdx.y, c0 = c * CH;
  const Head hd(d, bh);
  load_qk(ks, ld, k, d, hd, c0);
  load_tokens(s, d, hd, c0, starts, beta, g, nullptr);
  for (int e = threadIdx.x; e < CH * CH; e += blockDim.x) {
    const int i = e / CH, m = e % CH;
    float val = 0.f;
    if (m < i && same_doc(s, c0, i, m)) {
      float dot = 0.f;
      for (int r = 0; r < d.dk; ++r) dot += ks[i * ld + r] * ks[m * ld + r];
      val = s.beta[i] * expf(s.gc[i] - s.gc[m]) * dot;
    }
    a[i * (CH + 1) + m] = val;
  }
  BARRIER();
  const size_t row0 = (size_t)bh * d.tp() + c0;
  if (threadIdx.x < CH) G[row0 + threadIdx.x] = s.gc[threadIdx.x];
  const int n = min(CH, d.t - c0);
  // One column of [β v | β e^G carry k] a thread, solved down the rows in registers.
  for (int col = threadIdx.x; col < d.dv + d.dk; col += blockDim.x) {
    const bool is_u = col < d.dv;
    float x[CH];
#pragma unroll
    for (int i = 0; i < CH; ++i) {
      float rhs = 0.f;
      if (i < n)
        rhs = is_u ? s.beta[i] * to_f(v[hd.at(d, c0 + i) * d.dv + col])
                   : s.beta[i] * expf(s.gc[i]) * s.carry[i] * ks[i * ld + col - d.dv];
#pragma unroll
      for (int m = 0; m < i; ++m) rhs -= a[i * (CH + 1) + m] * x[m];
      x[i] = rhs;
    }
#pragma unroll
    for (int i = 0; i < CH; ++i) {
      if (is_u)
        U[(row0 + i) * d.dv + col] = x[i];
      else
        W[row0 * d.dk + (size_t)(col - d.dv) * CH + i] = x[i];  // Wᵀ per chunk, [d_k][64]
    }
  }
}

// ---- delta_chunk_state ----

// The products are register-tiled (4×2 and 4×4 outputs a thread, float4/float2 shared loads):
// the first version read two shared floats per FMA and measured 15 ms at the 27B layer, bound
// by shared-memory loads.
template <typename T>
DEV void chunk_state(const T* k, const unsigned* starts, const float* U, const float* W, const float* G,
                     const float* s0, float* delta, float* state, float* kept, Dims d) {
  extern __shared__ __align__(16) float smem[];
  const int kld = (d.dk + 3) / 4 * 4;  // rows d_k.. of the tiles are zero padding
  float *hs = smem, *wt = hs + kld * STATE_COLS, *ks = wt + kld * CH, *vd = ks + CH * kld;
  float* tokf = vd + CH * STATE_COLS;
  const ChunkTokens s{(int*)(tokf + 4 * CH), tokf, tokf + 2 * CH, tokf + 3 * CH};
  const int bh = blockIdx.x, col0 = blockIdx.y * STATE_COLS, tid = threadIdx.x;
  const Head hd(d, bh);
  const size_t head = (size_t)bh * d.dk * d.dv;
  auto col_of = [&](int e) { return col0 + e % STATE_COLS; };
  for (int e = tid; e < kld * STATE_COLS; e += THREADS) {
    const int r = e / STATE_COLS, col = col_of(e);
    hs[e] = r < d.dk && col < d.dv ? s0[head + (size_t)r * d.dv + col] : 0.f;
  }
  for (int c = 0; c < d.chunks; ++c) {
    const int c0 = c * CH, n = min(CH, d.t - c0), last = n - 1;
    const size_t row0 = (size_t)bh * d.tp() + c0;
    BARRIER();  // the previous chunk's update (or the initial load) done
    for (int e = tid; e < kld * STATE_COLS; e += THREADS) {
      const int r = e / STATE_COLS, col = col_of(e);
      if (r < d.dk && col < d.dv) kept[((size_t)bh * d.chunks + c) * d.dk * d.dv + (size_t)r * d.dv + col] = hs[e];
    }
    // Wᵀ of the chunk lies [d_k][64] (delta_chunk_wy writes it so).
    for (int e = tid; e < kld * CH; e += THREADS) wt[e] = e / CH < d.dk ? W[row0 * d.dk + e] : 0.f;
    for (int e = tid; e < CH * kld; e += THREADS) {
      const int i = e / kld, r = e % kld;
      ks[e] = r < d.dk && i < n ? to_f(k[hd.qk(d, c0 + i) + r]) : 0.f;
    }
    load_tokens(s, d, hd, c0, starts, nullptr, nullptr, G + row0);
    {  // δ = U − W h: rows i0..i0+3, columns c2, c2+1 of the tile
      const int i0 = tid / 16 * 4, c2 = tid % 16 * 2;
      float acc[4][2];
#pragma unroll
      for (int a = 0; a < 4; ++a)
#pragma unroll
        for (int b = 0; b < 2; ++b) {
          const int col = col0 + c2 + b;
          acc[a][b] = col < d.dv ? U[(row0 + i0 + a) * d.dv + col] : 0.f;
        }
      for (int r = 0; r < d.dk; ++r) {
        const float4 w4 = *reinterpret_cast<const float4*>(wt + r * CH + i0);
        const float2 h2 = *reinterpret_cast<const float2*>(hs + r * STATE_COLS + c2);
        const float w[4] = {w4.x, w4.y, w4.z, w4.w}, h[2] = {h2.x, h2.y};
#pragma unroll
        for (int a = 0; a < 4; ++a)
#pragma unroll
          for (int b = 0; b < 2; ++b) acc[a][b] -= w[a] * h[b];
      }
#pragma unroll
      for (int a = 0; a < 4; ++a) {
        const int i = i0 + a;
        const bool in = i <= last && same_doc(s, c0, last, i);
        const float wgt = in ? expf(s.gc[last] - s.gc[i]) : 0.f;
#pragma unroll
        for (int b = 0; b < 2; ++b) {
          const int col = col0 + c2 + b;
          if (col < d.dv) delta[(row0 + i) * d.dv + col] = acc[a][b];
          vd[i * STATE_COLS + c2 + b] = wgt * acc[a][b];
        }
      }
    }
    BARRIER();
    {  // h ← e^{G_last}·carry·h + Σ_j K_jᵀ (decay-weighted δ_j): rows r0..r0+3, columns c4..c4+3
      const int r0 = tid / 8 * 4, c4 = tid % 8 * 4;
      if (r0 < kld) {
        const float decay = expf(s.gc[last]) * s.carry[last];
        float acc[4][4];
#pragma unroll
        for (int a = 0; a < 4; ++a)
#pragma unroll
          for (int b = 0; b < 4; ++b) acc[a][b] = decay * hs[(r0 + a) * STATE_COLS + c4 + b];
        for (int j = 0; j < CH; ++j) {
          const float4 k4 = *reinterpret_cast<const float4*>(ks + j * kld + r0);
          const float4 v4 = *reinterpret_cast<const float4*>(vd + j * STATE_COLS + c4);
          const float kk[4] = {k4.x, k4.y, k4.z, k4.w}, vv[4] = {v4.x, v4.y, v4.z, v4.w};
#pragma unroll
          for (int a = 0; a < 4; ++a)
#pragma unroll
            for (int b = 0; b < 4; ++b) acc[a][b] += kk[a] * vv[b];
        }
#pragma unroll
        for (int a = 0; a < 4; ++a)
#pragma unroll
          for (int b = 0; b < 4; ++b) hs[(r0 + a) * STATE_COLS + c4 + b] = acc[a][b];
      }
    }
  }
  BARRIER();
  for (int e = tid; e < kld * STATE_COLS; e += THREADS) {
    const int r = e / STATE_COLS, col = col_of(e);
    if (r < d.dk && col < d.dv) state[head + (size_t)r * d.dv + col] = hs[e];
  }
}

// ---- delta_chunk_out ----

// Qᵀ, Kᵀ (then the state tile) lie [d_k][QLD] (padded: their transposing stores conflict less);
// Pᵀ [64][64]; δ [64][OUT_COLS]. Thread (i0, c4): rows i0..i0+3, columns c4..c4+3.
#define QLD (CH + 4)
template <typename T>
DEV void chunk_out(const T* q, const T* k, const unsigned* starts, const float* G, const float* kept,
                   const float* delta, T* out, Dims d, float scale) {
  extern __shared__ __align__(16) float smem[];
  float *qt = smem, *kt = qt + d.dk * QLD, *pt = kt + d.dk * QLD, *vs = pt + CH * CH, *tokf = vs + CH * OUT_COLS;
  const ChunkTokens s{(int*)(tokf + 4 * CH), tokf, tokf + 2 * CH, tokf + 3 * CH};
  const int bh = blockIdx.x, c = blockIdx.y, c0 = c * CH, n = min(CH, d.t - c0), tid = threadIdx.x;
  const Head hd(d, bh);
  const size_t row0 = (size_t)bh * d.tp() + c0;
  for (int e = tid; e < CH * d.dk; e += THREADS) {
    const int i = e / d.dk, r = e % d.dk;
    const bool ok = i < n;
    qt[r * QLD + i] = ok ? to_f(q[hd.qk(d, c0 + i) + r]) : 0.f;
    kt[r * QLD + i] = ok ? to_f(k[hd.qk(d, c0 + i) + r]) : 0.f;
  }
  load_tokens(s, d, hd, c0, starts, nullptr, nullptr, G + row0);
  const int i0 = tid / 16 * 4, c4 = tid % 16 * 4;
  {  // Pᵀ[j][i] = e^{G_i−G_j}·q_i·k_j where j is in i's document and not after it
    float acc[4][4] = {};
    for (int r = 0; r < d.dk; ++r) {
      const float4 q4 = *reinterpret_cast<const float4*>(qt + r * QLD + i0);
      const float4 k4 = *reinterpret_cast<const float4*>(kt + r * QLD + c4);
      const float qq[4] = {q4.x, q4.y, q4.z, q4.w}, kk[4] = {k4.x, k4.y, k4.z, k4.w};
#pragma unroll
      for (int a = 0; a < 4; ++a)
#pragma unroll
        for (int b = 0; b < 4; ++b) acc[a][b] += qq[a] * kk[b];
    }
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      float v[4];
#pragma unroll
      for (int a = 0; a < 4; ++a) {
        const int i = i0 + a, j = c4 + b;
        v[a] = i < n && same_doc(s, c0, i, j) ? expf(s.gc[i] - s.gc[j]) * acc[a][b] : 0.f;
      }
      *reinterpret_cast<float4*>(pt + (c4 + b) * CH + i0) = make_float4(v[0], v[1], v[2], v[3]);
    }
  }
  const float* h = kept + ((size_t)bh * d.chunks + c) * d.dk * d.dv;
  float* hs = kt;
  for (int ct = 0; ct < d.dv; ct += OUT_COLS) {
    BARRIER();  // Pᵀ formed (first tile), or the previous tile's reads done
    for (int e = tid; e < d.dk * OUT_COLS; e += THREADS) {
      const int r = e / OUT_COLS, col = ct + e % OUT_COLS;
      hs[r * QLD + e % OUT_COLS] = col < d.dv ? h[(size_t)r * d.dv + col] : 0.f;
    }
    for (int e = tid; e < CH * OUT_COLS; e += THREADS) {
      const int j = e / OUT_COLS, col = ct + e % OUT_COLS;
      vs[e] = col < d.dv ? delta[(row0 + j) * d.dv + col] : 0.f;
    }
    BARRIER();
    float inter[4][4] = {}, intra[4][4] = {};
    for (int r = 0; r < d.dk; ++r) {
      const float4 q4 = *reinterpret_cast<const float4*>(qt + r * QLD + i0);
      const float4 h4 = *reinterpret_cast<const float4*>(hs + r * QLD + c4);
      const float qq[4] = {q4.x, q4.y, q4.z, q4.w}, hh[4] = {h4.x, h4.y, h4.z, h4.w};
#pragma unroll
      for (int a = 0; a < 4; ++a)
#pragma unroll
        for (int b = 0; b < 4; ++b) inter[a][b] += qq[a] * hh[b];
    }
    for (int j = 0; j < i0 + 4; ++j) {  // Pᵀ is zero past each row's token
      const float4 p4 = *reinterpret_cast<const float4*>(pt + j * CH + i0);
      const float4 v4 = *reinterpret_cast<const float4*>(vs + j * OUT_COLS + c4);
      const float pp[4] = {p4.x, p4.y, p4.z, p4.w}, vv[4] = {v4.x, v4.y, v4.z, v4.w};
#pragma unroll
      for (int a = 0; a < 4; ++a)
#pragma unroll
        for (int b = 0; b < 4; ++b) intra[a][b] += pp[a] * vv[b];
    }
#pragma unroll
    for (int a = 0; a < 4; ++a) {
      const int i = i0 + a;
      if (i >= n) continue;
      const float gate = expf(s.gc[i]) * s.carry[i];
#pragma unroll
      for (int b = 0; b < 4; ++b) {
        const int col = ct + c4 + b;
        if (col < d.dv) out[hd.at(d, c0 + i) * d.dv + col] = from_f<T>(scale * (gate * inter[a][b] + intra[a][b]));
      }
    }
  }
}

#define DELTA_CHUNKED(SUF, T)                                                                      \
  KERNEL void __launch_bounds__(THREADS)                                                           \
      delta_chunk_wy_##SUF(const T* k, const T* v, const float* beta, const float* g,              \
                           const unsigned* starts, float* U, float* W, float* G, int b, int t,     \
                           int hk, int h, int dk, int dv, int chunks) {                            \
    chunk_wy<T>(k, v, beta, g, starts, U, W, G, Dims{b, t, hk, h, dk, dv, chunks});                \
  }                                                                                                \
  KERNEL void __launch_bounds__(THREADS)                                                           \
      delta_chunk_state_##SUF(const T* k, const unsigned* starts, const float* U, const float* W,  \
                              const float* G, const float* s0, float* delta, float* state,         \
                              float* kept, int b, int t, int hk, int h, int dk, int dv, int chunks) { \
    chunk_state<T>(k, starts, U, W, G, s0, delta, state, kept, Dims{b, t, hk, h, dk, dv, chunks}); \
  }                                                                                                \
  KERNEL void __launch_bounds__(THREADS)                                                           \
      delta_chunk_out_##SUF(const T* q, const T* k, const unsigned* starts, const float* G,        \
                            const float* kept, const float* delta, T* out, int b, int t, int hk,   \
                            int h, int dk, int dv, int chunks, float scale) {                      \
    chunk_out<T>(q, k, starts, G, kept, delta, out, Dims{b, t, hk, h, dk, dv, chunks}, scale);     \
  }
FOR_DTYPES(DELTA_CHUNKED)
