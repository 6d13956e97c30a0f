// Micro-benchmarks of the dense CUDA kernels on q3n-80b-like shapes: achieved bandwidth of the
// decode matvec per weight type (the streaming kernel against the previous dispatch, same run)
// against a measured device copy, Q8_0 against the uploaded Q8_0x8 layout, the prefill GEMM's rate,
// decode and prefill attention, the GDN scan and sampling. --matvec-only: the launch floor and the
// decode matvec alone; --q8-only: the Q8 layouts alone; --decode-only: the Q6_K LM head's kernels
// alone; --gemm-only: the prefill products alone
// (tiled against prepared weights per layer shape); --matvec-probe: the phase stamps of the batch-1
// streaming products inside a PDL chain alone (matvec_probe_bench.cc); --cold-read: HBM reads of a
// product's size on a cold L2 by access order and page recency alone (cold_read_bench.cu);
// prefill_stages_bench has the fast-prefill
// stages' products; the decode matvec cases live in decode_matvec_bench.cc. Prints one line per case ("name: value unit, detail") and, with --json=PATH,
// writes the same numbers as JSON. Timing: CUDA events around `reps` launches after warm-up,
// median of 5 such rounds. Weights hold random bytes (never zeros).
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "gpu_service/backends/cuda/kernels/attention.cuh"
#include "gpu_service/backends/cuda/kernels/dense_matvec.cuh"
#include "gpu_service/backends/cuda/kernels/gdn.cuh"
#include "gpu_service/backends/cuda/kernels/gemm.cuh"
#include "gpu_service/backends/cuda/kernels/gemm_plan.h"
#include "gpu_service/backends/cuda/kernels/sampling_plan.h"
#include "tests/gpu/bench_util.h"
#include "tests/gpu/decode_matvec_bench.h"

namespace tandem::cuda {
namespace {

using bench::GraphUs;
using bench::RandomDevice;
using bench::RandomQ8_0Device;
using bench::RandomFloats;
using bench::Report;

// Median milliseconds per call of fn (three untimed calls first).
double TimeMs(const std::function<void()>& fn, int reps = 20) { return bench::TimeMs(fn, reps, /*warmup=*/3); }

double BenchCopy() {
  const size_t bytes = 2ull << 30;
  void *a, *b;
  BENCH_CHECK(cudaMalloc(&a, bytes));
  BENCH_CHECK(cudaMalloc(&b, bytes));
  BENCH_CHECK(cudaMemset(a, 0x5A, bytes));
  const double ms = TimeMs([&] { BENCH_CHECK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice)); }, 5);
  const double gbs = 2.0 * bytes / (ms * 1e6);
  Report("copy_d2d_2GiB", gbs, "GB/s", "read+write bytes / time: the HBM ceiling");
  cudaFree(a);
  cudaFree(b);
  return gbs;
}

void BenchGemm() {
  const int64_t n = 4096, cols = 2048, rows = 8192;
  const int64_t row_bytes = cols / 256 * 144;
  void* w = RandomDevice(static_cast<size_t>(rows * row_bytes), 21);
  // Random bytes may hold f16 NaN/inf scales; zero the top exponent bits of d and dmin so that the
  // tile holds finite values (the rate does not depend on them, but NaN paths might).
  std::vector<uint8_t> host(static_cast<size_t>(rows * row_bytes));
  BENCH_CHECK(cudaMemcpy(host.data(), w, host.size(), cudaMemcpyDeviceToHost));
  for (size_t b = 0; b < host.size(); b += 144) {
    host[b + 1] &= 0x3B;
    host[b + 3] &= 0x3B;
  }
  BENCH_CHECK(cudaMemcpy(w, host.data(), host.size(), cudaMemcpyHostToDevice));
  const DeviceMatrix m{kTypeQ4_K, w, cols, rows, row_bytes};
  float* x = RandomFloats(static_cast<size_t>(n * cols), 22);
  float* y;
  BENCH_CHECK(cudaMalloc(&y, n * rows * sizeof(float)));
  for (GemmMode mode : {GemmMode::kFast, GemmMode::kExact}) {
    DenseGemmOptions o;
    o.split_f8 = false;  // the three f16 products: these rows are the historical split baseline
    o.mode = mode;
    o.max_n = n;
    o.max_cols = cols;
    o.tile_bytes = rows * cols * 4;
    auto g = DenseGemm::Create(o);
    if (!g.ok()) {
      std::fprintf(stderr, "gemm create: %s\n", g.status().ToString().c_str());
      std::exit(1);
    }
    const double ms = TimeMs([&] {
      absl::Status s = (*g)->Run(m, x, n, y, nullptr);
      if (!s.ok()) {
        std::fprintf(stderr, "gemm: %s\n", s.ToString().c_str());
        std::exit(1);
      }
    }, 5);
    const double tflops = 2.0 * n * cols * rows / (ms * 1e9);
    char detail[200];
    std::snprintf(detail, sizeof(detail), "q4_K %lldx%lld weights, %lld rows, %.2f ms incl. dequant", (long long)rows,
                  (long long)cols, (long long)n, ms);
    Report(mode == GemmMode::kFast ? "gemm_fast_bf16_q4K_n4096" : "gemm_exact_f32_q4K_n4096", tflops, "TFLOP/s",
           detail);
  }
  cudaFree(w);
  cudaFree(x);
  cudaFree(y);
}

