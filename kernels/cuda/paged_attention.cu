// The serving engine's attention over a paged key/value cache (CPU reference:
// kernels/src/paged_attention.rs). Caches are [blocks, block_size, kv_heads, hd]; a sequence's
// token p lives in slot table[p / block_size] * block_size + p % block_size.
//
// paged_attn: one thread block per (work item, kv head, split). A work item is up to TQ query
// rows of one sequence (TQ·g ≤ 16 (row, query head) units, g = heads / kv_heads); a decode row is
// an item of one row. The item's key range is cut into `splits` near-equal parts (split-K, paged.h:
// a long context is spread over many blocks even when few sequences decode); each part is read
// in tiles of WARP keys that the block stages in shared memory once for all its units (GQA:
// the group's query heads share each K/V load). A warp owns units; lane l scores key l of the
// tile (a full dot product from shared memory), the softmax is online across tiles, and each
// lane accumulates its hd/WARP output elements. With one split the output is written normalised;
// otherwise each split leaves (max, sum, unnormalised output) and paged_reduce merges them.
#include "paged.h"

#define THREADS 128
#define WARPS (THREADS / WARP)
#define MAX_UNITS 16
#define UNITS_PER_WARP (MAX_UNITS / WARPS)

// Padding of a shared K row: 16 bytes, so rows stay 16-byte aligned for whole-chunk reads and
// the 8 lanes of a quarter-warp reading 16 bytes each from 8 different keys hit 8 different
// groups of 4 banks (a row is 4 words past a multiple of 32 banks from the one before).
template <typename T> struct KPad { static const int value = 16 / sizeof(T); };

// n consecutive elements of shared memory as floats, in the widest loads their alignment allows
// (callers pass offsets that are multiples of n elements from a 16-byte-aligned base).
template <typename T, int N> DEV void load_floats(const T* p, float (&out)[N]) {
  constexpr int BYTES = N * (int)sizeof(T);
  if constexpr (BYTES % 16 == 0) {
    constexpr int PER = 16 / sizeof(T);
#pragma unroll
    for (int i = 0; i < N / PER; ++i) {
      const uint4 v = reinterpret_cast<const uint4*>(p)[i];
      const T* e = reinterpret_cast<const T*>(&v);
#pragma unroll
      for (int j = 0; j < PER; ++j) out[i * PER + j] = to_f(e[j]);
    }
  } else if constexpr (BYTES == 8) {
    const uint2 v = *reinterpret_cast<const uint2*>(p);
    const T* e = reinterpret_cast<const T*>(&v);
#pragma unroll
    for (int j = 0; j < N; ++j) out[j] = to_f(e[j]);
  } else if constexpr (BYTES == 4) {
    const unsigned v = *reinterpret_cast<const unsigned*>(p);
    const T* e = reinterpret_cast<const T*>(&v);
#pragma unroll
    for (int j = 0; j < N; ++j) out[j] = to_f(e[j]);
  } else {
#pragma unroll
    for (int j = 0; j < N; ++j) out[j] = to_f(p[j]);
  }
}

// n floats rounded to T into n consecutive elements, in the widest stores their alignment allows
// (the counterpart of load_floats).
template <typename T, int N> DEV void store_floats(T* p, const float (&v)[N]) {
  constexpr int BYTES = N * (int)sizeof(T);
  if constexpr (BYTES % 16 == 0) {
    constexpr int PER = 16 / sizeof(T);
#pragma unroll
    for (int i = 0; i < N / PER; ++i) {
      uint4 out;
      T* e = reinterpret_cast<T*>(&out);
#pragma unroll
      for (int j = 0; j < PER; ++j) e[j] = from_f<T>(v[i * PER + j]);
      reinterpret_cast<uint4*>(p)[i] = out;
    }
  } else if constexpr (BYTES == 8) {
    uint2 out;
    T* e = reinterpret_cast<T*>(&out);
#pragma unroll
    for (int j = 0; j < N; ++j) e[j] = from_f<T>(v[j]);
    *reinterpret_cast<uint2*>(p) = out;
  } else if constexpr (BYTES == 4) {
    unsigned out;
    T* e = reinterpret_cast<T*>(&out);
#pragma unroll
    for (int j = 0; j < N; ++j) e[j] = from_f<T>(v[j]);
    *reinterpret_cast<unsigned*>(p) = out;
  } else {
#pragma unroll
    for (int j = 0; j < N; ++j) p[j] = from_f<T>(v[j]);
  }
}

