#include "gpu_service/backends/cuda/backend/moe_stage.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <tuple>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gpu_service/backends/cuda/backend/moe_stage_impl.h"
#include "gpu_service/backends/cuda/cuda_check.h"
#include "gpu_service/backends/cuda/env_switch.h"
#include "gpu_service/backends/cuda/kernels/dense_matvec.cuh"
#include "gpu_service/backends/cuda/moe/device_plan.cuh"
#include "gpu_service/backends/cuda/moe/expert_decode.cuh"
#include "gpu_service/backends/cuda/moe/expert_decode_one.cuh"
#include "gpu_service/backends/cuda/moe/engram_host.h"
#include "gpu_service/backends/cuda/moe/expert_prefill.cuh"
#include "gpu_service/backends/cuda/moe/expert_prefill.h"
#include "gpu_service/backends/cuda/moe/experts.h"
#include "gpu_service/backends/cuda/moe/moe_scatter.cuh"
#include "gpu_service/backends/cuda/moe/route_plan.cuh"
#include "gpu_service/backends/cuda/moe/router.h"
#include "gpu_service/backends/cuda/weight_type_ids.h"

namespace tandem::cuda {
namespace {

template <typename T>
absl::StatusOr<DeviceBuffer> DeviceArray(int64_t count) {
  return DeviceBuffer::Allocate(static_cast<size_t>(std::max<int64_t>(count, 1)) * sizeof(T));
}

ProcessSwitch g_old_shared_chain{[] { return EnvSwitch("TANDEM_OLD_SHARED_CHAIN"); }};

ProcessSwitch g_old_down_join{[] { return EnvSwitch("TANDEM_OLD_DOWN_JOIN"); }};

ProcessSwitch g_one_token_int16{[] { return EnvSwitchDefaultOn("TANDEM_ONE_TOKEN_INT16"); }};

ProcessSwitch g_one_token_logit_route{[] { return EnvSwitchDefaultOn("TANDEM_ONE_TOKEN_LOGIT_ROUTE"); }};

ProcessSwitch g_one_token_early_x{[] { return EnvSwitchDefaultOn("TANDEM_ONE_TOKEN_X_EARLY"); }};

// Off by default: the chain alone gains ~0.5 us a layer (gpu_moe_bench --one-token-probe), but
// end to end it measured 0.7-1.4% slower (docs/PERF.md, eighteenth session).
ProcessSwitch g_one_token_pick_counts{[] { return EnvSwitch("TANDEM_ONE_TOKEN_PICK_COUNTS"); }};

// On by default: +2.0% batch-1 decode end to end on the 80B shapes (docs/PERF.md, twentieth session).
ProcessSwitch g_one_token_fused{[] { return EnvSwitchDefaultOn("TANDEM_ONE_TOKEN_FUSED"); }};

ProcessSwitch g_fused_shared_beside{[] { return EnvSwitch("TANDEM_FUSED_SHARED_BESIDE"); }};

// On by default: +1.0..1.2% batch-1 decode end to end in two A/Bs on two machines (docs/PERF.md,
// twenty-first session); TANDEM_FUSED_ROUTER=0 for the router's own launch.
ProcessSwitch g_fused_router_in_grid{[] { return EnvSwitchDefaultOn("TANDEM_FUSED_ROUTER"); }};

// Off by default since 2026-12-05: on the fused kernel of today warp 0 measured +0.7 .. 1.5% batch-1
// decode against the choice by slot in three A/Bs on an H100 (docs/PERF.md, fiftieth and
// fifty-first sessions); the choice by slot had won on the H200 with the kernel of the twenty-ninth
// session. TANDEM_FUSED_PICK_BY_SLOT=1 for it (scripts/device/sweep_80b.sh flips it).
ProcessSwitch g_fused_pick_warp_by_slot{[] { return EnvSwitch("TANDEM_FUSED_PICK_BY_SLOT"); }};

ProcessSwitch g_host_prefill_plan{[] { return EnvSwitch("TANDEM_HOST_PREFILL_PLAN"); }};

ProcessSwitch g_old_streamed_input{[] { return EnvSwitch("TANDEM_OLD_STREAMED_INPUT"); }};

}  // namespace

namespace moe_stage_internal {

bool OldSharedGate() {
  static const bool old = EnvSwitch("TANDEM_OLD_SHARED_GATE");
  return old;
}

}  // namespace moe_stage_internal

using moe_stage_internal::MaxPlanUnits;
using moe_stage_internal::ShapeKey;

void SetHostPrefillPlan(bool on) { g_host_prefill_plan.set(on); }
bool HostPrefillPlan() { return g_host_prefill_plan.on(); }
void SetOldStreamedInput(bool on) { g_old_streamed_input.set(on); }
bool OldStreamedInput() { return g_old_streamed_input.on(); }
void SetOldSharedChain(bool on) { g_old_shared_chain.set(on); }
bool OldSharedChain() { return g_old_shared_chain.on(); }
void SetOldDownJoin(bool on) { g_old_down_join.set(on); }
bool OldDownJoin() { return g_old_down_join.on(); }
void SetOneTokenInt16(bool on) { g_one_token_int16.set(on); }
bool OneTokenInt16() { return g_one_token_int16.on(); }
void SetOneTokenLogitRoute(bool on) { g_one_token_logit_route.set(on); }
bool OneTokenLogitRoute() { return g_one_token_logit_route.on(); }
void SetOneTokenEarlyX(bool on) { g_one_token_early_x.set(on); }
bool OneTokenEarlyX() { return g_one_token_early_x.on(); }
void SetOneTokenPickCounts(bool on) { g_one_token_pick_counts.set(on); }
bool OneTokenPickCounts() { return g_one_token_pick_counts.on(); }
void SetOneTokenFused(bool on) { g_one_token_fused.set(on); }
bool OneTokenFused() { return g_one_token_fused.on(); }
void SetFusedSharedBeside(bool on) { g_fused_shared_beside.set(on); }
bool FusedSharedBeside() { return g_fused_shared_beside.on(); }
void SetFusedRouterInGrid(bool on) { g_fused_router_in_grid.set(on); }
bool FusedRouterInGrid() { return g_fused_router_in_grid.on(); }
void SetFusedPickWarpBySlot(bool on) { g_fused_pick_warp_by_slot.set(on); }
bool FusedPickWarpBySlot() { return g_fused_pick_warp_by_slot.on(); }

absl::StatusOr<std::unique_ptr<ResidentExperts>> ResidentExperts::Create(const DeviceModel* model, int64_t experts) {
  const size_t layers = model->layers.size();
  std::vector<ExpertLocation> table(layers * static_cast<size_t>(experts));
  for (size_t l = 0; l < layers; ++l) {
    const GpuLayer& g = model->layers[l];
    if (g.gate_exps.data == nullptr) continue;  // no routed experts here: the table stays null
    for (int64_t e = 0; e < experts; ++e) {
      table[l * experts + e] = {g.gate_exps.expert(e), g.up_exps.expert(e), g.down_exps.expert(e)};
    }
  }
  absl::StatusOr<DeviceBuffer> dev = DeviceArray<ExpertLocation>(static_cast<int64_t>(table.size()));
  if (!dev.ok()) return dev.status();
  TANDEM_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(dev->get(), table.data(), table.size() * sizeof(ExpertLocation), cudaMemcpyHostToDevice));
  return std::unique_ptr<ResidentExperts>(new ResidentExperts(model, experts, *std::move(dev)));
}

