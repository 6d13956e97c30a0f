// The MoE and Engram stages of the CUDA backend's layer loop, over the MoE kernel family
// (router, expert work lists, scatter-sum, Engram). The header names none of that family's types,
// so the layer loop sees the MoE work through MoeStage only.
//
// Experts: every step routes on the GPU and plans the step as a list of ExpertUnits, each naming
// one expert's device weight addresses and up to kMaxUnitRows activation rows. The addresses come
// from an ExpertSource, so the expert arena (an LRU of device slots fed by the host) can replace the
// resident weights without touching the kernels; pairs whose expert the source cannot place are
// the host worker's (not wired yet: FailedPrecondition).
//
// Planning: for steps of at most kDevicePlanMaxTokens tokens whose source has a device table for
// the layer (every expert on the GPU), the plan is made on the GPU (device_plan.cuh,
// route_plan.cuh) and the stage never waits on the host, so a decode step can be captured as a
// CUDA graph. Longer steps with a device table are planned on the GPU too (route_plan.cuh) and the
// prefill runner builds its tiles from the device units (prefill_tiles_device.cuh): no host wait
// either, unless the caller asks for the picks (or HostPrefillPlan: the units come back to the host
// once per layer). Without a device table (the arena) the picks come back and the host plans
// (PlanMoeStep).
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_BACKEND_MOE_STAGE_H_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_BACKEND_MOE_STAGE_H_

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "common/model/model_config.h"
#include "common/reference/engram.h"
#include "gpu_service/backends/cuda/backend/device_model.h"
#include "gpu_service/backends/cuda/backend/stage_timer.h"
#include "gpu_service/backends/cuda/device_buffer.h"
#include "gpu_service/backends/cuda/kernels/embedding.cuh"
#include "gpu_service/backends/cuda/kernels/norm_streams.cuh"
#include "gpu_service/backends/cuda/moe/expert_prefill_mmq.cuh"
#include "gpu_service/backends/cuda/moe/expert_unit.h"

namespace tandem::cuda {

// Where routed experts' weights are on the device for this step.
class ExpertSource {
 public:
  virtual ~ExpertSource() = default;
  // nullopt: not on the device (to be computed by the host worker).
  virtual std::optional<ExpertLocation> Locate(int64_t layer, int32_t expert) = 0;
  // Device memory holding the E locations of `layer`'s routed experts, valid while the step's work
  // is queued, when every one of them is on the device; nullptr otherwise (the host plans).
  virtual const ExpertLocation* DeviceTable(int64_t /*layer*/) const { return nullptr; }
};

// Every expert resident in the uploaded model.
class ResidentExperts : public ExpertSource {
 public:
  static absl::StatusOr<std::unique_ptr<ResidentExperts>> Create(const DeviceModel* model, int64_t experts);
  std::optional<ExpertLocation> Locate(int64_t layer, int32_t expert) override;
  const ExpertLocation* DeviceTable(int64_t layer) const override;

