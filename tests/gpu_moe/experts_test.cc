// The decode expert path (planner + fused gate/up and down kernels, exact mode) against the
// reference expert FFN.
#include "gpu_service/backends/cuda/moe/experts.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <initializer_list>
#include <set>
#include <string>
#include <utility>

#include "common/reference/moe.h"
#include "gpu_service/backends/cuda/moe/expert_decode.cuh"
#include "gpu_service/backends/cuda/moe/matvec.cuh"
#include "gpu_service/backends/cuda/weight_type_ids.h"
#include "tests/gpu_moe/test_support.h"
#include "tests/test_seed.h"

namespace tandem::cuda {
namespace {

using testing::Download;
using testing::PoisonedBuffer;
using testing::RandomMatrix;
using testing::Upload;

// Random picks: K distinct experts per token.
std::vector<int32_t> RandomPicks(std::mt19937& rng, int64_t n, int64_t E, int64_t K) {
  std::vector<int32_t> picks;
  std::vector<int32_t> ids(static_cast<size_t>(E));
  for (int64_t t = 0; t < n; ++t) {
    for (int32_t e = 0; e < E; ++e) ids[e] = e;
    std::shuffle(ids.begin(), ids.end(), rng);
    picks.insert(picks.end(), ids.begin(), ids.begin() + K);
  }
  return picks;
}

struct TypePair {
  WeightType gate_up, down;
};

class ExpertDecodeTest : public ::testing::TestWithParam<TypePair> {};

// Every (token, pick) row computed by the GPU units equals FFN_e(x_t) of the reference; the experts
// live in separate device allocations (the path takes locations, not a layout).
TEST_P(ExpertDecodeTest, MatchesReferenceFfn) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng = ::tandem::testing::SeededRng();
  const TypePair types = GetParam();
  const int64_t h = 512, I = 256, E = 6;
  for (int64_t n : {1, 2, 9, 19}) {
    const int64_t K = std::min<int64_t>(4, E);
    const testing::RandomExperts w = testing::MakeRandomExperts(rng, types.gate_up, types.down, h, I, E);
    const std::vector<float> x = testing::RandomVector(rng, n * h);
    DeviceBuffer dx = Upload(x);
    const std::vector<int32_t> picks = RandomPicks(rng, n, E, K);
    absl::StatusOr<MoeStepPlan> plan = PlanMoeStep(picks, n, K, E, [&](int32_t e) -> std::optional<ExpertLocation> {
      return ExpertLocation{w.dgate[e].get(), w.dup[e].get(), w.ddown[e].get()};
    });
    ASSERT_TRUE(plan.ok()) << plan.status();
    ASSERT_EQ(plan->gpu_slots, n * K);
    absl::StatusOr<ExpertDecodeRunner> runner = ExpertDecodeRunner::Create(64);
    ASSERT_TRUE(runner.ok()) << runner.status();
    DeviceBuffer act = PoisonedBuffer(static_cast<size_t>(n * K * I) * sizeof(float));
    DeviceBuffer partial = PoisonedBuffer(static_cast<size_t>(n * K * h) * sizeof(float));
    const absl::Status s = runner->Run(plan->units, {types.gate_up, types.down, h, I}, dx.as<float>(), act.as<float>(),
                                       partial.as<float>(), nullptr);
    ASSERT_TRUE(s.ok()) << s;
    const std::vector<float> got = Download<float>(partial.get(), static_cast<size_t>(n * K * h));
    std::vector<float> ref(got.size());
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t k = 0; k < K; ++k) {
        const int32_t e = picks[t * K + k];
        const MatrixView g = testing::HostMatrix(types.gate_up, w.gate[e], h, I);
        const MatrixView u = testing::HostMatrix(types.gate_up, w.up[e], h, I);
        const MatrixView d = testing::HostMatrix(types.down, w.down[e], I, h);
        FfnForward(g, u, d, x.data() + t * h, 1, ref.data() + plan->slot[t * K + k] * h, nullptr);
      }
    }
    ASSERT_TRUE(testing::AllFinite(got)) << "unwritten partial rows, n=" << n;
    EXPECT_LE(testing::RelativeL2(got, ref), 1e-5) << "n=" << n;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Types, ExpertDecodeTest,
    ::testing::Values(TypePair{WeightType::kQ4_K, WeightType::kQ4_K}, TypePair{WeightType::kQ2_K, WeightType::kQ4_K},
                      TypePair{WeightType::kQ5_K, WeightType::kQ6_K}, TypePair{WeightType::kQ6_K, WeightType::kQ5_K},
                      TypePair{WeightType::kQ3_K, WeightType::kQ8_0}, TypePair{WeightType::kQ8_0, WeightType::kQ3_K},
                      TypePair{WeightType::kF16, WeightType::kBF16}));