std::optional<ExpertLocation> ResidentExperts::Locate(int64_t layer, int32_t expert) {
  const GpuLayer& l = model_->layers[layer];
  return ExpertLocation{l.gate_exps.expert(expert), l.up_exps.expert(expert), l.down_exps.expert(expert)};
}

const ExpertLocation* ResidentExperts::DeviceTable(int64_t layer) const {
  return table_.as<ExpertLocation>() + layer * experts_;
}

MoeStage::MoeStage(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
MoeStage::~MoeStage() = default;

absl::StatusOr<std::unique_ptr<MoeStage>> MoeStage::Create(const ModelConfig& c, const DeviceModel& model,
                                                           const MoeStageOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->config = c;
  impl->model = &model;
  impl->options = options;
  const int64_t T = options.max_tokens, h = c.h, E = c.moe.E, K = c.moe.K;
  const int64_t inner = std::max(c.expert_ffn, c.shared_ffn);
  absl::StatusOr<GpuRouter> router = GpuRouter::Create(T, E, K);
  if (!router.ok()) return router.status();
  impl->router.emplace(*std::move(router));
  // Every pair may be its own unit.
  absl::StatusOr<ExpertDecodeRunner> rr = ExpertDecodeRunner::Create(T * K);
  if (!rr.ok()) return rr.status();
  impl->routed_runner.emplace(*std::move(rr));
  absl::StatusOr<ExpertDecodeRunner> sr = ExpertDecodeRunner::Create((T + kMaxUnitRows - 1) / kMaxUnitRows);
  if (!sr.ok()) return sr.status();
  impl->shared_runner.emplace(*std::move(sr));

  struct Buf { DeviceBuffer* buf; absl::StatusOr<DeviceBuffer> made; };
  // One more float: a one-token step's (E + 1)-row router product ends with the shared gate logit.
  Buf bufs[] = {{&impl->logits, DeviceArray<float>(T * E + 1)},
                {&impl->act, DeviceArray<float>(T * std::max<int64_t>(K, 1) * inner)},
                {&impl->partial, DeviceArray<float>(T * K * h)},
                {&impl->shared, DeviceArray<float>(T * h)},
                {&impl->gate_logit, DeviceArray<float>(T)},
                {&impl->slot, DeviceArray<int32_t>(T * K)},
                {&impl->pick_counts, DeviceArray<int32_t>(K + 1)}};
  for (Buf& b : bufs) {
    if (!b.made.ok()) return b.made.status();
    *b.buf = *std::move(b.made);
  }
  TANDEM_CUDA_RETURN_IF_ERROR(cudaMemset(impl->pick_counts.get(), 0, static_cast<size_t>(K + 1) * sizeof(int32_t)));
  if (options.fast) {
    absl::StatusOr<DeviceBuffer> fused_y = DeviceArray<float>(c.n_layers * h);
    if (!fused_y.ok()) return fused_y.status();
    impl->fused_y = *std::move(fused_y);
    absl::StatusOr<DeviceBuffer> counters = DeviceArray<int32_t>(2);
    if (!counters.ok()) return counters.status();
    impl->fused_router_counters = *std::move(counters);
  }
  const bool shared_gemms =
      std::any_of(model.layers.begin(), model.layers.end(), [](const GpuLayer& l) { return SharedExpertRunsAsDenseGemms(l); });
  if (options.fast && shared_gemms && T > kMaxUnitRows) {
    absl::StatusOr<DeviceBuffer> sg = DeviceArray<float>(3 * T * c.shared_ffn);
    if (!sg.ok()) return sg.status();
    impl->shared_gemm = *std::move(sg);
  }
  absl::StatusOr<PinnedBuffer> staging = PinnedBuffer::Allocate(static_cast<size_t>(T * K) * sizeof(int32_t));
  if (!staging.ok()) return staging.status();
  impl->slot_staging = *std::move(staging);
  if (E <= kDevicePlanMaxExperts) {
    impl->plan_tokens = std::min(T, kDevicePlanMaxTokens);
    const int64_t P = impl->plan_tokens;
    if (T > P && E <= kRoutePlanMaxExperts && K <= 32) {
      impl->prefill_units_bound = MaxPlanUnits(T * K, E);
      absl::StatusOr<PinnedBuffer> us =
          PinnedBuffer::Allocate(alignof(ExpertUnit) + static_cast<size_t>(impl->prefill_units_bound) * sizeof(ExpertUnit));
      if (!us.ok()) return us.status();
      impl->units_staging = *std::move(us);
    }
    Buf plan_bufs[] = {{&impl->plan_units, DeviceArray<ExpertUnit>(std::max(P * K, impl->prefill_units_bound))},
                       {&impl->plan_shared_units, DeviceArray<ExpertUnit>((P + kMaxUnitRows - 1) / kMaxUnitRows)},
                       {&impl->plan_ints, DeviceArray<int32_t>(3)},
                       {&impl->shared_act, DeviceArray<float>(P * std::max<int64_t>(c.shared_ffn, 1))}};
    for (Buf& b : plan_bufs) {
      if (!b.made.ok()) return b.made.status();
      *b.buf = *std::move(b.made);
    }
    if (absl::Status s = impl->BuildDecodeTables(); !s.ok()) return s;
    absl::StatusOr<PinnedBuffer> readback = PinnedBuffer::Allocate(sizeof(int32_t));
    if (!readback.ok()) return readback.status();
    impl->error_readback = *std::move(readback);
    *impl->error_readback.as<int>() = 0;
    TANDEM_CUDA_RETURN_IF_ERROR(cudaMemset(impl->plan_ints.get(), 0, 3 * sizeof(int32_t)));
    impl->error_copied = EnvSwitch("TANDEM_OLD_ERROR_READBACK");
    if (impl->error_copied) {
      impl->error_word = impl->plan_ints.as<int>() + 1;
    } else {
      void* mapped = nullptr;
      TANDEM_CUDA_RETURN_IF_ERROR(cudaHostGetDevicePointer(&mapped, impl->error_readback.get(), 0));
      impl->error_word = static_cast<int*>(mapped);
    }
    if (impl->prefill_units_bound > 0 && E <= kRoutePlanGridMaxExperts) {
      // The grid route-plan kernel's scratch (route_plan_grid.cuh): zeroed once, left valid by every launch.
      const int64_t ints = RoutePlanGridScratchInts(static_cast<int>(E));
      absl::StatusOr<DeviceBuffer> pg = DeviceArray<int32_t>(ints);
      if (!pg.ok()) return pg.status();
      impl->plan_grid = *std::move(pg);
      impl->plan_grid_ints = ints;
      TANDEM_CUDA_RETURN_IF_ERROR(cudaMemset(impl->plan_grid.get(), 0, static_cast<size_t>(ints) * sizeof(int32_t)));
      // Zero before any stream's first launch reads the barrier words (non-blocking streams do not
      // wait for the legacy stream's memset).
      TANDEM_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
    }
    absl::StatusOr<StreamFork> fork = StreamFork::Create();
    if (!fork.ok()) return fork.status();
    impl->fork.emplace(*std::move(fork));
  }

  impl->engram.resize(static_cast<size_t>(c.n_layers));
  for (int64_t layer = 0; layer < c.n_layers; ++layer) {
    const GpuLayer& l = model.layers[layer];
    if (l.has_engram) {
      absl::StatusOr<GpuEngramLayer> e = GpuEngramLayer::Create(c.engram[c.engram_index(layer)], c.n_streams, h, T);
      if (!e.ok()) return e.status();
      impl->engram[layer].emplace(*std::move(e));
    }
    if (l.shared_gate.present() && l.shared_gate.type != l.shared_up.type) {
      return absl::InvalidArgumentError(absl::StrCat("layer ", layer, ": ffn_gate_shexp and ffn_up_shexp have different types (",
                                                     l.shared_gate.type, ", ", l.shared_up.type, ")"));
    }
    if (l.gate_exps.type != l.up_exps.type) {
      return absl::InvalidArgumentError(absl::StrCat("layer ", layer, ": ffn_gate_exps and ffn_up_exps have different types"));
    }
    if (!options.fast) continue;
    // The bf16 GEMM runners, one per distinct expert shape (made now: no allocation in a step).
    const ShapeKey routed{l.gate_exps.type, l.down_exps.type, c.expert_ffn};
    if (!impl->prefill.contains(routed)) {
      // Input rows are the step's tokens (< T): the bf16 copy of x needs T rows, not T·K.
      absl::StatusOr<ExpertPrefillRunner> p = ExpertPrefillRunner::Create(
          {static_cast<WeightType>(l.gate_exps.type), static_cast<WeightType>(l.down_exps.type), h, c.expert_ffn}, T * K,
          PrefillOptions{PrefillAlgorithm::kGroupedTiles, 0, T});
      if (!p.ok()) return p.status();
      impl->prefill.emplace(routed, *std::move(p));
    }
    if (l.shared_gate.present() && !SharedExpertRunsAsDenseGemms(l)) {
      const ShapeKey shared{l.shared_gate.type, l.shared_down.type, c.shared_ffn};
      if (!impl->prefill.contains(shared)) {
        absl::StatusOr<ExpertPrefillRunner> p = ExpertPrefillRunner::Create(
            {static_cast<WeightType>(l.shared_gate.type), static_cast<WeightType>(l.shared_down.type), h, c.shared_ffn},
            std::max<int64_t>(T, T * K));
        if (!p.ok()) return p.status();
        impl->prefill.emplace(shared, *std::move(p));
      }
    }
  }
  return std::unique_ptr<MoeStage>(new MoeStage(std::move(impl)));
}

absl::Status MoeStage::Impl::BuildDecodeTables() {
  const int64_t layers = static_cast<int64_t>(model->layers.size()), P = plan_tokens;
  std::vector<ExpertUnit> table;
  shared_units_at.assign(static_cast<size_t>(layers * (P + 1)), -1);
  router_wpr.assign(static_cast<size_t>(layers), 0);
  for (int64_t layer = 0; layer < layers; ++layer) {
    const GpuLayer& l = model->layers[layer];
    if (l.router_and_gate.present()) router_wpr[layer] = DenseMatVecF32WarpsPerRow(l.router);
    if (!l.shared_gate.present()) continue;
    const ExpertLocation where{l.shared_gate.data, l.shared_up.data, l.shared_down.data};
    for (int64_t n = 1; n <= P; ++n) {
      shared_units_at[static_cast<size_t>(layer * (P + 1) + n)] = static_cast<int64_t>(table.size());
      const std::vector<ExpertUnit> units = DenseExpertUnits(where, n, 0);
      table.insert(table.end(), units.begin(), units.end());
    }
  }
  if (table.empty()) return absl::OkStatus();
  absl::StatusOr<DeviceBuffer> dev = DeviceArray<ExpertUnit>(static_cast<int64_t>(table.size()));
  if (!dev.ok()) return dev.status();
  shared_unit_table = *std::move(dev);
  TANDEM_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(shared_unit_table.get(), table.data(), table.size() * sizeof(ExpertUnit), cudaMemcpyHostToDevice));
  // Complete before any step's stream reads it (a pageable copy may return before its DMA ends,
  // and non-blocking streams do not wait for the legacy stream).
  TANDEM_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  return absl::OkStatus();
}

