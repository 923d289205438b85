// Hopper's warpgroup MMA (wgmma, sm_90a) for the training attention's backward: shared-memory
// tiles in the 128-byte swizzled layout it reads, their descriptors, and the instructions. A
// warpgroup (4 consecutive warps, 128 threads) computes a 64-row product; its accumulator
// fragment, per warp, is mma.sync's m16n8 C fragment repeated along N, so the softmax code of
// mma.h applies to it unchanged. Callers include this only where __CUDA_ARCH_FEAT_SM90_ALL is
// defined (PTX built for compute_90a).
#pragma once
#include "mma.h"

namespace wg {

// A [ROWS, HD] bf16 tile stored as HD / 64 blocks of [ROWS, 64]: 128-byte rows whose 16-byte
// chunks are XOR-swizzled by row % 8 (wgmma's 128B swizzle; also free of bank conflicts for the
// cp.async writes). Blocks and the tile start 1024-byte aligned.
template <int ROWS> DEV int sw_offset(int r, int c) {  // in elements
  return (c / 64) * ROWS * 64 + r * 64 + ((((c % 64) / 8) ^ (r % 8)) * 8) + c % 8;
}

// Rows r0 .. r0 + ROWS of a head (rows `ld` elements apart) into a swizzled tile; rows past Tn
// read as zeros.
template <int ROWS, int HD, int THREADS>
DEV void load_sw(bf16* s, const bf16* g, int r0, int Tn, int ld) {
  constexpr int CH = HD / 8;
  for (int c = threadIdx.x; c < ROWS * CH; c += THREADS) {
    const int r = c / CH, col = (c % CH) * 8;
    const bool ok = r0 + r < Tn;
    mma16::cp16(s + sw_offset<ROWS>(r, col), g + (size_t)(ok ? r0 + r : 0) * ld + col, ok);
  }
}

// 4 bytes global → shared, asynchronously; zeros when !valid.
DEV void cp4(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(mma16::smem_addr(dst)), "l"(src),
               "r"(valid ? 4 : 0));
}

DEV unsigned long long desc(const void* s, unsigned lbo, unsigned sbo) {
  const unsigned long long a = mma16::smem_addr(s);
  return ((a & 0x3FFFF) >> 4) | ((unsigned long long)(lbo >> 4) << 16) | ((unsigned long long)(sbo >> 4) << 32) | (1ull << 62);
}
// A swizzled [ROWS, HD] tile as a K-major operand (rows along M or N, K along HD): the 16 columns
// of k-step kk.
template <int ROWS> DEV unsigned long long desc_k(const bf16* tile, int kk) {
  return desc(tile + (kk * 16 / 64) * ROWS * 64 + (kk * 16) % 64, 16, 1024);
}
// A swizzled [ROWS, HD] tile as an MN-major operand (K along its rows, N along HD): the 16 rows of
// k-step kk.
template <int ROWS> DEV unsigned long long desc_mn(const bf16* tile, int kk) {
  return desc(tile + kk * 16 * 64, ROWS * 128, 1024);
}

DEV void fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
DEV void commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> DEV void wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }
// Shared memory written through the generic proxy (cp.async, st.shared) before wgmma reads it.
DEV void fence_async_smem() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// D (+)= A·B, m64nNk16 (N = 8 × d's first extent): A and B in shared memory (descriptors), both
// K-major; `accumulate` 0 makes D = A·B.
DEV void wgmma_ss(float (&d)[8][4], unsigned long long a, unsigned long long b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
        "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
        "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
        "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]),
        "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
        "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
      : "l"(a), "l"(b), "r"(accumulate));
}

DEV void wgmma_ss(float (&d)[4][4], unsigned long long a, unsigned long long b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
        "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
        "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3])
      : "l"(a), "l"(b), "r"(accumulate));
}

// D += A·B, m64n128k16: A from registers (each warp its 16 rows, laid out as mma.sync's A
// fragment), B in shared memory MN-major (its 128-byte rows run along N).
DEV void wgmma_rs_t(float (&d)[16][4], const unsigned (&a)[4], unsigned long long b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
        "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
        "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
        "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]),
        "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
        "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]),
        "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]),
        "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]),
        "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]),
        "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]),
        "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]),
        "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]),
        "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]),
        "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
}

// D += A·B, m64n64k16: A from registers (each warp its 16 rows, laid out as mma.sync's A
// fragment), B in shared memory MN-major (its 128-byte rows run along N).
DEV void wgmma_rs_t(float (&d)[8][4], const unsigned (&a)[4], unsigned long long b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
        "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
        "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
        "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]),
        "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
        "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
}

}  // namespace wg
