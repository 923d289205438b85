// Several LoRA adapters in one batch (CPU reference: kernels/src/multi_lora.rs, a loop over
// adapters): after the shared base GEMM y = x·Wᵀ, each row adds its own adapter's branch
// s·(x·Aᵀ)·Bᵀ, with A [slots, r, in], B [slots, out, r] and ids[row] its slot (−1: none).
// Shrink, then expand into y: two passes whose cost does not grow with the number of adapters.
#include "portable.h"

// xa[n, j] = scale[slot] · Σ_e x[n, e]·A[slot, j, e]: one warp per (row, j); grid-stride.
#define LORA_SHRINK(S, T)                                                                           \
  KERNEL void lora_shrink_##S(const T* x, const T* a, const float* scales, const int* ids,         \
                              float* xa, int n, int r, int d_in) {                                  \
    const int lane = threadIdx.x % WARP;                                                            \
    const size_t warps = global_stride() / WARP;                                                    \
    for (size_t w = global_index() / WARP; w < (size_t)n * r; w += warps) {                        \
      const int row = w / r, j = w % r;                                                             \
      const int slot = ids[row];                                                                    \
      if (slot < 0) {                                                                               \
        if (lane == 0) xa[w] = 0.f;                                                                 \
        continue;                                                                                   \
      }                                                                                             \
      const T* xr = x + (size_t)row * d_in;                                                         \
      const T* ar = a + ((size_t)slot * r + j) * d_in;                                              \
      float acc = 0.f;                                                                              \
      for (int e = lane; e < d_in; e += WARP) acc += to_f(xr[e]) * to_f(ar[e]);                     \
      acc = warp_sum(acc);                                                                          \
      if (lane == 0) xa[w] = acc * scales[slot];                                                    \
    }                                                                                               \
  }
FOR_DTYPES(LORA_SHRINK)

// y[n, o] += Σ_j xa[n, c + j]·B[slot, o, j] for rows with an adapter; grid-stride over n·out.
// xa has xa_cols = m·r columns for a packed group of m members (q/k/v, gate/up); output row o
// belongs to member (o ≥ b1) + (o ≥ b2) and reads that member's r columns, c = member·r (a
// block-diagonal B would multiply the other members' columns by zeros: m times the work).
#define LORA_EXPAND(S, T)                                                                           \
  KERNEL void lora_expand_##S(T* y, const float* xa, const T* b, const int* ids, int n, int r,     \
                              int d_out, int xa_cols, int b1, int b2) {                             \
    for (size_t i = global_index(); i < (size_t)n * d_out; i += global_stride()) {                 \
      const int row = i / d_out, o = i % d_out;                                                     \
      const int slot = ids[row];                                                                    \
      if (slot < 0) continue;                                                                       \
      const T* br = b + ((size_t)slot * d_out + o) * r;                                             \
      const float* xr = xa + (size_t)row * xa_cols + ((o >= b1) + (o >= b2)) * r;                   \
      float acc = 0.f;                                                                              \
      for (int j = 0; j < r; ++j) acc += xr[j] * to_f(br[j]);                                       \
      y[i] = from_f<T>(to_f(y[i]) + acc);                                                           \
    }                                                                                               \
  }
FOR_DTYPES(LORA_EXPAND)
