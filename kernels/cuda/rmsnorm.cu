// RMSNorm over rows of d: one warp per row (d = 128 for the per-head q/k norms, up to 4096 for the
// residual stream; a warp keeps every row's reduction in registers and shuffles).
// The gain's gradient is summed deterministically: partial sums over fixed blocks of
// DW_ROWS rows, then over the blocks in order (no atomics).
#include "portable.h"

#define DW_ROWS 256

template <typename T>
DEV void norm_row(const T* x, const T* w, T* y, float* rstd, int row, int d, float eps) {
  const int lane = threadIdx.x % WARP;
  const T* xr = x + (size_t)row * d;
  float ss = 0.f;
  for (int i = lane; i < d; i += WARP) {
    float v = to_f(xr[i]);
    ss += v * v;
  }
  const float r = rsqrtf(warp_sum(ss) / d + eps);
  if (lane == 0) rstd[row] = r;
  T* yr = y + (size_t)row * d;
  for (int i = lane; i < d; i += WARP) yr[i] = from_f<T>(to_f(xr[i]) * r * to_f(w[i]));
}

DEV int warp_row() { return blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP; }

#define RMSNORM_FWD(S, T)                                                                          \
  KERNEL void rmsnorm_fwd_##S(const T* x, const T* w, T* y, float* rstd, int rows, int d,         \
                              float eps) {                                                         \
    const int row = warp_row();                                                                    \
    if (row < rows) norm_row<T>(x, w, y, rstd, row, d, eps);                                       \
  }
FOR_DTYPES(RMSNORM_FWD)

// Few rows (a decode step's batch): one block of 256 threads per row. One warp per row would
// launch rows / 8 blocks, leaving most multiprocessors idle, and each lane would walk a 4096-wide
// row in 128 dependent loads; here 8 warps share the row and the reduction goes through shared
// memory in a fixed order (deterministic, as the warp version).
DEV float block_sum(float v, float* part) {
  const int lane = threadIdx.x % WARP, w = threadIdx.x / WARP, nw = blockDim.x / WARP;
  v = warp_sum(v);
  if (lane == 0) part[w] = v;
  BARRIER();
  float t = 0.f;
  for (int i = 0; i < nw; ++i) t += part[i];
  return t;
}

// A row of a decode step is latency-bound, not bandwidth-bound (8 KiB at d = 4096): what costs is
// the number of dependent trips to memory. So each thread loads all of its share of the row (and
// of a and b, for the fused add) and of the gains in 16-byte chunks before it uses any, one trip
// instead of the 16 + 16 of an element-at-a-time loop (profiled on the H200: ~15 µs a row, 1.1 ms
// of an 8B decode step). Rows whose width is no multiple of a chunk, wider than VEC_MAX chunks a
// thread, or not 16-byte aligned take the element loop below.
#define VEC_MAX 4

template <typename T> DEV bool vec_fits(int d, const void* const* ptrs, int count) {
  constexpr int V = 16 / sizeof(T);
  if (d % V != 0 || d / V > (int)blockDim.x * VEC_MAX) return false;
  for (int i = 0; i < count; ++i)
    if ((reinterpret_cast<size_t>(ptrs[i]) & 15) != 0) return false;
  return true;
}

// s = a + b rounded to T (when b is given; else s = a, not stored), then y = rmsnorm(s)·w, each
// thread on chunks threadIdx.x + c·blockDim.x. The same arithmetic per element as the element
// loop, so only the sum of squares' order differs between the two forms.
template <typename T>
DEV void norm_row_block_vec(const T* a, const T* b, const T* w, T* s, T* y, float* rstd, int row, int d,
                            float eps, float* part) {
  constexpr int V = 16 / sizeof(T);
  const int chunks = d / V;
  const size_t off = (size_t)row * d;
  uint4 xv[VEC_MAX], bv[VEC_MAX], wv[VEC_MAX];
#pragma unroll
  for (int c = 0; c < VEC_MAX; ++c) {
    const int i = threadIdx.x + c * blockDim.x;
    if (i < chunks) {
      xv[c] = reinterpret_cast<const uint4*>(a + off)[i];
      if (b) bv[c] = reinterpret_cast<const uint4*>(b + off)[i];
      wv[c] = reinterpret_cast<const uint4*>(w)[i];
    }
  }
  float ss = 0.f;
#pragma unroll
  for (int c = 0; c < VEC_MAX; ++c) {
    const int i = threadIdx.x + c * blockDim.x;
    if (i >= chunks) continue;
    T* xe = reinterpret_cast<T*>(&xv[c]);
    if (b) {
      const T* be = reinterpret_cast<const T*>(&bv[c]);
#pragma unroll
      for (int j = 0; j < V; ++j) xe[j] = from_f<T>(to_f(xe[j]) + to_f(be[j]));
      reinterpret_cast<uint4*>(s + off)[i] = xv[c];
    }
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const float v = to_f(xe[j]);
      ss += v * v;
    }
  }
  const float r = rsqrtf(block_sum(ss, part) / d + eps);
  if (threadIdx.x == 0) rstd[row] = r;
