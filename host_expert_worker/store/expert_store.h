// The host worker's share of a model's routed experts, copied out of the GGUF file into memory on
// one NUMA node.
//
// A worker started as share K of N holds experts [K*E/N, (K+1)*E/N) of every MoE layer (main
// layers and MTP layers, in the engine's layer numbering): for each layer the share's slice of
// ffn_gate_exps, ffn_up_exps and ffn_down_exps, each contiguous in the file and copied verbatim
// (ggml block layout, no repacking: docs/PERF.md says why). The copy is done by the worker's
// pinned compute threads so that every page is first touched on the node that will read it.
#ifndef TANDEM_HOST_EXPERT_WORKER_STORE_EXPERT_STORE_H_
#define TANDEM_HOST_EXPERT_WORKER_STORE_EXPERT_STORE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/gguf/gguf_file.h"
#include "common/offload/model_fingerprint.h"
#include "host_expert_worker/channel/expert_row_computer.h"
#include "host_expert_worker/kernels/expert_ffn_engine.h"
#include "host_expert_worker/kernels/worker_thread_pool.h"
#include "host_expert_worker/store/numa_memory.h"

namespace tandem {

struct ExpertShare {
  int index = 0;  // K
  int count = 1;  // N
  // [K*E/N, (K+1)*E/N).
  uint32_t begin(uint32_t experts) const { return static_cast<uint32_t>(uint64_t{experts} * index / count); }
  uint32_t end(uint32_t experts) const { return static_cast<uint32_t>(uint64_t{experts} * (index + 1) / count); }
};

// Parses "K/N" with 0 <= K < N (InvalidArgument naming --share otherwise).
absl::StatusOr<ExpertShare> ParseExpertShare(const std::string& text);

// ExpertTensorsFingerprint (the fingerprint of the expert tensors) is in
// common/offload/model_fingerprint.h, shared with the GPU service.

struct ExpertStoreOptions {
  ExpertShare share;
  int numa_node = kNoNumaNode;
};

class ExpertStore {
 public:
  // Reads the config, binds the expert tensors, checks them, and copies this share into a region
  // on options.numa_node, using `pool`'s threads. `file` is needed only during Load.
  static absl::StatusOr<std::unique_ptr<ExpertStore>> Load(const GgufFile& file,
                                                           const ExpertStoreOptions& options,
                                                           WorkerThreadPool* pool);

  const ExpertModelShape& shape() const { return shape_; }
  int64_t inner() const { return inner_; }           // I
  uint64_t bytes() const { return region_->size(); } // expert bytes held
  int numa_node() const { return region_->node(); }
  // Layer l's share: local expert j is global expert shape().expert_begin + j.
  const ExpertLayerView& layer(uint32_t l) const { return layers_[l]; }

 private:
  ExpertStore() = default;
  ExpertModelShape shape_;
  int64_t inner_ = 0;
  std::unique_ptr<NumaRegion> region_;
  std::vector<ExpertLayerView> layers_;
};

// The ExpertRowComputer the channel server calls: the store's weights on the engine's kernels.
class HostExpertComputer : public ExpertRowComputer {
 public:
  // Both must outlive the computer. force_exact: every request runs in the exact mode, whatever
  // its flag says (validation runs).
  HostExpertComputer(const ExpertStore* store, ExpertFfnEngine* engine, bool force_exact = false)
      : store_(store), engine_(engine), force_exact_(force_exact) {}
  const ExpertModelShape& shape() const override { return store_->shape(); }
  absl::Status Compute(const ExpertBatch& batch, float* outputs) override;

 private:
  const ExpertStore* store_;
  ExpertFfnEngine* engine_;
  bool force_exact_;
};

}  // namespace tandem

#endif  // TANDEM_HOST_EXPERT_WORKER_STORE_EXPERT_STORE_H_
