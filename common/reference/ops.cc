#include "common/reference/ops.h"

#include <algorithm>

namespace tandem {

void RmsNorm(const float* x, int64_t n, float eps, const float* gamma, float* y) {
  double sum_sq = 0.0;
  for (int64_t i = 0; i < n; ++i) sum_sq += static_cast<double>(x[i]) * x[i];
  const float scale = static_cast<float>(1.0 / std::sqrt(sum_sq / static_cast<double>(n) + eps));
  if (gamma != nullptr) {
    for (int64_t i = 0; i < n; ++i) y[i] = gamma[i] * (x[i] * scale);
  } else {
    for (int64_t i = 0; i < n; ++i) y[i] = x[i] * scale;
  }
}

void L2Normalize(float* x, int64_t n, float eps) {
  double sum_sq = 0.0;
  for (int64_t i = 0; i < n; ++i) sum_sq += static_cast<double>(x[i]) * x[i];
  const float scale = static_cast<float>(1.0 / std::sqrt(sum_sq + eps));
  for (int64_t i = 0; i < n; ++i) x[i] *= scale;
}

void Softmax(float* x, int64_t n) {
  if (n <= 0) return;
  const float max = *std::max_element(x, x + n);
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - max);
    sum += x[i];
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

float Dot(const float* a, const float* b, int64_t n) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(a[i]) * b[i];
  return static_cast<float>(sum);
}

void RopeNeox(float* x, int64_t rot, double theta, int64_t pos) {
  const int64_t half = rot / 2;
  for (int64_t i = 0; i < half; ++i) {
    const double angle =
        static_cast<double>(pos) * std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(rot));
    const double c = std::cos(angle);
    const double s = std::sin(angle);
    const double a = x[i];
    const double b = x[i + half];
    x[i] = static_cast<float>(a * c - b * s);
    x[i + half] = static_cast<float>(a * s + b * c);
  }
}

}  // namespace tandem
