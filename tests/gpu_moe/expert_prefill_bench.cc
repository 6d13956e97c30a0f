// Timings of the prefill routed-expert path on the Qwen3-Next-80B shapes (h 2048, I 512, E 512,
// K 10, Q4_K gate/up/down, every expert resident), for 512, 2048 and 8192 tokens with uniform
// random routing: per layer time, TFLOP/s and GB/s of the routed experts' weights of each
// algorithm (the per-expert cuBLAS path; the pipelined tile kernel at its chosen height with
// remainder tiles; the streamed Q4_K kernel with tiles of up to 64 rows, and with tiles of up to 16
// and 32 (its deeper ring), and its two weight-prefetch variants; the row-streamed Q4_K kernel at its
// chosen bound, 16 and 32; the integer-MMA kernel at its chosen bound, 16, 32, with 16 warps, and
// 4 warps with rings of 16, L2 row prefetch, the min term as f32 FMAs, the hi term only, and its load-only and math-only timing variants; the runner's default), against the rate of one large bf16 and one f16 cuBLAS GEMM measured
// in the same run. Also prints the relative L2 of the grouped outputs against the cuBLAS path (a
// sanity line; the tests decide correctness). Not a test.
//
// wgmma rows (2026-12-01, branches h/wgexp, h/wgws): "wgmma weights-as-A, tiles <= 256"
// (PrefillKernel::kWgmma, expert_prefill_wgexp.cu) and "wgmma warp-specialized" (kWgmmaWs,
// expert_prefill_wgws.cu) beside "streamed 64 (old default)", each twice in alternation, with the
// relative L2 of each wgmma output to the first streamed row's at every n and "bits EQUAL to the
// first wgmma row's" for every later wgmma row. "default (auto)" prints the kernel it ran:
// kWgmmaWs where the groups average >= 64 rows (8192 tokens; the default since 2026-12-02), kWgmma
// with TANDEM_PREFILL_WGMMA=1, kStreamed with =0; where that is a wgmma kernel, its bits line too
// (e.g. `--tokens=8192 --only=wgmma --only=default`).
// Work-order rows (2026-12-01): "streamed 64, order ranges/strided/dynamic"
// time the streamed kernel at tiles <= 64 with each StreamedOrder in one process (ranges: the order
// until 2026-12-01; dynamic: the new default), each twice in alternation so that drift shows.
// Arguments: --tokens=N (repeatable; default 512, 2048, 8192) and --only=SUBSTRING (repeatable:
// only the grouped variants whose name holds one of them; the cuBLAS reference then runs only where
// the relative-L2 line needs it, n <= 2048), e.g. `expert_prefill_bench --tokens=2048 --tokens=8192
// --only=order`.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "gpu_service/backends/cuda/moe/expert_prefill.h"
#include "gpu_service/backends/cuda/moe/experts.h"
#include "tests/gpu/bench_util.h"