// Keys [tile, tile + WARP) of kv head `kvh`, K rows padded and V rows dense in shared memory;
// keys at or past k1 read as zeros. Each thread moves whole 16-byte chunks and looks each key's
// slot up once; the loads go to registers (`load`) and reach shared memory later (`store`), so
// the next tile's loads are in flight while the block computes over this one. (Staging one tile
// at a time, load then compute, ran at 1.4 TB/s at 64 decoding sequences on the H200: each
// block's compute waited for its loads and its loads for its compute. Before that, an element
// at a time: ~10% of the bandwidth.)
template <typename T, int HD> struct TileRegs {
  static constexpr int KS = HD + KPad<T>::value;
  static constexpr int VEC = 16 / sizeof(T);  // elements per chunk
  static constexpr int ROW = HD / VEC;        // chunks per key
  static constexpr int CHUNKS = WARP * ROW;
  static constexpr int PER_THREAD = (CHUNKS + THREADS - 1) / THREADS;
  uint4 k[PER_THREAD], v[PER_THREAD];

  DEV_MEMBER void load(const T* kc, const T* vc, const unsigned* table, int tile, int k1, int block_size,
                       int kvh_count, int kvh) {
#pragma unroll
    for (int j = 0; j < PER_THREAD; ++j) {
      const int c = threadIdx.x + j * THREADS;
      const int r = c / ROW, e = (c % ROW) * VEC, key = tile + r;
      k[j] = make_uint4(0u, 0u, 0u, 0u);
      v[j] = k[j];
      if (c < CHUNKS && key < k1) {
        const size_t slot = (size_t)table[key / block_size] * block_size + key % block_size;
        const size_t at = (slot * kvh_count + kvh) * HD + e;
        k[j] = *reinterpret_cast<const uint4*>(kc + at);
        v[j] = *reinterpret_cast<const uint4*>(vc + at);
      }
    }
  }

  DEV_MEMBER void store(T* ks, T* vs) const {
#pragma unroll
    for (int j = 0; j < PER_THREAD; ++j) {
      const int c = threadIdx.x + j * THREADS;
      if (c >= CHUNKS) continue;
      const int r = c / ROW, e = (c % ROW) * VEC;
      *reinterpret_cast<uint4*>(ks + r * KS + e) = k[j];
      *reinterpret_cast<uint4*>(vs + r * HD + e) = v[j];
    }
  }
};

// The same tile element by element, for a cache view off 16-byte alignment.
template <typename T, int HD>
DEV void stage_tile_unaligned(const T* kc, const T* vc, const unsigned* table, T* ks, T* vs, int tile, int k1,
                              int block_size, int kvh_count, int kvh) {
  constexpr int KS = HD + KPad<T>::value;
  for (int i = threadIdx.x; i < WARP * HD; i += THREADS) {
    const int r = i / HD, e = i % HD, key = tile + r;
    T kv_k = from_f<T>(0.f), kv_v = from_f<T>(0.f);
    if (key < k1) {
      const size_t slot = (size_t)table[key / block_size] * block_size + key % block_size;
      const size_t at = (slot * kvh_count + kvh) * HD + e;
      kv_k = kc[at];
      kv_v = vc[at];
    }
    ks[r * KS + e] = kv_k;
    vs[r * HD + e] = kv_v;
  }
}

