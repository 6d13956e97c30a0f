// The prefill path's integer-MMA kernels (kMmq*, expert_prefill_mmq*.cu) against the reference FFN
// and each other, and their activation quantization (alone and folded into the norm).
#include "gpu_service/backends/cuda/moe/expert_prefill.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <random>
#include <string>

#include "gpu_service/backends/cuda/kernels/norm_streams.cuh"
#include "gpu_service/backends/cuda/moe/expert_prefill.cuh"
#include "gpu_service/backends/cuda/moe/expert_prefill_mmq.cuh"
#include "gpu_service/backends/cuda/weight_type_ids.h"
#include "tests/gpu_moe/prefill_check.h"
#include "tests/gpu_moe/test_support.h"
#include "tests/test_seed.h"

namespace tandem::cuda {
namespace {

using testing::Download;
using testing::ExpectMatchesReference;
using testing::LaunchReadNorm;
using testing::PoisonedBuffer;
using testing::Upload;

// The integer-MMA kernel (kMmq) on ragged groups: one expert per token (K = 1), expert e taking
// from 0 to 70 tokens (empty experts, groups of 1, 8, 9, 16, 17, 32, 33 and 70 rows: one to three
// n8 blocks of a 16-row tile, several tiles a group at both bounds), tokens in shuffled order (the
// gather through the slot index). Shapes: the 80B model's h 2048 / I 512 (gate/up K = 2048, eight
// super-blocks a row; down K = 512) and a small odd one, h 768 / I 256 (three super-blocks; one
// down super-block a row; 3 units of 256 down rows). Bound 2e-3 relative L2 (two int8 terms).
TEST(ExpertPrefillTest, MmqRaggedGroupsMatchReference) {
  TANDEM_SKIP_WITHOUT_GPU();
  const std::vector<PrefillOptions> options = {{PrefillAlgorithm::kGroupedTiles, 0, 0, PrefillKernel::kMmq},
                                               {PrefillAlgorithm::kGroupedTiles, 16, 0, PrefillKernel::kMmq},
                                               {PrefillAlgorithm::kGroupedTiles, 32, 0, PrefillKernel::kMmq},
                                               {PrefillAlgorithm::kGroupedTiles, 16, 0, PrefillKernel::kMmqWarps16},
                                               {PrefillAlgorithm::kGroupedTiles, 16, 0, PrefillKernel::kMmqLean},
                                               {PrefillAlgorithm::kGroupedTiles, 16, 0, PrefillKernel::kMmqLeanWarps8},
                                               {PrefillAlgorithm::kGroupedTiles, 16, 0, PrefillKernel::kMmqWarps4},
                                               {PrefillAlgorithm::kGroupedTiles, 0, 0, PrefillKernel::kMmqF32Min},
                                               {PrefillAlgorithm::kGroupedTiles, 0, 0, PrefillKernel::kMmqL2Prefetch},
                                               {PrefillAlgorithm::kGroupedTiles, 32, 0, PrefillKernel::kMmqF32Min},
                                               {PrefillAlgorithm::kGroupedTiles, 0, 0}};
  const std::vector<int> model_counts = {1, 0, 8, 9, 16, 17, 70, 0, 32, 33, 2, 24, 0, 41, 5, 63};
  int n = 0;
  for (int k : model_counts) n += k;
  ExpectMatchesReference({WeightType::kQ4_K, WeightType::kQ4_K, 2048, 512, static_cast<int64_t>(model_counts.size()), 1, n},
                         options, 0, false, model_counts);
  std::vector<int> odd_counts;
  n = 0;
  for (int e = 0; e < 24; ++e) {
    odd_counts.push_back(e % 7 == 3 ? 0 : 1 + (e * 37) % 70);
    n += odd_counts.back();
  }
  ExpectMatchesReference({WeightType::kQ4_K, WeightType::kQ4_K, 768, 256, 24, 1, n}, options, 0, false, odd_counts);
}

// The 512-token regime on the model shapes through the usual top-k routing (10 rows per expert):
// kMmq at its chosen bound, kMmqWarps16 and kMmqLean (kMmqLean2, the default there, is held to its bits below) beside the streamed kernels.
TEST(ExpertPrefillTest, MmqModelShapesMatchReference) {
  TANDEM_SKIP_WITHOUT_GPU();
  ExpectMatchesReference({WeightType::kQ4_K, WeightType::kQ4_K, 2048, 512, 24, 4, 60},
                         {{PrefillAlgorithm::kGroupedTiles, 0, 0, PrefillKernel::kMmq},
                          {PrefillAlgorithm::kGroupedTiles, 16, 0, PrefillKernel::kMmqWarps16},
                          {PrefillAlgorithm::kGroupedTiles, 16, 0, PrefillKernel::kMmqLean},
                          {PrefillAlgorithm::kGroupedTiles, 0, 0, PrefillKernel::kStreamed}});
}

// kMmqLean2 (expert_prefill_mmq_lean2.cu, the default for small groups) against kMmqLean: the
// same integer sums and f32 order, so the outputs must be bit-identical (same_bits; both also within
// the MMQ bound of the reference, and the device-planned calls equal to the host-planned ones), on
// every path of its launcher: the 80B shapes (gate/up K = 2048 compiled in, single-buffered; down
// K = 512 compiled in, double-buffered) on ragged groups, on many small tiles and on top-k routing;
// h 768 / I 256 (K from the argument, double-buffered both
// ways); h 1280 / I 1280 (K from the argument, single-buffered both ways: two 1280-wide tiles do
// not fit beside the ring).
TEST(ExpertPrefillTest, MmqLean2BitIdenticalToLean) {
  TANDEM_SKIP_WITHOUT_GPU();
  const std::vector<PrefillOptions> options = {{PrefillAlgorithm::kGroupedTiles, 16, 0, PrefillKernel::kMmqLean},
                                               {PrefillAlgorithm::kGroupedTiles, 16, 0, PrefillKernel::kMmqLean2}};
  // Ragged groups, the 80B shapes (one expert a token: 0 to 70 rows an expert).
  const std::vector<int> model_counts = {1, 0, 8, 9, 16, 17, 70, 0, 32, 33, 2, 24, 0, 41, 5, 63};
  int n = 0;
  for (int k : model_counts) n += k;
  ExpectMatchesReference({WeightType::kQ4_K, WeightType::kQ4_K, 2048, 512, static_cast<int64_t>(model_counts.size()), 1, n},
                         options, 0, false, model_counts, 2e-3, /*same_bits=*/true);
  // Many small tiles at the 80B shapes: 600 experts (8 weight sets) taking 0 to 3 tokens each: ~450
  // tiles, ~1800 gate/up and ~3600 down units, so every block of the persistent grid (one an SM)
  // switches tiles several times (the buffers alternate, the descriptor read ahead crosses tiles).
  std::vector<int> many_counts;
  n = 0;
  for (int e = 0; e < 600; ++e) {
    many_counts.push_back((e * 7) % 4);
    n += many_counts.back();
  }
  ExpectMatchesReference({WeightType::kQ4_K, WeightType::kQ4_K, 2048, 512, 600, 1, n}, options, 0, false, many_counts,
                         2e-3, /*same_bits=*/true, /*weight_sets=*/8);
  // Top-k routing at the 80B shapes (10 experts a token, tiles of 16 slots and partial ones).
  ExpectMatchesReference({WeightType::kQ4_K, WeightType::kQ4_K, 2048, 512, 48, 10, 120}, options, 0, false, {}, 2e-3,
                         /*same_bits=*/true);
  // K from the argument: double-buffered (768 / 256) and single-buffered (1280 / 1280) kernels.
  std::vector<int> odd_counts;
  n = 0;
  for (int e = 0; e < 24; ++e) {
    odd_counts.push_back(e % 7 == 3 ? 0 : 1 + (e * 37) % 70);
    n += odd_counts.back();
  }
  ExpectMatchesReference({WeightType::kQ4_K, WeightType::kQ4_K, 768, 256, 24, 1, n}, options, 0, false,
                         odd_counts, 2e-3, /*same_bits=*/true);
  n = 0;
  for (int k : model_counts) n += k;
  ExpectMatchesReference({WeightType::kQ4_K, WeightType::kQ4_K, 1280, 1280, static_cast<int64_t>(model_counts.size()), 1, n},
                         options, 0, false, model_counts, 2e-3, /*same_bits=*/true, /*weight_sets=*/4);
}

// The quantizer: every element within max|x| / 16256 of s · (hi + lo / 64) of its 256-block, and
// sumx the sums of 32.
TEST(ExpertPrefillTest, MmqQuantizeRoundTrips) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng = ::tandem::testing::SeededRng();
  const int64_t rows = 7;
  const int K = 768;
  std::vector<float> x = testing::RandomVector(rng, rows * K);
  for (int i = 0; i < 256; ++i) x[static_cast<size_t>(K + i)] = 0.0f;  // an all-zero block
  x[5] = 40.0f;                                                        // an outlier
  DeviceBuffer dx = Upload(x);
  DeviceBuffer q = PoisonedBuffer(MmqActivationBytes(rows, K));
  const MmqActivations planes = MmqActivationPlanes(q.get(), rows, K);
  ASSERT_EQ(LaunchMmqQuantize(dx.as<float>(), rows, K, planes, nullptr), cudaSuccess);
  const std::vector<int8_t> hi = Download<int8_t>(planes.hi, static_cast<size_t>(rows * K));
  const std::vector<int8_t> lo = Download<int8_t>(planes.lo, static_cast<size_t>(rows * K));
  const std::vector<float> scale = Download<float>(planes.scale, static_cast<size_t>(rows * K / 256));
  const std::vector<float> sumx = Download<float>(planes.sumx, static_cast<size_t>(rows * K / 32));
  for (int64_t r = 0; r < rows; ++r) {
    for (int b = 0; b < K / 256; ++b) {
      float amax = 0.0f;
      for (int i = 0; i < 256; ++i) amax = std::max(amax, std::fabs(x[r * K + b * 256 + i]));
      const float s = scale[r * (K / 256) + b];
      EXPECT_NEAR(s, amax / 127.0f, amax * 1e-6f);
      for (int i = 0; i < 256; ++i) {
        const int64_t k = r * K + b * 256 + i;
        const float back = s * (static_cast<float>(hi[k]) + static_cast<float>(lo[k]) / 64.0f);
        EXPECT_LE(std::fabs(back - x[k]), amax / 16000.0f + 1e-30f) << "row " << r << " element " << b * 256 + i;
      }
    }
    for (int j = 0; j < K / 32; ++j) {
      double sum = 0;
      for (int i = 0; i < 32; ++i) sum += x[r * K + j * 32 + i];
      EXPECT_NEAR(sumx[r * (K / 32) + j], sum, 1e-4 * (1 + std::fabs(sum)));
    }
  }
}

// The stream norm's folded quantization (NormMmqOut): the same planes, bit for bit, as the norm
// followed by LaunchMmqQuantize over its output, and the same f32 (and f16) rows as without it;
// the register kernels (h 2048, 768), the two-pass kernel (h 5120; 4100 inject rows at h 2048).
TEST(ExpertPrefillTest, MmqQuantizeFoldedIntoNormIsBitIdentical) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng = ::tandem::testing::SeededRng();
  struct Case {
    int64_t n, h;
    int copies;  // 0: LaunchInjectRmsNorm, else LaunchInjectRmsNormF16
    bool inject;
  };
  for (const Case& c : {Case{37, 2048, 3, true}, Case{37, 2048, 0, true}, Case{5, 768, 1, false},
                        Case{9, 5120, 3, true}, Case{4100, 2048, 3, true}}) {
    const int64_t n = c.n, h = c.h;
    const std::vector<float> H0 = testing::RandomVector(rng, n * h);
    std::vector<float> y = testing::RandomVector(rng, n * h);
    y[3] = 0.0f;
    const std::vector<float> gamma = testing::UniformVector(rng, h, 0.5f, 1.5f);
    DeviceBuffer dy = Upload(y), dg = Upload(gamma);
    std::vector<float> N[2];
    std::vector<uint8_t> planes[2], f16[2];
    for (int fold = 0; fold < 2; ++fold) {
      DeviceBuffer dH = Upload(H0);
      DeviceBuffer dN = PoisonedBuffer(static_cast<size_t>(n * h) * sizeof(float));
      DeviceBuffer d16 = PoisonedBuffer(static_cast<size_t>(n * 3 * h) * sizeof(uint16_t));
      DeviceBuffer dq = PoisonedBuffer(MmqActivationBytes(n, static_cast<int>(h)));
      const MmqActivations q = MmqActivationPlanes(dq.get(), n, static_cast<int>(h));
      const NormMmqOut out{q.hi, q.lo, q.scale, q.sumx};
      const NormMmqOut* qp = fold == 1 ? &out : nullptr;
      const float* yp = c.inject ? dy.as<float>() : nullptr;
      ASSERT_EQ(
          LaunchReadNorm(dH.as<float>(), n, h, yp, dg.as<float>(), dN.as<float>(), c.copies, d16.as<uint16_t>(), qp),
          cudaSuccess);
      if (fold == 0) {
        ASSERT_EQ(LaunchMmqQuantize(dN.as<float>(), n, static_cast<int>(h), q, nullptr), cudaSuccess);
      }
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      N[fold] = Download<float>(dN.get(), static_cast<size_t>(n * h));
      planes[fold] = Download<uint8_t>(dq.get(), MmqActivationBytes(n, static_cast<int>(h)));
      if (c.copies != 0) f16[fold] = Download<uint8_t>(d16.get(), static_cast<size_t>(n * c.copies * h) * 2);
    }
    const std::string where = "n=" + std::to_string(n) + " h=" + std::to_string(h) + " copies=" + std::to_string(c.copies);
    ASSERT_TRUE(testing::AllFinite(N[0])) << where;
    EXPECT_EQ(std::memcmp(N[0].data(), N[1].data(), N[0].size() * sizeof(float)), 0) << where;
    EXPECT_EQ(planes[0], planes[1]) << where;
    EXPECT_EQ(f16[0], f16[1]) << where;
  }
  // Refused: streams (S > 1) and h not a multiple of 256.
  DeviceBuffer H = PoisonedBuffer(2 * 512 * sizeof(float)), N = PoisonedBuffer(2 * 512 * sizeof(float));
  DeviceBuffer g = PoisonedBuffer(2 * 512 * sizeof(float)), dq = PoisonedBuffer(MmqActivationBytes(2, 512));
  const MmqActivations q = MmqActivationPlanes(dq.get(), 2, 512);
  const NormMmqOut out{q.hi, q.lo, q.scale, q.sumx};
  EXPECT_EQ(LaunchInjectRmsNorm(H.as<float>(), 1, 2, 256, nullptr, nullptr, g.as<float>(), 1e-6f, N.as<float>(), nullptr,
                                &out),
            cudaErrorInvalidValue);
  EXPECT_EQ(LaunchInjectRmsNorm(H.as<float>(), 2, 1, 320, nullptr, nullptr, g.as<float>(), 1e-6f, N.as<float>(), nullptr,
                                &out),
            cudaErrorInvalidValue);
}

}  // namespace
}  // namespace tandem::cuda
