// gpu_moe_bench's routing and one-token MoE chain timings (BenchRouting, BenchOneToken; its main
// calls them). Not a test.
#include <cuda_runtime.h>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <optional>
#include <span>
#include <cstdio>
#include <random>
#include <set>
#include <string>
#include <vector>
#include "gpu_service/backends/cuda/kernels/dense_matvec.cuh"
#include "gpu_service/backends/cuda/kernels/gemm_plan.h"
#include "gpu_service/backends/cuda/moe/device_plan.cuh"
#include "gpu_service/backends/cuda/moe/expert_decode.cuh"
#include "gpu_service/backends/cuda/moe/expert_decode_one.cuh"
#include "gpu_service/backends/cuda/pdl.cuh"
#include "gpu_service/backends/cuda/moe/expert_prefill.h"
#include "gpu_service/backends/cuda/moe/experts.h"
#include "gpu_service/backends/cuda/moe/matvec.cuh"
#include "gpu_service/backends/cuda/moe/moe_scatter.cuh"
#include "gpu_service/backends/cuda/moe/route_plan.cuh"
#include "gpu_service/backends/cuda/moe/router.cuh"
#include "gpu_service/backends/cuda/weight_type_ids.h"
#include "tests/gpu/bench_util.h"
#include "tests/gpu_moe/moe_bench_util.h"

