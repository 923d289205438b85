// What the training attention's flash kernels share (flash_attention.cu, and the Hopper
// backward of flash_attention_sm90a.cu): where a head's rows lie, tile loads and the output store.
// NVIDIA sm_80+ only: callers include it inside `#if !defined(__HIPCC__)`.
#pragma once
#include "mma.h"

namespace flash {

using namespace mma16;

constexpr int THREADS = 128;  // 4 warps

// Whether a head size's Q, dO, K and V fragments fit in registers beside a warp's output rows
// (16 × HD f32 accumulators). Wider heads (256: 128 accumulator registers per lane) read them
// from shared memory at each use (`RowFrags`), and dK/dV blocks split the columns, since dK and
// dV together would need 256 registers per lane.
__host__ __device__ constexpr bool held(int hd) { return hd <= 128; }
// The columns of dK and dV one dK/dV block accumulates.
__host__ __device__ constexpr int dkdv_cols(int hd) { return held(hd) ? hd : 128; }

// Where one head's rows lie in a tensor of `heads` heads: [B, heads, T, HD] has rows HD apart
// and heads T·HD apart, [B, T, heads, HD] rows heads·HD apart and heads HD apart; batches are
// heads·T·HD apart in both.
template <int HD> struct Heads {
  int heads, ld;
  DEV_MEMBER size_t base(int b, int h, int Tn) const {
    return (size_t)b * heads * Tn * HD + (size_t)h * (ld == HD ? (size_t)Tn * HD : HD);
  }
};

// Rows r0 .. r0 + ROWS of a head (rows `ld` apart) into shared memory (row stride HD + PAD).
template <int ROWS, int HD> DEV void load_tile(bf16* s, const bf16* g, int r0, int Tn, int ld) {
  constexpr int CH = HD / 8;
  for (int c = threadIdx.x; c < ROWS * CH; c += THREADS) {
    const int r = c / CH, col = (c % CH) * 8;
    const bool ok = r0 + r < Tn;
    cp16(s + r * (HD + PAD) + col, g + (size_t)(ok ? r0 + r : 0) * ld + col, ok);
  }
}

// Writes a warp's 16 × HD accumulator rows (row0 + g, row0 + g + 8) times `mul`, skipping rows
// past Tn.
template <int HD>
DEV void store_rows(bf16* head, int ld, const float (&acc)[HD / 8][4], int row0, int Tn, const float (&mul)[2]) {
  const int l = threadIdx.x % 32, g = l / 4, t4 = l % 4;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int row = row0 + g + 8 * i;
    if (row >= Tn) continue;
    bf16* out = head + (size_t)row * ld + 2 * t4;
#pragma unroll
    for (int nt = 0; nt < HD / 8; ++nt)
      *reinterpret_cast<__nv_bfloat162*>(out + nt * 8) =
          __floats2bfloat162_rn(acc[nt][2 * i] * mul[i], acc[nt][2 * i + 1] * mul[i]);
  }
}

// The query tiles a dK/dV block of keys kb..kmax meets, in order: the heads of its group, and in
// each the rows from kb on while a row may see a key ≤ kmax (starts never decrease, so the first
// row that starts after kmax ends the head).
struct QueryTiles {
  const unsigned* starts;  // this batch row's
  int Tn, kb, kmax, rows;  // rows: the tile's
  DEV_MEMBER bool valid(int qs) const { return qs < Tn && (int)starts[qs] <= kmax; }
  // Moves (head, first row) to the next tile; whether there is one among the group's heads.
  DEV_MEMBER bool next(int& hh, int& qs, int group) const {
    qs += rows;
    if (!valid(qs)) {
      ++hh;
      qs = kb;
    }
    return hh < group;
  }
};

// This lane's two rows of its warp's 16 in an accumulator fragment: row0 + lane / 4, and + 8.
DEV void lane_rows(int (&r)[2], int row0) {
  const int g = threadIdx.x % 32 / 4;
  r[0] = row0 + g;
  r[1] = row0 + g + 8;
}

}  // namespace flash
