// MoeStage's state (MoeStage::Impl) and the helpers its two source files share: moe_stage.cc
// (creation, the host-planned path, Engram) and moe_stage_device.cc (the device-planned paths of
// decode and prefill, and the shared expert). Internal to the backend folder.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_BACKEND_MOE_STAGE_IMPL_H_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_BACKEND_MOE_STAGE_IMPL_H_

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gpu_service/backends/cuda/backend/moe_stage.h"
#include "gpu_service/backends/cuda/cuda_check.h"
#include "gpu_service/backends/cuda/moe/device_plan.cuh"
#include "gpu_service/backends/cuda/moe/engram_host.h"
#include "gpu_service/backends/cuda/moe/expert_decode.cuh"
#include "gpu_service/backends/cuda/moe/expert_prefill.h"
#include "gpu_service/backends/cuda/moe/experts.h"
#include "gpu_service/backends/cuda/moe/route_plan.cuh"
#include "gpu_service/backends/cuda/moe/route_plan_grid.cuh"
#include "gpu_service/backends/cuda/moe/router.h"

namespace tandem::cuda {
namespace moe_stage_internal {

using ShapeKey = std::tuple<uint32_t, uint32_t, int64_t>;  // gate/up type, down type, inner

// The most units a plan of `pairs` (token, expert) pairs over E experts can have: per expert
// ceil(rows / kMaxUnitRows), at most pairs / kMaxUnitRows + (experts named) in all.
inline int64_t MaxPlanUnits(int64_t pairs, int64_t E) { return std::min(pairs, pairs / kMaxUnitRows + E); }

// TANDEM_OLD_SHARED_GATE=1 (read once): of the new shared chain (OldSharedChain off), keep only the
// unit table; one-token steps compute the gate logit as its own one-row product on the side stream
// again. A diagnostic A/B of the chain's two parts; TANDEM_OLD_SHARED_CHAIN=1 turns both off.
bool OldSharedGate();

}  // namespace moe_stage_internal

struct MoeStage::Impl {
  using ShapeKey = moe_stage_internal::ShapeKey;

  ModelConfig config;
  const DeviceModel* model = nullptr;
  MoeStageOptions options;
  std::optional<GpuRouter> router;
  std::optional<ExpertDecodeRunner> routed_runner, shared_runner;
  std::map<ShapeKey, ExpertPrefillRunner> prefill;  // fast mode: per expert shape
  DeviceBuffer logits, act, partial, shared, gate_logit, slot;
  // The one-token kernels' per-pick completion counts (K + 1 ints, zeroed here, left zero by every
  // down kernel: OneTokenMoeArgs::pick_counts).
  DeviceBuffer pick_counts;
  // Fast mode: the fused one-token kernel's outputs, n_layers × h floats (layer l at l·h), zeroed
  // by PrepareStep before a step that uses them; fused_step: this step may use them.
  DeviceBuffer fused_y;
  bool fused_step = false;
  // The fused kernel's router-block counters (FusedRouter::counters: two ints), zeroed by PrepareStep.
  DeviceBuffer fused_router_counters;
  // Fast mode, steps above kMaxUnitRows tokens: the shared expert's gate, up and SiLU(g)·u rows
  // (T × shared_ffn each) between its three dense GEMMs.
  DeviceBuffer shared_gemm;
  PinnedBuffer slot_staging;
  // Steps above plan_tokens with a device table: the device plan's unit
  // count and units brought back (prefill_units_bound units at most; 0: not set up).
  int64_t prefill_units_bound = 0;
  PinnedBuffer units_staging;
  // The device planner's outputs (device_plan.cuh), for steps of up to plan_tokens tokens.
  int64_t plan_tokens = 0;
  // plan_ints: [unit count, error flag, the route-and-plan kernel's block counter]
  DeviceBuffer plan_units, plan_shared_units, plan_ints;
  // The error flag the kernels set (`*error = 1`, never read on the device): the page-locked word
  // error_readback itself through its mapped address, so that the host reads it after the step
  // with no copy behind the step's last kernel; TANDEM_OLD_ERROR_READBACK=1: plan_ints[1] and a
  // copy into error_readback at the end of each step.
  PinnedBuffer error_readback;
  int* error_word = nullptr;
  bool error_copied = false;  // TANDEM_OLD_ERROR_READBACK
  // The grid route-plan kernel's scratch (route_plan_grid.cuh) for prefill steps, zeroed at creation
  // (plan_grid_ints ints; 0: not set up, the old route-and-plan kernel and tile builder run).
  DeviceBuffer plan_grid;
  int64_t plan_grid_ints = 0;
  DeviceBuffer shared_act;  // the shared expert's SiLU(g)·u rows when it runs beside the routed experts
  // The shared expert's units of every device-planned step (unless OldSharedChain): for each layer
  // with a shared expert and each n in 1..plan_tokens, DenseExpertUnits(its matrices, n, 0), written
  // once at creation (before any graph capture; never written by a step). shared_units_at[layer ·
  // (plan_tokens + 1) + n] is the index of the first of them (-1: the layer has none).
  DeviceBuffer shared_unit_table;
  std::vector<int64_t> shared_units_at;
  // Per layer with router_and_gate: the warps per row of its E-row router's own one-row product
  // (DenseMatVecF32WarpsPerRow; 0: not the streaming kernel), forced on the (E + 1)-row product so
  // that the routing logits keep their bits.
  std::vector<int> router_wpr;
  std::optional<StreamFork> fork;  // the shared expert's side stream: starts after x, rejoined at the scatter
  SharedExpertFn shared_fn;  // SetSharedExpertFn
  std::vector<std::optional<GpuEngramLayer>> engram;  // per layer