// The dense prefill products of q3n-80b (Q8_0 weights; the router in f32) at 512, 2048 and 8192
// tokens: DenseGemm as it was (tiled: the weights dequantized on every call) against the prepared
// copies (DenseGemm::Prepare), for the split (three f16 terms: one product over [hi | lo | hi]
// rows, or two over [hi | lo]) and the single f16 product; plus the f16 activation conversion
// alone and cuBLAS's own rate on plain f16 operands of the shape (K = cols, and K = 3 · cols as
// the one-product split runs it). Microseconds per call, including the activation conversion.
void BenchDenseShapes() {
  struct Shape {
    const char* name;
    int64_t cols, rows;
    uint32_t type;
  };
  const Shape shapes[] = {{"gdn_qkv", 2048, 12288, kTypeQ8_0}, {"gdn_z", 2048, 4096, kTypeQ8_0},
                          {"gdn_ba", 2048, 64, kTypeQ8_0},     {"out_o", 4096, 2048, kTypeQ8_0},
                          {"attn_q", 2048, 8192, kTypeQ8_0},   {"attn_kv", 2048, 512, kTypeQ8_0},
                          {"router_f32", 2048, 512, kTypeF32}};
  const int64_t max_n = 8192, max_cols = 4096, max_rows = 12288;
  auto make_gemm = [&](GemmMode mode, bool one_product) {
    DenseGemmOptions o;
    o.split_f8 = false;  // the three f16 products: these rows are the historical split baseline
    o.mode = mode;
    o.max_n = max_n;
    o.max_cols = max_cols;
    o.tile_bytes = 128ll << 20;  // as the backend sizes it
    o.split_one_product = one_product;
    auto g = DenseGemm::Create(o);
    if (!g.ok()) {
      std::fprintf(stderr, "gemm create: %s\n", g.status().ToString().c_str());
      std::exit(1);
    }
    return *std::move(g);
  };
  // tiled: never prepared; split1 / split2 / fast: every matrix prepared for their mode.
  auto tiled = make_gemm(GemmMode::kFastSplit, true);
  auto split1 = make_gemm(GemmMode::kFastSplit, true);
  auto split2 = make_gemm(GemmMode::kFastSplit, false);
  auto fast = make_gemm(GemmMode::kFast, true);
  float* x = RandomFloats(static_cast<size_t>(max_n * max_cols), 61);
  float* y;
  BENCH_CHECK(cudaMalloc(&y, static_cast<size_t>(max_n * max_rows) * sizeof(float)));
  // Plain f16 operands for cuBLAS alone (finite values: the top exponent bit of each half cleared).
  void* w16 = RandomDevice(static_cast<size_t>(max_rows * 3 * max_cols * 2), 62, 0xBFFFBFFFBFFFBFFFull);
  void* x16 = RandomDevice(static_cast<size_t>(max_n * 3 * max_cols * 2), 63, 0xBFFFBFFFBFFFBFFFull);
  cublasHandle_t handle;
  if (cublasCreate(&handle) != CUBLAS_STATUS_SUCCESS) std::exit(1);
  void* ws;
  BENCH_CHECK(cudaMalloc(&ws, 32 << 20));
  if (cublasSetWorkspace(handle, ws, 32 << 20) != CUBLAS_STATUS_SUCCESS) std::exit(1);
  auto raw = [&](int64_t rows, int64_t n, int64_t k) {
    const float alpha = 1.0f, beta = 0.0f;
    if (cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(rows), static_cast<int>(n),
                     static_cast<int>(k), &alpha, w16, CUDA_R_16F, static_cast<int>(k), x16, CUDA_R_16F,
                     static_cast<int>(k), &beta, y, CUDA_R_32F, static_cast<int>(rows), CUBLAS_COMPUTE_32F,
                     CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS) {
      std::fprintf(stderr, "cublasGemmEx failed\n");
      std::exit(1);
    }
  };
  for (const Shape& sh : shapes) {
    const bool f32 = sh.type == kTypeF32;
    const int64_t row_bytes = f32 ? sh.cols * 4 : sh.cols / 32 * 34;
    void* w;
    if (f32) {
      w = RandomFloats(static_cast<size_t>(sh.rows * sh.cols), 64);
      std::vector<float> host(static_cast<size_t>(sh.rows * sh.cols));
      BENCH_CHECK(cudaMemcpy(host.data(), w, host.size() * 4, cudaMemcpyDeviceToHost));
      for (float& v : host) v *= 0.05f;  // router-like magnitudes
      BENCH_CHECK(cudaMemcpy(w, host.data(), host.size() * 4, cudaMemcpyHostToDevice));
    } else {
      w = RandomQ8_0Device(sh.rows, sh.cols, 65);
    }
    const DeviceMatrix m{sh.type, w, sh.cols, sh.rows, row_bytes};
    BENCH_OK(split1->Prepare(m));
    BENCH_OK(split2->Prepare(m));
    BENCH_OK(fast->Prepare(m));
    for (int64_t n : {512, 2048, 8192}) {
      auto run = [&](DenseGemm& g, GemmMode mode) {
        return TimeMs([&] { BENCH_OK(g.Run(m, x, n, y, nullptr, mode)); }, 10) * 1e3;
      };
      const double tiled_split = run(*tiled, GemmMode::kFastSplit);
      const double one = run(*split1, GemmMode::kFastSplit);
      const double two = run(*split2, GemmMode::kFastSplit);
      const double tiled_fast = run(*tiled, GemmMode::kFast);
      const double prepared_fast = run(*fast, GemmMode::kFast);
      const double convert = TimeMs([&] {
        BENCH_CHECK(LaunchF32ToF16SplitRows(x, n, sh.cols, static_cast<uint16_t*>(x16), nullptr));
      }, 10) * 1e3;
      const double raw1 = TimeMs([&] { raw(sh.rows, n, sh.cols); }, 10) * 1e3;
      const double raw3 = TimeMs([&] { raw(sh.rows, n, 3 * sh.cols); }, 10) * 1e3;
      const double flop = 2.0 * n * sh.cols * sh.rows;
      char detail[400];
      std::snprintf(detail, sizeof(detail),
                    "%lld -> %lld %s: split prepared one product %.1f us, two products %.1f us, before (tiled) "
                    "%.1f us; split activation rows alone %.1f us; cuBLAS alone K=3*cols %.1f us (%.0f TFLOP/s)",
                    (long long)sh.cols, (long long)sh.rows, f32 ? "f32" : "q8_0", one, two, tiled_split, convert,
                    raw3, 3 * flop / (raw3 * 1e6));
      Report(std::string("dense_split_") + sh.name + "_n" + std::to_string(n), tiled_split / one, "x", detail);
      std::snprintf(detail, sizeof(detail),
                    "single f16 product: prepared %.1f us, before (tiled) %.1f us; cuBLAS alone K=cols %.1f us "
                    "(%.0f TFLOP/s)",
                    prepared_fast, tiled_fast, raw1, flop / (raw1 * 1e6));
      Report(std::string("dense_fast_") + sh.name + "_n" + std::to_string(n), flop / (raw1 * 1e6), "TFLOP/s",
             detail);
    }
    BENCH_CHECK(cudaFree(w));
  }
  std::printf("prepared bytes: split one product %lld, two products %lld, fast %lld\n",
              (long long)split1->prepared_bytes(), (long long)split2->prepared_bytes(),
              (long long)fast->prepared_bytes());
  cublasDestroy(handle);
  cudaFree(ws);
  cudaFree(w16);
  cudaFree(x16);
  cudaFree(x);
  cudaFree(y);
}

