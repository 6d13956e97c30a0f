// Internals of CudaBackend shared by its translation units (cuda_backend.cc: sequences, steps,
// KeepFirst; cuda_backend_setup.cc: loading; layer_loop.cc: the blocks of one layer and the head;
// gdn_mixer.cc and attention_mixer.cc: the two mixers). Not a public header.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_BACKEND_BACKEND_IMPL_H_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_BACKEND_BACKEND_IMPL_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gpu_service/backends/cuda/backend/cuda_backend.h"
#include "gpu_service/backends/cuda/backend/decode_graphs.h"
#include "gpu_service/backends/cuda/backend/device_model.h"
#include "gpu_service/backends/cuda/backend/moe_stage.h"
#include "gpu_service/backends/cuda/backend/stage_timer.h"
#include "gpu_service/backends/cuda/cuda_check.h"
#include "gpu_service/backends/cuda/device_buffer.h"
#include "gpu_service/backends/cuda/kernels/attention.cuh"
#include "gpu_service/backends/cuda/kernels/dense_matvec.cuh"
#include "gpu_service/backends/cuda/kernels/gdn.cuh"
#include "gpu_service/backends/cuda/kernels/gemm_plan.h"
#include "gpu_service/backends/cuda/kernels/norm_streams.cuh"

namespace tandem {
namespace backend_internal {

// A kernel launcher's status: cudaErrorInvalidValue is a shape or type the kernel refused (said so,
// naming `what`), any other error the CUDA error.
inline absl::Status Launch(cudaError_t err, const char* what) {
  if (err == cudaErrorInvalidValue) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": shape or type refused by the kernel"));
  }
  return cuda::CudaStatus(err, what, __FILE__, __LINE__);
}

// Whether [p, p + bytes) is page-locked host memory (cudaMallocHost, cudaHostAlloc, cudaHostRegister),
// judged by its first and last byte. A failed query counts as "no" (and its error is cleared).
inline bool PinnedHost(const void* p, size_t bytes) {
  for (const void* q : {p, static_cast<const void*>(static_cast<const char*>(p) + bytes - 1)}) {
    cudaPointerAttributes attr{};
    if (cudaPointerGetAttributes(&attr, q) != cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
    if (attr.type != cudaMemoryTypeHost) return false;
  }
  return true;
}

}  // namespace backend_internal

// The shared expert's parts stacked into one fast-prefill GEMM: [gate; up], plus its gate logit
// when the model has one over the same input. PrepareDenseWeights (cuda_backend.cc) prepares this
// stack and SharedExpertStacked (layer_loop.cc) runs it, so both take it from here.
struct SharedExpertStack {
  std::array<const cuda::DeviceMatrix*, 3> parts;
  size_t count;
  bool with_gate_logit() const { return count == 3; }
  std::span<const cuda::DeviceMatrix* const> matrices() const { return {parts.data(), count}; }
};
inline SharedExpertStack SharedExpertStackOf(const cuda::GpuLayer& l) {
  const bool gate_logit = l.shared_gate_inp.present() && l.shared_gate_inp.cols == l.shared_gate.cols;
  return {{&l.shared_gate, &l.shared_up, &l.shared_gate_inp}, gate_logit ? size_t{3} : size_t{2}};
}

// The mixer's input products over the same x stacked into one fast-prefill GEMM: GDN [qkv; z; ba]
// (row t of its output: [qkv | z | ba]), attention [k; v] (the queries stay a product of their own:
// their rows carry the output gate, which the attention kernels read at the row width). Prepared by
// PrepareDenseWeights (cuda_backend.cc), run by MixerStacked (layer_loop.cc).
struct MixerStack {
  std::array<const cuda::DeviceMatrix*, 3> parts;
  size_t count;
  std::span<const cuda::DeviceMatrix* const> matrices() const { return {parts.data(), count}; }
  // Whether every part exists (else there is nothing to stack).
  bool present() const {
    for (size_t i = 0; i < count; ++i) {
      if (!parts[i]->present()) return false;
    }
    return true;
  }
};
inline MixerStack MixerStackOf(const cuda::GpuLayer& l) {
  if (l.kind == LayerKind::kGdn) return {{&l.qkv, &l.z, &l.ba}, 3};
  return {{&l.k, &l.v, nullptr}, 2};
}

