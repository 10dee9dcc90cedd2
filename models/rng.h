// Seeded random numbers with a fixed definition (mt19937_64 plus our own conversions), so
// that the same seed gives bitwise the same values with any compiler and standard library;
// and counter-based ones (element i of a stream a pure function of its key and i) for the
// large fills, which threads share (synthetic data, initial weights).
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

// The counter-based functions run on the host and in kernels alike (same values, bitwise).
#if defined(__CUDACC__)
#define DDP_HOST_DEVICE __host__ __device__
#else
#define DDP_HOST_DEVICE
#endif

namespace ddp {

class Rng {
 public:
  explicit Rng(uint64_t seed) : engine_(seed) {}

  uint64_t next_u64() { return engine_(); }
  // Uniform in [0, 1) with 24 random bits (exactly representable in float).
  float uniform01() { return static_cast<float>(engine_() >> 40) * (1.0f / 16777216.0f); }
  float uniform(float low, float high) { return low + (high - low) * uniform01(); }
  // Standard normal by Box-Muller (computed in double, one value per call).
  float normal() {
    const double u1 = (static_cast<double>(engine_() >> 11) + 1.0) * (1.0 / 9007199254740992.0);
    const double u2 = static_cast<double>(engine_() >> 11) * (1.0 / 9007199254740992.0);
    return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
  }
  // Uniform integer in [0, n) by rejection (no modulo bias).
  uint64_t below(uint64_t n) {
    const uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t x;
    do {
      x = engine_();
    } while (x >= limit);
    return x % n;
  }
  template <typename T>
  void shuffle(std::vector<T>& values) {
    for (size_t i = values.size(); i > 1; --i)
      std::swap(values[i - 1], values[below(i)]);
  }

 private:
  std::mt19937_64 engine_;
};

// Derives an independent seed for a purpose (e.g. the epoch of a sampler) from a base seed.
DDP_HOST_DEVICE inline uint64_t mix_seed(uint64_t seed, uint64_t stream) {
  uint64_t z = seed + 0x9E3779B97F4A7C15ull * (stream + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Counter-based random numbers: SplitMix64 of (key, index), so that any number of threads
// fill a range, in any order, with the same values as one.
DDP_HOST_DEVICE inline uint64_t counter_bits(uint64_t key, uint64_t index) {
  return mix_seed(key, index);
}
// Uniform in [0, 1) with 24 random bits (exactly representable in float).
DDP_HOST_DEVICE inline float counter_uniform01(uint64_t key, uint64_t index) {
  return static_cast<float>(counter_bits(key, index) >> 40) * (1.0f / 16777216.0f);
}
// Uniform in [low, high): computed in double, where the product is exact (24-bit factors),
// then rounded once to float, so that a fused multiply-add (a compiler's or the GPU's) gives
// the same value as separate operations.
DDP_HOST_DEVICE inline float counter_uniform(uint64_t key, uint64_t index, float low, float high) {
  const double span = static_cast<double>(high) - static_cast<double>(low);
  return static_cast<float>(static_cast<double>(low) +
                            span * static_cast<double>(counter_uniform01(key, index)));
}
// Uniform integer in [0, n) by multiply-shift (a bias below n / 2^64).
inline uint32_t counter_below(uint64_t key, uint64_t index, uint32_t n) {
  return static_cast<uint32_t>((static_cast<unsigned __int128>(counter_bits(key, index)) * n) >>
                               64);
}
// Standard normals 2 * pair and 2 * pair + 1 of a stream: both Box-Muller values (computed in
// double) of that pair's two uniforms.
inline void counter_normal_pair(uint64_t key, uint64_t pair, float* first, float* second) {
  const double u1 =
      (static_cast<double>(counter_bits(key, 2 * pair) >> 11) + 1.0) * (1.0 / 9007199254740992.0);
  const double u2 =
      static_cast<double>(counter_bits(key, 2 * pair + 1) >> 11) * (1.0 / 9007199254740992.0);
  const double radius = std::sqrt(-2.0 * std::log(u1));
  *first = static_cast<float>(radius * std::cos(6.283185307179586 * u2));
  *second = static_cast<float>(radius * std::sin(6.283185307179586 * u2));
}

}  // namespace ddp
