// The prefill path's WGMMA kernels (kWgmma, expert_prefill_wgexp.cu; kWgmmaWs, expert_prefill_wgws.cu)
// against the reference FFN and the streamed kernel, their switch and their scope.
#include "gpu_service/backends/cuda/moe/expert_prefill.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <random>
#include <string>

#include "common/weights/half.h"
#include "gpu_service/backends/cuda/moe/expert_prefill.cuh"
#include "gpu_service/backends/cuda/moe/expert_prefill_wgexp.cuh"
#include "gpu_service/backends/cuda/weight_type_ids.h"
#include "tests/gpu_moe/prefill_check.h"
#include "tests/gpu_moe/test_support.h"
#include "tests/test_seed.h"

namespace tandem::cuda {
namespace {

using testing::Download;
using testing::ExpectMatchesReference;
using testing::PoisonedBuffer;
using testing::RandomMatrix;
using testing::Upload;

// The weights-as-A wgmma kernels (kWgmma, expert_prefill_wgexp.cu, at its chosen bound and at 64;
// kWgmmaWs, expert_prefill_wgws.cu, at its chosen bound and at 32) against the CPU reference and
// against kStreamed (the first option: the same f16 weights and activations, so the two differ
// only in f32 summation order and the f16 rounding of SiLU·up it moves: relative L2 within 2e-3 of
// each other, the reference's 1e-2 each), beside kStreamedAuto (which takes WgmmaAutoKernel(),
// kWgmmaWs by default, where the groups average >= kWgmmaMinMeanRows rows on an sm_90 device,
// unless TANDEM_PREFILL_WGMMA=0).
// Every runner also runs device-planned (the device tile builder at 256 and the device tile count;
// bits equal to the host-planned call for the fixed kernels):
//  - uneven groups (expert e drawn with weight 2e + 1: 1 to ~120 rows, tiles of every N share a
//    launch, 20+ units a block); h 512 / I 256 (gate/up 8 k-stages, down 4) and h 768 (three
//    super-blocks; 2·I = 512: four gate/up units);
//  - tiles of 1, 7, 64, 160, 256 rows and a split group (300 rows: 256 + 44), one expert a token
//    in shuffled order (the gather through the slot index), N = 32, 32, 64, 160, 256, 64;
//  - groups > 256 rows (~400 rows an expert: tiles of 256 and a remainder);
//  - the 80B shapes (h 2048, I 512: gate/up 32 k-stages, down 8), 160 rows an expert as at 8192
//    tokens (320 tokens to keep the CPU reference short).
TEST(ExpertPrefillTest, WgmmaKernelMatchesReferenceAndStreamed) {
  TANDEM_SKIP_WITHOUT_GPU();
  const std::vector<PrefillOptions> options = {{PrefillAlgorithm::kGroupedTiles, 0, 0, PrefillKernel::kStreamed},
                                               {PrefillAlgorithm::kGroupedTiles, 0, 0, PrefillKernel::kWgmma},
                                               {PrefillAlgorithm::kGroupedTiles, 64, 0, PrefillKernel::kWgmma},
                                               {PrefillAlgorithm::kGroupedTiles, 0, 0, PrefillKernel::kWgmmaWs},
                                               {PrefillAlgorithm::kGroupedTiles, 32, 0, PrefillKernel::kWgmmaWs},
                                               {PrefillAlgorithm::kGroupedTiles, 0, 0, PrefillKernel::kStreamedAuto}};
  constexpr double kCross = 2e-3;
  ExpectMatchesReference({WeightType::kQ4_K, WeightType::kQ4_K, 512, 256, 40, 4, 400}, options, 0, /*skewed=*/true, {},
                         2e-3, false, 0, kCross);
  ExpectMatchesReference({WeightType::kQ4_K, WeightType::kQ4_K, 768, 256, 12, 3, 90}, options, 0, /*skewed=*/true, {},
                         2e-3, false, 0, kCross);
  const std::vector<int> counts = {1, 7, 64, 160, 256, 0, 300, 33};
  int n = 0;
  for (int k : counts) n += k;
  ExpectMatchesReference({WeightType::kQ4_K, WeightType::kQ4_K, 512, 256, static_cast<int64_t>(counts.size()), 1, n},
                         options, 0, false, counts, 2e-3, false, 0, kCross);
  ExpectMatchesReference({WeightType::kQ4_K, WeightType::kQ4_K, 768, 256, 3, 2, 600}, options, 0, false, {}, 2e-3, false,
                         0, kCross);
  ExpectMatchesReference({WeightType::kQ4_K, WeightType::kQ4_K, 2048, 512, 8, 4, 320}, options, 0, false, {}, 2e-3, false,
                         0, kCross);
}

// kWgmma's and kWgmmaWs's operand layouts, directly (no runner): one down tile whose activation
// rows are one-hot (row m has 1 at k = 4m: with 256 rows every k-stage of K = 1024, four
// super-blocks, is hit), so output (m, n) must be the f16 weight (n, 4m) as LaunchDequantizeToF16
// gives it (to a few f16 ulps: the factors are rounded differently), for N = 256 (two units) and
// tiles of 1, 7, 64, 160, 200 and 256 rows (wgmma N 32, 32, 64, 160, 224, 256). A second tile
// behind it is beyond the device tile count (1): its rows must stay unwritten. On a mismatch it
// prints where the value came from, to tell a swizzle or fragment-layout error from a value error.
TEST(ExpertPrefillTest, WgmmaKernelOneHotProbe) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng = ::tandem::testing::SeededRng();
  const int K = 1024, N = 256;
  const std::vector<uint8_t> w = RandomMatrix(rng, WeightType::kQ4_K, K, N, 1.0f);
  DeviceBuffer dw = Upload(w);
  DeviceBuffer wf = PoisonedBuffer(static_cast<size_t>(K) * N * 2);
  ASSERT_EQ(LaunchDequantizeToF16(kTypeQ4_K, dw.get(), K, N, wf.as<uint16_t>(), nullptr), cudaSuccess);
  const std::vector<uint16_t> wbits = Download<uint16_t>(wf.get(), static_cast<size_t>(K) * N);
  std::vector<float> wv(wbits.size());
  for (size_t i = 0; i < wbits.size(); ++i) wv[i] = Fp16ToFp32(wbits[i]);
  float wmax = 0.0f;
  for (float v : wv) wmax = std::max(wmax, std::fabs(v));
  DeviceBuffer count = Upload(std::vector<int32_t>{1});
  for (int variant = 0; variant < 12; ++variant) {
    const int rows = std::vector<int>{1, 7, 64, 160, 200, 256}[variant % 6];
    const PrefillKernel kernel = variant < 6 ? PrefillKernel::kWgmma : PrefillKernel::kWgmmaWs;
    const char* const which = variant < 6 ? "" : " (warp-specialized)";
    SCOPED_TRACE("tile rows " + std::to_string(rows) + which);
    std::vector<uint16_t> act(static_cast<size_t>(2 * rows) * K, 0);
    for (int m = 0; m < 2 * rows; ++m) act[static_cast<size_t>(m) * K + 4 * (m % rows)] = 0x3C00;  // f16 1.0
    DeviceBuffer da = Upload(act);
    DeviceBuffer dt = Upload(std::vector<PrefillTile>{{nullptr, nullptr, dw.get(), 0, rows},
                                                      {nullptr, nullptr, dw.get(), rows, rows}});
    DeviceBuffer out = PoisonedBuffer(static_cast<size_t>(2 * rows) * N * sizeof(float));
    ASSERT_EQ(LaunchPrefillDown(kernel, kTypeQ4_K, kWgmmaMaxTileRows, dt.as<PrefillTile>(), 2,
                                da.as<uint16_t>(), N, K, out.as<float>(), nullptr, count.as<int>()),
              cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<float> got = Download<float>(out.get(), static_cast<size_t>(2 * rows) * N);
    int bad = 0;
    for (int m = 0; m < rows; ++m) {
      for (int n = 0; n < N; ++n) {
        const float want = wv[static_cast<size_t>(n) * K + 4 * m], g = got[static_cast<size_t>(m) * N + n];
        if (std::fabs(g - want) <= std::fabs(want) * 1e-2f + wmax * 1e-3f) continue;
        if (++bad <= 6) {
          std::string from = "nowhere";
          for (int n2 = 0; n2 < N && from == "nowhere"; ++n2) {
            for (int k2 = 0; k2 < K; ++k2) {
              const float v = wv[static_cast<size_t>(n2) * K + k2];
              if (v != 0.0f && std::fabs(v - g) <= std::fabs(v) * 2e-3f) {
                from = "weight (n " + std::to_string(n2) + ", k " + std::to_string(k2) + ")";
                break;
              }
            }
          }
          std::printf("  wgmma probe rows %d: out (m %d, n %d) = %g, want %g; value found at %s\n", rows, m, n, g, want,
                      from.c_str());
        }
      }
    }
    EXPECT_EQ(bad, 0);
    // The second tile is past the device count: still 0xFF (NaN).
    std::vector<uint32_t> tail(static_cast<size_t>(rows) * N);
    std::memcpy(tail.data(), got.data() + static_cast<size_t>(rows) * N, tail.size() * sizeof(float));
    EXPECT_EQ(std::count(tail.begin(), tail.end(), 0xFFFFFFFFu), static_cast<std::ptrdiff_t>(tail.size()))
        << "a tile past the device tile count was written";
  }
}

// kWgmmaWs (expert_prefill_wgws.cu: a producer warpgroup issues every copy into a 5-slot ring of
// full/empty mbarriers whose stage count runs across units; two consumer warpgroups dequantize,
// MMA and store) against kWgmma: the same f16 operands into the same accumulators in the same k
// order, so bit-identical outputs, host- and device-planned (the device tile count), on kWgmma's
// cases. What each case exercises of the ring:
//  - uneven groups (1 to ~120 rows: tiles of N 32 to 128 alternate in a block, the producer a
//    unit ahead at another N); down K = 256 is 4 k-stages, fewer than the 5 slots, so a unit's
//    stages start at every slot and phase; h 768 (gate/up 12 stages: the ring wraps mid-unit);
//  - tiles of 1, 7, 64, 160, 256 rows and a split group (300 = 256 + 44), one expert a token in
//    shuffled order (the producer's gather through its double-buffered slot index);
//  - groups > 256 rows; the 80B shapes (gate/up 32 k-stages, down 8);
//  - more units than blocks: 600 experts of 0 to 3 tokens (~3600 gate/up and ~7200 down units over
//    one block an SM: the gate/up staging reused between the consumers' named barriers every
//    unit), and top-10 routing of 120 tokens over 48 experts;
//  - a fixed tile bound of 64 (both kernels at 64).
// A hang here (a phase or count error in the mbarriers) is a failure: run it under `timeout`.
TEST(ExpertPrefillTest, WgmmaWsBitIdenticalToWgmma) {
  TANDEM_SKIP_WITHOUT_GPU();
  const std::vector<PrefillOptions> options = {{PrefillAlgorithm::kGroupedTiles, 0, 0, PrefillKernel::kWgmma},
                                               {PrefillAlgorithm::kGroupedTiles, 0, 0, PrefillKernel::kWgmmaWs}};
  ExpectMatchesReference({WeightType::kQ4_K, WeightType::kQ4_K, 512, 256, 40, 4, 400}, options, 0, /*skewed=*/true, {},
                         2e-3, /*same_bits=*/true);
  ExpectMatchesReference({WeightType::kQ4_K, WeightType::kQ4_K, 768, 256, 12, 3, 90}, options, 0, /*skewed=*/true, {},
                         2e-3, /*same_bits=*/true);
  const std::vector<int> counts = {1, 7, 64, 160, 256, 0, 300, 33};
  int n = 0;
  for (int k : counts) n += k;
  ExpectMatchesReference({WeightType::kQ4_K, WeightType::kQ4_K, 512, 256, static_cast<int64_t>(counts.size()), 1, n},
                         options, 0, false, counts, 2e-3, /*same_bits=*/true);
  ExpectMatchesReference({WeightType::kQ4_K, WeightType::kQ4_K, 768, 256, 3, 2, 600}, options, 0, false, {}, 2e-3,
                         /*same_bits=*/true);
  ExpectMatchesReference({WeightType::kQ4_K, WeightType::kQ4_K, 2048, 512, 8, 4, 320}, options, 0, false, {}, 2e-3,
                         /*same_bits=*/true);
  std::vector<int> many_counts;
  int many = 0;
  for (int e = 0; e < 600; ++e) {
    many_counts.push_back((e * 7) % 4);
    many += many_counts.back();
  }
  ExpectMatchesReference({WeightType::kQ4_K, WeightType::kQ4_K, 2048, 512, 600, 1, many}, options, 0, false, many_counts,
                         2e-3, /*same_bits=*/true, /*weight_sets=*/8);
  ExpectMatchesReference({WeightType::kQ4_K, WeightType::kQ4_K, 2048, 512, 48, 10, 120}, options, 0, false, {}, 2e-3,
                         /*same_bits=*/true);
  const std::vector<PrefillOptions> at64 = {{PrefillAlgorithm::kGroupedTiles, 64, 0, PrefillKernel::kWgmma},
                                            {PrefillAlgorithm::kGroupedTiles, 64, 0, PrefillKernel::kWgmmaWs}};
  ExpectMatchesReference({WeightType::kQ4_K, WeightType::kQ4_K, 512, 256, 40, 4, 400}, at64, 0, /*skewed=*/true, {},
                         2e-3, /*same_bits=*/true);
}

// The switch reaches the kernel: TANDEM_PREFILL_WGMMA (read once; unset, or any value but 1, 0
// and "" (4 included): kWgmmaWs, the default; 1: kWgmma; 0 or "": none) sets WgmmaAutoKernel() on
// an sm_90 device, and a kStreamedAuto runner (the server's default options) runs it on large
// groups (128 rows an expert here, >= kWgmmaMinMeanRows unless TANDEM_PREFILL_WGMMA_MIN_ROWS says
// otherwise) both host- and device-planned (ExpertPrefillRunner::last_kernel); with the switch
// off, kStreamed. Run it once per value of the switch (unset, 1, 0).
TEST(ExpertPrefillTest, WgmmaSwitchReachesRunner) {
  TANDEM_SKIP_WITHOUT_GPU();
  int device = 0, major = 0, minor = 0;
  ASSERT_EQ(cudaGetDevice(&device), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device), cudaSuccess);
  const char* v = std::getenv("TANDEM_PREFILL_WGMMA");
  PrefillKernel want = PrefillKernel::kWgmmaWs;  // unset: the default
  if (v != nullptr && (v[0] == '\0' || std::string(v) == "0")) {
    want = PrefillKernel::kStreamedAuto;
  } else if (v != nullptr && std::string(v) == "1") {
    want = PrefillKernel::kWgmma;
  }
  if (major != 9 || minor != 0) want = PrefillKernel::kStreamedAuto;
  std::printf("  TANDEM_PREFILL_WGMMA=%s: WgmmaAutoKernel %d, want %d\n", v == nullptr ? "(unset)" : v,
              static_cast<int>(WgmmaAutoKernel()), static_cast<int>(want));
  EXPECT_EQ(WgmmaAutoKernel(), want);
  const PrefillKernel ran = want == PrefillKernel::kStreamedAuto ? PrefillKernel::kStreamed : want;

