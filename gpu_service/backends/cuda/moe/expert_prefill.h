// The prefill expert path: f16 GEMMs with f32 accumulation (gate and up, SiLU(gate)·up rounded
// to f16, then down). Tolerance against the reference: relative L2 about 1e-2 (f16 operands).
//
// Consumes the same ExpertUnits as the decode path (MoeStepPlan::units): consecutive units of one
// expert with consecutive slots form one group (one expert applied to consecutive slots).
//
// Algorithms (PrefillAlgorithm):
//  - kGroupedTiles (default): every group of a call split into row tiles; per call, activations to
//    f16 once, then gate/up (SiLU·up in registers) and down launches over all tiles. Where
//    UsesStreamedKernel holds (Q4_K gate/up and down, the 80B model's case), one launch each of
//    the streamed kernel (expert_prefill_stream.cuh): tiles of up to 64 rows, raw Q4_K bytes
//    streamed through a cp.async ring and dequantized straight into the MMA fragments; where
//    nearly every expert has at most 16 rows (512 tokens on the 80B model) and h, I <= 2048, the
//    row-streamed kernel instead (expert_prefill_rows.cuh, PrefillOptions::streamed_kernel);
//    and where nearly every expert has at most 16 rows and h, I <= 2048 (ChooseMmqTile 16), the
//    integer-MMA kernel before either (expert_prefill_mmq.cu, MmqAutoKernel); and where the
//    groups average at least kWgmmaMinMeanRows rows (from ~820 tokens on the 80B model), the
//    warp-specialized weights-as-A wgmma kernel (kWgmmaWs, expert_prefill_wgws.cu, ChooseWgmmaTile;
//    TANDEM_PREFILL_WGMMA=1 takes kWgmma, =0 keeps kStreamed). Otherwise as kGroupedTilesPipelined.
//  - kGroupedTilesPipelined (the default until 2026-12-01, and the path of every other type):
//    full tiles of one chosen height and, per group, one remainder tile launched at the smallest
//    compiled height that holds it (PrefillTileClass), one launch per height present; the weights
//    dequantized tile by tile into shared memory as f16, software-pipelined
//    (expert_prefill_gemm.cuh).
//  - kCublasPerExpert (the original path, kept for comparison): per group, its weights dequantized
//    to f16 in global memory, rows gathered, two cuBLAS GEMMs: 7 launches per expert.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_EXPERT_PREFILL_H_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_EXPERT_PREFILL_H_

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "gpu_service/backends/cuda/device_buffer.h"
#include "gpu_service/backends/cuda/moe/expert_prefill.cuh"
#include "gpu_service/backends/cuda/moe/expert_prefill_mmq.cuh"
#include "gpu_service/backends/cuda/moe/expert_prefill_wgexp.cuh"
#include "gpu_service/backends/cuda/moe/experts.h"
#include "gpu_service/backends/cuda/moe/prefill_tiles_device.cuh"

