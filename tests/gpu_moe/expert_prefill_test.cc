// The prefill expert path (both algorithms, every tile height) against the reference FFN: the
// f16 dequantizer, the algorithms and tile heights, the streamed kernel's groups, work orders and
// scope, the runner's option checks. The WGMMA kernels' tests are in expert_prefill_wgmma_test.cc,
// the integer-MMA kernels' in expert_prefill_mmq_test.cc (all through prefill_check.h); the
// host-side tile planning in prefill_choice_test.cc.
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
#include "gpu_service/backends/cuda/weight_type_ids.h"
#include "tests/gpu_moe/prefill_check.h"
#include "tests/gpu_moe/test_support.h"
#include "tests/test_seed.h"

namespace tandem::cuda {
namespace {

using testing::AllOptions;
using testing::Download;
using testing::ExpectMatchesReference;
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