  // The device planners' arguments for an n-token step over `table`, into this stage's unit,
  // count, error and slot buffers (routing inputs and outputs left to the caller).
  DeviceMoePlanArgs PlanArgs(int64_t n, const ExpertLocation* table) {
    DeviceMoePlanArgs a;
    a.n = static_cast<int>(n);
    a.K = static_cast<int>(config.moe.K);
    a.E = static_cast<int>(config.moe.E);
    a.table = table;
    a.units = plan_units.as<ExpertUnit>();
    a.num_units = plan_ints.as<int>();
    a.error = error_word;
    a.slot = slot.as<int32_t>();
    return a;
  }

  // PlanArgs for a kernel that also routes: it reads `logits` and writes the picks and weights into
  // the router's device outputs.
  absl::StatusOr<DeviceMoePlanArgs> RoutingPlanArgs(int64_t n, const ExpertLocation* table, const float* logits) {
    absl::StatusOr<std::pair<int32_t*, float*>> out = router->DeviceOutputs(n);
    if (!out.ok()) return out.status();
    DeviceMoePlanArgs a = PlanArgs(n, table);
    a.logits = logits;
    a.experts = a.experts_out = out->first;
    a.weights_out = out->second;
    return a;
  }

  // Routes the n tokens' logits and plans the step on the device in one kernel (route_plan.cuh):
  // picks and weights into the router's device outputs, units, count and slots into this stage's
  // buffers.
  absl::Status LaunchRouteAndPlan(int64_t n, const ExpertLocation* table, const float* logits, cudaStream_t stream) {
    absl::StatusOr<DeviceMoePlanArgs> plan = RoutingPlanArgs(n, table, logits);
    if (!plan.ok()) return plan.status();
    RoutePlanArgs rp;
    rp.plan = *plan;
    rp.counter = reinterpret_cast<unsigned*>(plan_ints.as<int>() + 2);
    TANDEM_CUDA_RETURN_IF_ERROR(LaunchRoutePlan(rp, stream));
    return absl::OkStatus();
  }

  // Whether a prefill step of n tokens takes the grid route-plan kernel (LaunchRouteAndPlanGrid).
  bool UsesRoutePlanGrid(int64_t n) const {
    const int E = static_cast<int>(config.moe.E), K = static_cast<int>(config.moe.K);
    return RoutePlanGridOn() && plan_grid_ints > 0 && RoutePlanGridFits(static_cast<int>(n), K, E) &&
           plan_grid_ints >= RoutePlanGridScratchInts(E);
  }

