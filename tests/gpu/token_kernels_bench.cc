// Micro-benchmark of the memory-bound per-token kernels of a GDN layer and of the stream norm, on
// Qwen3-Next-80B shapes (GDN nk 16, nv 32, dk = dv = 128, conv kernel 4: 8192 qkv channels; h 2048):
// each vector kernel beside the general scalar kernel it replaces, in the same run. Prefill sizes
// (512 and 8192 tokens) are timed from host launches and reported as effective bandwidth (bytes
// read + written once / time); decode sizes (1 and 32 rows) from CUDA-graph replay, in
// microseconds. Each launch cycles through enough copies of its buffers (>= 192 MB together) that
// the 50 MB L2 does not hold its inputs from an earlier launch. One line per case:
// "name value unit detail"; --json=PATH writes the same numbers as JSON.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "gpu_service/backends/cuda/kernels/gdn.cuh"
#include "gpu_service/backends/cuda/kernels/norm_streams.cuh"
#include "tests/gpu/bench_util.h"

namespace tandem::cuda {
namespace {

using bench::GraphUs;
using bench::RandomFloats;
using bench::Report;


// Device pools that the launches cycle through: copy i of a buffer of `bytes` starts at
// pool + (i mod copies)·bytes.
constexpr size_t kPoolBytes = 544ull << 20;
constexpr size_t kRotateBytes = 192ull << 20;
struct Pools {
  float* p[4];
};

int Copies(size_t bytes_per_launch, size_t largest_buffer) {
  const size_t want = (kRotateBytes + bytes_per_launch - 1) / bytes_per_launch;
  return static_cast<int>(std::max<size_t>(1, std::min(want, kPoolBytes / largest_buffer)));
}

float* Copy(float* pool, size_t floats, int i) { return pool + static_cast<size_t>(i) * ((floats + 63) / 64 * 64); }

// Times `now` and `before` (each called with the copy index), both at prefill size (host launches)
// or decode size (graph), and reports the vector kernel's number with the general one's beside it.
void Compare(const std::string& name, int64_t rows, double bytes, int copies, const std::function<void(int)>& now,
             const std::function<void(int)>& before) {
  int next = 0;
  auto run = [&](const std::function<void(int)>& fn) {
    return [&next, copies, fn] { fn(next++ % copies); };
  };
  char detail[300];
  if (rows > 32) {
    const int reps = std::max(6, 3 * copies);
    const double us = bench::TimeMs(run(now), reps, copies) * 1e3;
    const double us_before = bench::TimeMs(run(before), reps, copies) * 1e3;
    std::snprintf(detail, sizeof(detail), "%.2f MB, %.2f us (general %.2f us, %.2f TB/s; x%.2f)", bytes / 1e6, us,
                  us_before, bytes / (us_before * 1e6), us_before / us);
    Report(name, bytes / (us * 1e6), "TB/s", detail);
  } else {
    run(now)();
    run(before)();
    const double us = GraphUs(run(now), 50);
    const double us_before = GraphUs(run(before), 50);
    std::snprintf(detail, sizeof(detail), "graph replay, %.3f MB; general %.2f us", bytes / 1e6, us_before);
    Report(name, us, "us", detail);
  }
}

void BenchGdnTokens(const Pools& pools) {
  const GdnShape d{16, 32, 128, 128, 4};
  const int64_t c_dim = d.c_dim(), vw = d.nv * d.dv, qk = 2 * d.nk * d.dk;
  float* taps = RandomFloats(static_cast<size_t>(c_dim * d.kk), 61);
  float* ssm_a = RandomFloats(d.nv, 62);
  float* dt_bias = RandomFloats(d.nv, 63);
  float* norm = RandomFloats(d.dv, 64);
  const float eps = 1e-6f;
  for (int64_t n : {1, 32, 512, 8192}) {
    const std::string sz = "_n" + std::to_string(n);
    const size_t row_floats = static_cast<size_t>(n * c_dim);
    const size_t gate_floats = static_cast<size_t>(n * d.nv);
    const double gate_bytes = 4.0 * n * (2 * d.nv + 2 * d.nv);  // ba read, g and beta written
    // pools: 0 qkv / o, 1 conv out / z, 2 history + ba, 3 g + beta.
    const int copies = Copies(8 * row_floats, 4 * row_floats);
    auto qkv = [&](int i) { return Copy(pools.p[0], row_floats, i); };
    auto conv = [&](int i) { return Copy(pools.p[1], row_floats, i); };
    auto hist = [&](int i) { return Copy(pools.p[2], static_cast<size_t>((d.kk - 1) * c_dim), i); };
    auto ba = [&](int i) { return Copy(pools.p[2], static_cast<size_t>(2 * n * d.nv), i) + (64ull << 20) / 4; };
    auto g = [&](int i) { return Copy(pools.p[3], 2 * gate_floats, i); };
    auto beta = [&](int i) { return Copy(pools.p[3], 2 * gate_floats, i) + gate_floats; };
    if (n > 1) {  // decode runs LaunchGdnConvDecode (unchanged)
      Compare("gdn_conv" + sz, n, 8.0 * n * c_dim, copies,
              [&](int i) { BENCH_CHECK(LaunchGdnConv(qkv(i), hist(i), taps, n, d, conv(i), bench::LaunchStream())); },
              [&](int i) { BENCH_CHECK(LaunchGdnConvGeneral(qkv(i), hist(i), taps, n, d, conv(i), bench::LaunchStream())); });
      Compare("gdn_conv_prepare" + sz, n, 8.0 * n * c_dim + gate_bytes, copies,
              [&](int i) {
                BENCH_CHECK(LaunchGdnConvPrepare(qkv(i), hist(i), taps, ba(i), ssm_a, dt_bias, n, d, conv(i), g(i),
                                                 beta(i), bench::LaunchStream()));
              },
              [&](int i) {
                BENCH_CHECK(LaunchGdnConvGeneral(qkv(i), hist(i), taps, n, d, conv(i), bench::LaunchStream()));
                BENCH_CHECK(LaunchGdnPrepareGeneral(conv(i), ba(i), ssm_a, dt_bias, n, d, g(i), beta(i), bench::LaunchStream()));
              });
    }
    const int prep_copies = Copies(static_cast<size_t>(8 * n * qk), row_floats * 4);
    Compare("gdn_prepare" + sz, n, 8.0 * n * qk + gate_bytes, prep_copies,
            [&](int i) { BENCH_CHECK(LaunchGdnPrepare(conv(i), ba(i), ssm_a, dt_bias, n, d, g(i), beta(i), bench::LaunchStream())); },
            [&](int i) {
              BENCH_CHECK(LaunchGdnPrepareGeneral(conv(i), ba(i), ssm_a, dt_bias, n, d, g(i), beta(i), bench::LaunchStream()));
            });
    const size_t v_floats = static_cast<size_t>(n * vw);
    const int gated_copies = Copies(12 * v_floats, 4 * v_floats);
    auto o = [&](int i) { return Copy(pools.p[0], v_floats, i); };
    auto z = [&](int i) { return Copy(pools.p[1], v_floats, i); };
    Compare("gdn_gated_norm" + sz, n, 12.0 * n * vw, gated_copies,
            [&](int i) { BENCH_CHECK(LaunchGdnGatedNorm(o(i), z(i), norm, eps, n, d, o(i), bench::LaunchStream())); },
            [&](int i) { BENCH_CHECK(LaunchGdnGatedNormGeneral(o(i), z(i), norm, eps, n, d, o(i), bench::LaunchStream())); });
  }
  cudaFree(taps);
  cudaFree(ssm_a);
  cudaFree(dt_bias);
  cudaFree(norm);
}

void BenchRmsNorm(const Pools& pools) {
  const int64_t h = 2048;
  float* gamma = RandomFloats(h, 71);
  for (int64_t n : {1, 32, 512, 8192}) {
    const size_t floats = static_cast<size_t>(n * h);
    for (bool inject : {false, true}) {
      const int copies = Copies((inject ? 16 : 8) * floats, 4 * floats);
      auto H = [&](int i) { return Copy(pools.p[0], floats, i); };
      auto y = [&](int i) { return inject ? Copy(pools.p[1], floats, i) : nullptr; };
      auto N = [&](int i) { return Copy(pools.p[2], floats, i); };
      Compare(std::string(inject ? "inject_rms_norm" : "rms_norm") + "_h2048_n" + std::to_string(n), n,
              (inject ? 16.0 : 8.0) * n * h, copies,
              [&](int i) { BENCH_CHECK(LaunchInjectRmsNorm(H(i), n, 1, h, nullptr, y(i), gamma, 1e-6f, N(i), bench::LaunchStream())); },
              [&](int i) {
                BENCH_CHECK(LaunchInjectRmsNormGeneral(H(i), n, 1, h, nullptr, y(i), gamma, 1e-6f, N(i), bench::LaunchStream()));
              });
    }
  }
  cudaFree(gamma);
}

}  // namespace
}  // namespace tandem::cuda