namespace tandem::cuda {

// One expert's contiguous run of slots.
struct PrefillGroup {
  ExpertLocation where;
  int32_t first_slot;
  int32_t rows;
};

// Merges consecutive units of one expert whose slots follow each other.
std::vector<PrefillGroup> GroupUnits(std::span<const ExpertUnit> units);

// The tile height (one of kPrefillTileRows) with the least modelled cost for these groups: each
// tile costs its padded rows of tensor-core work plus a fixed share for dequantizing the weights.
// remainders_at_class (how the pipelined kernel launches at a chosen height): a group's last,
// partial tile is padded only to its PrefillTileClass, and each launch beyond the first (one per
// class present) costs a fixed share; otherwise every tile is padded to the height.
int ChoosePrefillTileRows(std::span<const PrefillGroup> groups, bool remainders_at_class = true);

// The height a tile of `rows` rows (1 .. 128) is launched at by the pipelined kernel: the smallest of
// kPrefillTileRows that holds it.
int PrefillTileClass(int rows);

// The row tiles covering every group in order, each at most tile_rows rows (a group of r rows
// gives ceil(r / tile_rows) tiles).
std::vector<PrefillTile> MakePrefillTiles(std::span<const PrefillGroup> groups, int tile_rows);

enum class PrefillAlgorithm {
  kGroupedTiles,
  kCublasPerExpert,
  kGroupedTilesPipelined,
};

// Whether kGroupedTiles runs `shape` on the streamed kernel at this tile_rows option (0: chosen):
// Q4_K gate/up and down, h and I multiples of 256, tile_rows 0 or at most kStreamedMaxTileRows.
bool UsesStreamedKernel(const ExpertDecodeRunner::Shape& shape, int tile_rows);

// Whether the row-streamed kernel (PrefillKernel::kStreamedRows) can run `shape`: a streamed shape
// with h and I at most kStreamedRowsMaxK.
bool UsesStreamedRowsKernel(const ExpertDecodeRunner::Shape& shape);

// The tile bound kStreamedRows runs these groups at: 16 (measured on the H200, 2026-12-01,
// expert_prefill_bench: 16-row tiles beat 32-row ones at 512 and 2048 tokens, 0.705 vs 1.125 and
// 1.975 vs 2.187 ms), or, for kStreamedAuto (auto_choice), 0 (take kStreamed) unless at most 1 group
// in 20 needs a second 16-row tile: kStreamedRows reads an expert's weights once per tile and beat
// kStreamed only by 7% at 512 tokens (about 10 rows per expert, 0.705 vs 0.755 ms); at 2048 (about
// 40) it lost 2x.
int ChooseStreamedRowsTile(std::span<const PrefillGroup> groups, bool auto_choice);

// Whether the integer-MMA kernel (PrefillKernel::kMmq, expert_prefill_mmq.cu) can run `shape`:
// Q4_K gate/up and down, h and I multiples of 256 and at most kMmqMaxK.
bool UsesMmqKernel(const ExpertDecodeRunner::Shape& shape);

// The tile bound kMmq runs these groups at when none is given: 16 unless 16-row tiles would read
// the weights more than 1.25 times (tiles > 1.25 · groups), then 32 (the ring of 4 stages).
int ChooseMmqTile(std::span<const PrefillGroup> groups);

// The kernel kStreamedAuto takes where the shape fits, tile_rows is 0 and ChooseMmqTile is 16 (small
// groups, the 512-token regime): kMmqLean2, kMmqLean with its per-unit and per-tile latency steps
// off the critical path (bit-identical outputs), the fastest measured there (H200, 2026-12-01, end to
// end prefill 512: 13874 tok/s with kMmqLean, 14621 with kMmqLean2; kMmqLean itself was 0.440 ms a
// layer at 512 tokens against 0.572 for kMmqWarps16; moe/PERF_NOTES.md). TANDEM_PREFILL_MMQ (read
// once) overrides it for A/B runs of one binary: "0": none (the streamed kernels, the old default),
// "1": kMmq, "2": kMmqL2Prefetch, "3": kMmqWarps16, "7": kMmqLean (the default before kMmqLean2).
// Larger groups keep the streamed kernels: the MMQ tiles (<= 32 rows) re-read the weights per tile
// and lost 2x at 2048 and 8192 tokens.
PrefillKernel MmqAutoKernel();
bool MmqByDefault();  // MmqAutoKernel() is an MMQ kernel

// The weights-as-A wgmma kernels (PrefillKernel::kWgmmaWs, expert_prefill_wgws.cu, and kWgmma,
// expert_prefill_wgexp.cu; the same bits) for large groups: kStreamedAuto (tile_rows 0) takes
// WgmmaAutoKernel(), at tiles of up to kWgmmaMaxTileRows rows, where kStreamed would run and the
// groups average at least kWgmmaMinMeanRows rows (device-planned calls: slots >=
// kWgmmaMinMeanRows · experts; on the 80B model 1024 tokens (20 rows an expert), 2048 (40) and
// 8192 (160) yes, 512 (10: the MMQ kernel) no). WgmmaAutoKernel (read once), by TANDEM_PREFILL_WGMMA: unset (the default) or any value but
// those below (4 included, which chose kWgmmaWs before it was the default): kWgmmaWs; 1: kWgmma
// (the default until 2026-12-02, for A/B); 0 or "": kStreamedAuto (none: kStreamed, the old
// choice). kStreamedAuto also where the device is not sm_90 (the kernels are sm_90a code).
// WgmmaByDefault: WgmmaAutoKernel() is a wgmma kernel.
// ChooseWgmmaTile: kWgmmaMaxTileRows where kStreamedAuto takes it for these groups, else 0.
// WgmmaMinMeanRows: kWgmmaMinMeanRows, or TANDEM_PREFILL_WGMMA_MIN_ROWS (a positive integer, read
// once; anything else: the default), to time the choice's bound (e.g. 2048 tokens, 40 rows).
// 16 since 2026-12-02 (64 before): on the H200, q3n-80b shapes, kWgmmaWs against kStreamed at 64
// rows a tile: 0.785 against 0.947 ms a layer at 1024 tokens, 0.926 against 1.034 at 2048
// (expert_prefill_bench); end to end +9% at 1024 tokens, +5.6% at 2048 (docs/PERF.md).
inline constexpr int kWgmmaMinMeanRows = 16;
int WgmmaMinMeanRows();
PrefillKernel WgmmaAutoKernel();
bool WgmmaByDefault();
int ChooseWgmmaTile(const ExpertDecodeRunner::Shape& shape, std::span<const PrefillGroup> groups);

// The kernel and tile bound of a device-planned call (ExpertPrefillRunner::RunDevicePlanned).
struct DevicePrefillChoice {
  PrefillKernel kernel;
  int tile_rows;
};

// Device-planned calls (kStreamedAuto, tile_rows 0) take MmqAutoKernel() (kMmqLean2) at 16-row tiles while the mean
// rows per expert (slots / experts) is at most this, else kStreamed at 64: ChooseMmqTile's rule
// (16-row tiles, at most 1.25 per group) on Poisson-distributed rows holds up to a mean of about
// 13 (at 12, about 1 group in 10 needs a second tile). On the 80B model (E = 512, K = 10) that is
// MMQ at 512 tokens (mean 10) and else kStreamed (2048, 8192: 40, 160 rows), as the host rule picks
// under uniform routing; WgmmaAutoKernel() (kWgmmaWs) at 256 from a mean of kWgmmaMinMeanRows
// (1024 tokens and up) unless TANDEM_PREFILL_WGMMA=0.
inline constexpr int kDeviceMmqMaxMeanRows = 12;

struct PrefillOptions {
  PrefillAlgorithm algorithm = PrefillAlgorithm::kGroupedTiles;
  // Grouped algorithms: rows per tile (one of kPrefillTileRows), or 0 to choose per call (the
  // streamed kernel: 64). A fixed height launches every tile at that height (no remainder tiles at
  // smaller heights); kGroupedTiles with 128 on a streamed shape runs the pipelined kernel.
  int tile_rows = 0;
  // Grouped algorithms: bound on the input rows a call addresses (input_row < max_input_rows); sizes the
  // f16 copy of x. 0 means max_slots (enough whenever every token has at least one slot).
  int64_t max_input_rows = 0;
  // kGroupedTiles on a streamed shape: which streamed kernel variant (not kPipelined). kStreamedAuto
  // with tile_rows 0: kStreamedRows at ChooseStreamedRowsTile's bound (auto) where that is not 0 and
  // the shape fits (UsesStreamedRowsKernel), else kStreamed; with a fixed tile_rows: kStreamed.
  // kStreamedRows on a shape it does not fit runs kStreamed.
  // kWgmma, kWgmmaWs: tile_rows 0 (kWgmmaMaxTileRows) or 16 .. 64; kStreamedAuto
  // with tile_rows 0 takes WgmmaAutoKernel() where ChooseWgmmaTile is not 0.
  // kMmq* (integer MMAs): tile_rows 0 (ChooseMmqTile), or 1 .. 32; kStreamedAuto with tile_rows 0
  // takes kMmq where UsesMmqKernel and MmqByDefault hold; kMmq* on a shape it does not fit runs
  // kStreamed.
  PrefillKernel streamed_kernel = PrefillKernel::kStreamedAuto;
  // The streamed kernels' work order (StreamedOrder, expert_prefill.cuh); nullopt:
  // DefaultStreamedOrder().
  std::optional<StreamedOrder> work_order = std::nullopt;
};

// The work order of the streamed kernels when PrefillOptions::work_order is not set: kDynamic (an
// expert's tiles run at the same time, so its weights come from HBM about once; moe/PERF_NOTES.md
// "work order"; measured faster than kRanges, the order until 2026-12-01: docs/PERF.md, sixth
// session; its A/B switch TANDEM_PREFILL_OLD_ORDER was removed in the ninth).
StreamedOrder DefaultStreamedOrder();

class ExpertPrefillRunner {
 public:
  // max_slots bounds the slots of one call (and so the rows of any one expert). All device memory
  // is allocated here. InvalidArgument for a non-positive size, a tile_rows not in
  // kPrefillTileRows, or (grouped) h or I not a multiple of 32 or of the types' blocks.
  static absl::StatusOr<ExpertPrefillRunner> Create(const ExpertDecodeRunner::Shape& shape, int64_t max_slots,
                                                    const PrefillOptions& options = {});
  ExpertPrefillRunner(ExpertPrefillRunner&&) noexcept;
  ExpertPrefillRunner& operator=(ExpertPrefillRunner&&) noexcept;
  ~ExpertPrefillRunner();