template <typename T, int HD>
DEV void paged_attn(const T* q, const T* kc, const T* vc, const unsigned* query_starts,
                    const unsigned* context_lens, const unsigned* tables, const Item* items, T* out,
                    float* part_m, float* part_l, float* part_acc, int heads, int kvh_count,
                    int block_size, int max_blocks, int splits, float scale) {
  constexpr int E = HD / WARP;  // output elements per lane
  constexpr int KS = HD + KPad<T>::value;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* ks = reinterpret_cast<T*>(smem_raw);                       // [WARP][KS]
  T* vs = ks + WARP * KS;                                       // [WARP][HD]
  float* qs = reinterpret_cast<float*>(vs + WARP * HD);         // [MAX_UNITS][HD]

  const Item it = items[blockIdx.x];
  const int kvh = blockIdx.y, split = blockIdx.z;
  const int g = heads / kvh_count;
  const int units = it.rows * g;
  const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
  const ItemKeys keys = item_keys(it, query_starts, context_lens, tables, max_blocks, WARP, split, splits);
  const int first = keys.first, t = keys.t, ctx = keys.ctx, k0 = keys.k0, k1 = keys.k1;
  const unsigned* table = keys.table;

  for (int i = threadIdx.x; i < units * HD; i += THREADS) {
    const int u = i / HD, e = i % HD;
    const int row = first + it.row0 + u / g, head = kvh * g + u % g;
    qs[i] = to_f(q[((size_t)row * heads + head) * HD + e]) * scale;
  }
  float m[UNITS_PER_WARP], l[UNITS_PER_WARP], acc[UNITS_PER_WARP][E];
#pragma unroll
  for (int j = 0; j < UNITS_PER_WARP; ++j) {
    m[j] = -INFINITY;
    l[j] = 0.f;
    for (int e = 0; e < E; ++e) acc[j][e] = 0.f;
  }
  BARRIER();
  const bool aligned = !(((size_t)kc | (size_t)vc) & 15);
  TileRegs<T, HD> next;
  if (aligned && k0 < k1) next.load(kc, vc, table, k0, k1, block_size, kvh_count, kvh);
  for (int tile = k0; tile < k1; tile += WARP) {
    if (aligned)
      next.store(ks, vs);
    else
      stage_tile_unaligned<T, HD>(kc, vc, table, ks, vs, tile, k1, block_size, kvh_count, kvh);
    BARRIER();
    // In flight while this tile is scored and accumulated.
    if (aligned && tile + WARP < k1) next.load(kc, vc, table, tile + WARP, k1, block_size, kvh_count, kvh);
    const int key = tile + lane;
#pragma unroll
    for (int j = 0; j < UNITS_PER_WARP; ++j) {
      const int u = warp + j * WARPS;
      // Warp-uniform: every lane of a warp takes the same branches, so the shuffles below
      // always run on the whole warp.
      if (u >= units) continue;
      // Row u / g of the item may see keys up to ctx − t + its row index.
      const int limit = ctx - t + it.row0 + u / g;
      float s = -INFINITY;
      if (key < k1 && key <= limit) {
        s = 0.f;
        const float* qu = qs + u * HD;
        // Whole 16-byte chunks of the key and of q (a broadcast): profiled on the H200, the
        // element-at-a-time reads here kept the shared memory 87% busy while DRAM ran at 31%.
        constexpr int C = 16 / sizeof(T);
        const T* kr = ks + lane * KS;
#pragma unroll 4
        for (int e = 0; e < HD; e += C) {
          float kf[C], qf[C];
          load_floats<T, C>(kr + e, kf);
          load_floats<float, C>(qu + e, qf);
#pragma unroll
          for (int i = 0; i < C; ++i) s += qf[i] * kf[i];
        }
      }
      const float tile_max = warp_max(s);
      const float m_new = fmaxf(m[j], tile_max);
      if (m_new == -INFINITY) continue;  // nothing visible yet
      const float corr = __expf(m[j] - m_new);
      const float p = (s == -INFINITY) ? 0.f : __expf(s - m_new);
      l[j] = l[j] * corr + warp_sum(p);
#pragma unroll
      for (int e = 0; e < E; ++e) acc[j][e] *= corr;
      for (int r = 0; r < WARP; ++r) {
        const float pr = SHFL(p, r);
        float vf[E];
        load_floats<T, E>(vs + r * HD + lane * E, vf);
#pragma unroll
        for (int e = 0; e < E; ++e) acc[j][e] += pr * vf[e];
      }
      m[j] = m_new;
    }
    BARRIER();
  }
#pragma unroll
  for (int j = 0; j < UNITS_PER_WARP; ++j) {
    const int u = warp + j * WARPS;
    if (u >= units) continue;
    const int row = first + it.row0 + u / g, head = kvh * g + u % g;
    const size_t rh = (size_t)row * heads + head;
    if (splits == 1) {
      const float inv = l[j] > 0.f ? 1.f / l[j] : 0.f;
      for (int e = 0; e < E; ++e) out[rh * HD + lane * E + e] = from_f<T>(acc[j][e] * inv);
    } else {
      const size_t at = rh * splits + split;
      if (lane == 0) {
        part_m[at] = m[j];
        part_l[at] = l[j];
      }
      for (int e = 0; e < E; ++e) part_acc[at * HD + lane * E + e] = acc[j][e];
    }
  }
}

