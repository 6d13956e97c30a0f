// Helpers of the fused one-token MoE kernel tests (expert_decode_fused_test.cc,
// expert_decode_fused_predict_test.cc): the kernel's arguments in the fast mode's forms, a Q8_0
// shared expert computed inside the kernel, and the 80B-shaped experts of the probe tests.
#ifndef TANDEM_TESTS_GPU_MOE_EXPERT_DECODE_FUSED_CASE_H_
#define TANDEM_TESTS_GPU_MOE_EXPERT_DECODE_FUSED_CASE_H_

#include <cstdint>
#include <random>
#include <vector>

#include "common/reference/moe.h"
#include "gpu_service/backends/cuda/device_buffer.h"
#include "gpu_service/backends/cuda/moe/expert_decode_fused.cuh"
#include "tests/gpu_moe/one_token_support.h"
#include "tests/gpu_moe/test_support.h"

namespace tandem::cuda::fused_testing {

using one_token_testing::OneTokenExperts;
using one_token_testing::OneTokenStep;
using one_token_testing::Shared;

// The fused kernel's arguments for a step: the fast mode's forms, y zeroed first (it accumulates).
inline OneTokenMoeArgs FusedArgs(OneTokenStep& step, const OneTokenExperts& ex, int K, Shared sh, bool x_early) {
  OneTokenMoeArgs a = step.Args(ex, K, sh);
  a.int16_activations = true;
  a.logit_route = true;
  a.x_written_earlier = x_early;
  EXPECT_EQ(cudaMemset(step.y.get(), 0, static_cast<size_t>(ex.h) * sizeof(float)), cudaSuccess);
  return a;
}

// A Q8_0 shared expert {h, inner} / {inner, h} on the device and its CPU output for one x.
struct SharedQ8 {
  SharedQ8(std::mt19937& rng, int64_t h, int64_t inner_) : inner(inner_) {
    gate = testing::RandomMatrix(rng, WeightType::kQ8_0, h, inner, 0.05f);
    up = testing::RandomMatrix(rng, WeightType::kQ8_0, h, inner, 0.05f);
    down = testing::RandomMatrix(rng, WeightType::kQ8_0, inner, h, 0.05f);
    dgate = testing::Upload(gate);
    dup = testing::Upload(up);
    ddown = testing::Upload(down);
    where = FusedSharedExpert{dgate.get(), dup.get(), ddown.get(), static_cast<int>(inner)};
  }
  std::vector<float> Reference(int64_t h, const std::vector<float>& x) const {
    std::vector<float> out(static_cast<size_t>(h));
    FfnForward(testing::HostMatrix(WeightType::kQ8_0, gate, h, inner), testing::HostMatrix(WeightType::kQ8_0, up, h, inner),
               testing::HostMatrix(WeightType::kQ8_0, down, inner, h), x.data(), 1, out.data(), nullptr);
    return out;
  }
  int64_t inner;
  std::vector<uint8_t> gate, up, down;
  DeviceBuffer dgate, dup, ddown;
  FusedSharedExpert where;
};

// The probe tests' model: the 80B shape's experts (`sets` weight sets, expert e the set e % sets;
// K by default) and its Q8_0 shared expert.
struct EightyBExperts {
  static constexpr int64_t kH = 2048, kI = 512, kE = 512;
  static constexpr int kK = 10;
  explicit EightyBExperts(std::mt19937& rng, int64_t sets = kK) : ex(rng, kH, kI, kE, sets), sq(rng, kH, 512) {}
  OneTokenExperts ex;
  SharedQ8 sq;
};

}  // namespace tandem::cuda::fused_testing

#endif  // TANDEM_TESTS_GPU_MOE_EXPERT_DECODE_FUSED_CASE_H_
