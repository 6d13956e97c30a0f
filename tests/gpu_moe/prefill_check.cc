#include "tests/gpu_moe/prefill_check.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <random>
#include <string>

#include "common/reference/moe.h"
#include "gpu_service/backends/cuda/moe/expert_prefill.cuh"
#include "gpu_service/backends/cuda/moe/expert_prefill_mmq.cuh"
#include "gtest/gtest.h"
#include "tests/gpu_moe/test_support.h"
#include "tests/test_seed.h"

namespace tandem::cuda::testing {

std::string Describe(const PrefillOptions& o) {
  switch (o.algorithm) {
    case PrefillAlgorithm::kCublasPerExpert: return "cublas per expert";
    case PrefillAlgorithm::kGroupedTilesPipelined: return "pipelined grouped tiles, tile_rows " + std::to_string(o.tile_rows);
    case PrefillAlgorithm::kGroupedTiles: break;
  }
  const std::string order = o.work_order.has_value() ? std::to_string(static_cast<int>(*o.work_order)) : "default";
  return "grouped tiles (streamed or MMQ where it fits, variant " + std::to_string(static_cast<int>(o.streamed_kernel)) +
         "), tile_rows " + std::to_string(o.tile_rows) + ", work order " + order;
}

void ExpectMatchesReference(const PrefillCase& c, const std::vector<PrefillOptions>& all, int expected_tile_rows,
                            bool skewed, const std::vector<int>& counts, double mmq_rel_l2,
                            bool same_bits, int64_t weight_sets, double cross_rel_l2) {
  std::mt19937 rng = ::tandem::testing::SeededRng();
  const int64_t h = c.h, I = c.I, E = c.E, K = c.K, n = c.n;
  const int64_t W = weight_sets > 0 ? std::min(weight_sets, E) : E;
  const RandomExperts w = MakeRandomExperts(rng, c.gu_type, c.d_type, h, I, W);
  std::vector<int32_t> picks;
  std::vector<double> weights;
  for (int64_t e = 0; e < E; ++e) weights.push_back(static_cast<double>(2 * e + 1));
  std::discrete_distribution<int32_t> draw(weights.begin(), weights.end());
  if (!counts.empty()) {
    ASSERT_EQ(K, 1);
    for (int e = 0; e < static_cast<int>(counts.size()); ++e) picks.insert(picks.end(), counts[e], e);
    ASSERT_EQ(static_cast<int64_t>(picks.size()), n);
    std::shuffle(picks.begin(), picks.end(), rng);
  }
  for (int64_t t = 0; t < n && counts.empty(); ++t) {
    const size_t first = picks.size();
    for (int64_t k = 0; k < K; ++k) {
      int32_t e = static_cast<int32_t>((t + 2 * k) % E);
      if (skewed) {
        do {
          e = draw(rng);
        } while (std::find(picks.begin() + static_cast<std::ptrdiff_t>(first), picks.end(), e) != picks.end());
      }
      picks.push_back(e);
    }
  }
  const std::vector<float> x = testing::RandomVector(rng, n * h);
  DeviceBuffer dx = Upload(x);
  absl::StatusOr<MoeStepPlan> plan = PlanMoeStep(picks, n, K, E, [&](int32_t e) -> std::optional<ExpertLocation> {
    return ExpertLocation{w.dgate[e % W].get(), w.dup[e % W].get(), w.ddown[e % W].get()};
  });
  ASSERT_TRUE(plan.ok()) << plan.status();
  std::vector<float> ref(static_cast<size_t>(n * K * h));
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t k = 0; k < K; ++k) {
      const int32_t e = static_cast<int32_t>(picks[t * K + k] % W);
      FfnForward(testing::HostMatrix(c.gu_type, w.gate[e], h, I), testing::HostMatrix(c.gu_type, w.up[e], h, I),
                 testing::HostMatrix(c.d_type, w.down[e], I, h), x.data() + t * h, 1,
                 ref.data() + plan->slot[t * K + k] * h, nullptr);
    }
  }
  std::vector<float> first_got;
  for (const PrefillOptions& options : all) {
    SCOPED_TRACE(Describe(options));
    absl::StatusOr<ExpertPrefillRunner> runner = ExpertPrefillRunner::Create({c.gu_type, c.d_type, h, I}, n * K, options);
    ASSERT_TRUE(runner.ok()) << runner.status();
    DeviceBuffer partial = PoisonedBuffer(ref.size() * sizeof(float));
    const absl::Status s = runner->Run(plan->units, dx.as<float>(), partial.as<float>(), nullptr);
    ASSERT_TRUE(s.ok()) << s;
    const std::vector<float> got = Download<float>(partial.get(), ref.size());
    ASSERT_TRUE(testing::AllFinite(got)) << "unwritten partial rows";
    const double l2 = testing::RelativeL2(got, ref);
    EXPECT_LE(l2, 1e-2);
    if (same_bits) {
      if (first_got.empty()) first_got = got;
      EXPECT_EQ(std::memcmp(got.data(), first_got.data(), got.size() * sizeof(float)), 0)
          << "differs bit-wise from the first option's output";
    }
    if (cross_rel_l2 > 0) {
      if (first_got.empty()) first_got = got;
      const double cross = testing::RelativeL2(got, first_got);
      std::printf("  %s: relative L2 %.3e to the reference, %.3e to the first option\n", Describe(options).c_str(), l2,
                  cross);
      EXPECT_LE(cross, cross_rel_l2) << "differs from the first option's output";
    }
    // The device-planned call on the same units (in device memory, with a device count): the
    // reference's tolerance, and the host call's bits where the options fix the kernel and tile
    // bound (both then run the same kernel on the same tiles).
    if (const std::optional<DevicePrefillChoice> choice = runner->DevicePlannedChoice(n * K, E); choice.has_value()) {
      DeviceBuffer du = Upload(plan->units);
      DeviceBuffer dints = Upload(std::vector<int32_t>{static_cast<int32_t>(plan->units.size()), 0});
      DeviceBuffer dpartial = PoisonedBuffer(ref.size() * sizeof(float));
      const absl::Status ds = runner->RunDevicePlanned(
          du.as<ExpertUnit>(), dints.as<int32_t>(), static_cast<int>(std::max<size_t>(plan->units.size(), 1)),
          static_cast<int>(n), static_cast<int>(n * K), E, dx.as<float>(), dpartial.as<float>(),
          dints.as<int32_t>() + 1, nullptr);
      ASSERT_TRUE(ds.ok()) << ds;
      const std::vector<float> dgot = Download<float>(dpartial.get(), ref.size());
      EXPECT_EQ(Download<int32_t>(dints.get(), 2)[1], 0) << "device plan error flag";
      ASSERT_TRUE(testing::AllFinite(dgot)) << "device-planned call: unwritten partial rows";
      const double dl2 = testing::RelativeL2(dgot, ref);
      std::printf("  device-planned: kernel %d tile_rows %d, relative L2 %.3e\n", static_cast<int>(choice->kernel),
                  choice->tile_rows, dl2);
      EXPECT_LE(dl2, IsMmqKernel(choice->kernel) ? mmq_rel_l2 : 1e-2);
      if (options.tile_rows != 0 || options.streamed_kernel != PrefillKernel::kStreamedAuto || same_bits) {
        EXPECT_EQ(std::memcmp(dgot.data(), got.data(), got.size() * sizeof(float)), 0)
            << "the device-planned call differs from the host-planned one";
      }
    }
    const ExpertDecodeRunner::Shape shape{c.gu_type, c.d_type, h, I};
    const bool on_mmq = options.algorithm == PrefillAlgorithm::kGroupedTiles && UsesMmqKernel(shape) &&
                        (IsMmqKernel(options.streamed_kernel) ||
                         (options.streamed_kernel == PrefillKernel::kStreamedAuto && options.tile_rows == 0 &&
                          MmqByDefault() && ChooseMmqTile(GroupUnits(plan->units)) == 16));
    if (on_mmq) {
      std::printf("  MMQ h=%lld I=%lld variant %d tile_rows %d: relative L2 %.3e\n", static_cast<long long>(h),
                  static_cast<long long>(I), static_cast<int>(options.streamed_kernel), runner->last_tile_rows(), l2);
      EXPECT_LE(l2, mmq_rel_l2);
    }
    if (options.algorithm != PrefillAlgorithm::kCublasPerExpert && options.tile_rows != 0) {
      EXPECT_EQ(runner->last_tile_rows(), options.tile_rows);
    }
    if (expected_tile_rows != 0 && options.algorithm == PrefillAlgorithm::kGroupedTilesPipelined && options.tile_rows == 0) {
      EXPECT_EQ(runner->last_tile_rows(), expected_tile_rows);
    }
    if (options.algorithm == PrefillAlgorithm::kGroupedTiles && options.tile_rows == 0 &&
        UsesStreamedKernel({c.gu_type, c.d_type, h, I}, 0)) {
      // kStreamed: 64; kStreamedRows (chosen, or by kStreamedAuto for small groups): 16 or 32.
      const std::vector<PrefillGroup> groups = GroupUnits(plan->units);
      const bool rows_fit = UsesStreamedRowsKernel({c.gu_type, c.d_type, h, I});
      int expected = kStreamedMaxTileRows;
      if (IsWgmmaKernel(options.streamed_kernel)) {
        expected = kWgmmaMaxTileRows;
      } else if (on_mmq) {
        expected = ChooseMmqTile(groups);
      } else if (rows_fit && options.streamed_kernel == PrefillKernel::kStreamedRows) {
        expected = ChooseStreamedRowsTile(groups, /*auto_choice=*/false);
      } else if (rows_fit && options.streamed_kernel == PrefillKernel::kStreamedAuto &&
                 ChooseStreamedRowsTile(groups, /*auto_choice=*/true) != 0) {
        expected = ChooseStreamedRowsTile(groups, /*auto_choice=*/true);
      } else if (options.streamed_kernel == PrefillKernel::kStreamedAuto &&
                 ChooseWgmmaTile({c.gu_type, c.d_type, h, I}, groups) != 0) {
        expected = kWgmmaMaxTileRows;  // the wgmma kernel for large groups (sm_90, TANDEM_PREFILL_WGMMA not 0)
      }
      EXPECT_EQ(runner->last_tile_rows(), expected);
    }
  }
}

std::vector<PrefillOptions> AllOptions() {
  std::vector<PrefillOptions> all = {{PrefillAlgorithm::kCublasPerExpert, 0, 0}};
  for (PrefillAlgorithm a : {PrefillAlgorithm::kGroupedTiles, PrefillAlgorithm::kGroupedTilesPipelined}) {
    all.push_back({a, 0, 0});
    for (int rows : kPrefillTileRows) all.push_back({a, rows, 0});
  }
  return all;
}

}  // namespace tandem::cuda::testing
