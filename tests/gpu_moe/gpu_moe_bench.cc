// Timings of the MoE kernels on the Qwen3-Next-80B shapes (h 2048, I 512, E 512, K 10), every
// expert resident: decode expert bandwidth against a measured device-to-device copy, the prefill
// GEMM path, routing and the scatter-sum. Weights are random bytes (timing does not depend on
// their values; never zeros). Prints one line per measurement. Not a test.
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

namespace tandem::cuda {
namespace {


constexpr int64_t kH = 2048, kI = 512, kE = 512, kK = 10;

// Random bytes with every f16 scale field finite: the generator only draws bytes below 0x78 in
// odd positions, so no f16 read from the block has an all-ones exponent.
void FillRandom(void* dst, size_t bytes, std::mt19937& rng) {
  std::vector<uint8_t> host(std::min<size_t>(bytes, size_t{64} << 20));
  for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<uint8_t>(rng() % (i % 2 ? 0x78 : 0x100));
  for (size_t off = 0; off < bytes; off += host.size()) {
    BENCH_CHECK(cudaMemcpy(static_cast<uint8_t*>(dst) + off, host.data(), std::min(host.size(), bytes - off),
                           cudaMemcpyHostToDevice));
  }
}

struct Timer {
  cudaEvent_t a, b;
  Timer() {
    BENCH_CHECK(cudaEventCreate(&a));
    BENCH_CHECK(cudaEventCreate(&b));
  }
  void Start() { BENCH_CHECK(cudaEventRecord(a)); }
  float StopMs() {
    BENCH_CHECK(cudaEventRecord(b));
    BENCH_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    BENCH_CHECK(cudaEventElapsedTime(&ms, a, b));
    return ms;
  }
};

float Median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Layer {
  void* gate;
  void* up;
  void* down;
  int64_t gate_row_bytes, down_row_bytes;
  ExpertLocation Expert(int64_t e) const {
    return {static_cast<uint8_t*>(gate) + e * kI * gate_row_bytes, static_cast<uint8_t*>(up) + e * kI * gate_row_bytes,
            static_cast<uint8_t*>(down) + e * kH * down_row_bytes};
  }
};

int64_t RowBytesOf(uint32_t type, int64_t cols) {
  switch (type) {
    case kTypeQ4_K: return cols / 256 * 144;
    case kTypeQ2_K: return cols / 256 * 84;
    case kTypeQ6_K: return cols / 256 * 210;
    case kTypeQ8_0: return cols / 32 * 34;
    default: return 0;
  }
}

// A layer of kE experts of the given gate/up and down types, random bytes (cudaFree its three
// arrays when done).
Layer RandomLayer(uint32_t gate_up_type, uint32_t down_type, std::mt19937& rng) {
  Layer layer{};
  layer.gate_row_bytes = RowBytesOf(gate_up_type, kH);
  layer.down_row_bytes = RowBytesOf(down_type, kI);
  const size_t gbytes = static_cast<size_t>(kE * kI * layer.gate_row_bytes);
  const size_t dbytes = static_cast<size_t>(kE * kH * layer.down_row_bytes);
  BENCH_CHECK(cudaMalloc(&layer.gate, gbytes));
  BENCH_CHECK(cudaMalloc(&layer.up, gbytes));
  BENCH_CHECK(cudaMalloc(&layer.down, dbytes));
  FillRandom(layer.gate, gbytes, rng);
  FillRandom(layer.up, gbytes, rng);
  FillRandom(layer.down, dbytes, rng);
  return layer;
}

std::vector<int32_t> RandomPicks(std::mt19937& rng, int64_t n) {
  std::vector<int32_t> picks, ids(kE);
  for (int64_t t = 0; t < n; ++t) {
    for (int32_t e = 0; e < kE; ++e) ids[e] = e;
    for (int64_t k = 0; k < kK; ++k) std::swap(ids[k], ids[k + rng() % (kE - k)]);
    picks.insert(picks.end(), ids.begin(), ids.begin() + kK);
  }
  return picks;
}

// Decode: `iters` steps, each with fresh picks for n tokens (all units uploaded beforehand so that
// the loop times the kernels only; 200 steps of distinct experts are far more than L2 holds).
// Bandwidth counts the bytes of the distinct experts of each step. `kernel` names the kernel that
// LaunchExpertGateUp / LaunchExpertDown run (set by the caller); combined_only times gate/up + down
// together and skips the parts and the runner.
// graph: the combined case only, its 200 steps captured once into a CUDA graph on a created stream
// and the graph replayed (no host launch cost; PDL edges kept), as the backend runs a decode step.
void BenchDecode(const char* name, const char* kernel, const Layer& layer, uint32_t gu_type, uint32_t d_type, int64_t n,
                 std::mt19937& rng, const float* x, float* act, float* partial, double copy_gbs,
                 bool combined_only = false, bool graph = false) {
  const int iters = 200;
  std::vector<std::vector<ExpertUnit>> plans;
  double bytes = 0;
  int max_rows = 1;
  size_t max_units = 0;
  for (int it = 0; it < iters; ++it) {
    const std::vector<int32_t> picks = RandomPicks(rng, n);
    absl::StatusOr<MoeStepPlan> plan =
        PlanMoeStep(picks, n, kK, kE, [&](int32_t e) -> std::optional<ExpertLocation> { return layer.Expert(e); });
    BENCH_OK(plan.status());
    const std::set<int32_t> distinct(picks.begin(), picks.end());
    bytes += static_cast<double>(distinct.size()) * (2.0 * kI * layer.gate_row_bytes + kH * layer.down_row_bytes);
    max_rows = std::max(max_rows, plan->max_unit_rows);
    max_units = std::max(max_units, plan->units.size());
    plans.push_back(plan->units);
  }
  ExpertUnit* dunits;
  BENCH_CHECK(cudaMalloc(&dunits, iters * max_units * sizeof(ExpertUnit)));
  for (int it = 0; it < iters; ++it) {
    BENCH_CHECK(cudaMemcpy(dunits + it * max_units, plans[it].data(), plans[it].size() * sizeof(ExpertUnit),
                           cudaMemcpyHostToDevice));
  }
  auto run = [&](int it, bool gate_up, bool down, cudaStream_t stream = nullptr) {
    const int count = static_cast<int>(plans[it].size());
    if (gate_up) BENCH_CHECK(LaunchExpertGateUp(gu_type, dunits + it * max_units, count, max_rows, kH, kI, x, act, stream));
    if (down) BENCH_CHECK(LaunchExpertDown(d_type, dunits + it * max_units, count, max_rows, kI, kH, act, partial, stream));
  };
  Timer timer;
  for (int it = 0; it < 20; ++it) run(it, true, true);  // warm-up
  if (graph) {
    cudaStream_t stream;
    BENCH_CHECK(cudaStreamCreate(&stream));  // blocking: ordered with the timer's legacy-stream events
    cudaGraph_t g;
    cudaGraphExec_t exec;
    BENCH_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    for (int it = 0; it < iters; ++it) run(it, true, true, stream);
    BENCH_CHECK(cudaStreamEndCapture(stream, &g));
    BENCH_CHECK(cudaGraphInstantiate(&exec, g, 0));
    BENCH_CHECK(cudaGraphLaunch(exec, stream));  // warm-up
    std::vector<float> reps;
    for (int rep = 0; rep < 5; ++rep) {
      timer.Start();
      BENCH_CHECK(cudaGraphLaunch(exec, stream));
      reps.push_back(timer.StopMs());
    }
    const double ms = Median(reps) / iters;
    const double gbs = bytes / iters / (ms * 1e-3) / 1e9;
    std::printf("decode %-22s %-12s n=%-3lld %-13s %8.2f us/step %8.1f GB/s (%4.0f%% of copy) graph\n", name, kernel,
                static_cast<long long>(n), "gate_up+down", ms * 1e3, gbs, 100.0 * gbs / copy_gbs);
    BENCH_CHECK(cudaGraphExecDestroy(exec));
    BENCH_CHECK(cudaGraphDestroy(g));
    BENCH_CHECK(cudaStreamDestroy(stream));
    BENCH_CHECK(cudaFree(dunits));
    return;
  }
  const char* parts[3] = {"gate_up+down", "gate_up", "down"};
  for (int part = 0; part < (combined_only ? 1 : 3); ++part) {
    std::vector<float> reps;
    for (int rep = 0; rep < 5; ++rep) {
      timer.Start();
      for (int it = 0; it < iters; ++it) run(it, part != 2, part != 1);
      reps.push_back(timer.StopMs());
    }
    const double ms = Median(reps) / iters;
    double part_bytes = bytes / iters;
    if (part == 1) part_bytes *= 2.0 * kI * layer.gate_row_bytes / (2.0 * kI * layer.gate_row_bytes + kH * layer.down_row_bytes);
    if (part == 2) part_bytes *= kH * layer.down_row_bytes / (2.0 * kI * layer.gate_row_bytes + kH * layer.down_row_bytes);
    const double gbs = part_bytes / (ms * 1e-3) / 1e9;
    std::printf("decode %-22s %-12s n=%-3lld %-13s %8.2f us/step %8.1f GB/s (%4.0f%% of copy) %.1f MB/step\n", name,
                kernel, static_cast<long long>(n), parts[part], ms * 1e3, gbs, 100.0 * gbs / copy_gbs, part_bytes / 1e6);
  }
  if (combined_only) {
    BENCH_CHECK(cudaFree(dunits));
    return;
  }
  // The runner path (units staged through pinned memory each step).
  absl::StatusOr<ExpertDecodeRunner> runner = ExpertDecodeRunner::Create(static_cast<int64_t>(max_units));
  BENCH_OK(runner.status());
  const ExpertDecodeRunner::Shape shape{static_cast<WeightType>(gu_type), static_cast<WeightType>(d_type), kH, kI};
  timer.Start();
  for (int it = 0; it < iters; ++it) BENCH_OK(runner->Run(plans[it], shape, x, act, partial, nullptr));
  const double ms = timer.StopMs() / iters;
  std::printf("decode %-22s %-12s n=%-3lld %-13s %8.2f us/step (staging + 2 launches per step)\n", name, kernel,
              static_cast<long long>(n), "runner", ms * 1e3);
  BENCH_CHECK(cudaFree(dunits));
}

void BenchPrefill(const Layer& layer, uint32_t gu_type, uint32_t d_type, int64_t n, std::mt19937& rng, const float* x,
                  float* partial) {
  const std::vector<int32_t> picks = RandomPicks(rng, n);
  absl::StatusOr<MoeStepPlan> plan =
      PlanMoeStep(picks, n, kK, kE, [&](int32_t e) -> std::optional<ExpertLocation> { return layer.Expert(e); });
  BENCH_OK(plan.status());
  absl::StatusOr<ExpertPrefillRunner> runner =
      ExpertPrefillRunner::Create({static_cast<WeightType>(gu_type), static_cast<WeightType>(d_type), kH, kI}, n * kK);
  BENCH_OK(runner.status());
  BENCH_OK(runner->Run(plan->units, x, partial, nullptr));  // warm-up (cuBLAS handles, heuristics)
  Timer timer;
  std::vector<float> reps;
  for (int rep = 0; rep < 3; ++rep) {
    timer.Start();
    BENCH_OK(runner->Run(plan->units, x, partial, nullptr));
    reps.push_back(timer.StopMs());
  }
  const double ms = Median(reps);
  const double flops = static_cast<double>(n * kK) * (2.0 * 2 * kH * kI + 2.0 * kI * kH);
  std::printf("prefill experts n=%-5lld %8.2f ms %8.1f TFLOP/s  %8.0f tokens/s (experts only, per layer)\n",
              static_cast<long long>(n), ms, flops / (ms * 1e-3) / 1e12, n / (ms * 1e-3));
}

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
  std::vector<ExpertLocation> htable(kE);
  for (int64_t e = 0; e < kE; ++e) htable[e] = layer.Expert(e);
  ExpertLocation* table;
  BENCH_CHECK(cudaMalloc(&table, kE * sizeof(ExpertLocation)));
  BENCH_CHECK(cudaMemcpy(table, htable.data(), kE * sizeof(ExpertLocation), cudaMemcpyHostToDevice));
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
    OneTokenMoeArgs o;
    o.logits = logits;
    o.E = kE;
    o.K = kK;
    o.table = table;
    o.h = kH;
    o.inner = kI;
    o.x = x + (step % 4096) * kH;
    o.act = act;
    o.experts_out = picks;
    o.weights_out = reinterpret_cast<float*>(picks + kK);
    o.error = ints + 1;
    o.shared = shared;
    o.shared_gate_logit = gate_logit;
    o.y = y_new;
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

int Main(bool decode_only, bool routing_only, bool one_token_only) {
  if (!tandem::bench::PrintDevice()) {
    std::printf("no CUDA GPU: nothing to time\n");
    return 0;
  }
  std::mt19937 rng(12345);
  if (one_token_only) {
    float* x = bench::RandomFloats(4096 * kH, 3);
    BenchOneToken(x, rng);
    BENCH_CHECK(cudaFree(x));
    return 0;
  }
  if (routing_only) {
    float* x = bench::RandomFloats(8192 * kH, 3);
    BenchRouting(x, rng);
    BENCH_CHECK(cudaFree(x));
    return 0;
  }

  // Ceiling: device-to-device copy of 2 GiB (bytes read + written).
  const size_t copy_bytes = size_t{1} << 31;
  void *src, *dst;
  BENCH_CHECK(cudaMalloc(&src, copy_bytes));
  BENCH_CHECK(cudaMalloc(&dst, copy_bytes));
  BENCH_CHECK(cudaMemset(src, 0x5A, copy_bytes));
  BENCH_CHECK(cudaMemcpy(dst, src, copy_bytes, cudaMemcpyDeviceToDevice));
  Timer timer;
  std::vector<float> reps;
  for (int rep = 0; rep < 5; ++rep) {
    timer.Start();
    BENCH_CHECK(cudaMemcpy(dst, src, copy_bytes, cudaMemcpyDeviceToDevice));
    reps.push_back(timer.StopMs());
  }
  const double copy_gbs = 2.0 * copy_bytes / (Median(reps) * 1e-3) / 1e9;
  std::printf("ceiling: device-to-device copy %.0f GB/s (read + write)\n", copy_gbs);
  BENCH_CHECK(cudaFree(src));
  BENCH_CHECK(cudaFree(dst));

  const int64_t max_n = 8192;
  float *x, *act, *partial;
  BENCH_CHECK(cudaMalloc(&x, max_n * kH * sizeof(float)));
  BENCH_CHECK(cudaMalloc(&act, max_n * kK * kI * sizeof(float)));
  BENCH_CHECK(cudaMalloc(&partial, max_n * kK * kH * sizeof(float)));
  {
    std::vector<float> hx(max_n * kH);
    std::normal_distribution<float> nd;
    for (float& v : hx) v = nd(rng);
    BENCH_CHECK(cudaMemcpy(x, hx.data(), hx.size() * sizeof(float), cudaMemcpyHostToDevice));
  }

  struct Variant {
    const char* name;
    uint32_t gu, d;
  } variants[] = {{"q4_K gate/up, q4_K down", kTypeQ4_K, kTypeQ4_K}, {"q2_K gate/up, q4_K down", kTypeQ2_K, kTypeQ4_K}};
  for (const Variant& v : variants) {
    const Layer layer = RandomLayer(v.gu, v.d, rng);
    const size_t gbytes = static_cast<size_t>(kE * kI * layer.gate_row_bytes);
    const size_t dbytes = static_cast<size_t>(kE * kH * layer.down_row_bytes);
    std::printf("layer: %s, %.0f MB of routed experts\n", v.name, (2.0 * gbytes + dbytes) / 1e6);
    // Before and after in the same run: the generic kernel of matvec_impl.cuh for every type
    // ("old-generic"), expert_decode.cuh's per-piece kernel for Q4_K ("old-pieces", the default
    // until 2026-12-01) and the routed default ("new-tiles": expert_decode_q4k.cuh for Q4_K). Each
    // line set eager (host launches, PDL attribute on) and graph-replayed.
    struct Choice {
      const char* label;
      ExpertKernelChoice choice;
    } choices[] = {{"old-generic", ExpertKernelChoice::kGeneric},
                   {"old-pieces", ExpertKernelChoice::kDecodePieces},
                   {"new-tiles", ExpertKernelChoice::kDecode}};
    for (int64_t n : {1, 8, 32}) {
      for (const Choice& c : choices) {
        SetExpertKernelChoice(c.choice);
        BenchDecode(v.name, c.label, layer, v.gu, v.d, n, rng, x, act, partial, copy_gbs);
        BenchDecode(v.name, c.label, layer, v.gu, v.d, n, rng, x, act, partial, copy_gbs, true, true);
      }
      SetExpertKernelChoice(ExpertKernelChoice::kDecode);
    }
    // The tile kernel's knob (steps per warp; "new-tiles" uses the default rule) and PDL off.
    if (v.gu == kTypeQ4_K) {
      for (int64_t n : {1, 8, 32}) {
        for (int spw : {1, 2, 4}) {
          SetExpertDecodeStepsPerWarp(spw);
          const std::string label = "new-tiles-s" + std::to_string(spw);
          BenchDecode(v.name, label.c_str(), layer, v.gu, v.d, n, rng, x, act, partial, copy_gbs, true, true);
        }
        SetExpertDecodeStepsPerWarp(0);
        // Tile warps per block forced (the default is the rule: 4 at about one wave, 8 above).
        for (int warps : {2, 4, 8}) {
          SetExpertDecodeTileWarps(warps);
          const std::string label = "new-tiles-w" + std::to_string(warps);
          BenchDecode(v.name, label.c_str(), layer, v.gu, v.d, n, rng, x, act, partial, copy_gbs, true, true);
        }
        SetExpertDecodeTileWarps(0);
        SetPdlEnabled(false);
        BenchDecode(v.name, "new-tiles-nopdl", layer, v.gu, v.d, n, rng, x, act, partial, copy_gbs, true, true);
        SetPdlEnabled(true);
      }
    }
    if (v.gu == kTypeQ4_K && !decode_only) {
      for (int64_t n : {512, 8192}) BenchPrefill(layer, v.gu, v.d, n, rng, x, partial);
    }
    BENCH_CHECK(cudaFree(layer.gate));
    BENCH_CHECK(cudaFree(layer.up));
    BENCH_CHECK(cudaFree(layer.down));
  }

  // Routing and the scatter-sum at decode sizes.
  float *logits, *weights;
  int32_t *experts, *slot;
  BENCH_CHECK(cudaMalloc(&logits, 32 * kE * sizeof(float)));
  BENCH_CHECK(cudaMalloc(&weights, 32 * kK * sizeof(float)));
  BENCH_CHECK(cudaMalloc(&experts, 32 * kK * sizeof(int32_t)));
  BENCH_CHECK(cudaMalloc(&slot, 32 * kK * sizeof(int32_t)));
  BENCH_CHECK(cudaMemcpy(logits, x, 32 * kE * sizeof(float), cudaMemcpyDeviceToDevice));
  {
    std::vector<int32_t> hs(32 * kK);
    for (int i = 0; i < 32 * kK; ++i) hs[i] = i;
    BENCH_CHECK(cudaMemcpy(slot, hs.data(), hs.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
  }
  for (int n : {1, 32}) {
    BENCH_CHECK(LaunchRouteTopK(logits, n, kE, kK, experts, weights, nullptr));
    timer.Start();
    for (int i = 0; i < 100; ++i) BENCH_CHECK(LaunchRouteTopK(logits, n, kE, kK, experts, weights, nullptr));
    const double route_us = timer.StopMs() * 10;
    timer.Start();
    for (int i = 0; i < 100; ++i) {
      BENCH_CHECK(LaunchMoeScatterSum(partial, slot, weights, n, kK, kH, partial, logits, act, nullptr));
    }
    const double scatter_us = timer.StopMs() * 10;
    std::printf("route E=512 K=10 n=%-3d %6.2f us; scatter-sum n=%-3d %6.2f us\n", n, route_us, n, scatter_us);
  }
  if (!decode_only) BenchRouting(x, rng);
  BenchOneToken(x, rng);
  BENCH_CHECK(cudaDeviceSynchronize());
  return 0;
}

}  // namespace
}  // namespace tandem::cuda

// --routing-only: only BenchRouting (router product + plan, old and new).
// --decode-only: the copy ceiling and the decode expert cases, each timed with the old generic
// kernel, the per-piece decode kernel and the routed default (the Q4_K tile kernel), eager and
// graph-replayed, then the tile kernel's knob sweep.
// --one-token-only: only BenchOneToken (the n = 1 MoE chain, old and new).
int main(int argc, char** argv) {
  bool decode_only = false, routing_only = false, one_token_only = false;
  for (int i = 1; i < argc; ++i) {
    decode_only |= std::string(argv[i]) == "--decode-only";
    routing_only |= std::string(argv[i]) == "--routing-only";
    one_token_only |= std::string(argv[i]) == "--one-token-only";
  }
  return tandem::cuda::Main(decode_only, routing_only, one_token_only);
}
