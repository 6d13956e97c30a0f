#include "gpu_service/backends/cuda/backend/moe_stage.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <tuple>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gpu_service/backends/cuda/cuda_check.h"
#include "gpu_service/backends/cuda/env_switch.h"
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

using ShapeKey = std::tuple<uint32_t, uint32_t, int64_t>;  // gate/up type, down type, inner

// The most units a plan of `pairs` (token, expert) pairs over E experts can have: per expert
// ceil(rows / kMaxUnitRows), at most pairs / kMaxUnitRows + (experts named) in all.
int64_t MaxPlanUnits(int64_t pairs, int64_t E) { return std::min(pairs, pairs / kMaxUnitRows + E); }

// TANDEM_OLD_MOE_DECODE=1 (read once, at the first MoE step) keeps one-token steps on the planned
// path (router product, plan kernel, gate/up, down, scatter-sum) instead of the two one-token
// kernels of expert_decode_one.cuh: the A/B switch for benchmarks.
bool OldMoeDecode() {
  static const bool old = EnvSwitch("TANDEM_OLD_MOE_DECODE");
  return old;
}

std::atomic<bool>& PrefillSharedSerialSwitch() {
  static std::atomic<bool> serial{EnvSwitch("TANDEM_PREFILL_SHARED_SERIAL")};
  return serial;
}

std::atomic<bool>& HostPrefillPlanSwitch() {
  static std::atomic<bool> host{EnvSwitch("TANDEM_HOST_PREFILL_PLAN")};
  return host;
}

}  // namespace

void SetHostPrefillPlan(bool on) { HostPrefillPlanSwitch().store(on, std::memory_order_relaxed); }
bool HostPrefillPlan() { return HostPrefillPlanSwitch().load(std::memory_order_relaxed); }
void SetPrefillSharedSerial(bool on) { PrefillSharedSerialSwitch().store(on, std::memory_order_relaxed); }
bool PrefillSharedSerial() { return PrefillSharedSerialSwitch().load(std::memory_order_relaxed); }

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

struct MoeStage::Impl {
  ModelConfig config;
  const DeviceModel* model = nullptr;
  MoeStageOptions options;
  std::optional<GpuRouter> router;
  std::optional<ExpertDecodeRunner> routed_runner, shared_runner;
  std::map<ShapeKey, ExpertPrefillRunner> prefill;  // fast mode: per expert shape
  DeviceBuffer logits, act, partial, shared, gate_logit, slot;
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
  PinnedBuffer error_readback;
  DeviceBuffer shared_act;  // the shared expert's SiLU(g)·u rows when it runs beside the routed experts
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
    a.error = plan_ints.as<int>() + 1;
    a.slot = slot.as<int32_t>();
    return a;
  }

  // Routes the n tokens' logits and plans the step on the device in one kernel (route_plan.cuh):
  // picks and weights into the router's device outputs, units, count and slots into this stage's
  // buffers.
  absl::Status LaunchRouteAndPlan(int64_t n, const ExpertLocation* table, const float* logits, cudaStream_t stream) {
    absl::StatusOr<std::pair<int32_t*, float*>> out = router->DeviceOutputs(n);
    if (!out.ok()) return out.status();
    RoutePlanArgs rp;
    rp.plan = PlanArgs(n, table);
    rp.plan.logits = logits;
    rp.plan.experts = rp.plan.experts_out = out->first;
    rp.plan.weights_out = out->second;
    rp.counter = reinterpret_cast<unsigned*>(plan_ints.as<int>() + 2);
    TANDEM_CUDA_RETURN_IF_ERROR(LaunchRoutePlan(rp, stream));
    return absl::OkStatus();
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
                                       uint64_t* local_rows, DenseProductFn product);
};

