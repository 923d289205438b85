// The dialect every kernel in this folder is written in: plain C++ device code plus these
// macros, so one source builds with nvcc (CUDA, PTX for sm_90) and with hipcc (HIP). Nothing
// outside this header names a CUDA- or HIP-only identifier.
#pragma once

#if defined(__HIPCC__)
#include <hip/hip_runtime.h>
#if __has_include(<hip/hip_bf16.h>)
#include <hip/hip_bf16.h>
typedef __hip_bfloat16 bf16;
#else
// ROCm before 5.6 (Debian ships 5.2) has only the older bfloat16 struct; these give it the two
// conversions the kernels use (round to nearest even, as the CUDA intrinsics).
#include <hip/hip_bfloat16.h>
typedef hip_bfloat16 bf16;
static __device__ __forceinline__ float __bfloat162float(bf16 x) { return static_cast<float>(x); }
static __device__ __forceinline__ bf16 __float2bfloat16(float x) { return bf16(x); }
#endif
// AMD wavefronts are 64 lanes; the warp reductions below use WARP, never 32.
#define WARP 64
#define SHFL_XOR(v, m) __shfl_xor((v), (m))
#define SHFL(v, src) __shfl((v), (src))
#else
#include <cuda_bf16.h>
typedef __nv_bfloat16 bf16;
#define WARP 32
#define SHFL_XOR(v, m) __shfl_xor_sync(0xffffffffu, (v), (m))
#define SHFL(v, src) __shfl_sync(0xffffffffu, (v), (src))
#endif

#define KERNEL extern "C" __global__
#define DEV static __device__ __forceinline__
#define DEV_MEMBER __device__ __forceinline__
#define BARRIER() __syncthreads()

// Every kernel reads and writes its tensors' own dtype and does its arithmetic in f32.
DEV float to_f(float x) { return x; }
DEV float to_f(bf16 x) { return __bfloat162float(x); }
template <typename T> DEV T from_f(float x);
template <> __device__ __forceinline__ float from_f<float>(float x) { return x; }
template <> __device__ __forceinline__ bf16 from_f<bf16>(float x) { return __float2bfloat16(x); }

// Instantiates `M(suffix, type)` for each dtype the kernels serve: extern "C" names carry the
// suffix (`rmsnorm_fwd_f32`, `rmsnorm_fwd_bf16`), which is how the Rust side picks one.
#define FOR_DTYPES(M) M(f32, float) M(bf16, bf16)

// Sum over the lanes of one warp; every lane gets the total. The butterfly order is fixed, so
// the result does not depend on scheduling.
DEV float warp_sum(float v) {
  for (int m = WARP / 2; m > 0; m >>= 1) v += SHFL_XOR(v, m);
  return v;
}

DEV float warp_max(float v) {
  for (int m = WARP / 2; m > 0; m >>= 1) v = fmaxf(v, SHFL_XOR(v, m));
  return v;
}

// A 64-bit global index: token × hidden products pass 2^31 at the 8B shapes.
DEV size_t global_index() { return (size_t)blockIdx.x * blockDim.x + threadIdx.x; }
DEV size_t global_stride() { return (size_t)gridDim.x * blockDim.x; }
