// Warp-level tensor-core building blocks shared by the attention kernels (flash_attention.cu for
// training, paged_attention_tc.cu for serving): the m16n8k16 bf16 MMA, ldmatrix fragment loads
// from padded shared-memory tiles, and cp.async staging. NVIDIA sm_80+ only: callers include it
// inside `#if !defined(__HIPCC__)`.
#pragma once
#include "portable.h"

namespace mma16 {

constexpr int PAD = 8;        // bf16 per row of padding in shared memory
constexpr float LOG2E = 1.4426950408889634f;
constexpr float LN2 = 0.6931471805599453f;

DEV unsigned smem_addr(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }

// Four 8×8 b16 matrices; lane l gives the address of row l % 8 of matrix l / 8.
DEV void ldsm4(unsigned (&r)[4], const bf16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
DEV void ldsm4t(unsigned (&r)[4], const bf16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

// d += a·b for a 16×16 A (row-major fragment), 16×8 B (column-major fragment), f32 d.
DEV void mma(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two f32 as one register of bf16, the first in the low half (the lower column index).
DEV unsigned pack2(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<unsigned*>(&v);
}

// The A fragment of a 16×16 tile whose columns 0–7 are C fragment c0 and 8–15 are c1.
DEV void c_to_a(unsigned (&a)[4], const float (&c0)[4], const float (&c1)[4]) {
  a[0] = pack2(c0[0], c0[1]);
  a[1] = pack2(c0[2], c0[3]);
  a[2] = pack2(c1[0], c1[1]);
  a[3] = pack2(c1[2], c1[3]);
}

// 16 bytes global → shared, asynchronously; `valid` false writes zeros (rows past T).
DEV void cp16(bf16* dst, const bf16* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(valid ? 16 : 0));
}
DEV void cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> DEV void cp_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }


// Fragment addresses inside a tile of row stride LD, for this lane:
// the A fragment of rows r0..r0+16, columns c0..c0+16 (ldsm4);
DEV const bf16* a_frag(const bf16* s, int ld, int r0, int c0) {
  const int l = threadIdx.x % 32;
  return s + (r0 + l % 8 + 8 * ((l / 8) % 2)) * ld + c0 + 8 * (l / 16);
}
// two B fragments (n 0–7, 8–15) whose n runs along the tile's rows r0..r0+16 (ldsm4);
DEV const bf16* b_rows(const bf16* s, int ld, int r0, int c0) {
  const int l = threadIdx.x % 32;
  return s + (r0 + l % 8 + 8 * (l / 16)) * ld + c0 + 8 * ((l / 8) % 2);
}
// two B fragments whose k runs along the tile's rows r0..r0+16, n along columns c0..c0+16
// (ldsm4t): the same addresses as an A fragment.
DEV const bf16* b_cols(const bf16* s, int ld, int r0, int c0) { return a_frag(s, ld, r0, c0); }

DEV float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
DEV float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// acc[16 × 8·N] += A (one 16×16 fragment: columns kk·16.. of the left-hand side) · the tile's
// columns kk·16..+16, transposed, the tile's rows r0.. as n.
template <int N>
DEV void mma_rows_slice(float (&acc)[N][4], const unsigned (&a)[4], const bf16* s, int ld, int r0, int kk) {
#pragma unroll
  for (int np = 0; np < N / 2; ++np) {
    unsigned r[4];
    ldsm4(r, b_rows(s, ld, r0 + np * 16, kk * 16));
    mma(acc[2 * np], a, r[0], r[1]);
    mma(acc[2 * np + 1], a, r[2], r[3]);
  }
}

// acc[16 × 8·N] += A (KS fragments of 16×16) · tileᵀ, the tile's rows r0.. as n.
template <int KS, int N>
DEV void mma_rows(float (&acc)[N][4], const unsigned (&a)[KS][4], const bf16* s, int ld, int r0) {
#pragma unroll
  for (int kk = 0; kk < KS; ++kk) mma_rows_slice<N>(acc, a[kk], s, ld, r0, kk);
}

// acc[16 × HD] += C (16 × 16·KS as C fragments) · tile (rows r0.. as k, HD columns from c0 on as
// n; the tile's row stride ld, by default a tile of exactly HD columns).
template <int HD, int N2>
DEV void mma_cols(float (&acc)[HD / 8][4], const float (&c)[N2][4], const bf16* s, int r0, int ld = HD + PAD,
                  int c0 = 0) {
#pragma unroll
  for (int kk = 0; kk < N2 / 2; ++kk) {
    unsigned a[4];
    c_to_a(a, c[2 * kk], c[2 * kk + 1]);
#pragma unroll
    for (int np = 0; np < HD / 16; ++np) {
      unsigned r[4];
      ldsm4t(r, b_cols(s, ld, r0 + kk * 16, c0 + np * 16));
      mma(acc[2 * np], a, r[0], r[1]);
      mma(acc[2 * np + 1], a, r[2], r[3]);
    }
  }
}

// The A fragments of rows r0..r0+16 of a staged tile, every column.
template <int HD> DEV void load_a(unsigned (&a)[HD / 16][4], const bf16* s, int r0) {
#pragma unroll
  for (int kk = 0; kk < HD / 16; ++kk) ldsm4(a[kk], a_frag(s, HD + PAD, r0, kk * 16));
}

// A warp's 16 rows of a staged tile (row stride HD + PAD) as the left-hand side of rows · tileᵀ.
// HELD keeps their A fragments in registers (HD / 4 per lane); otherwise each product reads them
// from the tile slice by slice, leaving the registers to an output accumulator too wide to share
// them (head size 256: 128 per lane), and the tile must stay staged while it is used.
template <int HD, bool HELD> struct RowFrags;
template <int HD> struct RowFrags<HD, true> {
  unsigned a[HD / 16][4];
  DEV_MEMBER void load(const bf16* s, int r0) { load_a<HD>(a, s, r0); }
  // acc[16 × 8·N] += these rows · tᵀ, t's rows 0.. as n.
  template <int N> DEV_MEMBER void times_t(float (&acc)[N][4], const bf16* t) const {
    mma_rows<HD / 16, N>(acc, a, t, HD + PAD, 0);
  }
};
template <int HD> struct RowFrags<HD, false> {
  const bf16* s;
  int r0;
  DEV_MEMBER void load(const bf16* tile, int row0) {
    s = tile;
    r0 = row0;
  }
  template <int N> DEV_MEMBER void times_t(float (&acc)[N][4], const bf16* t) const {
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk) {
      unsigned a[4];
      ldsm4(a, a_frag(s, HD + PAD, r0, kk * 16));
      mma_rows_slice<N>(acc, a, t, HD + PAD, 0, kk);
    }
  }
};

// One key tile of the online softmax for a lane's two MMA rows (i = 0: row lane / 4, i = 1: that
// + 8; with HALVES = 1 the caller has no unit in rows 8–15 and row i = 1 is left as it is). `s`
// holds the tile's scores as C fragments over 8·NT keys; a score becomes s·c (log2 units) where
// visible(i, column) holds and −inf elsewhere, the running max m and sum and the accumulator o are
// rescaled to the new max, and s becomes the probabilities exp2(s·c − max).
template <int NT, int HD, int HALVES = 2, typename Visible>
DEV void softmax_tile(float (&s)[NT][4], float (&m)[2], float (&sum)[2], float (&o)[HD / 8][4], float c,
                      Visible visible) {
  const int t4 = threadIdx.x % 4;
#pragma unroll
  for (int i = 0; i < HALVES; ++i) {
    float mx = -INFINITY;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float& x = s[nt][2 * i + e];
        x = visible(i, nt * 8 + 2 * t4 + e) ? x * c : -INFINITY;
        mx = fmaxf(mx, x);
      }
    const float mn = fmaxf(m[i], quad_max(mx));
    const float base = mn == -INFINITY ? 0.f : mn;  // a row with nothing visible yet stays 0
    const float corr = exp2f(m[i] - base);
    sum[i] *= corr;
#pragma unroll
    for (int nt = 0; nt < HD / 8; ++nt) {
      o[nt][2 * i] *= corr;
      o[nt][2 * i + 1] *= corr;
    }
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float p = exp2f(s[nt][2 * i + e] - base);
        s[nt][2 * i + e] = p;
        sum[i] += p;
      }
    m[i] = mn;
  }
}

}  // namespace mma16
