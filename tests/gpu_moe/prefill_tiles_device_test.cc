// The device-built prefill tiles (prefill_tiles_device.cuh) against the host's (GroupUnits,
// MakePrefillTiles and the slot index of ExpertPrefillRunner::RunGrouped) on ragged random
// routings, and its checks of the units.
#include "gpu_service/backends/cuda/moe/prefill_tiles_device.cuh"

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "gpu_service/backends/cuda/moe/expert_prefill.h"
#include "gpu_service/backends/cuda/weight_type_ids.h"
#include "tests/gpu_moe/test_support.h"

namespace tandem::cuda {
namespace {

using testing::Download;
using testing::PoisonedBuffer;
using testing::Upload;

// Fake, aligned device addresses per expert: the builder copies them and never dereferences them.
ExpertLocation FakeLocation(int32_t e) {
  const uintptr_t base = (static_cast<uintptr_t>(e) + 1) << 20;
  return {reinterpret_cast<const void*>(base), reinterpret_cast<const void*>(base + 4096),
          reinterpret_cast<const void*>(base + 8192)};
}

// n tokens, K distinct experts each of E: every fifth expert never picked (0 rows), experts 1 and 2
// about 20 times as likely as the rest (far more than 64 rows at 512 and 2048 tokens).
std::vector<int32_t> RaggedPicks(std::mt19937& rng, int n, int K, int E) {
  std::vector<double> w(static_cast<size_t>(E));
  for (int e = 0; e < E; ++e) w[e] = e % 5 == 0 ? 0.0 : (e == 1 || e == 2 ? 20.0 : 1.0);
  std::discrete_distribution<int32_t> draw(w.begin(), w.end());
  std::vector<int32_t> picks;
  for (int t = 0; t < n; ++t) {
    const size_t first = picks.size();
    while (picks.size() < first + static_cast<size_t>(K)) {
      const int32_t e = draw(rng);
      if (std::find(picks.begin() + static_cast<std::ptrdiff_t>(first), picks.end(), e) == picks.end()) picks.push_back(e);
    }
  }
  return picks;
}

struct DeviceTiles {
  int count = -1, error = -1;
  std::vector<PrefillTile> tiles;
  std::vector<int32_t> index;
};

DeviceTiles BuildOnDevice(const std::vector<ExpertUnit>& units, int tile_rows, int slots, int input_rows, int max_units) {
  DeviceTiles out;
  DeviceBuffer du = Upload(units);
  // [unit count, error, tile count]
  DeviceBuffer ints = Upload(std::vector<int32_t>{static_cast<int32_t>(units.size()), 0, -1});
  DeviceBuffer tiles = PoisonedBuffer(static_cast<size_t>(slots) * sizeof(PrefillTile));
  DeviceBuffer index = Upload(std::vector<int32_t>(static_cast<size_t>(slots), -1));
  DeviceBuffer scratch = PoisonedBuffer(static_cast<size_t>(2 * max_units) * sizeof(int32_t));
  DevicePrefillTilesArgs a;
  a.units = du.as<ExpertUnit>();
  a.num_units = ints.as<int32_t>();
  a.max_units = max_units;
  a.tile_rows = tile_rows;
  a.max_slots = slots;
  a.max_input_rows = input_rows;
  a.gate_up_align = KernelRowAlignment(kTypeQ4_K);
  a.down_align = KernelRowAlignment(kTypeQ4_K);
  a.tiles = tiles.as<PrefillTile>();
  a.max_tiles = slots;
  a.num_tiles = ints.as<int32_t>() + 2;
  a.index = index.as<int32_t>();
  a.scratch = scratch.as<int32_t>();
  a.error = ints.as<int32_t>() + 1;
  EXPECT_EQ(LaunchBuildPrefillTiles(a, nullptr), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<int32_t> got = Download<int32_t>(ints.get(), 3);
  out.error = got[1];
  out.count = got[2];
  if (out.count > 0) out.tiles = Download<PrefillTile>(tiles.get(), static_cast<size_t>(out.count));
  out.index = Download<int32_t>(index.get(), static_cast<size_t>(slots));
  return out;
}

void ExpectSameTiles(const std::vector<ExpertUnit>& units, int tile_rows, int slots, int n) {
  SCOPED_TRACE("tile_rows " + std::to_string(tile_rows));
  const std::vector<PrefillTile> want = MakePrefillTiles(GroupUnits(units), tile_rows);
  const DeviceTiles got = BuildOnDevice(units, tile_rows, slots, n, static_cast<int>(units.size()));
  EXPECT_EQ(got.error, 0);
  ASSERT_EQ(got.count, static_cast<int>(want.size()));
  for (size_t i = 0; i < want.size(); ++i) {
    const PrefillTile& w = want[i];
    const PrefillTile& g = got.tiles[i];
    ASSERT_TRUE(w.gate == g.gate && w.up == g.up && w.down == g.down && w.first_slot == g.first_slot &&
                w.rows == g.rows)
        << "tile " << i << ": want slot " << w.first_slot << " rows " << w.rows << ", got slot " << g.first_slot
        << " rows " << g.rows;
  }
  for (const ExpertUnit& u : units) {
    for (int r = 0; r < u.rows; ++r) ASSERT_EQ(got.index[u.first_slot + r], u.input_row[r]);
  }
}

TEST(PrefillTilesDeviceTest, DeviceTilesAndIndexEqualTheHostOnes) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(1234);
  const int E = 64, K = 8;
  for (int n : {65, 512, 2048}) {
    SCOPED_TRACE("n " + std::to_string(n));
    const std::vector<int32_t> picks = RaggedPicks(rng, n, K, E);
    absl::StatusOr<MoeStepPlan> plan =
        PlanMoeStep(picks, n, K, E, [](int32_t e) -> std::optional<ExpertLocation> { return FakeLocation(e); });
    ASSERT_TRUE(plan.ok()) << plan.status();
    int most = 0, empty = 0;
    for (const PrefillGroup& g : GroupUnits(plan->units)) most = std::max(most, static_cast<int>(g.rows));
    for (int e = 0; e < E; ++e) empty += std::find(picks.begin(), picks.end(), e) == picks.end() ? 1 : 0;
    EXPECT_GT(empty, 0);
    if (n >= 512) {
      EXPECT_GT(most, 64);
    }
    for (int T : {16, 32, 64}) ExpectSameTiles(plan->units, T, n * K, n);
    // Units out of expert order (groups split and merged differently): still GroupUnits' groups.
    std::vector<ExpertUnit> shuffled = plan->units;
    std::shuffle(shuffled.begin(), shuffled.end(), rng);
    ExpectSameTiles(shuffled, 16, n * K, n);
  }
}

// A unit the host path would refuse sets the error flag and leaves no tiles; so does a count above
// the bound.
TEST(PrefillTilesDeviceTest, BadUnitsSetTheErrorFlagAndNoTiles) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(99);
  const int n = 100, K = 4, E = 16;
  const std::vector<int32_t> picks = RaggedPicks(rng, n, K, E);
  absl::StatusOr<MoeStepPlan> plan =
      PlanMoeStep(picks, n, K, E, [](int32_t e) -> std::optional<ExpertLocation> { return FakeLocation(e); });
  ASSERT_TRUE(plan.ok()) << plan.status();
  const int units = static_cast<int>(plan->units.size());
  for (int which = 0; which < 5; ++which) {
    SCOPED_TRACE("case " + std::to_string(which));
    std::vector<ExpertUnit> bad = plan->units;
    ExpertUnit& u = bad[bad.size() / 2];
    int max_units = units;
    switch (which) {
      case 0: u.rows = 0; break;
      case 1: u.input_row[0] = n; break;
      case 2: u.first_slot = n * K - 1; break;
      case 3: u.gate = static_cast<const uint8_t*>(u.gate) + 2; break;
      case 4: max_units = units - 1; break;
    }
    const DeviceTiles got = BuildOnDevice(bad, 16, n * K, n, max_units);
    EXPECT_EQ(got.error, 1);
    EXPECT_EQ(got.count, 0);
  }
}

}  // namespace
}  // namespace tandem::cuda