  // partial[slot] (h wide) = FFN_expert(x[input row]) for every row of every unit; x is the MoE
  // input (device, h wide rows). Enqueued on `stream`; the units' token indices are staged through
  // pinned memory (one copy). partial must be 8-byte aligned. InvalidArgument for a unit with
  // rows outside [1, kMaxUnitRows], a negative slot, slots past max_slots, an input row outside
  // [0, max_input_rows) (grouped), a null or misaligned matrix, or a type the kernels refuse.
  absl::Status Run(std::span<const ExpertUnit> units, const float* x, float* partial, cudaStream_t stream);

  // The kernel and tile bound RunDevicePlanned takes for a call of `slots` slots over `experts`
  // experts, chosen from those sizes alone (kDeviceMmqMaxMeanRows); nullopt where this runner's
  // shape or options need the groups on the host (then call Run): shapes off the streamed
  // kernels, kernels other than kStreamed*, kWgmma* and kMmqLean*, and kStreamedAuto's small-group choices
  // off kMmqLean (TANDEM_PREFILL_MMQ set to another kernel or off).
  std::optional<DevicePrefillChoice> DevicePlannedChoice(int64_t slots, int64_t experts) const;

  // Run for units in device memory with a device count (the route-and-plan kernel's,
  // route_plan.cuh): the tiles, their count and the slot index are built on the device
  // (prefill_tiles_device.cuh) and the kernels read the count, so nothing waits on the host.
  // input_rows: rows of x the units may address (the step's tokens); slots: bound on the units'
  // slots (n·K), which sizes the call; max_units bounds *num_units (at most max_slots). The checks
  // Run makes on host units are made on the device: a failing unit, or a count above max_units,
  // sets *error to 1 and the call computes nothing (read *error back later, as the device plan's
  // error flag is). FailedPrecondition where DevicePlannedChoice is nullopt; InvalidArgument for
  // sizes beyond the runner's or a misaligned partial.
  absl::Status RunDevicePlanned(const ExpertUnit* units, const int* num_units, int max_units, int input_rows,
                                int slots, int64_t experts, const float* x, float* partial, int* error,
                                cudaStream_t stream, bool x_ready = false);

