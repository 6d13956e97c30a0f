// gpu_kernels_bench --cold-read: how fast a read of a decode product's size (2-64 MB) streams from
// HBM when L2 does not hold it, by access order and by how recently its pages were read. The decode
// step's Q8_0x8 input products read 17.8-27 MB at 1.7-1.8 TB/s on a cold L2 (Nsight Compute, H200,
// docs/PERF.md twenty-fourth session) whatever their kernel's loads in flight, while the read
// ceiling (a grid-stride sweep of 4 GB) reaches ~4.4 TB/s. Cases, each replayed from a CUDA graph
// of 20 launches that read 20 different regions (so no launch finds its bytes in L2):
//   sweep: the whole grid strides over the region together (the ceiling kernel's order);
//   runs:  264 blocks each read their own contiguous run, 8 loads in flight a thread (the order
//          of a row-split product);
//   near:  the 20 regions adjacent (their pages read every 20 launches);
//   far:   the 20 regions spread over an 8 GB pool (each launch's pages untouched for ~8 GB of reads,
//          as a decode step's 46 GB of weights leave them);
//   touched: far, with a one-block kernel before each read that loads one word every 64 KB of the
//          next launch's region (its address translations warmed a launch ahead, as a decode step
//          could warm the next product's pages under the kernel before it); the time is the pair's,
//          and touch_far the touch kernel's alone over far regions, so that pair − touch is the read
//          with its translations warm.
// If far reads are slower than near ones and touched ones close the gap, address translation (not
// DRAM) is what the products' cold reads wait on.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <string>

#include "tests/gpu/bench_util.h"
#include "tests/gpu/decode_matvec_bench.h"
#include "tests/gpu/sweep_read_kernel.cuh"

namespace tandem::cuda {
namespace {

using bench::GraphUs;
using bench::LaunchStream;
using bench::Report;
using bench::SweepReadKernel;

// RunsReadKernel and TouchPagesKernel XOR what they read and write only if the result is a value the
// pool's fill never gives, as SweepReadKernel (sweep_read_kernel.cuh: the read ceiling's kernel, so
// the same order of reads), so that the loads stay and nothing is written.

// One 4-byte load every `stride` bytes of [p, p + bytes): a thread a load.
__global__ void TouchPagesKernel(const uint8_t* __restrict__ p, uint64_t bytes, uint64_t stride, uint32_t* sink) {
  uint32_t acc = 0;
  for (uint64_t i = threadIdx.x; i * stride < bytes; i += blockDim.x) {
    acc ^= __ldcs(reinterpret_cast<const uint32_t*>(p + i * stride));
  }
  if (acc == 0x9E3779B9u) sink[0] = acc;
}

constexpr int kRunUnroll = 8;

__global__ void RunsReadKernel(const uint4* __restrict__ p, uint64_t words, uint32_t* sink) {
  const uint64_t begin = words * blockIdx.x / gridDim.x, end = words * (blockIdx.x + 1) / gridDim.x;
  uint32_t acc = 0;
  for (uint64_t i = begin + threadIdx.x; i < end; i += static_cast<uint64_t>(blockDim.x) * kRunUnroll) {
    uint4 v[kRunUnroll];
#pragma unroll
    for (int u = 0; u < kRunUnroll; ++u) {
      const uint64_t j = i + static_cast<uint64_t>(u) * blockDim.x;
      v[u] = j < end ? __ldcs(p + j) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kRunUnroll; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  if (acc == 0x9E3779B9u) sink[0] = acc;
}

}  // namespace

void BenchColdRead() {
  constexpr uint64_t kPool = uint64_t{8} << 30;
  constexpr int kRegions = 20;
  uint8_t* pool = nullptr;
  BENCH_CHECK(cudaMalloc(&pool, kPool + 64));
  BENCH_CHECK(cudaMemset(pool, 0x5A, kPool + 64));  // every page backed before the timing
  uint32_t* sink = reinterpret_cast<uint32_t*>(pool + kPool);
  int sms = 0;
  BENCH_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  for (const uint64_t mb : {2, 9, 18, 27, 64}) {
    const uint64_t bytes = mb << 20, words = bytes / 16;
    {
      const uint64_t spacing = kPool / kRegions / 4096 * 4096;
      int next = 0;
      auto touch = [&] {
        TouchPagesKernel<<<1, 512, 0, LaunchStream()>>>(pool + (next++ % kRegions) * spacing, bytes, 64 << 10, sink);
      };
      touch();
      BENCH_CHECK(cudaDeviceSynchronize());
      const double us = GraphUs(touch, kRegions);
      char detail[120];
      std::snprintf(detail, sizeof(detail), "%llu MB far regions: one load every 64 KB, one block (us a launch)",
                    static_cast<unsigned long long>(mb));
      Report("cold_read_touch_far_" + std::to_string(mb) + "mb", us, "us", detail);
    }
    for (const int placement : {0, 1, 2}) {  // near, far, far with the next region's pages touched
      const bool far = placement > 0, touched = placement == 2;
      const uint64_t spacing = far ? kPool / kRegions / 4096 * 4096 : bytes;
      for (const bool runs : {false, true}) {
        int next = 0;
        auto launch = [&] {
          const int i = next++ % kRegions;
          const uint4* region = reinterpret_cast<const uint4*>(pool + i * spacing);
          if (touched) {
            TouchPagesKernel<<<1, 512, 0, LaunchStream()>>>(pool + ((i + 1) % kRegions) * spacing, bytes, 64 << 10, sink);
          }
          if (runs) {
            RunsReadKernel<<<2 * sms, 256, 0, LaunchStream()>>>(region, words, sink);
          } else {
            SweepReadKernel<<<8 * sms, 512, 0, LaunchStream()>>>(region, words, sink);
          }
        };
        launch();
        BENCH_CHECK(cudaDeviceSynchronize());
        next = 0;
        const double us = GraphUs(launch, kRegions);
        char detail[160];
        const char* where = touched ? "touched" : far ? "far" : "near";
        std::snprintf(detail, sizeof(detail), "%llu MB, %s regions, %s: %.2f us a launch (graph of %d, each its own region)",
                      static_cast<unsigned long long>(mb), where, runs ? "per-block runs" : "grid sweep", us, kRegions);
        Report(std::string("cold_read_") + (runs ? "runs_" : "sweep_") + where + "_" + std::to_string(mb) + "mb",
               static_cast<double>(bytes) / (us * 1e3), "GB/s", detail);
      }
    }
  }
  BENCH_CHECK(cudaFree(pool));
}

}  // namespace tandem::cuda
