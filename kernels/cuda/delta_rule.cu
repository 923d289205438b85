// The gated delta rule (kernels/src/delta_rule.rs states the recurrence), the "fused recurrent"
// form: one token at a time, the state in registers.
//
// Layout. A block serves one (batch row, value head) and a tile of value columns; each warp owns
// CV columns and every row of the state, lane l holding rows l, l+32, l+64, l+96 (RK = 4, so
// d_k ≤ 128; wider heads take the composed reference). The reductions over rows (u = S'ᵀk,
// o = Sᵀq̃, the backward's k·dS) are warp shuffles: no barrier in the forward. Padding rows and
// columns hold zeros and stay zero, so they change no sum.
//
// Predicted cost (Qwen3.6-27B layer, B = 2, T = 4096, 48 value heads of 128×128): the forward
// reads q/k/v once per column tile (~0.3 GB in bf16) and does ~6·d_k·d_v flops a token and head
// (~20 GFLOP): latency-bound on the per-token chain of 2·CV warp sums, not on memory or
// arithmetic (measured on an H200: 6.6 ms). The backward recomputes each 64-token chunk from its
// checkpoint, keeps the chunk's per-token states in a global scratch (each thread reads back only
// what it wrote: coalesced, no synchronisation), then walks the chunk backwards: ~2× the
// forward's chain plus 2·B·H·T·d_k·d_v·4 bytes of scratch traffic (~52 GB, ~12 ms at H200
// bandwidth) and a barrier a token (measured: 28 ms). The chunked tensor-core form (FLA's
// chunk_gated_delta_rule) is what would take both below the chain's latency.
//
// Determinism: no atomics. The q/k gradients, which sum over the block's warps, the column tiles
// and the value heads sharing a key head, go through shared memory in warp order, then per-tile
// partials summed in (head, tile) order by delta_qk_grads.
#include "portable.h"

#define RK 4
#define CV 8
#define CHUNK 64

struct Sizes {
  int b, t, hk, h, dk, dv;
};

// Where a block's warp sits: the head it serves, its first column, its lane.
struct Place {
  int b, h, hq, col0, lane, warp;
  DEV_MEMBER Place(const Sizes& s) {
    const int bh = blockIdx.x;
    b = bh / s.h;
    h = bh % s.h;
    hq = h / (s.h / s.hk);
    lane = threadIdx.x % WARP;
    warp = threadIdx.x / WARP;
    col0 = (blockIdx.y * (blockDim.x / WARP) + warp) * CV;
  }
  DEV_MEMBER int row(int r) const { return lane + r * WARP; }
  // Token t's index in [B, T, H] and its q/k row's first element.
  DEV_MEMBER size_t at(const Sizes& s, int t) const { return ((size_t)b * s.t + t) * s.h + h; }
  DEV_MEMBER size_t qk(const Sizes& s, int t) const { return (((size_t)b * s.t + t) * s.hk + hq) * s.dk; }
};

// Whether a document starts at token t (the row's first token continues the initial state).
DEV bool restarts(const unsigned* starts, const Sizes& s, int b, int t) {
  return starts && t > 0 && starts[(size_t)b * s.t + t] == (unsigned)t;
}

// The lane's rows of a q/k row, zero past d_k.
template <typename T> DEV void load_rows(const T* x, const Sizes& s, const Place& p, float (&out)[RK]) {
#pragma unroll
  for (int r = 0; r < RK; ++r) out[r] = p.row(r) < s.dk ? to_f(x[p.row(r)]) : 0.f;
}

// The warp's columns of a [.., d_v] row, zero past d_v.
template <typename T> DEV void load_cols(const T* x, const Sizes& s, const Place& p, float (&out)[CV]) {
#pragma unroll
  for (int c = 0; c < CV; ++c) out[c] = p.col0 + c < s.dv ? to_f(x[p.col0 + c]) : 0.f;
}