bool SharedExpertRunsAsDenseGemms(const GpuLayer& l) {
  for (const DeviceMatrix* m : {&l.shared_gate, &l.shared_up, &l.shared_down}) {
    if (!m->present() || !DenseKernelsSupportType(m->type) || m->cols % RowLengthMultiple(m->type) != 0) return false;
  }
  return true;
}

const ExpertPrefillRunner* MoeStage::Impl::DevicePlannedRunner(int64_t layer, int64_t n, ExpertSource& source) const {
  // Run's choice of path, step by step: the device-planned prefill with its runner.
  const GpuLayer& l = model->layers[layer];
  if (n < 1 || n > options.max_tokens || n <= plan_tokens) return nullptr;
  if (!(options.fast && n > kMaxUnitRows) || prefill_units_bound <= 0 || HostPrefillPlan()) return nullptr;
  if (source.DeviceTable(layer) == nullptr) return nullptr;
  auto it = prefill.find(ShapeKey{l.gate_exps.type, l.down_exps.type, config.expert_ffn});
  return it == prefill.end() ? nullptr : &it->second;
}

std::optional<MoeStage::ReadyLogits> MoeStage::ReadyLogitsFor(int64_t layer, int64_t n, ExpertSource& source) const {
  const Impl& m = *impl_;
  if (n != 1 || n > m.plan_tokens || source.DeviceTable(layer) == nullptr) return std::nullopt;
  const Impl::DecodeForm form = m.PlanDecodeForm(layer, n, /*fused_output=*/true);
  if (!form.router_rows_f32) return std::nullopt;
  return ReadyLogits{form.router_rows, m.logits.as<float>()};
}

