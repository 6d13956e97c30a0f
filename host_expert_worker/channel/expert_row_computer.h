// The worker's compute interface: what the channel server hands to the expert kernels.
//
// The server validates every index before calling Compute, so an implementation may index its
// weights with batch.layer and pair.expert, and the activations with pair.row, without checks.
#ifndef TANDEM_HOST_EXPERT_WORKER_CHANNEL_EXPERT_ROW_COMPUTER_H_
#define TANDEM_HOST_EXPERT_WORKER_CHANNEL_EXPERT_ROW_COMPUTER_H_

#include <cstdint>
#include <span>

#include "absl/status/status.h"
#include "common/offload/channel_layout.h"

namespace tandem {

// What the worker holds: the server refuses segments and requests that do not fit it.
struct ExpertModelShape {
  uint32_t layer_count = 0;
  uint32_t expert_count = 0;  // E of the whole model (expert ids are global)
  uint32_t hidden_size = 0;   // h
  uint64_t fingerprint = 0;   // ModelFingerprint() of the expert tensors
  // The experts this worker holds: [expert_begin, expert_end). A worker started for part K of N
  // holds one range; a request naming an expert outside it gets kBadExpert.
  uint32_t expert_begin = 0;
  uint32_t expert_end = 0;
};

// One validated request. Pointers refer to worker-private copies (pairs) or to the segment
// (activations) and are valid for the duration of Compute only.
struct ExpertBatch {
  uint32_t layer = 0;
  std::span<const ExpertRowPair> pairs;  // every expert in the held range, every row < row_count
  const float* activations = nullptr;    // activation_row_count rows of hidden_size floats
  uint32_t activation_row_count = 0;
  uint32_t hidden_size = 0;
  bool exact = false;  // true: f32 activations in the dot products; false: int8-quantized
};

class ExpertRowComputer {
 public:
  virtual ~ExpertRowComputer() = default;

  // The model this computer serves. Constant for the computer's lifetime.
  virtual const ExpertModelShape& shape() const = 0;

  // Writes one output row (hidden_size floats) per pair, in pair order, to outputs
  // (pairs.size() * hidden_size floats, 64-byte aligned). Called from one thread at a time.
  // An error is sent back to the client as kComputeFailed with the status message.
  virtual absl::Status Compute(const ExpertBatch& batch, float* outputs) = 0;
};

}  // namespace tandem

#endif  // TANDEM_HOST_EXPERT_WORKER_CHANNEL_EXPERT_ROW_COMPUTER_H_
