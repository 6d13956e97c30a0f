// The stream norm writing the streamed expert kernels' f16 input rows (NormMmqOut::x16, h/normf16)
// against the path it replaces: the norm, then LaunchConvertToF16 over its f32 output (what
// ExpertPrefillRunner::RunDeviceTiles launched before). Bit for bit: the f16 rows, the f32 rows,
// the injected H, the products' f16 rows and the folded MMQ planes when written alongside.
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/weights/half.h"
#include "gpu_service/backends/cuda/kernels/norm_streams.cuh"
#include "gpu_service/backends/cuda/moe/expert_prefill.cuh"
#include "gpu_service/backends/cuda/moe/expert_prefill.h"
#include "gpu_service/backends/cuda/moe/expert_prefill_mmq.cuh"
#include "tests/gpu_moe/test_support.h"
#include "tests/test_seed.h"

namespace tandem::cuda {
namespace {

using testing::Download;
using testing::LaunchReadNorm;
using testing::PoisonedBuffer;
using testing::Upload;

// Every launch form the layer loop's FFN read takes (LaunchInjectRmsNorm; LaunchInjectRmsNormF16
// with 1 or 3 copies), with and without the pending inject, with and without the folded MMQ
// planes, over the register kernels (h 256, 768, 2048), the two-pass kernel (h 5120; 4100 inject
// rows of h 2048) and an h the MMQ planes refuse (260: x16 alone).
TEST(NormMoeInputTest, NormWrittenF16RowsAreTheConvertedRows) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng = ::tandem::testing::SeededRng();
  struct Case {
    int64_t n, h;
    int copies;  // 0: LaunchInjectRmsNorm, else LaunchInjectRmsNormF16
    bool inject, mmq;
  };
  for (const Case& c : {Case{37, 2048, 3, true, false}, Case{37, 2048, 3, true, true}, Case{37, 2048, 0, true, false},
                        Case{5, 768, 1, false, true}, Case{5, 256, 0, false, false}, Case{3, 260, 0, true, false},
                        Case{9, 5120, 3, true, true}, Case{4100, 2048, 3, true, false},
                        Case{4100, 2048, 0, true, true}}) {
    const int64_t n = c.n, h = c.h;
    const std::vector<float> H0 = testing::RandomVector(rng, n * h, 2.0f);
    const std::vector<float> y = testing::RandomVector(rng, n * h);
    const std::vector<float> gamma = testing::UniformVector(rng, h, 0.5f, 1.5f);
    DeviceBuffer dy = Upload(y), dg = Upload(gamma);
    std::vector<float> N[2], Hs[2];
    std::vector<uint16_t> x16[2], rows[2];
    std::vector<uint8_t> planes[2];
    for (int fold = 0; fold < 2; ++fold) {  // 0: norm, then LaunchConvertToF16; 1: NormMmqOut::x16
      DeviceBuffer dH = Upload(H0);
      DeviceBuffer dN = PoisonedBuffer(static_cast<size_t>(n * h) * sizeof(float));
      DeviceBuffer d16 = PoisonedBuffer(static_cast<size_t>(n * 3 * h) * sizeof(uint16_t));
      DeviceBuffer dx16 = PoisonedBuffer(static_cast<size_t>(n * h) * sizeof(uint16_t));
      DeviceBuffer dq = PoisonedBuffer(c.mmq ? MmqActivationBytes(n, static_cast<int>(h)) : 8);
      NormMmqOut out;
      if (c.mmq) {
        const MmqActivations q = MmqActivationPlanes(dq.get(), n, static_cast<int>(h));
        out = NormMmqOut{q.hi, q.lo, q.scale, q.sumx};
      }
      if (fold == 1) out.x16 = dx16.as<uint16_t>();
      const NormMmqOut* qp = (c.mmq || fold == 1) ? &out : nullptr;
      const float* yp = c.inject ? dy.as<float>() : nullptr;
      ASSERT_EQ(
          LaunchReadNorm(dH.as<float>(), n, h, yp, dg.as<float>(), dN.as<float>(), c.copies, d16.as<uint16_t>(), qp),
          cudaSuccess);
      if (fold == 0) {
        ASSERT_EQ(LaunchConvertToF16(dN.as<float>(), n * h, dx16.as<uint16_t>(), nullptr), cudaSuccess);
      }
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      N[fold] = Download<float>(dN.get(), static_cast<size_t>(n * h));
      Hs[fold] = Download<float>(dH.get(), static_cast<size_t>(n * h));
      x16[fold] = Download<uint16_t>(dx16.get(), static_cast<size_t>(n * h));
      if (c.copies != 0) rows[fold] = Download<uint16_t>(d16.get(), static_cast<size_t>(n * c.copies * h));
      if (c.mmq) planes[fold] = Download<uint8_t>(dq.get(), MmqActivationBytes(n, static_cast<int>(h)));
    }
    const std::string where = "n=" + std::to_string(n) + " h=" + std::to_string(h) + " copies=" +
                              std::to_string(c.copies) + " inject=" + std::to_string(c.inject) +
                              " mmq=" + std::to_string(c.mmq);
    ASSERT_TRUE(testing::AllFinite(N[0])) << where;
    EXPECT_EQ(std::memcmp(N[0].data(), N[1].data(), N[0].size() * sizeof(float)), 0) << where;
    EXPECT_EQ(std::memcmp(Hs[0].data(), Hs[1].data(), Hs[0].size() * sizeof(float)), 0) << where;
    EXPECT_EQ(x16[0], x16[1]) << where;
    EXPECT_EQ(rows[0], rows[1]) << where;
    EXPECT_EQ(planes[0], planes[1]) << where;
    // The rows hold the f32 rows rounded to f16 (the host's round to nearest even; not a poisoned
    // buffer left as it was).
    int64_t off = 0;
    for (size_t i = 0; i < N[0].size(); ++i) off += x16[1][i] != Fp32ToFp16(N[0][i]);
    EXPECT_EQ(off, 0) << where;
  }
  // Refused: x16 with streams (S > 1), x16 not 8-byte aligned.
  DeviceBuffer H = PoisonedBuffer(2 * 512 * sizeof(float)), N = PoisonedBuffer(2 * 512 * sizeof(float));
  DeviceBuffer g = PoisonedBuffer(2 * 512 * sizeof(float)), r = PoisonedBuffer(2 * 512 * sizeof(uint16_t) + 8);
  NormMmqOut out;
  out.x16 = r.as<uint16_t>();
  EXPECT_EQ(LaunchInjectRmsNorm(H.as<float>(), 1, 2, 256, nullptr, nullptr, g.as<float>(), 1e-6f, N.as<float>(), nullptr,
                                &out),
            cudaErrorInvalidValue);
  out.x16 = r.as<uint16_t>() + 2;
  EXPECT_EQ(LaunchInjectRmsNorm(H.as<float>(), 2, 1, 256, nullptr, nullptr, g.as<float>(), 1e-6f, N.as<float>(), nullptr,
                                &out),
            cudaErrorInvalidValue);
}

// Where the runner says a device-planned call reads the f16 rows (StreamedF16Input): the calls that
// take the streamed kernels, never the MMQ ones (those name their planes), never past its sizes.
// The shapes and sizes of prefill_switch_test's StreamedInputTest: tiny-q3n (h 256, I 256, E 16,
// K 4) at 160 and 65 tokens, small (h 1024, I 512, E 64, K 8) at 160 (streamed) and 65 (mean 8.1
// rows per expert: the small-group choice, MMQ or the host plan).
TEST(NormMoeInputTest, RunnerNamesItsF16RowsOnlyForStreamedCalls) {
  TANDEM_SKIP_WITHOUT_GPU();
  struct Case {
    int64_t h, inner, E, K, tokens;
    bool streamed;
  };
  for (const Case& c : {Case{256, 256, 16, 4, 160, true}, Case{256, 256, 16, 4, 65, true},
                        Case{1024, 512, 64, 8, 160, true}, Case{1024, 512, 64, 8, 65, false}}) {
    const std::string where = "h=" + std::to_string(c.h) + " tokens=" + std::to_string(c.tokens);
    const int64_t slots = c.tokens * c.K;
    absl::StatusOr<ExpertPrefillRunner> r =
        ExpertPrefillRunner::Create({WeightType::kQ4_K, WeightType::kQ4_K, c.h, c.inner}, slots);
    ASSERT_TRUE(r.ok()) << r.status();
    uint16_t* rows = r->StreamedF16Input(c.tokens, slots, c.E);
    EXPECT_EQ(rows != nullptr, c.streamed) << where;
    if (rows != nullptr) {
      EXPECT_FALSE(r->MmqInputPlanes(c.tokens, slots, c.E).has_value()) << where;
      EXPECT_EQ(reinterpret_cast<uintptr_t>(rows) % 8, 0u) << where;
    }
    EXPECT_EQ(r->StreamedF16Input(slots + 1, slots, c.E), nullptr) << where;  // more rows than it holds
    EXPECT_EQ(r->StreamedF16Input(c.tokens, slots + 1, c.E), nullptr) << where;
  }
  // A shape off the streamed kernels (Q6_K down) has no device-planned call at all.
  absl::StatusOr<ExpertPrefillRunner> r =
      ExpertPrefillRunner::Create({WeightType::kQ4_K, WeightType::kQ6_K, 256, 256}, 640);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->StreamedF16Input(160, 640, 16), nullptr);
}

}  // namespace
}  // namespace tandem::cuda
