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
// other reader). Medians over blocks and 20 launches, us. Each case for WarpPickLogits and for three other
// candidate forms of the picks (PickForm below), whose ids are checked against WarpPickLogits' on
// the same logits (the count of blocks that differ is printed). Not a test.
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "gpu_service/backends/cuda/global_timer.cuh"
#include "gpu_service/backends/cuda/load_acquire.cuh"
#include "gpu_service/backends/cuda/moe/block_route.cuh"
#include "tests/gpu/bench_util.h"
#include "gpu_service/backends/cuda/moe/expert_decode_one.cuh"
#include "gpu_service/backends/cuda/moe/warp_slot.cuh"
#include "tests/gpu_moe/moe_bench_util.h"
#include "tests/gpu_moe/warp_threshold_pick.cuh"

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

// The logits' keys as WarpPickLogits forms them (lane l: ids l, l + 32, ...).
__device__ __forceinline__ void LoadKeys(const float* logits, unsigned (&key)[kPickPer]) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int j = 0; j < kPickPer; ++j) {
    key[j] = LogitKey(__ldcg(logits + lane + 32 * j) + 0.0f);
  }
}

// Candidate forms of the picks, for the same ids as WarpTakeKeys (largest key, lowest id on ties):
// kSortedLanes: each lane sorts its keys once (a bitonic network over (key, slot)), then a round
// reduces the lanes' heads (the same two warp reductions) and the winner shifts its list, so no
// round walks the lane's keys; kBallot: WarpTakeKeys' rounds with the lowest id found by a ballot of
// the lanes holding the top key (a reduction only when several do). (A third, the holder clearing
// its key at once after the ballot and the id sent by a shuffle no later round waits for, measured
// 1.63 us against 1.11: docs/PERF.md, twenty-ninth session.)
// kThreshold: warp_threshold_pick.cuh's WarpThresholdPick (WarpTakeKeys where it hands back).
enum PickForm { kWarpPickLogits, kSortedLanes, kBallot, kThreshold };

__device__ __forceinline__ void PickSortedLanes(unsigned (&key)[kPickPer], int rounds, int* ids) {
  const int lane = threadIdx.x & 31;
  int slot[kPickPer];
#pragma unroll
  for (int j = 0; j < kPickPer; ++j) slot[j] = j;
  // a before b: a larger key, or an equal key at a lower slot (a lower id).
  auto before = [&](int a, int b) { return key[a] > key[b] || (key[a] == key[b] && slot[a] < slot[b]); };
#pragma unroll
  for (int k = 2; k <= kPickPer; k <<= 1) {
#pragma unroll
    for (int j = k >> 1; j > 0; j >>= 1) {
#pragma unroll
      for (int i = 0; i < kPickPer; ++i) {
        const int l = i ^ j;
        if (l > i && ((i & k) == 0 ? before(l, i) : before(i, l))) {
          const unsigned tk = key[i];
          key[i] = key[l];
          key[l] = tk;
          const int ts = slot[i];
          slot[i] = slot[l];
          slot[l] = ts;
        }
      }
    }
  }
  for (int r = 0; r < rounds; ++r) {
    const unsigned head = key[0];
    const unsigned top = __reduce_max_sync(0xFFFFFFFFu, head);
    const unsigned mine = static_cast<unsigned>(lane + 32 * slot[0]);
    const unsigned id = __reduce_min_sync(0xFFFFFFFFu, head == top && top != 0u ? mine : 0xFFFFFFFFu);
    if (lane == 0) ids[r] = top != 0u ? static_cast<int>(id) : kPickE;
    if (top != 0u && mine == id) {  // the winner's list moves up by one
#pragma unroll
      for (int j = 0; j + 1 < kPickPer; ++j) {
        key[j] = key[j + 1];
        slot[j] = slot[j + 1];
      }
      key[kPickPer - 1] = 0u;
    }
  }
  __syncwarp();
}

__device__ __forceinline__ void PickBallot(unsigned (&key)[kPickPer], int rounds, int* ids) {
  const int lane = threadIdx.x & 31;
  for (int r = 0; r < rounds; ++r) {
    int slot;
    const unsigned best = LaneBestKey<kPickPer>(key, &slot);
    const unsigned top = __reduce_max_sync(0xFFFFFFFFu, best);
    const unsigned mine = static_cast<unsigned>(lane + 32 * slot);
    const unsigned holders = __ballot_sync(0xFFFFFFFFu, best == top && top != 0u);
    const unsigned id = __popc(holders) == 1 ? __shfl_sync(0xFFFFFFFFu, mine, __ffs(holders) - 1)
                                              : __reduce_min_sync(0xFFFFFFFFu, best == top && top != 0u ? mine : 0xFFFFFFFFu);
    if (lane == 0) ids[r] = top != 0u ? static_cast<int>(id) : kPickE;
#pragma unroll
    for (int j = 0; j < kPickPer; ++j) {
      if (top != 0u && lane + 32 * j == static_cast<int>(id)) key[j] = 0u;
    }
  }
  __syncwarp();
}