namespace tandem::cuda::moe_bench {

// Routing and planning of one MoE layer on the 80B shapes (f32 router 512 × 2048, K 10), old and
// new in one process. Old: the backend's router product (dense matvec up to kMatVecMaxRows tokens,
// else the prepared near-f32 GEMM), then up to kDevicePlanMaxTokens tokens LaunchPlanMoeOnDevice
// (fused routing), above it the route kernel, the picks to the host and PlanMoeStep there (one
// wait). New: the same product, then LaunchRoutePlan, every size on the device. Decode sizes:
// graph-replayed,
// 48 layers' routers in turn (192 MB: not L2-resident, as in a decode step without prefetch) and
// one router again and again (L2-warm). Prefill sizes: eager, to the end of the host plan.
void BenchRouting(const float* x, std::mt19937& rng) {
  const int layers = 48;
  const int64_t router_bytes = kE * kH * sizeof(float);
  std::vector<float*> routers(layers);
  std::vector<DeviceMatrix> mats(layers);
  std::normal_distribution<float> nd(0.0f, 0.03f);
  std::vector<float> host(kE * kH);
  for (float& v : host) v = nd(rng);
  for (int l = 0; l < layers; ++l) {
    BENCH_CHECK(cudaMalloc(&routers[l], router_bytes));
    BENCH_CHECK(cudaMemcpy(routers[l], host.data(), router_bytes, cudaMemcpyHostToDevice));
    mats[l] = DeviceMatrix{kTypeF32, routers[l], kH, kE, kH * static_cast<int64_t>(sizeof(float))};
  }
  DenseGemmOptions go;
  go.split_f8 = false;  // the three f16 products: these rows are the historical split baseline
  go.mode = GemmMode::kFastSplit;
  absl::StatusOr<std::unique_ptr<DenseGemm>> gemm = DenseGemm::Create(go);
  BENCH_OK(gemm.status());
  for (const DeviceMatrix& m : mats) BENCH_OK((*gemm)->Prepare(m, GemmMode::kFastSplit));
  const int64_t max_n = 8192;
  float *logits, *weights;
  int32_t *experts, *slot;
  ExpertUnit *units, *shared_units;
  ExpertLocation* table;
  int* ints;
  BENCH_CHECK(cudaMalloc(&logits, max_n * kE * sizeof(float)));
  BENCH_CHECK(cudaMalloc(&weights, max_n * kK * sizeof(float)));
  BENCH_CHECK(cudaMalloc(&experts, max_n * kK * sizeof(int32_t)));
  BENCH_CHECK(cudaMalloc(&slot, max_n * kK * sizeof(int32_t)));
  BENCH_CHECK(cudaMalloc(&units, max_n * kK * sizeof(ExpertUnit)));
  BENCH_CHECK(cudaMalloc(&shared_units, (max_n / kMaxUnitRows + 1) * sizeof(ExpertUnit)));
  BENCH_CHECK(cudaMalloc(&ints, 3 * sizeof(int)));
  BENCH_CHECK(cudaMemset(ints, 0, 3 * sizeof(int)));
  std::vector<ExpertLocation> htable(kE);
  for (int64_t e = 0; e < kE; ++e) {
    const uintptr_t base = 0x100000 + static_cast<uintptr_t>(e) * 0x3000;
    htable[e] = {reinterpret_cast<const void*>(base), reinterpret_cast<const void*>(base + 0x1000),
                 reinterpret_cast<const void*>(base + 0x2000)};
  }
  BENCH_CHECK(cudaMalloc(&table, kE * sizeof(ExpertLocation)));
  BENCH_CHECK(cudaMemcpy(table, htable.data(), kE * sizeof(ExpertLocation), cudaMemcpyHostToDevice));
  int32_t* host_picks = nullptr;
  BENCH_CHECK(cudaMallocHost(&host_picks, max_n * kK * sizeof(int32_t)));
  int layer = 0;
  auto product = [&](int64_t n, cudaStream_t s) {
    const DeviceMatrix& m = mats[layer];
    if (n <= kMatVecMaxRows) {
      BENCH_CHECK(LaunchDenseMatVec(m, x, kH, static_cast<int>(n), logits, kE, s));
    } else {
      BENCH_OK((*gemm)->Run(m, x, n, logits, s, GemmMode::kFastSplit));
    }
  };
  auto plan_args = [&](int64_t n) {
    DeviceMoePlanArgs a;
    a.n = static_cast<int>(n);
    a.K = kK;
    a.E = kE;
    a.table = table;
    a.shared = htable[7];
    a.shared_units = shared_units;
    a.units = units;
    a.num_units = ints;
    a.error = ints + 1;
    a.slot = slot;
    a.logits = logits;
    a.experts = a.experts_out = experts;
    a.weights_out = weights;
    return a;
  };
  auto old_path = [&](int64_t n) {
    cudaStream_t s = bench::LaunchStream();
    product(n, s);
    BENCH_CHECK(LaunchPlanMoeOnDevice(plan_args(n), s));
  };
  auto new_path = [&](int64_t n) {
    cudaStream_t s = bench::LaunchStream();
    RoutePlanArgs a;
    a.plan = plan_args(n);
    a.counter = reinterpret_cast<unsigned*>(ints + 2);
    product(n, s);
    BENCH_CHECK(LaunchRoutePlan(a, s));
  };
  const char* labels[] = {"old product+plan", "new product+route-plan"};
  for (int64_t n : {1, 2, 3, 4, 8, 32, 64}) {
    for (int variant = 0; variant < 2; ++variant) {
      auto fn = [&, variant] {
        if (variant == 0) {
          old_path(n);
        } else {
          new_path(n);
        }
      };
      layer = 0;
      fn();
      BENCH_CHECK(cudaDeviceSynchronize());
      // Cold: 48 routers in turn; warm: one router.
      const double cold = bench::GraphUs([&] { fn(); layer = (layer + 1) % layers; }, layers);
      layer = 0;
      const double warm = bench::GraphUs([&] { fn(); }, layers);
      layer = 0;
      SetPdlEnabled(false);
      const double cold_nopdl = bench::GraphUs([&] { fn(); layer = (layer + 1) % layers; }, layers);
      SetPdlEnabled(true);
      layer = 0;
      std::printf("routing+plan E=512 K=10 h=2048 n=%-5lld %s: %7.2f us/layer (48 routers, graph), %7.2f (one router, L2-warm), %7.2f (48 routers, PDL off)\n",
                  static_cast<long long>(n), labels[variant], cold, warm, cold_nopdl);
      const char* keys[] = {"old", "new"};
      bench::Report(std::string("routing_") + keys[variant] + "_n" + std::to_string(n), cold, "us",
                    "router product + plan per layer, graph, 48 routers");
    }
    layer = 0;
    const double product_us = bench::GraphUs([&] { product(n, bench::LaunchStream()); layer = (layer + 1) % layers; }, layers);
    layer = 0;
    std::printf("  router product alone n=%lld: %7.2f us (48 routers, graph); floor %.2f us (4.19 MB at 4.5 TB/s)\n",
                static_cast<long long>(n), product_us, router_bytes / 4.5e12 * 1e6);
  }
  // Prefill sizes: the old host plan (route kernel, picks to the host, PlanMoeStep) against the device plan.
  for (int64_t n : {512, 8192}) {
    layer = 0;
    const double product_ms = bench::TimeMs([&] { product(n, nullptr); }, 10, 2);
    const double old_ms = bench::TimeMs([&] {
      product(n, nullptr);
      BENCH_CHECK(LaunchRouteTopK(logits, static_cast<int>(n), kE, kK, experts, weights, nullptr));
      BENCH_CHECK(cudaMemcpyAsync(host_picks, experts, n * kK * sizeof(int32_t), cudaMemcpyDeviceToHost, nullptr));
      BENCH_CHECK(cudaStreamSynchronize(nullptr));
      absl::StatusOr<MoeStepPlan> plan = PlanMoeStep(std::span<const int32_t>(host_picks, n * kK), n, kK, kE,
                                                     [&](int32_t e) { return std::optional<ExpertLocation>(htable[e]); });
      BENCH_OK(plan.status());
    }, 10, 2);
    const double new_ms = bench::TimeMs([&] {
      new_path(n);
      BENCH_CHECK(cudaStreamSynchronize(nullptr));
    }, 10, 2);
    // The host planner alone on the last picks.
    const auto h0 = std::chrono::steady_clock::now();
    for (int rep = 0; rep < 10; ++rep) {
      absl::StatusOr<MoeStepPlan> plan = PlanMoeStep(std::span<const int32_t>(host_picks, n * kK), n, kK, kE,
                                                     [&](int32_t e) { return std::optional<ExpertLocation>(htable[e]); });
      BENCH_OK(plan.status());
    }
    const double host_plan_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - h0).count() / 10;
    std::printf("routing+plan n=%lld: product %.3f ms; old (route kernel, host plan) %.3f ms, of which PlanMoeStep on "
                "the host %.3f ms; new (device plan) %.3f ms; product floor %.3f ms (near-f32: 3 x %.1f GFLOP at 800 "
                "TFLOP/s)\n",
                static_cast<long long>(n), product_ms, old_ms, host_plan_ms, new_ms,
                3.0 * 2.0 * n * kE * kH / 800e12 * 1e3, 2.0 * n * kE * kH / 1e9);
    bench::Report("routing_prefill_old_n" + std::to_string(n), old_ms * 1e3, "us", "product + route + host plan");
    bench::Report("routing_prefill_new_n" + std::to_string(n), new_ms * 1e3, "us", "product + device route-plan");
  }
  for (float* r : routers) BENCH_CHECK(cudaFree(r));
  for (void* p : std::initializer_list<void*>{logits, weights, experts, slot, units, shared_units, table, ints}) {
    BENCH_CHECK(cudaFree(p));
  }
  BENCH_CHECK(cudaFreeHost(host_picks));
}