  // RunDevicePlanned in two halves, for a caller whose own kernel builds the tiles (the grid
  // route-plan kernel, route_plan_grid.cuh; the tile builder is then not launched): DeviceTilesTarget
  // fills *target as RunDevicePlanned fills the tile builder's arguments (tile height, bounds,
  // checks, error, this runner's tile, tile count and index buffers; units, num_units and scratch
  // null), and RunDeviceTiles, with the same sizes, runs the expert kernels on what was built there.
  // The same errors as RunDevicePlanned.
  absl::Status DeviceTilesTarget(int max_units, int input_rows, int slots, int64_t experts, int* error,
                                 DevicePrefillTilesArgs* target);
  // x_ready: the call's own form of x was already written by the caller (the stream norm's NormMmqOut):
  // the integer-MMA kernels' quantized planes (MmqInputPlanes) or the streamed kernels' f16 rows
  // (StreamedF16Input), so the call neither quantizes nor converts x again.
  absl::Status RunDeviceTiles(int max_units, int input_rows, int slots, int64_t experts, const float* x,
                              float* partial, cudaStream_t stream, bool x_ready = false);

  // Where a device-planned call of these sizes quantizes x for the integer-MMA kernels (the planes
  // of max_input_rows rows of h, LaunchMmqQuantize's), or nullopt when its choice is not such a
  // kernel or input_rows is beyond this runner's: a caller that writes the first input_rows rows
  // of them itself passes x_ready.
  std::optional<MmqActivations> MmqInputPlanes(int64_t input_rows, int64_t slots, int64_t experts) const;

