// The depthwise causal conv1d with SiLU (kernels/src/causal_conv1d.rs states it): x [B, T, C],
// w [C, W], bias [C], the state [B, C, W−1] (the positions before the row, oldest first), the
// per-token document starts [B·T] or null (decoding: rows of one document each).
//
// Elementwise kernels, one thread per output element, channels fastest so a warp reads 32
// consecutive channels of a token (coalesced). Memory-bound: the forward reads x W times from
// cache and writes y once (~2·B·T·C elements: 0.17 GB in bf16 at the 27B layer's ~10k channels,
// B = 2, T = 4096, ~50 µs); the backward writes du in f32 once and reads it for dx and for the
// weight's gradient. The weight and bias gradients are summed over fixed blocks of CONV_ROWS
// tokens, then over the blocks in order: no atomics, the same bits every run.
#include "portable.h"

#define CONV_ROWS 256

struct Conv {
  int b, t, c, w;
  const unsigned* starts;
  DEV_MEMBER int k() const { return w - 1; }
  // Whether token t of row b may read position p (a state column when negative): a token of a
  // document that starts later in the row reads nothing before that start.
  DEV_MEMBER bool visible(int row, int tok, int p) const {
    if (!starts) return true;
    const int start = (int)starts[(size_t)row * t + tok];
    return start <= 0 || p >= start;
  }
};

// Row b's input at position p of channel ch: x, or the state before the row.
template <typename T> DEV float input(const T* x, const T* s0, const Conv& d, int b, int p, int ch) {
  return p >= 0 ? to_f(x[((size_t)b * d.t + p) * d.c + ch]) : to_f(s0[((size_t)b * d.c + ch) * d.k() + p + d.k()]);
}

// u = bias + Σ_j w_j·x_{t+j−(W−1)} over the taps token t may read.
template <typename T>
DEV float pre_activation(const T* x, const T* w, const T* bias, const T* s0, const Conv& d, int b, int t, int ch) {
  float u = to_f(bias[ch]);
  for (int j = 0; j < d.w; ++j) {
    const int p = t + j - d.k();
    if (d.visible(b, t, p)) u += to_f(w[(size_t)ch * d.w + j]) * input(x, s0, d, b, p, ch);
  }
  return u;
}

DEV float sigmoid(float u) { return 1.f / (1.f + expf(-u)); }

// y = silu(u), and the final state: column m is position T + m − (W−1) as the last token sees it
// (zero before its document's start).
#define CONV_FWD(S, T)                                                                             \
  KERNEL void conv1d_fwd_##S(const T* x, const T* w, const T* bias, const T* s0, const unsigned* starts, \
                             T* y, T* last, int b, int t, int c, int width, int segmented) {       \
    const Conv d{b, t, c, width, segmented ? starts : nullptr};                                    \
    const size_t n = (size_t)b * t * c;                                                            \
    for (size_t i = global_index(); i < n; i += global_stride()) {                                 \
      const int ch = i % c;                                                                        \
      const size_t row = i / c;                                                                    \
      const float u = pre_activation(x, w, bias, s0, d, row / t, row % t, ch);                     \
      y[i] = from_f<T>(u * sigmoid(u));                                                            \
    }                                                                                              \
    const size_t ns = (size_t)b * c * d.k();                                                       \
    for (size_t i = global_index(); i < ns; i += global_stride()) {                                \
      const int m = i % d.k(), ch = (i / d.k()) % c, row = i / ((size_t)d.k() * c);               \
      const int p = t + m - d.k();                                                                 \
      last[i] = from_f<T>(d.visible(row, t - 1, p) ? input(x, s0, d, row, p, ch) : 0.f);           \
    }                                                                                              \
  }
FOR_DTYPES(CONV_FWD)

// du = dy·silu'(u) in f32, u recomputed; silu' = σ + silu·(1 − σ).
#define CONV_DU(S, T)                                                                              \
  KERNEL void conv1d_du_##S(const T* dy, const T* x, const T* w, const T* bias, const T* s0,       \
                            const unsigned* starts, float* du, int b, int t, int c, int width) {   \
    const Conv d{b, t, c, width, starts};                                                          \
    const size_t n = (size_t)b * t * c;                                                            \
    for (size_t i = global_index(); i < n; i += global_stride()) {                                 \
      const int ch = i % c;                                                                        \
      const size_t row = i / c;                                                                    \
      const float u = pre_activation(x, w, bias, s0, d, row / t, row % t, ch);                     \
      const float s = sigmoid(u);                                                                  \
      du[i] = to_f(dy[i]) * (s + u * s * (1.f - s));                                               \
    }                                                                                              \
  }