absl::Status MoeStage::Impl::SharedExpert(int64_t layer, const float* x, int64_t n, bool gemm, DenseProductFn product,
                                          cudaStream_t stream, const float** shared_out, const float** gate_out) {
  const ModelConfig& c = config;
  const GpuLayer& l = model->layers[layer];
  const int64_t h = c.h;
  *shared_out = nullptr;
  *gate_out = nullptr;
  if (!l.shared_gate.present()) return absl::OkStatus();
  bool shared_done = false;  // shared and the gate logit by shared_fn
  if (gemm && SharedExpertRunsAsDenseGemms(l) && shared_fn) {
    absl::StatusOr<bool> done = shared_fn(layer, x, n, shared.as<float>(), gate_logit.as<float>(), stream);
    if (!done.ok()) return done.status();
    shared_done = *done;
  }
  if (shared_done) {
    // shared (and the gate logit below) already written by the layer loop's stacked path
  } else if (gemm && SharedExpertRunsAsDenseGemms(l)) {
    // One expert over every row: three dense GEMMs (cuBLAS, the layer loop's precision) keep the
    // whole GPU busy, where the grouped expert kernel had one tile column per 128 rows.
    float* g = shared_gemm.as<float>();
    float* u = g + n * c.shared_ffn;
    float* a = u + n * c.shared_ffn;
    if (absl::Status s = product(l.shared_gate, x, n, g, stream); !s.ok()) return s;
    if (absl::Status s = product(l.shared_up, x, n, u, stream); !s.ok()) return s;
    TANDEM_CUDA_RETURN_IF_ERROR(LaunchSiluMulF32(g, u, n * c.shared_ffn, a, stream));
    if (absl::Status s = product(l.shared_down, a, n, shared.as<float>(), stream); !s.ok()) return s;
  } else {
    const std::vector<ExpertUnit> units =
        DenseExpertUnits({l.shared_gate.data, l.shared_up.data, l.shared_down.data}, n, 0);
    if (gemm) {
      auto it = prefill.find(ShapeKey{l.shared_gate.type, l.shared_down.type, c.shared_ffn});
      if (it == prefill.end()) return absl::InternalError("no prefill runner for the shared expert's shape");
      if (absl::Status s = it->second.Run(units, x, shared.as<float>(), stream); !s.ok()) return s;
    } else {
      const ExpertDecodeRunner::Shape shape{static_cast<WeightType>(l.shared_gate.type),
                                            static_cast<WeightType>(l.shared_down.type), h, c.shared_ffn};
      if (absl::Status s = shared_runner->Run(units, shape, x, act.as<float>(), shared.as<float>(), stream); !s.ok()) {
        return s;
      }
    }
  }
  *shared_out = shared.as<float>();
  if (l.shared_gate_inp.present()) {
    if (!shared_done) {
      if (absl::Status s = product(l.shared_gate_inp, x, n, gate_logit.as<float>(), stream); !s.ok()) return s;
    }
    *gate_out = gate_logit.as<float>();
  }
  return absl::OkStatus();
}