// A [d_k, d_v] f32 matrix's lane/warp part into S, or S into it.
DEV void load_state(const float* m, const Sizes& s, const Place& p, float (&S)[RK][CV]) {
#pragma unroll
  for (int r = 0; r < RK; ++r)
#pragma unroll
    for (int c = 0; c < CV; ++c)
      S[r][c] = p.row(r) < s.dk && p.col0 + c < s.dv ? m[(size_t)p.row(r) * s.dv + p.col0 + c] : 0.f;
}

DEV void store_state(float* m, const Sizes& s, const Place& p, const float (&S)[RK][CV]) {
#pragma unroll
  for (int r = 0; r < RK; ++r)
#pragma unroll
    for (int c = 0; c < CV; ++c)
      if (p.row(r) < s.dk && p.col0 + c < s.dv) m[(size_t)p.row(r) * s.dv + p.col0 + c] = S[r][c];
}

// Lane c < CV writes column c of `vals` (warp-uniform values) to row `dst`: one coalesced store.
template <typename T> DEV void store_cols(T* dst, const Sizes& s, const Place& p, const float (&vals)[CV]) {
  float mine = 0.f;
#pragma unroll
  for (int c = 0; c < CV; ++c)
    if (p.lane == c) mine = vals[c];
  if (p.lane < CV && p.col0 + p.lane < s.dv) dst[p.col0 + p.lane] = from_f<T>(mine);
}

// One token's operands for the forward (the lane's rows of k and q, the warp's columns of v, the
// gates), loaded a token ahead of their use: the loads do not depend on the state, so issuing the
// next token's before this token's arithmetic takes their memory latency off the per-token chain
// (measured at the 27B layer, B = 2, T = 4096: 10.5 ms loaded on use, 6.6 ms ahead). The backward
// loads on use: the extra registers (168 a thread) halved its blocks per multiprocessor and it
// ran at 44 ms instead of 28.
template <typename T> struct Token {
  float k[RK], q[RK], v[CV], alpha, beta;
  DEV_MEMBER void load(const T* q_, const T* k_, const T* v_, const float* beta_, const float* g, const Sizes& s,
                       const Place& p, int t) {
    const size_t at = p.at(s, t);
    load_rows(k_ + p.qk(s, t), s, p, k);
    load_rows(q_ + p.qk(s, t), s, p, q);
    load_cols(v_ + at * s.dv, s, p, v);
    alpha = expf(g[at]);
    beta = beta_[at];
  }
};

// One token on S (the previous state, zeroed where a document starts): S' = αS, u = S'ᵀk,
// δ = β(v − u), S = S' + kδᵀ. Writes u and δ (the same in every lane).
DEV void advance(float (&S)[RK][CV], const float (&k)[RK], const float (&v)[CV], float alpha, float beta,
                 float (&u)[CV], float (&delta)[CV]) {
#pragma unroll
  for (int c = 0; c < CV; ++c) {
    float part = 0.f;
#pragma unroll
    for (int r = 0; r < RK; ++r) {
      S[r][c] *= alpha;
      part += k[r] * S[r][c];
    }
    u[c] = warp_sum(part);
    delta[c] = beta * (v[c] - u[c]);
#pragma unroll
    for (int r = 0; r < RK; ++r) S[r][c] += k[r] * delta[c];
  }
}

// out_t = Sᵀ(scale·q), per column.
DEV void read_out(const float (&S)[RK][CV], const float (&q)[RK], float scale, float (&o)[CV]) {
#pragma unroll
  for (int c = 0; c < CV; ++c) {
    float part = 0.f;
#pragma unroll
    for (int r = 0; r < RK; ++r) part += q[r] * S[r][c];
    o[c] = scale * warp_sum(part);
  }
}

