// The CUDA backend: the Backend interface (gpu_service/backend/backend.h) with every block of the
// layer loop (docs/MODEL.md §4.2) on one GPU and every routed expert resident in device memory.
//
//   CudaBackendOptions o;
//   o.mode = CudaMode::kExact;
//   auto backend = CudaBackend::Open("tiny.gguf", o);
//
// Memory: the weights are uploaded once into one allocation; all scratch is sized at Open for
// max_batch_tokens tokens per step, and all sequence state for max_sequences sequences of up to
// max_context positions (GDN conv + S f32, Engram conv history, indexer keys, checkpoints for
// KeepFirst), plus a pool of KV pages (64 positions each) handed to sequences as they grow. A step
// allocates no device memory.
//
// Modes: kExact computes every product in f32 (dense matvec for up to 8 rows, f32 pedantic cuBLAS
// for more: no TF32) with f32 caches; it is the validation mode (logits within 1e-4 of the CPU
// reference). kFast runs prefill products and prefill experts as bf16 GEMMs with f32 accumulation.
//
// Steps of at most 64 tokens plan their expert work on the GPU and wait only once, at the end, for
// the logits; longer steps wait once per MoE layer for the routing picks (planned on the host).
// Decode steps (one token per sequence) of models without Engram or the indexer are captured as
// CUDA graphs, one per batch size (options.cuda_graphs), and replayed. Profiling (options.profile) times the stages with CUDA
// events and keeps one text line per step (last_profile()).
//
// Not yet: the MTP draft head (DraftGreedy has no Backend counterpart yet), host-worker experts.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_BACKEND_CUDA_BACKEND_H_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_BACKEND_CUDA_BACKEND_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "common/model/reference_model.h"
#include "common/reference/moe.h"
#include "gpu_service/backend/backend.h"

namespace tandem {

enum class CudaMode { kExact, kFast };

// Empty when this process can use a CUDA device; otherwise why not, e.g. "no CUDA device
// (cudaErrorNoDevice: no CUDA-capable device is detected)" (no device, no driver, a driver too
// old for this build). For --backend auto's choice, without opening a model.
std::string CudaDeviceUnavailableReason();

struct CudaBackendOptions {
  CudaMode mode = CudaMode::kExact;
  int64_t max_batch_tokens = 256;  // tokens of one Step, all sequences together
  int64_t max_sequences = 16;      // live sequences
  int64_t max_context = 4096;      // positions per sequence
  int64_t kv_pages = 0;            // KV pages of 64 positions; 0: max_sequences · max_context / 64
  int device = 0;                  // CUDA device ordinal
  // kFast only: which prefill products run as bf16 GEMMs (the others stay f32 exact).
  bool fast_dense_gemm = true;     // projections, stream reads, head
  // ... as three f16 products of hi/lo halves, or one f16 product plus one fp8 correction for
  // matrices of >= 2048 x 2048 (near-f32 accuracy; the router's and the shared expert's products are
  // split whatever this says). Off by default since 2026-12-02: one f16 product each (H200, q3n-80b:
  // prefill +6.2% at 512 tokens, +11.2% at 8192; routing agreement over eight prompts tiny /
  // tiny-q3n / small 0.9956 / 0.9985 / 0.9912 against 0.9982 / 0.9993 / 0.9928 split, logits where
  // every pick agreed <= 1.7e-3: docs/VALIDATION.md). TANDEM_DENSE_SPLIT, where set, overrides it
  // at Create (the A/B switch: 1 split, 0 one product).
  bool fast_dense_split = false;
  // With fast_dense_split on: the mixers' output products (GDN ssm_out, attention o), whose outputs
  // are added to the residual stream, as ONE f16 product (their f16 copy and inputs only), every
  // other dense product staying split. On by default since 2026-12-02 (H200, q3n-80b: prefill
  // +3.4% at 512 tokens, +4.4% at 2048 and 8192; routing agreement on the test models tiny /
  // tiny-q3n / small 1.0000 / 1.0000 / 0.9980 against 1.0000 / 1.0000 / 0.9971 with them split,
  // in the same run: docs/VALIDATION.md).
  // TANDEM_DENSE_OUT_SINGLE, where set, overrides it at Create (0: split, 1: one product).
  bool fast_dense_out_single = true;
  bool fast_expert_gemm = true;    // routed and shared experts (steps above 64 tokens)
  bool fast_attention = true;      // f16 tensor-core attention for sequences with >= 64 new tokens
  bool fast_gdn = true;            // tf32 tensor cores in the chunked delta rule
  bool cuda_graphs = true;         // replay decode steps (one token per sequence) as CUDA graphs
  // Programmatic dependent launch (pdl.cuh): kernels of a step start while the one before them
  // finishes. A process-wide launch policy: the last backend created sets it.
  bool pdl = true;
  // Steps of up to 8 tokens: weights brought into L2 on a side stream ahead of the products that
  // read them (kernels/l2_prefetch.cuh). 0: none; 1: within the layer (the mixer's output
  // projection, the router and the shared expert, from the layer's start); 2: also the next
  // layer's mixer inputs (from the MoE stage). Off by default: with the Q8_0x8 matvecs the side
  // stream's reads slowed batch-1 decode (q3n-80b, f91babc: 275.6 / 279.5 tok/s with 2 against
  // 293.9 / 291.6 with 0, docs/PERF.md "Fourth session").
  int l2_prefetch = 0;
  // Fast mode, steps above 8 tokens: persistent f16 copies of the dense matrices (DenseGemm::
  // Prepare) so that prefill products skip the per-call dequantization. With fast_dense_split they
  // take 6 bytes per weight (11.4 GB for Qwen3-Next-80B's dense weights), else 2.
  bool prepare_dense_weights = true;
  int graph_capacity = 16;         // graphs kept (one per decode batch size seen), least recent dropped
  bool profile = false;            // per-stage CUDA-event timing of every step (steps run without graphs)
  bool print_profile = false;      // also print each step's line to stderr
};

class CudaBackend : public Backend {
 public:
  static absl::StatusOr<std::unique_ptr<CudaBackend>> Open(const std::string& model_path,
                                                           const CudaBackendOptions& options);
  // Over an already open model (its file mapping, config, weight views and tokenizer are used;
  // its own CPU state pool is not).
  static absl::StatusOr<std::unique_ptr<CudaBackend>> Create(std::unique_ptr<ReferenceModel> model,
                                                             const CudaBackendOptions& options);
  ~CudaBackend() override;

