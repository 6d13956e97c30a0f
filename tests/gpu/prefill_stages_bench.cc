// The fast-prefill stages' dense products on q3n-80b shapes, old path against new, at 512 and 8192
// tokens (BenchPrefillStages: one f16 conversion of the input shared by the products that read
// it, the shared expert's stacked [gate; up; gate logit] product, the gated norm writing the output
// product's f16 rows), and cuBLAS's default algorithm for the split product against every one
// cuBLASLt offers (BenchSplitAlgorithms). Prints one line per case and, with --json=PATH, writes
// JSON. Weights hold random bytes (never zeros).
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "gpu_service/backends/cuda/kernels/gdn.cuh"
#include "gpu_service/backends/cuda/kernels/gemm.cuh"
#include "gpu_service/backends/cuda/kernels/gemm_plan.h"
#include "gpu_service/backends/cuda/kernels/norm_streams.cuh"
#include "gpu_service/backends/cuda/moe/expert_prefill.cuh"
#include "tests/gpu/bench_util.h"

namespace tandem::cuda {
namespace {

using bench::RandomDevice;
using bench::RandomQ8_0Device;
using bench::RandomFloats;
using bench::Report;

double TimeMs(const std::function<void()>& fn, int reps = 20) { return bench::TimeMs(fn, reps, /*warmup=*/3); }

// cuBLAS's choice for the split product (f16 operands, K = 3 · cols, f32 output, TN) against
// every algorithm cuBLASLt's heuristic offers (up to 16), timed: whether the default leaves speed
// on the table for these shapes (an autotuned algorithm per shape would be the next step).
void BenchSplitAlgorithms() {
  struct Shape {
    const char* name;
    int64_t rows, cols, n;
  };
  const Shape shapes[] = {{"qkv", 8192, 2048, 8192}, {"z", 4096, 2048, 8192},   {"out", 2048, 4096, 8192},
                          {"shared_gu", 1032, 2048, 8192}, {"shared_down", 2048, 512, 8192},
                          {"qkv", 8192, 2048, 512}, {"shared_gu", 1032, 2048, 512}};
  cublasLtHandle_t lt;
  if (cublasLtCreate(&lt) != CUBLAS_STATUS_SUCCESS) std::exit(1);
  cublasHandle_t handle;
  if (cublasCreate(&handle) != CUBLAS_STATUS_SUCCESS) std::exit(1);
  const size_t ws_bytes = 32 << 20;
  void* ws;
  BENCH_CHECK(cudaMalloc(&ws, ws_bytes));
  if (cublasSetWorkspace(handle, ws, ws_bytes) != CUBLAS_STATUS_SUCCESS) std::exit(1);
  void* a = RandomDevice(static_cast<size_t>(8192) * 3 * 4096 * 2, 91, 0xBFFFBFFFBFFFBFFFull);
  void* b = RandomDevice(static_cast<size_t>(8192) * 3 * 4096 * 2, 92, 0xBFFFBFFFBFFFBFFFull);
  float* c;
  BENCH_CHECK(cudaMalloc(&c, static_cast<size_t>(8192) * 8192 * 4));
  for (const Shape& sh : shapes) {
    const int64_t k = 3 * sh.cols;
    const float alpha = 1.0f, beta = 0.0f;
    const double def_us = TimeMs([&] {
      if (cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(sh.rows), static_cast<int>(sh.n),
                       static_cast<int>(k), &alpha, a, CUDA_R_16F, static_cast<int>(k), b, CUDA_R_16F,
                       static_cast<int>(k), &beta, c, CUDA_R_32F, static_cast<int>(sh.rows), CUBLAS_COMPUTE_32F,
                       CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS) {
        std::exit(1);
      }
    }, 10) * 1e3;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    bool ok = cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS &&
              cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)) == CUBLAS_STATUS_SUCCESS &&
              cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)) == CUBLAS_STATUS_SUCCESS &&
              cublasLtMatrixLayoutCreate(&la, CUDA_R_16F, k, sh.rows, k) == CUBLAS_STATUS_SUCCESS &&
              cublasLtMatrixLayoutCreate(&lb, CUDA_R_16F, k, sh.n, k) == CUBLAS_STATUS_SUCCESS &&
              cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, sh.rows, sh.n, sh.rows) == CUBLAS_STATUS_SUCCESS;
    cublasLtMatmulPreference_t pref;
    ok = ok && cublasLtMatmulPreferenceCreate(&pref) == CUBLAS_STATUS_SUCCESS &&
         cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                              sizeof(ws_bytes)) == CUBLAS_STATUS_SUCCESS;
    cublasLtMatmulHeuristicResult_t results[16];
    int found = 0;
    ok = ok && cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, lc, lc, pref, 16, results, &found) ==
                   CUBLAS_STATUS_SUCCESS;
    if (!ok) {
      std::printf("split_algorithms %s: cuBLASLt setup failed\n", sh.name);
      continue;
    }
    double best = 1e30, first = 0;
    int best_i = -1;
    for (int i = 0; i < found; ++i) {
      bool failed = false;
      const double us = TimeMs([&] {
        if (cublasLtMatmul(lt, op, &alpha, a, la, b, lb, &beta, c, lc, c, lc, &results[i].algo, ws, ws_bytes,
                           nullptr) != CUBLAS_STATUS_SUCCESS) {
          failed = true;
        }
      }, 10) * 1e3;
      if (failed) continue;
      if (i == 0) first = us;
      if (us < best) best = us, best_i = i;
    }
    const double flop = 2.0 * sh.rows * sh.n * k;
    char detail[300];
    std::snprintf(detail, sizeof(detail),
                  "M=%lld N=%lld K=%lld: cublasGemmEx default %.1f us (%.0f TFLOP/s), Lt heuristic #0 %.1f us, best of "
                  "%d: #%d %.1f us (%.0f TFLOP/s)",
                  (long long)sh.rows, (long long)sh.n, (long long)k, def_us, flop / (def_us * 1e6), first, found,
                  best_i, best, flop / (best * 1e6));
    Report(std::string("split_algorithms_") + sh.name + "_n" + std::to_string(sh.n), def_us / best, "x", detail);
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatmulDescDestroy(op);
  }
  cublasLtDestroy(lt);
  cublasDestroy(handle);
  for (void* p : {a, b, static_cast<void*>(c), ws}) BENCH_CHECK(cudaFree(p));
}

