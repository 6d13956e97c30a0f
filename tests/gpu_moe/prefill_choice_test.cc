// The prefill expert path's host-side choices (prefill_choice.cc): tile heights, tile lists and
// unit grouping. No GPU needed: the weights are dummy pointers that are never read.
#include <vector>

#include "gpu_service/backends/cuda/moe/expert_prefill.h"
#include "gtest/gtest.h"

namespace tandem::cuda {
namespace {

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

// kMmq's tile bound: 16 while 16-row tiles read the weights at most 1.25 times, else 32 (and
// kStreamedAuto then keeps the streamed kernels).
TEST(PrefillTilesTest, MmqTileChoice) {
  const int dummy = 0;
  const ExpertLocation w{&dummy, &dummy, &dummy};
  std::vector<PrefillGroup> groups;
  for (int i = 0; i < 20; ++i) groups.push_back({w, 20 * i, i < 5 ? 20 : 10});  // 25 tiles for 20 groups
  EXPECT_EQ(ChooseMmqTile(groups), 16);
  groups[5].rows = 17;  // 26
  EXPECT_EQ(ChooseMmqTile(groups), 32);
  const std::vector<PrefillGroup> large = {{w, 0, 40}, {w, 40, 160}};
  EXPECT_EQ(ChooseMmqTile(large), 32);
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
