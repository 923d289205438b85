// NF4 dequantisation of a range of a weight's elements into the compute dtype, the first half
// of QLoRA's dequant-matmul (kernels/src/nf4.rs): a tile of rows is expanded here and consumed
// by one cuBLAS GEMM, so the dense weight never exists whole.
#include "portable.h"

// Must equal LEVELS in kernels/src/nf4.rs (the NormalFloat4 quantiles, ascending).
__constant__ float NF4_LEVELS[16] = {
    -1.0f, -0.6961928f, -0.52507305f, -0.3949175f, -0.28444138f, -0.18477343f, -0.091050036f, 0.0f,
    0.0795803f, 0.1609302f, 0.2461123f, 0.33791524f, 0.44070983f, 0.562617f, 0.72295684f, 1.0f};

// out[i] = level(code of element start + i) · scale of its block of 64, for i < n. Codes are
// two per byte, low nibble first.
#define NF4_DEQUANT(S, T)                                                                          \
  KERNEL void nf4_dequant_##S(const unsigned char* codes, const float* scales, T* out,            \
                              size_t start, size_t n) {                                            \
    for (size_t i = global_index(); i < n; i += global_stride()) {                                 \
      const size_t e = start + i;                                                                  \
      const int code = (codes[e / 2] >> (4 * (e % 2))) & 0xF;                                      \
      out[i] = from_f<T>(NF4_LEVELS[code] * scales[e / 64]);                                       \
    }                                                                                              \
  }
FOR_DTYPES(NF4_DEQUANT)