  std::mt19937 rng = ::tandem::testing::SeededRng();
  const int64_t h = 512, I = 256, E = 4, K = 2, n = 256;  // 128 rows an expert
  std::vector<DeviceBuffer> dg, du, dd;
  for (int64_t e = 0; e < E; ++e) {
    dg.push_back(Upload(RandomMatrix(rng, WeightType::kQ4_K, h, I, 0.05f)));
    du.push_back(Upload(RandomMatrix(rng, WeightType::kQ4_K, h, I, 0.05f)));
    dd.push_back(Upload(RandomMatrix(rng, WeightType::kQ4_K, I, h, 0.05f)));
  }
  std::vector<int32_t> picks;
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t k = 0; k < K; ++k) picks.push_back(static_cast<int32_t>((t + 2 * k) % E));
  }
  absl::StatusOr<MoeStepPlan> plan = PlanMoeStep(picks, n, K, E, [&](int32_t e) -> std::optional<ExpertLocation> {
    return ExpertLocation{dg[e].get(), du[e].get(), dd[e].get()};
  });
  ASSERT_TRUE(plan.ok()) << plan.status();
  DeviceBuffer dx = Upload(testing::RandomVector(rng, n * h));
  absl::StatusOr<ExpertPrefillRunner> runner =
      ExpertPrefillRunner::Create({WeightType::kQ4_K, WeightType::kQ4_K, h, I}, n * K, PrefillOptions{});
  ASSERT_TRUE(runner.ok()) << runner.status();
  DeviceBuffer partial = PoisonedBuffer(static_cast<size_t>(n * K * h) * sizeof(float));
  ASSERT_TRUE(runner->Run(plan->units, dx.as<float>(), partial.as<float>(), nullptr).ok());
  EXPECT_EQ(runner->last_kernel(), ran) << "host-planned";
  const std::vector<float> got = Download<float>(partial.get(), static_cast<size_t>(n * K * h));
  if (const std::optional<DevicePrefillChoice> choice = runner->DevicePlannedChoice(n * K, E); choice.has_value()) {
    EXPECT_EQ(choice->kernel, ran);
    DeviceBuffer dunits = Upload(plan->units);
    DeviceBuffer dints = Upload(std::vector<int32_t>{static_cast<int32_t>(plan->units.size()), 0});
    DeviceBuffer dpartial = PoisonedBuffer(static_cast<size_t>(n * K * h) * sizeof(float));
    const absl::Status ds = runner->RunDevicePlanned(dunits.as<ExpertUnit>(), dints.as<int32_t>(),
                                                     static_cast<int>(plan->units.size()), static_cast<int>(n),
                                                     static_cast<int>(n * K), E, dx.as<float>(), dpartial.as<float>(),
                                                     dints.as<int32_t>() + 1, nullptr);
    ASSERT_TRUE(ds.ok()) << ds;
    EXPECT_EQ(runner->last_kernel(), ran) << "device-planned";
    const std::vector<float> dgot = Download<float>(dpartial.get(), got.size());
    EXPECT_EQ(std::memcmp(dgot.data(), got.data(), got.size() * sizeof(float)), 0)
        << "the device-planned call differs from the host-planned one";
  } else {
    ADD_FAILURE() << "no device-planned choice for this runner";
  }
}

