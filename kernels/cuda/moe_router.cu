// The MoE router on the GPU, one warp per token (CPU kernel and reference: kernels/src/moe/cpu.rs
// `router_forward`/`router_backward`, the referee `moe::router::reference`). f32 arithmetic, as
// the CPU kernel: probabilities and log-sum-exp in f32, the routing weights and the logits'
// gradient in the logits' dtype.
//
// Why a kernel: routed on the host, a layer's logits go to the host and the routing comes back
// (two synchronising copies a layer each way); the referee path GPU runs took before that was half
// of a 30B-A3B step (docs/benchmarks.md). Here a token is a warp's work: E ≤ 32·WARP logits,
// lane l holding experts l, l + WARP, …
#include "portable.h"

namespace {

// The largest (v, i) over the warp, ties to the lower index; every lane gets the answer.
DEV void warp_argmax(float& v, int& i) {
#pragma unroll
  for (int m = WARP / 2; m > 0; m >>= 1) {
    const float ov = SHFL_XOR(v, m);
    const int oi = SHFL_XOR(i, m);
    if (ov > v || (ov == v && oi < i)) {
      v = ov;
      i = oi;
    }
  }
}

// Softmax of each token's logits, the top k by repeated selection (ties to the lower expert, as
// the CPU kernel), and their probabilities, renormalised to sum to one when `norm`.
template <typename T>
DEV void router_fwd(const T* logits, float* probs, float* lse, unsigned* experts, T* weights, int n, int e, int k,
                    int norm) {
  const int t = blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP, lane = threadIdx.x % WARP;
  if (t >= n) return;
  const T* row = logits + (size_t)t * e;
  float* p = probs + (size_t)t * e;
  float m = -INFINITY;
  for (int j = lane; j < e; j += WARP) m = fmaxf(m, to_f(row[j]));
  m = warp_max(m);
  float s = 0.f;
  for (int j = lane; j < e; j += WARP) {
    const float x = expf(to_f(row[j]) - m);
    p[j] = x;
    s += x;
  }
  s = warp_sum(s);
  const float inv = 1.f / s;
  for (int j = lane; j < e; j += WARP) p[j] *= inv;  // each lane rereads only what it wrote
  if (lane == 0) lse[t] = m + logf(s);
  unsigned taken = 0u;  // bit q: expert lane + q·WARP is chosen
  unsigned* ex = experts + (size_t)t * k;
  float total = 0.f;
  for (int slot = 0; slot < k; ++slot) {
    float best = -INFINITY;
    int at = e;  // past every expert: loses every comparison with a real one
    for (int q = 0, j = lane; j < e; ++q, j += WARP) {
      if (!(taken >> q & 1u) && (at == e || p[j] > best)) {
        best = p[j];
        at = j;
      }
    }
    warp_argmax(best, at);
    if (at % WARP == lane) taken |= 1u << (at / WARP);
    if (lane == 0) ex[slot] = (unsigned)at;
    total += best;  // in selection order, as the CPU kernel
  }
  // The chosen ids and the other lanes' probabilities are read below (HIP's wavefronts run in
  // lockstep and have no __syncwarp).
#if !defined(__HIPCC__)
  __syncwarp();
#endif
  T* w = weights + (size_t)t * k;
  for (int slot = lane; slot < k; slot += WARP) {
    const float v = p[ex[slot]];
    w[slot] = from_f<T>(norm ? v / total : v);
  }
}

// ∂L/∂logits from ∂L/∂weights and the losses' terms (`balance` [E], zeros for none; `counted`
// [N], 1 for a token the losses count, 0 for padding), as the CPU kernel: dp = balance·c plus, per
// chosen expert, (d − Σ d·p/s)/s (renormalised) or d; then the softmax's backward and the
// z-loss's c·z·2·lse·p.
template <typename T>
DEV void router_bwd(const T* dw, const float* probs, const float* lse, const unsigned* experts, const float* balance,
                    const float* counted, float z, int norm, T* out, int n, int e, int k) {
  const int t = blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP, lane = threadIdx.x % WARP;
  if (t >= n) return;
  const float* p = probs + (size_t)t * e;
  const unsigned* ex = experts + (size_t)t * k;
  const T* d = dw + (size_t)t * k;
  const float c = counted[t];
  float s = 1.f, dot = 0.f;
  if (norm) {
    s = 0.f;
    for (int slot = 0; slot < k; ++slot) s += p[ex[slot]];
    for (int slot = 0; slot < k; ++slot) dot += to_f(d[slot]) * (p[ex[slot]] / s);
  }
  // dp of expert j: its balance term, and the term of the slot that chose it (at most one).
  auto dp = [&](int j) {
    float o = balance[j] * c;
    for (int slot = 0; slot < k; ++slot)
      if (ex[slot] == (unsigned)j) o += norm ? (to_f(d[slot]) - dot) / s : to_f(d[slot]);
    return o;
  };
  float inner = 0.f;
  for (int j = lane; j < e; j += WARP) inner += p[j] * dp(j);
  inner = warp_sum(inner);
  const float zt = z * c * 2.f * lse[t];
  T* o = out + (size_t)t * e;
  for (int j = lane; j < e; j += WARP) o[j] = from_f<T>(p[j] * (dp(j) - inner) + zt * p[j]);
}

}  // namespace

#define ROUTER(S, T)                                                                                    \
  KERNEL void moe_router_fwd_##S(const T* logits, float* probs, float* lse, unsigned* experts, T* weights, \
                                 int n, int e, int k, int norm) {                                       \
    router_fwd<T>(logits, probs, lse, experts, weights, n, e, k, norm);                                 \
  }                                                                                                     \
  KERNEL void moe_router_bwd_##S(const T* dw, const float* probs, const float* lse, const unsigned* experts, \
                                 const float* balance, const float* counted, float z, int norm, T* out, int n, \
                                 int e, int k) {                                                        \
    router_bwd<T>(dw, probs, lse, experts, balance, counted, z, norm, out, n, e, k);                    \
  }
FOR_DTYPES(ROUTER)