// The prefill stages' dense products of q3n-80b at 512 and 8192 tokens, as the backend ran them
// (old: every product converts its f32 input to f16 split rows itself; the shared expert
// as gate, up, f32 SiLU·up, down and the gate logit, five conversions) against the new path (one
// conversion per input: DenseGemm::ConvertInput / RunInput; the shared expert's gate, up and gate
// logit as one stacked GEMM, SiLU written straight as the down product's f16 rows). All in the
// split mode (three f16 terms). Microseconds per stage; the floor is 3 × FLOPs at 800 TFLOP/s.
void BenchPrefillStages() {
  const int64_t max_n = 8192, max_cols = 4096;
  auto make_gemm = [&] {
    DenseGemmOptions o;
    o.split_f8 = false;  // the three f16 products: these rows are the historical split baseline
    o.mode = GemmMode::kFastSplit;
    o.max_n = max_n;
    o.max_cols = max_cols;
    o.tile_bytes = 128ll << 20;
    auto g = DenseGemm::Create(o);
    if (!g.ok()) {
      std::fprintf(stderr, "gemm create: %s\n", g.status().ToString().c_str());
      std::exit(1);
    }
    return *std::move(g);
  };
  auto old_g = make_gemm();
  auto new_g = make_gemm();
  std::vector<void*> owned;
  auto q8 = [&](int64_t cols, int64_t rows, uint64_t seed) {
    void* w = RandomQ8_0Device(rows, cols, seed);
    owned.push_back(w);
    return DeviceMatrix{kTypeQ8_0, w, cols, rows, cols / 32 * 34};
  };
  const DeviceMatrix qkv = q8(2048, 8192, 71), z = q8(2048, 4096, 72), ba = q8(2048, 64, 73);
  const DeviceMatrix ssm_out = q8(4096, 2048, 74);
  const DeviceMatrix q = q8(2048, 8192, 75), k = q8(2048, 512, 76), v = q8(2048, 512, 77), o = q8(4096, 2048, 78);
  const DeviceMatrix gate = q8(2048, 512, 79), up = q8(2048, 512, 80), down = q8(512, 2048, 81);
  float* gate_inp_w = RandomFloats(2048, 82);
  std::vector<float> gi(2048);
  BENCH_CHECK(cudaMemcpy(gi.data(), gate_inp_w, 2048 * 4, cudaMemcpyDeviceToHost));
  for (float& f : gi) f *= 0.05f;
  BENCH_CHECK(cudaMemcpy(gate_inp_w, gi.data(), 2048 * 4, cudaMemcpyHostToDevice));
  const DeviceMatrix gate_inp{kTypeF32, gate_inp_w, 2048, 1, 2048 * 4};
  for (const DeviceMatrix* m : {&qkv, &z, &ba, &ssm_out, &q, &k, &v, &o, &gate, &up, &down, &gate_inp}) {
    BENCH_OK(old_g->Prepare(*m));
  }
  const DeviceMatrix* stack[] = {&gate, &up, &gate_inp};
  absl::StatusOr<int64_t> stack_rows = new_g->PrepareStack(stack, GemmMode::kFastSplit);
  BENCH_OK(stack_rows.status());
  for (const DeviceMatrix* m : {&qkv, &z, &ba, &ssm_out, &q, &k, &v, &o, &down}) BENCH_OK(new_g->Prepare(*m));
  const int64_t R = *stack_rows;
  float* x = RandomFloats(static_cast<size_t>(max_n * max_cols), 83);
  float *y1, *y2, *y3, *gu, *act, *shared, *glog;
  for (float** p : {&y1, &y2, &y3, &gu, &act, &shared, &glog}) {
    BENCH_CHECK(cudaMalloc(p, static_cast<size_t>(max_n * 8192) * sizeof(float)));
  }
  for (int64_t n : {512, 8192}) {
    struct Stage {
      const char* name;
      double flop;  // one f16 product's
      std::function<void()> old_fn, new_fn;
    };
    auto conv = [&](const float* in, int64_t cols) {
      absl::StatusOr<DenseGemm::F16Input> c = new_g->ConvertInput(in, n, cols, GemmMode::kFastSplit, nullptr);
      BENCH_OK(c.status());
      return *c;
    };
    const std::vector<Stage> stages = {
        {"gdn_in_qkv_z_ba", 2.0 * n * 2048 * (8192 + 4096 + 64),
         [&] {
           BENCH_OK(old_g->Run(z, x, n, y2, nullptr));
           BENCH_OK(old_g->Run(ba, x, n, y3, nullptr));
           BENCH_OK(old_g->Run(qkv, x, n, y1, nullptr));
         },
         [&] {
           const DenseGemm::F16Input in = conv(x, 2048);
           BENCH_OK(new_g->RunInput(z, in, y2, nullptr));
           BENCH_OK(new_g->RunInput(ba, in, y3, nullptr));
           BENCH_OK(new_g->RunInput(qkv, in, y1, nullptr));
         }},
        {"gdn_out", 2.0 * n * 4096 * 2048, [&] { BENCH_OK(old_g->Run(ssm_out, x, n, y1, nullptr)); },
         [&] { BENCH_OK(new_g->Run(ssm_out, x, n, y1, nullptr)); }},
        {"attn_in_q_k_v", 2.0 * n * 2048 * (8192 + 1024),
         [&] {
           BENCH_OK(old_g->Run(k, x, n, y2, nullptr));
           BENCH_OK(old_g->Run(v, x, n, y3, nullptr));
           BENCH_OK(old_g->Run(q, x, n, y1, nullptr));
         },
         [&] {
           const DenseGemm::F16Input in = conv(x, 2048);
           BENCH_OK(new_g->RunInput(k, in, y2, nullptr));
           BENCH_OK(new_g->RunInput(v, in, y3, nullptr));
           BENCH_OK(new_g->RunInput(q, in, y1, nullptr));
         }},
        {"attn_o", 2.0 * n * 4096 * 2048, [&] { BENCH_OK(old_g->Run(o, x, n, y1, nullptr)); },
         [&] { BENCH_OK(new_g->Run(o, x, n, y1, nullptr)); }},
        {"shared_expert", 2.0 * n * 2048 * (512 * 3 + 1),
         [&] {
           BENCH_OK(old_g->Run(gate, x, n, y1, nullptr));
           BENCH_OK(old_g->Run(up, x, n, y2, nullptr));
           BENCH_CHECK(LaunchSiluMulF32(y1, y2, n * 512, act, nullptr));
           BENCH_OK(old_g->Run(down, act, n, shared, nullptr));
           BENCH_OK(old_g->Run(gate_inp, x, n, glog, nullptr));
         },
         [&] {
           BENCH_OK(new_g->RunStack(stack, conv(x, 2048), gu, nullptr));
           BENCH_CHECK(LaunchSiluMulToF16Rows(gu, n, R, 512, true, new_g->input_scratch(), 1024, glog, nullptr));
           BENCH_OK(new_g->RunInput(down, DenseGemm::F16Input{new_g->input_scratch(), n, 512, GemmMode::kFastSplit},
                                    shared, nullptr));
         }},
    };
    for (const Stage& st : stages) {
      const double old_us = TimeMs(st.old_fn, 10) * 1e3;
      const double new_us = TimeMs(st.new_fn, 10) * 1e3;
      const double floor_us = 3.0 * st.flop / 800e12 * 1e6;
      char detail[300];
      std::snprintf(detail, sizeof(detail),
                    "old %.1f us, new %.1f us; split floor (3 x %.1f GFLOP at 800 TFLOP/s) %.1f us, new at %.0f%% of it",
                    old_us, new_us, st.flop / 1e9, floor_us, 100.0 * floor_us / new_us);
      Report(std::string("prefill_stage_") + st.name + "_n" + std::to_string(n), old_us / new_us, "x", detail);
    }
    // The same shared expert results both ways (the stack's common scale): relative L2 of new vs old.
    stages.back().old_fn();
    std::vector<float> a(static_cast<size_t>(n * 2048)), b(a.size()), ga(static_cast<size_t>(n)), gb(ga.size());
    BENCH_CHECK(cudaMemcpy(a.data(), shared, a.size() * 4, cudaMemcpyDeviceToHost));
    BENCH_CHECK(cudaMemcpy(ga.data(), glog, ga.size() * 4, cudaMemcpyDeviceToHost));
    stages.back().new_fn();
    BENCH_CHECK(cudaMemcpy(b.data(), shared, b.size() * 4, cudaMemcpyDeviceToHost));
    BENCH_CHECK(cudaMemcpy(gb.data(), glog, gb.size() * 4, cudaMemcpyDeviceToHost));
    double num = 0, den = 0, gnum = 0, gden = 0;
    for (size_t i = 0; i < a.size(); ++i) num += (a[i] - b[i]) * (a[i] - b[i]), den += a[i] * a[i];
    for (size_t i = 0; i < ga.size(); ++i) gnum += (ga[i] - gb[i]) * (ga[i] - gb[i]), gden += ga[i] * ga[i];
    std::printf("shared expert n=%lld: new vs old relative L2 %.3e (output), %.3e (gate logit)\n", (long long)n,
                std::sqrt(num / den), std::sqrt(gnum / gden));
  }
  for (void* p : owned) BENCH_CHECK(cudaFree(p));
  for (float* p : {gate_inp_w, x, y1, y2, y3, gu, act, shared, glog}) BENCH_CHECK(cudaFree(p));
}