#define PAGED_ATTN(S, T, HD)                                                                        \
  KERNEL void paged_attn_##S##_hd##HD(                                                              \
      const T* q, const T* kc, const T* vc, const unsigned* qs, const unsigned* cl,                 \
      const unsigned* tables, const Item* items, T* out, float* pm, float* pl, float* pacc,         \
      int heads, int kvh, int block_size, int max_blocks, int splits, float scale) {                \
    paged_attn<T, HD>(q, kc, vc, qs, cl, tables, items, out, pm, pl, pacc, heads, kvh, block_size, \
                      max_blocks, splits, scale);                                                   \
  }
#define PAGED_ATTN_ALL(S, T) PAGED_ATTN(S, T, 64) PAGED_ATTN(S, T, 128) PAGED_ATTN(S, T, 256)
FOR_DTYPES(PAGED_ATTN_ALL)

// Merges the splits of each (row, head): out = Σ accᵢ·e^{mᵢ−M} / Σ lᵢ·e^{mᵢ−M}. One block of
// hd threads per (row, head), thread e for element e; grid (rows, heads). A decode step's merge is
// latency-bound (a few hundred bytes per block), so all threads load the splits' m and l at once
// into shared memory, a tile of hd splits at a time, and each thread's accumulator loads are
// unrolled to keep several in flight. (One loop over splits per thread read m, l and acc in
// chains of dependent trips: 13.6 µs a merge on the H200, 0.5 ms of an 8B decode step.) The sums
// run in split order, as that loop's did: the same bits.
template <typename T>
DEV void paged_reduce_row(const float* pm, const float* pl, const float* pacc, T* out, int heads, int splits,
                          int hd) {
  __shared__ float weight[256];  // e^{mᵢ−M}, or −1 for a split with no keys
  __shared__ float mass[256];    // lᵢ
  __shared__ float red[256 / WARP];
  const int e = threadIdx.x;
  const size_t rh = (size_t)blockIdx.x * heads + blockIdx.y;
  const float* m = pm + rh * splits;
  float mx = -INFINITY;
  for (int i = e; i < splits; i += hd) mx = fmaxf(mx, m[i]);
  mx = warp_max(mx);
  if (e % WARP == 0) red[e / WARP] = mx;
  BARRIER();
  mx = -INFINITY;
  for (int w = 0; w < hd / WARP; ++w) mx = fmaxf(mx, red[w]);
  float num = 0.f, denom = 0.f;
  for (int s0 = 0; s0 < splits; s0 += hd) {
    const int n = min(hd, splits - s0);
    BARRIER();  // the last tile is read
    if (e < n) {
      const float ms = m[s0 + e];
      weight[e] = ms == -INFINITY ? -1.f : __expf(ms - mx);
      mass[e] = pl[rh * splits + s0 + e];
    }
    BARRIER();
    const float* acc = pacc + (rh * splits + s0) * hd + e;
#pragma unroll 8
    for (int i = 0; i < n; ++i) {
      const float a = acc[(size_t)i * hd], wi = weight[i];
      // Adding 0 where a split had no keys leaves the sum as skipping it did.
      num += wi >= 0.f ? a * wi : 0.f;
      denom += wi >= 0.f ? mass[i] * wi : 0.f;
    }
  }
  out[rh * hd + e] = from_f<T>(denom > 0.f ? num / denom : 0.f);
}

// Launched with hd threads (64, 128 or 256: the head sizes the fused attention serves).
#define PAGED_REDUCE(S, T)                                                                          \
  KERNEL void paged_reduce_##S(const float* pm, const float* pl, const float* pacc, T* out,        \
                               int heads, int splits, int hd) {                                     \
    paged_reduce_row<T>(pm, pl, pacc, out, heads, splits, hd);                                      \
  }
