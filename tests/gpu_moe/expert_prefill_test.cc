// The prefill expert path (both algorithms, every tile height) against the reference FFN. Its
// host-side tile planning is tested in prefill_choice_test.cc.
#include "gpu_service/backends/cuda/moe/expert_prefill.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <random>
#include <string>

#include "common/reference/moe.h"
#include "common/weights/half.h"
#include "gpu_service/backends/cuda/kernels/norm_streams.cuh"
#include "gpu_service/backends/cuda/moe/expert_prefill.cuh"
#include "gpu_service/backends/cuda/moe/expert_prefill_mmq.cuh"
#include "gpu_service/backends/cuda/moe/expert_prefill_wgexp.cuh"
#include "gpu_service/backends/cuda/weight_type_ids.h"
#include "tests/gpu_moe/test_support.h"
#include "tests/test_seed.h"

namespace tandem::cuda {
namespace {

using testing::Download;
using testing::LaunchReadNorm;
using testing::PoisonedBuffer;
using testing::RandomMatrix;
using testing::Upload;

// The f16 dequantizer returns DequantizeRow's values rounded to f16.
TEST(DequantizeToF16Test, MatchesReferenceRounded) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng = ::tandem::testing::SeededRng();
  for (WeightType type : {WeightType::kQ2_K, WeightType::kQ3_K, WeightType::kQ4_K, WeightType::kQ5_K, WeightType::kQ6_K,
                          WeightType::kQ8_0, WeightType::kQ4_0, WeightType::kF16, WeightType::kF32}) {
    const int64_t cols = 512, rows = 5;
    const std::vector<uint8_t> w = RandomMatrix(rng, type, cols, rows, 1.0f);
    DeviceBuffer dw = Upload(w);
    DeviceBuffer out = PoisonedBuffer(static_cast<size_t>(cols * rows) * 2);
    ASSERT_EQ(LaunchDequantizeToF16(static_cast<uint32_t>(type), dw.get(), cols, rows, out.as<uint16_t>(), nullptr),
              cudaSuccess);
    const std::vector<uint16_t> got = Download<uint16_t>(out.get(), static_cast<size_t>(cols * rows));
    std::vector<float> ref(static_cast<size_t>(cols));
    const int64_t row_bytes = *RowBytes(type, cols);
    int64_t mismatches = 0;
    for (int64_t r = 0; r < rows; ++r) {
      DequantizeRow(type, w.data() + r * row_bytes, ref.data(), cols);
      for (int64_t c = 0; c < cols; ++c) {
        // One f16 ulp of slack: the device may fuse the dequantizer's final multiply-add.
        const float g = Fp16ToFp32(got[r * cols + c]);
        if (std::fabs(g - ref[c]) > std::fabs(ref[c]) * (1.0f / 128) + 1e-30f) ++mismatches;
      }
    }
    EXPECT_EQ(mismatches, 0) << "type " << static_cast<int>(type);
  }
}

struct PrefillCase {
  WeightType gu_type, d_type;
  int64_t h, I, E, K, n;
};

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

// Runs one random layer through a runner made with each of `all` (both algorithms, every tile
// height); relative L2 against FfnForward.
// expected_tile_rows (0: unchecked): the height the chosen-height kGroupedTilesPipelined runner
// must pick. A chosen-height kGroupedTiles runner on a streamed shape must report 64.
// skewed: token t picks experts by a weighted draw (expert e with weight 2e + 1) instead of the
// round robin (t + 2k) % E.
// counts (K must be 1): expert e takes counts[e] tokens (0: none), tokens in shuffled order; n
// must be the sum. mmq_rel_l2: the bound for runs on the integer-MMA kernel (kMmq*, or
// kStreamedAuto where it takes kMmq), tighter than the f16 paths' 1e-2. same_bits: every option's
// output (host- and device-planned) must equal the first option's bit for bit. weight_sets (0: E):
// expert e uses weight set e % weight_sets (many experts, hence many tiles, without generating and
// uploading E sets). cross_rel_l2 (0: unchecked): every option's output within this relative L2 of
// the first option's (kernels on the same f16 weights and activations, differing in f32 order).
void ExpectMatchesReference(const PrefillCase& c, const std::vector<PrefillOptions>& all, int expected_tile_rows = 0,
                            bool skewed = false, const std::vector<int>& counts = {}, double mmq_rel_l2 = 2e-3,
                            bool same_bits = false, int64_t weight_sets = 0, double cross_rel_l2 = 0) {
  std::mt19937 rng = ::tandem::testing::SeededRng();
  const int64_t h = c.h, I = c.I, E = c.E, K = c.K, n = c.n;
  const int64_t W = weight_sets > 0 ? std::min(weight_sets, E) : E;
  std::vector<std::vector<uint8_t>> gate(W), up(W), down(W);
  std::vector<DeviceBuffer> dg, du, dd;
  for (int64_t e = 0; e < W; ++e) {
    gate[e] = RandomMatrix(rng, c.gu_type, h, I, 0.05f);
    up[e] = RandomMatrix(rng, c.gu_type, h, I, 0.05f);
    down[e] = RandomMatrix(rng, c.d_type, I, h, 0.05f);
    dg.push_back(Upload(gate[e]));
    du.push_back(Upload(up[e]));
    dd.push_back(Upload(down[e]));
  }
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
    return ExpertLocation{dg[e % W].get(), du[e % W].get(), dd[e % W].get()};
  });
  ASSERT_TRUE(plan.ok()) << plan.status();
  std::vector<float> ref(static_cast<size_t>(n * K * h));
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t k = 0; k < K; ++k) {
      const int32_t e = static_cast<int32_t>(picks[t * K + k] % W);
      FfnForward(testing::HostMatrix(c.gu_type, gate[e], h, I), testing::HostMatrix(c.gu_type, up[e], h, I),
                 testing::HostMatrix(c.d_type, down[e], I, h), x.data() + t * h, 1,
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

// Every algorithm; both grouped algorithms at the chosen and at every fixed tile height (on Q4_K
// shapes kGroupedTiles at 16, 32 and 64 is the streamed kernel with that bound on tile rows).
std::vector<PrefillOptions> AllOptions() {
  std::vector<PrefillOptions> all = {{PrefillAlgorithm::kCublasPerExpert, 0, 0}};
  for (PrefillAlgorithm a : {PrefillAlgorithm::kGroupedTiles, PrefillAlgorithm::kGroupedTilesPipelined}) {
    all.push_back({a, 0, 0});
    for (int rows : kPrefillTileRows) all.push_back({a, rows, 0});
  }
  return all;
}

// Few rows per expert (the 512-token regime): Q4_K gate/up, Q6_K down.
TEST(ExpertPrefillTest, MatchesReferenceFfnWithinF16Tolerance) {
  TANDEM_SKIP_WITHOUT_GPU();
  ExpectMatchesReference({WeightType::kQ4_K, WeightType::kQ6_K, 512, 256, 5, 3, 40}, AllOptions());
}

// Groups of about 200 rows (several tiles per expert at every tile height), Q4_K down as in the
// 80B model, h and I not multiples of the pipelined kernel's 128-column block. Streamed: h = 768
// is three super-blocks (6 stages of 128 per gate/up unit, 2 per down unit).
TEST(ExpertPrefillTest, LargeGroupsMatchReference) {
  TANDEM_SKIP_WITHOUT_GPU();
  ExpectMatchesReference({WeightType::kQ4_K, WeightType::kQ4_K, 768, 256, 3, 2, 300}, AllOptions());
}

// Q8_0 with h = 320 and I = 96: the last 64-deep step is half empty (I) and the last column block
// is partly outside (h, and 2·I for gate/up).
TEST(ExpertPrefillTest, RaggedShapesMatchReference) {
  TANDEM_SKIP_WITHOUT_GPU();
  ExpectMatchesReference({WeightType::kQ8_0, WeightType::kQ8_0, 320, 96, 4, 2, 70}, AllOptions());
}

// Groups of 132 rows, Q4_K throughout: the pipelined kernel's chosen height is 128 and each
// group's 4-row remainder runs in a separate 16-row launch; the streamed kernel takes the groups
// as tiles of 64, 64 and 4 rows in one launch.
TEST(ExpertPrefillTest, MixedTileHeightsMatchReference) {
  TANDEM_SKIP_WITHOUT_GPU();
  ExpectMatchesReference({WeightType::kQ4_K, WeightType::kQ4_K, 512, 256, 5, 2, 330},
                         {{PrefillAlgorithm::kGroupedTiles, 0, 0}, {PrefillAlgorithm::kGroupedTilesPipelined, 0, 0}},
                         /*expected_tile_rows=*/128);
}

// The streamed kernel (both rings: tiles of up to 64 and of up to 32 slots; and its two
// weight-prefetch variants) with groups of every fragment count: 40 experts, uneven routing (expert e
// drawn with weight 2e + 1: from about 1 to 120 rows), so tiles of 1 to 64 rows share each
// launch; with 16-row tiles there are more units (about 560) than blocks on an H200 (264), so blocks
// walk several units and the ring crosses unit and tile boundaries.
TEST(ExpertPrefillTest, StreamedUnevenGroupsMatchReference) {
  TANDEM_SKIP_WITHOUT_GPU();
  ExpectMatchesReference({WeightType::kQ4_K, WeightType::kQ4_K, 512, 256, 40, 4, 400},
                         {{PrefillAlgorithm::kGroupedTiles, 0, 0},
                          {PrefillAlgorithm::kGroupedTiles, 16, 0},
                          {PrefillAlgorithm::kGroupedTiles, 32, 0},
                          {PrefillAlgorithm::kGroupedTiles, 0, 0, PrefillKernel::kStreamedL2Lines256},
                          {PrefillAlgorithm::kGroupedTiles, 32, 0, PrefillKernel::kStreamedL2Lines256},
                          {PrefillAlgorithm::kGroupedTiles, 0, 0, PrefillKernel::kStreamedUnitPrefetch},
                          {PrefillAlgorithm::kGroupedTiles, 16, 0, PrefillKernel::kStreamedUnitPrefetch},
                          {PrefillAlgorithm::kGroupedTilesPipelined, 0, 0}},
                         /*expected_tile_rows=*/0, /*skewed=*/true);
}

// The streamed kernel's work orders (StreamedOrder: kRanges, the order until 2026-12-01; kStrided;
// kDynamic, the runner's default) give bit-identical outputs: only the order in which the blocks
// take their units changes, each unit writing its own outputs with the same arithmetic. Every
// runner runs twice (host-planned, then device-planned with the device tile count, bits compared
// inside ExpectMatchesReference), so a kDynamic counter left non-zero by the first launch would show
// as unwritten (poisoned) rows in the second. Uneven routing so tiles of 1 to 64 rows share a
// launch, and more units than an H200 has blocks (264), so blocks walk several units:
//  - the model shapes (h 2048, I 512: gate/up 16 k-stages a unit, down 4) with 32 experts and
//    ~1600 slots (about 512 gate/up and 1000 down units at tiles <= 64);
//  - h 512 / I 256: down has 2 k-stages a unit (the shortest the kernel takes), so with the 6-stage
//    ring of tiles <= 32 the prologue crosses two unit boundaries (kDynamic's prologue barriers).
TEST(ExpertPrefillTest, StreamedWorkOrdersGiveIdenticalBits) {
  TANDEM_SKIP_WITHOUT_GPU();
  for (int tile_rows : {0, 16, 32}) {
    SCOPED_TRACE("tile_rows " + std::to_string(tile_rows));
    std::vector<PrefillOptions> options;
    for (StreamedOrder order : {StreamedOrder::kRanges, StreamedOrder::kStrided, StreamedOrder::kDynamic}) {
      PrefillOptions o{PrefillAlgorithm::kGroupedTiles, tile_rows, 0, PrefillKernel::kStreamed};
      o.work_order = order;
      options.push_back(o);
    }
    ExpectMatchesReference({WeightType::kQ4_K, WeightType::kQ4_K, 512, 256, 40, 4, 400}, options, 0, /*skewed=*/true, {},
                           2e-3, /*same_bits=*/true);
    if (tile_rows == 0) {
      ExpectMatchesReference({WeightType::kQ4_K, WeightType::kQ4_K, 2048, 512, 32, 4, 400}, options, 0, /*skewed=*/true,
                             {}, 2e-3, /*same_bits=*/true);
    }
  }
}

// kDynamic needs its counter: the launchers refuse it without one, before touching any pointer.
TEST(ExpertPrefillTest, StreamedDynamicOrderNeedsCounter) {
  const PrefillTile* no_tiles = nullptr;
  StreamedSchedule dynamic;
  dynamic.order = StreamedOrder::kDynamic;
  EXPECT_EQ(LaunchPrefillGateUp(PrefillKernel::kStreamed, kTypeQ4_K, 64, no_tiles, 1, nullptr, nullptr, 512, 256, nullptr,
                                nullptr, nullptr, dynamic),
            cudaErrorInvalidValue);
  EXPECT_EQ(LaunchPrefillDown(PrefillKernel::kStreamed, kTypeQ4_K, 64, no_tiles, 1, nullptr, 512, 256, nullptr, nullptr,
                              nullptr, dynamic),
            cudaErrorInvalidValue);
}

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

// The row-streamed kernel (kStreamedRows) at both tile bounds and chosen, against the old
// streamed kernel, on uneven groups (1 to about 120 rows: tiles of 1 to 32 rows share a launch,
// blocks walk many units and cross tile boundaries). Shapes: h 512 / I 256 (gate/up K = 512: 4
// row groups of 16 per stage; down K = 256: 8 groups, one warp each) and h 768 (K = 768: three
// super-blocks, 2 groups of 4 warps with one warp idle).
TEST(ExpertPrefillTest, StreamedRowsUnevenGroupsMatchReference) {
  TANDEM_SKIP_WITHOUT_GPU();
  const std::vector<PrefillOptions> options = {{PrefillAlgorithm::kGroupedTiles, 0, 0, PrefillKernel::kStreamedRows},
                                               {PrefillAlgorithm::kGroupedTiles, 16, 0, PrefillKernel::kStreamedRows},
                                               {PrefillAlgorithm::kGroupedTiles, 32, 0, PrefillKernel::kStreamedRows},
                                               {PrefillAlgorithm::kGroupedTiles, 0, 0, PrefillKernel::kStreamedAuto},
                                               {PrefillAlgorithm::kGroupedTiles, 0, 0, PrefillKernel::kStreamed}};
  ExpectMatchesReference({WeightType::kQ4_K, WeightType::kQ4_K, 512, 256, 40, 4, 400}, options, 0, /*skewed=*/true);
  ExpectMatchesReference({WeightType::kQ4_K, WeightType::kQ4_K, 768, 256, 12, 3, 90}, options, 0, /*skewed=*/true);
}

// The 80B shapes (h 2048, I 512: gate/up one super-block per warp, a stage 8 gate + 8 up rows;
// down K = 512): 10 rows per expert (the 512-token regime; kStreamedAuto takes kStreamedRows) and
// about 30 (skewed: kStreamedAuto takes kStreamed; tiles of up to 16 and 32 rows).
TEST(ExpertPrefillTest, StreamedRowsModelShapesMatchReference) {
  TANDEM_SKIP_WITHOUT_GPU();
  const std::vector<PrefillOptions> options = {{PrefillAlgorithm::kGroupedTiles, 0, 0, PrefillKernel::kStreamedRows},
                                               {PrefillAlgorithm::kGroupedTiles, 16, 0, PrefillKernel::kStreamedRows},
                                               {PrefillAlgorithm::kGroupedTiles, 32, 0, PrefillKernel::kStreamedRows},
                                               {PrefillAlgorithm::kGroupedTiles, 0, 0, PrefillKernel::kStreamedAuto}};
  ExpectMatchesReference({WeightType::kQ4_K, WeightType::kQ4_K, 2048, 512, 24, 4, 60}, options, 0, /*skewed=*/false);
  ExpectMatchesReference({WeightType::kQ4_K, WeightType::kQ4_K, 2048, 512, 8, 3, 80}, options, 0, /*skewed=*/true);
}

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

// Which shapes kGroupedTiles sends to the streamed kernel, and what its launchers refuse.
TEST(ExpertPrefillTest, StreamedKernelScope) {
  EXPECT_TRUE(UsesStreamedKernel({WeightType::kQ4_K, WeightType::kQ4_K, 2048, 512}, 0));
  EXPECT_TRUE(UsesStreamedKernel({WeightType::kQ4_K, WeightType::kQ4_K, 2048, 512}, 16));
  EXPECT_FALSE(UsesStreamedKernel({WeightType::kQ4_K, WeightType::kQ4_K, 2048, 512}, 128));
  EXPECT_FALSE(UsesStreamedKernel({WeightType::kQ4_K, WeightType::kQ6_K, 2048, 512}, 0));
  EXPECT_FALSE(UsesStreamedKernel({WeightType::kQ8_0, WeightType::kQ8_0, 2048, 512}, 0));
  // The launchers refuse before touching any pointer: another type, a tile bound over 64, an N
  // (2·inner = 192) that is not a multiple of 128.
  const PrefillTile* no_tiles = nullptr;
  EXPECT_EQ(LaunchPrefillGateUp(PrefillKernel::kStreamed, kTypeQ6_K, 64, no_tiles, 1, nullptr, nullptr, 512, 256,
                                nullptr, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(LaunchPrefillGateUp(PrefillKernel::kStreamed, kTypeQ4_K, 128, no_tiles, 1, nullptr, nullptr, 512, 256,
                                nullptr, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(LaunchPrefillGateUp(PrefillKernel::kStreamed, kTypeQ4_K, 64, no_tiles, 1, nullptr, nullptr, 512, 96,
                                nullptr, nullptr),
            cudaErrorInvalidValue);
  // kStreamedRows: tiles of at most 32 rows, K (here h) at most 2048.
  EXPECT_TRUE(UsesStreamedRowsKernel({WeightType::kQ4_K, WeightType::kQ4_K, 2048, 512}));
  EXPECT_FALSE(UsesStreamedRowsKernel({WeightType::kQ4_K, WeightType::kQ4_K, 4096, 512}));
  EXPECT_EQ(LaunchPrefillGateUp(PrefillKernel::kStreamedRows, kTypeQ4_K, 33, no_tiles, 1, nullptr, nullptr, 512, 256,
                                nullptr, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(LaunchPrefillGateUp(PrefillKernel::kStreamedRows, kTypeQ4_K, 16, no_tiles, 1, nullptr, nullptr, 4096, 256,
                                nullptr, nullptr),
            cudaErrorInvalidValue);
}

TEST(ExpertPrefillTest, CreateRejectsBadOptions) {
  const ExpertDecodeRunner::Shape shape{WeightType::kQ4_K, WeightType::kQ4_K, 512, 256};
  EXPECT_FALSE(ExpertPrefillRunner::Create(shape, 64, {PrefillAlgorithm::kGroupedTiles, 48, 0}).ok());
  EXPECT_FALSE(ExpertPrefillRunner::Create({WeightType::kQ8_0, WeightType::kQ8_0, 512, 80}, 64).ok());
  EXPECT_FALSE(ExpertPrefillRunner::Create(shape, 0).ok());
  EXPECT_FALSE(ExpertPrefillRunner::Create(shape, 64, {PrefillAlgorithm::kGroupedTilesPipelined, 100, 0}).ok());
  EXPECT_FALSE(ExpertPrefillRunner::Create(shape, 64, {PrefillAlgorithm::kGroupedTiles, 0, 0, PrefillKernel::kPipelined}).ok());
  EXPECT_FALSE(ExpertPrefillRunner::Create(shape, 64, {PrefillAlgorithm::kGroupedTiles, 64, 0, PrefillKernel::kStreamedRows}).ok());
  EXPECT_FALSE(ExpertPrefillRunner::Create(shape, 64, {PrefillAlgorithm::kGroupedTiles, 64, 0, PrefillKernel::kMmq}).ok());
  // The MMQ kernel's scope: Q4_K both ways, h and I multiples of 256 up to 2048.
  EXPECT_TRUE(UsesMmqKernel({WeightType::kQ4_K, WeightType::kQ4_K, 2048, 512}));
  EXPECT_TRUE(UsesMmqKernel({WeightType::kQ4_K, WeightType::kQ4_K, 768, 256}));
  EXPECT_FALSE(UsesMmqKernel({WeightType::kQ4_K, WeightType::kQ4_K, 4096, 512}));
  EXPECT_FALSE(UsesMmqKernel({WeightType::kQ4_K, WeightType::kQ6_K, 2048, 512}));
}

}  // namespace
}  // namespace tandem::cuda