// The decode shapes of Qwen3-Next-80B (h 2048, I 512, K 10) through the launchers: 1 and 8
// tokens (up to 8 rows per unit), the decode formats for gate/up and down.
TEST(ExpertMatVecTest, MatchesReferenceOnModelShapes) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng = ::tandem::testing::SeededRng();
  const int64_t h = 2048, I = 512, E = 12, K = 10;
  for (const TypePair types : {TypePair{WeightType::kQ4_K, WeightType::kQ4_K}, TypePair{WeightType::kQ8_0, WeightType::kQ6_K},
                               TypePair{WeightType::kQ5_K, WeightType::kQ8_0}}) {
    const testing::RandomExperts w = testing::MakeRandomExperts(rng, types.gate_up, types.down, h, I, E);
    for (int64_t n : {1, 8}) {
      const std::vector<float> x = testing::RandomVector(rng, n * h);
      DeviceBuffer dx = Upload(x);
      const std::vector<int32_t> picks = RandomPicks(rng, n, E, K);
      absl::StatusOr<MoeStepPlan> plan = PlanMoeStep(picks, n, K, E, [&](int32_t e) -> std::optional<ExpertLocation> {
        return ExpertLocation{w.dgate[e].get(), w.dup[e].get(), w.ddown[e].get()};
      });
      ASSERT_TRUE(plan.ok()) << plan.status();
      DeviceBuffer dunits = Upload(plan->units);
      const int units = static_cast<int>(plan->units.size());
      DeviceBuffer act = PoisonedBuffer(static_cast<size_t>(n * K * I) * sizeof(float));
      DeviceBuffer partial = PoisonedBuffer(static_cast<size_t>(n * K * h) * sizeof(float));
      TANDEM_ASSERT_CUDA(LaunchExpertGateUp(static_cast<uint32_t>(types.gate_up), dunits.as<ExpertUnit>(), units,
                                            plan->max_unit_rows, h, I, dx.as<float>(), act.as<float>(), nullptr));
      TANDEM_ASSERT_CUDA(LaunchExpertDown(static_cast<uint32_t>(types.down), dunits.as<ExpertUnit>(), units,
                                          plan->max_unit_rows, I, h, act.as<float>(), partial.as<float>(), nullptr));
      const std::vector<float> got = Download<float>(partial.get(), static_cast<size_t>(n * K * h));
      std::vector<float> ref(got.size());
      for (int64_t t = 0; t < n; ++t) {
        for (int64_t k = 0; k < K; ++k) {
          const int32_t e = picks[t * K + k];
          FfnForward(testing::HostMatrix(types.gate_up, w.gate[e], h, I), testing::HostMatrix(types.gate_up, w.up[e], h, I),
                     testing::HostMatrix(types.down, w.down[e], I, h), x.data() + t * h, 1,
                     ref.data() + plan->slot[t * K + k] * h, nullptr);
        }
      }
      ASSERT_TRUE(testing::AllFinite(got)) << "unwritten partial rows, n=" << n;
      const double err = testing::RelativeL2(got, ref);
      std::printf("[ parity   ] experts %s/%s n=%lld rel_l2=%.3e\n", std::string(GetWeightTypeInfo(types.gate_up).name).c_str(),
                  std::string(GetWeightTypeInfo(types.down).name).c_str(), static_cast<long long>(n), err);
      EXPECT_LE(err, 1e-5) << "n=" << n;
    }
  }
}