std::optional<MmqActivations> MoeStage::MmqInput(int64_t layer, int64_t n, ExpertSource& source) {
  const ExpertPrefillRunner* runner = impl_->DevicePlannedRunner(layer, n, source);
  if (runner == nullptr) return std::nullopt;
  return runner->MmqInputPlanes(n, n * impl_->config.moe.K, impl_->config.moe.E);
}

uint16_t* MoeStage::StreamedF16Input(int64_t layer, int64_t n, ExpertSource& source) {
  if (OldStreamedInput()) return nullptr;
  const ExpertPrefillRunner* runner = impl_->DevicePlannedRunner(layer, n, source);
  if (runner == nullptr) return nullptr;
  return runner->StreamedF16Input(n, n * impl_->config.moe.K, impl_->config.moe.E);
}

absl::Status MoeStage::Run(int64_t layer, const float* x, int64_t n, float* y, ExpertSource& source,
                           cudaStream_t stream, cudaStream_t side, StageTimer& timer, std::vector<int32_t>* picks,
                           uint64_t* local_rows, DenseProductFn product, bool x_ready,
                           PendingShared* deferred, const float** y_written, bool logits_ready) {
  Impl& m = *impl_;
  if (deferred != nullptr) *deferred = PendingShared{};  // y complete unless the one-token path says otherwise
  if (y_written != nullptr) *y_written = y;               // y unless the fused one-token kernel says otherwise
  const ModelConfig& c = m.config;
  const GpuLayer& l = m.model->layers[layer];
  const int64_t h = c.h, E = c.moe.E, K = c.moe.K;
  if (n < 1 || n > m.options.max_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("MoE stage: ", n, " tokens, capacity ", m.options.max_tokens));
  }
  const ExpertLocation* table = source.DeviceTable(layer);
  if (table != nullptr && n <= m.plan_tokens) {
    if (absl::Status s = RunDevicePlanned(layer, x, n, y, table, stream, side, timer, product, picks != nullptr,
                                         deferred, y_written, logits_ready);
        !s.ok()) {
      return s;
    }
    if (picks != nullptr) {
      TANDEM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
      picks->assign(m.router->experts(), m.router->experts() + n * K);
    }
    if (local_rows != nullptr) *local_rows += static_cast<uint64_t>(n * K);
    return absl::OkStatus();
  }
  if (logits_ready) {
    return absl::InternalError("MoE stage: logits handed in ready for a step the device planner does not run");
  }
  const bool gemm = m.options.fast && n > kMaxUnitRows;
  if (table != nullptr && m.prefill_units_bound > 0 && !HostPrefillPlan()) {
    // Planned on the device, and no host round trip: the units stay there.
    ExpertPrefillRunner* runner = nullptr;
    bool device = true;
    if (gemm) {
      auto it = m.prefill.find(ShapeKey{l.gate_exps.type, l.down_exps.type, c.expert_ffn});
      if (it == m.prefill.end()) return absl::InternalError("no prefill runner for the routed experts' shape");
      runner = &it->second;
      device = runner->DevicePlannedChoice(n * K, E).has_value();
    }
    if (device) {
      return m.RunPrefillDevicePlanned(layer, x, n, y, table, runner, stream, side, timer, picks, local_rows, product,
                                       x_ready);
    }
  }
  // 1. Routing on the GPU; the picks (or, planned on the device, the units) come back to the host.
  timer.Mark(Stage::kRoute, stream);
  float* logits = m.logits.as<float>();
  if (absl::Status s = product(l.router, x, n, logits, stream); !s.ok()) return s;
  std::optional<MoeStepPlan> host_plan;
  std::span<const ExpertUnit> units;
  if (table != nullptr && m.prefill_units_bound > 0) {
    // Every expert resident: the route-and-plan kernel plans on the device (slots written there);
    // only the units come back, for the runners that take host units. No PlanMoeStep (~0.9 ms a
    // layer at 8192 tokens on the device machine's host).
    if (absl::Status s = m.LaunchRouteAndPlan(n, table, logits, stream); !s.ok()) return s;
    const int64_t bound = MaxPlanUnits(n * K, E);
    TANDEM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(m.units_staging.get(), m.plan_ints.get(), sizeof(int),
                                                cudaMemcpyDeviceToHost, stream));
    TANDEM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(m.units_staging.as<uint8_t>() + alignof(ExpertUnit), m.plan_units.get(),
                                                static_cast<size_t>(bound) * sizeof(ExpertUnit),
                                                cudaMemcpyDeviceToHost, stream));
    if (picks != nullptr) {
      if (absl::Status s = m.router->CopyToHost(stream); !s.ok()) return s;
    }
    TANDEM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
    const int count = *m.units_staging.as<int>();
    if (count < 0 || count > bound) return absl::InternalError(absl::StrCat("device plan: ", count, " units"));
    units = std::span<const ExpertUnit>(
        reinterpret_cast<const ExpertUnit*>(m.units_staging.as<uint8_t>() + alignof(ExpertUnit)), static_cast<size_t>(count));
    if (picks != nullptr) picks->assign(m.router->experts(), m.router->experts() + n * K);
  } else {
    if (absl::Status s = m.router->RouteLogits(logits, n, stream); !s.ok()) return s;
    TANDEM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
    const std::span<const int32_t> experts(m.router->experts(), static_cast<size_t>(n * K));
    if (picks != nullptr) picks->assign(experts.begin(), experts.end());

    // 2. The step's expert work list: (device weight addresses, rows) per unit.
    absl::StatusOr<MoeStepPlan> plan =
        PlanMoeStep(experts, n, K, E, [&](int32_t e) { return source.Locate(layer, e); });
    if (!plan.ok()) return plan.status();
    if (!plan->offloaded.empty()) {
      return absl::FailedPreconditionError(absl::StrCat("layer ", layer, ": ", plan->offloaded.size(),
                                                        " routed pairs need experts that are not on the GPU, "
                                                        "and no host expert worker is attached"));
    }
    std::memcpy(m.slot_staging.get(), plan->slot.data(), plan->slot.size() * sizeof(int32_t));
    TANDEM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(m.slot.get(), m.slot_staging.get(), plan->slot.size() * sizeof(int32_t),
                                                cudaMemcpyHostToDevice, stream));
    host_plan = *std::move(plan);
    units = host_plan->units;
  }
  timer.Mark(Stage::kExperts, stream);
  if (gemm) {
    auto it = m.prefill.find(ShapeKey{l.gate_exps.type, l.down_exps.type, c.expert_ffn});
    if (it == m.prefill.end()) return absl::InternalError("no prefill runner for the routed experts' shape");
    if (absl::Status s = it->second.Run(units, x, m.partial.as<float>(), stream); !s.ok()) return s;
  } else {
    const ExpertDecodeRunner::Shape shape{static_cast<WeightType>(l.gate_exps.type),
                                          static_cast<WeightType>(l.down_exps.type), h, c.expert_ffn};
    if (absl::Status s = m.routed_runner->Run(units, shape, x, m.act.as<float>(), m.partial.as<float>(), stream);
        !s.ok()) {
      return s;
    }
  }
  if (local_rows != nullptr) *local_rows += static_cast<uint64_t>(n * K);

  // 3. The gated shared expert, then the scatter-sum in routing order.
  timer.Mark(Stage::kShared, stream);
  const float* shared = nullptr;
  const float* gate_logit = nullptr;
  if (absl::Status s = m.SharedExpert(layer, x, n, gemm, product, stream, &shared, &gate_logit); !s.ok()) return s;
  TANDEM_CUDA_RETURN_IF_ERROR(LaunchMoeScatterSum(m.partial.as<float>(), m.slot.as<int32_t>(), m.router->device_weights(),
                                                  static_cast<int>(n), static_cast<int>(K), static_cast<int>(h), shared,
                                                  gate_logit, y, stream));
  return absl::OkStatus();
}

