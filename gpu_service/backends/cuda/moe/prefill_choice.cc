// The expert prefill's host-side choices (expert_prefill.h): which kernel a step's shape and groups
// take (UsesStreamedKernel, UsesMmqKernel, MmqAutoKernel, the tile heights) and the host-planned
// tile list (GroupUnits, ChoosePrefillTileRows, MakePrefillTiles), and ChooseWgmmaTile. The runner
// (expert_prefill.cc) applies them; the device-planned path builds the same tiles on the GPU (prefill_tiles_device.cuh,
// route_plan_grid.cuh).
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <iterator>
#include <span>
#include <string_view>
#include <vector>

#include "gpu_service/backends/cuda/env_switch.h"
#include "gpu_service/backends/cuda/moe/expert_prefill.cuh"
#include "gpu_service/backends/cuda/moe/expert_prefill.h"
#include "gpu_service/backends/cuda/moe/expert_prefill_mmq.cuh"
#include "gpu_service/backends/cuda/sm90a_device.h"
#include "gpu_service/backends/cuda/weight_type_ids.h"

namespace tandem::cuda {
namespace {

// Modelled cost of one tile beyond its rows: dequantizing a weight tile (256 chunks of 32 per
// 64-deep step) takes about as long as the tensor-core work of this many rows. Fitted to the H200
// timings of expert_prefill_bench (80B shapes, Q4_K): 16-row tiles best at 512 tokens, 64 at 2048,
// 128 at 8192 (about 10, 40 and 160 rows per expert).
constexpr int64_t kDequantCostRows = 96;

// Modelled cost of each launch beyond the first (pipelined kernel, remainder tiles at their class):
// a launch lasts at least one block's whole k-loop however few tiles it has. Fitted to the H200
// (expert_prefill_bench, 512 tokens: 15 tiles of 32 rows in a second launch cost 0.03 ms, more than
// the padding they saved).
constexpr int64_t kLaunchCostRows = 2500;

// Index of a height in kPrefillTileRows.
size_t ClassIndex(int height) {
  return static_cast<size_t>(std::find(std::begin(kPrefillTileRows), std::end(kPrefillTileRows), height) -
                             std::begin(kPrefillTileRows));
}

}  // namespace

bool UsesStreamedKernel(const ExpertDecodeRunner::Shape& shape, int tile_rows) {
  return shape.gate_up_type == WeightType::kQ4_K && shape.down_type == WeightType::kQ4_K && shape.h % 256 == 0 &&
         shape.inner % 256 == 0 && (2 * shape.inner) % kStreamedUnitCols == 0 && shape.h % kStreamedUnitCols == 0 &&
         tile_rows <= kStreamedMaxTileRows;
}

bool UsesStreamedRowsKernel(const ExpertDecodeRunner::Shape& shape) {
  return UsesStreamedKernel(shape, 0) && shape.h <= kStreamedRowsMaxK && shape.inner <= kStreamedRowsMaxK;
}

int ChooseStreamedRowsTile(std::span<const PrefillGroup> groups, bool auto_choice) {
  int64_t tiles = 0;
  for (const PrefillGroup& g : groups) tiles += (g.rows + 15) / 16;
  if (auto_choice && 20 * tiles > 21 * static_cast<int64_t>(groups.size())) return 0;
  return 16;
}

bool UsesMmqKernel(const ExpertDecodeRunner::Shape& shape) {
  return shape.gate_up_type == WeightType::kQ4_K && shape.down_type == WeightType::kQ4_K && shape.h % 256 == 0 &&
         shape.inner % 256 == 0 && shape.h <= kMmqMaxK && shape.inner <= kMmqMaxK;
}

int ChooseMmqTile(std::span<const PrefillGroup> groups) {
  int64_t tiles = 0;
  for (const PrefillGroup& g : groups) tiles += (g.rows + 15) / 16;
  return 4 * tiles > 5 * static_cast<int64_t>(groups.size()) ? 32 : 16;
}

PrefillKernel MmqAutoKernel() {
  // 7: kMmqLean, the default before kMmqLean2.
  static const PrefillKernel k = EnvChoice<PrefillKernel>(
      "TANDEM_PREFILL_MMQ",
      {{"0", PrefillKernel::kStreamedAuto},
       {"1", PrefillKernel::kMmq},
       {"2", PrefillKernel::kMmqL2Prefetch},
       {"3", PrefillKernel::kMmqWarps16},
       {"7", PrefillKernel::kMmqLean}},
      PrefillKernel::kMmqLean2);
  return k;
}

bool MmqByDefault() { return MmqAutoKernel() != PrefillKernel::kStreamedAuto; }

PrefillKernel WgmmaAutoKernel() {
  static const PrefillKernel k = [] {
    if (!EnvSwitchDefaultOn("TANDEM_PREFILL_WGMMA")) return PrefillKernel::kStreamedAuto;
    if (!CurrentDeviceRunsSm90a()) return PrefillKernel::kStreamedAuto;
    const char* v = std::getenv("TANDEM_PREFILL_WGMMA");
    const std::string_view s = v == nullptr ? "" : v;
    // 1: kWgmma, the default until 2026-12-02, for A/B. Any other value (unset, 4, which selected
    // kWgmmaWs while kWgmma was the default, or the retired 2 (kWgmmaOverlap) and 3, 5 (unmerged
    // variants)): kWgmmaWs, 1.80 against kWgmma's 1.96-2.13 ms a layer at 8192 tokens, same bits.
    if (s == "1") return PrefillKernel::kWgmma;
    return PrefillKernel::kWgmmaWs;
  }();
  return k;
}

bool WgmmaByDefault() { return IsWgmmaKernel(WgmmaAutoKernel()); }

int WgmmaMinMeanRows() {
  static const int rows =
      static_cast<int>(EnvInteger("TANDEM_PREFILL_WGMMA_MIN_ROWS", kWgmmaMinMeanRows, 1, 1 << 20));
  return rows;
}

int ChooseWgmmaTile(const ExpertDecodeRunner::Shape& shape, std::span<const PrefillGroup> groups) {
  if (!WgmmaByDefault() || !UsesStreamedKernel(shape, 0) || groups.empty()) return 0;
  int64_t rows = 0;
  for (const PrefillGroup& g : groups) rows += g.rows;
  return rows >= WgmmaMinMeanRows() * static_cast<int64_t>(groups.size()) ? kWgmmaMaxTileRows : 0;
}

std::vector<PrefillGroup> GroupUnits(std::span<const ExpertUnit> units) {
  std::vector<PrefillGroup> groups;
  for (const ExpertUnit& u : units) {
    if (!groups.empty()) {
      PrefillGroup& g = groups.back();
      if (g.where.gate == u.gate && g.where.up == u.up && g.where.down == u.down && g.first_slot + g.rows == u.first_slot) {
        g.rows += u.rows;
        continue;
      }
    }
    groups.push_back(PrefillGroup{ExpertLocation{u.gate, u.up, u.down}, u.first_slot, u.rows});
  }
  return groups;
}

int PrefillTileClass(int rows) {
  for (int height : kPrefillTileRows) {
    if (rows <= height) return height;
  }
  return kPrefillTileRows[std::size(kPrefillTileRows) - 1];
}

int ChoosePrefillTileRows(std::span<const PrefillGroup> groups, bool remainders_at_class) {
  int best = kPrefillTileRows[0];
  int64_t best_cost = -1;
  for (int rows : kPrefillTileRows) {
    int64_t cost = 0;
    if (remainders_at_class) {
      bool launched[std::size(kPrefillTileRows)] = {};
      for (const PrefillGroup& g : groups) {
        cost += g.rows / rows * (kDequantCostRows + rows);
        if (g.rows >= rows) launched[ClassIndex(rows)] = true;
        if (const int rest = g.rows % rows; rest != 0) {
          cost += kDequantCostRows + PrefillTileClass(rest);
          launched[ClassIndex(PrefillTileClass(rest))] = true;
        }
      }
      const int64_t launches = std::count(std::begin(launched), std::end(launched), true);
      cost += kLaunchCostRows * std::max<int64_t>(launches - 1, 0);
    } else {
      for (const PrefillGroup& g : groups) cost += (g.rows + rows - 1) / rows * (kDequantCostRows + rows);
    }
    if (best_cost < 0 || cost < best_cost) {
      best = rows;
      best_cost = cost;
    }
  }
  return best;
}

std::vector<PrefillTile> MakePrefillTiles(std::span<const PrefillGroup> groups, int tile_rows) {
  std::vector<PrefillTile> tiles;
  for (const PrefillGroup& g : groups) {
    for (int32_t r = 0; r < g.rows; r += tile_rows) {
      tiles.push_back(PrefillTile{g.where.gate, g.where.up, g.where.down, g.first_slot + r, std::min(tile_rows, g.rows - r)});
    }
  }
  return tiles;
}

}  // namespace tandem::cuda
