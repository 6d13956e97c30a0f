// The prefill expert path (bf16 dequantization + cuBLAS GEMMs) against the reference FFN.
#include "gpu_service/backends/cuda/moe/expert_prefill.h"

#include <cmath>

#include "common/reference/moe.h"
#include "common/weights/half.h"
#include "gpu_service/backends/cuda/moe/expert_prefill.cuh"
#include "tests/gpu_moe/test_support.h"

namespace tandem::cuda {
namespace {

using testing::Download;
using testing::PoisonedBuffer;
using testing::RandomMatrix;
using testing::Upload;

// The bf16 dequantizer returns DequantizeRow's values rounded to bf16.
TEST(DequantizeToBf16Test, MatchesReferenceRounded) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(std::random_device{}());
  for (WeightType type : {WeightType::kQ2_K, WeightType::kQ3_K, WeightType::kQ4_K, WeightType::kQ5_K, WeightType::kQ6_K,
                          WeightType::kQ8_0, WeightType::kQ4_0, WeightType::kF16, WeightType::kF32}) {
    const int64_t cols = 512, rows = 5;
    const std::vector<uint8_t> w = RandomMatrix(rng, type, cols, rows, 1.0f);
    DeviceBuffer dw = Upload(w);
    DeviceBuffer out = PoisonedBuffer(static_cast<size_t>(cols * rows) * 2);
    ASSERT_EQ(LaunchDequantizeToBf16(static_cast<uint32_t>(type), dw.get(), cols, rows, out.as<uint16_t>(), nullptr),
              cudaSuccess);
    const std::vector<uint16_t> got = Download<uint16_t>(out.get(), static_cast<size_t>(cols * rows));
    std::vector<float> ref(static_cast<size_t>(cols));
    const int64_t row_bytes = *RowBytes(type, cols);
    int64_t mismatches = 0;
    for (int64_t r = 0; r < rows; ++r) {
      DequantizeRow(type, w.data() + r * row_bytes, ref.data(), cols);
      for (int64_t c = 0; c < cols; ++c) {
        // One bf16 ulp of slack: the device may fuse the dequantizer's final multiply-add.
        const float g = Bf16ToFp32(got[r * cols + c]);
        if (std::fabs(g - ref[c]) > std::fabs(ref[c]) * (1.0f / 128) + 1e-30f) ++mismatches;
      }
    }
    EXPECT_EQ(mismatches, 0) << "type " << static_cast<int>(type);
  }
}

TEST(ExpertPrefillTest, MatchesReferenceFfnWithinBf16Tolerance) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(std::random_device{}());
  const int64_t h = 512, I = 256, E = 5, K = 3, n = 40;
  const WeightType gu_type = WeightType::kQ4_K, d_type = WeightType::kQ6_K;
  std::vector<std::vector<uint8_t>> gate(E), up(E), down(E);
  std::vector<DeviceBuffer> dg, du, dd;
  for (int64_t e = 0; e < E; ++e) {
    gate[e] = RandomMatrix(rng, gu_type, h, I, 0.05f);
    up[e] = RandomMatrix(rng, gu_type, h, I, 0.05f);
    down[e] = RandomMatrix(rng, d_type, I, h, 0.05f);
    dg.push_back(Upload(gate[e]));
    du.push_back(Upload(up[e]));
    dd.push_back(Upload(down[e]));
  }
  std::vector<int32_t> picks;
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t k = 0; k < K; ++k) picks.push_back(static_cast<int32_t>((t + 2 * k) % E));
  }
  const std::vector<float> x = testing::RandomVector(rng, n * h);
  DeviceBuffer dx = Upload(x);
  absl::StatusOr<MoeStepPlan> plan = PlanMoeStep(picks, n, K, E, [&](int32_t e) -> std::optional<ExpertLocation> {
    return ExpertLocation{dg[e].get(), du[e].get(), dd[e].get()};
  });
  ASSERT_TRUE(plan.ok()) << plan.status();
  absl::StatusOr<ExpertPrefillRunner> runner = ExpertPrefillRunner::Create({gu_type, d_type, h, I}, n * K);
  ASSERT_TRUE(runner.ok()) << runner.status();
  DeviceBuffer partial = PoisonedBuffer(static_cast<size_t>(n * K * h) * sizeof(float));
  const absl::Status s = runner->Run(plan->units, dx.as<float>(), partial.as<float>(), nullptr);
  ASSERT_TRUE(s.ok()) << s;
  const std::vector<float> got = Download<float>(partial.get(), static_cast<size_t>(n * K * h));
  std::vector<float> ref(got.size());
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t k = 0; k < K; ++k) {
      const int32_t e = picks[t * K + k];
      FfnForward(testing::HostMatrix(gu_type, gate[e], h, I), testing::HostMatrix(gu_type, up[e], h, I),
                 testing::HostMatrix(d_type, down[e], I, h), x.data() + t * h, 1,
                 ref.data() + plan->slot[t * K + k] * h, nullptr);
    }
  }
  ASSERT_TRUE(testing::AllFinite(got)) << "unwritten partial rows";
  EXPECT_LE(testing::RelativeL2(got, ref), 1e-2);
}

}  // namespace
}  // namespace tandem::cuda