#pragma unroll
  for (int c = 0; c < VEC_MAX; ++c) {
    const int i = threadIdx.x + c * blockDim.x;
    if (i >= chunks) continue;
    const T* xe = reinterpret_cast<const T*>(&xv[c]);
    const T* we = reinterpret_cast<const T*>(&wv[c]);
    uint4 out;
    T* oe = reinterpret_cast<T*>(&out);
#pragma unroll
    for (int j = 0; j < V; ++j) oe[j] = from_f<T>(to_f(xe[j]) * r * to_f(we[j]));
    reinterpret_cast<uint4*>(y + off)[i] = out;
  }
}

template <typename T>
DEV void norm_row_block(const T* x, const T* w, T* y, float* rstd, int row, int d, float eps) {
  __shared__ float part[32];
  const void* ptrs[3] = {x, w, y};
  if (vec_fits<T>(d, ptrs, 3)) {
    norm_row_block_vec<T>(x, nullptr, w, nullptr, y, rstd, row, d, eps, part);
    return;
  }
  const T* xr = x + (size_t)row * d;
  float ss = 0.f;
  for (int i = threadIdx.x; i < d; i += blockDim.x) {
    float v = to_f(xr[i]);
    ss += v * v;
  }
  const float r = rsqrtf(block_sum(ss, part) / d + eps);
  if (threadIdx.x == 0) rstd[row] = r;
  T* yr = y + (size_t)row * d;
  for (int i = threadIdx.x; i < d; i += blockDim.x) yr[i] = from_f<T>(to_f(xr[i]) * r * to_f(w[i]));
}

#define RMSNORM_FWD_ROWS(S, T)                                                                     \
  KERNEL void rmsnorm_fwd_rows_##S(const T* x, const T* w, T* y, float* rstd, int rows, int d,    \
                                   float eps) {                                                    \
    if ((int)blockIdx.x < rows) norm_row_block<T>(x, w, y, rstd, blockIdx.x, d, eps);              \
  }
FOR_DTYPES(RMSNORM_FWD_ROWS)

template <typename T>
DEV void add_norm_row_block(const T* a, const T* b, const T* w, T* s, T* y, float* rstd, int row, int d,
                            float eps) {
  __shared__ float part[32];
  const void* ptrs[5] = {a, b, w, s, y};
  if (vec_fits<T>(d, ptrs, 5)) {
    norm_row_block_vec<T>(a, b, w, s, y, rstd, row, d, eps, part);
    return;
  }
  const size_t off = (size_t)row * d;
  for (int i = threadIdx.x; i < d; i += blockDim.x) s[off + i] = from_f<T>(to_f(a[off + i]) + to_f(b[off + i]));
  // s may be aligned where a or b was not: then norm_row_block reads it in chunks other threads
  // wrote.
  BARRIER();
  norm_row_block<T>(s, w, y, rstd, row, d, eps);
}

#define ADD_RMSNORM_FWD_ROWS(S, T)                                                                 \
  KERNEL void add_rmsnorm_fwd_rows_##S(const T* a, const T* b, const T* w, T* s, T* y,            \
                                       float* rstd, int rows, int d, float eps) {                  \
    if ((int)blockIdx.x < rows) add_norm_row_block<T>(a, b, w, s, y, rstd, blockIdx.x, d, eps);    \
  }
FOR_DTYPES(ADD_RMSNORM_FWD_ROWS)

// The residual add fused in front of the norm: `s = a + b` (rounded to T, as a separate add
// would store it), then `y = rmsnorm(s)`. One read of a and b instead of three passes.
#define ADD_RMSNORM_FWD(S, T)                                                                      \
  KERNEL void add_rmsnorm_fwd_##S(const T* a, const T* b, const T* w, T* s, T* y, float* rstd,    \
                                  int rows, int d, float eps) {                                    \
    const int row = warp_row();                                                                    \
    if (row >= rows) return;                                                                       \
    const size_t off = (size_t)row * d;                                                            \
    for (int i = threadIdx.x % WARP; i < d; i += WARP)                                             \
      s[off + i] = from_f<T>(to_f(a[off + i]) + to_f(b[off + i]));                                 \
    /* norm_row reads element i from the lane that wrote it: no barrier needed. */                 \
    norm_row<T>(s, w, y, rstd, row, d, eps);                                                       \
  }
FOR_DTYPES(ADD_RMSNORM_FWD)

// dx = rstd·(g − x̂·mean(g·x̂)), g = dy·w, x̂ = x·rstd.
#define RMSNORM_BWD(S, T)                                                                          \
  KERNEL void rmsnorm_bwd_##S(const T* dy, const T* x, const T* w, const float* rstd, T* dx,      \
                              int rows, int d) {                                                   \
    const int row = warp_row();                                                                    \
    if (row >= rows) return;                                                                       \
    const int lane = threadIdx.x % WARP;                                                           \
    const size_t off = (size_t)row * d;                                                            \
    const float r = rstd[row];                                                                     \
    float gx = 0.f;                                                                                \
    for (int i = lane; i < d; i += WARP) gx += to_f(dy[off + i]) * to_f(w[i]) * to_f(x[off + i]);  \
    const float proj = warp_sum(gx) * r * r / d;                                                   \
    for (int i = lane; i < d; i += WARP) {                                                         \
      const float g = to_f(dy[off + i]) * to_f(w[i]);                                              \
      dx[off + i] = from_f<T>(r * (g - to_f(x[off + i]) * proj));                                  \
    }                                                                                              \
  }