namespace tandem::cuda {
namespace {

#define BLAS_CHECK(call)                                                          \
  do {                                                                            \
    if (cublasStatus_t s_ = (call); s_ != CUBLAS_STATUS_SUCCESS) {                \
      std::fprintf(stderr, "%s:%d %s: %d\n", __FILE__, __LINE__, #call, int(s_)); \
      std::exit(1);                                                               \
    }                                                                             \
  } while (0)

constexpr int64_t kH = 2048, kI = 512, kE = 512, kK = 10;
constexpr int64_t kQ4KBlockBytes = 144, kQ4KBlockElems = 256;

using bench::Median;
using Timer = bench::EventTimer;

// Q4_K blocks with random quants and scales and f16 super-block scales d, dmin in [2^-13, 2^-10):
// values of order 0.1, so that the FFN outputs stay finite and the two algorithms can be compared.
void FillQ4K(uint8_t* dst, size_t bytes, std::mt19937& rng) {
  const size_t pattern_blocks = size_t{1} << 18;
  std::vector<uint8_t> host(pattern_blocks * kQ4KBlockBytes);
  for (size_t b = 0; b < pattern_blocks; ++b) {
    uint8_t* blk = host.data() + b * kQ4KBlockBytes;
    for (int i = 0; i < kQ4KBlockBytes; ++i) blk[i] = static_cast<uint8_t>(rng());
    for (int f = 0; f < 2; ++f) {  // d, dmin: exponent field 2..4, random mantissa
      const uint16_t bits = static_cast<uint16_t>(((2 + rng() % 3) << 10) | (rng() & 0x3FF));
      blk[2 * f] = static_cast<uint8_t>(bits & 0xFF);
      blk[2 * f + 1] = static_cast<uint8_t>(bits >> 8);
    }
  }
  for (size_t off = 0; off < bytes; off += host.size()) {
    BENCH_CHECK(cudaMemcpy(dst + off, host.data(), std::min(host.size(), bytes - off), cudaMemcpyHostToDevice));
  }
}

// The kernels the runner's default (kStreamedAuto) can resolve to, by name (ExpertPrefillRunner::last_kernel).
const char* KernelName(PrefillKernel k) {
  switch (k) {
    case PrefillKernel::kStreamed: return "kStreamed";
    case PrefillKernel::kStreamedRows: return "kStreamedRows";
    case PrefillKernel::kWgmma: return "kWgmma";
    case PrefillKernel::kWgmmaWs: return "kWgmmaWs";
    case PrefillKernel::kMmqLean2: return "kMmqLean2";
    default: return IsMmqKernel(k) ? "an MMQ kernel" : "another kernel";
  }
}

std::vector<int32_t> RandomPicks(std::mt19937& rng, int64_t n) {
  std::vector<int32_t> picks;
  picks.reserve(static_cast<size_t>(n * kK));
  for (int64_t t = 0; t < n; ++t) {
    std::vector<int32_t> mine;
    while (static_cast<int64_t>(mine.size()) < kK) {
      const int32_t e = static_cast<int32_t>(rng() % kE);
      if (std::find(mine.begin(), mine.end(), e) == mine.end()) mine.push_back(e);
    }
    picks.insert(picks.end(), mine.begin(), mine.end());
  }
  return picks;
}

// TFLOP/s of one bf16 × bf16 (or f16 × f16) → f32 cuBLAS GEMM of m = n = k = 8192 (the ceiling).
double CublasCeiling(cudaDataType_t type, const char* name) {
  const int64_t d = 8192;
  void *a, *b, *c;
  BENCH_CHECK(cudaMalloc(&a, d * d * 2));
  BENCH_CHECK(cudaMalloc(&b, d * d * 2));
  BENCH_CHECK(cudaMalloc(&c, d * d * 4));
  BENCH_CHECK(cudaMemset(a, 0x3C, d * d * 2));  // bf16 0x3C3C ≈ 0.0115, f16 0x3C3C ≈ 1.06 (f32 sums)
  BENCH_CHECK(cudaMemset(b, 0x3C, d * d * 2));
  cublasHandle_t handle;
  BLAS_CHECK(cublasCreate(&handle));
  const float one = 1.0f, zero = 0.0f;
  auto gemm = [&] {
    BLAS_CHECK(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, d, d, d, &one, a, type, d, b, type, d, &zero, c,
                            CUDA_R_32F, d, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  };
  gemm();
  Timer timer;
  std::vector<float> reps;
  for (int rep = 0; rep < 5; ++rep) {
    timer.Start();
    gemm();
    reps.push_back(timer.StopMs());
  }
  BLAS_CHECK(cublasDestroy(handle));
  BENCH_CHECK(cudaFree(a));
  BENCH_CHECK(cudaFree(b));
  BENCH_CHECK(cudaFree(c));
  const double tflops = 2.0 * d * d * d / (Median(reps) * 1e-3) / 1e12;
  std::printf("ceiling: cuBLAS %s GEMM 8192^3 (f32 out) %.2f ms, %.1f TFLOP/s\n", name, Median(reps), tflops);
  return tflops;
}

double RelativeL2(const std::vector<float>& got, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    num += (static_cast<double>(got[i]) - ref[i]) * (static_cast<double>(got[i]) - ref[i]);
    den += static_cast<double>(ref[i]) * ref[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

// Median ms of one Run (host planning and upload included), after one warm-up call; -1 (and the
// error printed) where the runner refuses the call. host_ms: the median host time of the Run call
// itself (planning, upload, launches: the GPU idles for that long at the start of each timed Run).
double TimeRuns(ExpertPrefillRunner& runner, const MoeStepPlan& plan, const float* x, float* partial,
                double* host_ms = nullptr) {
  if (absl::Status s = runner.Run(plan.units, x, partial, nullptr); !s.ok()) {
    std::printf("  refused: %s\n", s.ToString().c_str());
    return -1;
  }
  BENCH_CHECK(cudaDeviceSynchronize());
  Timer timer;
  std::vector<float> reps, host;
  for (int rep = 0; rep < 5; ++rep) {
    timer.Start();
    const auto t0 = std::chrono::steady_clock::now();
    BENCH_OK(runner.Run(plan.units, x, partial, nullptr));
    host.push_back(std::chrono::duration<float, std::milli>(std::chrono::steady_clock::now() - t0).count());
    reps.push_back(timer.StopMs());
  }
  if (host_ms != nullptr) *host_ms = Median(host);
  return Median(reps);
}

PrefillOptions Ordered(int64_t n, StreamedOrder order) {
  PrefillOptions o{PrefillAlgorithm::kGroupedTiles, 0, n, PrefillKernel::kStreamed};
  o.work_order = order;
  return o;
}

int Main(int argc, char** argv) {
  std::vector<int64_t> sizes;
  std::vector<std::string> only;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg.starts_with("--tokens=")) {
      sizes.push_back(std::atoll(argv[i] + 9));
    } else if (arg.starts_with("--only=")) {
      only.emplace_back(arg.substr(7));
    } else {
      std::fprintf(stderr, "usage: expert_prefill_bench [--tokens=N]... [--only=SUBSTRING]...\n");
      return 2;
    }
  }
  if (sizes.empty()) sizes = {512, 2048, 8192};
  for (int64_t n : sizes) {
    if (n < 1 || n > 8192) {
      std::fprintf(stderr, "--tokens: 1 .. 8192\n");
      return 2;
    }
  }
  auto selected = [&](const std::string& name) {
    if (only.empty()) return true;
    for (const std::string& o : only) {
      if (name.find(o) != std::string::npos) return true;
    }
    return false;
  };
  if (!tandem::bench::PrintDevice()) {
    std::printf("no CUDA GPU: nothing to time\n");
    return 0;
  }
  const double ceiling = CublasCeiling(CUDA_R_16BF, "bf16");
  CublasCeiling(CUDA_R_16F, "f16");

  // Every expert's gate, up (I rows of h) and down (h rows of I), Q4_K, one allocation.
  const int64_t gate_bytes = kI * (kH / kQ4KBlockElems) * kQ4KBlockBytes;
  const int64_t down_bytes = kH * (kI / kQ4KBlockElems) * kQ4KBlockBytes;
  const int64_t expert_bytes = 2 * gate_bytes + down_bytes;
  std::mt19937 rng(12345);
  uint8_t* weights;
  BENCH_CHECK(cudaMalloc(&weights, kE * expert_bytes));
  FillQ4K(weights, static_cast<size_t>(kE * expert_bytes), rng);
  std::printf("routed experts: %.0f MB of Q4_K per layer\n", kE * expert_bytes / 1e6);
  auto locate = [&](int32_t e) -> std::optional<ExpertLocation> {
    const uint8_t* base = weights + e * expert_bytes;
    return ExpertLocation{base, base + gate_bytes, base + 2 * gate_bytes};
  };

  const int64_t max_n = 8192;
  std::vector<float> host_x(static_cast<size_t>(max_n * kH));
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  for (float& v : host_x) v = uniform(rng);
  float *x, *partial, *partial_ref;
  BENCH_CHECK(cudaMalloc(&x, max_n * kH * sizeof(float)));
  BENCH_CHECK(cudaMemcpy(x, host_x.data(), host_x.size() * sizeof(float), cudaMemcpyHostToDevice));
  BENCH_CHECK(cudaMalloc(&partial, max_n * kK * kH * sizeof(float)));
  BENCH_CHECK(cudaMalloc(&partial_ref, max_n * kK * kH * sizeof(float)));

  const ExpertDecodeRunner::Shape shape{WeightType::kQ4_K, WeightType::kQ4_K, kH, kI};
  for (int64_t n : sizes) {
    const std::vector<int32_t> picks = RandomPicks(rng, n);
    absl::StatusOr<MoeStepPlan> plan = PlanMoeStep(picks, n, kK, kE, locate);
    BENCH_OK(plan.status());
    const double flops = static_cast<double>(n * kK) * (2.0 * 2 * kH * kI + 2.0 * kI * kH);
    // Bytes of the experts the step routes to (each read at least once).
    std::vector<int32_t> distinct = picks;
    std::sort(distinct.begin(), distinct.end());
    distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
    const double weight_bytes = static_cast<double>(distinct.size()) * expert_bytes;
    auto report = [&](const std::string& name, double ms, int tile_rows) {
      const double tflops = flops / (ms * 1e-3) / 1e12;
      std::printf("prefill n=%-5lld %-28s tile_rows %-3d %8.3f ms/layer %7.1f TFLOP/s (%4.1f%% of cuBLAS ceiling) "
                  "%6.0f GB/s of weights %6.1f ms per 48 layers\n",
                  static_cast<long long>(n), name.c_str(), tile_rows, ms, tflops, 100.0 * tflops / ceiling,
                  weight_bytes / (ms * 1e-3) / 1e9, 48 * ms);
    };
    if (only.empty() || n <= 2048) {
      absl::StatusOr<ExpertPrefillRunner> runner =
          ExpertPrefillRunner::Create(shape, n * kK, {PrefillAlgorithm::kCublasPerExpert, 0, n});
      BENCH_OK(runner.status());
      report("cublas per expert (before)", TimeRuns(*runner, *plan, x, partial_ref), 0);
    }
    struct Variant {
      const char* name;
      PrefillOptions options;
    };
    const std::vector<Variant> grouped = {{"pipelined tiles (before)", {PrefillAlgorithm::kGroupedTilesPipelined, 0, n}},
                                          {"streamed 64 (old default)",
                                           {PrefillAlgorithm::kGroupedTiles, 0, n, PrefillKernel::kStreamed}},
                                          {"wgmma weights-as-A, tiles <= 256",
                                           {PrefillAlgorithm::kGroupedTiles, 0, n, PrefillKernel::kWgmma}},
                                          {"wgmma warp-specialized (producer warpgroup), tiles <= 256",
                                           {PrefillAlgorithm::kGroupedTiles, 0, n, PrefillKernel::kWgmmaWs}},
                                          {"streamed 64 again",
                                           {PrefillAlgorithm::kGroupedTiles, 0, n, PrefillKernel::kStreamed}},
                                          {"wgmma weights-as-A again, tiles <= 256",
                                           {PrefillAlgorithm::kGroupedTiles, 0, n, PrefillKernel::kWgmma}},
                                          {"wgmma warp-specialized again, tiles <= 256",
                                           {PrefillAlgorithm::kGroupedTiles, 0, n, PrefillKernel::kWgmmaWs}},
                                          {"rows-streamed (chosen)",
                                           {PrefillAlgorithm::kGroupedTiles, 0, n, PrefillKernel::kStreamedRows}},
                                          {"rows-streamed, tiles <= 16",
                                           {PrefillAlgorithm::kGroupedTiles, 16, n, PrefillKernel::kStreamedRows}},
                                          {"rows-streamed, tiles <= 32",
                                           {PrefillAlgorithm::kGroupedTiles, 32, n, PrefillKernel::kStreamedRows}},
                                          {"default (auto)", {PrefillAlgorithm::kGroupedTiles, 0, n}},
                                          {"mmq (chosen)", {PrefillAlgorithm::kGroupedTiles, 0, n, PrefillKernel::kMmq}},
                                          {"mmq, tiles <= 16", {PrefillAlgorithm::kGroupedTiles, 16, n, PrefillKernel::kMmq}},
                                          {"mmq, tiles <= 32", {PrefillAlgorithm::kGroupedTiles, 32, n, PrefillKernel::kMmq}},
                                          {"mmq 16 warps, tiles <= 16",
                                           {PrefillAlgorithm::kGroupedTiles, 16, n, PrefillKernel::kMmqWarps16}},
                                          {"mmq lean (16 warps), tiles <= 16",
                                           {PrefillAlgorithm::kGroupedTiles, 16, n, PrefillKernel::kMmqLean}},
                                          {"mmq lean2 (unit-ahead descriptors, cp.async tile rows), tiles <= 16",
                                           {PrefillAlgorithm::kGroupedTiles, 16, n, PrefillKernel::kMmqLean2}},
                                          {"mmq lean (16 warps) again, tiles <= 16",
                                           {PrefillAlgorithm::kGroupedTiles, 16, n, PrefillKernel::kMmqLean}},
                                          {"mmq lean2 again, tiles <= 16",
                                           {PrefillAlgorithm::kGroupedTiles, 16, n, PrefillKernel::kMmqLean2}},
                                          {"mmq lean 8 warps x 8 stages, tiles <= 16",
                                           {PrefillAlgorithm::kGroupedTiles, 16, n, PrefillKernel::kMmqLeanWarps8}},
                                          {"mmq + L2 row prefetch (chosen)",
                                           {PrefillAlgorithm::kGroupedTiles, 0, n, PrefillKernel::kMmqL2Prefetch}},
                                          {"mmq f32 min term (chosen)",
                                           {PrefillAlgorithm::kGroupedTiles, 0, n, PrefillKernel::kMmqF32Min}},
                                          {"mmq 4 warps x 16 stages, tiles <= 16",
                                           {PrefillAlgorithm::kGroupedTiles, 16, n, PrefillKernel::kMmqWarps4}},
                                          {"mmq hi term only, tiles <= 16",
                                           {PrefillAlgorithm::kGroupedTiles, 16, n, PrefillKernel::kMmqHiOnly}},
                                          {"mmq LOAD-ONLY, tiles <= 16",
                                           {PrefillAlgorithm::kGroupedTiles, 16, n, PrefillKernel::kMmqLoadOnly}},
                                          {"mmq MATH-ONLY, tiles <= 16",
                                           {PrefillAlgorithm::kGroupedTiles, 16, n, PrefillKernel::kMmqMathOnly}},
                                          {"streamed, tiles <= 32", {PrefillAlgorithm::kGroupedTiles, 32, n}},
                                          {"streamed, tiles <= 16", {PrefillAlgorithm::kGroupedTiles, 16, n}},
                                          {"streamed + L2 256B lines",
                                           {PrefillAlgorithm::kGroupedTiles, 0, n, PrefillKernel::kStreamedL2Lines256}},
                                          {"streamed + unit prefetch",
                                           {PrefillAlgorithm::kGroupedTiles, 0, n, PrefillKernel::kStreamedUnitPrefetch}},
                                          {"streamed 64, order ranges (old)", Ordered(n, StreamedOrder::kRanges)},
                                          {"streamed 64, order strided", Ordered(n, StreamedOrder::kStrided)},
                                          {"streamed 64, order dynamic (new)", Ordered(n, StreamedOrder::kDynamic)},
                                          {"streamed 64, order ranges (old) again", Ordered(n, StreamedOrder::kRanges)},
                                          {"streamed 64, order strided again", Ordered(n, StreamedOrder::kStrided)},
                                          {"streamed 64, order dynamic (new) again", Ordered(n, StreamedOrder::kDynamic)}};
    std::vector<float> order_ref;  // the first work-order row's output at this n
    std::vector<float> lean_ref;   // the kMmqLean row's output at this n (kMmqLean2 must equal it)
    std::vector<float> streamed_ref;  // the first kStreamed row's output at this n (kWgmma within f32 order of it)
    std::vector<float> wgmma_ref;     // the first kWgmma row's output at this n (the other wgmma kernels equal it)
    for (const Variant& v : grouped) {
      if (!selected(v.name)) continue;
      absl::StatusOr<ExpertPrefillRunner> runner = ExpertPrefillRunner::Create(shape, n * kK, v.options);
      BENCH_OK(runner.status());
      double host_ms = 0;
      const double ms = TimeRuns(*runner, *plan, x, partial, &host_ms);
      if (ms < 0) continue;
      report(v.name, ms, runner->last_tile_rows());
      std::printf("prefill n=%-5lld %s: host time of Run %.3f ms\n", static_cast<long long>(n), v.name, host_ms);
      if (v.options.work_order.has_value()) {
        // The work orders must not change a bit: compare with the first order row of this n.
        const size_t count = static_cast<size_t>(n * kK * kH);
        std::vector<float> got(count);
        BENCH_CHECK(cudaMemcpy(got.data(), partial, count * sizeof(float), cudaMemcpyDeviceToHost));
        if (order_ref.empty()) {
          order_ref = std::move(got);
        } else {
          std::printf("prefill n=%-5lld %s: bits %s the first order row's\n", static_cast<long long>(n), v.name,
                      std::memcmp(got.data(), order_ref.data(), count * sizeof(float)) == 0 ? "EQUAL to" : "DIFFER from");
        }
      }
      if (v.options.streamed_kernel == PrefillKernel::kMmqLean || v.options.streamed_kernel == PrefillKernel::kMmqLean2) {
        const size_t count = static_cast<size_t>(n * kK * kH);
        std::vector<float> got(count);
        BENCH_CHECK(cudaMemcpy(got.data(), partial, count * sizeof(float), cudaMemcpyDeviceToHost));
        if (v.options.streamed_kernel == PrefillKernel::kMmqLean) {
          lean_ref = std::move(got);
        } else if (!lean_ref.empty()) {
          std::printf("prefill n=%-5lld %s: bits %s the mmq lean row's\n", static_cast<long long>(n), v.name,
                      std::memcmp(got.data(), lean_ref.data(), count * sizeof(float)) == 0 ? "EQUAL to" : "DIFFER from");
        }
      }
      const bool automatic = v.options.streamed_kernel == PrefillKernel::kStreamedAuto;
      if (automatic) {
        std::printf("prefill n=%-5lld %s: ran %s\n", static_cast<long long>(n), v.name,
                    KernelName(runner->last_kernel()));
      }
      const bool wgmma = IsWgmmaKernel(automatic ? runner->last_kernel() : v.options.streamed_kernel);
      if ((v.options.streamed_kernel == PrefillKernel::kStreamed && streamed_ref.empty()) || wgmma) {
        // The wgmma kernels against kStreamed at every n (8192 too: the only check of real
        // 8192-token routing), and against the first kWgmma row (kWgmmaWs, the default's choice too:
        // the same bits).
        const size_t count = static_cast<size_t>(n * kK * kH);
        std::vector<float> got(count);
        BENCH_CHECK(cudaMemcpy(got.data(), partial, count * sizeof(float), cudaMemcpyDeviceToHost));
        if (v.options.streamed_kernel == PrefillKernel::kWgmma && wgmma_ref.empty()) {
          wgmma_ref = got;
        } else if (wgmma && !wgmma_ref.empty()) {
          std::printf("prefill n=%-5lld %s (%s): bits %s the first wgmma row's\n", static_cast<long long>(n), v.name,
                      KernelName(runner->last_kernel()),
                      std::memcmp(got.data(), wgmma_ref.data(), count * sizeof(float)) == 0 ? "EQUAL to" : "DIFFER from");
        }
        if (v.options.streamed_kernel == PrefillKernel::kStreamed) {
          streamed_ref = std::move(got);
        } else if (!streamed_ref.empty()) {
          std::printf("prefill n=%-5lld %s vs streamed 64: relative L2 %.2e\n", static_cast<long long>(n), v.name,
                      RelativeL2(got, streamed_ref));
        }
      }
      if (n > 2048) continue;  // the L2 check copies 1.3 GB at 8192 tokens: only the smaller steps
      if (v.options.tile_rows == 0 || v.options.streamed_kernel == PrefillKernel::kStreamedRows ||
          v.options.streamed_kernel == PrefillKernel::kMmq || v.options.streamed_kernel == PrefillKernel::kMmqWarps16 ||
          v.options.streamed_kernel == PrefillKernel::kMmqWarps4 || v.options.streamed_kernel == PrefillKernel::kMmqHiOnly ||
          v.options.streamed_kernel == PrefillKernel::kMmqF32Min || v.options.streamed_kernel == PrefillKernel::kMmqL2Prefetch ||
          v.options.streamed_kernel == PrefillKernel::kMmqLean || v.options.streamed_kernel == PrefillKernel::kMmqLeanWarps8 ||
          v.options.streamed_kernel == PrefillKernel::kMmqLean2) {
        const size_t count = static_cast<size_t>(n * kK * kH);
        std::vector<float> got(count), ref(count);
        BENCH_CHECK(cudaMemcpy(got.data(), partial, count * sizeof(float), cudaMemcpyDeviceToHost));
        BENCH_CHECK(cudaMemcpy(ref.data(), partial_ref, count * sizeof(float), cudaMemcpyDeviceToHost));
        std::printf("prefill n=%-5lld %s vs cublas: relative L2 %.2e\n", static_cast<long long>(n), v.name,
                    RelativeL2(got, ref));
      }
    }
  }
  BENCH_CHECK(cudaFree(weights));
  BENCH_CHECK(cudaFree(x));
  BENCH_CHECK(cudaFree(partial));
  BENCH_CHECK(cudaFree(partial_ref));
  return 0;
}

}  // namespace
}  // namespace tandem::cuda

int main(int argc, char** argv) { return tandem::cuda::Main(argc, argv); }
