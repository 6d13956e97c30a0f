// The device MoE planner (gpu_service/backends/cuda/moe/device_plan.cuh) against the properties of
// the host planner's output: every pair gets one slot, units name the pair's expert and token,
// each expert's units hold at most kMaxUnitRows rows at consecutive slots, bad picks are flagged.
// Skips without a GPU.
#include "gpu_service/backends/cuda/moe/device_plan.cuh"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "common/reference/moe.h"
#include "gpu_service/backends/cuda/moe/experts.h"
#include "gpu_service/backends/cuda/moe/route_plan.cuh"
#include "gpu_service/backends/cuda/moe/router.cuh"
#include "gtest/gtest.h"
#include "tests/gpu_backend/backend_test_util.h"
#include "tests/gpu_backend/device_arrays.h"

namespace tandem::cuda {
namespace {

using gpu_backend_testing::DeviceArrayOf;
using gpu_backend_testing::DeviceCopy;
using gpu_backend_testing::HostCopy;

// Fake, never dereferenced, distinct addresses per expert and matrix.
ExpertLocation FakeLocation(int e) {
  const uintptr_t base = 0x100000 + static_cast<uintptr_t>(e) * 0x3000;
  return {reinterpret_cast<const void*>(base), reinterpret_cast<const void*>(base + 0x1000),
          reinterpret_cast<const void*>(base + 0x2000)};
}

struct PlanResult {
  std::vector<ExpertUnit> units, shared_units;
  std::vector<int32_t> slot;
  int num_units = 0, error = 0;
  std::vector<int32_t> picks;   // with logits: what the fused routing picked
  std::vector<float> weights;   // and their weights
};

// Runs the planner on `picks` (n × K), or with `logits` (n × E) on its fused routing (picks then
// only sizes the picks array).
PlanResult Plan(const std::vector<int32_t>& picks, int n, int K, int E, const std::vector<ExpertLocation>& table,
                bool with_shared, const std::vector<float>* logits = nullptr) {
  int32_t* d_picks = DeviceCopy(picks);
  float* d_logits = logits != nullptr ? DeviceCopy(*logits) : nullptr;
  float* d_weights = logits != nullptr ? DeviceCopy(std::vector<float>(static_cast<size_t>(n) * K)) : nullptr;
  ExpertLocation* d_table = DeviceCopy(table);
  ExpertUnit *d_units = nullptr, *d_shared = nullptr;
  int32_t* d_slot = nullptr;
  int* d_ints = nullptr;
  EXPECT_EQ(cudaMalloc(&d_units, sizeof(ExpertUnit) * n * K), cudaSuccess);
  EXPECT_EQ(cudaMalloc(&d_shared, sizeof(ExpertUnit) * ((n + 7) / 8)), cudaSuccess);
  EXPECT_EQ(cudaMalloc(&d_slot, sizeof(int32_t) * n * K), cudaSuccess);
  EXPECT_EQ(cudaMalloc(&d_ints, 2 * sizeof(int)), cudaSuccess);
  EXPECT_EQ(cudaMemset(d_ints, 0, 2 * sizeof(int)), cudaSuccess);
  DeviceMoePlanArgs a;
  a.experts = d_picks;
  a.n = n;
  a.K = K;
  a.E = E;
  a.table = d_table;
  if (with_shared) a.shared = FakeLocation(100000);
  a.units = d_units;
  a.num_units = d_ints;
  a.error = d_ints + 1;
  a.slot = d_slot;
  a.shared_units = d_shared;
  if (logits != nullptr) {
    a.logits = d_logits;
    a.experts_out = d_picks;
    a.weights_out = d_weights;
  }
  EXPECT_EQ(LaunchPlanMoeOnDevice(a, nullptr), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  PlanResult r;
  const std::vector<int> ints = HostCopy(d_ints, 2);
  r.num_units = ints[0];
  r.error = ints[1];
  r.units = HostCopy(d_units, static_cast<size_t>(std::min(r.num_units, n * K)));
  r.shared_units = HostCopy(d_shared, static_cast<size_t>((n + 7) / 8));
  r.slot = HostCopy(d_slot, static_cast<size_t>(n * K));
  if (logits != nullptr) {
    r.picks = HostCopy(d_picks, static_cast<size_t>(n * K));
    r.weights = HostCopy(d_weights, static_cast<size_t>(n * K));
    cudaFree(d_logits);
    cudaFree(d_weights);
  }
  cudaFree(d_picks);
  cudaFree(d_table);
  cudaFree(d_units);
  cudaFree(d_shared);
  cudaFree(d_slot);
  cudaFree(d_ints);
  return r;
}

// Top-K distinct experts per token, skewed so that some experts get many rows.
std::vector<int32_t> RandomPicks(int n, int K, int E, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> picks;
  for (int t = 0; t < n; ++t) {
    std::set<int32_t> chosen;
    while (static_cast<int>(chosen.size()) < K) {
      const int32_t e = (rng() % 4 == 0) ? static_cast<int32_t>(rng() % 3) : static_cast<int32_t>(rng() % E);
      if (chosen.insert(e).second) picks.push_back(e);
    }
  }
  return picks;
}

// The plan's invariants for `picks` (n × K): every pair one slot (a permutation of [0, n·K)), units
// of at most kMaxUnitRows rows at consecutive slots of one expert naming the pair's token, unit
// count per expert ceil(rows / kMaxUnitRows).
void ExpectValidPlan(const PlanResult& r, const std::vector<int32_t>& picks, int n, int K,
                     const std::vector<ExpertLocation>& table) {
  EXPECT_EQ(r.error, 0);
  std::map<int32_t, int> rows;
  for (int32_t e : picks) ++rows[e];
  int want_units = 0;
  for (auto& [e, c] : rows) want_units += (c + kMaxUnitRows - 1) / kMaxUnitRows;
  ASSERT_EQ(r.num_units, want_units);
  std::vector<int32_t> sorted = r.slot;
  std::sort(sorted.begin(), sorted.end());
  for (int i = 0; i < n * K; ++i) ASSERT_EQ(sorted[i], i);
  std::vector<int32_t> owner_token(static_cast<size_t>(n) * K), owner_expert(owner_token.size());
  for (int p = 0; p < n * K; ++p) {
    owner_token[r.slot[p]] = p / K;
    owner_expert[r.slot[p]] = picks[p];
  }
  int covered = 0;
  for (const ExpertUnit& u : r.units) {
    ASSERT_GE(u.rows, 1);
    ASSERT_LE(u.rows, kMaxUnitRows);
    const int32_t e = owner_expert[u.first_slot];
    EXPECT_EQ(u.gate, table[e].gate);
    EXPECT_EQ(u.up, table[e].up);
    EXPECT_EQ(u.down, table[e].down);
    for (int row = 0; row < u.rows; ++row) {
      EXPECT_EQ(owner_expert[u.first_slot + row], e);
      EXPECT_EQ(owner_token[u.first_slot + row], u.input_row[row]);
    }
    covered += u.rows;
  }
  EXPECT_EQ(covered, n * K);
}

TEST(DevicePlanTest, EveryPairGetsOneSlotInAUnitOfItsExpert) {
  TANDEM_BACKEND_SKIP_WITHOUT_GPU();
  const int K = 10, E = 512;
  std::vector<ExpertLocation> table(E);
  for (int e = 0; e < E; ++e) table[e] = FakeLocation(e);
  for (int n : {1, 2, 7, 8, 9, 33, 64}) {
    SCOPED_TRACE(n);
    const std::vector<int32_t> picks = RandomPicks(n, K, E, 100 + n);
    const PlanResult r = Plan(picks, n, K, E, table, /*with_shared=*/true);
    ExpectValidPlan(r, picks, n, K, table);
    // Shared expert: token t at slot t.
    for (int i = 0; i * kMaxUnitRows < n; ++i) {
      const ExpertUnit& u = r.shared_units[i];
      EXPECT_EQ(u.gate, FakeLocation(100000).gate);
      EXPECT_EQ(u.rows, std::min(kMaxUnitRows, n - i * kMaxUnitRows));
      EXPECT_EQ(u.first_slot, i * kMaxUnitRows);
      for (int row = 0; row < u.rows; ++row) EXPECT_EQ(u.input_row[row], i * kMaxUnitRows + row);
    }
  }
}

TEST(DevicePlanTest, PicksWithoutALocationAreFlaggedAndGetNoUnit) {
  TANDEM_BACKEND_SKIP_WITHOUT_GPU();
  const int n = 3, K = 2, E = 8;
  std::vector<ExpertLocation> table(E);
  for (int e = 0; e < E; ++e) table[e] = FakeLocation(e);
  table[5] = {};  // not on the device
  const std::vector<int32_t> picks = {1, 5, 2, 9, 1, 2};  // 5: no location; 9: outside [0, 8)
  const PlanResult r = Plan(picks, n, K, E, table, false);
  EXPECT_EQ(r.error, 1);
  EXPECT_EQ(r.slot[1], -1);
  EXPECT_EQ(r.slot[3], -1);
  int covered = 0;
  for (const ExpertUnit& u : r.units) covered += u.rows;
  EXPECT_EQ(covered, 4);
  EXPECT_EQ(r.num_units, 2);  // experts 1 and 2, two rows each
}

// The fused routing must pick what the route kernel picks, with the same weights.
TEST(DevicePlanTest, FusedRoutingEqualsTheRouteKernel) {
  TANDEM_BACKEND_SKIP_WITHOUT_GPU();
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  for (const auto& [n, E, K] : std::vector<std::tuple<int, int, int>>{{1, 512, 10}, {7, 100, 8}, {64, 512, 10},
                                                                      {3, 1024, 4}}) {
    SCOPED_TRACE(::testing::Message() << "n=" << n << " E=" << E << " K=" << K);
    std::vector<float> logits(static_cast<size_t>(n) * E);
    for (float& v : logits) v = normal(rng);
    logits[3] = logits[5];  // a tie: the lower id first
    float* d_logits = DeviceCopy(logits);
    int32_t* d_want_e = DeviceCopy(std::vector<int32_t>(static_cast<size_t>(n) * K));
    float* d_want_w = DeviceCopy(std::vector<float>(static_cast<size_t>(n) * K));
    ASSERT_EQ(LaunchRouteTopK(d_logits, n, E, K, d_want_e, d_want_w, nullptr), cudaSuccess);
    // The plan with fused routing over a table where every expert is present.
    std::vector<ExpertLocation> table(E);
    for (int e = 0; e < E; ++e) table[e] = FakeLocation(e);
    const PlanResult r = Plan(std::vector<int32_t>(static_cast<size_t>(n) * K, -7), n, K, E, table,
                              /*with_shared=*/false, &logits);
    const std::vector<int32_t> want_e = HostCopy(d_want_e, static_cast<size_t>(n) * K);
    const std::vector<float> want_w = HostCopy(d_want_w, static_cast<size_t>(n) * K);
    EXPECT_EQ(r.picks, want_e);
    ASSERT_EQ(r.weights.size(), want_w.size());
    for (size_t i = 0; i < r.weights.size(); ++i) EXPECT_NEAR(r.weights[i], want_w[i], 1e-6f * want_w[i]) << i;
    EXPECT_EQ(r.error, 0);
    // The plan covers every pair.
    std::vector<int32_t> sorted = r.slot;
    std::sort(sorted.begin(), sorted.end());
    for (int i = 0; i < n * K; ++i) ASSERT_EQ(sorted[i], i);
    for (void* p : std::initializer_list<void*>{d_logits, d_want_e, d_want_w}) cudaFree(p);
  }
}

TEST(DevicePlanTest, RefusesShapesItCannotPlan) {
  TANDEM_BACKEND_SKIP_WITHOUT_GPU();
  DeviceMoePlanArgs a;
  EXPECT_EQ(LaunchPlanMoeOnDevice(a, nullptr), cudaErrorInvalidValue);  // n = 0, null pointers
  a.n = 1;
  a.K = 1;
  a.E = kDevicePlanMaxExperts + 1;
  EXPECT_EQ(LaunchPlanMoeOnDevice(a, nullptr), cudaErrorInvalidValue);
}

// The shared expert's units that MoeStage builds once on the host for its decode table
// (DenseExpertUnits; unless TANDEM_OLD_SHARED_CHAIN) are those the unit kernel writes every step.
TEST(DevicePlanTest, HostDenseUnitsEqualTheUnitKernels) {
  TANDEM_BACKEND_SKIP_WITHOUT_GPU();
  const ExpertLocation where = FakeLocation(7);
  for (int n = 1; n <= 64; ++n) {
    SCOPED_TRACE(n);
    const size_t count = static_cast<size_t>((n + kMaxUnitRows - 1) / kMaxUnitRows);
    ExpertUnit* d_units = DeviceArrayOf<ExpertUnit>(count);
    ASSERT_EQ(LaunchDenseUnitsOnDevice(where, n, d_units, nullptr), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<ExpertUnit> got = HostCopy(d_units, count);
    const std::vector<ExpertUnit> want = DenseExpertUnits(where, n, 0);
    ASSERT_EQ(want.size(), count);
    for (size_t i = 0; i < count; ++i) {
      EXPECT_EQ(got[i].gate, want[i].gate);
      EXPECT_EQ(got[i].up, want[i].up);
      EXPECT_EQ(got[i].down, want[i].down);
      EXPECT_EQ(got[i].rows, want[i].rows);
      EXPECT_EQ(got[i].first_slot, want[i].first_slot);
      for (int r = 0; r < want[i].rows; ++r) EXPECT_EQ(got[i].input_row[r], want[i].input_row[r]) << "unit " << i;
    }
  }
}


// Runs LaunchRoutePlan (twice: the block counter must be left at zero) on logits (n × E); returns
// the plan, the picks and the weights.
PlanResult RoutePlan(int n, int K, int E, const std::vector<ExpertLocation>& table, bool with_shared,
                     const std::vector<float>& logits) {
  float* d_logits = DeviceCopy(logits);
  int32_t* d_picks = DeviceCopy(std::vector<int32_t>(static_cast<size_t>(n) * K, -7));
  float* d_weights = DeviceCopy(std::vector<float>(static_cast<size_t>(n) * K));
  ExpertLocation* d_table = DeviceCopy(table);
  ExpertUnit* d_units = DeviceCopy(std::vector<ExpertUnit>(static_cast<size_t>(n) * K));
  ExpertUnit* d_shared = DeviceCopy(std::vector<ExpertUnit>(static_cast<size_t>((n + 7) / 8)));
  int32_t* d_slot = DeviceCopy(std::vector<int32_t>(static_cast<size_t>(n) * K));
  int* d_ints = DeviceCopy(std::vector<int>(3, 0));
  RoutePlanArgs a;
  a.plan.logits = d_logits;
  a.plan.experts = a.plan.experts_out = d_picks;
  a.plan.weights_out = d_weights;
  a.plan.n = n;
  a.plan.K = K;
  a.plan.E = E;
  a.plan.table = d_table;
  if (with_shared) a.plan.shared = FakeLocation(100000);
  a.plan.units = d_units;
  a.plan.num_units = d_ints;
  a.plan.error = d_ints + 1;
  a.plan.slot = d_slot;
  a.plan.shared_units = d_shared;
  a.counter = reinterpret_cast<unsigned*>(d_ints + 2);
  PlanResult r;
  for (int run = 0; run < 2; ++run) {
    EXPECT_EQ(LaunchRoutePlan(a, nullptr), cudaSuccess);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<int> ints = HostCopy(d_ints, 3);
    EXPECT_EQ(ints[2], 0) << "block counter not reset";
    r.num_units = ints[0];
    r.error = ints[1];
  }
  r.units = HostCopy(d_units, static_cast<size_t>(std::clamp(r.num_units, 0, n * K)));
  r.shared_units = HostCopy(d_shared, static_cast<size_t>((n + 7) / 8));
  r.slot = HostCopy(d_slot, static_cast<size_t>(n * K));
  r.picks = HostCopy(d_picks, static_cast<size_t>(n * K));
  r.weights = HostCopy(d_weights, static_cast<size_t>(n * K));
  for (void* p : std::initializer_list<void*>{d_logits, d_picks, d_weights, d_table, d_units, d_shared, d_slot,
                                              d_ints}) {
    cudaFree(p);
  }
  return r;
}

// Picks and weights against the CPU reference RouteTokens on the same logits.
void ExpectReferenceRouting(const PlanResult& r, const std::vector<float>& logits, int n, int K, int E) {
  std::vector<int32_t> want_e(static_cast<size_t>(n) * K);
  std::vector<float> want_w(want_e.size());
  RouteTokens(logits.data(), n, E, K, want_e.data(), want_w.data());
  EXPECT_EQ(r.picks, want_e);
  ASSERT_EQ(r.weights.size(), want_w.size());
  for (size_t i = 0; i < want_w.size(); ++i) EXPECT_NEAR(r.weights[i], want_w[i], 1e-6f * want_w[i] + 1e-12f) << i;
}

// The route-and-plan kernel from given logits: the reference's picks and weights and a valid
// plan, with the candidate top-K (random logits) and its K-round fallback (many equal logits).
TEST(RoutePlanTest, RoutesLikeTheReferenceAndPlansEveryPair) {
  TANDEM_BACKEND_SKIP_WITHOUT_GPU();
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::uniform_int_distribution<int> level(0, 3);
  for (bool ties : {false, true}) {
    for (const auto& [n, E, K] : std::vector<std::tuple<int, int, int>>{
             {1, 512, 10}, {3, 512, 10}, {4, 100, 8}, {7, 100, 8}, {64, 512, 10}, {33, 1024, 4}, {2, 1024, 32},
             {5, 40, 32}, {300, 512, 10}, {2048, 512, 10}, {700, 1024, 4}}) {
      SCOPED_TRACE(::testing::Message() << "ties=" << ties << " n=" << n << " E=" << E << " K=" << K);
      std::vector<float> logits(static_cast<size_t>(n) * E);
      for (float& v : logits) v = ties ? 0.5f * level(rng) : normal(rng);
      logits[3] = logits[5];  // a tie: the lower id first
      std::vector<ExpertLocation> table(E);
      for (int e = 0; e < E; ++e) table[e] = FakeLocation(e);
      const PlanResult r = RoutePlan(n, K, E, table, /*with_shared=*/true, logits);
      ExpectReferenceRouting(r, logits, n, K, E);
      ExpectValidPlan(r, r.picks, n, K, table);
      for (int i = 0; i * kMaxUnitRows < n; ++i) {
        EXPECT_EQ(r.shared_units[i].rows, std::min(kMaxUnitRows, n - i * kMaxUnitRows));
        EXPECT_EQ(r.shared_units[i].first_slot, i * kMaxUnitRows);
      }
    }
  }
}

TEST(RoutePlanTest, RefusesShapesItCannotRoute) {
  TANDEM_BACKEND_SKIP_WITHOUT_GPU();
  RoutePlanArgs a;
  EXPECT_EQ(LaunchRoutePlan(a, nullptr), cudaErrorInvalidValue);  // n = 0, null pointers
}

}  // namespace
}  // namespace tandem::cuda