// device_num_units (CUDA-graph capture): the grid covers every unit, but units at index >= the
// count read on the device leave their outputs untouched; the others are computed.
TEST(ExpertMatVecTest, DeviceUnitCountSkipsLaterUnits) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng = ::tandem::testing::SeededRng();
  const int64_t h = 512, I = 256;
  for (const WeightType type : {WeightType::kQ4_K, WeightType::kQ8_0, WeightType::kQ2_K}) {
    const int num_units = 4;
    const testing::RandomExperts w = testing::MakeRandomExperts(rng, type, type, h, I, num_units);
    std::vector<ExpertUnit> units(num_units);
    for (int u = 0; u < num_units; ++u) {
      units[u] = ExpertUnit{w.dgate[u].get(), w.dup[u].get(), w.ddown[u].get(), 1, u, {u, 0, 0, 0, 0, 0, 0, 0}};
    }
    const std::vector<float> x = testing::RandomVector(rng, num_units * h);
    DeviceBuffer dx = Upload(x);
    DeviceBuffer dunits = Upload(units);
    for (int count : {0, 2, num_units}) {
      DeviceBuffer dcount = Upload(std::vector<int32_t>{count});
      DeviceBuffer act = PoisonedBuffer(static_cast<size_t>(num_units * I) * sizeof(float));
      DeviceBuffer partial = PoisonedBuffer(static_cast<size_t>(num_units * h) * sizeof(float));
      TANDEM_ASSERT_CUDA(LaunchExpertGateUp(static_cast<uint32_t>(type), dunits.as<ExpertUnit>(), num_units, 1, h, I,
                                            dx.as<float>(), act.as<float>(), nullptr, dcount.as<int>()));
      TANDEM_ASSERT_CUDA(LaunchExpertDown(static_cast<uint32_t>(type), dunits.as<ExpertUnit>(), num_units, 1, I, h,
                                          act.as<float>(), partial.as<float>(), nullptr, dcount.as<int>()));
      const std::vector<float> got = Download<float>(partial.get(), static_cast<size_t>(num_units * h));
      const std::vector<float> got_act = Download<float>(act.get(), static_cast<size_t>(num_units * I));
      for (int u = 0; u < num_units; ++u) {
        const std::vector<float> row(got.begin() + u * h, got.begin() + (u + 1) * h);
        if (u >= count) {
          for (int64_t i = 0; i < h; ++i) ASSERT_TRUE(std::isnan(row[i])) << "unit " << u << " written, count " << count;
          for (int64_t i = 0; i < I; ++i) ASSERT_TRUE(std::isnan(got_act[u * I + i])) << "unit " << u << " act written";
          continue;
        }
        std::vector<float> ref(static_cast<size_t>(h));
        FfnForward(testing::HostMatrix(type, w.gate[u], h, I), testing::HostMatrix(type, w.up[u], h, I),
                   testing::HostMatrix(type, w.down[u], I, h), x.data() + u * h, 1, ref.data(), nullptr);
        EXPECT_LE(testing::RelativeL2(row, ref), 1e-5) << "unit " << u << ", count " << count;
      }
    }
  }
}

// E random experts of one shape, on the host (for the reference) and on the device (each matrix in
// its own allocation).
struct ExpertSet : testing::RandomExperts {
  ExpertSet(std::mt19937& rng, TypePair t, int64_t h_, int64_t I_, int64_t E)
      : testing::RandomExperts(testing::MakeRandomExperts(rng, t.gate_up, t.down, h_, I_, E)), types(t), h(h_), I(I_) {}
  // FFN_e(x) of one row (h wide) into out.
  void Reference(int64_t e, const float* x, float* out) const {
    FfnForward(testing::HostMatrix(types.gate_up, gate[e], h, I), testing::HostMatrix(types.gate_up, up[e], h, I),
               testing::HostMatrix(types.down, down[e], I, h), x, 1, out, nullptr);
  }
  TypePair types;
  int64_t h, I;
};

