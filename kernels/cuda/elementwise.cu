// Elementwise ops: SwiGLU and RoPE. Memory-bound: one read of each input, one write of each
// output, grid-stride loops so any size fits one launch.
#include "portable.h"

DEV float sigmoid(float g) { return 1.f / (1.f + expf(-g)); }

#define SWIGLU_FWD(S, T)                                                                           \
  KERNEL void swiglu_fwd_##S(const T* gate, const T* up, T* h, size_t n) {                        \
    for (size_t i = global_index(); i < n; i += global_stride()) {                                 \
      const float g = to_f(gate[i]);                                                               \
      h[i] = from_f<T>(g * sigmoid(g) * to_f(up[i]));                                              \
    }                                                                                              \
  }
FOR_DTYPES(SWIGLU_FWD)

// silu(gate)·up for one 16-byte chunk of each, element by element as the element kernels.
template <typename T> DEV uint4 swiglu_chunk(const uint4& gv, const uint4& uv) {
  constexpr int V = 16 / sizeof(T);
  const T* ge = reinterpret_cast<const T*>(&gv);
  const T* ue = reinterpret_cast<const T*>(&uv);
  uint4 out;
  T* oe = reinterpret_cast<T*>(&out);
#pragma unroll
  for (int e = 0; e < V; ++e) {
    const float g = to_f(ge[e]);
    oe[e] = from_f<T>(g * sigmoid(g) * to_f(ue[e]));
  }
  return out;
}

// The same in 16-byte chunks when the element count is a multiple of a chunk and the buffers are
// 16-byte aligned: the element form's 2-byte loads ran at 3.3× the bandwidth floor on a training
// step's [4096, 12288] (0.25 ms a layer at 8B). The same arithmetic per element.
#define SWIGLU_FWD_VEC(S, T)                                                                       \
  KERNEL void swiglu_fwd_vec_##S(const T* gate, const T* up, T* h, size_t chunks) {               \
    for (size_t c = global_index(); c < chunks; c += global_stride()) {                            \
      const uint4 gv = reinterpret_cast<const uint4*>(gate)[c], uv = reinterpret_cast<const uint4*>(up)[c]; \
      reinterpret_cast<uint4*>(h)[c] = swiglu_chunk<T>(gv, uv);                                    \
    }                                                                                              \
  }
FOR_DTYPES(SWIGLU_FWD_VEC)

// The same over a packed gate/up projection: row r of gu is [gate (f) | up (f)].
#define SWIGLU_PACKED_FWD(S, T)                                                                    \
  KERNEL void swiglu_packed_fwd_##S(const T* gu, T* h, size_t n, size_t f) {                      \
    for (size_t i = global_index(); i < n; i += global_stride()) {                                 \
      const size_t r = i / f, j = i % f;                                                           \
      const float g = to_f(gu[r * 2 * f + j]);                                                     \
      h[i] = from_f<T>(g * sigmoid(g) * to_f(gu[r * 2 * f + f + j]));                              \
    }                                                                                              \
  }
FOR_DTYPES(SWIGLU_PACKED_FWD)

// The same in 16-byte chunks (`per_row` chunks of gate, then of up, per row), for f a multiple
// of a chunk and 16-byte aligned rows: the element form's 64-bit division and 2-byte loads ran
// at ~0.9 TB/s on an 8B prefill step (0.7 ms a layer). The same arithmetic per element.
#define SWIGLU_PACKED_FWD_VEC(S, T)                                                                \
  KERNEL void swiglu_packed_fwd_vec_##S(const T* gu, T* h, unsigned chunks, unsigned per_row) {    \
    const uint4* in = reinterpret_cast<const uint4*>(gu);                                          \
    for (unsigned c = blockIdx.x * blockDim.x + threadIdx.x; c < chunks; c += gridDim.x * blockDim.x) { \
      const unsigned r = c / per_row, j = c % per_row;                                             \
      const uint4 gv = in[(size_t)r * 2 * per_row + j], uv = in[(size_t)r * 2 * per_row + per_row + j]; \
      reinterpret_cast<uint4*>(h)[c] = swiglu_chunk<T>(gv, uv);                                    \
    }                                                                                              \
  }
FOR_DTYPES(SWIGLU_PACKED_FWD_VEC)

// d_gate = dh·up·(σ + silu·(1 − σ)), d_up = dh·silu.
#define SWIGLU_BWD(S, T)                                                                           \
  KERNEL void swiglu_bwd_##S(const T* dh, const T* gate, const T* up, T* dgate, T* dup,          \
                             size_t n) {                                                           \
    for (size_t i = global_index(); i < n; i += global_stride()) {                                 \
      const float g = to_f(gate[i]), d = to_f(dh[i]), sg = sigmoid(g), silu = g * sg;              \
      dgate[i] = from_f<T>(d * to_f(up[i]) * (sg + silu * (1.f - sg)));                           \
      dup[i] = from_f<T>(d * silu);                                                                \
    }                                                                                              \
  }
FOR_DTYPES(SWIGLU_BWD)