 private:
  ResidentExperts(const DeviceModel* model, int64_t experts, DeviceBuffer table)
      : model_(model), experts_(experts), table_(std::move(table)) {}
  const DeviceModel* model_;
  int64_t experts_;
  DeviceBuffer table_;  // layers × E ExpertLocations
};

// Steps of at most this many tokens are planned on the device when the source allows it.
inline constexpr int64_t kDevicePlanMaxTokens = 64;

// Process-wide A/B switch: longer (prefill) steps with a device table bring the device plan's units
// back to the host and plan the expert launches there, one wait per MoE layer (the path before
// 2026-12-01), instead of running from the units on the device. Off by default;
// TANDEM_HOST_PREFILL_PLAN on at start-up (env_switch.h) turns it on.
void SetHostPrefillPlan(bool on);
bool HostPrefillPlan();
// Process-wide A/B switch: StreamedF16Input answers nullptr, so the streamed expert kernels'
// input is converted by its own launch (ConvertF16Kernel, the path before h/normf16) instead of
// being written by the stream norm. Off by default; TANDEM_OLD_STREAMED_INPUT on at start-up turns
// it on.
void SetOldStreamedInput(bool on);
bool OldStreamedInput();
// Process-wide A/B switch: device-planned decode steps keep the shared expert's side chain of
// before 2026-12-01 (the unit kernel writing its units, and at one token the gate logit as its own
// one-row product) instead of units built at creation and, at one token, the gate logit as the
// router product's last row. Off by default; TANDEM_OLD_SHARED_CHAIN on at start-up turns it on.
// Read at each step's enqueue: flip it only between backends, not while graphs are live.
void SetOldSharedChain(bool on);
bool OldSharedChain();
// Process-wide A/B switch: one-token decode steps that Run may leave the shared term to y's
// consumer (Run's `deferred`) add it in the down kernel again, with the side stream joined before
// that kernel (the order before 2026-12-01: the down kernel could start, route and fetch its rows
// only once the shared expert's chain had ended). Off by default; TANDEM_OLD_DOWN_JOIN on at
// start-up turns it on. Read at each step's enqueue: flip it only between backends, not while
// graphs are live.
void SetOldDownJoin(bool on);
bool OldDownJoin();
// Process-wide switch: fast-mode one-token decode steps (MoeStageOptions::fast) run the one-token
// MoE kernels with int16 activations (OneTokenMoeArgs::int16_activations: x and act quantized per
// 256 elements, the Q4_K products on dp2a; ~1e-5 relative error) instead of f32 products. On by
// default; TANDEM_ONE_TOKEN_INT16=0 at start-up turns it off. Exact mode never uses it. Read at each
// step's enqueue: flip it only between backends, not while graphs are live.
void SetOneTokenInt16(bool on);
bool OneTokenInt16();
// Process-wide switches of the one-token MoE kernels (OneTokenMoeArgs), read at each step's
// enqueue (flip them only between backends, not while graphs are live); set at start-up by their
// variables (=0 off, =1 on):
//   - TANDEM_ONE_TOKEN_LOGIT_ROUTE, on by default, fast mode only: route by the top-K logits
//     (logit_route) instead of the f64 softmax that is bit-identical to the planned path's routing;
//   - TANDEM_ONE_TOKEN_X_EARLY, on by default: the gate/up kernel stages x before its PDL wait
//     (x_written_earlier: the stream norm wrote x before the router product);
//   - TANDEM_ONE_TOKEN_PICK_COUNTS, off by default (measured slower end to end): the down kernel
//     starts each pick once that pick's gate/up blocks are done (pick_counts) instead of after the
//     whole gate/up grid.
// The last two give the same bits as without.
void SetOneTokenLogitRoute(bool on);
bool OneTokenLogitRoute();
void SetOneTokenEarlyX(bool on);
bool OneTokenEarlyX();
void SetOneTokenPickCounts(bool on);
bool OneTokenPickCounts();
// Fast-mode one-token steps run each layer's routed experts (and a Q8_0 shared expert) as one kernel
// of clusters (expert_decode_fused.cuh) that adds into a per-layer buffer of the stage, zeroed by
// PrepareStep, instead of the two one-token kernels. On by default; TANDEM_ONE_TOKEN_FUSED=0: the
// two kernels. Its sums are added with atomics, so their last bits may differ between runs.
void SetOneTokenFused(bool on);
bool OneTokenFused();
// TANDEM_FUSED_SHARED_BESIDE=1: the fused kernel runs even where a shared expert must stay on the
// side chain, and leaves there one it could compute inside (as the two-kernel path runs it), for
// A/B.
void SetFusedSharedBeside(bool on);
bool FusedSharedBeside();
// The fused kernel also computes the router product (FusedRouter: router blocks ahead of its
// clusters, the expert blocks waiting on their count instead of a launch boundary). On by default;
// TANDEM_FUSED_ROUTER=0: the router product's own launch before it.
void SetFusedRouterInGrid(bool on);
bool FusedRouterInGrid();
// The fused kernel's blocks route with the warp their place on the SM names
// (OneTokenMoeArgs::pick_warp_by_slot) instead of warp 0. Off by default: warp 0 measured 0.7 ..
// 1.5% faster on an H100 (docs/PERF.md, fiftieth and fifty-first sessions);
// TANDEM_FUSED_PICK_BY_SLOT=1 turns it on (it had won on the H200 with an older kernel).
void SetFusedPickWarpBySlot(bool on);
bool FusedPickWarpBySlot();

// True when layer l's shared expert can run as three dense GEMMs in fast-mode steps above
// kMaxUnitRows tokens: its matrices have types the dense kernels take (shared experts are uploaded
// with the expert types, some of which only the expert kernels read). The others run through the
// grouped expert prefill kernel.
bool SharedExpertRunsAsDenseGemms(const GpuLayer& l);

// y (n × m.rows) = m·x for n rows on `stream`: the layer loop's dense product (matvec or GEMM by n).
using DenseProductFn =
    absl::FunctionRef<absl::Status(const DeviceMatrix& m, const float* x, int64_t n, float* y, cudaStream_t stream)>;

// The shared expert of a fast prefill step done whole by the layer loop (stacked gate/up/gate-
// logit GEMM, fused SiLU, down GEMM: DenseGemm::PrepareStack): writes shared (n × h) and, when the
// layer has a shared gate, gate_logit (n). Returns false when it cannot (then the three products
// and the gate's run as before).
using SharedExpertFn = std::function<absl::StatusOr<bool>(int64_t layer, const float* x, int64_t n, float* shared,
                                                          float* gate_logit, cudaStream_t stream)>;

struct MoeStageOptions {
  bool fast = false;       // prefill experts through bf16 GEMMs (else f32 matvec units); one-token decode
                           // with int16 activations (OneTokenInt16)
  int64_t max_tokens = 0;  // most tokens of one step
};

class MoeStage {
 public:
  static absl::StatusOr<std::unique_ptr<MoeStage>> Create(const ModelConfig& config,
                                                          const DeviceModel& model,
                                                          const MoeStageOptions& options);
  ~MoeStage();