// One live sequence: its row in the device state arrays and page table, and its host-side history.
struct CudaSequence {
  int32_t row = 0;
  int64_t length = 0;
  int64_t last_chunk_start = 0;
  bool rewindable = false;      // the last chunk's start state was saved (KeepFirst may rewind it)
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
  cuda::AttentionPlan attn;      // full attention's work items and split (PlanAttention)
};

class CudaBackend::Impl {
 public:
  // Everything below is set up by Create (cuda_backend.cc).
  std::unique_ptr<ReferenceModel> model;
  CudaBackendOptions options;
  const ModelConfig* c = nullptr;
  cuda::AttnShape attn_shape;  // c->attn and c->gdn as the kernels take them
  cuda::GdnShape gdn_shape;
  std::unique_ptr<cuda::DeviceModel> dm;
  cuda::Stream stream;
  cuda::Stream side;                 // work that overlaps the main stream's (Fork / Join)
  std::optional<cuda::StreamFork> side_fork;
  cuda::Stream prefetch_stream;      // L2 prefetches (PrefetchToL2), joined once per step
  std::optional<cuda::StreamFork> prefetch_fork;
  bool prefetch_pending = false;     // prefetch_stream has work the main stream has not joined
  std::unique_ptr<cuda::DenseGemm> gemm;
  // The mode of the mixers' output products (ssm_out, o) in prefill: gemm's mode, or kFast under
  // fast_dense_out_single / TANDEM_DENSE_OUT_SINGLE=1 with a kFastSplit plan (set at Create).
  cuda::GemmMode out_mode = cuda::GemmMode::kExact;
  cuda::DeviceBuffer shared_gu;  // the stacked shared-expert GEMM's rows (max_batch_tokens × shared_stack_rows)
  int64_t shared_stack_rows = 0;  // widest stack of [shared gate; shared up; shared gate logit], 0: none
  cuda::DeviceBuffer mixer_rows;  // the stacked mixer-input GEMM's rows (max_batch_tokens × mixer_stack_rows)
  int64_t mixer_stack_rows = 0;   // widest MixerStack prepared as one copy, 0: none (unstacked products)
  // Widest GpuLayer::mixer_in, 0: none. Small steps' stacked input products write their rows into
  // mixer_rows too (min(max_batch_tokens, kMatVecMaxRows) × decode_in_rows at least), never in a
  // layer that runs MixerStacked (larger steps only).
  int64_t decode_in_rows = 0;
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
  float* attn_scratch = nullptr;   // split-context partials of full attention (AttentionMaxScratchBytes)
  // The f16 K / V tiles of the tensor-core prefill (TANDEM_ATTN_KV16=1 at setup, hd 256, fast
  // attention; else null): AttnKv16ScratchBytes over the pool's pages, shared by the attention layers.
  uint8_t* attn_f16_tiles = nullptr;
  float* gdn_scratch = nullptr;    // the chunked delta rule's scratch (prefill), gdn_scratch_bytes long
  int64_t gdn_scratch_bytes = 0;
  // Fast mode, a model with such layers: a row of h a layer, where one-token steps add the mixer's
  // output when its output product adds into it (GDN: ssm_out inside the fused kernel,
  // GetGdnDecodeFused 3, 4; attention: the column-split o product, AttnOutColumnSplit); zeroed by
  // EnqueueForward. Layer l's row starts at l·mixer_out_stride: h, or more where a GDN layer's
  // output product also sums the router's rows (GpuLayer::route_rows: its row holds the mixer's
  // output, then those rows' parts, kernels/route_compose.cuh).
  float* mixer_out_y = nullptr;
  int64_t mixer_out_stride = 0;
  // Fast mode, a model with GDN layers whose output product can go inside the fused kernel: a row
  // of the stacked product's width (gdn_polled_stride floats) for each such layer, in layer order
  // (gdn_polled_slot: the layer's row, -1 for the others), which one-token steps fill with
  // cuda::kRowUnwrittenBits at their start; under cuda::GdnRowsPolled the layer's norm-in product
  // writes its rows there and the fused kernel polls them (RunGdn).
  float* gdn_polled_rows = nullptr;
  int64_t gdn_polled_stride = 0;
  int64_t gdn_polled_layers = 0;
  std::vector<int64_t> gdn_polled_slot;
  cuda::DeviceBuffer route_h_reads;  // NormRoute::h_reads (one int, zero between launches)
  float *qg = nullptr, *q = nullptr, *kb = nullptr, *vb = nullptr, *ao = nullptr;
  float *iqk = nullptr, *iq = nullptr, *scores = nullptr;
  int32_t *sel_blocks = nullptr, *sel_counts = nullptr;
  float *xh = nullptr, *logits = nullptr;
  // The step's inputs on the device, one allocation that one copy a step fills: a prefix of
  // kStepPrefixInts (head_dest, the head kernel's destination), then step_ints.
  static constexpr int64_t kStepPrefixInts = 4;
  int32_t* step_block = nullptr;
  int32_t* step_ints = nullptr;    // tokens, seq rows, positions (T each), then attention items (2T)
  cuda::PinnedBuffer staging;      // the host side of step_block
  cuda::PinnedBuffer host_logits;  // T × vocab