// The same in 16-byte chunks (as swiglu_fwd_vec).
#define SWIGLU_BWD_VEC(S, T)                                                                       \
  KERNEL void swiglu_bwd_vec_##S(const T* dh, const T* gate, const T* up, T* dgate, T* dup,      \
                                 size_t chunks) {                                                  \
    constexpr int V = 16 / sizeof(T);                                                              \
    for (size_t c = global_index(); c < chunks; c += global_stride()) {                            \
      const uint4 dv = reinterpret_cast<const uint4*>(dh)[c];                                      \
      const uint4 gv = reinterpret_cast<const uint4*>(gate)[c], uv = reinterpret_cast<const uint4*>(up)[c]; \
      const T *de = reinterpret_cast<const T*>(&dv), *ge = reinterpret_cast<const T*>(&gv);        \
      const T* ue = reinterpret_cast<const T*>(&uv);                                               \
      uint4 dgo, duo;                                                                              \
      T *dge = reinterpret_cast<T*>(&dgo), *due = reinterpret_cast<T*>(&duo);                      \
      _Pragma("unroll") for (int e = 0; e < V; ++e) {                                              \
        const float g = to_f(ge[e]), d = to_f(de[e]), sg = sigmoid(g), silu = g * sg;              \
        dge[e] = from_f<T>(d * to_f(ue[e]) * (sg + silu * (1.f - sg)));                            \
        due[e] = from_f<T>(d * silu);                                                              \
      }                                                                                            \
      reinterpret_cast<uint4*>(dgate)[c] = dgo;                                                    \
      reinterpret_cast<uint4*>(dup)[c] = duo;                                                      \
    }                                                                                              \
  }
FOR_DTYPES(SWIGLU_BWD_VEC)

// The same over a packed gate/up projection (row r of gu is [gate (f) | up (f)]), its gradient
// written in that layout (row r of dgu is [d_gate | d_up]): what the MoE experts' fused
// gate_up_proj reads back, with no split of gu or concatenation of the two halves.
#define SWIGLU_PACKED_BWD(S, T)                                                                    \
  KERNEL void swiglu_packed_bwd_##S(const T* dh, const T* gu, T* dgu, size_t n, size_t f) {       \
    for (size_t i = global_index(); i < n; i += global_stride()) {                                 \
      const size_t r = i / f, j = i % f, at = r * 2 * f + j;                                       \
      const float g = to_f(gu[at]), d = to_f(dh[i]), sg = sigmoid(g), silu = g * sg;              \
      dgu[at] = from_f<T>(d * to_f(gu[at + f]) * (sg + silu * (1.f - sg)));                        \
      dgu[at + f] = from_f<T>(d * silu);                                                           \
    }                                                                                              \
  }
FOR_DTYPES(SWIGLU_PACKED_BWD)

// RoPE, HF rotate_half convention, on x [tokens, heads, hd] with tables [tokens, hd] shared by a
// token's heads. One thread per rotated pair (i, i + hd/2). `transposed` applies the map's
// transpose, which is the backward.
#define ROPE(S, T)                                                                                 \
  KERNEL void rope_##S(const T* x, const T* cos, const T* sin, T* y, size_t pairs, int heads,     \
                       int hd, int transposed) {                                                   \
    const int half = hd / 2;                                                                       \
    for (size_t p = global_index(); p < pairs; p += global_stride()) {                             \
      const size_t vec = p / half, tok = vec / heads;                                              \
      const int i = p % half;                                                                      \
      const size_t xo = vec * hd, to = tok * hd;                                                   \
      const float a = to_f(x[xo + i]), b = to_f(x[xo + i + half]);                                 \
      const float c1 = to_f(cos[to + i]), c2 = to_f(cos[to + i + half]);                           \
      const float s1 = to_f(sin[to + i]), s2 = to_f(sin[to + i + half]);                           \
      if (transposed) {                                                                            \
        y[xo + i] = from_f<T>(a * c1 + b * s2);                                                    \
        y[xo + i + half] = from_f<T>(b * c2 - a * s1);                                             \
      } else {                                                                                     \
        y[xo + i] = from_f<T>(a * c1 - b * s1);                                                    \
        y[xo + i + half] = from_f<T>(b * c2 + a * s2);                                             \
      }                                                                                            \
    }                                                                                              \
  }
FOR_DTYPES(ROPE)

// AdamW, torch's single-tensor arithmetic (see kernels/src/adamw.rs) in one pass: reads p, g,
// m, v once and writes the new p, m, v. Moments are f32 whatever the parameter's dtype.
#define ADAMW(S, T)                                                                                \
  KERNEL void adamw_##S(const T* p, const T* g, const float* m, const float* v, T* p_out,         \
                        float* m_out, float* v_out, size_t n, int decay, float decay_factor,      \
                        float lerp_weight, float beta2, float one_minus_beta2, float bc2_sqrt,    \
                        float eps, float neg_step_size) {                                          \
    for (size_t i = global_index(); i < n; i += global_stride()) {                                 \
      float pi = to_f(p[i]);                                                                       \
      const float gi = to_f(g[i]);                                                                 \
      if (decay) pi *= decay_factor;                                                               \
      const float mi = fabsf(lerp_weight) < 0.5f ? m[i] + lerp_weight * (gi - m[i])               \
                                                 : gi - (gi - m[i]) * (1.f - lerp_weight);         \
      const float vi = v[i] * beta2 + one_minus_beta2 * gi * gi;                                   \
      const float denom = sqrtf(vi) / bc2_sqrt + eps;                                              \
      p_out[i] = from_f<T>(pi + neg_step_size * mi / denom);                                       \
      m_out[i] = mi;                                                                               \
      v_out[i] = vi;                                                                               \
    }                                                                                              \
  }
FOR_DTYPES(ADAMW)
