// Seeded normal draws for weight init, the same function as kernels/src/seeded.rs (the host
// reference): value i is scale·N(0, 1) from the SplitMix64 stream whose state is states[i / block],
// its draw j = i % block, Box–Muller over the stream's calls 2j+1 and 2j+2. SplitMix64's state
// after c calls is state + c·GAMMA (mod 2^64), so each value is computed on its own. In f64, as
// the host: the results differ from the host's only where CUDA's log and cos round their last bit
// differently from the host's libm.
#include "portable.h"

#define GAMMA 0x9E3779B97F4A7C15ull

DEV unsigned long long mix64(unsigned long long z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// [0, 1) from the top 53 bits (times 2^-53: exact, as the host's division).
DEV double unit53(unsigned long long x) { return (double)(x >> 11) * (1.0 / 9007199254740992.0); }

KERNEL void seeded_normal_f64(const unsigned long long* states, double* out, size_t n, size_t block,
                              double scale) {
  const double tau = 6.283185307179586;  // std::f64::consts::TAU, the same double
  for (size_t i = global_index(); i < n; i += global_stride()) {
    const unsigned long long s = states[i / block], j = i % block;
    const double u1 = 1.0 - unit53(mix64(s + (2 * j + 1) * GAMMA));
    const double u2 = unit53(mix64(s + (2 * j + 2) * GAMMA));
    out[i] = scale * (sqrt(-2.0 * log(u1)) * cos(tau * u2));
  }
}

// Inverted dropout's mask (kernels/src/seeded.rs, dropout_mask): value i is 0 where the stream's
// draw i+1 is uniform below p, keep elsewhere. The comparison is in exact f64 on both sides, so
// the mask is the host's bit for bit.
KERNEL void seeded_dropout_f32(unsigned long long state, float* out, size_t n, double p, float keep) {
  for (size_t i = global_index(); i < n; i += global_stride())
    out[i] = unit53(mix64(state + (unsigned long long)(i + 1) * GAMMA)) < p ? 0.f : keep;
}