// Units with the given row counts over random experts of `set`, reading random (repeating,
// unordered) input rows of an n-row x; each unit's slots follow the previous unit's with a gap of
// one unowned slot after every odd unit. Returns the units and sets *slots to the slot count.
std::vector<ExpertUnit> MakeUnits(std::mt19937& rng, const ExpertSet& set, const std::vector<int>& rows, int64_t n,
                                  std::vector<int32_t>* expert_of_unit, int* slots) {
  std::vector<ExpertUnit> units;
  int next = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    const int32_t e = static_cast<int32_t>(rng() % set.dgate.size());
    ExpertUnit u{set.dgate[e].get(), set.dup[e].get(), set.ddown[e].get(), rows[i], next, {0, 0, 0, 0, 0, 0, 0, 0}};
    for (int r = 0; r < rows[i]; ++r) u.input_row[r] = static_cast<int32_t>(rng() % n);
    next += rows[i] + static_cast<int>(i % 2);
    units.push_back(u);
    expert_of_unit->push_back(e);
  }
  *slots = next;
  return units;
}

// Which launchers CheckUnits calls: the routed ones of matvec.cuh (the decode kernel for the types
// ExpertDecodeRoutesType names, the older kernel otherwise) or expert_decode.cuh's directly.
enum class Path { kRouted, kDecode };

// Launches gate/up + down over `units` through each of `paths` (the first `count` units computed
// when count >= 0 is passed through device_num_units) and checks every computed slot against the
// reference, and that every other slot of act and partial keeps its NaN poison.
void CheckUnits(const ExpertSet& set, const std::vector<ExpertUnit>& units, const std::vector<int32_t>& expert_of_unit,
                int slots, const std::vector<float>& x, int max_rows, int count, const std::string& what,
                std::initializer_list<Path> paths = {Path::kRouted, Path::kDecode}) {
  const int64_t h = set.h, I = set.I;
  const int num = static_cast<int>(units.size());
  const int computed = count >= 0 ? std::min(count, num) : num;
  std::vector<bool> owned(static_cast<size_t>(slots), false);
  std::vector<int> owned_slots;
  std::vector<float> ref_rows;
  for (int i = 0; i < computed; ++i) {
    const ExpertUnit& u = units[i];
    for (int r = 0; r < u.rows; ++r) {
      owned[u.first_slot + r] = true;
      owned_slots.push_back(u.first_slot + r);
      std::vector<float> ref(static_cast<size_t>(h));
      set.Reference(expert_of_unit[i], x.data() + static_cast<int64_t>(u.input_row[r]) * h, ref.data());
      ref_rows.insert(ref_rows.end(), ref.begin(), ref.end());
    }
  }
  DeviceBuffer dx = Upload(x);
  DeviceBuffer dunits = Upload(units);
  DeviceBuffer dcount = Upload(std::vector<int32_t>{count});
  const int* device_count = count >= 0 ? dcount.as<int>() : nullptr;
  const uint32_t gu = static_cast<uint32_t>(set.types.gate_up), dn = static_cast<uint32_t>(set.types.down);
  for (const Path path : paths) {
    const std::string label = what + (path == Path::kRouted ? " [routed]" : " [decode kernel]");
    DeviceBuffer act = PoisonedBuffer(static_cast<size_t>(slots * I) * sizeof(float));
    DeviceBuffer partial = PoisonedBuffer(static_cast<size_t>(slots * h) * sizeof(float));
    const ExpertUnit* du = dunits.as<ExpertUnit>();
    if (path == Path::kRouted) {
      TANDEM_ASSERT_CUDA(LaunchExpertGateUp(gu, du, num, max_rows, h, I, dx.as<float>(), act.as<float>(), nullptr, device_count));
      TANDEM_ASSERT_CUDA(LaunchExpertDown(dn, du, num, max_rows, I, h, act.as<float>(), partial.as<float>(), nullptr, device_count));
    } else {
      TANDEM_ASSERT_CUDA(
          LaunchExpertDecodeGateUp(gu, du, num, max_rows, h, I, dx.as<float>(), act.as<float>(), nullptr, device_count));
      TANDEM_ASSERT_CUDA(
          LaunchExpertDecodeDown(dn, du, num, max_rows, I, h, act.as<float>(), partial.as<float>(), nullptr, device_count));
    }
    const std::vector<float> got = Download<float>(partial.get(), static_cast<size_t>(slots * h));
    const std::vector<float> got_act = Download<float>(act.get(), static_cast<size_t>(slots * I));
    for (int slot = 0; slot < slots; ++slot) {
      if (owned[slot]) continue;
      for (int64_t i = 0; i < h; ++i) ASSERT_TRUE(std::isnan(got[slot * h + i])) << label << ": partial slot " << slot << " written";
      for (int64_t i = 0; i < I; ++i) ASSERT_TRUE(std::isnan(got_act[slot * I + i])) << label << ": act slot " << slot << " written";
    }
    std::vector<float> got_rows;
    for (int slot : owned_slots) got_rows.insert(got_rows.end(), got.begin() + slot * h, got.begin() + (slot + 1) * h);
    ASSERT_TRUE(testing::AllFinite(got_rows)) << label << ": unwritten partial rows";
    if (!got_rows.empty()) {
      EXPECT_LE(testing::RelativeL2(got_rows, ref_rows), 1e-5) << label;
    }
  }
}