  // LaunchRouteAndPlan's outputs and, with tiles (a prefill runner's DeviceTilesTarget), the
  // runner's tiles, tile count and slot index, from one grid-wide kernel (route_plan_grid.cuh).
  absl::Status LaunchRouteAndPlanGrid(int64_t n, const ExpertLocation* table, const float* logits,
                                      const DevicePrefillTilesArgs* tiles, cudaStream_t stream) {
    absl::StatusOr<DeviceMoePlanArgs> plan = RoutingPlanArgs(n, table, logits);
    if (!plan.ok()) return plan.status();
    RoutePlanGridArgs rp;
    rp.plan = *plan;
    if (tiles != nullptr) rp.tiles = *tiles;
    rp.scratch = plan_grid.as<int32_t>();
    rp.scratch_ints = plan_grid_ints;
    TANDEM_CUDA_RETURN_IF_ERROR(LaunchRoutePlanGrid(rp, stream));
    return absl::OkStatus();
  }

  // How RunDevicePlanned runs a layer's n-token step: which one-token form, where the shared expert
  // and the router product go. fused_output: the caller takes the fused kernel's own output buffer
  // (Run's y_written given).
  struct DecodeForm {
    bool has_shared = false;      // the layer's shared expert runs (not ablated)
    bool gate_in_router = false;  // its gate logit is the router product's row E
    bool one_token = false;       // the one-token kernels (two, or the fused one)
    bool fused = false;           // the fused one-token kernel
    bool shared_inside = false;   // the shared expert inside it
    bool router_inside = false;   // the router product inside it (FusedRouter)
    // The fused kernel's form whose logits could come from the router's f32 rows in its grid or
    // from the caller (router_inside is this and FusedRouterInGrid; MoeStage::ReadyLogitsFor).
    bool router_rows_f32 = false;
    const DeviceMatrix* router_rows = nullptr;  // the router product's matrix: E rows, or E + 1 with the gate's
  };
  DecodeForm PlanDecodeForm(int64_t layer, int64_t n, bool fused_output) const;

  // Fills shared_unit_table, shared_units_at and router_wpr (Create, once plan_tokens is set).
  absl::Status BuildDecodeTables();

  // The device table's units of layer's shared expert for an n-token device-planned step (n in
  // 1..plan_tokens), or nullptr (none built).
  const ExpertUnit* SharedUnits(int64_t layer, int64_t n) const {
    if (n < 1 || n > plan_tokens || shared_units_at.empty()) return nullptr;
    const int64_t at = shared_units_at[static_cast<size_t>(layer * (plan_tokens + 1) + n)];
    return at < 0 ? nullptr : shared_unit_table.as<ExpertUnit>() + at;
  }

  // The gated shared expert of an n-row step of Run's planned paths on `stream`: *shared_out (n × h)
  // and *gate_out (n; nullptr without a shared gate). Both nullptr when the layer has none.
  absl::Status SharedExpert(int64_t layer, const float* x, int64_t n, bool gemm, DenseProductFn product,
                            cudaStream_t stream, const float** shared_out, const float** gate_out);

  // Run's path for prefill steps (above plan_tokens) with a device table, unless
  // TANDEM_HOST_PREFILL_PLAN: the route-and-plan kernel's units stay on the device and the routed
  // experts run from them (runner: the fast path's prefill runner, whose DevicePlannedChoice
  // holds; nullptr: the f32 unit kernels), so the layer never waits on the host unless picks is
  // set. The shared expert runs on `side` beside the routing and the routed experts where it
  // shares no buffer with them.
  absl::Status RunPrefillDevicePlanned(int64_t layer, const float* x, int64_t n, float* y,
                                       const ExpertLocation* table, ExpertPrefillRunner* runner, cudaStream_t stream,
                                       cudaStream_t side, StageTimer& timer, std::vector<int32_t>* picks,
                                       uint64_t* local_rows, DenseProductFn product, bool x_ready = false);
  // The prefill runner Run(layer, x, n, ...) with this source hands x to through
  // RunPrefillDevicePlanned, or nullptr for any other path (MmqInput, StreamedF16Input).
  const ExpertPrefillRunner* DevicePlannedRunner(int64_t layer, int64_t n, ExpertSource& source) const;
};

}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_BACKEND_MOE_STAGE_IMPL_H_