// Grid (B·H, column tiles), CV·warps columns a block. `starts` is null for rows that are one
// document each (decoding); `kept` null when no checkpoints are wanted.
template <typename T>
DEV void forward(const T* q, const T* k, const T* v, const float* beta, const float* g, const float* s0,
                 const unsigned* starts, T* out, float* state, float* kept, Sizes s, float scale) {
  const Place p(s);
  if (p.col0 >= s.dv) return;
  const size_t head = (size_t)blockIdx.x * s.dk * s.dv;
  const int chunks = (s.t + CHUNK - 1) / CHUNK;
  float S[RK][CV];
  load_state(s0 + head, s, p, S);
  Token<T> next;
  next.load(q, k, v, beta, g, s, p, 0);
  for (int t = 0; t < s.t; ++t) {
    const Token<T> x = next;
    if (t + 1 < s.t) next.load(q, k, v, beta, g, s, p, t + 1);
    if (kept && t % CHUNK == 0) store_state(kept + ((size_t)blockIdx.x * chunks + t / CHUNK) * s.dk * s.dv, s, p, S);
    if (restarts(starts, s, p.b, t)) {
#pragma unroll
      for (int r = 0; r < RK; ++r)
#pragma unroll
        for (int c = 0; c < CV; ++c) S[r][c] = 0.f;
    }
    float u[CV], delta[CV], o[CV];
    advance(S, x.k, x.v, x.alpha, x.beta, u, delta);
    read_out(S, x.q, scale, o);
    store_cols(out + p.at(s, t) * s.dv, s, p, o);
  }
  store_state(state + head, s, p, S);
}

#define DELTA_FWD(SUF, T)                                                                          \
  KERNEL void delta_rule_fwd_##SUF(const T* q, const T* k, const T* v, const float* beta, const float* g, \
                                   const float* s0, const unsigned* starts, T* out, float* state,  \
                                   float* kept, int b, int t, int hk, int h, int dk, int dv,       \
                                   float scale, int segmented, int keep) {                         \
    forward<T>(q, k, v, beta, g, s0, segmented ? starts : nullptr, out, state, keep ? kept : nullptr, \
               Sizes{b, t, hk, h, dk, dv}, scale);                                                 \
  }
FOR_DTYPES(DELTA_FWD)

// Sums `vals` (one per lane row, RK each) and two warp-uniform scalars over the block's warps in
// warp order, through `red` ([warps][d_k + 2], one of two buffers alternating by step, so one
// barrier a step suffices), into `rows` [d_k] and `scalars` [2] of this block's partial.
DEV void block_reduce(float* red, const Sizes& s, const Place& p, const float (&vals)[RK], float x0, float x1,
                      float* rows, float* scalars) {
  const int width = s.dk + 2, warps = blockDim.x / WARP;
  float* mine = red + p.warp * width;
#pragma unroll
  for (int r = 0; r < RK; ++r)
    if (p.row(r) < s.dk) mine[p.row(r)] = vals[r];
  if (p.lane == 0) {
    mine[s.dk] = x0;
    mine[s.dk + 1] = x1;
  }
  BARRIER();
  for (int i = threadIdx.x; i < width; i += blockDim.x) {
    float sum = 0.f;
    for (int w = 0; w < warps; ++w) sum += red[w * width + i];
    if (i < s.dk) rows[i] = sum;
    else if (scalars) scalars[i - s.dk] = sum;
  }
}

