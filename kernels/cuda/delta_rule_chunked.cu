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
// Scratch (f32, rows padded to whole chunks, Tp = 64·chunks): U, δ [B·H, Tp, d_v], W [B·H, Tp,
// d_k], G [B·H, Tp]. Predicted at the Qwen3.6-27B layer (B = 2, T = 4096, 48 value heads of
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
  extern __shared__ float smem[];
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
        W[(row0 + i) * d.dk + col - d.dv] = x[i];
    }
  }
}

// ---- delta_chunk_state ----

// Thread (row group, column): rows warp, warp + 8, ... of the state tile, column lane.
template <typename T>
DEV void chunk_state(const T* k, const unsigned* starts, const float* U, const float* W, const float* G,
                     const float* s0, float* delta, float* state, float* kept, Dims d) {
  extern __shared__ float smem[];
  const int ld = d.dk + 1, cs = STATE_COLS + 1;
  float *hs = smem, *ws = hs + d.dk * STATE_COLS, *ks = ws + CH * ld, *vs = ks + CH * ld, *tokf = vs + CH * cs;
  const ChunkTokens s{(int*)(tokf + 4 * CH), tokf, tokf + 2 * CH, tokf + 3 * CH};
  const int bh = blockIdx.x, col0 = blockIdx.y * STATE_COLS;
  const int cc = threadIdx.x % STATE_COLS, grp = threadIdx.x / STATE_COLS, groups = THREADS / STATE_COLS;
  const int col = col0 + cc;
  const bool col_ok = col < d.dv;
  const Head hd(d, bh);
  const size_t head = (size_t)bh * d.dk * d.dv;
  for (int r = grp; r < d.dk; r += groups) hs[r * STATE_COLS + cc] = col_ok ? s0[head + (size_t)r * d.dv + col] : 0.f;
  for (int c = 0; c < d.chunks; ++c) {
    const int c0 = c * CH;
    const size_t row0 = (size_t)bh * d.tp() + c0;
    if (col_ok)
      for (int r = grp; r < d.dk; r += groups)
        kept[((size_t)bh * d.chunks + c) * d.dk * d.dv + (size_t)r * d.dv + col] = hs[r * STATE_COLS + cc];
    for (int e = threadIdx.x; e < CH * d.dk; e += blockDim.x) ws[e / d.dk * ld + e % d.dk] = W[row0 * d.dk + e];
    load_qk(ks, ld, k, d, hd, c0);
    load_tokens(s, d, hd, c0, starts, nullptr, nullptr, G + row0);
    const int last = min(CH, d.t - c0) - 1;
    // δ = U − W h for rows grp, grp + 8, ...; kept decay-weighted for the state update.
    for (int i = grp; i < CH; i += groups) {
      float acc = col_ok ? U[(row0 + i) * d.dv + col] : 0.f;
      for (int r = 0; r < d.dk; ++r) acc -= ws[i * ld + r] * hs[r * STATE_COLS + cc];
      if (col_ok) delta[(row0 + i) * d.dv + col] = acc;
      const bool in = i <= last && same_doc(s, c0, last, i);
      vs[i * cs + cc] = in ? expf(s.gc[last] - s.gc[i]) * acc : 0.f;
    }
    BARRIER();
    const float decay = expf(s.gc[last]) * s.carry[last];
    for (int r = grp; r < d.dk; r += groups) {
      float acc = decay * hs[r * STATE_COLS + cc];
      for (int j = 0; j < CH; ++j) acc += ks[j * ld + r] * vs[j * cs + cc];
      hs[r * STATE_COLS + cc] = acc;
    }
    BARRIER();
  }
  if (col_ok)
    for (int r = grp; r < d.dk; r += groups) state[head + (size_t)r * d.dv + col] = hs[r * STATE_COLS + cc];
}

// ---- delta_chunk_out ----

template <typename T>
DEV void chunk_out(const T* q, const T* k, const unsigned* starts, const float* G, const float* kept,
                   const float* delta, T* out, Dims d, float scale) {
  extern __shared__ float smem[];
  const int ld = d.dk + 1, cs = OUT_COLS + 1;
  // The K buffer holds the state tile [d_k][OUT_COLS] once P is formed (d_k·64 < 64·(d_k + 1)).
  float *qs = smem, *ks = qs + CH * ld, *p = ks + CH * ld, *vs = p + CH * (CH + 1), *tokf = vs + CH * cs;
  const ChunkTokens s{(int*)(tokf + 4 * CH), tokf, tokf + 2 * CH, tokf + 3 * CH};
  const int bh = blockIdx.x, c = blockIdx.y, c0 = c * CH, n = min(CH, d.t - c0);
  const Head hd(d, bh);
  const size_t row0 = (size_t)bh * d.tp() + c0;
  load_qk(qs, ld, q, d, hd, c0);
  load_qk(ks, ld, k, d, hd, c0);
  load_tokens(s, d, hd, c0, starts, nullptr, nullptr, G + row0);
  for (int e = threadIdx.x; e < CH * CH; e += blockDim.x) {
    const int i = e / CH, j = e % CH;
    float val = 0.f;
    if (i < n && same_doc(s, c0, i, j)) {
      float dot = 0.f;
      for (int r = 0; r < d.dk; ++r) dot += qs[i * ld + r] * ks[j * ld + r];
      val = expf(s.gc[i] - s.gc[j]) * dot;
    }
    p[i * (CH + 1) + j] = val;
  }
  const float* h = kept + ((size_t)bh * d.chunks + c) * d.dk * d.dv;
  const int cc = threadIdx.x % OUT_COLS, grp = threadIdx.x / OUT_COLS, groups = THREADS / OUT_COLS;
  float* hs = ks;
  for (int ct = 0; ct < d.dv; ct += OUT_COLS) {
    const int col = ct + cc;
    const bool col_ok = col < d.dv;
    BARRIER();  // P formed (first tile), or the previous tile's reads done
    for (int r = grp; r < d.dk; r += groups) hs[r * OUT_COLS + cc] = col_ok ? h[(size_t)r * d.dv + col] : 0.f;
    for (int i = grp; i < CH; i += groups) vs[i * cs + cc] = col_ok ? delta[(row0 + i) * d.dv + col] : 0.f;
    BARRIER();
    for (int i = grp; i < n; i += groups) {
      float inter = 0.f, intra = 0.f;
      for (int r = 0; r < d.dk; ++r) inter += qs[i * ld + r] * hs[r * OUT_COLS + cc];
      for (int j = 0; j <= i; ++j) intra += p[i * (CH + 1) + j] * vs[j * cs + cc];
      if (col_ok) out[hd.at(d, c0 + i) * d.dv + col] = from_f<T>(scale * (expf(s.gc[i]) * s.carry[i] * inter + intra));
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
