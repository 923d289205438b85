// The two row passes of the lm_head cross-entropy over one vocabulary chunk of logits
// (kernels/src/lm_head_ce.rs): the chunk's row log-sum-exp, and the chunk's logit gradient
// `w·(softmax − onehot)` given the full row log-sum-exp. Statistics are f32.
#include "portable.h"

// One warp per row: each lane keeps an online (max, sum of exp) over its columns, then the
// lanes merge pairwise in a fixed butterfly order.
#define ROW_LSE(S, T)                                                                              \
  KERNEL void row_lse_##S(const T* logits, float* lse, int rows, int cols) {                      \
    const int row = blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP;                         \
    if (row >= rows) return;                                                                       \
    const T* x = logits + (size_t)row * cols;                                                      \
    float m = -INFINITY, s = 0.f;                                                                  \
    for (int j = threadIdx.x % WARP; j < cols; j += WARP) {                                        \
      const float v = to_f(x[j]);                                                                  \
      if (v > m) {                                                                                 \
        s = s * expf(m - v) + 1.f;                                                                 \
        m = v;                                                                                     \
      } else {                                                                                     \
        s += expf(v - m);                                                                          \
      }                                                                                            \
    }                                                                                              \
    for (int k = WARP / 2; k > 0; k >>= 1) {                                                       \
      const float mo = SHFL_XOR(m, k), so = SHFL_XOR(s, k);                                        \
      const float mn = fmaxf(m, mo);                                                               \
      s = (m == -INFINITY ? 0.f : s * expf(m - mn)) + (mo == -INFINITY ? 0.f : so * expf(mo - mn)); \
      m = mn;                                                                                      \
    }                                                                                              \
    if (threadIdx.x % WARP == 0) lse[row] = m + logf(s);                                           \
  }
FOR_DTYPES(ROW_LSE)

// out[r][j] = weight[r]·(exp(logits[r][j] − lse[r]) − [target[r] == v0 + j]).
#define CE_CHUNK_GRAD(S, T)                                                                        \
  KERNEL void ce_chunk_grad_##S(const T* logits, const float* lse, const float* weight,           \
                                const unsigned* target, int v0, int rows, int cols, T* out) {      \
    const size_t n = (size_t)rows * cols;                                                          \
    for (size_t i = global_index(); i < n; i += global_stride()) {                                 \
      const size_t r = i / cols;                                                                   \
      const int j = i % cols;                                                                      \
      const float w = weight[r];                                                                   \
      const float onehot = target[r] == (unsigned)(v0 + j) ? 1.f : 0.f;                            \
      out[i] = from_f<T>(w * (expf(to_f(logits[i]) - lse[r]) - onehot));                          \
    }                                                                                              \
  }
FOR_DTYPES(CE_CHUNK_GRAD)