// The backward over one (row, head, column tile), chunks last to first. Per chunk: recompute the
// per-token states from the checkpoint, keeping each token's incoming state P in `scratch` (this
// thread's elements only) and u, δ in shared memory, and emit the q gradient from each token's
// state (dq = scale·S·do); then walk the chunk backwards carrying dS:
//   dS += q̃·doᵀ;  dk = dS·δ;  dδ = dSᵀk;  dβ = ⟨dδ, v − u⟩;  dv = β·dδ;  du = −dv;
//   dS' = dS + k·duᵀ;  dk += α·P·du;  dg = α·⟨dS', P⟩;  dS = α·dS' (zero past a document start).
// Partials per tile: qk_part [B, T, H, tiles, 2, d_k] (dq then dk), sc_part [B, T, H, tiles, 2] (dβ, dg).
template <typename T>
DEV void backward(const T* q, const T* k, const T* v, const float* beta, const float* g, const float* kept,
                  const T* dout, const float* dstate, const unsigned* starts, float* scratch, float* qk_part,
                  float* sc_part, T* dv_out, float* ds0, Sizes s, float scale) {
  extern __shared__ float shared[];
  const Place p(s);
  const int warps = blockDim.x / WARP, cols = warps * CV, tiles = gridDim.y, tile = blockIdx.y;
  float* su = shared;                       // [CHUNK][cols]
  float* sd = su + CHUNK * cols;            // [CHUNK][cols]
  float* red = sd + CHUNK * cols;           // [2][warps][d_k + 2]
  const int red_size = warps * (s.dk + 2);
  const size_t head = (size_t)blockIdx.x * s.dk * s.dv;
  const int chunks = (s.t + CHUNK - 1) / CHUNK;
  const int slots = RK * CV;
  float* mine = scratch + ((size_t)blockIdx.x * tiles + tile) * CHUNK * slots * blockDim.x + threadIdx.x;
  const int wc = p.warp * CV;  // the warp's first column in the block's shared rows
  float dS[RK][CV];
  load_state(dstate + head, s, p, dS);
  int step = 0;
  for (int c = chunks - 1; c >= 0; --c) {
    const int t0 = c * CHUNK, t1 = min(t0 + CHUNK, s.t);
    float S[RK][CV];
    load_state(kept + ((size_t)blockIdx.x * chunks + c) * s.dk * s.dv, s, p, S);
    for (int t = t0; t < t1; ++t, ++step) {
      const int i = t - t0;
      const bool fresh = restarts(starts, s, p.b, t);
#pragma unroll
      for (int r = 0; r < RK; ++r)
#pragma unroll
        for (int cc = 0; cc < CV; ++cc) {
          if (fresh) S[r][cc] = 0.f;
          mine[((size_t)i * slots + r * CV + cc) * blockDim.x] = S[r][cc];
        }
      const size_t at = p.at(s, t);
      float kr[RK], vc[CV], doc[CV], u[CV], delta[CV], dq[RK];
      load_rows(k + p.qk(s, t), s, p, kr);
      load_cols(v + at * s.dv, s, p, vc);
      load_cols(dout + at * s.dv, s, p, doc);
      advance(S, kr, vc, expf(g[at]), beta[at], u, delta);
      if (p.lane == 0) {
#pragma unroll
        for (int cc = 0; cc < CV; ++cc) {
          su[i * cols + wc + cc] = u[cc];
          sd[i * cols + wc + cc] = delta[cc];
        }
      }
#pragma unroll
      for (int r = 0; r < RK; ++r) {
        float acc = 0.f;
#pragma unroll
        for (int cc = 0; cc < CV; ++cc) acc += S[r][cc] * doc[cc];
        dq[r] = scale * acc;
      }
      float* part = qk_part + (at * tiles + tile) * 2 * s.dk;
      block_reduce(red + (step & 1) * red_size, s, p, dq, 0.f, 0.f, part, nullptr);
    }
    for (int t = t1 - 1; t >= t0; --t, ++step) {
      const int i = t - t0;
      const size_t at = p.at(s, t);
      const float alpha = expf(g[at]), b = beta[at];
      const bool fresh = restarts(starts, s, p.b, t);
      float kr[RK], qr[RK], vc[CV], doc[CV], dk[RK], ddelta[CV], du[CV];
      load_rows(k + p.qk(s, t), s, p, kr);
      load_rows(q + p.qk(s, t), s, p, qr);
      load_cols(v + at * s.dv, s, p, vc);
      load_cols(dout + at * s.dv, s, p, doc);
#pragma unroll
      for (int r = 0; r < RK; ++r) {
        float acc = 0.f;
#pragma unroll
        for (int cc = 0; cc < CV; ++cc) {
          dS[r][cc] += scale * qr[r] * doc[cc];
          acc += dS[r][cc] * sd[i * cols + wc + cc];
        }
        dk[r] = acc;
      }
      float dbeta = 0.f;
#pragma unroll
      for (int cc = 0; cc < CV; ++cc) {
        float part = 0.f;
#pragma unroll
        for (int r = 0; r < RK; ++r) part += kr[r] * dS[r][cc];
        ddelta[cc] = warp_sum(part);
        dbeta += ddelta[cc] * (vc[cc] - su[i * cols + wc + cc]);
        du[cc] = b * ddelta[cc];
      }
      store_cols(dv_out + at * s.dv, s, p, du);
      float dg = 0.f;
#pragma unroll
      for (int r = 0; r < RK; ++r) {
        float acc = 0.f;
#pragma unroll
        for (int cc = 0; cc < CV; ++cc) {
          dS[r][cc] -= kr[r] * du[cc];
          const float prev = fresh ? 0.f : mine[((size_t)i * slots + r * CV + cc) * blockDim.x];
          acc += prev * du[cc];
          dg += dS[r][cc] * prev;
          dS[r][cc] *= fresh ? 0.f : alpha;
        }
        dk[r] -= alpha * acc;
      }
      dg = alpha * warp_sum(dg);
      float* part = qk_part + (at * tiles + tile) * 2 * s.dk + s.dk;
      block_reduce(red + (step & 1) * red_size, s, p, dk, dbeta, dg, part, sc_part + (at * tiles + tile) * 2);
    }
  }
  store_state(ds0 + head, s, p, dS);
}