  std::string name() const override { return "cuda"; }
  const ModelConfig& config() const override;
  const Tokenizer& tokenizer() const override;
  uint64_t parameter_count() const override;

  absl::StatusOr<SequenceSlot> CreateSequence() override;
  void ReleaseSequence(SequenceSlot slot) override;
  absl::Status Step(std::span<const StepInput> inputs) override;
  // Page-locked (cudaMallocHost): Step copies the head's rows straight into it.
  LogitsBuffer AllocateLogits(size_t floats) override;
  absl::Status KeepFirst(SequenceSlot slot, int64_t m) override;
  StateUsage state_usage() const override;
  ExpertPlacementTotals placement() const override;

  // When set (not null), the next Steps write each MoE layer's picks (n × K, step order) here:
  // (*routing)[layer].experts. For parity tests against ReferenceModel's ForwardOptions::routing.
  void set_routing_sink(std::vector<MoeRouting>* routing);
  // When set (not null), the next Steps write each sparse-attention layer's block selections here
  // in ReferenceModel's ForwardOptions::selections layout ((*selections)[layer], step order: the
  // blocks besides the query's own, ascending; empty for GDN layers and without an indexer), copied
  // to the host after each such layer with a wait (tests only; no decode graphs while set). For
  // parity tests: a flipped block selection is a discrete change like a flipped routing pick.
  void set_selection_sink(std::vector<BlockSelection>* selections);
  // Switches the per-stage timing on or off from the next Step (options.profile is the initial value).
  void set_profile(bool on);
  // The last step's stage line ("tokens=... total=... ms io=... head=..."), empty without profile.
  std::string last_profile() const;
  // Device bytes held for the model's weights; for state and scratch (the arena, and the stacked
  // products' row buffers beside it); for the dense weights' f16 (and fp8) copies that fast
  // prefill multiplies (DenseGemm::prepared_bytes; 0 in exact mode).
  uint64_t weight_bytes() const;
  uint64_t state_bytes() const;
  uint64_t prepared_weight_bytes() const;
  // Decode-step graphs captured and replayed so far.
  int64_t graph_captures() const;
  int64_t graph_replays() const;
  // Rows of the widest mixer-input stack prepared as one GEMM (fast mode), 0: none.
  int64_t stacked_mixer_rows() const;
  // Whether fast prefill runs the mixers' output products (ssm_out, o) as one f16 product while
  // the other dense products are split (CudaBackendOptions::fast_dense_out_single or
  // TANDEM_DENSE_OUT_SINGLE=1, with fast_dense_split); false otherwise.
  bool dense_out_single() const;

  class Impl;

 private:
  explicit CudaBackend(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_BACKEND_CUDA_BACKEND_H_
