// The prefill expert path (both algorithms, every tile height) against the reference FFN, and its
// host-side tile planning.
#include "gpu_service/backends/cuda/moe/expert_prefill.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <string>

#include "common/reference/moe.h"
#include "common/weights/half.h"
#include "gpu_service/backends/cuda/moe/expert_prefill.cuh"
#include "gpu_service/backends/cuda/weight_type_ids.h"
#include "tests/gpu_moe/test_support.h"

namespace tandem::cuda {
namespace {

using testing::Download;
using testing::PoisonedBuffer;
using testing::RandomMatrix;
using testing::Upload;

// The f16 dequantizer returns DequantizeRow's values rounded to f16.
TEST(DequantizeToF16Test, MatchesReferenceRounded) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(std::random_device{}());
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
  return "grouped tiles (streamed where it fits, variant " + std::to_string(static_cast<int>(o.streamed_kernel)) +
         "), tile_rows " + std::to_string(o.tile_rows);
}

// Runs one random layer through a runner made with each of `all` (both algorithms, every tile
// height); relative L2 against FfnForward.
// expected_tile_rows (0: unchecked): the height the chosen-height kGroupedTilesPipelined runner
// must pick. A chosen-height kGroupedTiles runner on a streamed shape must report 64.
// skewed: token t picks experts by a weighted draw (expert e with weight 2e + 1) instead of the
// round robin (t + 2k) % E.
void ExpectMatchesReference(const PrefillCase& c, const std::vector<PrefillOptions>& all, int expected_tile_rows = 0,
                            bool skewed = false) {
  std::mt19937 rng(std::random_device{}());
  const int64_t h = c.h, I = c.I, E = c.E, K = c.K, n = c.n;
  std::vector<std::vector<uint8_t>> gate(E), up(E), down(E);
  std::vector<DeviceBuffer> dg, du, dd;
  for (int64_t e = 0; e < E; ++e) {
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
  for (int64_t t = 0; t < n; ++t) {
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
    return ExpertLocation{dg[e].get(), du[e].get(), dd[e].get()};
  });
  ASSERT_TRUE(plan.ok()) << plan.status();
  std::vector<float> ref(static_cast<size_t>(n * K * h));
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t k = 0; k < K; ++k) {
      const int32_t e = picks[t * K + k];
      FfnForward(testing::HostMatrix(c.gu_type, gate[e], h, I), testing::HostMatrix(c.gu_type, up[e], h, I),
                 testing::HostMatrix(c.d_type, down[e], I, h), x.data() + t * h, 1,
                 ref.data() + plan->slot[t * K + k] * h, nullptr);
    }
  }
  for (const PrefillOptions& options : all) {
    SCOPED_TRACE(Describe(options));
    absl::StatusOr<ExpertPrefillRunner> runner = ExpertPrefillRunner::Create({c.gu_type, c.d_type, h, I}, n * K, options);
    ASSERT_TRUE(runner.ok()) << runner.status();
    DeviceBuffer partial = PoisonedBuffer(ref.size() * sizeof(float));
    const absl::Status s = runner->Run(plan->units, dx.as<float>(), partial.as<float>(), nullptr);
    ASSERT_TRUE(s.ok()) << s;
    const std::vector<float> got = Download<float>(partial.get(), ref.size());
    ASSERT_TRUE(testing::AllFinite(got)) << "unwritten partial rows";
    EXPECT_LE(testing::RelativeL2(got, ref), 1e-2);
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
      if (rows_fit && options.streamed_kernel == PrefillKernel::kStreamedRows) {
        expected = ChooseStreamedRowsTile(groups, /*auto_choice=*/false);
      } else if (rows_fit && options.streamed_kernel == PrefillKernel::kStreamedAuto &&
                 ChooseStreamedRowsTile(groups, /*auto_choice=*/true) != 0) {
        expected = ChooseStreamedRowsTile(groups, /*auto_choice=*/true);
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

// kStreamedRows' tile bound: 16; kStreamedAuto takes kStreamed (0) once more than 1 group in 20
// needs a second 16-row tile.
TEST(PrefillTilesTest, StreamedRowsTileChoice) {
  const int dummy = 0;
  const ExpertLocation w{&dummy, &dummy, &dummy};
  std::vector<PrefillGroup> small;
  for (int i = 0; i < 20; ++i) small.push_back({w, 10 * i, i == 0 ? 17 : 10});  // one group in 20 splits
  EXPECT_EQ(ChooseStreamedRowsTile(small, true), 16);
  small[1].rows = 20;  // two in 20
  EXPECT_EQ(ChooseStreamedRowsTile(small, true), 0);
  EXPECT_EQ(ChooseStreamedRowsTile(small, false), 16);
  const std::vector<PrefillGroup> medium = {{w, 0, 40}, {w, 40, 30}, {w, 70, 45}};
  EXPECT_EQ(ChooseStreamedRowsTile(medium, true), 0);
  EXPECT_EQ(ChooseStreamedRowsTile(medium, false), 16);
}

TEST(ExpertPrefillTest, CreateRejectsBadOptions) {
  const ExpertDecodeRunner::Shape shape{WeightType::kQ4_K, WeightType::kQ4_K, 512, 256};
  EXPECT_FALSE(ExpertPrefillRunner::Create(shape, 64, {PrefillAlgorithm::kGroupedTiles, 48, 0}).ok());
  EXPECT_FALSE(ExpertPrefillRunner::Create({WeightType::kQ8_0, WeightType::kQ8_0, 512, 80}, 64).ok());
  EXPECT_FALSE(ExpertPrefillRunner::Create(shape, 0).ok());
  EXPECT_FALSE(ExpertPrefillRunner::Create(shape, 64, {PrefillAlgorithm::kGroupedTilesPipelined, 100, 0}).ok());
  EXPECT_FALSE(ExpertPrefillRunner::Create(shape, 64, {PrefillAlgorithm::kGroupedTiles, 0, 0, PrefillKernel::kPipelined}).ok());
  EXPECT_FALSE(ExpertPrefillRunner::Create(shape, 64, {PrefillAlgorithm::kGroupedTiles, 64, 0, PrefillKernel::kStreamedRows}).ok());
}

TEST(PrefillTilesTest, TileClassIsSmallestHeightHoldingTheRows) {
  EXPECT_EQ(PrefillTileClass(1), 16);
  EXPECT_EQ(PrefillTileClass(16), 16);
  EXPECT_EQ(PrefillTileClass(17), 32);
  EXPECT_EQ(PrefillTileClass(33), 64);
  EXPECT_EQ(PrefillTileClass(100), 128);
  EXPECT_EQ(PrefillTileClass(128), 128);
}

// Host planning of the grouped path (runs without a GPU).
TEST(PrefillTilesTest, TilesCoverEveryGroupRowOnce) {
  const int dummy = 0;
  const void* a = &dummy;
  const void* b = &dummy + 1;
  const std::vector<PrefillGroup> groups = {{{a, a, a}, 0, 5}, {{b, b, b}, 5, 130}, {{a, a, a}, 135, 64}};
  for (int rows : kPrefillTileRows) {
    const std::vector<PrefillTile> tiles = MakePrefillTiles(groups, rows);
    std::vector<int> covered(199, 0);
    for (const PrefillTile& t : tiles) {
      ASSERT_GE(t.rows, 1);
      ASSERT_LE(t.rows, rows);
      for (int r = 0; r < t.rows; ++r) ++covered[t.first_slot + r];
      EXPECT_EQ(t.gate, t.first_slot >= 5 && t.first_slot < 135 ? b : a) << "slot " << t.first_slot;
    }
    for (int s = 0; s < 199; ++s) EXPECT_EQ(covered[s], 1) << "slot " << s << ", tile_rows " << rows;
    EXPECT_EQ(tiles.size(), static_cast<size_t>(1 + (130 + rows - 1) / rows + (64 + rows - 1) / rows));
  }
}

TEST(PrefillTilesTest, ChoosesSmallTilesForSmallGroupsAndLargeForLarge) {
  const int dummy = 0;
  std::vector<PrefillGroup> small, large;
  for (int g = 0; g < 8; ++g) {
    small.push_back({{&dummy, &dummy, &dummy}, g * 5, 5});
    large.push_back({{&dummy, &dummy, &dummy}, g * 128, 128});
  }
  EXPECT_EQ(ChoosePrefillTileRows(small), kPrefillTileRows[0]);
  EXPECT_EQ(ChoosePrefillTileRows(large), 128);
  // 512 experts of 160 rows (8192 tokens of the 80B model): one 128-row tile plus a 32-row
  // remainder tile (in a second launch) beats three 64-row tiles or five of 32.
  std::vector<PrefillGroup> ragged;
  for (int g = 0; g < 512; ++g) ragged.push_back({{&dummy, &dummy, &dummy}, g * 160, 160});
  EXPECT_EQ(ChoosePrefillTileRows(ragged), 128);
  EXPECT_EQ(ChoosePrefillTileRows(ragged, /*remainders_at_class=*/false), 128);
  // Mostly 10-row groups and a few of 20: a second launch for 32-row remainder tiles costs more
  // than two 16-row tiles for the few; padding every tile to the height (unpipelined) likewise.
  std::vector<PrefillGroup> mostly_small;
  for (int g = 0; g < 100; ++g) mostly_small.push_back({{&dummy, &dummy, &dummy}, g * 20, g % 30 == 0 ? 20 : 10});
  EXPECT_EQ(ChoosePrefillTileRows(mostly_small), 16);
  EXPECT_EQ(ChoosePrefillTileRows(mostly_small, /*remainders_at_class=*/false), 16);
}

// GroupUnits merges consecutive units of one expert with consecutive slots, and nothing else.
TEST(PrefillTilesTest, GroupUnitsMergesConsecutiveSlotsOfOneExpert) {
  const int dummy[2] = {0, 0};
  auto unit = [&](int e, int first, int rows) {
    ExpertUnit u{&dummy[e], &dummy[e], &dummy[e], rows, first, {}};
    return u;
  };
  const std::vector<ExpertUnit> units = {unit(0, 0, 8), unit(0, 8, 3), unit(1, 11, 8), unit(1, 20, 2)};
  const std::vector<PrefillGroup> groups = GroupUnits(units);
  ASSERT_EQ(groups.size(), 3u);
  EXPECT_EQ(groups[0].rows, 11);
  EXPECT_EQ(groups[1].first_slot, 11);
  EXPECT_EQ(groups[1].rows, 8);
  EXPECT_EQ(groups[2].first_slot, 20);
}

}  // namespace
}  // namespace tandem::cuda