// The split-K number and reduction scheme of cuBLASLt's first algorithm for the split product
// (m × n, K = k), and the index of the first algorithm with one K slice: which products take the
// splitKreduce kernel at a step size (cublasGemmEx's default choice follows the same heuristic as
// far as the Nsight profiles show; the bench prints both so the next run can check).
std::string SplitKInfo(cublasLtHandle_t lt, int64_t m, int64_t n, int64_t k, size_t ws_bytes) {
  cublasLtMatmulDesc_t op;
  cublasLtMatrixLayout_t la, lb, lc;
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  bool ok = cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS &&
            cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)) == CUBLAS_STATUS_SUCCESS &&
            cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)) == CUBLAS_STATUS_SUCCESS &&
            cublasLtMatrixLayoutCreate(&la, CUDA_R_16F, k, m, k) == CUBLAS_STATUS_SUCCESS &&
            cublasLtMatrixLayoutCreate(&lb, CUDA_R_16F, k, n, k) == CUBLAS_STATUS_SUCCESS &&
            cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, m, n, m) == CUBLAS_STATUS_SUCCESS;
  cublasLtMatmulPreference_t pref;
  ok = ok && cublasLtMatmulPreferenceCreate(&pref) == CUBLAS_STATUS_SUCCESS &&
       cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                            sizeof(ws_bytes)) == CUBLAS_STATUS_SUCCESS;
  cublasLtMatmulHeuristicResult_t results[16];
  int found = 0;
  ok = ok && cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, lc, lc, pref, 16, results, &found) == CUBLAS_STATUS_SUCCESS;
  std::string out = "heuristic failed";
  if (ok && found > 0) {
    auto attr = [&](int i, cublasLtMatmulAlgoConfigAttributes_t a) {
      int32_t v = -1;
      size_t written = 0;
      cublasLtMatmulAlgoConfigGetAttribute(&results[i].algo, a, &v, sizeof(v), &written);
      return v;
    };
    int first_one = -1;
    for (int i = 0; i < found && first_one < 0; ++i) {
      if (attr(i, CUBLASLT_ALGO_CONFIG_SPLITK_NUM) <= 1) first_one = i;
    }
    out = "Lt #0 splitK " + std::to_string(attr(0, CUBLASLT_ALGO_CONFIG_SPLITK_NUM)) + " scheme " +
          std::to_string(attr(0, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME)) + ", first unsplit #" +
          std::to_string(first_one) + " of " + std::to_string(found);
  }
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(lc);
  cublasLtMatmulDescDestroy(op);
  return out;
}