// The one-token MoE chain (batch-1 decode) on the 80B shapes, old and new in one process, each
// step captured into a CUDA graph of 48 steps (the layer loop) and replayed. Old: the f32 router
// product, the one-warp plan kernel (fused routing), gate/up and down over the planned units (the
// tile kernels), the scatter-sum with the gated shared expert. New: the same router product, then
// the two kernels of expert_decode_one.cuh. Step i uses router i % 24 (24 × 4.2 MB: not
// L2-resident) and x row i, so every step routes to fresh experts of the 906 MB layer. The shared
// expert's row and gate logit are fixed buffers (the backend computes them on the side stream).
void BenchOneToken(const float* x, std::mt19937& rng) {
  const int routers = 24, steps = 48;
  const Layer layer = RandomLayer(kTypeQ4_K, kTypeQ4_K, rng);
  ExpertLocation* table = UploadTable(layer);
  const int64_t router_bytes = kE * kH * sizeof(float);
  std::vector<float*> mats(routers);
  {
    std::normal_distribution<float> nd(0.0f, 0.03f);
    std::vector<float> host(kE * kH);
    for (float*& m : mats) {
      for (float& v : host) v = nd(rng);
      BENCH_CHECK(cudaMalloc(&m, router_bytes));
      BENCH_CHECK(cudaMemcpy(m, host.data(), router_bytes, cudaMemcpyHostToDevice));
    }
  }
  float *logits, *act, *partial, *shared, *gate_logit, *y_old, *y_new;
  int32_t *picks, *slot;
  ExpertUnit* units;
  int* ints;
  BENCH_CHECK(cudaMalloc(&logits, kE * sizeof(float)));
  BENCH_CHECK(cudaMalloc(&act, kK * kI * sizeof(float)));
  BENCH_CHECK(cudaMalloc(&partial, kK * kH * sizeof(float)));
  BENCH_CHECK(cudaMalloc(&shared, kH * sizeof(float)));
  BENCH_CHECK(cudaMalloc(&gate_logit, sizeof(float)));
  BENCH_CHECK(cudaMalloc(&y_old, kH * sizeof(float)));
  BENCH_CHECK(cudaMalloc(&y_new, kH * sizeof(float)));
  BENCH_CHECK(cudaMalloc(&picks, 2 * kK * sizeof(int32_t)));
  BENCH_CHECK(cudaMalloc(&slot, kK * sizeof(int32_t)));
  BENCH_CHECK(cudaMalloc(&units, kK * sizeof(ExpertUnit)));
  BENCH_CHECK(cudaMalloc(&ints, 4 * sizeof(int)));
  BENCH_CHECK(cudaMemset(ints, 0, 4 * sizeof(int)));
  BENCH_CHECK(cudaMemcpy(shared, x + kH, kH * sizeof(float), cudaMemcpyDeviceToDevice));
  BENCH_CHECK(cudaMemcpy(gate_logit, x + 2 * kH, sizeof(float), cudaMemcpyDeviceToDevice));
  absl::StatusOr<ExpertDecodeRunner> runner = ExpertDecodeRunner::Create(kK);
  BENCH_OK(runner.status());
  int step = 0;
  auto product = [&](cudaStream_t s) {
    BENCH_CHECK(LaunchDenseMatVec(DeviceMatrix{kTypeF32, mats[step % routers], kH, kE, kH * 4}, x + (step % 4096) * kH,
                                  kH, 1, logits, kE, s));
  };
  auto old_chain = [&](bool with_product) {
    cudaStream_t s = bench::LaunchStream();
    if (with_product) product(s);
    DeviceMoePlanArgs a;
    a.n = 1;
    a.K = kK;
    a.E = kE;
    a.table = table;
    a.units = units;
    a.num_units = ints;
    a.error = ints + 1;
    a.slot = slot;
    a.logits = logits;
    a.experts = a.experts_out = picks;
    a.weights_out = reinterpret_cast<float*>(picks + kK);
    BENCH_CHECK(LaunchPlanMoeOnDevice(a, s));
    BENCH_OK(runner->RunPlanned(units, kK, ints, 1, {WeightType::kQ4_K, WeightType::kQ4_K, kH, kI}, x + (step % 4096) * kH,
                                act, partial, s));
    BENCH_CHECK(LaunchMoeScatterSum(partial, slot, a.weights_out, 1, kK, kH, shared, gate_logit, y_old, s));
    ++step;
  };
  auto new_chain = [&](bool with_product) {
    cudaStream_t s = bench::LaunchStream();
    if (with_product) product(s);
    const OneTokenMoeArgs o =
        OneTokenBenchArgs(logits, table, x + (step % 4096) * kH, act, picks, ints, shared, gate_logit, y_new);
    BENCH_CHECK(LaunchOneTokenMoeGateUp(o, s));
    BENCH_CHECK(LaunchOneTokenMoeDown(o, s));
    ++step;
  };
  // The same step both ways: y must agree (same dot products, same summation order).
  step = 5;
  old_chain(true);
  step = 5;
  new_chain(true);
  BENCH_CHECK(cudaDeviceSynchronize());
  {
    std::vector<float> a(kH), b(kH);
    BENCH_CHECK(cudaMemcpy(a.data(), y_old, kH * sizeof(float), cudaMemcpyDeviceToHost));
    BENCH_CHECK(cudaMemcpy(b.data(), y_new, kH * sizeof(float), cudaMemcpyDeviceToHost));
    double num = 0, den = 0;
    for (int64_t j = 0; j < kH; ++j) {
      num += (static_cast<double>(a[j]) - b[j]) * (static_cast<double>(a[j]) - b[j]);
      den += static_cast<double>(a[j]) * a[j];
    }
    std::printf("one-token chain: new vs old y relative L2 %.3e%s\n", std::sqrt(num / std::max(den, 1e-30)),
                std::memcmp(a.data(), b.data(), kH * sizeof(float)) == 0 ? " (bit-identical)" : "");
  }
  const double expert_mb = kK * (2.0 * kI * layer.gate_row_bytes + kH * layer.down_row_bytes) / 1e6;
  const double floor_us = expert_mb * 1e6 / 4.5e12 * 1e6;
  const double product_floor_us = router_bytes / 4.5e12 * 1e6;
  for (const bool pdl : {true, false}) {
    SetPdlEnabled(pdl);
    for (const bool with_product : {true, false}) {
      step = 0;
      const double old_us = bench::GraphUs([&] { old_chain(with_product); }, steps);
      step = 0;
      const double new_us = bench::GraphUs([&] { new_chain(with_product); }, steps);
      std::printf("one-token MoE E=512 K=10 h=2048 I=512 %s%s: old %7.2f us/layer (5 kernels%s), new %7.2f us/layer "
                  "(%s), graph of %d layers; floor %.2f us (routed experts %.1f MB at 4.5 TB/s)%s\n",
                  with_product ? "router product + chain" : "chain without router product", pdl ? "" : ", PDL off",
                  old_us, with_product ? "" : " less the product", new_us,
                  with_product ? "3 kernels" : "2 kernels", steps, floor_us + (with_product ? product_floor_us : 0.0),
                  expert_mb, with_product ? " + router 4.19 MB" : "");
      if (pdl) {
        const std::string key = with_product ? "_with_product" : "";
        bench::Report("one_token_moe_old" + key, old_us, "us", "n=1 MoE chain per layer, graph, old (plan path)");
        bench::Report("one_token_moe_new" + key, new_us, "us", "n=1 MoE chain per layer, graph, expert_decode_one");
      }
    }
  }
  SetPdlEnabled(true);
  for (float* m : mats) BENCH_CHECK(cudaFree(m));
  for (void* p : std::initializer_list<void*>{layer.gate, layer.up, layer.down, table, logits, act, partial, shared,
                                              gate_logit, y_old, y_new, picks, slot, units, ints}) {
    BENCH_CHECK(cudaFree(p));
  }
}

}  // namespace tandem::cuda::moe_bench
