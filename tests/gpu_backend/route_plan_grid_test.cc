// The grid route-plan kernel (route_plan_grid.cuh) against the path it replaces: the route-and-plan
// kernel (route_plan.cuh) then the one-block tile builder (prefill_tiles_device.cuh), on ragged
// routings of 65 to 8192 tokens (experts with no rows, experts with over 64, one expert taking
// every token, experts without a location, a misaligned expert), and against the host planner
// (PlanMoeStep), whose pair order the grid kernel keeps. Also prints the two paths' times at 512,
// 2048 and 8192 tokens (printed only: timing never decides a test). Skips without a GPU.
// Written 2026-12-01 without a GPU (branch h/plan2): not yet run.
#include "gpu_service/backends/cuda/moe/route_plan_grid.cuh"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "gpu_service/backends/cuda/moe/expert_prefill.h"
#include "gpu_service/backends/cuda/moe/experts.h"
#include "gpu_service/backends/cuda/moe/prefill_tiles_device.cuh"
#include "gpu_service/backends/cuda/moe/route_plan.cuh"
#include "gpu_service/backends/cuda/weight_type_ids.h"
#include "gtest/gtest.h"
#include "tests/gpu_backend/backend_test_util.h"
#include "tests/gpu_backend/device_arrays.h"

namespace tandem::cuda {
namespace {

using gpu_backend_testing::DeviceArrayOf;
using gpu_backend_testing::DeviceCopy;
using gpu_backend_testing::HostCopy;

// Fake device addresses, never dereferenced, aligned for any kernel (1 MiB apart per expert).
ExpertLocation FakeLocation(int e) {
  const uintptr_t base = (static_cast<uintptr_t>(e) + 1) << 20;
  return {reinterpret_cast<const void*>(base), reinterpret_cast<const void*>(base + 4096),
          reinterpret_cast<const void*>(base + 8192)};
}

int MaxUnits(int n, int K, int E) { return std::min(n * K, n * K / kMaxUnitRows + E); }
int MaxTiles(int slots, int T, int max_units) { return std::min(slots, slots / T + max_units); }

// One prefill plan's device buffers and, after Download, its outputs.
struct Plan {
  int n, K, E, T;
  float* logits = nullptr;
  ExpertLocation* table = nullptr;
  int32_t* picks = nullptr;
  float* weights = nullptr;
  ExpertUnit* units = nullptr;
  int32_t* slot = nullptr;
  int* ints = nullptr;  // [units, error, route-plan counter, tile count]
  PrefillTile* tiles = nullptr;
  int32_t* index = nullptr;
  int* scratch = nullptr;  // the tile builder's, or the grid kernel's
  int64_t scratch_ints = 0;
  // Outputs.
  std::vector<int32_t> h_picks, h_slot, h_index;
  std::vector<float> h_weights;
  std::vector<ExpertUnit> h_units;
  std::vector<PrefillTile> h_tiles;
  int num_units = -1, error = -1, counter = -1, num_tiles = -1;