// glue512 (2026-12-01; NOT yet run on a GPU when written). (1) Every prepared split product of a
// q3n-80b layer at 512 and 8192 tokens through the three GemmAlgo paths (the same prepared copies,
// one DenseGemm each), with the per-step sum (36 GDN + 12 attention layers, each with the router
// and the shared expert's stack and down product): what TANDEM_GEMM_LT / TANDEM_GEMM_NO_SPLITK
// would change. (2) The stream norm with the inject (h 2048) then F32ToF16SplitRows, against
// LaunchInjectRmsNormF16 writing both; per step the old path ran 48 mixer reads with one
// conversion and 48 MoE reads with two (router, shared expert), the new one 96 fused norms.
void BenchGlue() {
  const int64_t max_n = 8192, h = 2048;
  std::vector<void*> owned;
  auto q8 = [&](int64_t cols, int64_t rows, uint64_t seed) {
    void* w = RandomQ8_0Device(rows, cols, seed);
    owned.push_back(w);
    return DeviceMatrix{kTypeQ8_0, w, cols, rows, cols / 32 * 34};
  };
  struct Product {
    const char* name;
    DeviceMatrix w;
    int per_step;  // launches in one step of q3n-80b's 48 layers
  };
  const DeviceMatrix gate = q8(2048, 512, 109), up = q8(2048, 512, 110), gate_inp = q8(2048, 8, 111);
  const std::vector<Product> products = {
      {"gdn_qkv", q8(2048, 8192, 101), 36},  {"gdn_z", q8(2048, 4096, 102), 36},
      {"gdn_ba", q8(2048, 64, 103), 36},     {"gdn_out", q8(4096, 2048, 104), 36},
      {"attn_q", q8(2048, 8192, 105), 12},   {"attn_k", q8(2048, 512, 106), 12},
      {"attn_v", q8(2048, 512, 107), 12},    {"attn_o", q8(4096, 2048, 108), 12},
      {"router", q8(2048, 512, 112), 48},    {"shared_down", q8(512, 2048, 113), 48},
  };
  const DeviceMatrix* stack[] = {&gate, &up, &gate_inp};
  // The fourth: the split as one f16 product (cublasGemmEx) plus one fp8 correction (f8corr,
  // DenseGemmOptions::split_f8; its conversion includes the device max |x| and the fp8 rows).
  constexpr int kPaths = 4;
  const GemmAlgo algos[kPaths] = {GemmAlgo::kGemmEx, GemmAlgo::kLt, GemmAlgo::kLtNoSplitK, GemmAlgo::kGemmEx};
  const char* algo_names[kPaths] = {"gemmex", "lt", "lt_nosplitk", "f8"};
  std::unique_ptr<DenseGemm> g[kPaths];
  int64_t R = 0;
  for (int a = 0; a < kPaths; ++a) {
    DenseGemmOptions o;
    o.mode = GemmMode::kFastSplit;
    o.max_n = max_n;
    o.max_cols = 4096;
    o.tile_bytes = 128ll << 20;
    o.prepared_algo = algos[a];
    o.split_f8 = a == 3;
    o.split_f8_min_weights = 0;  // every shape in the F8 form: the per-shape column
    auto made = DenseGemm::Create(o);
    BENCH_OK(made.status());
    g[a] = *std::move(made);
    for (const Product& p : products) BENCH_OK(g[a]->Prepare(p.w));
    absl::StatusOr<int64_t> rows = g[a]->PrepareStack(stack, GemmMode::kFastSplit);
    BENCH_OK(rows.status());
    R = *rows;
  }
  cublasLtHandle_t lt;
  if (cublasLtCreate(&lt) != CUBLAS_STATUS_SUCCESS) std::exit(1);
  float* x = RandomFloats(static_cast<size_t>(max_n * 4096), 120);
  float* y;
  BENCH_CHECK(cudaMalloc(&y, static_cast<size_t>(max_n * 8192) * sizeof(float)));
  for (int64_t n : {512, 8192}) {
    double step_us[kPaths] = {0, 0, 0, 0};
    double step_hybrid_us = 0;
    auto one = [&](const char* name, int64_t m, int64_t cols, int per_step, const std::function<void(DenseGemm&)>& fn) {
      double us[kPaths];
      for (int a = 0; a < kPaths; ++a) {
        us[a] = TimeMs([&] { fn(*g[a]); }, 20) * 1e3;
        step_us[a] += per_step * us[a];
      }
      step_hybrid_us += per_step * (m * cols >= 2048 * 2048 ? us[3] : us[0]);
      char detail[300];
      std::snprintf(detail, sizeof(detail),
                    "M=%lld K=3x%lld: gemmex %.2f us, lt %.2f us, lt_nosplitk %.2f us, f8 %.2f us; %s", (long long)m,
                    (long long)cols, us[0], us[1], us[2], us[3], SplitKInfo(lt, m, n, 3 * cols, 32ull << 20).c_str());
      Report(std::string("glue_gemm_") + name + "_n" + std::to_string(n), us[0] / us[2], "x", detail);
      std::snprintf(detail, sizeof(detail), "M=%lld cols=%lld: 3 x f16 (gemmex) %.2f us, f16 + fp8 %.2f us",
                    (long long)m, (long long)cols, us[0], us[3]);
      Report(std::string("glue_gemm_f8_") + name + "_n" + std::to_string(n), us[0] / us[3], "x", detail);
    };
    for (const Product& p : products) {
      one(p.name, p.w.rows, p.w.cols, p.per_step, [&](DenseGemm& gg) {
        absl::StatusOr<DenseGemm::F16Input> in = gg.ConvertInput(x, n, p.w.cols, GemmMode::kFastSplit, nullptr);
        BENCH_OK(in.status());
        BENCH_OK(gg.RunInput(p.w, *in, y, nullptr));
      });
    }
    one("shared_stack", R, 2048, 48, [&](DenseGemm& gg) {
      absl::StatusOr<DenseGemm::F16Input> in = gg.ConvertInput(x, n, 2048, GemmMode::kFastSplit, nullptr);
      BENCH_OK(in.status());
      BENCH_OK(gg.RunStack(stack, *in, y, nullptr));
    });
    // The size threshold (DenseGemmOptions::split_f8_min_weights' default 2048 · 2048) from the same
    // timings.
    char hybrid[200];
    std::snprintf(hybrid, sizeof(hybrid),
                  "sum over one step: F8 for >= 2048 x 2048 weights, 3 x f16 below (from the columns above): %.1f us",
                  step_hybrid_us);
    Report(std::string("glue_gemm_step_f8_min_weights_n") + std::to_string(n), step_us[0] / step_hybrid_us, "x", hybrid);
    for (int a = 0; a < kPaths; ++a) {
      char detail[200];
      std::snprintf(detail, sizeof(detail), "sum over one step's dense products (conversion included): %.1f us",
                    step_us[a]);
      Report(std::string("glue_gemm_step_") + algo_names[a] + "_n" + std::to_string(n), step_us[0] / step_us[a], "x",
             detail);
    }
  }
  // (2) The norm.
  float* H0 = RandomFloats(static_cast<size_t>(max_n * h), 121);
  float* H = RandomFloats(static_cast<size_t>(max_n * h), 121);
  float* yb = RandomFloats(static_cast<size_t>(max_n * h), 122);
  float* gamma = RandomFloats(static_cast<size_t>(h), 123);
  for (int64_t n : {512, 8192}) {
    // The inject adds into H on every call: restore it between repetitions is not needed for time
    // (values stay finite over a few dozen adds of N(0, 1)).
    BENCH_CHECK(cudaMemcpy(H, H0, static_cast<size_t>(n * h) * 4, cudaMemcpyDeviceToDevice));
    uint16_t* rows = g[0]->input_scratch();
    const double norm_us = TimeMs([&] {
      BENCH_CHECK(LaunchInjectRmsNorm(H, n, 1, h, nullptr, yb, gamma, 1e-6f, x, nullptr));
    }) * 1e3;
    const double conv_us = TimeMs([&] { BENCH_CHECK(LaunchF32ToF16SplitRows(x, n, h, rows, nullptr)); }) * 1e3;
    const double fused_us = TimeMs([&] {
      BENCH_CHECK(LaunchInjectRmsNormF16(H, n, 1, h, nullptr, yb, gamma, 1e-6f, x, 3, rows, nullptr));
    }) * 1e3;
    const double old_step = 48 * (norm_us + conv_us) + 48 * (norm_us + 2 * conv_us), new_step = 96 * fused_us;
    // Bytes: the norm reads H, y and writes H, x (4 · 4 · n · h); the rows are 6 · n · h.
    const double fused_bytes = (16.0 + 6.0) * n * h;
    char detail[300];
    std::snprintf(detail, sizeof(detail),
                  "norm %.2f us + split rows %.2f us vs fused %.2f us (%.0f GB/s; floor at 4.5 TB/s %.2f us); per step "
                  "old %.0f us, new %.0f us",
                  norm_us, conv_us, fused_us, fused_bytes / (fused_us * 1e3), fused_bytes / 4.5e6, old_step, new_step);
    Report(std::string("glue_norm_f16_rows_n") + std::to_string(n), old_step / new_step, "x", detail);
  }
  cublasLtDestroy(lt);
  for (void* p : owned) BENCH_CHECK(cudaFree(p));
  for (float* p : {x, y, H0, H, yb, gamma}) BENCH_CHECK(cudaFree(p));
}