  // y (n × h) = MoE_layer(x) for the n rows of x (device). Enqueued on `stream`; with the host
  // planner, one wait for the routing picks. picks, when non-null, receives the n × K expert ids
  // (routing order; this waits for them whichever planner runs). Counts the rows computed on the
  // device into *local_rows. product computes the router and shared-gate logits.
  // side (may be nullptr): a second stream for work that can overlap (the shared expert beside the
  // routed ones, with the device planner); it is joined back before Run's last kernel (after it
  // when the shared term is deferred, below), always before Run returns. x_ready: the
  // caller already wrote the experts' form of x that MmqInput or StreamedF16Input named.
  // deferred (may be nullptr: y always complete): always written. A one-token step on the two
  // one-token kernels (expert_decode_one.cuh) with a shared expert, unless OldDownJoin, leaves the
  // gated shared term out of y and names it here instead (*deferred = {shared, gate logit}; else
  // {}): its down kernel then follows the gate/up kernel directly (PDL) instead of waiting for the
  // shared expert's side chain, which is joined after it. The caller adds the term where it reads
  // y (norm_streams.cuh's PendingShared: the same bits as the down kernel's sum). The pointers are
  // this stage's buffers, valid until its next Run; their producers are ordered before Run's end
  // on `stream`.
  // y_written (may be nullptr: then y is always the output): always written; where the layer's
  // output is, y or, for a one-token step on the fused kernel (OneTokenFused, after PrepareStep),
  // a buffer of this stage that stays valid until the next PrepareStep.
  // logits_ready: the launch just before Run's wrote this step's router logits where
  // ReadyLogitsFor(layer, n, source) said (an error where it said none): no router product.
  absl::Status Run(int64_t layer, const float* x, int64_t n, float* y, ExpertSource& source,
                   cudaStream_t stream, cudaStream_t side, StageTimer& timer, std::vector<int32_t>* picks,
                   uint64_t* local_rows, DenseProductFn product, bool x_ready = false,
                   PendingShared* deferred = nullptr, const float** y_written = nullptr, bool logits_ready = false);

