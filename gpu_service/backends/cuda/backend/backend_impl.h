// Internals of CudaBackend shared by its two translation units (cuda_backend.cc: sequences, steps,
// KeepFirst; layer_loop.cc: the blocks of one layer and the head). Not a public header.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_BACKEND_BACKEND_IMPL_H_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_BACKEND_BACKEND_IMPL_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "gpu_service/backends/cuda/backend/cuda_backend.h"
#include "gpu_service/backends/cuda/backend/device_model.h"
#include "gpu_service/backends/cuda/backend/moe_stage.h"
#include "gpu_service/backends/cuda/backend/stage_timer.h"
#include "gpu_service/backends/cuda/device_buffer.h"
#include "gpu_service/backends/cuda/kernels/gemm_plan.h"

namespace tandem {

// One live sequence: its row in the device state arrays and page table, and its host-side history.
struct CudaSequence {
  int32_t row = 0;
  int64_t length = 0;
  int64_t last_chunk_start = 0;
  std::vector<int32_t> tokens;  // ids of positions [0, length)
  std::vector<int32_t> pages;   // physical KV pages, in logical order
};

// A Step's inputs in the form the layer loop reads.
struct StepPlan {
  std::vector<CudaSequence*> seqs;
  std::vector<int64_t> starts;   // positions before the step
  std::vector<int64_t> counts;   // new tokens
  std::vector<int64_t> offsets;  // first row of each input in the step's token rows
  int64_t tokens = 0;
  int num_items = 0;             // attention work items (PlanAttentionItems)
};

class CudaBackend::Impl {
 public:
  // Everything below is set up by Create (cuda_backend.cc).
  std::unique_ptr<ReferenceModel> model;
  CudaBackendOptions options;
  const ModelConfig* c = nullptr;
  std::unique_ptr<cuda::DeviceModel> dm;
  cuda::Stream stream;
  std::unique_ptr<cuda::DenseGemm> gemm;
  std::unique_ptr<cuda::MoeStage> moe;
  std::unique_ptr<cuda::ResidentExperts> experts;
  std::optional<cuda::StageTimer> timer;
  std::optional<cuda::DeviceArena> arena;  // state and scratch

  // State layout: per sequence row, `recurrent_floats` of GDN conv/S and Engram conv history
  // (offsets per layer, −1 where absent), the same again as the KeepFirst checkpoint.
  int64_t recurrent_floats = 0;
  std::vector<int64_t> gdn_conv_off, gdn_ssm_off, engram_off;
  std::vector<int64_t> attn_slot;  // per layer: index among attention layers, or −1
  int64_t max_pages = 0;           // page-table row length
  int64_t block_slots = 0;         // indexer block keys per sequence
  int64_t kv_width = 0;
  float* recurrent = nullptr;
  float* checkpoint = nullptr;
  std::vector<float*> k_pool, v_pool, index_keys, block_keys;  // per attention layer
  int32_t* page_table = nullptr;   // device: max_sequences × max_pages
  cuda::PinnedBuffer host_page_table;

  // Scratch for max_batch_tokens rows.
  float *H = nullptr, *N = nullptr, *x = nullptr, *y = nullptr, *a = nullptr, *hz = nullptr, *hm = nullptr;
  float *qkv = nullptr, *zg = nullptr, *ba = nullptr, *conv = nullptr, *g = nullptr, *beta = nullptr, *go = nullptr;
  float *qg = nullptr, *q = nullptr, *kb = nullptr, *vb = nullptr, *ao = nullptr;
  float *iqk = nullptr, *iq = nullptr, *scores = nullptr;
  int32_t *sel_blocks = nullptr, *sel_counts = nullptr;
  float *xh = nullptr, *logits = nullptr;
  int32_t* step_ints = nullptr;    // tokens, seq rows, positions (T each), then attention items (2T)
  cuda::PinnedBuffer staging;      // the host side of step_ints
  cuda::PinnedBuffer host_logits;  // T × vocab

  // Sequences.
  absl::flat_hash_map<SequenceSlot, CudaSequence> seqs;
  SequenceSlot next_slot = 1;
  std::vector<int32_t> free_rows, free_pages;
  std::atomic<int64_t> pages_in_use{0};
  int64_t total_pages = 0;

  std::atomic<uint64_t> local_rows{0};
  std::vector<MoeRouting>* routing_sink = nullptr;
  mutable std::mutex profile_mu;
  std::string profile_line;

  int32_t* tokens_dev() const { return step_ints; }
  int32_t* seq_dev() const { return step_ints + options.max_batch_tokens; }
  int32_t* pos_dev() const { return step_ints + 2 * options.max_batch_tokens; }
  int32_t* items_dev() const { return step_ints + 3 * options.max_batch_tokens; }
  float* state(const CudaSequence& s) const { return recurrent + s.row * recurrent_floats; }

  // Layer loop (layer_loop.cc).
  absl::Status Product(const cuda::DeviceMatrix& w, const float* x, int64_t n, float* y);
  absl::Status Read(const cuda::GpuHcRead& r, int64_t n, float* x, float* a);
  absl::Status RunLayer(int64_t layer, const StepPlan& plan);
  absl::Status RunGdn(int64_t layer, const StepPlan& plan);
  absl::Status RunAttention(int64_t layer, const StepPlan& plan);
  absl::Status RunHead(const StepPlan& plan, std::span<const Backend::StepInput> inputs);
};

}  // namespace tandem

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_BACKEND_BACKEND_IMPL_H_
