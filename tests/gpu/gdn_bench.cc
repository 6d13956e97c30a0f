// Micro-benchmark of the gated delta rule on Qwen3-Next-80B shapes (nk 16, nv 32, dk = dv = 128),
// one layer: the recurrent kernel (LaunchGdnRecurrent) against the chunked one (LaunchGdnChunked)
// in exact (f32) and fast (tf32) mode, at 512, 4096 and 8192 tokens, with scratch for all tokens
// and for 2048 (several passes, as the backend sizes it). Timing: CUDA events
// around `reps` calls after warm-up, median of 5 rounds; for the full-scratch runs at 4096 tokens
// and more (f32: 8192) also each kernel alone (the call captured into a graph, each kernel node
// replayed by itself). Also prints the relative L2 difference of each chunked run's outputs and
// final state from the recurrent kernel's, from the same random start state.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#include "gpu_service/backends/cuda/kernels/gdn.cuh"
#include "tests/gpu/bench_util.h"

namespace tandem::cuda {
namespace {

using bench::TimeMs;


// A small xorshift generator: the inputs are 67 M floats at 8192 tokens.
struct Rng {
  uint64_t s = 0x9E3779B97F4A7C15ull;
  float Uniform() {  // [0, 1)
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    return static_cast<float>(s >> 40) * (1.0f / 16777216.0f);
  }
};

double RelL2(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    num += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    den += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(num / den);
}

// Milliseconds of each kernel of one launcher call run alone: the call is captured into a graph on
// `stream` (non-blocking: the legacy default stream cannot be captured), and each kernel node is
// copied into a graph of its own and replayed on the default stream, where TimeMs's events are. The kernels see the buffers as the
// captured call left them (the scan re-runs from the state it wrote: fine for timing).
void PrintKernelTimes(const char* what, cudaStream_t stream, const std::function<void(cudaStream_t)>& launch) {
  cudaGraph_t graph;
  BENCH_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  launch(stream);
  BENCH_CHECK(cudaStreamEndCapture(stream, &graph));
  size_t count = 0;
  BENCH_CHECK(cudaGraphGetNodes(graph, nullptr, &count));
  std::vector<cudaGraphNode_t> nodes(count);
  BENCH_CHECK(cudaGraphGetNodes(graph, nodes.data(), &count));
  for (size_t i = 0; i < count; ++i) {
    cudaGraphNodeType type;
    BENCH_CHECK(cudaGraphNodeGetType(nodes[i], &type));
    if (type != cudaGraphNodeTypeKernel) continue;
    cudaKernelNodeParams params;
    BENCH_CHECK(cudaGraphKernelNodeGetParams(nodes[i], &params));
    const char* name = "?";
    if (cudaFuncGetName(&name, params.func) != cudaSuccess) name = "?";
    cudaGraph_t one;
    cudaGraphNode_t node;
    cudaGraphExec_t exec;
    BENCH_CHECK(cudaGraphCreate(&one, 0));
    BENCH_CHECK(cudaGraphAddKernelNode(&node, one, nullptr, 0, &params));
    BENCH_CHECK(cudaGraphInstantiate(&exec, one, 0));
    const double ms = TimeMs([&] { BENCH_CHECK(cudaGraphLaunch(exec, nullptr)); }, 10);
    std::printf("      %-22s kernel %zu alone %8.3f ms  grid %ux%u block %u smem %u  %.60s\n", what, i, ms,
                params.gridDim.x, params.gridDim.y, params.blockDim.x, params.sharedMemBytes, name);
    BENCH_CHECK(cudaGraphExecDestroy(exec));
    BENCH_CHECK(cudaGraphDestroy(one));
  }
  BENCH_CHECK(cudaGraphDestroy(graph));
}

template <typename T>
std::vector<T> ToHost(const T* p, size_t count) {
  std::vector<T> v(count);
  BENCH_CHECK(cudaMemcpy(v.data(), p, count * sizeof(T), cudaMemcpyDeviceToHost));
  return v;
}

int Main() {
  const GdnShape d{16, 32, 128, 128, 4};
  const int64_t max_n = 8192, c_dim = d.c_dim(), nv = d.nv, dk = d.dk;
  const size_t state_floats = static_cast<size_t>(nv) * dk * d.dv;
  Rng rng;
  std::vector<float> conv(static_cast<size_t>(max_n * c_dim));
  for (float& x : conv) x = 2.0f * rng.Uniform() - 1.0f;
  for (int64_t t = 0; t < max_n; ++t) {  // q heads scaled by 1/√dk, k heads unit length
    for (int h = 0; h < 2 * d.nk; ++h) {
      float* x = conv.data() + t * c_dim + h * dk;
      double ss = 0;
      for (int i = 0; i < dk; ++i) ss += static_cast<double>(x[i]) * x[i];
      const float s = (h < d.nk ? 1.0f / std::sqrt(static_cast<float>(dk)) : 1.0f) / std::sqrt(static_cast<float>(ss));
      for (int i = 0; i < dk; ++i) x[i] *= s;
    }
  }
  std::vector<float> g(static_cast<size_t>(max_n * nv)), beta(g.size()), state0(state_floats);
  for (size_t i = 0; i < g.size(); ++i) {
    const float a = std::exp(rng.Uniform() * std::log(16.0f));
    g[i] = -a * std::log1p(std::exp(6.0f * rng.Uniform() - 6.0f));
    beta[i] = 1.0f / (1.0f + std::exp(-(4.0f * rng.Uniform() - 2.0f)));
  }
  for (float& s : state0) s = 0.2f * (2.0f * rng.Uniform() - 1.0f);

  float *d_conv, *d_g, *d_beta, *d_state, *d_o;
  void* scratch;
  const int64_t scratch_bytes = GdnChunkedScratchBytes(d, max_n);
  const int64_t small_scratch_bytes = GdnChunkedScratchBytes(d, 2048);
  BENCH_CHECK(cudaMalloc(&d_conv, conv.size() * sizeof(float)));
  BENCH_CHECK(cudaMalloc(&d_g, g.size() * sizeof(float)));
  BENCH_CHECK(cudaMalloc(&d_beta, beta.size() * sizeof(float)));
  BENCH_CHECK(cudaMalloc(&d_state, state_floats * sizeof(float)));
  BENCH_CHECK(cudaMalloc(&d_o, static_cast<size_t>(max_n * nv * d.dv) * sizeof(float)));
  BENCH_CHECK(cudaMalloc(&scratch, static_cast<size_t>(scratch_bytes)));
  BENCH_CHECK(cudaMemcpy(d_conv, conv.data(), conv.size() * sizeof(float), cudaMemcpyHostToDevice));
  BENCH_CHECK(cudaMemcpy(d_g, g.data(), g.size() * sizeof(float), cudaMemcpyHostToDevice));
  BENCH_CHECK(cudaMemcpy(d_beta, beta.data(), beta.size() * sizeof(float), cudaMemcpyHostToDevice));
  std::printf("gdn_bench: nk %d nv %d dk %d dv %d; scratch %.1f MB for %lld tokens (%.1f MB for 2048)\n", d.nk,
              d.nv, d.dk, d.dv, scratch_bytes / 1e6, static_cast<long long>(max_n), small_scratch_bytes / 1e6);

  auto reset_state = [&] {
    BENCH_CHECK(cudaMemcpy(d_state, state0.data(), state_floats * sizeof(float), cudaMemcpyHostToDevice));
  };
  auto recurrent = [&](int64_t n) {
    BENCH_CHECK(LaunchGdnRecurrent(d_conv, d_g, d_beta, n, d, d_state, d_o, nullptr));
  };
  using Launcher = cudaError_t (*)(const float*, const float*, const float*, int64_t, const GdnShape&,
                                   GdnChunkPrecision, void*, int64_t, float*, float*, cudaStream_t);
  auto chunked = [&](Launcher launch, int64_t n, GdnChunkPrecision p, int64_t bytes, cudaStream_t stream) {
    BENCH_CHECK(launch(d_conv, d_g, d_beta, n, d, p, scratch, bytes, d_state, d_o, stream));
  };
  cudaStream_t capture_stream;
  BENCH_CHECK(cudaStreamCreateWithFlags(&capture_stream, cudaStreamNonBlocking));
  for (int64_t n : {512, 4096, 8192}) {
    const size_t out_floats = static_cast<size_t>(n * nv * d.dv);
    reset_state();
    recurrent(n);
    const std::vector<float> rec_o = ToHost(d_o, out_floats), rec_s = ToHost(d_state, state_floats);
    const int reps = n <= 512 ? 20 : 4;
    const double rec_ms = TimeMs([&] { recurrent(n); }, reps);
    std::printf("n %5lld  recurrent          %9.3f ms\n", static_cast<long long>(n), rec_ms);
    struct Variant {
      const char* name;
      Launcher launch;
      GdnChunkPrecision p;
      int64_t bytes;
    };
    constexpr GdnChunkPrecision kF32 = GdnChunkPrecision::kF32, kTf32 = GdnChunkPrecision::kTf32;
    for (const Variant& v : {Variant{"f32", LaunchGdnChunked, kF32, scratch_bytes},
                             Variant{"tf32", LaunchGdnChunked, kTf32, scratch_bytes},
                             Variant{"f32 2048/pass", LaunchGdnChunked, kF32, small_scratch_bytes},
                             Variant{"tf32 2048/pass", LaunchGdnChunked, kTf32, small_scratch_bytes}}) {
      if (v.bytes == small_scratch_bytes && n <= 2048) continue;
      reset_state();
      chunked(v.launch, n, v.p, v.bytes, nullptr);
      BENCH_CHECK(cudaDeviceSynchronize());
      const double err_o = RelL2(ToHost(d_o, out_floats), rec_o);
      const double err_s = RelL2(ToHost(d_state, state_floats), rec_s);
      const double ms = TimeMs([&] { chunked(v.launch, n, v.p, v.bytes, nullptr); }, 20);
      std::printf("n %5lld  %-22s %9.3f ms  (%.1fx)  rel_l2 vs recurrent: out %.2e state %.2e\n",
                  static_cast<long long>(n), v.name, ms, rec_ms / ms, err_o, err_s);
      if (v.bytes == scratch_bytes && (n == 8192 || (n >= 4096 && v.p == kTf32))) {
        PrintKernelTimes(v.name, capture_stream,
                         [&](cudaStream_t st) { chunked(v.launch, n, v.p, v.bytes, st); });
      }
    }
    std::fflush(stdout);
  }
  BENCH_CHECK(cudaStreamDestroy(capture_stream));
  BENCH_CHECK(cudaFree(d_conv));
  BENCH_CHECK(cudaFree(d_g));
  BENCH_CHECK(cudaFree(d_beta));
  BENCH_CHECK(cudaFree(d_state));
  BENCH_CHECK(cudaFree(d_o));
  BENCH_CHECK(cudaFree(scratch));
  return 0;
}

}  // namespace
}  // namespace tandem::cuda

int main() { return tandem::cuda::Main(); }