FOR_DTYPES(PAGED_REDUCE)

// cache[slots[i]] = src[i], rows of `row` elements; grid-stride over every element. A slot past
// the cache's `capacity` is skipped (the host checks slots; this keeps a bad one in bounds).
#define KV_WRITE(S, T)                                                                              \
  KERNEL void kv_write_##S(T* cache, const T* src, const unsigned* slots, size_t n, int row,       \
                           unsigned capacity) {                                                     \
    for (size_t i = global_index(); i < n; i += global_stride()) {                                  \
      const size_t r = i / row;                                                                     \
      if (slots[r] < capacity) cache[(size_t)slots[r] * row + i % row] = src[i];                    \
    }                                                                                               \
  }
FOR_DTYPES(KV_WRITE)

// What a block does between its projections and attention, for every row n in one pass: q and k
// heads RMS-normalised (gains qw, kw; `norm` 0 leaves them as they are: an architecture whose q/k
// norms span the whole projection normalised them before) and rotated (RoPE, rotate_half
// convention, tables cos/sin [N, hd]); q written to q_out, k and v into their cache slots. The input is the packed q/k/v
// projection, a row of heads + 2·kvh heads of hd (the q heads, the k heads, the v heads). One
// warp per (row, head), heads counted in that order; hd ≤ 256.
template <typename T>
DEV void prepare_unit(const T* qkv, const T* qw, const T* kw, const T* cos, const T* sin, T* q_out, T* kc,
                      T* vc, const unsigned* slots, unsigned capacity, int n, int heads, int kvh, int hd,
                      float eps, int norm, float* stash) {
  const int per_row = heads + 2 * kvh;
  const int lane = threadIdx.x % WARP;
  const int unit = blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP;
  if (unit >= n * per_row) return;
  const int row = unit / per_row, j = unit % per_row;
  const size_t slot = slots[row] < capacity ? slots[row] : 0;
  const bool store = slots[row] < capacity;
  const T* x = qkv + ((size_t)row * per_row + j) * hd;
  if (j >= heads + kvh) {  // v: copied into the cache as it is
    const int h = j - heads - kvh;
    if (store)
      for (int e = lane; e < hd; e += WARP) vc[(slot * kvh + h) * hd + e] = x[e];
    return;
  }
  const bool is_q = j < heads;
  const int h = is_q ? j : j - heads;
  const T* w = is_q ? qw : kw;
  float ss = 0.f;
  for (int e = lane; e < hd; e += WARP) {
    const float xv = to_f(x[e]);
    ss += xv * xv;
  }
  const float r = norm ? rsqrtf(warp_sum(ss) / hd + eps) : 1.f;
  // The normalised row, rounded to T as the unfused ops would store it, goes through the
  // warp's own stash so each lane can read its rotation partner.
  for (int e = lane; e < hd; e += WARP) stash[e] = to_f(from_f<T>(to_f(x[e]) * r * (norm ? to_f(w[e]) : 1.f)));
#if !defined(__HIPCC__)
  __syncwarp();
#endif
  const int half = hd / 2;
  const T* cr = cos + (size_t)row * hd;
  const T* sr = sin + (size_t)row * hd;
  T* dst = is_q ? q_out + ((size_t)row * heads + h) * hd : kc + (slot * kvh + h) * hd;
  if (!is_q && !store) return;
  for (int e = lane; e < hd; e += WARP) {
    const float rot = e < half ? -stash[e + half] : stash[e - half];
    dst[e] = from_f<T>(stash[e] * to_f(cr[e]) + rot * to_f(sr[e]));
  }
}

