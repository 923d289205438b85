// Per-row sampling on the device (CPU reference: kernels/src/sampling.rs, which defines the rule):
// greedy, or temperature with top-k and top-p as thresholds on logit values, then the first
// index (vocabulary order) whose running kept weight passes u·Σ kept. One block per row; the
// k-th largest value and the top-p cut are found by bisection over the floats' ordered bit
// patterns (32 counting passes each), so nothing is sorted. The row's max, its first index and
// Σ e^{x − max} come first from `sample_parts`, many blocks a row: one block walking a 152k
// vocabulary alone took 73 µs of a 64-row decode step (H200), a whole greedy step's sampling.
#include "portable.h"

#define THREADS 256

DEV unsigned ordered(float x) {
  const unsigned b = __float_as_uint(x);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// A block-wide reduction (every thread gets the result): each warp reduces with `warp`, then
// every thread folds the warps' results with `op`; `red` holds one float per warp.
template <typename W, typename Op>
DEV float block_reduce(float v, float* red, W warp_op, Op op, float init) {
  v = warp_op(v);
  const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
  BARRIER();
  if (lane == 0) red[warp] = v;
  BARRIER();
  float t = init;
  for (int w = 0; w < THREADS / WARP; ++w) t = op(t, red[w]);
  return t;
}

DEV float block_sum(float v, float* red) {
  return block_reduce(v, red, [](float x) { return warp_sum(x); }, [](float a, float b) { return a + b; }, 0.f);
}

DEV float block_max(float v, float* red) {
  return block_reduce(v, red, [](float x) { return warp_max(x); }, [](float a, float b) { return fmaxf(a, b); },
                      -INFINITY);
}

// The largest key K with f(K) ≥ goal, f non-increasing in K (a count or a mass above K).
template <typename F> DEV unsigned largest_key(F f, float goal) {
  unsigned lo = 0u, hi = 0xffffffffu;  // f(lo) ≥ goal holds: everything is above key 0
  while (lo < hi) {
    // ⌈(hi − lo) / 2⌉ without forming hi − lo + 1, which wraps to 0 on the full range and
    // would pin mid at lo forever.
    const unsigned d = hi - lo;
    const unsigned mid = lo + d / 2u + (d & 1u);
    if (f(mid) >= goal) lo = mid; else hi = mid - 1u;
  }
  return lo;
}

// This thread's max, its first index and Σ e^{x − max} over elements [i0, i1) of row `l`, in one
// pass (online: the sum is rescaled when the max grows), in 16-byte chunks where the row is
// aligned for them (i0 a multiple of 8). A thread that saw only −∞ holds (−∞, vocab, 0).
template <typename T>
DEV void scan_max(const T* l, int i0, int i1, int vocab, float& mx, int& arg, float& se) {
  mx = -INFINITY;
  se = 0.f;
  arg = vocab;
  const int tid = threadIdx.x;
  auto visit = [&](float x, int i) {
    if (x > mx) {
      se = se * __expf(mx - x) + 1.f;
      mx = x;
      arg = i;
    } else if (x != -INFINITY) {  // (−∞ − −∞ would add NaN)
      se += __expf(x - mx);
    }
  };
  constexpr int V = 16 / sizeof(T);
  if (vocab % V == 0 && i0 % V == 0 && (reinterpret_cast<size_t>(l) & 15) == 0) {
    const uint4* chunks = reinterpret_cast<const uint4*>(l);
#pragma unroll 4
    for (int c = i0 / V + tid; c < (i1 + V - 1) / V; c += THREADS) {
      const uint4 v = chunks[c];
      const T* e = reinterpret_cast<const T*>(&v);
#pragma unroll
      for (int j = 0; j < V; ++j)
        if (c * V + j < i1) visit(to_f(e[j]), c * V + j);
    }
  } else {
    for (int i = i0 + tid; i < i1; i += THREADS) visit(to_f(l[i]), i);
  }
}

// The block's (max, first index of it, Σ e^{x − max}) from each thread's (mx, arg, se); every
// thread gets them.
DEV void combine_max(float mx, int arg, float se, int vocab, float* red, float& max_out, int& arg_out,
                     float& se_out) {
  max_out = block_max(mx, red);
  const float cand = (mx == max_out) ? (float)arg : (float)vocab;
  arg_out = (int)(-block_max(-cand, red));
  // A thread that saw only −∞ holds se = 0 (its e^{mx − max} would be NaN).
  se_out = block_sum(mx == -INFINITY ? 0.f : se * __expf(mx - max_out), red);
}

// Part `blockIdx.y` (elements [y·per, (y+1)·per)) of row `blockIdx.x`: its (max, first index as
// a float, exact below 2^24, Σ e^{x − max}) into parts[(row·parts + y)·3 ..].
template <typename T> DEV void row_part(const T* logits, float* parts, int vocab, int per) {
  __shared__ float red[THREADS / WARP];
  const T* l = logits + (size_t)blockIdx.x * vocab;
  const int i0 = blockIdx.y * per, i1 = min(vocab, i0 + per);
  float mx, se;
  int arg;
  scan_max<T>(l, i0, i1, vocab, mx, arg, se);
  float pm, ps;
  int pa;
  combine_max(mx, arg, se, vocab, red, pm, pa, ps);
  if (threadIdx.x == 0) {
    float* p = parts + ((size_t)blockIdx.x * gridDim.y + blockIdx.y) * 3;
    p[0] = pm;
    p[1] = (float)pa;
    p[2] = ps;
  }
}

template <typename T>
DEV void sample_row(const T* logits, const float* parts, int nparts, const float* temperature, const float* top_p,
                    const unsigned* top_k, const float* uniform, unsigned* token, float* logprob, int vocab) {
  __shared__ float red[THREADS / WARP];
  __shared__ float chunk[THREADS];
  const int row = blockIdx.x, tid = threadIdx.x;
  const T* l = logits + (size_t)row * vocab;
  // The row's parts, one a thread (nparts ≤ THREADS), folded as the threads' own scans were.
  float mx = -INFINITY, se = 0.f;
  int arg = vocab;
  if (tid < nparts) {
    const float* p = parts + ((size_t)row * nparts + tid) * 3;
    mx = p[0];
    arg = (int)p[1];
    se = p[2];
  }
  float row_max, row_se;
  int first_max;
  combine_max(mx, arg, se, vocab, red, row_max, first_max, row_se);
  const float lse = row_max + __logf(row_se);
  const float temp = temperature[row];
  const unsigned k = top_k[row];
  // No finite or +∞ logit (a row of NaN or −∞: diverged weights): token 0 with a NaN
  // log-probability, as the reference draws, so the host can tell; `vocab` would be past the row.
  const bool drawable = first_max < vocab;
  int pick = drawable ? first_max : 0;
  if (drawable && temp > 0.f && k != 1u) {
    const float inv_t = 1.f / temp;
    auto weight = [&](float x) { return __expf((x - row_max) * inv_t); };
    unsigned cut = 0u;
    if (k > 0u && (int)k < vocab) {
      cut = largest_key([&](unsigned key) {
        float c = 0.f;
        for (int i = tid; i < vocab; i += THREADS) c += ordered(to_f(l[i])) >= key ? 1.f : 0.f;
        return block_sum(c, red);
      }, (float)k);
    }
    if (top_p[row] < 1.f) {
      float kept = 0.f;
      for (int i = tid; i < vocab; i += THREADS) {
        const float x = to_f(l[i]);
        if (ordered(x) >= cut) kept += weight(x);
      }
      const float goal = top_p[row] * block_sum(kept, red);
      const unsigned floor_key = cut;
      cut = largest_key([&](unsigned key) {
        const unsigned kk = key > floor_key ? key : floor_key;
        float s = 0.f;
        for (int i = tid; i < vocab; i += THREADS) {
          const float x = to_f(l[i]);
          if (ordered(x) >= kk) s += weight(x);
        }
        return block_sum(s, red);
      }, goal);
      if (cut < floor_key) cut = floor_key;
    }
    // Contiguous chunks per thread, their kept mass, an exclusive scan, then the one chunk that
    // holds the crossing walks its elements.
    const int per = (vocab + THREADS - 1) / THREADS;
    const int i0 = tid * per, i1 = min(vocab, i0 + per);
    float mine = 0.f;
    int last_kept = -1;
    for (int i = i0; i < i1; ++i) {
      const float x = to_f(l[i]);
      if (ordered(x) >= cut) { mine += weight(x); last_kept = i; }
    }
    chunk[tid] = mine;
    BARRIER();
    __shared__ float total;
    __shared__ int chosen;
    if (tid == 0) {
      float acc = 0.f;
      for (int t = 0; t < THREADS; ++t) { const float c = chunk[t]; chunk[t] = acc; acc += c; }
      total = acc;
      chosen = -1;
    }
    BARRIER();
    const float target = uniform[row] * total;
    float acc = chunk[tid];
    if (mine > 0.f && acc <= target && target < acc + mine) {
      for (int i = i0; i < i1; ++i) {
        const float x = to_f(l[i]);
        if (ordered(x) < cut) continue;
        acc += weight(x);
        if (acc > target) { chosen = i; break; }
      }
    }
    BARRIER();
    // Rounding can leave the draw past the last kept weight: take the last kept index.
    const float lk = block_max(last_kept >= 0 ? (float)last_kept : -1.f, red);
    pick = chosen >= 0 ? chosen : (int)lk;
  }
  if (tid == 0) {
    token[row] = (unsigned)pick;
    logprob[row] = drawable ? to_f(l[pick]) - lse : __int_as_float(0x7fc00000);
  }
}

#define SAMPLE(S, T)                                                                                \
  KERNEL void sample_parts_##S(const T* logits, float* parts, int vocab, int per) {                 \
    row_part<T>(logits, parts, vocab, per);                                                         \
  }                                                                                                 \
  KERNEL void sample_##S(const T* logits, const float* parts, int nparts, const float* temperature, \
                         const float* top_p, const unsigned* top_k, const float* uniform,           \
                         unsigned* token, float* logprob, int vocab) {                              \
    sample_row<T>(logits, parts, nparts, temperature, top_p, top_k, uniform, token, logprob, vocab); \
  }
FOR_DTYPES(SAMPLE)