void MoeStage::SetSharedExpertFn(SharedExpertFn fn) { impl_->shared_fn = std::move(fn); }

absl::Status MoeStage::EnqueueErrorReadback(cudaStream_t stream) {
  Impl& m = *impl_;
  if (m.plan_tokens == 0 || !m.error_copied) return absl::OkStatus();  // else the kernels write the word itself
  TANDEM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(m.error_readback.get(), m.plan_ints.as<int>() + 1, sizeof(int),
                                              cudaMemcpyDeviceToHost, stream));
  return absl::OkStatus();
}

absl::Status MoeStage::CheckDeviceErrors() {
  Impl& m = *impl_;
  if (m.plan_tokens == 0 || *m.error_readback.as<int>() == 0) return absl::OkStatus();
  return absl::InternalError(
      "the device MoE planner met a routing pick outside [0, E) or an expert without a location, or the device "
      "prefill plan a unit it could not run");
}

absl::Status MoeStage::PrepareStep(int64_t n, cudaStream_t stream, cuda::GatherRanges* ranges) {
  Impl& m = *impl_;
  m.fused_step = n == 1 && m.options.fast && OneTokenFused() && OneTokenInt16() && OneTokenLogitRoute() &&
                 m.fused_y.get() != nullptr;
  if (m.fused_step) {
    for (const DeviceBuffer* b : {&m.fused_y, &m.fused_router_counters}) {
      if (ranges != nullptr && ranges->Add(b->get(), b->bytes())) continue;
      TANDEM_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(b->get(), 0, b->bytes(), stream));
    }
  }
  return absl::OkStatus();
}

absl::Status MoeStage::RunEngram(int64_t layer, const MatrixView& embd, std::span<const int64_t> rows, float* H,
                                 int64_t n, float* conv_state, cudaStream_t stream) {
  Impl& m = *impl_;
  if (layer < 0 || layer >= static_cast<int64_t>(m.engram.size()) || !m.engram[layer].has_value()) {
    return absl::InvalidArgumentError(absl::StrCat("layer ", layer, " has no Engram"));
  }
  const GpuLayer& l = m.model->layers[layer];
  const EngramDeviceWeights w{l.engram_key,        l.engram_value,     l.engram_key_norm,
                              l.engram_query_norm, l.engram_conv_norm, l.engram_conv};
  GpuEngramLayer& e = *m.engram[layer];
  if (absl::Status s = e.Stage(embd, rows, n, stream); !s.ok()) return s;
  return e.Forward(w, H, n, m.config.eps, conv_state, stream);
}

}  // namespace tandem::cuda