FOR_DTYPES(CONV_DU)

// The gradient reaching position p of channel ch (p < 0: the initial state's column p + W − 1):
// tap j of token p + (W−1) − j where that token may read p, and the final state's copy of p.
template <typename T>
DEV float position_grad(const float* du, const T* w, const T* dlast, const Conv& d, int b, int p, int ch) {
  float g = 0.f;
  for (int j = 0; j < d.w; ++j) {
    const int tok = p + d.k() - j;
    if (tok >= 0 && tok < d.t && d.visible(b, tok, p))
      g += to_f(w[(size_t)ch * d.w + j]) * du[((size_t)b * d.t + tok) * d.c + ch];
  }
  if (p + d.k() >= d.t && d.visible(b, d.t - 1, p)) g += to_f(dlast[((size_t)b * d.c + ch) * d.k() + p + d.k() - d.t]);
  return g;
}

// dx [B, T, C] and the initial state's gradient [B, C, W−1].
#define CONV_DX(S, T)                                                                              \
  KERNEL void conv1d_dx_##S(const float* du, const T* w, const T* dlast, const unsigned* starts, T* dx, \
                            T* ds0, int b, int t, int c, int width) {                              \
    const Conv d{b, t, c, width, starts};                                                          \
    const size_t n = (size_t)b * t * c;                                                            \
    for (size_t i = global_index(); i < n; i += global_stride()) {                                 \
      const size_t row = i / c;                                                                    \
      dx[i] = from_f<T>(position_grad(du, w, dlast, d, row / t, row % t, i % c));                  \
    }                                                                                              \
    const size_t ns = (size_t)b * c * d.k();                                                       \
    for (size_t i = global_index(); i < ns; i += global_stride()) {                                \
      const int m = i % d.k(), ch = (i / d.k()) % c, row = i / ((size_t)d.k() * c);               \
      ds0[i] = from_f<T>(position_grad(du, w, dlast, d, row, m - d.k(), ch));                      \
    }                                                                                              \
  }
FOR_DTYPES(CONV_DX)

// Partial sums over CONV_ROWS tokens (grid.y) of channel blockIdx.x·blockDim + threadIdx:
// partial[blk][j][ch] = Σ du·x_{t+j−(W−1)} for the W taps, then Σ du (the bias) at j = W.
#define CONV_DW(S, T)                                                                              \
  KERNEL void conv1d_dw_partial_##S(const float* du, const T* x, const T* s0, const unsigned* starts, \
                                    float* partial, int b, int t, int c, int width) {              \
    const Conv d{b, t, c, width, starts};                                                          \
    const int ch = blockIdx.x * blockDim.x + threadIdx.x;                                          \
    if (ch >= c) return;                                                                           \
    const int r0 = blockIdx.y * CONV_ROWS, r1 = min(r0 + CONV_ROWS, b * t);                        \
    for (int j = 0; j <= width; ++j) {                                                             \
      float acc = 0.f;                                                                             \
      for (int r = r0; r < r1; ++r) {                                                              \
        const int row = r / t, tok = r % t, p = tok + j - d.k();                                   \
        const float g = du[(size_t)r * c + ch];                                                    \
        if (j == width) acc += g;                                                                  \
        else if (d.visible(row, tok, p)) acc += g * input(x, s0, d, row, p, ch);                   \
      }                                                                                            \
      partial[((size_t)blockIdx.y * (width + 1) + j) * c + ch] = acc;                              \
    }                                                                                              \
  }
FOR_DTYPES(CONV_DW)

// dw [C, W] and dbias [C]: the blocks' partials summed in block order.
#define CONV_DW_SUM(S, T)                                                                          \
  KERNEL void conv1d_dw_sum_##S(const float* partial, T* dw, T* dbias, int blocks, int c, int width) { \
    const size_t n = (size_t)c * (width + 1);                                                      \
    for (size_t i = global_index(); i < n; i += global_stride()) {                                 \
      const int ch = i % c, j = i / c;                                                             \
      float acc = 0.f;                                                                             \
      for (int blk = 0; blk < blocks; ++blk) acc += partial[((size_t)blk * (width + 1) + j) * c + ch]; \
      if (j == width) dbias[ch] = from_f<T>(acc);                                                  \
      else dw[(size_t)ch * width + j] = from_f<T>(acc);                                            \
    }                                                                                              \
  }
FOR_DTYPES(CONV_DW_SUM)