int main(int argc, char** argv) {
  using namespace tandem::cuda;
  std::string json;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--json=", 7) == 0) json = argv[i] + 7;
  }
  if (!tandem::bench::PrintDevice()) {
    std::fprintf(stderr, "token_kernels_bench: no CUDA device\n");
    return 1;
  }
  Pools pools;
  pools.p[0] = RandomFloats(kPoolBytes / 4, 5);
  for (int i = 1; i < 4; ++i) {
    BENCH_CHECK(cudaMalloc(&pools.p[i], kPoolBytes));
    BENCH_CHECK(cudaMemcpy(pools.p[i], pools.p[0], kPoolBytes, cudaMemcpyDeviceToDevice));
  }
  {  // the copy ceiling on the same pools
    const double ms = tandem::bench::TimeMs(
        [&] { BENCH_CHECK(cudaMemcpyAsync(pools.p[1], pools.p[0], kPoolBytes, cudaMemcpyDeviceToDevice)); }, 5);
    Report("copy_d2d_544MiB", 2.0 * kPoolBytes / (ms * 1e9), "TB/s", "read+write bytes / time: the HBM ceiling");
  }
  BenchGdnTokens(pools);
  BenchRmsNorm(pools);
  for (float* p : pools.p) cudaFree(p);
  tandem::bench::WriteJson(json);
  return 0;
}