void BenchAttention(double copy_gbs) {
  const AttnShape d{16, 2, 256, 64, 1e-6f};
  const int kvw = d.kv_width();
  const int ctx = 32768, pages = ctx / kKvPageSize;
  float* kc = RandomFloats(static_cast<size_t>(pages) * kKvPageSize * kvw, 31);
  float* vc = RandomFloats(static_cast<size_t>(pages) * kKvPageSize * kvw, 32);
  std::vector<int32_t> table(pages);
  for (int i = 0; i < pages; ++i) table[i] = (i * 7919) % pages;  // scattered pages
  int32_t* d_table;
  BENCH_CHECK(cudaMalloc(&d_table, pages * 4));
  BENCH_CHECK(cudaMemcpy(d_table, table.data(), pages * 4, cudaMemcpyHostToDevice));
  const PagedKv cache{kc, vc, d_table, pages};
  const int n_max = 4096;
  float* q = RandomFloats(static_cast<size_t>(n_max) * d.nh * d.hd, 33);
  float* qg = RandomFloats(static_cast<size_t>(n_max) * d.nh * 2 * d.hd, 34);
  float* o;
  BENCH_CHECK(cudaMalloc(&o, static_cast<size_t>(n_max) * d.nh * d.hd * 4));
  int32_t *d_seq, *d_pos, *d_items;
  BENCH_CHECK(cudaMalloc(&d_seq, n_max * 4));
  BENCH_CHECK(cudaMalloc(&d_pos, n_max * 4));
  BENCH_CHECK(cudaMalloc(&d_items, 2 * n_max * 4));
  auto run = [&](int n, int first_pos) {
    std::vector<int32_t> seq(n, 0), pos(n);
    for (int i = 0; i < n; ++i) pos[i] = first_pos + i;
    const std::vector<int32_t> items = PlanAttentionItems(seq, d.nh / d.kvh);
    BENCH_CHECK(cudaMemcpy(d_seq, seq.data(), n * 4, cudaMemcpyHostToDevice));
    BENCH_CHECK(cudaMemcpy(d_pos, pos.data(), n * 4, cudaMemcpyHostToDevice));
    BENCH_CHECK(cudaMemcpy(d_items, items.data(), items.size() * 4, cudaMemcpyHostToDevice));
    const int num_items = static_cast<int>(items.size() / 2);
    return TimeMs([&] {
      BENCH_CHECK(LaunchAttention(q, qg, n, d, d_items, num_items, d_seq, d_pos, cache, o, nullptr));
    }, n > 1 ? 3 : 20);
  };
  for (int c : {4096, 32768}) {
    const double ms = run(1, c - 1);
    const double bytes = 2.0 * c * kvw * 4;
    char detail[160];
    std::snprintf(detail, sizeof(detail), "nh16 kvh2 hd256 f32 cache, ctx %d: %.1f us, %.0f%% of copy", c, ms * 1e3,
                  100.0 * bytes / (ms * 1e6) / copy_gbs);
    Report("attn_decode_ctx" + std::to_string(c), bytes / (ms * 1e6), "GB/s", detail);
  }
  {
    const int n = 4096;
    const double ms = run(n, 0);
    const double flops = 2.0 * 2.0 * d.nh * d.hd * (static_cast<double>(n) * (n + 1) / 2);
    char detail[160];
    std::snprintf(detail, sizeof(detail), "causal prefill of %d tokens, f32 CUDA cores: %.2f ms", n, ms);
    Report("attn_prefill_n4096", flops / (ms * 1e9), "TFLOP/s", detail);
  }
  cudaFree(kc);
  cudaFree(vc);
  cudaFree(q);
  cudaFree(qg);
  cudaFree(o);
  cudaFree(d_table);
  cudaFree(d_seq);
  cudaFree(d_pos);
  cudaFree(d_items);
}

