// Deterministic test data, written out in plain C arithmetic so that the program that measured
// ggml's figures in docs/PERF.md ("Quantization quality") reproduces exactly the same values.
#ifndef TANDEM_TESTS_WEIGHTS_TEST_DATA_H_
#define TANDEM_TESTS_WEIGHTS_TEST_DATA_H_

#include <cmath>
#include <cstdint>
#include <vector>

namespace tandem::testing {

// splitmix64: 64 random bits per call.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }

 private:
  uint64_t state_;
};

// N(0, 1): uniform (0, 1] doubles -> Box-Muller, rounded to f32. Uses libm's log / cos / sin.
inline std::vector<float> NormalData(uint64_t seed, int64_t n) {
  SplitMix64 rng(seed);
  auto uniform = [&rng]() { return static_cast<double>((rng.Next() >> 11) + 1) * 0x1.0p-53; };
  std::vector<float> out(n);
  for (int64_t i = 0; i < n; i += 2) {
    const double r = std::sqrt(-2.0 * std::log(uniform()));
    const double theta = 2.0 * 3.14159265358979323846 * uniform();
    out[i] = static_cast<float>(r * std::cos(theta));
    if (i + 1 < n) out[i + 1] = static_cast<float>(r * std::sin(theta));
  }
  return out;
}

// Roughly N(0, 1) without libm (so bit-for-bit the same wherever f32 is IEEE): the sum of four
// uniform [0, 1) floats with 24 random bits each, centred and scaled to unit variance.
inline std::vector<float> IrwinHallData(uint64_t seed, int64_t n) {
  SplitMix64 rng(seed);
  std::vector<float> out(n);
  for (int64_t i = 0; i < n; ++i) {
    float sum = 0;
    for (int k = 0; k < 4; ++k) sum += static_cast<float>(rng.Next() >> 40) * 0x1.0p-24f;
    out[i] = (sum - 2.0f) * 1.7320508f;
  }
  return out;
}

// sqrt(mean((a - b)^2)) in double.
inline double RmsError(const std::vector<float>& a, const std::vector<float>& b) {
  double sum = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = static_cast<double>(a[i]) - b[i];
    sum += d * d;
  }
  return std::sqrt(sum / static_cast<double>(a.size()));
}

}  // namespace tandem::testing

#endif  // TANDEM_TESTS_WEIGHTS_TEST_DATA_H_
