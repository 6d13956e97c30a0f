// Random expert tensors in any weight type, built in memory for the kernel tests.
#ifndef TANDEM_TESTS_EXPERT_KERNELS_RANDOM_EXPERTS_H_
#define TANDEM_TESTS_EXPERT_KERNELS_RANDOM_EXPERTS_H_

#include <cstdint>
#include <random>
#include <vector>

#include "common/reference/weight_view.h"
#include "common/weights/weight_types.h"

namespace tandem {

// One {cols, rows, experts} tensor quantized from N(0, scale^2) values.
struct RandomExpertTensor {
  std::vector<uint8_t> bytes;
  ExpertMatrixView view;
};

inline RandomExpertTensor MakeRandomExpertTensor(WeightType type, int64_t cols, int64_t rows,
                                                 int64_t experts, float scale, uint32_t seed) {
  RandomExpertTensor t;
  const int64_t row_bytes = *RowBytes(type, cols);
  t.bytes.resize(static_cast<size_t>(row_bytes * rows * experts));
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> row(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows * experts; ++r) {
    for (float& v : row) v = normal(rng);
    QuantizeRow(type, row.data(), t.bytes.data() + r * row_bytes, cols);
  }
  t.view = ExpertMatrixView{type, t.bytes.data(), cols, rows, experts, row_bytes};
  return t;
}

inline std::vector<float> RandomActivations(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n));
  for (float& v : x) v = normal(rng);
  return x;
}

}  // namespace tandem

#endif  // TANDEM_TESTS_EXPERT_KERNELS_RANDOM_EXPERTS_H_
