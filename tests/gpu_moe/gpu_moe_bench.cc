// Timings of the MoE kernels on the Qwen3-Next-80B shapes (h 2048, I 512, E 512, K 10), every
// expert resident: decode expert bandwidth against a measured device-to-device copy, the prefill
// GEMM path, routing and the scatter-sum. Weights are random bytes (timing does not depend on
// their values; never zeros). Prints one line per measurement. Not a test. The routing and
// one-token chain timings live in moe_chain_bench.cc, the shared pieces in moe_bench_util.h.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
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
#include "gpu_service/backends/cuda/kernels/norm_streams.cuh"
#include "gpu_service/backends/cuda/moe/expert_prefill_mmq.cuh"
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

namespace tandem::cuda {
namespace {

// The shapes, random layers and timers shared with moe_chain_bench.cc.
using moe_bench::FillRandom;
using moe_bench::kE;
using moe_bench::kH;
using moe_bench::kI;
using moe_bench::kK;
using moe_bench::BenchOneToken;
using moe_bench::BenchOneTokenProbe;
using moe_bench::BenchRouting;
using moe_bench::Layer;
using moe_bench::Median;
using moe_bench::RandomLayer;
using moe_bench::RandomPicks;
using moe_bench::RowBytesOf;
using moe_bench::Timer;


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

// The MoE prefill glue (h/moeglue) on the 80B shapes, old and new in one process: the scatter-sum
// (per-element kernel against the vector kernel; slots a random permutation of n·K rows, gated
// shared expert; bytes = partial rows + shared rows read + y written), the x quantization
// launched plainly against with PDL (back to back), and the FFN stream norm with its f16 split
// rows followed by LaunchMmqQuantize against the norm with the quantization folded in. Each
// pair's outputs are compared bit for bit. only_n > 0: that token count alone (for Nsight Compute).
void BenchGlue(int only_n) {
  std::mt19937 rng(7);
  for (int n : {1, 32, 512, 2048, 8192}) {
    if (only_n > 0 && n != only_n) continue;
    const int64_t slots = static_cast<int64_t>(n) * kK;
    float* partial = bench::RandomFloats(static_cast<size_t>(slots) * kH, 11);
    float* shared = bench::RandomFloats(static_cast<size_t>(n) * kH, 12);
    float* logit = bench::RandomFloats(static_cast<size_t>(n), 13);
    float* weights = bench::RandomFloats(static_cast<size_t>(slots), 14);
    std::vector<int32_t> hs(static_cast<size_t>(slots));
    for (int64_t i = 0; i < slots; ++i) hs[static_cast<size_t>(i)] = static_cast<int32_t>(i);
    std::shuffle(hs.begin(), hs.end(), rng);
    int32_t* slot = nullptr;
    float *y0 = nullptr, *y1 = nullptr;
    BENCH_CHECK(cudaMalloc(&slot, hs.size() * sizeof(int32_t)));
    BENCH_CHECK(cudaMemcpy(slot, hs.data(), hs.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
    BENCH_CHECK(cudaMalloc(&y0, static_cast<size_t>(n) * kH * 4));
    BENCH_CHECK(cudaMalloc(&y1, static_cast<size_t>(n) * kH * 4));
    const double old_ms = bench::TimeMs([&] {
      BENCH_CHECK(LaunchMoeScatterSumPerElement(partial, slot, weights, n, kK, kH, shared, logit, y0, nullptr));
    });
    const double new_ms = bench::TimeMs([&] {
      BENCH_CHECK(LaunchMoeScatterSum(partial, slot, weights, n, kK, kH, shared, logit, y1, nullptr));
    });
    std::vector<float> a(static_cast<size_t>(n) * kH), b(a.size());
    BENCH_CHECK(cudaMemcpy(a.data(), y0, a.size() * 4, cudaMemcpyDeviceToHost));
    BENCH_CHECK(cudaMemcpy(b.data(), y1, b.size() * 4, cudaMemcpyDeviceToHost));
    const bool equal = std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
    const double bytes = (static_cast<double>(slots) + 2.0 * n) * kH * 4;
    std::printf("glue scatter-sum n=%-5d K=%lld h=%lld: per-element %8.2f us (%6.0f GB/s), vector %8.2f us (%6.0f GB/s), "
                "floor %.2f us at 4.5 TB/s, bits %s\n",
                n, static_cast<long long>(kK), static_cast<long long>(kH), old_ms * 1e3, bytes / old_ms / 1e6, new_ms * 1e3, bytes / new_ms / 1e6, bytes / 4.5e6,
                equal ? "EQUAL" : "DIFFER");
    BENCH_CHECK(cudaFree(partial));
    BENCH_CHECK(cudaFree(shared));
    BENCH_CHECK(cudaFree(logit));
    BENCH_CHECK(cudaFree(weights));
    BENCH_CHECK(cudaFree(slot));
    BENCH_CHECK(cudaFree(y0));
    BENCH_CHECK(cudaFree(y1));
  }
  // The x quantization and the FFN stream norm at prefill sizes.
  for (int n : {512, 2048}) {
    if (only_n > 0 && n != only_n) continue;
    float* H = bench::RandomFloats(static_cast<size_t>(n) * kH, 21);
    float* y = bench::RandomFloats(static_cast<size_t>(n) * kH, 22);
    float* gamma = bench::RandomFloats(kH, 23);
    float* N = nullptr;
    uint16_t* N16 = nullptr;
    void *q0 = nullptr, *q1 = nullptr;
    const size_t qbytes = MmqActivationBytes(n, kH);
    BENCH_CHECK(cudaMalloc(&N, static_cast<size_t>(n) * kH * 4));
    BENCH_CHECK(cudaMalloc(&N16, static_cast<size_t>(n) * 3 * kH * 2));
    BENCH_CHECK(cudaMalloc(&q0, qbytes));
    BENCH_CHECK(cudaMalloc(&q1, qbytes));
    const MmqActivations p0 = MmqActivationPlanes(q0, n, kH), p1 = MmqActivationPlanes(q1, n, kH);
    const NormMmqOut out{p1.hi, p1.lo, p1.scale, p1.sumx};
    // y is injected into H on every call: a zero a-weight is not available, so H drifts; the
    // timing does not depend on the values.
    // Order (for Nsight Compute's launch counts): folded, separate, norm alone, quantize plain, PDL.
    const double fused = bench::TimeMs([&] {
      BENCH_CHECK(LaunchInjectRmsNormF16(H, n, 1, kH, nullptr, y, gamma, 1e-6f, N, 3, N16, nullptr, &out));
    });
    const double sep = bench::TimeMs([&] {
      BENCH_CHECK(LaunchInjectRmsNormF16(H, n, 1, kH, nullptr, y, gamma, 1e-6f, N, 3, N16, nullptr));
      BENCH_CHECK(LaunchMmqQuantize(N, n, kH, p0, nullptr));
    });
    const double norm_only = bench::TimeMs(
        [&] { BENCH_CHECK(LaunchInjectRmsNormF16(H, n, 1, kH, nullptr, y, gamma, 1e-6f, N, 3, N16, nullptr)); });
    SetPdlEnabled(false);
    const double quant_plain = bench::TimeMs([&] { BENCH_CHECK(LaunchMmqQuantize(N, n, kH, p0, nullptr)); });
    SetPdlEnabled(true);
    const double quant_pdl = bench::TimeMs([&] { BENCH_CHECK(LaunchMmqQuantize(N, n, kH, p0, nullptr)); });
    // Equality: one more norm with the fold, then the separate quantization of its N.
    BENCH_CHECK(LaunchInjectRmsNormF16(H, n, 1, kH, nullptr, y, gamma, 1e-6f, N, 3, N16, nullptr, &out));
    BENCH_CHECK(LaunchMmqQuantize(N, n, kH, p0, nullptr));
    std::vector<uint8_t> a(qbytes), b(qbytes);
    BENCH_CHECK(cudaMemcpy(a.data(), q0, qbytes, cudaMemcpyDeviceToHost));
    BENCH_CHECK(cudaMemcpy(b.data(), q1, qbytes, cudaMemcpyDeviceToHost));
    std::printf("glue x quantize n=%-5d: plain %6.2f us, PDL %6.2f us (back to back); norm+f16 split %6.2f us, "
                "+ quantize %6.2f us, folded %6.2f us; planes %s\n",
                n, quant_plain * 1e3, quant_pdl * 1e3, norm_only * 1e3, sep * 1e3, fused * 1e3,
                a == b ? "EQUAL" : "DIFFER");
    BENCH_CHECK(cudaFree(H));
    BENCH_CHECK(cudaFree(y));
    BENCH_CHECK(cudaFree(gamma));
    BENCH_CHECK(cudaFree(N));
    BENCH_CHECK(cudaFree(N16));
    BENCH_CHECK(cudaFree(q0));
    BENCH_CHECK(cudaFree(q1));
  }
  // The streamed experts' f16 input rows (h/normf16) at the sizes that take the streamed kernels:
  // the FFN norm (with the router's split rows) then LaunchConvertToF16 over its N, against the
  // norm writing them (NormMmqOut::x16). Bytes of the conversion: n·h·(4 + 2).
  for (int n : {2048, 8192}) {
    if (only_n > 0 && n != only_n) continue;
    float* H = bench::RandomFloats(static_cast<size_t>(n) * kH, 31);
    float* y = bench::RandomFloats(static_cast<size_t>(n) * kH, 32);
    float* gamma = bench::RandomFloats(kH, 33);
    float* N = nullptr;
    uint16_t *N16 = nullptr, *x0 = nullptr, *x1 = nullptr;
    BENCH_CHECK(cudaMalloc(&N, static_cast<size_t>(n) * kH * 4));
    BENCH_CHECK(cudaMalloc(&N16, static_cast<size_t>(n) * 3 * kH * 2));
    BENCH_CHECK(cudaMalloc(&x0, static_cast<size_t>(n) * kH * 2));
    BENCH_CHECK(cudaMalloc(&x1, static_cast<size_t>(n) * kH * 2));
    NormMmqOut out;
    out.x16 = x1;
    const double fused = bench::TimeMs([&] {
      BENCH_CHECK(LaunchInjectRmsNormF16(H, n, 1, kH, nullptr, y, gamma, 1e-6f, N, 3, N16, nullptr, &out));
    });
    const double sep = bench::TimeMs([&] {
      BENCH_CHECK(LaunchInjectRmsNormF16(H, n, 1, kH, nullptr, y, gamma, 1e-6f, N, 3, N16, nullptr));
      BENCH_CHECK(LaunchConvertToF16(N, static_cast<int64_t>(n) * kH, x0, nullptr));
    });
    const double norm_only = bench::TimeMs(
        [&] { BENCH_CHECK(LaunchInjectRmsNormF16(H, n, 1, kH, nullptr, y, gamma, 1e-6f, N, 3, N16, nullptr)); });
    const double convert = bench::TimeMs(
        [&] { BENCH_CHECK(LaunchConvertToF16(N, static_cast<int64_t>(n) * kH, x0, nullptr)); });
    // Equality: one more norm writing the rows, then the conversion of its N.
    BENCH_CHECK(LaunchInjectRmsNormF16(H, n, 1, kH, nullptr, y, gamma, 1e-6f, N, 3, N16, nullptr, &out));
    BENCH_CHECK(LaunchConvertToF16(N, static_cast<int64_t>(n) * kH, x0, nullptr));
    std::vector<uint16_t> a(static_cast<size_t>(n) * kH), b(a.size());
    BENCH_CHECK(cudaMemcpy(a.data(), x0, a.size() * 2, cudaMemcpyDeviceToHost));
    BENCH_CHECK(cudaMemcpy(b.data(), x1, b.size() * 2, cudaMemcpyDeviceToHost));
    const double cbytes = static_cast<double>(n) * kH * 6;
    std::printf("glue expert f16 rows n=%-5d: convert %7.2f us (floor %.2f us at 4.5 TB/s); norm+f16 split %7.2f us, "
                "+ convert %7.2f us, norm writing the rows %7.2f us; rows %s\n",
                n, convert * 1e3, cbytes / 4.5e6, norm_only * 1e3, sep * 1e3, fused * 1e3, a == b ? "EQUAL" : "DIFFER");
    BENCH_CHECK(cudaFree(H));
    BENCH_CHECK(cudaFree(y));
    BENCH_CHECK(cudaFree(gamma));
    BENCH_CHECK(cudaFree(N));
    BENCH_CHECK(cudaFree(N16));
    BENCH_CHECK(cudaFree(x0));
    BENCH_CHECK(cudaFree(x1));
  }
  BENCH_CHECK(cudaDeviceSynchronize());
}

int Main(bool decode_only, bool routing_only, bool one_token_only, bool one_token_probe, bool glue_only, int glue_n,
         bool pick_only) {
  if (!tandem::bench::PrintDevice()) {
    std::printf("no CUDA GPU: nothing to time\n");
    return 0;
  }
  if (pick_only) {
    moe_bench::BenchPick();
    return 0;
  }
  std::mt19937 rng(12345);
  if (glue_only) {
    BenchGlue(glue_n);
    return 0;
  }
  if (one_token_only || one_token_probe) {
    float* x = bench::RandomFloats(4096 * kH, 3);
    if (one_token_probe) {
      BenchOneTokenProbe(x, rng);
    } else {
      BenchOneToken(x, rng);
    }
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
// --one-token-probe: only BenchOneTokenProbe (the phases of the n = 1 chain's kernels, stamped).
// --glue-only: only BenchGlue (the MoE prefill glue: scatter-sum, x quantization, expert f16 rows; old and new);
// --glue-n=N: of it only N tokens.
// --pick: only BenchPick (the fused kernel's logit reads and picks alone, pick_bench.cu).
int main(int argc, char** argv) {
  bool decode_only = false, routing_only = false, one_token_only = false, one_token_probe = false, glue_only = false;
  bool pick_only = false;
  int glue_n = 0;
  for (int i = 1; i < argc; ++i) {
    decode_only |= std::string(argv[i]) == "--decode-only";
    routing_only |= std::string(argv[i]) == "--routing-only";
    one_token_only |= std::string(argv[i]) == "--one-token-only";
    one_token_probe |= std::string(argv[i]) == "--one-token-probe";
    glue_only |= std::string(argv[i]) == "--glue-only";
    pick_only |= std::string(argv[i]) == "--pick";
    if (std::string(argv[i]).rfind("--glue-n=", 0) == 0) glue_n = std::atoi(argv[i] + 9);
  }
  return tandem::cuda::Main(decode_only, routing_only, one_token_only, one_token_probe, glue_only, glue_n, pick_only);
}
