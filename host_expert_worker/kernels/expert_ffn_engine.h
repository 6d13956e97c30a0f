// Computes routed-expert FFN rows for a batch of (expert, activation row) pairs:
//   out = down_e · (SiLU(gate_e · x) ⊙ up_e · x)            (docs/MODEL.md §4.6, step 2)
// on a WorkerThreadPool, with every scratch buffer sized at construction.
//
// One Compute pass runs, on every thread of the team:
//   0. quantize the activation rows (int8 mode) in the formats the weights need, one 256-element
//      block per claim; then the pass's only team barrier;
//   1. gate and up for every tile (up to kMaxRowBlock pairs of one expert, so each weight block is
//      read once for up to 8 tokens), writing SiLU(g)·u; whichever thread finishes a tile's last
//      rows quantizes that tile's intermediate rows for down (int8 mode: two-term rows,
//      activation_blocks.h) and marks the tile ready;
//   2. down for every tile, straight to each pair's output row, each thread waiting only for the
//      tiles its rows belong to (not for the whole of step 1).
// Steps 1 and 2 share their rows as row_split.h describes: one contiguous static range per
// thread, sized by cost, then a claimed tail. Results do not depend on the split or the thread
// count: every output row is one kernel call on the same inputs.
#ifndef TANDEM_HOST_EXPERT_WORKER_KERNELS_EXPERT_FFN_ENGINE_H_
#define TANDEM_HOST_EXPERT_WORKER_KERNELS_EXPERT_FFN_ENGINE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>

#include "absl/status/statusor.h"
#include "common/offload/channel_layout.h"
#include "common/reference/weight_view.h"
#include "host_expert_worker/kernels/activation_blocks.h"
#include "host_expert_worker/kernels/kernel_isa.h"
#include "host_expert_worker/kernels/row_dot_kernels.h"
#include "host_expert_worker/kernels/row_split.h"
#include "host_expert_worker/kernels/worker_thread_pool.h"

namespace tandem {

// One layer's routed experts as the engine sees them: expert ids in a batch are global, and
// local expert (id - first_expert) is views' expert index.
struct ExpertLayerView {
  ExpertMatrixView gate;  // {h, I, n}
  ExpertMatrixView up;    // {h, I, n}
  ExpertMatrixView down;  // {I, h, n}
  uint32_t first_expert = 0;
};

struct ExpertFfnEngineOptions {
  int64_t hidden = 0;                 // h
  int64_t inner = 0;                  // I
  int64_t max_pairs = 4096;           // pairs per pass (larger batches run in several passes)
  int64_t max_activation_rows = 1024; // activation rows per Compute
  KernelIsa isa = KernelIsa::kScalar; // widest family to use (must be supported by this CPU)
};

class ExpertFfnEngine {
 public:
  // `pool` must outlive the engine. Errors: bad dimensions, an ISA this CPU lacks.
  static absl::StatusOr<std::unique_ptr<ExpertFfnEngine>> Create(const ExpertFfnEngineOptions& options,
                                                                 WorkerThreadPool* pool);
  ~ExpertFfnEngine();
  ExpertFfnEngine(const ExpertFfnEngine&) = delete;
  ExpertFfnEngine& operator=(const ExpertFfnEngine&) = delete;

  // Checks that a layer's tensors have this engine's shape and a type it computes (InvalidArgument
  // naming the tensor otherwise). Compute assumes a checked layer.
  absl::Status CheckLayer(const ExpertLayerView& layer) const;

  // Writes FFN_{pairs[i].expert}(activations row pairs[i].row) to outputs + i * h for every i.
  // Expert ids and rows must be valid (the channel validated them). exact: f32 activations and
  // dequantized weights; else int8 activations. Errors: more activation rows than the capacity.
  absl::Status Compute(const ExpertLayerView& layer, std::span<const ExpertRowPair> pairs,
                       const float* activations, int64_t activation_rows, bool exact,
                       float* outputs);

  const ExpertFfnEngineOptions& options() const { return options_; }
  // The family the kernels of `type` come from (lower than options().isa when the wider one has no
  // kernel for the type); kScalar for float types, which use the exact path.
  KernelIsa IsaFor(WeightType type) const;

 private:
  struct Tile {
    uint32_t expert;  // local
    uint32_t first;   // index into order_
    uint32_t count;   // 1 .. kMaxRowBlock
  };
  struct Buffers;

  ExpertFfnEngine(const ExpertFfnEngineOptions& options, WorkerThreadPool* pool);
  absl::Status ComputePass(const ExpertLayerView& layer, std::span<const ExpertRowPair> pairs,
                           bool exact, float* outputs, bool quantize_activations,
                           const float* activations, int64_t activation_rows);
  void RunThread(int t);
  // Step 1 for rows [r0, r0 + rows) of tile i; the thread that completes the tile prepares its
  // input for down and marks it ready.
  void GateUpRows(int64_t i, int64_t r0, int64_t rows, float* scratch);
  void DownRows(int64_t i, int64_t r0, int64_t rows, float* scratch);
  void RowDots(const ExpertMatrixView& m, ActivationFormat format, uint32_t e, int64_t r0,
               int64_t rows, const void* const* acts, int count, int terms, float* const* out,
               float* scratch) const;
  const void* ActivationRow(uint32_t slot, ActivationFormat format) const;

  ExpertFfnEngineOptions options_;
  WorkerThreadPool* pool_;
  std::unique_ptr<Buffers> buffers_;

  // The current pass (set by ComputePass before Run).
  struct Pass {
    const ExpertLayerView* layer = nullptr;
    std::span<const ExpertRowPair> pairs;
    const float* activations = nullptr;
    int64_t activation_rows = 0;
    bool quantize_activations = false;
    bool exact = false;
    float* outputs = nullptr;
    int64_t tiles = 0;
    uint64_t epoch = 0;  // tile_ready value meaning "ready in this pass"
    RowSplit up_split, down_split;
    ActivationFormat gate_format = ActivationFormat::kF32, up_format = ActivationFormat::kF32,
                     down_format = ActivationFormat::kF32;
  } pass_;
  alignas(64) std::atomic<int64_t> next_quant_{0};
  alignas(64) std::atomic<int64_t> next_up_{0};
  alignas(64) std::atomic<int64_t> next_down_{0};
};

}  // namespace tandem

#endif  // TANDEM_HOST_EXPERT_WORKER_KERNELS_EXPERT_FFN_ENGINE_H_
