// The device-planned paths of MoeStage (moe_stage.h): steps of up to plan_tokens tokens (decode,
// with the two one-token kernels at n = 1) and prefill steps over a device table, where routing,
// planning and the expert runs stay on the GPU; and the gated shared expert both kinds of step use.
#include <cstdint>
#include <cstdio>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gpu_service/backends/cuda/backend/decode_ablation.h"
#include "gpu_service/backends/cuda/backend/moe_stage.h"
#include "gpu_service/backends/cuda/backend/moe_stage_impl.h"
#include "gpu_service/backends/cuda/cuda_check.h"
#include "gpu_service/backends/cuda/kernels/dense_matvec.cuh"
#include "gpu_service/backends/cuda/moe/device_plan.cuh"
#include "gpu_service/backends/cuda/moe/expert_decode.cuh"
#include "gpu_service/backends/cuda/moe/expert_decode_fused.cuh"
#include "gpu_service/backends/cuda/moe/expert_decode_fused_probe.h"
#include "gpu_service/backends/cuda/moe/expert_decode_one.cuh"
#include "gpu_service/backends/cuda/moe/expert_prefill.cuh"
#include "gpu_service/backends/cuda/moe/expert_prefill.h"
#include "gpu_service/backends/cuda/moe/experts.h"
#include "gpu_service/backends/cuda/moe/moe_scatter.cuh"
#include "gpu_service/backends/cuda/moe/route_plan.cuh"
#include "gpu_service/backends/cuda/moe/router.h"
#include "gpu_service/backends/cuda/step_probe.h"
#include "gpu_service/backends/cuda/weight_type_ids.h"