FOR_DTYPES(RMSNORM_BWD)

// The same in 16-byte chunks, for d a multiple of a chunk and 16-byte aligned rows: the element
// loop's dependent 2-byte loads ran at 5× the bandwidth floor on a training step's
// [4096, 4096] (0.13 ms). A lane sums its chunks, so the row's sum is added in another order
// than the element loop's (a different rounding; still the same bits run to run).
#define RMSNORM_BWD_VEC(S, T)                                                                      \
  KERNEL void rmsnorm_bwd_vec_##S(const T* dy, const T* x, const T* w, const float* rstd, T* dx,  \
                                  int rows, int d) {                                               \
    constexpr int V = 16 / sizeof(T);                                                              \
    const int row = warp_row();                                                                    \
    if (row >= rows) return;                                                                       \
    const int lane = threadIdx.x % WARP, chunks = d / V;                                           \
    const uint4* dyr = reinterpret_cast<const uint4*>(dy + (size_t)row * d);                       \
    const uint4* xr = reinterpret_cast<const uint4*>(x + (size_t)row * d);                         \
    const uint4* wr = reinterpret_cast<const uint4*>(w);                                           \
    const float r = rstd[row];                                                                     \
    float gx = 0.f;                                                                                \
    for (int c = lane; c < chunks; c += WARP) {                                                    \
      const uint4 a = dyr[c], b = xr[c], ww = wr[c];                                               \
      const T *ae = reinterpret_cast<const T*>(&a), *be = reinterpret_cast<const T*>(&b);          \
      const T* we = reinterpret_cast<const T*>(&ww);                                               \
      _Pragma("unroll") for (int e = 0; e < V; ++e) gx += to_f(ae[e]) * to_f(we[e]) * to_f(be[e]); \
    }                                                                                              \
    const float proj = warp_sum(gx) * r * r / d;                                                   \
    uint4* out = reinterpret_cast<uint4*>(dx + (size_t)row * d);                                   \
    for (int c = lane; c < chunks; c += WARP) {                                                    \
      const uint4 a = dyr[c], b = xr[c], ww = wr[c];                                               \
      const T *ae = reinterpret_cast<const T*>(&a), *be = reinterpret_cast<const T*>(&b);          \
      const T* we = reinterpret_cast<const T*>(&ww);                                               \
      uint4 o;                                                                                     \
      T* oe = reinterpret_cast<T*>(&o);                                                            \
      _Pragma("unroll") for (int e = 0; e < V; ++e) {                                              \
        const float g = to_f(ae[e]) * to_f(we[e]);                                                 \
        oe[e] = from_f<T>(r * (g - to_f(be[e]) * proj));                                           \
      }                                                                                            \
      out[c] = o;                                                                                  \
    }                                                                                              \
  }
FOR_DTYPES(RMSNORM_BWD_VEC)

// partial[blk][j] = Σ over the DW_ROWS rows of block blk of dy·x·rstd; grid (column tiles, blocks).
#define RMSNORM_DW_PARTIAL(S, T)                                                                   \
  KERNEL void rmsnorm_dw_partial_##S(const T* dy, const T* x, const float* rstd, float* partial,  \
                                     int rows, int d) {                                            \
    const int j = blockIdx.x * blockDim.x + threadIdx.x;                                           \
    if (j >= d) return;                                                                            \
    const int r0 = blockIdx.y * DW_ROWS, r1 = min(rows, r0 + DW_ROWS);                             \
    float acc = 0.f;                                                                               \
    for (int r = r0; r < r1; ++r) {                                                                \
      const size_t o = (size_t)r * d + j;                                                          \
      acc += to_f(dy[o]) * to_f(x[o]) * rstd[r];                                                   \
    }                                                                                              \
    partial[(size_t)blockIdx.y * d + j] = acc;                                                     \
  }
FOR_DTYPES(RMSNORM_DW_PARTIAL)

// dw[j] = Σ_blk partial[blk][j], blocks in order.
#define SUM_BLOCKS(S, T)                                                                           \
  KERNEL void sum_blocks_##S(const float* partial, T* out, int blocks, int d) {                    \
    const int j = blockIdx.x * blockDim.x + threadIdx.x;                                           \
    if (j >= d) return;                                                                            \
    float acc = 0.f;                                                                               \
    for (int b = 0; b < blocks; ++b) acc += partial[(size_t)b * d + j];                            \
    out[j] = from_f<T>(acc);                                                                       \
  }
FOR_DTYPES(SUM_BLOCKS)