// kWgmma's and kWgmmaWs's launch scope: Q4_K only, N a multiple of 128, K of 256, tiles of at
// most 256 rows; the launchers refuse before touching any pointer.
TEST(ExpertPrefillTest, WgmmaKernelScope) {
  const PrefillTile* no_tiles = nullptr;
  for (PrefillKernel k : {PrefillKernel::kWgmma, PrefillKernel::kWgmmaWs}) {
    SCOPED_TRACE(static_cast<int>(k));
    EXPECT_EQ(LaunchPrefillGateUp(k, kTypeQ6_K, 256, no_tiles, 1, nullptr, nullptr, 512, 256, nullptr, nullptr),
              cudaErrorInvalidValue);
    EXPECT_EQ(LaunchPrefillGateUp(k, kTypeQ4_K, 257, no_tiles, 1, nullptr, nullptr, 512, 256, nullptr, nullptr),
              cudaErrorInvalidValue);
    EXPECT_EQ(LaunchPrefillGateUp(k, kTypeQ4_K, 256, no_tiles, 1, nullptr, nullptr, 512, 96, nullptr, nullptr),
              cudaErrorInvalidValue);  // N = 2·96 = 192: not a multiple of 128
    EXPECT_EQ(LaunchPrefillDown(k, kTypeQ4_K, 256, no_tiles, 1, nullptr, 320, 256, nullptr, nullptr),
              cudaErrorInvalidValue);  // N = h = 320: not a multiple of 128
    EXPECT_EQ(LaunchPrefillDown(k, kTypeQ4_K, 0, no_tiles, 1, nullptr, 512, 256, nullptr, nullptr),
              cudaErrorInvalidValue);  // tile_rows 0
  }
}

}  // namespace
}  // namespace tandem::cuda