// A reader block's row of stamps (thread 0) and its picks (threads < kPickK).
__device__ __forceinline__ void WriteRow(unsigned long long* stamps, int* ids_out, const int* ids, long long t0,
                                         long long t1, long long t2) {
  if (threadIdx.x == 0) {
    unsigned long long* row = stamps + static_cast<size_t>(blockIdx.x) * kPickWords;
    row[0] = static_cast<unsigned long long>(t0);
    row[1] = static_cast<unsigned long long>(t1);
    row[2] = static_cast<unsigned long long>(t2);
  }
  if (threadIdx.x < kPickK) ids_out[blockIdx.x * kPickK + threadIdx.x] = ids[threadIdx.x];
}

template <PickForm kForm>
__global__ void __launch_bounds__(kPickThreads) PickKernel(const float* logits, unsigned long long* stamps, int* ids_out) {
  __shared__ int ids[kOneTokenMaxPicks];
  __shared__ float picked[kOneTokenMaxPicks];
  if (threadIdx.x >= 32) return;
  const long long t0 = clock64();
  long long t1 = 0;
  if constexpr (kForm == kWarpPickLogits) {
    WarpPickLogits<kPickPer>(logits, kPickE, kPickK, ids, picked, true, [&](unsigned every) {
      if (threadIdx.x == 0 && every != 0x9E3779B9u) t1 = clock64();
    });
  } else {
    unsigned key[kPickPer];
    LoadKeys(logits, key);
    unsigned every = 0u;
#pragma unroll
    for (int j = 0; j < kPickPer; ++j) every ^= key[j];
    if (threadIdx.x == 0 && every != 0x9E3779B9u) t1 = clock64();
    if constexpr (kForm == kSortedLanes) {
      PickSortedLanes(key, kPickK, ids);
    } else if constexpr (kForm == kThreshold) {
      ThresholdPickKeys<kPickPer>(key, kPickE, kPickK, ids, picked);
    } else {
      PickBallot(key, kPickK, ids);
    }
  }
  WriteRow(stamps, ids_out, ids, t0, t1, clock64());
}