  // Sequences.
  absl::flat_hash_map<SequenceSlot, CudaSequence> seqs;
  SequenceSlot next_slot = 1;
  std::vector<int32_t> free_rows, free_pages;
  std::atomic<int64_t> pages_in_use{0};
  int64_t total_pages = 0;

  bool has_engram = false;                   // some layer has Engram (its rows are gathered on the host)
  std::optional<cuda::DecodeGraphs> graphs;  // set when options.cuda_graphs
  bool graphs_refused = false;               // CUDA refused a capture once: run without graphs
  // Rows of the head's output (and so of host_logits) per input, −1 when it wants none (EnqueueHead).
  std::vector<int64_t> head_first;
  int64_t head_rows = 0;
  // Per input: its logits came straight from the device (EnqueueLogitsCopy).
  std::vector<bool> logits_direct;
  // PlanHead: the step's one head row goes through the Q6_K head kernel, which writes to *head_dest()
  // (the step's copy sets it: the caller's page-locked row, else `logits`). TANDEM_OLD_HEAD_DEST=1:
  // never (the head writes `logits`, a copy brings the row to the host).
  bool head_y_at = false;
  // This step's head kernel writes the caller's page-locked row itself: no copy after it.
  bool head_wrote_host = false;

  // Step-time flags of the layer loop: the last block's output (y) still has to be injected into H
  // (the next read does it), and the inject weights in `a` are all 1 (one stream: not written).
  bool inject_pending = false;
  bool inject_is_one = false;
  // With inject_pending: the shared expert's term the MoE stage left out of y (MoeStage::Run's
  // `deferred`, one-token decode), added by whichever launch injects y; {} when y is complete.
  cuda::PendingShared pending_shared;
  // With inject_pending after a MoE stage: where its output is (MoeStage::Run's y_written: y, or the
  // stage's fused one-token buffer); nullptr: y.
  const float* moe_y = nullptr;
  const float* PendingY() const { return moe_y != nullptr ? moe_y : y; }
  // This step zeroed mixer_out_y, and its mixers may add their outputs there (EnqueueForward).
  bool mixer_out_step = false;
  // One-token steps whose mixer read left its norm to the products that read x
  // (MixerNormInProduct): x_norm_in holds that norm for InputProduct until the mixer ends, and
  // earlier_inject the inject H still owes until the layer's next read adds it (EarlierInject).
  std::optional<cuda::MatVecNormIn> x_norm_in;
  cuda::EarlierInject earlier_inject;
  // Where the current layer's mixer left its output: nullptr for y, or its row of mixer_out_y
  // (RunGdn with ssm_out inside the fused kernel, RunAttention's column-split o product). Reset by
  // RunLayer before each mixer.
  const float* mixer_y = nullptr;
  // Set with mixer_y when the mixer's output product also summed the router's rows and this step
  // routes through them (RouteThroughOutFor): the ffn norm then forms the routing logits.
  std::optional<cuda::NormRoute> route_parts;
  // The attention slices RunAttention left for the column-split o product to merge
  // (AttnDeferredMerge; splits 0: none), read by AttnOutProduct right after.
  cuda::AttnDeferredMerge attn_merge;