void BenchGdn() {
  const GdnShape d{16, 32, 128, 128, 4};
  const int n_max = 4096;
  float* conv = RandomFloats(static_cast<size_t>(n_max) * d.c_dim(), 41);
  float* g = RandomFloats(static_cast<size_t>(n_max) * d.nv, 42);
  float* beta = RandomFloats(static_cast<size_t>(n_max) * d.nv, 43);
  float* state = RandomFloats(static_cast<size_t>(d.nv) * d.dk * d.dv, 44);
  float* o;
  BENCH_CHECK(cudaMalloc(&o, static_cast<size_t>(n_max) * d.nv * d.dv * 4));
  // Keep the decay bounded: g in [-1, 0), beta in [0, 1).
  for (int n : {1, 4096}) {
    const double ms = TimeMs([&] { BENCH_CHECK(LaunchGdnRecurrent(conv, g, beta, n, d, state, o, nullptr)); },
                             n > 1 ? 3 : 50);
    char detail[160];
    std::snprintf(detail, sizeof(detail), "nv32 dk=dv=128, %d token(s): %.1f us (state 2 MiB read+written)", n,
                  ms * 1e3);
    Report("gdn_recurrent_n" + std::to_string(n), ms * 1e3, "us", detail);
  }
  cudaFree(conv);
  cudaFree(g);
  cudaFree(beta);
  cudaFree(state);
  cudaFree(o);
}

