// The model generator's random numbers: exact integer generators and transforms built only from
// IEEE-754 arithmetic, so the same seed gives the same bytes with any compiler or C++ library
// (std::normal_distribution and friends are not specified bit-for-bit and differ across
// libstdc++ / libc++ versions).
#ifndef TANDEM_COMMON_MODEL_GEN_GEN_RANDOM_H_
#define TANDEM_COMMON_MODEL_GEN_GEN_RANDOM_H_

#include <cstdint>
#include <string_view>

namespace tandem {

// One step of splitmix64 (Steele et al.): a bijective mixer, used to seed and to hash.
inline uint64_t SplitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// The seed of one named stream (a tensor, a table): FNV-1a of the name mixed with the model seed.
// Every tensor draws from its own stream, so its bytes do not depend on which tensors come
// before it in the file.
inline uint64_t StreamSeed(uint64_t model_seed, std::string_view name) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (char c : name) h = (h ^ static_cast<uint8_t>(c)) * 0x100000001B3ull;
  uint64_t state = model_seed ^ h;
  return SplitMix64(state);
}

// xoshiro256** (Blackman and Vigna): fast, 256-bit state, seeded through splitmix64.
class GenRandom {
 public:
  explicit GenRandom(uint64_t seed) {
    for (uint64_t& s : s_) s = SplitMix64(seed);
  }

  uint64_t Next() {
    const uint64_t result = Rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = Rotl(s_[3], 45);
    return result;
  }

  // Uniform in [0, 1) with 53 random bits.
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }
  // Uniform integer in [0, n) (n > 0); the modulo bias is below 2^-40 for n < 2^24.
  uint32_t Below(uint32_t n) { return static_cast<uint32_t>((Next() >> 24) % n); }

  // An approximately standard normal value: the centred sum of four 16-bit uniforms, scaled to
  // unit variance (Irwin-Hall). Mean 0, variance 1, bounded by ±2√3 ≈ 3.46: light tails are fine
  // for random weights, and one 64-bit draw per value keeps 45 GB generations fast.
  float Normal() {
    const uint64_t r = Next();
    const uint32_t sum = static_cast<uint32_t>(r & 0xFFFF) + static_cast<uint32_t>((r >> 16) & 0xFFFF) +
                         static_cast<uint32_t>((r >> 32) & 0xFFFF) + static_cast<uint32_t>(r >> 48);
    // Each uniform is (b + 0.5) / 65536, so the sum is (sum + 2) / 65536 with mean 2, variance 1/3.
    constexpr double kScale = 1.7320508075688772 / 65536.0;  // √3 / 65536
    return static_cast<float>((static_cast<double>(sum) - 131070.0) * kScale);
  }

 private:
  static uint64_t Rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
};

}  // namespace tandem

#endif  // TANDEM_COMMON_MODEL_GEN_GEN_RANDOM_H_
