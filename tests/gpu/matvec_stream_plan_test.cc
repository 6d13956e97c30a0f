// The streaming matvec's launch arithmetic (matvec_stream_plan.h), on the host: no GPU needed, so
// these run in CI too. The split choices below are the ones the H200 sweeps of tests/gpu/NOTES.md
// measured fastest (2026-12-01: Q8_0x8 2048->4096 at wpr 1, 4096->2048 at wpr 2, 128 blocks each);
// the arguments are those StreamLaunchSplit passes for Q8_0x8 at one activation row (16-element
// pieces, 32 lanes a row, a 3-deep ring passed as depth 4, 32 rows a block at wpr 1).
#include "gpu_service/backends/cuda/matvec_stream_plan.h"

#include <random>

#include "gtest/gtest.h"

namespace tandem {
namespace {

using cuda::fastmv::ChooseStreamSplit;
using cuda::fastmv::ResidentBlocks;
using cuda::fastmv::StreamSplit;

constexpr int kH200Sms = 132;
constexpr int kSmemPerSm = 228 * 1024;

TEST(StreamPlanTest, ResidentBlocksFollowsTheOccupancyRules) {
  EXPECT_EQ(ResidentBlocks(32, 0, kSmemPerSm), 8);              // threads: 2048 / 256
  EXPECT_EQ(ResidentBlocks(64, 0, kSmemPerSm), 4);              // registers: 64 · 256 a block
  EXPECT_EQ(ResidentBlocks(65, 0, kSmemPerSm), 3);              // rounded up to 72 a thread (2304 a warp)
  EXPECT_EQ(ResidentBlocks(32, 72 * 1024, kSmemPerSm), 3);      // shared memory, 1 KB reserved a block
  EXPECT_EQ(ResidentBlocks(32, 76 * 1024, kSmemPerSm), 2);      // 3 · 77 KB > 228 KB
  EXPECT_EQ(ResidentBlocks(255, 200 * 1024, kSmemPerSm), 1);
  EXPECT_EQ(ResidentBlocks(32, 300 * 1024, kSmemPerSm), 1);     // never 0: a launch of one block an SM
}

// Q8_0x8 at one activation row: the tie between splits goes to the larger one only while its grid
// stays within one block an SM (`sms`); without `sms` the larger split wins the tie.
TEST(StreamPlanTest, OneRowQ8x8TiesStayWithinOneBlockAnSm) {
  const int capacity = 2 * kH200Sms;
  StreamSplit up = ChooseStreamSplit(2048 / 16, 32, 4, 32, 4096, capacity, 0, 0, kH200Sms);
  EXPECT_EQ(up.wpr, 1);
  EXPECT_EQ(up.blocks, 128);
  StreamSplit down = ChooseStreamSplit(4096 / 16, 32, 4, 32, 2048, capacity, 0, 0, kH200Sms);
  EXPECT_EQ(down.wpr, 2);
  EXPECT_EQ(down.blocks, 128);
  up = ChooseStreamSplit(2048 / 16, 32, 4, 32, 4096, capacity, 0, 0);
  EXPECT_EQ(up.wpr, 2);
  EXPECT_EQ(up.blocks, 256);
  down = ChooseStreamSplit(4096 / 16, 32, 4, 32, 2048, capacity, 0, 0);
  EXPECT_EQ(down.wpr, 4);
  EXPECT_EQ(down.blocks, 256);
}

TEST(StreamPlanTest, ForcedSplitAndGridAreTaken) {
  const StreamSplit w = ChooseStreamSplit(128, 32, 4, 32, 4096, 264, 4, 0);
  EXPECT_EQ(w.wpr, 4);
  EXPECT_EQ(w.blocks, 264);  // 512 row groups, one wave of 264 blocks
  const StreamSplit b = ChooseStreamSplit(128, 32, 4, 32, 4096, 264, 0, 50);
  EXPECT_EQ(b.wpr, 1);
  EXPECT_EQ(b.blocks, 50);
}

// A split is taken only while every warp of a row has a piece a lane: 8 pieces fill 8 lanes of one
// warp, so no split of 2 or more warps a row.
TEST(StreamPlanTest, NoSplitWithoutAPieceALane) {
  for (int rows : {1, 64, 100000}) {
    EXPECT_EQ(ChooseStreamSplit(8, 8, 2, 128, rows, 264, 0, 0).wpr, 1) << rows;
  }
}

// On random shapes: the split is a power of two up to the block's warps, the grid never exceeds the
// row groups or the wave, and its blocks walk every row group.
TEST(StreamPlanTest, GridCoversEveryRowGroupWithinOneWave) {
  std::mt19937 rng(20261205);
  for (int i = 0; i < 5000; ++i) {
    const int lpr = 1 << std::uniform_int_distribution<int>(0, 5)(rng);
    const int pieces = lpr * std::uniform_int_distribution<int>(1, 64)(rng);
    const int slots = 1 << std::uniform_int_distribution<int>(1, 2)(rng);
    const int rpb1 = cuda::fastmv::kWarps * (32 / lpr) * slots;
    const int rows = std::uniform_int_distribution<int>(1, 20000)(rng);
    const int capacity = std::uniform_int_distribution<int>(1, 1056)(rng);
    const int depth = std::uniform_int_distribution<int>(2, 4)(rng);
    const int sms = std::uniform_int_distribution<int>(0, 1)(rng) * kH200Sms;
    const StreamSplit s = ChooseStreamSplit(pieces, lpr, depth, rpb1, rows, capacity, 0, 0, sms);
    ASSERT_TRUE(s.wpr == 1 || s.wpr == 2 || s.wpr == 4 || s.wpr == 8) << s.wpr;
    ASSERT_TRUE(s.wpr == 1 || pieces >= lpr * s.wpr) << pieces << " pieces, " << lpr << " lanes a row";
    const int rpb = rpb1 / s.wpr;
    const int groups = (rows + rpb - 1) / rpb;
    ASSERT_GE(s.blocks, 1);
    ASSERT_LE(s.blocks, groups);
    ASSERT_LE(s.blocks, capacity);
    const int per_block = (groups + s.blocks - 1) / s.blocks;
    ASSERT_GE(static_cast<int64_t>(per_block) * s.blocks, groups);
  }
}

}  // namespace
}  // namespace tandem
