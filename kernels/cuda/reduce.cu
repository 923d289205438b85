// Reductions to one f64 per tensor. Deterministic: block b sums the fixed chunk
// [b·per, (b+1)·per) with its threads strided over it and a fixed tree in shared memory, so the
// partials, and the host's in-order sum of them, depend only on the tensor's length.
#include "portable.h"

#define REDUCE_THREADS 256

// Sum of squares in f64 (a gradient norm's part): one partial per block into out[0..gridDim.x).
#define SUM_SQUARES(S, T)                                                                          \
  KERNEL void sum_squares_##S(const T* x, size_t n, size_t per, double* out) {                     \
    __shared__ double part[REDUCE_THREADS];                                                        \
    const size_t lo = (size_t)blockIdx.x * per;                                                    \
    const size_t hi = lo + per < n ? lo + per : n;                                                 \
    double acc = 0.0;                                                                              \
    for (size_t i = lo + threadIdx.x; i < hi; i += REDUCE_THREADS) {                               \
      const double v = (double)to_f(x[i]);                                                         \
      acc += v * v;                                                                                \
    }                                                                                              \
    part[threadIdx.x] = acc;                                                                       \
    __syncthreads();                                                                               \
    for (unsigned s = REDUCE_THREADS / 2; s > 0; s >>= 1) {                                        \
      if (threadIdx.x < s) part[threadIdx.x] += part[threadIdx.x + s];                             \
      __syncthreads();                                                                             \
    }                                                                                              \
    if (threadIdx.x == 0) out[blockIdx.x] = part[0];                                               \
  }
FOR_DTYPES(SUM_SQUARES)