// The readers as the fused kernel has them: every block resident and waiting on a count that the
// grid's last block (the writer, standing in for the router blocks) bumps once it has written the
// logits, ~4 us after the start; so the reads start together, on lines another SM has just
// written. `replicas` copies of the logits (stride kPickE floats) with reader b reading copy
// b % replicas: if many readers of one line at once are what the ~3.3 us of the probe's logit loads
// wait on, more copies shorten it. Stamps (clock64, the reader's SM): count seen, keys formed,
// picked. `generation` is the count the readers wait for (the counter is never reset).
// spread: the block's picking warp is the one the fused kernel's OneTokenMoeArgs::pick_warp_by_slot
// takes (moe/warp_slot.cuh PickWarpOfSlot), instead of warp 0; the
// stamps are then the picking warp's. layout (spread only): per reader, its SM id << 32 and the
// four warps' slots in bytes 0-3, which the host checks and prints (docs/PERF.md, twenty-ninth
// session: a block's warps hold one group of four slots 4j .. 4j + 3, rotated by j + 1).
__global__ void __launch_bounds__(kPickThreads)
    PickAfterCountKernel(float* logits, int replicas, unsigned seed, int* counter, int generation,
                         unsigned long long* stamps, int* ids_out, bool spread, unsigned long long* layout) {
  __shared__ int ids[kOneTokenMaxPicks];
  __shared__ float picked[kOneTokenMaxPicks];
  __shared__ unsigned slots[kPickThreads / 32];
  __shared__ long long times[3];
  if (blockIdx.x == gridDim.x - 1) {  // the writer
    const unsigned long long start = GlobalTimerNs();
    while (GlobalTimerNs() - start < 4000) {
    }
    for (int i = threadIdx.x; i < kPickE * replicas; i += blockDim.x) {
      unsigned h = (static_cast<unsigned>(i % kPickE) + seed) * 2654435761u;
      h ^= h >> 15;
      logits[i] = static_cast<float>(h & 0xFFFFu) * (1.0f / 65536.0f) - 0.5f;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      __threadfence();
      atomicAdd(counter, 1);
    }
    return;
  }
  int picker = 0;
  if (spread) {
    const int warp = static_cast<int>(threadIdx.x >> 5);
    if ((threadIdx.x & 31) == 0) slots[warp] = WarpSlot();
    __syncthreads();
    picker = PickWarpOfSlot(slots[0], kPickThreads / 32);
    if (threadIdx.x == 0) {
      const unsigned smid = SmId();
      unsigned long long packed = static_cast<unsigned long long>(smid) << 32;
      for (int w = 0; w < kPickThreads / 32; ++w) packed |= static_cast<unsigned long long>(slots[w] & 0xFFu) << (8 * w);
      layout[blockIdx.x] = packed;
    }
  }
  if (static_cast<int>(threadIdx.x >> 5) == picker) {
    const int lane = static_cast<int>(threadIdx.x & 31);
    if (lane == 0) {
      while (LoadAcquire(counter) < generation) __nanosleep(32);
    }
    __syncwarp();
    const long long t0 = clock64();
    long long t1 = 0;
    WarpPickLogits<kPickPer>(logits + (blockIdx.x % replicas) * kPickE, kPickE, kPickK, ids, picked, true,
                             [&](unsigned every) {
                               if (lane == 0 && every != 0x9E3779B9u) t1 = clock64();
                             });
    const long long t2 = clock64();
    if (lane == 0) {
      times[0] = t0;
      times[1] = t1;
      times[2] = t2;
    }
  }
  if (!spread && threadIdx.x >= 32) return;
  if (spread) {
    __syncthreads();
  } else {
    __syncwarp();
  }
  WriteRow(stamps, ids_out, ids, times[0], times[1], times[2]);
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
  BENCH_CHECK(cudaFuncSetAttribute(PickKernel<kWarpPickLogits>, cudaFuncAttributeMaxDynamicSharedMemorySize, kPickSmem));
  BENCH_CHECK(cudaFuncSetAttribute(PickKernel<kSortedLanes>, cudaFuncAttributeMaxDynamicSharedMemorySize, kPickSmem));
  BENCH_CHECK(cudaFuncSetAttribute(PickKernel<kBallot>, cudaFuncAttributeMaxDynamicSharedMemorySize, kPickSmem));
  BENCH_CHECK(cudaFuncSetAttribute(PickKernel<kThreshold>, cudaFuncAttributeMaxDynamicSharedMemorySize, kPickSmem));
  const cudaStream_t stream = bench::LaunchStream();
  int khz = 0;
  BENCH_CHECK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0));
  const double us_per_cycle = 1e3 / khz;
  const PickForm forms[4] = {kWarpPickLogits, kSortedLanes, kBallot, kThreshold};
  const char* form_names[4] = {"warp_pick_logits", "sorted_lanes", "ballot", "threshold"};
  auto launch = [&](PickForm form, int blocks) {
    if (form == kWarpPickLogits) PickKernel<kWarpPickLogits><<<blocks, kPickThreads, kPickSmem, stream>>>(logits, stamps, ids);
    if (form == kSortedLanes) PickKernel<kSortedLanes><<<blocks, kPickThreads, kPickSmem, stream>>>(logits, stamps, ids);
    if (form == kBallot) PickKernel<kBallot><<<blocks, kPickThreads, kPickSmem, stream>>>(logits, stamps, ids);
    if (form == kThreshold) PickKernel<kThreshold><<<blocks, kPickThreads, kPickSmem, stream>>>(logits, stamps, ids);
    BENCH_CHECK(cudaGetLastError());
  };
  for (int f = 0; f < 4; ++f) {
    for (const int blocks : {kMaxBlocks, 48, 1}) {
      std::vector<double> load, pick, total;
      std::vector<unsigned long long> rows(static_cast<size_t>(blocks) * kPickWords);
      std::vector<int> got(static_cast<size_t>(blocks) * kPickK), want(kPickK);
      int mismatches = 0;
      for (int launch_i = 0; launch_i < kLaunches; ++launch_i) {
        FillLogitsKernel<<<(kPickE + 255) / 256, 256, 0, stream>>>(logits, kPickE, 977u * launch_i);
        if (f != 0) {  // the reference ids: WarpPickLogits on the same logits
          launch(kWarpPickLogits, 1);
          BENCH_CHECK(cudaMemcpyAsync(want.data(), ids, kPickK * sizeof(int), cudaMemcpyDeviceToHost, stream));
        }
        launch(forms[f], blocks);
        BENCH_CHECK(cudaMemcpyAsync(rows.data(), stamps, rows.size() * sizeof(unsigned long long),
                                    cudaMemcpyDeviceToHost, stream));
        BENCH_CHECK(cudaMemcpyAsync(got.data(), ids, got.size() * sizeof(int), cudaMemcpyDeviceToHost, stream));
        BENCH_CHECK(cudaStreamSynchronize(stream));
        if (f != 0) {
          for (int b = 0; b < blocks; ++b) {
            mismatches += !std::equal(want.begin(), want.end(), got.begin() + static_cast<size_t>(b) * kPickK);
          }
        }
        if (launch_i < 2) continue;  // warm-up
        for (int b = 0; b < blocks; ++b) {
          const unsigned long long* r = rows.data() + static_cast<size_t>(b) * kPickWords;
          load.push_back(static_cast<double>(r[1] - r[0]) * us_per_cycle);
          pick.push_back(static_cast<double>(r[2] - r[1]) * us_per_cycle);
          total.push_back(static_cast<double>(r[2] - r[0]) * us_per_cycle);
        }
      }
      char detail[300];
      std::snprintf(detail, sizeof(detail),
                    "%s, %d blocks reading %d logits (through L2) and picking %d: keys formed %.2f us, picks %.2f us "
                    "(medians over blocks and launches, SM cycles at %d MHz); blocks whose ids differ from "
                    "WarpPickLogits': %d",
                    form_names[f], blocks, kPickE, kPickK, bench::Median(load), bench::Median(pick), khz / 1000,
                    mismatches);
      bench::Report(std::string("route_pick_") + form_names[f] + "_" + std::to_string(blocks),
                    bench::Median(total), "us", detail);
    }
  }
  // The readers released together by a count, as in the fused kernel (PickAfterCountKernel).
  float* copies = nullptr;
  int* counter = nullptr;
  constexpr int kMaxReplicas = 384;
  BENCH_CHECK(cudaMalloc(&copies, static_cast<size_t>(kMaxReplicas) * kPickE * sizeof(float)));
  BENCH_CHECK(cudaMalloc(&counter, sizeof(int)));
  BENCH_CHECK(cudaMemsetAsync(counter, 0, sizeof(int), stream));
  BENCH_CHECK(cudaFuncSetAttribute(PickAfterCountKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kPickSmem));
  int generation = 0;
  struct Case {
    int readers, replicas;
    bool spread = false;  // PickAfterCountKernel's spread
  };
  unsigned long long* layout = nullptr;
  BENCH_CHECK(cudaMalloc(&layout, static_cast<size_t>(kMaxBlocks) * sizeof(unsigned long long)));
  for (const Case c : {Case{384, 1}, Case{384, 8}, Case{384, 48}, Case{384, 384}, Case{48, 1}, Case{1, 1},
                       Case{384, 1, true}, Case{48, 1, true}}) {
    std::vector<double> load, pick;
    std::vector<unsigned long long> places(static_cast<size_t>(c.readers));
    int aligned = 0, shared_scheduler_warp0 = 0, shared_scheduler_spread = 0, place_blocks = 0;
    std::vector<unsigned long long> rows(static_cast<size_t>(c.readers) * kPickWords);
    std::vector<int> got(static_cast<size_t>(c.readers) * kPickK), want(kPickK);
    int mismatches = 0;
    for (int launch_i = 0; launch_i < kLaunches; ++launch_i) {
      const unsigned seed = 977u * launch_i + 13u;
      FillLogitsKernel<<<(kPickE + 255) / 256, 256, 0, stream>>>(logits, kPickE, seed);
      launch(kWarpPickLogits, 1);  // the reference ids on the same values
      BENCH_CHECK(cudaMemcpyAsync(want.data(), ids, kPickK * sizeof(int), cudaMemcpyDeviceToHost, stream));
      PickAfterCountKernel<<<c.readers + 1, kPickThreads, kPickSmem, stream>>>(copies, c.replicas, seed, counter,
                                                                              ++generation, stamps, ids, c.spread,
                                                                              layout);
      BENCH_CHECK(cudaGetLastError());
      if (c.spread && launch_i == kLaunches - 1) {
        BENCH_CHECK(cudaMemcpyAsync(places.data(), layout, places.size() * sizeof(unsigned long long),
                                    cudaMemcpyDeviceToHost, stream));
        BENCH_CHECK(cudaStreamSynchronize(stream));
        // A block's slots as one group 4j .. 4j + 3 (in any order), and per SM the readers whose
        // picking warp shares its slot mod 4 (the sub-partition, if slots map so) with another
        // reader's: with warp 0 picking, and spread.
        auto slots_of = [](unsigned long long p) {
          std::array<unsigned, 4> w;
          for (int i = 0; i < 4; ++i) w[i] = static_cast<unsigned>((p >> (8 * i)) & 0xFFu);
          return w;
        };
        std::vector<std::vector<unsigned>> warp0_by_sm(1024), spread_by_sm(1024);
        for (const unsigned long long p : places) {
          const std::array<unsigned, 4> w = slots_of(p);
          const unsigned group = w[0] / 4;
          unsigned seen = 0u;
          for (int i = 0; i < 4; ++i) seen |= w[i] / 4 == group ? 1u << (w[i] % 4) : 0u;
          aligned += seen == 0xFu;
          const unsigned sm = static_cast<unsigned>(p >> 32) % 1024;
          warp0_by_sm[sm].push_back(w[0] % 4);
          spread_by_sm[sm].push_back(w[PickWarpOfSlot(w[0], 4)] % 4);
        }
        auto sharing = [](const std::vector<std::vector<unsigned>>& by_sm) {
          int n = 0;
          for (const std::vector<unsigned>& v : by_sm) {
            for (size_t i = 0; i < v.size(); ++i) n += std::count(v.begin(), v.end(), v[i]) > 1;
          }
          return n;
        };
        shared_scheduler_warp0 = sharing(warp0_by_sm);
        shared_scheduler_spread = sharing(spread_by_sm);
        place_blocks = c.readers;
        // The raw slots of the readers on the first three SMs that hold any.
        int shown = 0;
        for (unsigned sm = 0; sm < 1024 && shown < 3; ++sm) {
          std::string line;
          for (const unsigned long long p : places) {
            if (static_cast<unsigned>(p >> 32) != sm) continue;
            const std::array<unsigned, 4> w = slots_of(p);
            char one[48];
            std::snprintf(one, sizeof(one), " [%u %u %u %u]", w[0], w[1], w[2], w[3]);
            line += one;
          }
          if (line.empty()) continue;
          std::printf("  readers' warp slots on SM %u (warps 0-3 of each):%s\n", sm, line.c_str());
          ++shown;
        }
      }
      BENCH_CHECK(cudaMemcpyAsync(rows.data(), stamps, rows.size() * sizeof(unsigned long long),
                                  cudaMemcpyDeviceToHost, stream));
      BENCH_CHECK(cudaMemcpyAsync(got.data(), ids, got.size() * sizeof(int), cudaMemcpyDeviceToHost, stream));
      BENCH_CHECK(cudaStreamSynchronize(stream));
      for (int b = 0; b < c.readers; ++b) {
        mismatches += !std::equal(want.begin(), want.end(), got.begin() + static_cast<size_t>(b) * kPickK);
      }
      if (launch_i < 2) continue;
      for (int b = 0; b < c.readers; ++b) {
        const unsigned long long* r = rows.data() + static_cast<size_t>(b) * kPickWords;
        load.push_back(static_cast<double>(r[1] - r[0]) * us_per_cycle);
        pick.push_back(static_cast<double>(r[2] - r[1]) * us_per_cycle);
      }
    }
    std::sort(load.begin(), load.end());
    char detail[600];
    std::snprintf(detail, sizeof(detail),
                  "%d blocks released together by a count, reading %d logits just written by another SM (%d "
                  "copies, block b reads b mod copies) and picking %d%s: keys formed %.2f us (p90 %.2f), picks "
                  "%.2f us; blocks whose ids differ from WarpPickLogits': %d",
                  c.readers, kPickE, c.replicas, kPickK, c.spread ? " with the warp of the block's SM place" : "",
                  bench::Median(load), load.empty() ? 0.0 : load[load.size() * 9 / 10], bench::Median(pick),
                  mismatches);
    std::string text = detail;
    if (c.spread) {
      std::snprintf(detail, sizeof(detail),
                    "; last launch: %d of %d readers with their warps in one slot group 4j..4j+3; readers sharing "
                    "their picking warp's slot mod 4 with another reader on the SM: %d with warp 0, %d spread",
                    aligned, place_blocks, shared_scheduler_warp0, shared_scheduler_spread);
      text += detail;
    }
    bench::Report("route_pick_after_count_" + std::to_string(c.readers) + "_copies_" + std::to_string(c.replicas) +
                      (c.spread ? "_spread" : ""),
                  bench::Median(load), "us", text);
  }
  BENCH_CHECK(cudaFree(layout));
  BENCH_CHECK(cudaFree(copies));
  BENCH_CHECK(cudaFree(counter));
  BENCH_CHECK(cudaFree(logits));
  BENCH_CHECK(cudaFree(stamps));
  BENCH_CHECK(cudaFree(ids));
}

}  // namespace tandem::cuda::moe_bench