absl::Status MoeStage::Impl::RunPrefillDevicePlanned(int64_t layer, const float* x, int64_t n, float* y,
                                                     const ExpertLocation* table, ExpertPrefillRunner* runner,
                                                     cudaStream_t stream, cudaStream_t side, StageTimer& timer,
                                                     std::vector<int32_t>* picks, uint64_t* local_rows,
                                                     DenseProductFn product) {
  const ModelConfig& c = config;
  const GpuLayer& l = model->layers[layer];
  const int64_t h = c.h, E = c.moe.E, K = c.moe.K;
  const bool gemm = options.fast && n > kMaxUnitRows;
  // The shared expert beside the routed ones only in its dense-GEMM forms: they write shared,
  // gate_logit and shared_gemm, which the routed experts do not touch (the grouped forms share act
  // or a prefill runner with them). Their cuBLAS handle is used on the main stream only before the
  // fork (the router product) and after the join.
  const bool overlap = side != nullptr && l.shared_gate.present() && gemm && SharedExpertRunsAsDenseGemms(l) &&
                       !PrefillSharedSerial();
  timer.Mark(Stage::kRoute, stream);
  float* router_logits = logits.as<float>();
  if (absl::Status s = product(l.router, x, n, router_logits, stream); !s.ok()) return s;
  const float* shared_rows = nullptr;
  const float* shared_gate_logit = nullptr;
  if (overlap) {
    if (absl::Status s = fork->Fork(stream, side); !s.ok()) return s;
    if (absl::Status s = SharedExpert(layer, x, n, gemm, product, side, &shared_rows, &shared_gate_logit); !s.ok()) {
      return s;
    }
  }
  if (absl::Status s = LaunchRouteAndPlan(n, table, router_logits, stream); !s.ok()) return s;
  if (picks != nullptr) {
    if (absl::Status s = router->CopyToHost(stream); !s.ok()) return s;
  }
  timer.Mark(Stage::kExperts, stream);
  const int bound = static_cast<int>(MaxPlanUnits(n * K, E));
  int* count = plan_ints.as<int>();
  int* error = count + 1;  // read back at the end of the step (EnqueueErrorReadback)
  if (runner != nullptr) {
    if (absl::Status s = runner->RunDevicePlanned(plan_units.as<ExpertUnit>(), count, bound, static_cast<int>(n),
                                                  static_cast<int>(n * K), E, x, partial.as<float>(), error, stream);
        !s.ok()) {
      return s;
    }
  } else {
    const ExpertDecodeRunner::Shape shape{static_cast<WeightType>(l.gate_exps.type),
                                          static_cast<WeightType>(l.down_exps.type), h, c.expert_ffn};
    if (absl::Status s = routed_runner->RunPlanned(plan_units.as<ExpertUnit>(), bound, count, kMaxUnitRows, shape, x,
                                                   act.as<float>(), partial.as<float>(), stream);
        !s.ok()) {
      return s;
    }
  }
  if (local_rows != nullptr) *local_rows += static_cast<uint64_t>(n * K);
  if (overlap) {
    if (absl::Status s = fork->Join(stream, side); !s.ok()) return s;
  } else {
    timer.Mark(Stage::kShared, stream);
    if (absl::Status s = SharedExpert(layer, x, n, gemm, product, stream, &shared_rows, &shared_gate_logit); !s.ok()) {
      return s;
    }
  }
  TANDEM_CUDA_RETURN_IF_ERROR(LaunchMoeScatterSum(partial.as<float>(), slot.as<int32_t>(), router->device_weights(),
                                                  static_cast<int>(n), static_cast<int>(K), static_cast<int>(h),
                                                  shared_rows, shared_gate_logit, y, stream));
  if (picks != nullptr) {
    TANDEM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
    picks->assign(router->experts(), router->experts() + n * K);
  }
  return absl::OkStatus();
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
  Buf bufs[] = {{&impl->logits, DeviceArray<float>(T * E)},
                {&impl->act, DeviceArray<float>(T * std::max<int64_t>(K, 1) * inner)},
                {&impl->partial, DeviceArray<float>(T * K * h)},
                {&impl->shared, DeviceArray<float>(T * h)},
                {&impl->gate_logit, DeviceArray<float>(T)},
                {&impl->slot, DeviceArray<int32_t>(T * K)}};
  for (Buf& b : bufs) {
    if (!b.made.ok()) return b.made.status();
    *b.buf = *std::move(b.made);
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
    absl::StatusOr<PinnedBuffer> readback = PinnedBuffer::Allocate(sizeof(int32_t));
    if (!readback.ok()) return readback.status();
    impl->error_readback = *std::move(readback);
    TANDEM_CUDA_RETURN_IF_ERROR(cudaMemset(impl->plan_ints.get(), 0, 3 * sizeof(int32_t)));
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

bool SharedExpertRunsAsDenseGemms(const GpuLayer& l) {
  for (const DeviceMatrix* m : {&l.shared_gate, &l.shared_up, &l.shared_down}) {
    if (!m->present() || !DenseKernelsSupportType(m->type) || m->cols % RowLengthMultiple(m->type) != 0) return false;
  }
  return true;
}

absl::Status MoeStage::Run(int64_t layer, const float* x, int64_t n, float* y, ExpertSource& source,
                           cudaStream_t stream, cudaStream_t side, StageTimer& timer, std::vector<int32_t>* picks,
                           uint64_t* local_rows, DenseProductFn product) {
  Impl& m = *impl_;
  const ModelConfig& c = m.config;
  const GpuLayer& l = m.model->layers[layer];
  const int64_t h = c.h, E = c.moe.E, K = c.moe.K;
  if (n < 1 || n > m.options.max_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("MoE stage: ", n, " tokens, capacity ", m.options.max_tokens));
  }
  const ExpertLocation* table = source.DeviceTable(layer);
  if (table != nullptr && n <= m.plan_tokens) {
    if (absl::Status s = RunDevicePlanned(layer, x, n, y, table, stream, side, timer, product, picks != nullptr);
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
      return m.RunPrefillDevicePlanned(layer, x, n, y, table, runner, stream, side, timer, picks, local_rows, product);
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

absl::Status MoeStage::RunDevicePlanned(int64_t layer, const float* x, int64_t n, float* y,
                                        const ExpertLocation* table, cudaStream_t stream, cudaStream_t side,
                                        StageTimer& timer, DenseProductFn product, bool copy_picks) {
  Impl& m = *impl_;
  const ModelConfig& c = m.config;
  const GpuLayer& l = m.model->layers[layer];
  const int64_t h = c.h, E = c.moe.E, K = c.moe.K;
  // The shared expert needs only x: on the side stream (when given) it runs beside the routing and
  // the routed experts instead of after them. Its gate logit too, when that is a matrix-vector
  // product (a GEMM would share the cuBLAS handle with the main stream's router product).
  const bool has_shared = l.shared_gate.present();
  const bool overlap = side != nullptr && has_shared;
  cudaStream_t ss = overlap ? side : stream;
  const float* shared = nullptr;
  const float* gate_logit = nullptr;
  const bool gate_on_side = overlap && n <= kMaxUnitRows;
  if (has_shared) {
    if (overlap) {
      if (absl::Status s = m.fork->Fork(stream, side); !s.ok()) return s;
    }
    timer.Mark(Stage::kShared, stream);
    const ExpertLocation where{l.shared_gate.data, l.shared_up.data, l.shared_down.data};
    ExpertUnit* units = m.plan_shared_units.as<ExpertUnit>();
    TANDEM_CUDA_RETURN_IF_ERROR(LaunchDenseUnitsOnDevice(where, static_cast<int>(n), units, ss));
    const ExpertDecodeRunner::Shape shape{static_cast<WeightType>(l.shared_gate.type),
                                          static_cast<WeightType>(l.shared_down.type), h, c.shared_ffn};
    const int count = static_cast<int>((n + kMaxUnitRows - 1) / kMaxUnitRows);
    if (absl::Status s = m.shared_runner->RunPlanned(units, count, nullptr, static_cast<int>(std::min<int64_t>(n, kMaxUnitRows)),
                                                     shape, x, m.shared_act.as<float>(), m.shared.as<float>(), ss);
        !s.ok()) {
      return s;
    }
    shared = m.shared.as<float>();
    if (l.shared_gate_inp.present()) {
      if (absl::Status s = product(l.shared_gate_inp, x, n, m.gate_logit.as<float>(), gate_on_side ? ss : stream);
          !s.ok()) {
        return s;
      }
      gate_logit = m.gate_logit.as<float>();
    }
  }
  // Routing and the plan, on the GPU only: no host wait.
  timer.Mark(Stage::kRoute, stream);
  float* logits = m.logits.as<float>();
  DeviceMoePlanArgs a = m.PlanArgs(n, table);
  if (absl::Status s = product(l.router, x, n, logits, stream); !s.ok()) return s;
  // One token: routing, gate/up, down and the weighted sum in two kernels (expert_decode_one.cuh),
  // with no plan kernel and no scatter-sum; Q4_K routed experts only.
  if (n == 1 && !OldMoeDecode() && l.gate_exps.type == kTypeQ4_K && l.down_exps.type == kTypeQ4_K &&
      GetExpertKernelChoice() == ExpertKernelChoice::kDecode &&
      OneTokenMoeFits(static_cast<int>(E), static_cast<int>(K), static_cast<int>(h), static_cast<int>(c.expert_ffn))) {
    absl::StatusOr<std::pair<int32_t*, float*>> out = m.router->DeviceOutputs(1);
    if (!out.ok()) return out.status();
    OneTokenMoeArgs o;
    o.logits = logits;
    o.E = static_cast<int>(E);
    o.K = static_cast<int>(K);
    o.table = table;
    o.h = static_cast<int>(h);
    o.inner = static_cast<int>(c.expert_ffn);
    o.x = x;
    o.act = m.act.as<float>();
    o.experts_out = out->first;
    o.weights_out = out->second;
    o.error = a.error;
    o.shared = shared;
    o.shared_gate_logit = gate_logit;
    o.y = y;
    timer.Mark(Stage::kExperts, stream);
    TANDEM_CUDA_RETURN_IF_ERROR(LaunchOneTokenMoeGateUp(o, stream));
    if (overlap) {
      if (absl::Status s = m.fork->Join(stream, side); !s.ok()) return s;
    }
    TANDEM_CUDA_RETURN_IF_ERROR(LaunchOneTokenMoeDown(o, stream));
    // After the down kernel, not between the two: a copy there would cut their overlap.
    if (copy_picks) {
      if (absl::Status s = m.router->CopyToHost(stream); !s.ok()) return s;
    }
    return absl::OkStatus();
  }
  // One-token steps keep the one-warp plan kernel (LaunchPlanMoeOnDevice): measured faster in the
  // decode chain than the route-and-plan kernel with the router product inside (route_plan.cuh).
  if (RoutePlanFused() && n > 1 && E <= kRoutePlanMaxExperts && K <= 32) {
    // One kernel: routing and the plan.
    if (absl::Status s = m.LaunchRouteAndPlan(n, table, logits, stream); !s.ok()) return s;
  } else {
    // Routing and planning in one kernel (fused when the expert count allows it); the picks stay
    // on the device unless the caller asked for them.
    if (E <= kDeviceRouteMaxExperts && K <= 32) {
      absl::StatusOr<std::pair<int32_t*, float*>> out = m.router->DeviceOutputs(n);
      if (!out.ok()) return out.status();
      a.logits = logits;
      a.experts_out = out->first;
      a.weights_out = out->second;
    } else if (absl::Status s = m.router->RouteLogits(logits, n, stream, false); !s.ok()) {
      return s;
    }
    a.experts = m.router->device_experts();
    TANDEM_CUDA_RETURN_IF_ERROR(LaunchPlanMoeOnDevice(a, stream));
  }
  if (copy_picks) {
    if (absl::Status s = m.router->CopyToHost(stream); !s.ok()) return s;
  }
  timer.Mark(Stage::kExperts, stream);
  // With one token every expert has at most one row; the one-row kernels suit it.
  const int max_rows = n == 1 ? 1 : kMaxUnitRows;
  const ExpertDecodeRunner::Shape routed{static_cast<WeightType>(l.gate_exps.type),
                                         static_cast<WeightType>(l.down_exps.type), h, c.expert_ffn};
  if (absl::Status s = m.routed_runner->RunPlanned(a.units, static_cast<int>(n * K), a.num_units, max_rows, routed, x,
                                                   m.act.as<float>(), m.partial.as<float>(), stream);
      !s.ok()) {
    return s;
  }
  if (overlap) {
    if (absl::Status s = m.fork->Join(stream, side); !s.ok()) return s;
  }
  TANDEM_CUDA_RETURN_IF_ERROR(LaunchMoeScatterSum(m.partial.as<float>(), m.slot.as<int32_t>(), m.router->device_weights(),
                                                  static_cast<int>(n), static_cast<int>(K), static_cast<int>(h), shared,
                                                  gate_logit, y, stream));
  return absl::OkStatus();
}

void MoeStage::SetSharedExpertFn(SharedExpertFn fn) { impl_->shared_fn = std::move(fn); }

absl::Status MoeStage::EnqueueErrorReadback(cudaStream_t stream) {
  Impl& m = *impl_;
  if (m.plan_tokens == 0) return absl::OkStatus();
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