std::string Describe(const TypePair& t, int64_t h, int64_t I, const std::vector<int>& rows, int max_rows, int count) {
  std::string s = std::string(GetWeightTypeInfo(t.gate_up).name) + "/" + std::string(GetWeightTypeInfo(t.down).name) +
                  " h=" + std::to_string(h) + " I=" + std::to_string(I) + " max_rows=" + std::to_string(max_rows) +
                  " count=" + std::to_string(count) + " rows={";
  for (int r : rows) s += std::to_string(r) + ",";
  return s + "}";
}

class ExpertDecodeKernelTest : public ::testing::TestWithParam<TypePair> {};

// The decode kernels (expert_decode.cuh: directly, and through LaunchExpertGateUp /
// LaunchExpertDown, which route Q4_K to them and the other types to the older kernel) for every
// row bucket (max_rows 1, 2, 4, 8), units of 1..8 rows mixed in one launch, odd unit counts, a
// bucket larger than any unit's rows, and shapes whose row pieces are not a power of two
// (768 = 24 pieces: 8 lanes × 3 for gate/up, 4 lanes × 6 for down) or odd (544 = 17 pieces).
TEST_P(ExpertDecodeKernelTest, MixedRowCountsMatchReference) {
  TANDEM_SKIP_WITHOUT_GPU();
  ASSERT_EQ(GetExpertKernelChoice(), ExpertKernelChoice::kDecode);
  std::mt19937 rng = ::tandem::testing::SeededRng();
  const TypePair types = GetParam();
  struct Case {
    std::vector<int> rows;
    int max_rows;
  };
  const std::vector<Case> cases = {{{1, 1, 1, 1, 1}, 1},          {{1, 2, 1, 2, 2, 1, 1}, 2}, {{3, 1, 4, 2, 1}, 4},
                                   {{8, 1, 5, 7, 2, 6, 3, 4, 1}, 8}, {{1, 1, 1}, 8},             {{2}, 4}};
  std::vector<std::pair<int64_t, int64_t>> shapes = {{512, 256}, {768, 768}};
  if (!IsKQuant(static_cast<uint32_t>(types.gate_up)) && !IsKQuant(static_cast<uint32_t>(types.down))) {
    shapes.push_back({544, 96});
  }
  for (const auto& [h, I] : shapes) {
    const ExpertSet set(rng, types, h, I, 4);
    const int64_t n = 5;
    const std::vector<float> x = testing::RandomVector(rng, n * h);
    for (const Case& c : cases) {
      // The larger shape only for the all-row-counts case (the CPU reference dominates the time).
      if (h == 768 && c.max_rows != 8) continue;
      std::vector<int32_t> experts;
      int slots = 0;
      const std::vector<ExpertUnit> units = MakeUnits(rng, set, c.rows, n, &experts, &slots);
      CheckUnits(set, units, experts, slots, x, c.max_rows, -1, Describe(types, h, I, c.rows, c.max_rows, -1));
    }
  }
}