  // Where a device-planned call of these sizes converts x to f16 rows for the streamed (f16 MMA)
  // kernels (max_input_rows rows of h, LaunchConvertToF16's: round to nearest even), or nullptr when
  // its choice is an integer-MMA kernel or input_rows is beyond this runner's: a caller that writes
  // the first input_rows rows itself (the stream norm's NormMmqOut::x16) passes x_ready.
  uint16_t* StreamedF16Input(int64_t input_rows, int64_t slots, int64_t experts) const;

  // Tile height of the full tiles of the last grouped call (0 before one, or with kCublasPerExpert);
  // for the streamed kernel, the bound on its tiles' rows.
  int last_tile_rows() const { return last_tile_rows_; }
  // The kernel the last grouped call resolved to (kPipelined for the pipelined tile kernel; with
  // kStreamedAuto resolved, e.g. WgmmaAutoKernel() for large groups), host- or device-planned;
  // kStreamedAuto before one. Lets tests and benches confirm an A/B switch reached its kernel.
  PrefillKernel last_kernel() const { return last_kernel_; }

 private:
  ExpertPrefillRunner() = default;
  struct Blas;
  absl::Status RunGrouped(std::span<const ExpertUnit> units, const float* x, float* partial, cudaStream_t stream);
  absl::Status RunCublas(std::span<const ExpertUnit> units, const float* x, float* partial, cudaStream_t stream);
  // What DeviceTilesTarget and RunDeviceTiles both need of a device-planned call of these sizes:
  // its choice, the tile bound and where the tiles and their count live, after the checks both
  // make (FailedPrecondition without a choice, InvalidArgument beyond this runner's sizes).
  struct DeviceTiles {
    DevicePrefillChoice choice;
    int max_tiles;
    PrefillTile* tiles;
    int* tile_count;
  };
  absl::StatusOr<DeviceTiles> CheckDevicePlan(int max_units, int input_rows, int slots, int64_t experts);

  ExpertDecodeRunner::Shape shape_{};
  int64_t max_slots_ = 0;
  PrefillOptions options_;
  int last_tile_rows_ = 0;
  PrefillKernel last_kernel_ = PrefillKernel::kStreamedAuto;
  // Both algorithms.
  DeviceBuffer act_;        // f16 [max_slots × I]
  DeviceBuffer index_;      // int32 [max_slots]: input row of each slot; then (grouped) the tiles
  PinnedBuffer index_staging_;
  // Device-planned calls (where the streamed kernels may run): the tile builder's scratch (2 ·
  // max_slots ints) and then the tile count.
  DeviceBuffer device_plan_;
  // Where the streamed kernels may run: the kDynamic work counters (2 ints for gate/up, 2 for
  // down; zeroed at Create, left zero by every launch).
  DeviceBuffer work_counters_;
  StreamedSchedule Schedule(bool down) const;
  // Grouped algorithms.
  DeviceBuffer x_f16_;     // f16 [max_input_rows × h]
  // kMmq (allocated where it may run): x quantized, the f32 SiLU·up rows, those quantized.
  DeviceBuffer mmq_x_;      // MmqActivationBytes(max_input_rows, h)
  DeviceBuffer mmq_act_;    // f32 [max_slots × I]
  DeviceBuffer mmq_act_q_;  // MmqActivationBytes(max_slots, I)
  // kCublasPerExpert.
  std::unique_ptr<Blas> blas_;
  DeviceBuffer w_gate_up_;  // f16 [2I × h]
  DeviceBuffer w_down_;     // f16 [h × I]
  DeviceBuffer x_rows_;     // f16 [max_slots × h]
  DeviceBuffer gu_;         // f32 [max_slots × 2I]
  Event staged_;
  bool pending_ = false;
};

}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_EXPERT_PREFILL_H_