  Plan(int n_, int K_, int E_, int T_, const std::vector<float>& l, const std::vector<ExpertLocation>& t, bool grid)
      : n(n_), K(K_), E(E_), T(T_) {
    logits = DeviceCopy(l);
    table = DeviceCopy(t);
    const size_t pairs = static_cast<size_t>(n) * K;
    picks = DeviceArrayOf<int32_t>(pairs);
    weights = DeviceArrayOf<float>(pairs);
    units = DeviceArrayOf<ExpertUnit>(pairs);
    slot = DeviceArrayOf<int32_t>(pairs);
    ints = DeviceArrayOf<int>(4, 0);
    tiles = DeviceArrayOf<PrefillTile>(pairs);
    index = DeviceArrayOf<int32_t>(pairs);
    scratch_ints = grid ? RoutePlanGridScratchInts(E) : 3 * MaxUnits(n, K, E);
    scratch = DeviceArrayOf<int>(static_cast<size_t>(scratch_ints), grid ? 0 : 0xFF);
    // The memsets done before a launch on a non-blocking stream reads the barrier words.
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
  ~Plan() {
    for (void* p : std::initializer_list<void*>{logits, table, picks, weights, units, slot, ints, tiles, index, scratch}) {
      cudaFree(p);
    }
  }

  DeviceMoePlanArgs Args() const {
    DeviceMoePlanArgs a;
    a.logits = logits;
    a.experts = a.experts_out = picks;
    a.weights_out = weights;
    a.n = n;
    a.K = K;
    a.E = E;
    a.table = table;
    a.units = units;
    a.num_units = ints;
    a.error = ints + 1;
    a.slot = slot;
    return a;
  }

  DevicePrefillTilesArgs TileArgs() const {
    DevicePrefillTilesArgs b;
    b.max_units = MaxUnits(n, K, E);
    b.tile_rows = T;
    b.max_slots = n * K;
    b.max_input_rows = n;
    b.gate_up_align = KernelRowAlignment(kTypeQ4_K);
    b.down_align = KernelRowAlignment(kTypeQ4_K);
    b.tiles = tiles;
    b.max_tiles = MaxTiles(n * K, T, b.max_units);
    b.num_tiles = ints + 3;
    b.index = index;
    b.error = ints + 1;
    return b;
  }

  // The old path: route-and-plan, then the tile builder on its units.
  cudaError_t LaunchOld(cudaStream_t stream) const {
    RoutePlanArgs rp;
    rp.plan = Args();
    rp.counter = reinterpret_cast<unsigned*>(ints + 2);
    if (cudaError_t e = LaunchRoutePlan(rp, stream); e != cudaSuccess) return e;
    DevicePrefillTilesArgs b = TileArgs();
    b.units = units;
    b.num_units = ints;
    b.scratch = scratch;
    return LaunchBuildPrefillTiles(b, stream);
  }

  cudaError_t LaunchGrid(cudaStream_t stream, bool with_tiles = true) const {
    RoutePlanGridArgs g;
    g.plan = Args();
    if (with_tiles) g.tiles = TileArgs();
    g.scratch = scratch;
    g.scratch_ints = scratch_ints;
    return LaunchRoutePlanGrid(g, stream);
  }

  void Download() {
    const size_t pairs = static_cast<size_t>(n) * K;
    const std::vector<int> h = HostCopy(ints, 4);
    num_units = h[0];
    error = h[1];
    counter = h[2];
    num_tiles = h[3];
    h_picks = HostCopy(picks, pairs);
    h_weights = HostCopy(weights, pairs);
    h_slot = HostCopy(slot, pairs);
    h_index = HostCopy(index, pairs);
    h_units = HostCopy(units, static_cast<size_t>(std::clamp(num_units, 0, static_cast<int>(pairs))));
    h_tiles = HostCopy(tiles, static_cast<size_t>(std::clamp(num_tiles, 0, static_cast<int>(pairs))));
  }
};

bool SameHeader(const ExpertUnit& a, const ExpertUnit& b) {
  return a.gate == b.gate && a.up == b.up && a.down == b.down && a.rows == b.rows && a.first_slot == b.first_slot;
}

// Ragged logits: experts e % 5 == 0 far below the rest (never picked), 1 and 2 far above
// (picked by most tokens: over 64 rows from 512 tokens on), `every` (>= 0) picked by every token.
std::vector<float> RaggedLogits(int n, int E, int every, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> l(static_cast<size_t>(n) * E);
  for (int t = 0; t < n; ++t) {
    for (int e = 0; e < E; ++e) {
      float v = normal(rng);
      if (e % 5 == 0) v -= 40.0f;
      if (e == 1 || e == 2) v += 3.0f;
      if (e == every) v += 40.0f;
      l[static_cast<size_t>(t) * E + e] = v;
    }
  }
  return l;
}

// The grid plan against the old one and the host planner.
void ExpectSamePlans(Plan& old_plan, Plan& grid, const std::vector<ExpertLocation>& table) {
  const int n = grid.n, K = grid.K, E = grid.E;
  const size_t pairs = static_cast<size_t>(n) * K;
  ASSERT_EQ(old_plan.h_picks, grid.h_picks);
  ASSERT_EQ(std::memcmp(old_plan.h_weights.data(), grid.h_weights.data(), pairs * sizeof(float)), 0);
  EXPECT_EQ(old_plan.error, grid.error);
  EXPECT_EQ(old_plan.counter, 0);
  ASSERT_EQ(old_plan.num_units, grid.num_units);
  ASSERT_EQ(old_plan.num_tiles, grid.num_tiles);
  for (int i = 0; i < grid.num_units; ++i) ASSERT_TRUE(SameHeader(old_plan.h_units[i], grid.h_units[i])) << "unit " << i;
  for (int i = 0; i < grid.num_tiles; ++i) {
    const PrefillTile& a = old_plan.h_tiles[i];
    const PrefillTile& b = grid.h_tiles[i];
    ASSERT_TRUE(a.gate == b.gate && a.up == b.up && a.down == b.down && a.first_slot == b.first_slot && a.rows == b.rows)
        << "tile " << i << ": old slot " << a.first_slot << " rows " << a.rows << ", grid slot " << b.first_slot
        << " rows " << b.rows;
  }
  // The grid plan is the host planner's, exactly (pairs in pair order within an expert).
  absl::StatusOr<MoeStepPlan> host = PlanMoeStep(grid.h_picks, n, K, E, [&](int32_t e) -> std::optional<ExpertLocation> {
    if (table[e].gate == nullptr) return std::nullopt;
    return table[e];
  });
  ASSERT_TRUE(host.ok()) << host.status();
  ASSERT_EQ(static_cast<int>(host->units.size()), grid.num_units);
  for (int i = 0; i < grid.num_units; ++i) {
    const ExpertUnit& h = host->units[i];
    const ExpertUnit& g = grid.h_units[i];
    ASSERT_TRUE(SameHeader(h, g)) << "unit " << i;
    for (int r = 0; r < h.rows; ++r) ASSERT_EQ(h.input_row[r], g.input_row[r]) << "unit " << i << " row " << r;
  }
  // (The host planner gives pairs without a location slots from gpu_slots on; the device planners -1.)
  for (size_t p = 0; p < pairs; ++p) {
    ASSERT_EQ(grid.h_slot[p], host->slot[p] >= host->gpu_slots ? -1 : host->slot[p]) << "pair " << p;
  }
  // The old plan: the same tokens at each expert's slots, in some order; its units, slots and
  // index agree with each other; the grid index names each slot's token.
  std::vector<int32_t> old_owner(pairs, -1), grid_owner(pairs, -1);
  for (size_t p = 0; p < pairs; ++p) {
    if (old_plan.h_slot[p] >= 0) old_owner[old_plan.h_slot[p]] = static_cast<int32_t>(p / K);
    if (grid.h_slot[p] >= 0) grid_owner[grid.h_slot[p]] = static_cast<int32_t>(p / K);
  }
  for (int i = 0; i < grid.num_units;) {
    int j = i;
    const ExpertUnit& first = grid.h_units[i];
    int end = first.first_slot;
    while (j < grid.num_units && grid.h_units[j].gate == first.gate) {
      end = grid.h_units[j].first_slot + grid.h_units[j].rows;
      ++j;
    }
    std::vector<int32_t> a(old_owner.begin() + first.first_slot, old_owner.begin() + end);
    std::vector<int32_t> b(grid_owner.begin() + first.first_slot, grid_owner.begin() + end);
    std::sort(a.begin(), a.end());
    std::sort(b.begin(), b.end());
    ASSERT_EQ(a, b) << "the expert of units " << i << ".." << j - 1;
    i = j;
  }
  for (int i = 0; i < grid.num_units; ++i) {
    const ExpertUnit& u = old_plan.h_units[i];
    for (int r = 0; r < u.rows; ++r) {
      ASSERT_EQ(old_owner[u.first_slot + r], u.input_row[r]);
      if (old_plan.num_tiles > 0) {
        ASSERT_EQ(old_plan.h_index[u.first_slot + r], u.input_row[r]);
      }
      if (grid.num_tiles > 0) {
        ASSERT_EQ(grid.h_index[u.first_slot + r], grid_owner[u.first_slot + r]);
      }
    }
  }
}

TEST(RoutePlanGridTest, GridPlanEqualsTheOldPlanAndTheHostOrder) {
  TANDEM_BACKEND_SKIP_WITHOUT_GPU();
  const int E = 512, K = 10;
  for (int n : {65, 512, 2048, 8192}) {
    for (int variant = 0; variant < 4; ++variant) {
      // 0: ragged; 1: expert 3 takes every token; 2: experts 7 and 11 have no location (picks
      // flagged, slot -1); 3: expert 1's gate misaligned (error, no tiles).
      SCOPED_TRACE(::testing::Message() << "n=" << n << " variant=" << variant);
      const std::vector<float> logits = RaggedLogits(n, E, variant == 1 ? 3 : -1, 100 + n + variant);
      std::vector<ExpertLocation> table(E);
      for (int e = 0; e < E; ++e) table[e] = FakeLocation(e);
      if (variant == 2) table[7] = table[11] = ExpertLocation{};
      if (variant == 3) table[1].gate = static_cast<const uint8_t*>(table[1].gate) + 2;
      const int T = n * K <= kDeviceMmqMaxMeanRows * E ? 16 : 64;
      ASSERT_TRUE(RoutePlanGridFits(n, K, E));
      Plan old_plan(n, K, E, T, logits, table, false), grid(n, K, E, T, logits, table, true);
      ASSERT_EQ(old_plan.LaunchOld(nullptr), cudaSuccess);
      for (int run = 0; run < 2; ++run) ASSERT_EQ(grid.LaunchGrid(nullptr), cudaSuccess);  // the barrier words stay valid
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      old_plan.Download();
      grid.Download();
      const std::vector<int> words = HostCopy(grid.scratch, 1);
      EXPECT_EQ(words[0], 0) << "barrier arrivals not back to 0";
      if (variant == 3) {
        EXPECT_EQ(old_plan.error, 1);
        EXPECT_EQ(grid.error, 1);
        EXPECT_EQ(old_plan.num_tiles, 0);
        EXPECT_EQ(grid.num_tiles, 0);
        continue;
      }
      EXPECT_EQ(grid.error, variant == 2 ? 1 : 0);
      ExpectSamePlans(old_plan, grid, table);
      if (variant == 0 && n >= 512) {
        std::map<int32_t, int> rows;
        for (int32_t e : grid.h_picks) ++rows[e];
        EXPECT_GT(std::max(rows[1], rows[2]), 64);
        EXPECT_EQ(rows.count(0), 0u);
      }
    }
  }
}

// Without a tile target (the f32 path) the grid kernel writes the units and slots alone.
TEST(RoutePlanGridTest, UnitsWithoutTiles) {
  TANDEM_BACKEND_SKIP_WITHOUT_GPU();
  const int n = 300, K = 8, E = 100;
  const std::vector<float> logits = RaggedLogits(n, E, -1, 5);
  std::vector<ExpertLocation> table(E);
  for (int e = 0; e < E; ++e) table[e] = FakeLocation(e);
  Plan old_plan(n, K, E, 16, logits, table, false), grid(n, K, E, 16, logits, table, true);
  ASSERT_EQ(old_plan.LaunchOld(nullptr), cudaSuccess);
  ASSERT_EQ(grid.LaunchGrid(nullptr, /*with_tiles=*/false), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  old_plan.Download();
  grid.Download();
  EXPECT_EQ(grid.num_tiles, 0);  // never written (zeroed at allocation)
  grid.num_tiles = old_plan.num_tiles = 0;
  ExpectSamePlans(old_plan, grid, table);
}

TEST(RoutePlanGridTest, RefusesWhatItCannotPlan) {
  TANDEM_BACKEND_SKIP_WITHOUT_GPU();
  RoutePlanGridArgs a;
  EXPECT_EQ(LaunchRoutePlanGrid(a, nullptr), cudaErrorInvalidValue);
  EXPECT_FALSE(RoutePlanGridFits(100, 10, kRoutePlanGridMaxExperts + 1));
  EXPECT_FALSE(RoutePlanGridFits(100, 33, 512));
  EXPECT_FALSE(RoutePlanGridFits(1 << 30, 10, 512));
}

// Old (route-and-plan kernel + tile builder) against the grid kernel, back to back on one stream
// (no kernels in between: launch gaps included, PDL as the backend sets it), 100 calls each.
// Printed for the notes; never asserted.
TEST(RoutePlanGridTest, PrintsOldAndNewTimes) {
  TANDEM_BACKEND_SKIP_WITHOUT_GPU();
  const int E = 512, K = 10, kCalls = 100;
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  cudaEvent_t start, stop;
  ASSERT_EQ(cudaEventCreate(&start), cudaSuccess);
  ASSERT_EQ(cudaEventCreate(&stop), cudaSuccess);
  for (int n : {512, 2048, 8192}) {
    std::mt19937 rng(n);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> logits(static_cast<size_t>(n) * E);
    for (float& v : logits) v = normal(rng);
    std::vector<ExpertLocation> table(E);
    for (int e = 0; e < E; ++e) table[e] = FakeLocation(e);
    const int T = n * K <= kDeviceMmqMaxMeanRows * E ? 16 : 64;
    Plan old_plan(n, K, E, T, logits, table, false), grid(n, K, E, T, logits, table, true);
    float ms[3] = {0, 0, 0};
    for (int which = 0; which < 3; ++which) {  // 0: old route-and-plan alone, 1: old + tiles, 2: grid
      auto launch = [&]() -> cudaError_t {
        if (which == 2) return grid.LaunchGrid(stream);
        if (which == 1) return old_plan.LaunchOld(stream);
        RoutePlanArgs rp;
        rp.plan = old_plan.Args();
        rp.counter = reinterpret_cast<unsigned*>(old_plan.ints + 2);
        return LaunchRoutePlan(rp, stream);
      };
      for (int i = 0; i < 5; ++i) ASSERT_EQ(launch(), cudaSuccess);
      ASSERT_EQ(cudaEventRecord(start, stream), cudaSuccess);
      for (int i = 0; i < kCalls; ++i) ASSERT_EQ(launch(), cudaSuccess);
      ASSERT_EQ(cudaEventRecord(stop, stream), cudaSuccess);
      ASSERT_EQ(cudaEventSynchronize(stop), cudaSuccess);
      ASSERT_EQ(cudaEventElapsedTime(&ms[which], start, stop), cudaSuccess);
    }
    printf("[route-plan bench] n=%d E=%d K=%d T=%d: old route-and-plan %.2f us + tiles %.2f us = %.2f us; grid %.2f us "
           "(%.2fx)\n",
           n, E, K, T, 1000.0 * ms[0] / kCalls, 1000.0 * (ms[1] - ms[0]) / kCalls, 1000.0 * ms[1] / kCalls,
           1000.0 * ms[2] / kCalls, ms[1] / std::max(ms[2], 1e-6f));
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace tandem::cuda