void BenchSampling() {
  const int vocab = 151936;
  for (int rows : {1, 32}) {
    float* logits = RandomFloats(static_cast<size_t>(rows) * vocab, 51);
    auto s = GpuSampler::Create(rows, vocab);
    if (!s.ok()) std::exit(1);
    std::vector<SamplingRowParams> params(rows, SamplingRowParams{0.8f, 40, 0.95f, 0.0f, 0.37});
    SamplingRowParams* d_params;
    int32_t* tokens;
    BENCH_CHECK(cudaMalloc(&d_params, rows * sizeof(SamplingRowParams)));
    BENCH_CHECK(cudaMalloc(&tokens, rows * 4));
    BENCH_CHECK(cudaMemcpy(d_params, params.data(), rows * sizeof(SamplingRowParams), cudaMemcpyHostToDevice));
    const double greedy = TimeMs([&] { (void)(*s)->Greedy(logits, rows, tokens, nullptr); });
    const double sample = TimeMs([&] { (void)(*s)->Sample(logits, rows, d_params, tokens, nullptr); });
    Report("sample_greedy_rows" + std::to_string(rows), greedy * 1e3, "us", "argmax over 151936");
    Report("sample_topk_topp_rows" + std::to_string(rows), sample * 1e3, "us", "segmented radix sort + select");
    cudaFree(logits);
    cudaFree(d_params);
    cudaFree(tokens);
  }
}

}  // namespace
}  // namespace tandem::cuda

int main(int argc, char** argv) {
  using namespace tandem::cuda;
  std::string json;
  bool matvec_only = false;  // --matvec-only: the copy ceiling and the decode matvec cases
  bool gemm_only = false;    // --gemm-only: the prefill GEMM cases alone
  bool q8_only = false;      // --q8-only: the copy ceiling and Q8_0 against Q8_0x8 (BenchQ8Layouts)
  bool decode_only = false;  // --decode-only: the copy ceiling and the Q6_K head
  bool probe_only = false;   // --matvec-probe: BenchMatVecProbe alone
  bool cold_read = false;    // --cold-read: BenchColdRead alone
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--json=", 7) == 0) json = argv[i] + 7;
    if (std::strcmp(argv[i], "--matvec-only") == 0) matvec_only = true;
    if (std::strcmp(argv[i], "--gemm-only") == 0) gemm_only = true;
    if (std::strcmp(argv[i], "--q8-only") == 0) q8_only = true;
    if (std::strcmp(argv[i], "--decode-only") == 0) decode_only = true;
    if (std::strcmp(argv[i], "--matvec-probe") == 0) probe_only = true;
    if (std::strcmp(argv[i], "--cold-read") == 0) cold_read = true;
  }
  if (!tandem::bench::PrintDevice()) {
    std::fprintf(stderr, "gpu_kernels_bench: no CUDA device\n");
    return 1;
  }
  if (probe_only) {
    BenchMatVecProbe();
    return 0;
  }
  if (cold_read) {
    BenchColdRead();
    tandem::bench::WriteJson(json);
    return 0;
  }
  if (gemm_only) {
    BenchGemm();
    BenchDenseShapes();
  }
  const double copy = gemm_only ? 0.0 : BenchCopy();
  if (decode_only) {
    BenchQ6Head(copy);
    tandem::bench::WriteJson(json);
    return 0;
  }
  if (q8_only) {
    BenchQ8Layouts(copy);
    tandem::bench::WriteJson(json);
    return 0;
  }
  if (!gemm_only) {
    BenchLaunchFloor();
    BenchMatVec(copy);
    BenchQ8Layouts(copy);
    BenchQ6Head(copy);
  }
  if (!matvec_only && !gemm_only) {
    BenchGemm();
    BenchDenseShapes();
    BenchAttention(copy);
    BenchGdn();
    BenchSampling();
  }
  tandem::bench::WriteJson(json);
  return 0;
}