// stack (2026-12-01): the mixer's input products of one x in a q3n-80b layer as separate prepared
// split products (one conversion, then RunInput each: the backend's path before the stacks) against one
// stacked product (PrepareStack / RunStack: GDN [qkv; z; ba] M = 12352, attention [k; v] M = 1024
// plus q alone), kGemmEx, at 512 and 8192 tokens. Floor: 2·n·M·3·2048 FLOPs at ~800 TFLOP/s.
void BenchStacks() {
  const int64_t max_n = 8192, h = 2048;
  std::vector<void*> owned;
  auto q8 = [&](int64_t rows, uint64_t seed) {
    void* w = RandomQ8_0Device(rows, h, seed);
    owned.push_back(w);
    return DeviceMatrix{kTypeQ8_0, w, h, rows, h / 32 * 34};
  };
  // Two copies of each matrix (different data pointers): one prepared alone, one in the stack.
  struct Group {
    const char* name;
    std::vector<DeviceMatrix> alone, stacked, also_alone, also_stacked;  // also: q beside the [k; v] stack
    int per_step;
  };
  std::vector<Group> groups = {
      {"gdn_qkv_z_ba", {q8(8192, 201), q8(4096, 202), q8(64, 203)}, {q8(8192, 201), q8(4096, 202), q8(64, 203)}, {}, {},
       36},
      {"attn_k_v_q", {q8(512, 204), q8(512, 205)}, {q8(512, 204), q8(512, 205)}, {q8(8192, 206)}, {q8(8192, 206)}, 12},
  };
  DenseGemmOptions o;
  o.split_f8 = false;  // the three f16 products: these rows are the historical split baseline
  o.mode = GemmMode::kFastSplit;
  o.max_n = max_n;
  o.max_cols = h;
  o.tile_bytes = 128ll << 20;
  auto made = DenseGemm::Create(o);
  BENCH_OK(made.status());
  DenseGemm& g = **made;
  std::vector<std::vector<const DeviceMatrix*>> stacks;
  int64_t widest = 0;
  for (Group& gr : groups) {
    for (const DeviceMatrix& m : gr.alone) BENCH_OK(g.Prepare(m));
    for (const DeviceMatrix& m : gr.also_alone) BENCH_OK(g.Prepare(m));
    for (const DeviceMatrix& m : gr.also_stacked) BENCH_OK(g.Prepare(m));
    std::vector<const DeviceMatrix*> parts;
    for (const DeviceMatrix& m : gr.stacked) parts.push_back(&m);
    absl::StatusOr<int64_t> rows = g.PrepareStack(parts, GemmMode::kFastSplit);
    BENCH_OK(rows.status());
    widest = std::max(widest, *rows);
    stacks.push_back(parts);
  }
  float* x = RandomFloats(static_cast<size_t>(max_n * h), 220);
  float* y;
  BENCH_CHECK(cudaMalloc(&y, static_cast<size_t>(max_n * std::max<int64_t>(widest, 3 * 8192)) * sizeof(float)));
  for (int64_t n : {512, 8192}) {
    double old_step = 0, new_step = 0;
    for (size_t i = 0; i < groups.size(); ++i) {
      const Group& gr = groups[i];
      int64_t m = 0;
      for (const DeviceMatrix& w : gr.alone) m += w.rows;
      for (const DeviceMatrix& w : gr.also_alone) m += w.rows;
      const double sep_us = TimeMs([&] {
        absl::StatusOr<DenseGemm::F16Input> in = g.ConvertInput(x, n, h, GemmMode::kFastSplit, nullptr);
        BENCH_OK(in.status());
        float* out = y;
        for (const DeviceMatrix& w : gr.alone) {
          BENCH_OK(g.RunInput(w, *in, out, nullptr));
          out += n * w.rows;
        }
        for (const DeviceMatrix& w : gr.also_alone) {
          BENCH_OK(g.RunInput(w, *in, out, nullptr));
          out += n * w.rows;
        }
      }) * 1e3;
      const double stk_us = TimeMs([&] {
        absl::StatusOr<DenseGemm::F16Input> in = g.ConvertInput(x, n, h, GemmMode::kFastSplit, nullptr);
        BENCH_OK(in.status());
        BENCH_OK(g.RunStack(stacks[i], *in, y, nullptr));
        float* out = y + n * widest;
        for (const DeviceMatrix& w : gr.also_stacked) BENCH_OK(g.RunInput(w, *in, out, nullptr));
      }) * 1e3;
      // The conversion alone (both paths run it once).
      const double conv_us = TimeMs([&] { BENCH_CHECK(LaunchF32ToF16SplitRows(x, n, h, g.input_scratch(), nullptr)); }) * 1e3;
      old_step += gr.per_step * (sep_us - conv_us);
      new_step += gr.per_step * (stk_us - conv_us);
      const double floor_us = 2.0 * n * m * 3 * h / 800e12 * 1e6;
      char detail[300];
      std::snprintf(detail, sizeof(detail),
                    "M=%lld: separate %.2f us, stacked %.2f us (conversion %.2f us in both); products alone %.2f -> "
                    "%.2f us, floor %.2f us at 800 TFLOP/s",
                    (long long)m, sep_us, stk_us, conv_us, sep_us - conv_us, stk_us - conv_us, floor_us);
      Report(std::string("stack_") + gr.name + "_n" + std::to_string(n), sep_us / stk_us, "x", detail);
    }
    char detail[200];
    std::snprintf(detail, sizeof(detail), "per step (36 GDN + 12 attention layers, products only): %.1f -> %.1f us",
                  old_step, new_step);
    Report(std::string("stack_step_n") + std::to_string(n), old_step / new_step, "x", detail);
  }
  for (void* p : owned) BENCH_CHECK(cudaFree(p));
  for (float* p : {x, y}) BENCH_CHECK(cudaFree(p));
}

}  // namespace
}  // namespace tandem::cuda

int main(int argc, char** argv) {
  std::string json;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--json=", 7) == 0) json = argv[i] + 7;
  }
  if (!tandem::bench::PrintDevice()) {
    std::fprintf(stderr, "prefill_stages_bench: no CUDA device\n");
    return 1;
  }
  // --glue: only BenchGlue (glue512's A/B), the quick run; --stack: only BenchStacks.
  bool glue_only = false, stack_only = false;
  for (int i = 1; i < argc; ++i) {
    glue_only |= std::strcmp(argv[i], "--glue") == 0;
    stack_only |= std::strcmp(argv[i], "--stack") == 0;
  }
  if (stack_only) {
    tandem::cuda::BenchStacks();
    tandem::bench::WriteJson(json);
    return 0;
  }
  if (!glue_only) {
    tandem::cuda::BenchPrefillStages();
    tandem::cuda::BenchSplitAlgorithms();
  }
  tandem::cuda::BenchGlue();
  tandem::bench::WriteJson(json);
  return 0;
}