// device_num_units with multi-row units and an odd unit count, both paths: units at index >= count
// leave act and partial untouched, the others are computed.
TEST_P(ExpertDecodeKernelTest, DeviceUnitCountCutsMixedUnits) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng = ::tandem::testing::SeededRng();
  const TypePair types = GetParam();
  const int64_t h = 512, I = 256, n = 4;
  const ExpertSet set(rng, types, h, I, 3);
  const std::vector<float> x = testing::RandomVector(rng, n * h);
  const std::vector<int> rows = {2, 1, 3, 1, 8, 1, 2};
  std::vector<int32_t> experts;
  int slots = 0;
  const std::vector<ExpertUnit> units = MakeUnits(rng, set, rows, n, &experts, &slots);
  for (int count : {0, 1, 4, 7}) {
    CheckUnits(set, units, experts, slots, x, kMaxUnitRows, count, Describe(types, h, I, rows, kMaxUnitRows, count));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Types, ExpertDecodeKernelTest,
    ::testing::Values(TypePair{WeightType::kQ4_K, WeightType::kQ4_K}, TypePair{WeightType::kQ2_K, WeightType::kQ4_K},
                      TypePair{WeightType::kQ5_K, WeightType::kQ6_K}, TypePair{WeightType::kQ6_K, WeightType::kQ5_K},
                      TypePair{WeightType::kQ3_K, WeightType::kQ8_0}, TypePair{WeightType::kQ8_0, WeightType::kQ3_K},
                      TypePair{WeightType::kQ8_0, WeightType::kQ6_K}, TypePair{WeightType::kQ5_K, WeightType::kQ8_0},
                      TypePair{WeightType::kF16, WeightType::kBF16}, TypePair{WeightType::kQ4_0, WeightType::kF32}));

// The older kernel (matvec_impl.cuh) stays selectable for the benchmark's before/after: it is
// still correct on mixed units.
TEST(ExpertMatVecTest, GenericKernelChoiceStillMatchesReference) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng = ::tandem::testing::SeededRng();
  const TypePair types{WeightType::kQ4_K, WeightType::kQ6_K};
  const ExpertSet set(rng, types, 512, 256, 3);
  const std::vector<float> x = testing::RandomVector(rng, 3 * 512);
  const std::vector<int> rows = {1, 3, 2};
  std::vector<int32_t> experts;
  int slots = 0;
  const std::vector<ExpertUnit> units = MakeUnits(rng, set, rows, 3, &experts, &slots);
  SetExpertKernelChoice(ExpertKernelChoice::kGeneric);
  CheckUnits(set, units, experts, slots, x, 4, 2, "generic kernel, count 2", {Path::kRouted});
  CheckUnits(set, units, experts, slots, x, 4, -1, "generic kernel", {Path::kRouted});
  SetExpertKernelChoice(ExpertKernelChoice::kDecode);
}

// The Q4_K tile kernel (expert_decode_q4k.cuh) with 2, 4 and 8 warps per block (8 warps × 3-4 steps
// are cut to the steps whose shared memory fits) and 1..4 steps per warp (the default rule picks 1
// or 2): the per-step cp.async groups are waited in order, partial last steps (768 rows at 10 rows
// per step) and units of more rows than one pass (kR = 2) reuse the weights in shared memory; and
// the previous per-piece Q4_K kernel, still selectable, stays correct.
TEST(ExpertMatVecTest, Q4KTileStepsAndPieceChoiceMatchReference) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng = ::tandem::testing::SeededRng();
  const TypePair types{WeightType::kQ4_K, WeightType::kQ4_K};
  for (const auto& [h, I] : std::vector<std::pair<int64_t, int64_t>>{{2048, 512}, {768, 768}}) {
    const ExpertSet set(rng, types, h, I, 3);
    const int64_t n = 4;
    const std::vector<float> x = testing::RandomVector(rng, n * h);
    const std::vector<int> rows = {1, 5, 2, 8};
    std::vector<int32_t> experts;
    int slots = 0;
    const std::vector<ExpertUnit> units = MakeUnits(rng, set, rows, n, &experts, &slots);
    for (int warps : {2, 4, 8}) {
      SetExpertDecodeTileWarps(warps);
      for (int steps : {1, 2, 3, 4}) {
        SetExpertDecodeStepsPerWarp(steps);
        CheckUnits(set, units, experts, slots, x, kMaxUnitRows, -1,
                   "tiles, " + std::to_string(warps) + " warps, steps " + std::to_string(steps) + " " +
                       Describe(types, h, I, rows, kMaxUnitRows, -1),
                   {Path::kDecode});
      }
      // One-row launches (kR = 1) with a device count.
      SetExpertDecodeStepsPerWarp(0);
      const std::vector<int> ones = {1, 1, 1, 1, 1};
      std::vector<int32_t> one_experts;
      int one_slots = 0;
      const std::vector<ExpertUnit> one_units = MakeUnits(rng, set, ones, n, &one_experts, &one_slots);
      CheckUnits(set, one_units, one_experts, one_slots, x, 1, 4,
                 "tiles, " + std::to_string(warps) + " warps, one-row " + Describe(types, h, I, ones, 1, 4),
                 {Path::kDecode});
    }
    SetExpertDecodeTileWarps(0);
    SetExpertDecodeStepsPerWarp(0);
    SetExpertKernelChoice(ExpertKernelChoice::kDecodePieces);
    CheckUnits(set, units, experts, slots, x, kMaxUnitRows, 3, "per-piece kernel, count 3");
    SetExpertKernelChoice(ExpertKernelChoice::kDecode);
  }
}