  // Where a caller may write a one-token step's router logits for Run to take ready
  // (logits_ready): the fused one-token kernel's form for this layer (after PrepareStep, with
  // y_written given) over f32 router rows: `rows` the router's matrix (E rows, or E + 1 with the
  // shared gate's row last), whose logits w_r · x go to `logits`. nullopt for any other form.
  struct ReadyLogits {
    const DeviceMatrix* rows = nullptr;
    float* logits = nullptr;
  };
  std::optional<ReadyLogits> ReadyLogitsFor(int64_t layer, int64_t n, ExpertSource& source) const;

  // Before a step's first layer, on `stream`: for a one-token step of the fast mode with
  // OneTokenFused, zeroes the per-layer buffers the fused kernel adds into (one memset) and lets
  // this step's Run calls take that kernel; any other step takes the two-kernel path. With
  // `ranges`, the buffers go into them instead (zeroed by the caller's embedding gather; a buffer
  // they have no room for is still cleared here).
  absl::Status PrepareStep(int64_t n, cudaStream_t stream, cuda::GatherRanges* ranges = nullptr);

  // Where Run(layer, x, n, ...) with this source would quantize x for the integer-MMA expert
  // kernels (the device-planned prefill path with such a kernel), or nullopt (another path). A caller that writes those planes while writing x (the stream norm's
  // NormMmqOut) passes x_ready = true to that Run, which then does not quantize x again.
  std::optional<MmqActivations> MmqInput(int64_t layer, int64_t n, ExpertSource& source);
  // The same for the streamed f16 expert kernels (the device-planned prefill path with kStreamed*:
  // 2048 and 8192 tokens on the 80B model): where Run would convert x to f16 rows (n rows of h,
  // round to nearest even), or nullptr (another path, or OldStreamedInput). A caller that writes
  // them while writing x (NormMmqOut::x16) passes x_ready = true, and Run does not convert x again.
  uint16_t* StreamedF16Input(int64_t layer, int64_t n, ExpertSource& source);

  // The device planner flags picks it could not place (never expected from the router): the
  // kernels write the flag into page-locked memory, checked once the stream has passed the step
  // (EnqueueErrorReadback enqueues nothing; with TANDEM_OLD_ERROR_READBACK=1 it copies the flag
  // there from the device).
  absl::Status EnqueueErrorReadback(cudaStream_t stream);
  // Run's host-planned path tries fn first for the shared expert of GEMM-sized steps.
  void SetSharedExpertFn(SharedExpertFn fn);
  absl::Status CheckDeviceErrors();

  // Engram layer `layer` for one sequence's n new positions: gathers their table rows on the host
  // (embd: the host table; rows from EngramRows), uploads them, and updates H (n × S·h, device)
  // and the sequence's conv state (device).
  absl::Status RunEngram(int64_t layer, const MatrixView& embd, std::span<const int64_t> rows,
                         float* H, int64_t n, float* conv_state, cudaStream_t stream);

 private:
  struct Impl;
  explicit MoeStage(std::unique_ptr<Impl> impl);
  // Run's path when the plan is made on the device (no host wait).
  absl::Status RunDevicePlanned(int64_t layer, const float* x, int64_t n, float* y, const ExpertLocation* table,
                                cudaStream_t stream, cudaStream_t side, StageTimer& timer, DenseProductFn product,
                                bool copy_picks, PendingShared* deferred, const float** y_written,
                                bool logits_ready);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_BACKEND_MOE_STAGE_H_
