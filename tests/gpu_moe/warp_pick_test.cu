// The fast mode's warp picks (block_route.cuh): WarpPickLogits against a CPU top-K of the same
// logits (largest first, the lowest id among equal logits, -0 equal to +0, a NaN never picked, id E
// and -inf once nothing is left), and WarpThresholdPick, the gather-and-place form it tries first,
// asserted to decide the cases it is made for (distinct logits, a lane holding many of the top) and
// to hand back, writing nothing, the ones it is not (every logit equal, fewer keys than picks).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gpu_service/backends/cuda/moe/block_route.cuh"
#include "gtest/gtest.h"
#include "tests/gpu_moe/test_support.h"
#include "tests/test_seed.h"

namespace tandem::cuda {
namespace {

constexpr int kMaxPicks = 32;

// One warp: WarpPickLogits' ids and logits into ids_out / picked_out (32 each), and, on the keys it
// forms, whether WarpThresholdPick decided (decided[0]) and, if so, its picks (ids_alone /
// keys_alone, `rounds` each).
template <int kPer>
__global__ void WarpPickKernel(const float* logits, int E, int rounds, int* ids_out, float* picked_out, int* decided,
                               unsigned* ids_alone, unsigned* keys_alone) {
  __shared__ int ids[kMaxPicks];
  __shared__ float picked[kMaxPicks];
  const int lane = threadIdx.x & 31;
  WarpPickLogits<kPer>(logits, E, rounds, ids, picked);
  if (lane < rounds) {
    ids_out[lane] = ids[lane];
    picked_out[lane] = picked[lane];
  }
  __syncwarp();
  unsigned key[kPer];
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int i = lane + 32 * j;
    key[j] = LogitKey(i < E ? logits[i] + 0.0f : __int_as_float(0x7FC00000));
  }
  unsigned id = 0u, top = 0u;
  const bool ok = WarpThresholdPick<kPer>(key, rounds, ids, picked, &id, &top);
  if (lane == 0) decided[0] = ok ? 1 : 0;
  if (ok && lane < rounds) {
    ids_alone[lane] = id;
    keys_alone[lane] = top;
  }
}

struct Picks {
  std::vector<int> ids;
  std::vector<float> picked;
  bool decided = false;
  std::vector<int> ids_alone;
};

Picks RunOnGpu(const std::vector<float>& logits, int rounds) {
  const int E = static_cast<int>(logits.size());
  float* d_logits = nullptr;
  int* d_ints = nullptr;  // ids_out (32), decided (1)
  float* d_picked = nullptr;
  unsigned* d_alone = nullptr;  // ids (32), keys (32)
  Picks out;
  EXPECT_EQ(cudaMalloc(&d_logits, logits.size() * sizeof(float)), cudaSuccess);
  EXPECT_EQ(cudaMalloc(&d_ints, (kMaxPicks + 1) * sizeof(int)), cudaSuccess);
  EXPECT_EQ(cudaMalloc(&d_picked, kMaxPicks * sizeof(float)), cudaSuccess);
  EXPECT_EQ(cudaMalloc(&d_alone, 2 * kMaxPicks * sizeof(unsigned)), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(d_logits, logits.data(), logits.size() * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  EXPECT_EQ(cudaMemset(d_ints, 0xFF, (kMaxPicks + 1) * sizeof(int)), cudaSuccess);
  EXPECT_EQ(cudaMemset(d_alone, 0xFF, 2 * kMaxPicks * sizeof(unsigned)), cudaSuccess);
  int* ids_out = d_ints;
  int* decided = d_ints + kMaxPicks;
  const int per = (E + 31) / 32;
  auto launch = [&](auto kernel) {
    kernel<<<1, 32>>>(d_logits, E, rounds, ids_out, d_picked, decided, d_alone, d_alone + kMaxPicks);
  };
  switch (per) {
    case 2: launch(WarpPickKernel<2>); break;
    case 4: launch(WarpPickKernel<4>); break;
    case 7: launch(WarpPickKernel<7>); break;
    case 16: launch(WarpPickKernel<16>); break;
    default: ADD_FAILURE() << "no kernel for " << per << " logits a lane";
  }
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<int> ints(kMaxPicks + 1);
  std::vector<unsigned> alone(2 * kMaxPicks);
  out.picked.resize(rounds);
  EXPECT_EQ(cudaMemcpy(ints.data(), d_ints, ints.size() * sizeof(int), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(out.picked.data(), d_picked, rounds * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(alone.data(), d_alone, alone.size() * sizeof(unsigned), cudaMemcpyDeviceToHost), cudaSuccess);
  out.ids.assign(ints.begin(), ints.begin() + rounds);
  out.decided = ints[kMaxPicks] == 1;
  if (out.decided) {
    for (int r = 0; r < rounds; ++r) out.ids_alone.push_back(static_cast<int>(alone[r]));
  }
  cudaFree(d_logits);
  cudaFree(d_ints);
  cudaFree(d_picked);
  cudaFree(d_alone);
  return out;
}

// The CPU top-`rounds`: ids and the logits (+0 for -0), E / -inf past the last present logit.
void CpuPicks(const std::vector<float>& logits, int rounds, std::vector<int>* ids, std::vector<float>* picked) {
  const int E = static_cast<int>(logits.size());
  std::vector<int> order;
  for (int i = 0; i < E; ++i) {
    if (!std::isnan(logits[i])) order.push_back(i);
  }
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return logits[a] + 0.0f > logits[b] + 0.0f; });
  ids->assign(rounds, E);
  picked->assign(rounds, -std::numeric_limits<float>::infinity());
  for (int r = 0; r < rounds && r < static_cast<int>(order.size()); ++r) {
    (*ids)[r] = order[r];
    (*picked)[r] = logits[order[r]] + 0.0f;
  }
}

// Checks one case; returns whether WarpThresholdPick decided it.
bool Check(const std::vector<float>& logits, int rounds, const std::string& what) {
  const Picks got = RunOnGpu(logits, rounds);
  std::vector<int> want_ids;
  std::vector<float> want_picked;
  CpuPicks(logits, rounds, &want_ids, &want_picked);
  EXPECT_EQ(got.ids, want_ids) << what;
  for (int r = 0; r < rounds; ++r) {
    // Bit equality: +0 and -0 differ, and the picked value is the logit itself.
    uint32_t a = 0, b = 0;
    std::memcpy(&a, &got.picked[r], 4);
    std::memcpy(&b, &want_picked[r], 4);
    EXPECT_EQ(a, b) << what << " pick " << r << ": " << got.picked[r] << " against " << want_picked[r];
  }
  if (got.decided) EXPECT_EQ(got.ids_alone, want_ids) << what << " (WarpThresholdPick alone)";
  return got.decided;
}

TEST(WarpPickTest, DistinctLogitsMatchTheCpuAndTheThresholdFormDecidesThem) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng = ::tandem::testing::SeededRng();
  std::normal_distribution<float> normal(0.0f, 2.0f);
  for (const int E : {512, 200, 128, 64}) {
    for (const int rounds : {1, 2, 7, 10, 16, 32}) {
      if (rounds > E) continue;
      int decided = 0;
      constexpr int kTrials = 40;
      for (int trial = 0; trial < kTrials; ++trial) {
        std::vector<float> logits(E);
        for (float& v : logits) v = normal(rng);
        decided += Check(logits, rounds, absl::StrCat("E=", E, " rounds=", rounds, " trial ", trial)) ? 1 : 0;
      }
      // The model's shape (512 experts, 10 picks) and fewer picks: the gather fits nearly always.
      if (rounds <= 10 && E >= 128) {
        EXPECT_GE(decided, kTrials * 3 / 4) << "E=" << E << " rounds=" << rounds;
      }
    }
  }
}

TEST(WarpPickTest, TiesSignedZerosAndNaNsMatchTheCpu) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng = ::tandem::testing::SeededRng();
  std::uniform_int_distribution<int> grid(-6, 6);
  for (const int E : {512, 200}) {
    for (const int rounds : {1, 10, 32}) {
      for (int trial = 0; trial < 20; ++trial) {
        std::vector<float> logits(E);
        for (float& v : logits) v = 0.25f * static_cast<float>(grid(rng));  // many equal values
        for (int n = 0; n < 8; ++n) logits[rng() % E] = (n & 1) ? -0.0f : 0.0f;
        for (int n = 0; n < 5; ++n) logits[rng() % E] = std::numeric_limits<float>::quiet_NaN();
        logits[rng() % E] = 1.5f;  // the top value several times
        logits[rng() % E] = 1.5f;
        Check(logits, rounds, absl::StrCat("ties E=", E, " rounds=", rounds, " trial ", trial));
      }
    }
  }
}

TEST(WarpPickTest, OneLaneHoldingTheTopIsGatheredWhole) {
  TANDEM_SKIP_WITHOUT_GPU();
  // Lane 0 holds the 16 largest logits (ids 0, 32, ..., 480): the threshold (the 10th largest lane
  // maximum) lets all 16 through with one from each of 9 other lanes, 25 gathered.
  std::vector<float> logits(512);
  for (int i = 0; i < 512; ++i) logits[i] = (i % 32 == 0) ? 100.0f - static_cast<float>(i) / 32.0f : -static_cast<float>(i);
  EXPECT_TRUE(Check(logits, 10, "lane 0 holds the top 16"));
  EXPECT_TRUE(Check(logits, 16, "lane 0 holds the top 16, 16 picks"));
}

TEST(WarpPickTest, CasesTheThresholdFormHandsBackStillMatchTheCpu) {
  TANDEM_SKIP_WITHOUT_GPU();
  // Every logit equal: all 512 reach the threshold.
  EXPECT_FALSE(Check(std::vector<float>(512, 0.5f), 10, "all equal"));
  // Five present logits and ten picks: ids E and -inf for the last five.
  std::vector<float> sparse(512, std::numeric_limits<float>::quiet_NaN());
  for (const int i : {3, 77, 78, 300, 511}) sparse[i] = static_cast<float>(i) * 0.01f;
  EXPECT_FALSE(Check(sparse, 10, "five present"));
  // Present logits in fewer lanes than picks (ids 0 .. 15 * 32 of lane 0 only).
  std::vector<float> one_lane(512, std::numeric_limits<float>::quiet_NaN());
  for (int j = 0; j < 16; ++j) one_lane[32 * j] = static_cast<float>(j);
  EXPECT_FALSE(Check(one_lane, 10, "one lane holds every logit"));
}

}  // namespace
}  // namespace tandem::cuda