  std::atomic<uint64_t> local_rows{0};
  std::vector<MoeRouting>* routing_sink = nullptr;
  std::vector<BlockSelection>* selection_sink = nullptr;  // CudaBackend::set_selection_sink
  mutable std::mutex profile_mu;
  std::string profile_line;

  float** head_dest() const { return reinterpret_cast<float**>(step_block); }
  int32_t* tokens_dev() const { return step_ints; }
  int32_t* seq_dev() const { return step_ints + options.max_batch_tokens; }
  int32_t* pos_dev() const { return step_ints + 2 * options.max_batch_tokens; }
  int32_t* items_dev() const { return step_ints + 3 * options.max_batch_tokens; }
  float* state(const CudaSequence& s) const { return recurrent + s.row * recurrent_floats; }

  // Layer loop (layer_loop.cc).
  // y = x·Wᵀ: matvec for up to 8 rows (f32), else the GEMM in the backend's mode, or near f32 when
  // accurate (f16 hi/lo triples in fast mode: the router's and shared gate's logits, whose rounding
  // would flip routing picks).
  absl::Status Product(const cuda::DeviceMatrix& w, const float* x, int64_t n, float* y, bool accurate = false,
                       cudaStream_t on = nullptr);  // on: the stream (nullptr: the main stream)
  // Product of the block input x (n rows; on: the stream, nullptr: the main stream), or, when the
  // read left its norm to the mixer's products (x_norm_in, one row), the norm-in product
  // (LaunchDenseMatVecNormIn) that forms x itself.
  // gdn: the GDN layer's product (stamped where cuda::ProbeDecodeStep, benchmarks).
  // polled (the norm-in product only): its rows polled by the kernel after it (cuda::RowsPolled).
  absl::Status InputProduct(const cuda::DeviceMatrix& w, int64_t n, float* y, cudaStream_t on = nullptr,
                            bool gdn = false, const cuda::RowsPolled* polled = nullptr);
  // A mixer's output product (ssm_out, o) on the main stream: matvec for up to 8 rows, else the
  // GEMM in out_mode (Product's result exactly when out_mode is the plan's mode).
  absl::Status OutProduct(const cuda::DeviceMatrix& w, const float* x, int64_t n, float* y);
  // y_i = x·W_iᵀ for several matrices of one input: GEMM-sized steps convert x to f16 once when
  // every matrix has a prepared copy in the plan's mode (DenseGemm::ConvertInput / RunInput), else
  // one Product each (same results either way: the same conversion and product).
  absl::Status Products(std::initializer_list<std::pair<const cuda::DeviceMatrix*, float*>> outs, const float* x,
                        int64_t n);
  // The shared expert of a fast prefill step from the stacked [gate; up; gate logit] copy
  // (MoeStage's SharedExpertFn): false when layer's copies are not stacked.
  absl::StatusOr<bool> SharedExpertStacked(int64_t layer, const float* x, int64_t n, float* shared, float* gate_logit,
                                           cudaStream_t st);
  // A fast prefill step's MixerStack of w over x as one GEMM into mixer_rows (row stride: the value
  // returned), then each of `also` (y = x·Wᵀ, same input) from the same f16 rows of x. 0, with
  // nothing run, when w's stack is not prepared as one (the caller runs Products instead).
  absl::StatusOr<int64_t> MixerStacked(const cuda::GpuLayer& w, int64_t n,
                                       std::initializer_list<std::pair<const cuda::DeviceMatrix*, float*>> also);
  // The side stream starts from the main stream's current point / the main stream waits for the
  // side stream's work so far. Independent products of small steps overlap this way (their kernels
  // are latency-bound: alone they leave most of the GPU idle).
  absl::Status Fork();
  absl::Status Join();
  // Brings the matrices into L2 from a side stream forked at the main stream's current point; the
  // main stream does not wait for it (JoinPrefetches does, once per step).
  absl::Status PrefetchToL2(std::initializer_list<const cuda::DeviceMatrix*> matrices);
  absl::Status JoinPrefetches();
  // A hyper-connection read into x (and the inject weights into a, unless a is nullptr), with the
  // pending block output (when not nullptr) injected into H first, fused into the norm. f16_for
  // (not kExact): a plain read's norm also writes x as the f16 input rows of products in that mode
  // (LaunchInjectRmsNormF16 into the DenseGemm scratch, DenseGemm::SetConverted). xq (plain reads
  // only, may be nullptr): the norm also writes x quantized for the MoE experts (NormMmqOut).
  // pending_shared (with pending only, may be nullptr): a shared term to add to pending first.
  // norm_in_product: a one-token read whose norm the caller's one product of x forms itself
  // (MixerNormInProduct): nothing is launched; x_norm_in and earlier_inject are set instead. A
  // plain read's norm adds earlier_inject to H first and clears it.
  absl::Status Read(const cuda::GpuHcRead& r, int64_t n, float* x, float* a, const float* pending,
                    cuda::GemmMode f16_for = cuda::GemmMode::kExact, const cuda::NormMmqOut* xq = nullptr,
                    const cuda::PendingShared* pending_shared = nullptr, bool norm_in_product = false,
                    const cuda::NormRoute* route = nullptr);
  // The router's parts a GDN layer's fused output product sums into its row `out` of mixer_out_y
  // for this step (GpuLayer::route_rows; RouteThroughOut; the norm's early H reads, which the route
  // blocks need), with w, rows and logits left for the layer loop to fill; nullopt: none.
  std::optional<cuda::NormRoute> RouteThroughOutFor(const cuda::GpuLayer& w, int64_t T, const float* out) const;
  // The pending shared term for the launch that injects y now ({}: none; the launches take a null
  // shared as none), and forgets it.
  cuda::PendingShared TakePendingShared() { return std::exchange(pending_shared, cuda::PendingShared{}); }
  // The mode in which the products after layer's mixer read (ffn: its MoE read) would convert x
  // through DenseGemm::ConvertInput, for Read's f16_for; kExact when none would (small steps, exact
  // mode, unprepared matrices). Else the stream norm before the product writes its f16 input rows
  // itself (LaunchInjectRmsNormF16 + DenseGemm::SetConverted), bit-identical to a separate
  // conversion and measured faster (TANDEM_OLD_NORM_CONVERT, its A/B switch, removed 2026-12-01).
  cuda::GemmMode ReadF16Mode(const cuda::GpuLayer& w, int64_t n, bool ffn) const;
  absl::Status RunLayer(int64_t layer, const StepPlan& plan);
  // Whether a small step runs layer w's mixer input products as the one product over w.mixer_in
  // (into mixer_rows, sized for it at setup).
  bool StackedInputs(const cuda::GpuLayer& w) const {
    return w.mixer_in.present() && w.mixer_in.rows <= decode_in_rows;
  }
  // How a small step's GDN layer runs its input products (RunGdn): one product over w.mixer_in or
  // w.qkv_ba (stacked_in), ssm_out inside the fused kernel into the layer's row of mixer_out_y
  // (out_inside), z's own product on the side stream beside w.qkv_ba's (z_side).
  struct GdnInputs {
    bool stacked_in = false, out_inside = false, z_side = false;
  };
  GdnInputs PlanGdnInputs(const cuda::GpuLayer& w, int64_t T, int fused_switch) const;
  // Whether RunGdn runs the layer w (inputs planned as `in`) in one launch with its stacked input
  // product inside (cuda::LaunchGdnDecodeLayer, TANDEM_GDN_LAYER_ONE): a one-token step with ssm_out
  // inside the fused kernel (by columns, bulk copies), the one stacked product forming its own norm
  // (x_norm_in), and the shapes the launch takes.
  bool GdnLayerInOneLaunch(const cuda::GpuLayer& w, const GdnInputs& in) const;
  // Whether layer w's mixer read of a one-token step leaves its norm to the products that read x
  // (LaunchDenseMatVecNormIn: a GDN layer's product over w.mixer_in; attention's over [k; v] and q,
  // or [q; k; v]), each forming x itself: the norm's launch is saved, H's inject moves to the
  // layer's next read (EarlierInject). Needs one stream, no inject weights, Q8_0x8 products the
  // norm-in form takes, a pending y that the mixer does not overwrite (the fused MoE's buffer, or a
  // mixer output in mixer_out_y) and no ablation of the pieces between. TANDEM_MIXER_NORM_LAUNCH=1
  // (A/B; settable: SetMixerNormLaunch) keeps the norm's own launch.
  bool MixerNormInProduct(const cuda::GpuLayer& w, int64_t T) const;
  // The two mixers (gdn_mixer.cc, attention_mixer.cc).
  absl::Status RunGdn(int64_t layer, const StepPlan& plan);
  absl::Status RunAttention(int64_t layer, const StepPlan& plan);
  absl::Status AttnOutProduct(int64_t layer, const cuda::GpuLayer& w, int64_t T);
  // Whether a small step with stacked inputs runs attention layer w's [k; v] product on the side
  // stream beside q's (the upload made w.kv; TANDEM_ATTN_DECODE_KV_SIDE), not the one [q; k; v].
  bool AttnKvAside(const cuda::GpuLayer& w) const { return w.kv.present() && cuda::AttnStackedKvSide(); }
  // Whether AttnOutProduct splits layer w's o product by columns into its row of mixer_out_y (fast
  // one-token steps) rather than writing y.
  bool AttnOutByColumns(const cuda::GpuLayer& w, int64_t T) const;
  // The matrix AttnOutProduct's column-split product reads (w.o_route when the step routes through
  // it, else w.o); null unless AttnOutByColumns(w, T).
  const cuda::DeviceMatrix* AttnOutMatrix(const cuda::GpuLayer& w, int64_t T) const;
  // Whether a step's attention layers run attention and o as one launch (attention_out_fused.cuh):
  // one token, the switch on, the context at most kAttnOutFusedMaxKeys. Part of the graph key.
  bool AttnOutFusedStep(const StepPlan& plan) const;
  // With selection_sink: waits for the step's block selections of layer (sel_blocks, sel_counts)
  // and writes them into (*selection_sink)[layer] without each token's own block.
  absl::Status CopySelectionsToSink(int64_t layer, const StepPlan& plan);
  // Which rows of the step go through the head (head_first, head_rows): host only, every step.
  void PlanHead(const StepPlan& plan, std::span<const Backend::StepInput> inputs);
  // After PlanHead: where the one-row head kernel writes this step (head_y_at): the page-locked
  // logits row of the input that wants it, through its mapped address (head_wrote_host), else
  // `logits`.
  float* HeadDestination(std::span<const Backend::StepInput> inputs);
  // The head for the rows PlanHead chose (no wait).
  absl::Status EnqueueHead(const StepPlan& plan, std::span<const Backend::StepInput> inputs);
  // After the forward (graph or not): the head's rows to each input's logits when those are
  // page-locked (logits_direct), else to host_logits (no wait).
  absl::Status EnqueueLogitsCopy(const StepPlan& plan, std::span<const Backend::StepInput> inputs);
  // After the step's stream is done: host_logits into each input's logits that were not direct.
  void CopyLogitsOut(const StepPlan& plan, std::span<const Backend::StepInput> inputs) const;
  // Everything of a step after its inputs are on the device: embedding, layers, head.
  absl::Status EnqueueForward(const StepPlan& plan, std::span<const Backend::StepInput> inputs);
  // Whether this step can run as a graph, and the graph's key.
  bool GraphKey(const StepPlan& plan, std::span<const Backend::StepInput> inputs, std::vector<int32_t>* key) const;
};

}  // namespace tandem

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_BACKEND_BACKEND_IMPL_H_
