// The decode matrix-vector part of gpu_kernels_bench (its main calls these): the launch floor,
// the decode matvec per weight type against the previous dispatch, Q8_0 against the uploaded
// Q8_0x8 layout, and the Q6_K LM head's kernels. Not a test.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "gpu_service/backends/cuda/kernels/dense_matvec.cuh"
#include "tests/gpu/bench_util.h"
#include "tests/gpu/decode_matvec_bench.h"

namespace tandem::cuda {
namespace {

using bench::GraphUs;
using bench::RandomDevice;
using bench::RandomFloats;
using bench::Report;

// Median milliseconds per call of fn (three untimed calls first).
double TimeMs(const std::function<void()>& fn, int reps = 20) { return bench::TimeMs(fn, reps, /*warmup=*/3); }

}  // namespace

// The fixed cost of one launch: a 4-byte memset, launched from the host and from a graph.
void BenchLaunchFloor() {
  void* p;
  BENCH_CHECK(cudaMalloc(&p, 4));
  const double host_us = TimeMs([&] { BENCH_CHECK(cudaMemsetAsync(p, 0, 4, bench::LaunchStream())); }, 50) * 1e3;
  const double graph_us = GraphUs([&] { BENCH_CHECK(cudaMemsetAsync(p, 0, 4, bench::LaunchStream())); });
  char detail[160];
  std::snprintf(detail, sizeof(detail), "4-byte memset back to back: %.2f us host-launched, %.2f us in a graph",
                host_us, graph_us);
  Report("launch_floor", graph_us, "us", detail);
  cudaFree(p);
}

// Decode matvec on the q3n-80b shapes, the streaming kernel (kAuto) against the previous
// dispatch (kPrevious) in the same run. Each case cycles through enough copies of the matrix
// (>= 256 MB together) that the 50 MB L2 never holds the weights between launches; bandwidth
// counts weight bytes only (activations and outputs are < 1% of them). n = 1 is also timed from a
// CUDA graph (GPU-side time without the host's launch cost). Then a sweep of the streaming
// kernel's split (warps per row) and grid (blocks per SM, 0 = one wave) on the per-layer shapes.
void BenchMatVec(double copy_gbs) {
  struct T {
    const char* name;
    uint32_t type;
    int64_t block_elems, block_bytes;
  };
  const T quant[] = {{"q8_0", kTypeQ8_0, 32, 34}, {"q6_K", kTypeQ6_K, 256, 210}, {"q5_K", kTypeQ5_K, 256, 176},
                     {"q4_K", kTypeQ4_K, 256, 144}};
  const T f32{"f32", kTypeF32, 32, 128};
  const T bf16{"bf16", kTypeBF16, 32, 64};
  struct Shape {
    int64_t cols, rows;
  };
  const Shape shapes[] = {{2048, 8192}, {2048, 4096}, {4096, 2048}, {2048, 512}, {512, 2048}, {2048, 151936}};
  float* x = RandomFloats(8 * 8192, 3);
  float* y;
  BENCH_CHECK(cudaMalloc(&y, 8 * 262144 * sizeof(float)));
  // Weights of one case: copies of the matrix cycled through by the launches.
  struct Weights {
    void* w;
    int64_t row_bytes, bytes;
    int copies;
  };
  auto make = [&](const T& t, const Shape& sh) {
    Weights k;
    k.row_bytes = sh.cols / t.block_elems * t.block_bytes;
    k.bytes = k.row_bytes * sh.rows;
    k.copies = static_cast<int>(std::min<int64_t>(512, std::max<int64_t>(1, ((256ll << 20) + k.bytes - 1) / k.bytes)));
    // f16 scales kept finite (the rate does not depend on the values; NaN paths might).
    k.w = t.type == kTypeF32 ? static_cast<void*>(RandomFloats(static_cast<size_t>(k.bytes / 4) * k.copies, 12))
                             : RandomDevice(static_cast<size_t>(k.bytes) * k.copies, 11, 0x3FFF3FFF3FFF3FFFull);
    return k;
  };
  int next = 0;
  auto launcher = [&](const T& t, const Shape& sh, const Weights& k, int n, MatVecOptions o) {
    return [&, n, o] {
      const DeviceMatrix m{t.type, static_cast<uint8_t*>(k.w) + (next++ % k.copies) * k.bytes, sh.cols, sh.rows,
                           k.row_bytes};
      BENCH_CHECK(LaunchDenseMatVec(m, x, sh.cols, n, y, sh.rows, o, bench::LaunchStream()));
    };
  };
  const MatVecOptions now{MatVecKernel::kAuto, 0, 0}, before{MatVecKernel::kPrevious, 0, 0};
  auto run_case = [&](const T& t, const Shape& sh, const std::vector<int>& ns) {
    const Weights k = make(t, sh);
    for (int n : ns) {
      const double ms = TimeMs(launcher(t, sh, k, n, now), 50);
      const double ms_before = TimeMs(launcher(t, sh, k, n, before), 50);
      const double gbs = static_cast<double>(k.bytes) / (ms * 1e6);
      const double gbs_before = static_cast<double>(k.bytes) / (ms_before * 1e6);
      char detail[300];
      int len = std::snprintf(detail, sizeof(detail),
                              "%lld -> %lld, %.2f MB, %.2f us (%.0f%% of copy); before %.0f GB/s, %.2f us",
                              (long long)sh.cols, (long long)sh.rows, k.bytes / 1e6, ms * 1e3, 100.0 * gbs / copy_gbs,
                              gbs_before, ms_before * 1e3);
      if (n == 1) {
        const int per_graph = std::max(20, std::min(k.copies, 256));  // >= 256 MB of weights per replay
        const double g = GraphUs(launcher(t, sh, k, n, now), per_graph);
        const double g_before = GraphUs(launcher(t, sh, k, n, before), per_graph);
        std::snprintf(detail + len, sizeof(detail) - len, "; graph %.2f us (%.0f GB/s), before %.2f us", g,
                      k.bytes / (g * 1e3), g_before);
      }
      Report(std::string("matvec_") + t.name + "_" + std::to_string(sh.cols) + "x" + std::to_string(sh.rows) + "_n" +
                 std::to_string(n),
             gbs, "GB/s", detail);
    }
    BENCH_CHECK(cudaFree(k.w));
  };
  for (const T& t : quant) {
    for (const Shape& sh : shapes) run_case(t, sh, {1, 2, 4, 8});
  }
  run_case(f32, Shape{2048, 512}, {1, 2, 8});  // the router: 512 experts x 2048
  run_case(f32, Shape{2048, 65536}, {1, 8});
  run_case(bf16, Shape{2048, 131072}, {1, 8});

  // The sweep: GPU-side (graph) microseconds per launch for each forced split and grid.
  const Shape sweep_shapes[] = {{2048, 8192}, {2048, 4096}, {4096, 2048}, {2048, 512}, {512, 2048}};
  for (const T& t : {quant[0], quant[3], f32}) {
    for (const Shape& sh : sweep_shapes) {
      if (t.type == kTypeF32 && sh.rows != 512) continue;
      const Weights k = make(t, sh);
      const int per_graph = std::max(20, std::min(k.copies, 256));
      for (int n : {1, 8}) {
        if (n == 8 && t.type != kTypeQ8_0) continue;
        for (int wpr : {1, 2, 4, 8}) {
          std::string detail = "us per launch (graph) at blocks/SM one-wave,1,2,4:";
          double best = 1e30;
          for (int b : {0, 1, 2, 4}) {
            const double us =
                GraphUs(launcher(t, sh, k, n, MatVecOptions{MatVecKernel::kAuto, wpr, b}), per_graph);
            best = std::min(best, us);
            char buf[32];
            std::snprintf(buf, sizeof(buf), " %.2f", us);
            detail += buf;
          }
          Report(std::string("sweep_") + t.name + "_" + std::to_string(sh.cols) + "x" + std::to_string(sh.rows) +
                     "_n" + std::to_string(n) + "_wpr" + std::to_string(wpr),
                 best, "us", detail);
        }
      }
      BENCH_CHECK(cudaFree(k.w));
    }
  }
  cudaFree(x);
  cudaFree(y);
}

// Q8_0 decode matvec, the ggml layout against Q8_0x8 (the layout the backend uploads product
// matrices in, device_matrix.h), both through kAuto, on every Q8_0 decode shape of q3n-80b: GDN
// qkv, z, ba, ssm_out; attention q (gated), k/v, o; 512-wide products; the LM head. Copies cycled
// as in BenchMatVec (the L2 never holds the weights); GB/s of weight bytes; n = 1 also from a
// graph. Then Q8_0x8's head through the previous kernel and the streaming one, and a sweep of the
// streaming kernel's split and grid for Q8_0x8 at n = 1.
void BenchQ8Layouts(double copy_gbs) {
  struct Shape {
    const char* name;
    int64_t cols, rows;
  };
  const Shape shapes[] = {{"gdn_qkv", 2048, 8192}, {"gdn_z", 2048, 4096},  {"gdn_ba", 2048, 64},
                          {"out_o", 4096, 2048},   {"attn_q", 2048, 8192}, {"attn_kv", 2048, 512},
                          {"w512_up", 512, 2048},  {"head", 2048, 151936}};
  float* x = RandomFloats(8 * 8192, 3);
  float* y;
  BENCH_CHECK(cudaMalloc(&y, 8 * 262144 * sizeof(float)));
  struct Weights {
    void* w;
    int64_t bytes;
    int copies;
  };
  // Both layouts have 34 bytes per 32 weights; random bytes with every even-offset f16 finite.
  auto make = [&](const Shape& sh) {
    Weights k;
    k.bytes = sh.cols / 32 * 34 * sh.rows;
    k.copies = static_cast<int>(std::min<int64_t>(512, std::max<int64_t>(1, ((256ll << 20) + k.bytes - 1) / k.bytes)));
    k.w = RandomDevice(static_cast<size_t>(k.bytes) * k.copies, 11, 0x3FFF3FFF3FFF3FFFull);
    return k;
  };
  int next = 0;
  auto launcher = [&](uint32_t type, const Shape& sh, const Weights& k, int n, MatVecOptions o) {
    return [&, type, n, o] {
      const DeviceMatrix m{type, static_cast<uint8_t*>(k.w) + (next++ % k.copies) * k.bytes, sh.cols, sh.rows,
                           sh.cols / 32 * 34};
      BENCH_CHECK(LaunchDenseMatVec(m, x, sh.cols, n, y, sh.rows, o, bench::LaunchStream()));
    };
  };
  const MatVecOptions autok{MatVecKernel::kAuto, 0, 0};
  for (const Shape& sh : shapes) {
    const Weights k = make(sh);
    for (int n : {1, 2, 4, 8}) {
      const double ms_old = TimeMs(launcher(kTypeQ8_0, sh, k, n, autok), 50);
      const double ms_new = TimeMs(launcher(kTypeQ8_0x8, sh, k, n, autok), 50);
      const double gbs = k.bytes / (ms_new * 1e6), gbs_old = k.bytes / (ms_old * 1e6);
      char detail[320];
      int len = std::snprintf(detail, sizeof(detail),
                              "%s %lld -> %lld, %.2f MB: q8_0x8 %.2f us (%.0f%% of copy); q8_0 %.0f GB/s, %.2f us",
                              sh.name, (long long)sh.cols, (long long)sh.rows, k.bytes / 1e6, ms_new * 1e3,
                              100.0 * gbs / copy_gbs, gbs_old, ms_old * 1e3);
      if (n == 1) {
        const int per_graph = std::max(20, std::min(k.copies, 256));
        const double g_new = GraphUs(launcher(kTypeQ8_0x8, sh, k, n, autok), per_graph);
        const double g_old = GraphUs(launcher(kTypeQ8_0, sh, k, n, autok), per_graph);
        std::snprintf(detail + len, sizeof(detail) - len, "; graph q8_0x8 %.2f us (%.0f GB/s), q8_0 %.2f us (%.0f GB/s)",
                      g_new, k.bytes / (g_new * 1e3), g_old, k.bytes / (g_old * 1e3));
      }
      Report(std::string("q8x8_") + sh.name + "_n" + std::to_string(n), gbs, "GB/s", detail);
    }
    if (sh.rows == 151936) {
      for (int n : {1, 8}) {
        const double prev = TimeMs(launcher(kTypeQ8_0x8, sh, k, n, {MatVecKernel::kPrevious, 0, 0}), 20);
        const double strm = TimeMs(launcher(kTypeQ8_0x8, sh, k, n, {MatVecKernel::kStream, 0, 0}), 20);
        char detail[200];
        std::snprintf(detail, sizeof(detail), "q8_0x8 head: previous kernel %.2f us (%.0f GB/s), streaming %.2f us",
                      prev * 1e3, k.bytes / (prev * 1e6), strm * 1e3);
        Report("q8x8_head_stream_n" + std::to_string(n), k.bytes / (strm * 1e6), "GB/s", detail);
      }
    } else if (sh.rows >= 2048) {
      const int per_graph = std::max(20, std::min(k.copies, 256));
      for (int wpr : {1, 2, 4}) {
        std::string detail = "q8_0x8 n=1 us per launch (graph) at blocks/SM one-wave,1,2,3:";
        double best = 1e30;
        for (int b : {0, 1, 2, 3}) {
          const double us = GraphUs(launcher(kTypeQ8_0x8, sh, k, 1, MatVecOptions{MatVecKernel::kAuto, wpr, b}), per_graph);
          best = std::min(best, us);
          char buf[32];
          std::snprintf(buf, sizeof(buf), " %.2f", us);
          detail += buf;
        }
        Report(std::string("q8x8_sweep_") + sh.name + "_wpr" + std::to_string(wpr), best, "us", detail);
      }
    }
    BENCH_CHECK(cudaFree(k.w));
  }
  cudaFree(x);
  cudaFree(y);
}

// The LM head (Q6_K 2048 -> 151936, 255 MB) and the other Q6_K decode shapes: the staged kernel
// (matvec_q6k_staged.cuh, MatVecKernel::kStaged) against the previous fast kernel (kPrevious, the
// head's dispatch before) and the streaming kernel (kStream), same run, copies cycled past L2;
// n = 1 also from a graph, and the staged kernel's grid forced to 1 and 2 blocks per SM.
void BenchQ6Head(double copy_gbs) {
  struct Shape {
    int64_t cols, rows;
  };
  float* x = RandomFloats(8 * 4096, 3);
  float* y;
  BENCH_CHECK(cudaMalloc(&y, 8 * 151936 * sizeof(float)));
  for (const Shape sh : {Shape{2048, 151936}, Shape{2048, 8192}, Shape{4096, 2048}}) {
    const int64_t row_bytes = sh.cols / 256 * 210, bytes = row_bytes * sh.rows;
    const int copies = static_cast<int>(std::max<int64_t>(2, ((512ll << 20) + bytes - 1) / bytes));
    void* w = RandomDevice(static_cast<size_t>(bytes) * copies, 11, 0x3FFF3FFF3FFF3FFFull);
    int next = 0;
    auto launcher = [&](int n, MatVecOptions o) {
      return [&, n, o] {
        const DeviceMatrix m{kTypeQ6_K, static_cast<uint8_t*>(w) + (next++ % copies) * bytes, sh.cols, sh.rows,
                             row_bytes};
        BENCH_CHECK(LaunchDenseMatVec(m, x, sh.cols, n, y, sh.rows, o, bench::LaunchStream()));
      };
    };
    const int per_graph = std::max(20, std::min(copies, 256));
    const std::string shape = std::to_string(sh.cols) + "x" + std::to_string(sh.rows);
    for (int n : {1, 2, 4, 8}) {
      const double staged = TimeMs(launcher(n, {MatVecKernel::kStaged, 0, 0}), 20);
      const double prev = TimeMs(launcher(n, {MatVecKernel::kPrevious, 0, 0}), 20);
      const double strm = TimeMs(launcher(n, {MatVecKernel::kStream, 0, 0}), 20);
      char detail[400];
      int len = std::snprintf(detail, sizeof(detail),
                              "%.1f MB: staged %.2f us (%.0f GB/s, %.0f%% of copy), previous %.2f us (%.0f GB/s), "
                              "stream %.2f us (%.0f GB/s)",
                              bytes / 1e6, staged * 1e3, bytes / (staged * 1e6), 100.0 * bytes / (staged * 1e6) / copy_gbs,
                              prev * 1e3, bytes / (prev * 1e6), strm * 1e3, bytes / (strm * 1e6));
      if (n == 1) {
        const double g = GraphUs(launcher(n, {MatVecKernel::kStaged, 0, 0}), per_graph);
        const double gp = GraphUs(launcher(n, {MatVecKernel::kPrevious, 0, 0}), per_graph);
        const double g1 = GraphUs(launcher(n, {MatVecKernel::kStaged, 0, 1}), per_graph);
        const double g2 = GraphUs(launcher(n, {MatVecKernel::kStaged, 0, 2}), per_graph);
        std::snprintf(detail + len, sizeof(detail) - len,
                      "; graph staged %.2f us (%.0f GB/s), previous %.2f us; staged 1 / 2 blocks per SM %.2f / %.2f us",
                      g, bytes / (g * 1e3), gp, g1, g2);
        // The one-row head kernel (matvec_q6k_head.cuh; 2048 columns only): each variant from a
        // graph, against the staged kernel timed just above in the same process.
        if (sh.cols == 2048) {
          std::string heads;
          double best = 1e30;
          int best_v = 0;
          for (int v = 0; v < kMatVecHeadVariants; ++v) {
            const double h = GraphUs(launcher(n, {MatVecKernel::kQ6Head, 0, 0, v}), per_graph);
            char buf[64];
            std::snprintf(buf, sizeof(buf), " v%d %.2f", v, h);
            heads += buf;
            if (h < best) best = h, best_v = v;
          }
          const double ha = GraphUs(launcher(n, {MatVecKernel::kAuto, 0, 0}), per_graph);
          Report("q6k_head_" + shape + "_n1_headkernel", best, "us",
                 "graph us:" + heads + "; auto " + std::to_string(ha) + "; best v" + std::to_string(best_v) + " " +
                     std::to_string(bytes / (best * 1e3)) + " GB/s against staged " + std::to_string(g) + " us");
          // The int16 form (MatVecOptions::int16_x, the fast mode's head), each variant likewise.
          std::string heads16;
          double best16 = 1e30;
          int best16_v = 0;
          for (int v = 0; v < kMatVecHeadVariants; ++v) {
            MatVecOptions o{MatVecKernel::kQ6Head, 0, 0, v};
            o.int16_x = true;
            const double h = GraphUs(launcher(n, o), per_graph);
            char buf[64];
            std::snprintf(buf, sizeof(buf), " v%d %.2f", v, h);
            heads16 += buf;
            if (h < best16) best16 = h, best16_v = v;
          }
          Report("q6k_head_" + shape + "_n1_headkernel_int16", best16, "us",
                 "graph us:" + heads16 + "; best v" + std::to_string(best16_v) + " " +
                     std::to_string(bytes / (best16 * 1e3)) + " GB/s against the f32 form's best " +
                     std::to_string(best) + " us");
        }
      }
      Report("q6k_head_" + shape + "_n" + std::to_string(n), bytes / (staged * 1e6), "GB/s", detail);
    }
    BENCH_CHECK(cudaFree(w));
  }
  // The head kernel's instruction cost apart from HBM: 16384 rows (27.5 MB) read from L2 launch
  // after launch (one copy, not cycled), f32 and int16 forms of the default variant.
  {
    const int64_t rows = 16384, row_bytes = 1680, bytes = rows * row_bytes;
    void* w = RandomDevice(static_cast<size_t>(bytes), 12, 0x3FFF3FFF3FFF3FFFull);
    const DeviceMatrix m{kTypeQ6_K, w, 2048, rows, row_bytes};
    auto launcher = [&](bool i16) {
      return [&, i16] {
        MatVecOptions o{MatVecKernel::kQ6Head};
        o.int16_x = i16;
        BENCH_CHECK(LaunchDenseMatVec(m, x, 2048, 1, y, rows, o, bench::LaunchStream()));
      };
    };
    const double f32 = GraphUs(launcher(false), 200), i16 = GraphUs(launcher(true), 200);
    char detail[200];
    std::snprintf(detail, sizeof(detail), "2048x16384 from L2: f32 form %.2f us, int16 form %.2f us (%.0f / %.0f GB/s)",
                  f32, i16, bytes / (f32 * 1e3), bytes / (i16 * 1e3));
    Report("q6k_head_l2_int16", i16, "us", detail);
    BENCH_CHECK(cudaFree(w));
  }
  cudaFree(x);
  cudaFree(y);
}

}  // namespace tandem::cuda
