// gpu_moe_bench --pick: the fused one-token MoE kernel's routing step alone (block_route.cuh's
// WarpPickLogits, as the fused kernel's warp 0 runs it with the router in the grid: 512 logits
// read through L2, ten picks), to tell its two parts apart. In the fused kernel's probe (docs/PERF.md,
// twenty-fifth session) ~3.3 us pass between the router count and the logits landing and ~2.3 us
// in the picks, for what should be one L2 round trip and ten rounds of two warp reductions.
// Each launch: a fill kernel writes the logits (so that they sit in L2, written by other SMs, as the
// router blocks leave them), then `blocks` blocks of 128 threads (the fused kernel's) whose warp 0
// reads and picks, reading its SM's clock (clock64: %globaltimer ticks in 256 ns here) at its
// start, once the keys are formed (behind a branch on the loaded values) and after the picks; cycles
// are turned into us at the device's reported clock rate. Cases: 384 readers at four blocks an SM (the fused
// kernel's routed blocks, all reading at once), 48 (one a cluster: the relay's count), one (no
// other reader). Medians over blocks and 20 launches, us. Not a test.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "gpu_service/backends/cuda/moe/block_route.cuh"
#include "tests/gpu/bench_util.h"
#include "gpu_service/backends/cuda/moe/expert_decode_one.cuh"
#include "tests/gpu_moe/moe_bench_util.h"

namespace tandem::cuda::moe_bench {
namespace {

constexpr int kPickE = 512, kPickK = 10, kPickThreads = 128, kPickPer = kPickE / 32;
constexpr int kPickWords = 3;  // start, keys formed, picked

__global__ void FillLogitsKernel(float* logits, int E, unsigned seed) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < E) {
    unsigned h = (static_cast<unsigned>(i) + seed) * 2654435761u;
    h ^= h >> 15;
    logits[i] = static_cast<float>(h & 0xFFFFu) * (1.0f / 65536.0f) - 0.5f;
  }
}

// The shared memory of the fused kernel's blocks (~55 KB), so that four sit on an SM as there.
constexpr int kPickSmem = 55 * 1024;

__global__ void __launch_bounds__(kPickThreads) PickKernel(const float* logits, unsigned long long* stamps, int* ids_out) {
  __shared__ int ids[kOneTokenMaxPicks];
  __shared__ float picked[kOneTokenMaxPicks];
  if (threadIdx.x >= 32) return;
  const long long t0 = clock64();
  long long t1 = 0;
  WarpPickLogits<kPickPer>(logits, kPickE, kPickK, ids, picked, true, [&](unsigned every) {
    if (threadIdx.x == 0 && every != 0x9E3779B9u) t1 = clock64();
  });
  const long long t2 = clock64();
  if (threadIdx.x == 0) {
    unsigned long long* row = stamps + static_cast<size_t>(blockIdx.x) * kPickWords;
    row[0] = static_cast<unsigned long long>(t0);
    row[1] = static_cast<unsigned long long>(t1);
    row[2] = static_cast<unsigned long long>(t2);
  }
  if (threadIdx.x < kPickK) ids_out[blockIdx.x * kPickK + threadIdx.x] = ids[threadIdx.x];
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

void BenchPick() {
  float* logits = nullptr;
  unsigned long long* stamps = nullptr;
  int* ids = nullptr;
  constexpr int kMaxBlocks = 384, kLaunches = 20;
  BENCH_CHECK(cudaMalloc(&logits, kPickE * sizeof(float)));
  BENCH_CHECK(cudaMalloc(&stamps, static_cast<size_t>(kMaxBlocks) * kPickWords * sizeof(unsigned long long)));
  BENCH_CHECK(cudaMalloc(&ids, static_cast<size_t>(kMaxBlocks) * kPickK * sizeof(int)));
  BENCH_CHECK(cudaFuncSetAttribute(PickKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kPickSmem));
  const cudaStream_t stream = bench::LaunchStream();
  int khz = 0;
  BENCH_CHECK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0));
  const double us_per_cycle = 1e3 / khz;
  for (const int blocks : {kMaxBlocks, 48, 1}) {
    std::vector<double> load, pick, total;
    std::vector<unsigned long long> rows(static_cast<size_t>(blocks) * kPickWords);
    for (int launch = 0; launch < kLaunches; ++launch) {
      FillLogitsKernel<<<(kPickE + 255) / 256, 256, 0, stream>>>(logits, kPickE, 977u * launch);
      PickKernel<<<blocks, kPickThreads, kPickSmem, stream>>>(logits, stamps, ids);
      BENCH_CHECK(cudaGetLastError());
      BENCH_CHECK(cudaMemcpyAsync(rows.data(), stamps, rows.size() * sizeof(unsigned long long),
                                  cudaMemcpyDeviceToHost, stream));
      BENCH_CHECK(cudaStreamSynchronize(stream));
      if (launch < 2) continue;  // warm-up
      for (int b = 0; b < blocks; ++b) {
        const unsigned long long* r = rows.data() + static_cast<size_t>(b) * kPickWords;
        load.push_back(static_cast<double>(r[1] - r[0]) * us_per_cycle);
        pick.push_back(static_cast<double>(r[2] - r[1]) * us_per_cycle);
        total.push_back(static_cast<double>(r[2] - r[0]) * us_per_cycle);
      }
    }
    char detail[240];
    std::snprintf(detail, sizeof(detail),
                  "%d blocks reading %d logits (through L2) and picking %d: keys formed %.2f us, picks %.2f us "
                  "(medians over blocks and launches, SM cycles at %d MHz)",
                  blocks, kPickE, kPickK, Median(load), Median(pick), khz / 1000);
    bench::Report("route_pick_" + std::to_string(blocks) + "_blocks", Median(total), "us", detail);
  }
  BENCH_CHECK(cudaFree(logits));
  BENCH_CHECK(cudaFree(stamps));
  BENCH_CHECK(cudaFree(ids));
}

}  // namespace tandem::cuda::moe_bench