// The same for head sizes of 32·E (64, 128, 256) with 16-byte aligned rows: lane l holds the E
// consecutive elements from l·E, loaded and stored whole, and its RoPE partners (±hd/2) are the
// same elements of lane l ^ 16, taken by a shuffle instead of a trip through shared memory.
// Profiled on an 8B prefill step of 8192 rows, the element form took 11 ms of 191 (2-byte loads,
// ~0.7 TB/s). The same arithmetic per element; the sum of squares adds in another order.
template <typename T, int E>
DEV void prepare_unit_vec(const T* qkv, const T* qw, const T* kw, const T* cos, const T* sin, T* q_out, T* kc,
                          T* vc, const unsigned* slots, unsigned capacity, int n, int heads, int kvh, float eps,
                          int norm) {
  constexpr int HD = 32 * E;
  const int per_row = heads + 2 * kvh;
  const int lane = threadIdx.x % WARP;
  const int unit = blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP;
  if (unit >= n * per_row) return;  // warp-uniform, as every branch below
  const int row = unit / per_row, j = unit % per_row;
  const bool store = slots[row] < capacity;
  const size_t slot = store ? slots[row] : 0;
  float x[E];
  load_floats<T, E>(qkv + ((size_t)row * per_row + j) * HD + lane * E, x);
  if (j >= heads + kvh) {  // v: copied into the cache as it is
    if (store) store_floats<T, E>(vc + (slot * kvh + (j - heads - kvh)) * HD + lane * E, x);
    return;
  }
  const bool is_q = j < heads;
  const int h = is_q ? j : j - heads;
  float w[E], c[E], sn[E];
  if (norm) {
    load_floats<T, E>((is_q ? qw : kw) + lane * E, w);
  } else {
#pragma unroll
    for (int e = 0; e < E; ++e) w[e] = 1.f;
  }
  float ss = 0.f;
#pragma unroll
  for (int e = 0; e < E; ++e) ss += x[e] * x[e];
  const float r = norm ? rsqrtf(warp_sum(ss) / HD + eps) : 1.f;
  // The normalised row, rounded to T as the unfused ops would store it.
  float nv[E], partner[E];
#pragma unroll
  for (int e = 0; e < E; ++e) nv[e] = to_f(from_f<T>(x[e] * r * w[e]));
#pragma unroll
  for (int e = 0; e < E; ++e) partner[e] = SHFL_XOR(nv[e], 16);
  if (!is_q && !store) return;
  load_floats<T, E>(cos + (size_t)row * HD + lane * E, c);
  load_floats<T, E>(sin + (size_t)row * HD + lane * E, sn);
  float out[E];
#pragma unroll
  for (int e = 0; e < E; ++e) out[e] = nv[e] * c[e] + (lane < 16 ? -partner[e] : partner[e]) * sn[e];
  T* dst = is_q ? q_out + ((size_t)row * heads + h) * HD : kc + (slot * kvh + h) * HD;
  store_floats<T, E>(dst + lane * E, out);
}

#define PAGED_PREPARE_VEC(S, T, E)                                                                  \
  KERNEL void paged_prepare_vec##E##_##S(const T* qkv, const T* qw, const T* kw, const T* cos,      \
                                         const T* sin, T* q_out, T* kc, T* vc, const unsigned* slots, \
                                         unsigned capacity, int n, int heads, int kvh, int hd,      \
                                         float eps, int norm) {                                     \
    prepare_unit_vec<T, E>(qkv, qw, kw, cos, sin, q_out, kc, vc, slots, capacity, n, heads, kvh, eps, norm); \
  }
#define PAGED_PREPARE_VEC_ALL(S, T) PAGED_PREPARE_VEC(S, T, 2) PAGED_PREPARE_VEC(S, T, 4) PAGED_PREPARE_VEC(S, T, 8)
#if !defined(__HIPCC__)  // 32 lanes a warp (an AMD wavefront has 64)
FOR_DTYPES(PAGED_PREPARE_VEC_ALL)
#endif

#define PAGED_PREPARE(S, T)                                                                         \
  KERNEL void paged_prepare_##S(const T* qkv, const T* qw, const T* kw, const T* cos, const T* sin, \
                                T* q_out, T* kc, T* vc, const unsigned* slots, unsigned capacity,   \
                                int n, int heads, int kvh, int hd, float eps, int norm) {           \
    __shared__ float stash[THREADS / WARP][256];                                                    \
    prepare_unit<T>(qkv, qw, kw, cos, sin, q_out, kc, vc, slots, capacity, n, heads, kvh, hd, eps,  \
                    norm, stash[threadIdx.x / WARP]);                                               \
  }
FOR_DTYPES(PAGED_PREPARE)