#define DELTA_BWD(SUF, T)                                                                          \
  KERNEL void delta_rule_bwd_##SUF(const T* q, const T* k, const T* v, const float* beta, const float* g, \
                                   const float* kept, const T* dout, const float* dstate,          \
                                   const unsigned* starts, float* scratch, float* qk_part,         \
                                   float* sc_part, T* dv_out, float* ds0, int b, int t, int hk, int h, \
                                   int dk, int dv, float scale) {                                  \
    backward<T>(q, k, v, beta, g, kept, dout, dstate, starts, scratch, qk_part, sc_part, dv_out, ds0, \
                Sizes{b, t, hk, h, dk, dv}, scale);                                                \
  }
FOR_DTYPES(DELTA_BWD)

// dq and dk [B, T, H_k, d_k]: the partials of the value heads sharing each key head and of every
// column tile, summed in (head, tile) order. Grid-stride over B·T·H_k·d_k.
#define DELTA_QK(SUF, T)                                                                           \
  KERNEL void delta_qk_grads_##SUF(const float* qk_part, T* dq, T* dk, int bt, int hk, int h, int tiles, \
                                   int d) {                                                        \
    const int rep = h / hk;                                                                        \
    const size_t n = (size_t)bt * hk * d;                                                          \
    for (size_t idx = global_index(); idx < n; idx += global_stride()) {                           \
      const int i = idx % d;                                                                       \
      const size_t row = idx / d;                                                                  \
      const size_t tok = row / hk;                                                                 \
      const int kh = row % hk;                                                                     \
      float sq = 0.f, sk = 0.f;                                                                    \
      for (int j = 0; j < rep; ++j)                                                                \
        for (int tl = 0; tl < tiles; ++tl) {                                                       \
          const float* part = qk_part + ((tok * h + kh * rep + j) * tiles + tl) * 2 * d;           \
          sq += part[i];                                                                           \
          sk += part[d + i];                                                                       \
        }                                                                                          \
      dq[idx] = from_f<T>(sq);                                                                     \
      dk[idx] = from_f<T>(sk);                                                                     \
    }                                                                                              \
  }
FOR_DTYPES(DELTA_QK)

// dβ and dg [B, T, H] (f32): the column tiles' partials summed in tile order.
KERNEL void delta_scalar_grads(const float* sc_part, float* dbeta, float* dg, int n, int tiles) {
  for (size_t idx = global_index(); idx < (size_t)n; idx += global_stride()) {
    float sb = 0.f, sg = 0.f;
    for (int tl = 0; tl < tiles; ++tl) {
      sb += sc_part[(idx * tiles + tl) * 2];
      sg += sc_part[(idx * tiles + tl) * 2 + 1];
    }
    dbeta[idx] = sb;
    dg[idx] = sg;
  }
}