namespace tandem::cuda {

using moe_stage_internal::MaxPlanUnits;
using moe_stage_internal::OldSharedGate;

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
                                                     DenseProductFn product, bool x_ready) {
  const ModelConfig& c = config;
  const GpuLayer& l = model->layers[layer];
  const int64_t h = c.h, E = c.moe.E, K = c.moe.K;
  const bool gemm = options.fast && n > kMaxUnitRows;
  // The shared expert beside the routed ones only in its dense-GEMM forms: they write shared,
  // gate_logit and shared_gemm, which the routed experts do not touch (the grouped forms share act
  // or a prefill runner with them). Their cuBLAS handle is used on the main stream only before the
  // fork (the router product) and after the join.
  const bool overlap = side != nullptr && l.shared_gate.present() && gemm && SharedExpertRunsAsDenseGemms(l);
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
  const int bound = static_cast<int>(MaxPlanUnits(n * K, E));
  int* count = plan_ints.as<int>();
  int* error = error_word;  // read by the host after the step (CheckDeviceErrors)
  // The grid route-plan kernel (unless TANDEM_OLD_PREFILL_PLAN): routing, plan and, for the
  // runner, its tiles and slot index in one launch; else the route-and-plan kernel here and the
  // runner's tile builder in RunDevicePlanned.
  bool grid = UsesRoutePlanGrid(n);
  if (grid) {
    DevicePrefillTilesArgs target;
    if (runner != nullptr) {
      if (absl::Status s = runner->DeviceTilesTarget(bound, static_cast<int>(n), static_cast<int>(n * K), E, error,
                                                     &target);
          !s.ok()) {
        return s;
      }
    }
    if (absl::Status s = LaunchRouteAndPlanGrid(n, table, router_logits, runner != nullptr ? &target : nullptr, stream);
        !s.ok()) {
      // A launch the runtime refused (the cooperative grid did not fit, e.g. beside another
      // process): the old kernels from now on, said once. (A sticky error fails them as well.)
      (void)cudaGetLastError();
      fprintf(stderr, "MoE stage: grid route-plan kernel refused (%s); the old route-and-plan kernels from now on\n",
              s.ToString().c_str());
      plan_grid_ints = 0;
      grid = false;
    }
  }
  if (!grid) {
    if (absl::Status s = LaunchRouteAndPlan(n, table, router_logits, stream); !s.ok()) return s;
  }
  if (picks != nullptr) {
    if (absl::Status s = router->CopyToHost(stream); !s.ok()) return s;
  }
  timer.Mark(Stage::kExperts, stream);
  if (runner != nullptr) {
    const absl::Status s =
        grid ? runner->RunDeviceTiles(bound, static_cast<int>(n), static_cast<int>(n * K), E, x, partial.as<float>(),
                                      stream, x_ready)
             : runner->RunDevicePlanned(plan_units.as<ExpertUnit>(), count, bound, static_cast<int>(n),
                                        static_cast<int>(n * K), E, x, partial.as<float>(), error, stream, x_ready);
    if (!s.ok()) return s;
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

MoeStage::Impl::DecodeForm MoeStage::Impl::PlanDecodeForm(int64_t layer, int64_t n, bool fused_output) const {
  const ModelConfig& c = config;
  const GpuLayer& l = model->layers[layer];
  const int64_t h = c.h, E = c.moe.E, K = c.moe.K;
  DecodeForm f;
  // The shared expert needs only x: on the side stream (when given) it runs beside the routing and
  // the routed experts instead of after them. Its gate logit too, when that is a matrix-vector
  // product (a GEMM would share the cuBLAS handle with the main stream's router product).
  f.has_shared = l.shared_gate.present() && !Ablated(Ablate::kShared, n);  // decode_ablation.h
  // Unless TANDEM_OLD_SHARED_CHAIN: the side chain is the shared expert's two kernels alone. Its
  // units come from the table built at creation (no unit kernel), and at one token its gate logit
  // is the last row of one (E + 1)-row router product on the main stream (router_and_gate): one
  // launch instead of two, and one fewer on the side chain that the down kernel waits for. (More
  // tokens keep the E-row router: their logits are n rows of E, which the routing kernels read.)
  f.gate_in_router = !OldSharedChain() && !OldSharedGate() && n == 1 && f.has_shared &&
                     l.shared_gate_inp.present() && l.router_and_gate.present() && l.router_and_gate.rows == E + 1;
  // One token: routing, gate/up, down and the weighted sum in two kernels (expert_decode_one.cuh) or
  // the fused one, with no plan kernel and no scatter-sum; Q4_K routed experts only (other types and
  // shapes take the planned path).
  f.one_token = n == 1 && l.gate_exps.type == kTypeQ4_K && l.down_exps.type == kTypeQ4_K &&
                GetExpertKernelChoice() == ExpertKernelChoice::kDecode &&
                OneTokenMoeFits(static_cast<int>(E), static_cast<int>(K), static_cast<int>(h),
                                static_cast<int>(c.expert_ffn));
  // The fused one-token kernel (OneTokenFused, after PrepareStep zeroed this step's buffers): one
  // launch for the routed experts that adds into the layer's own buffer, which the caller then
  // reads, with the shared expert inside it when the kernel takes its shape and type (Q8_0) and its
  // gate logit comes from the router product: then no side chain, fork or join at all. A shared
  // expert it cannot take keeps the layer on the two kernels (beside the fused kernel's clusters the
  // side chain measured slower than either, PERF.md), unless FusedSharedBeside asks for that.
  const bool fused_shape = f.one_token && fused_step && fused_output &&
                           static_cast<size_t>(layer + 1) * static_cast<size_t>(h) * sizeof(float) <= fused_y.bytes() &&
                           OneTokenFusedFits(static_cast<int>(E), static_cast<int>(K), static_cast<int>(h),
                                             static_cast<int>(c.expert_ffn));
  const bool shared_fits_inside = f.has_shared && l.shared_gate.type == kTypeQ8_0 && l.shared_up.type == kTypeQ8_0 &&
                                  l.shared_down.type == kTypeQ8_0 &&
                                  OneTokenFusedTakesShared(static_cast<int>(h), static_cast<int>(c.shared_ffn)) &&
                                  (f.gate_in_router || !l.shared_gate_inp.present());
  f.fused = fused_shape && (!f.has_shared || shared_fits_inside || FusedSharedBeside());
  f.shared_inside = f.fused && shared_fits_inside && !FusedSharedBeside();
  // FusedRouterInGrid: the router product's rows (f32; E, or E + 1 with the shared gate's row) in
  // the fused kernel's grid instead of a launch before it, when the shared expert is inside or
  // there is none.
  f.router_rows = f.gate_in_router ? &l.router_and_gate : &l.router;
  const DeviceMatrix& router_rows = *f.router_rows;
  f.router_rows_f32 = f.fused && (!f.has_shared || f.shared_inside) && !Ablated(Ablate::kRouter, n) &&
                      router_rows.type == kTypeF32 && router_rows.cols == h && router_rows.row_bytes == h * 4 &&
                      h % 128 == 0 && (router_rows.rows == E || (f.gate_in_router && router_rows.rows == E + 1));
  f.router_inside = f.router_rows_f32 && FusedRouterInGrid();
  return f;
}

absl::Status MoeStage::RunDevicePlanned(int64_t layer, const float* x, int64_t n, float* y,
                                        const ExpertLocation* table, cudaStream_t stream, cudaStream_t side,
                                        StageTimer& timer, DenseProductFn product, bool copy_picks,
                                        PendingShared* deferred, const float** y_written, bool logits_ready) {
  Impl& m = *impl_;
  const ModelConfig& c = m.config;
  const GpuLayer& l = m.model->layers[layer];
  const int64_t h = c.h, E = c.moe.E, K = c.moe.K;
  const Impl::DecodeForm form = m.PlanDecodeForm(layer, n, y_written != nullptr);
  if (logits_ready && !form.router_rows_f32) {
    return absl::InternalError("MoE stage: logits handed in ready for a layer the fused kernel does not route");
  }
  const bool has_shared = form.has_shared, gate_in_router = form.gate_in_router, one_token = form.one_token;
  const bool fused = form.fused, shared_inside = form.shared_inside;
  const bool router_inside = form.router_inside && !logits_ready;
  const DeviceMatrix& router_rows = *form.router_rows;
  const bool overlap = side != nullptr && has_shared && !shared_inside;
  cudaStream_t ss = overlap ? side : stream;
  const float* shared = nullptr;
  const float* gate_logit = nullptr;
  const bool gate_on_side = overlap && n <= kMaxUnitRows;
  float* logits = m.logits.as<float>();
  if (gate_in_router) gate_logit = logits + E;  // written by the router product below
  if (has_shared && !shared_inside) {
    if (overlap) {
      if (absl::Status s = m.fork->Fork(stream, side); !s.ok()) return s;
    }
    timer.Mark(Stage::kShared, stream);
    const ExpertUnit* units = OldSharedChain() ? nullptr : m.SharedUnits(layer, n);
    if (units == nullptr) {
      const ExpertLocation where{l.shared_gate.data, l.shared_up.data, l.shared_down.data};
      ExpertUnit* written = m.plan_shared_units.as<ExpertUnit>();
      TANDEM_CUDA_RETURN_IF_ERROR(LaunchDenseUnitsOnDevice(where, static_cast<int>(n), written, ss));
      units = written;
    }
    const ExpertDecodeRunner::Shape shape{static_cast<WeightType>(l.shared_gate.type),
                                          static_cast<WeightType>(l.shared_down.type), h, c.shared_ffn};
    const int count = static_cast<int>((n + kMaxUnitRows - 1) / kMaxUnitRows);
    if (absl::Status s = m.shared_runner->RunPlanned(units, count, nullptr, static_cast<int>(std::min<int64_t>(n, kMaxUnitRows)),
                                                     shape, x, m.shared_act.as<float>(), m.shared.as<float>(), ss);
        !s.ok()) {
      return s;
    }
    shared = m.shared.as<float>();
    if (!gate_in_router && l.shared_gate_inp.present()) {
      if (absl::Status s = product(l.shared_gate_inp, x, n, m.gate_logit.as<float>(), gate_on_side ? ss : stream);
          !s.ok()) {
        return s;
      }
      gate_logit = m.gate_logit.as<float>();
    }
  }
  // Routing and the plan, on the GPU only: no host wait.
  timer.Mark(Stage::kRoute, stream);
  DeviceMoePlanArgs a = m.PlanArgs(n, table);
  if (Ablated(Ablate::kRouter, n)) {
    // decode_ablation.h: timing only.
  } else if (logits_ready) {
    // The caller's launch just before wrote them (ReadyLogitsFor).
  } else if (router_inside) {
    // In the fused kernel's grid (below).
  } else if (gate_in_router) {
    // The layer loop's one-row product (LaunchDenseMatVec, kAuto) over E + 1 rows, split as the
    // E-row router's own launch is (router_wpr): the routing logits keep their bits whatever split
    // the taller matrix would get.
    MatVecOptions mv;
    mv.warps_per_row = m.router_wpr[static_cast<size_t>(layer)];
    TANDEM_CUDA_RETURN_IF_ERROR(LaunchDenseMatVec(l.router_and_gate, x, h, 1, logits, E + 1, mv, stream));
  } else if (absl::Status s = product(l.router, x, n, logits, stream); !s.ok()) {
    return s;
  }
  if (one_token) {
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
    // Unless TANDEM_OLD_DOWN_JOIN: the shared term goes to y's consumer (Run's `deferred`), so the
    // down kernel reads nothing of the side chain and follows the gate/up kernel directly: it
    // routes and starts the copies of its rows (before its PDL wait) while gate/up runs, instead of
    // after the shared expert's last kernel. The side stream is joined after it (the consumer
    // reads shared and, at !gate_in_router, the side chain's gate logit).
    const bool defer = deferred != nullptr && shared != nullptr && !OldDownJoin();
    o.shared = defer ? nullptr : shared;
    o.shared_gate_logit = defer ? nullptr : gate_logit;
    o.y = y;
    o.int16_activations = m.options.fast && OneTokenInt16();  // fast mode only: exact keeps f32 products
    o.logit_route = m.options.fast && OneTokenLogitRoute();    // exact keeps the planned path's bits
    // x was written before the router product just launched (the stream norm, or earlier); with
    // ready logits the norm that wrote x is the launch just before.
    o.x_written_earlier = OneTokenEarlyX() && !logits_ready;
    o.pick_counts = OneTokenPickCounts() ? m.pick_counts.as<int32_t>() : nullptr;
    timer.Mark(Stage::kExperts, stream);
    if (fused) {  // PrepareStep took int16 products and logit routing for this step
      o.y = m.fused_y.as<float>() + layer * h;
      o.pick_counts = nullptr;
      o.pick_warp_by_slot = FusedPickWarpBySlot();
      // Without `defer` the kernel reads the side chain's shared term: join first.
      if (overlap && !defer) {
        if (absl::Status s = m.fork->Join(stream, side); !s.ok()) return s;
      }
      FusedSharedExpert inside;
      if (shared_inside) {
        inside = FusedSharedExpert{l.shared_gate.data, l.shared_up.data, l.shared_down.data,
                                   static_cast<int>(c.shared_ffn)};
        o.shared = nullptr;
        o.shared_gate_logit = gate_logit;
      }
      FusedRouter router;
      if (router_inside) {
        router = FusedRouter{static_cast<const float*>(router_rows.data), static_cast<int>(router_rows.rows), logits,
                             m.fused_router_counters.as<int32_t>()};
        o.x_written_earlier = false;  // the stream norm is now the launch just before
      }
      // A benchmark's in-step probe (expert_decode_fused_probe.h), where its instantiation takes E.
      const auto launch = ProbeDecodeStep() && OneTokenFusedProbeTakes(o.E) ? LaunchOneTokenMoeFusedArmedProbe
                                                                                  : LaunchOneTokenMoeFused;
      TANDEM_CUDA_RETURN_IF_ERROR(
          launch(o, shared_inside ? &inside : nullptr, stream, router_inside ? &router : nullptr));
      *y_written = o.y;
    } else {
      TANDEM_CUDA_RETURN_IF_ERROR(LaunchOneTokenMoeGateUp(o, stream));
      if (overlap && !defer) {
        if (absl::Status s = m.fork->Join(stream, side); !s.ok()) return s;
      }
      if (const cudaError_t err = LaunchOneTokenMoeDown(o, stream); err != cudaSuccess) {
        // The gate/up blocks will count; no down kernel zeroes the counts: do it after them.
        if (o.pick_counts != nullptr) (void)cudaMemsetAsync(o.pick_counts, 0, static_cast<size_t>(K + 1) * sizeof(int32_t), stream);
        return CudaStatus(err, "LaunchOneTokenMoeDown(o, stream)", __FILE__, __LINE__);
      }
    }
    if (overlap && defer) {
      if (absl::Status s = m.fork->Join(stream, side); !s.ok()) return s;
    }
    if (defer) *deferred = PendingShared{shared, gate_logit};
    // After the down kernel, not between the two: a copy there would cut their overlap.
    if (copy_picks) {
      if (absl::Status s = m.router->CopyToHost(stream); !s.ok()) return s;
    }
    return absl::OkStatus();
  }
  // One-token steps keep the one-warp plan kernel (LaunchPlanMoeOnDevice): measured faster in the
  // decode chain than the route-and-plan kernel with the router product inside (route_plan.cuh).
  // It also takes the shapes the route-and-plan kernel refuses.
  if (n > 1 && E <= kRoutePlanMaxExperts && K <= 32) {
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

}  // namespace tandem::cuda
