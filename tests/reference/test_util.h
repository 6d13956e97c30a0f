// Helpers shared by the reference tests: seeded random data and error measures.
#ifndef TANDEM_TESTS_REFERENCE_TEST_UTIL_H_
#define TANDEM_TESTS_REFERENCE_TEST_UTIL_H_

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace tandem::testing {

inline std::vector<float> RandomVector(std::mt19937& rng, int64_t n, float stddev = 1.0f,
                                       float mean = 0.0f) {
  std::normal_distribution<float> dist(mean, stddev);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}

inline std::vector<float> UniformVector(std::mt19937& rng, int64_t n, float lo, float hi) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}

// ‖a − b‖ / ‖b‖ (b is the reference); 0 when both are zero.
inline double RelativeL2(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = static_cast<double>(a[i]) - b[i];
    num += d * d;
    den += static_cast<double>(b[i]) * b[i];
  }
  if (den == 0.0) return num == 0.0 ? 0.0 : INFINITY;
  return std::sqrt(num / den);
}

inline double MaxAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0.0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(static_cast<double>(a[i]) - b[i]));
  return m;
}

// Plain f64 helpers for the independent naive implementations in the tests.
inline double NaiveSigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
inline double NaiveSilu(double x) { return x * NaiveSigmoid(x); }

// gamma ⊙ x / sqrt(mean(x²) + eps), all in f64.
inline std::vector<double> NaiveRmsNorm(const float* x, int64_t n, double eps, const float* gamma) {
  double ss = 0.0;
  for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  const double inv = 1.0 / std::sqrt(ss / n + eps);
  std::vector<double> y(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * inv * (gamma ? gamma[i] : 1.0);
  return y;
}

// y = W·x for W stored row-major as {cols, rows} f32 (row r = output r).
inline std::vector<double> NaiveMatVec(const std::vector<float>& w, int64_t cols, int64_t rows,
                                       const double* x) {
  std::vector<double> y(static_cast<size_t>(rows), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) y[r] += static_cast<double>(w[r * cols + c]) * x[c];
  }
  return y;
}

}  // namespace tandem::testing

#endif  // TANDEM_TESTS_REFERENCE_TEST_UTIL_H_