TEST(PlanMoeStepTest, SplitsGpuAndOffloadedPairsIntoDistinctSlots) {
  std::mt19937 rng = ::tandem::testing::SeededRng();
  const int64_t n = 21, E = 8, K = 3;
  const std::vector<int32_t> picks = RandomPicks(rng, n, E, K);
  static const char kWeights[64] = {};
  absl::StatusOr<MoeStepPlan> plan = PlanMoeStep(picks, n, K, E, [&](int32_t e) -> std::optional<ExpertLocation> {
    if (e % 3 == 0) return std::nullopt;
    return ExpertLocation{kWeights, kWeights + 16, kWeights + 32};
  });
  ASSERT_TRUE(plan.ok()) << plan.status();
  std::set<int32_t> slots(plan->slot.begin(), plan->slot.end());
  EXPECT_EQ(static_cast<int64_t>(slots.size()), n * K);
  EXPECT_EQ(*slots.begin(), 0);
  EXPECT_EQ(*slots.rbegin(), plan->total_slots - 1);
  int64_t gpu_rows = 0;
  for (const ExpertUnit& u : plan->units) {
    EXPECT_GE(u.rows, 1);
    EXPECT_LE(u.rows, kMaxUnitRows);
    gpu_rows += u.rows;
  }
  EXPECT_EQ(gpu_rows, plan->gpu_slots);
  for (const OffloadedPair& p : plan->offloaded) {
    EXPECT_EQ(p.expert % 3, 0);
    EXPECT_GE(p.slot, plan->gpu_slots);
    bool found = false;
    for (int64_t k = 0; k < K; ++k) found |= picks[p.token * K + k] == p.expert && plan->slot[p.token * K + k] == p.slot;
    EXPECT_TRUE(found) << "offloaded pair (" << p.expert << ", " << p.token << ") has the wrong slot";
  }
  EXPECT_FALSE(PlanMoeStep({picks.data(), 3}, 1, 3, 2, [](int32_t) { return std::nullopt; }).ok());
}

TEST(ExpertDecodeRunnerTest, RefusesMisalignedAndEmptyUnits) {
  TANDEM_SKIP_WITHOUT_GPU();
  absl::StatusOr<ExpertDecodeRunner> runner = ExpertDecodeRunner::Create(4);
  ASSERT_TRUE(runner.ok()) << runner.status();
  DeviceBuffer w = PoisonedBuffer(4096);
  ExpertUnit u{};
  u.gate = static_cast<char*>(w.get()) + 2;  // Q4_K needs 16-byte alignment
  u.up = w.get();
  u.down = w.get();
  u.rows = 1;
  std::vector<ExpertUnit> units = {u};
  absl::Status s = runner->Run(units, {WeightType::kQ4_K, WeightType::kQ4_K, 256, 256}, nullptr, nullptr, nullptr, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  units[0].gate = w.get();
  units[0].rows = 0;
  s = runner->Run(units, {WeightType::kQ4_K, WeightType::kQ4_K, 256, 256}, nullptr, nullptr, nullptr, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
}

}  // namespace
}  // namespace tandem::cuda
