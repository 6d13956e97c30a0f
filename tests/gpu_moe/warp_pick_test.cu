// The fast mode's warp picks: block_route.cuh's WarpPickLogits against a CPU top-K of the same
// logits (largest first, the lowest id among equal logits, -0 equal to +0, a NaN never picked, id E
// and -inf once nothing is left), and the bench's candidate form (warp_threshold_pick.cuh:
// WarpThresholdPick, WarpTakeKeys where it hands back) against the same, with WarpThresholdPick
// asserted to decide the cases it is made for (distinct logits, a lane holding many of the top)
// and to hand back the ones it is not (every logit equal, fewer keys than picks).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gpu_service/backends/cuda/moe/block_route.cuh"
#include "gtest/gtest.h"
#include "tests/gpu_moe/test_support.h"
#include "tests/gpu_moe/warp_threshold_pick.cuh"
#include "tests/test_seed.h"

namespace tandem::cuda {
namespace {

constexpr int kMaxPicks = 32;

// One warp: WarpPickLogits' ids and logits into ids_out / picked_out (32 each), and, on the keys it
// forms, ThresholdPickKeys' into ids_alone / picked_alone and whether WarpThresholdPick decided
// (decided[0]).
template <int kPer>
__global__ void WarpPickKernel(const float* logits, int E, int rounds, int* ids_out, float* picked_out, int* decided,
                               int* ids_alone, float* picked_alone) {
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
  const bool ok = ThresholdPickKeys<kPer>(key, E, rounds, ids, picked);
  if (lane == 0) decided[0] = ok ? 1 : 0;
  if (lane < rounds) {
    ids_alone[lane] = ids[lane];
    picked_alone[lane] = picked[lane];
  }
}

// A form's picks: ids and their logits.
struct FormPicks {
  std::vector<int> ids;
  std::vector<float> picked;
};

struct Picks {
  FormPicks main;       // WarpPickLogits
  FormPicks threshold;  // ThresholdPickKeys
  bool decided = false;
};

Picks RunOnGpu(const std::vector<float>& logits, int rounds) {
  const int E = static_cast<int>(logits.size());
  Picks out;
  float* d_logits = nullptr;
  int* d_ints = nullptr;      // ids_out (32), ids_alone (32), decided (1)
  float* d_floats = nullptr;  // picked_out (32), picked_alone (32)
  EXPECT_EQ(cudaMalloc(&d_logits, logits.size() * sizeof(float)), cudaSuccess);
  EXPECT_EQ(cudaMalloc(&d_ints, (2 * kMaxPicks + 1) * sizeof(int)), cudaSuccess);
  EXPECT_EQ(cudaMalloc(&d_floats, 2 * kMaxPicks * sizeof(float)), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(d_logits, logits.data(), logits.size() * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  EXPECT_EQ(cudaMemset(d_ints, 0xFF, (2 * kMaxPicks + 1) * sizeof(int)), cudaSuccess);
  EXPECT_EQ(cudaMemset(d_floats, 0xFF, 2 * kMaxPicks * sizeof(float)), cudaSuccess);
  auto launch = [&](auto kernel) {
    kernel<<<1, 32>>>(d_logits, E, rounds, d_ints, d_floats, d_ints + 2 * kMaxPicks, d_ints + kMaxPicks,
                      d_floats + kMaxPicks);
  };
  switch ((E + 31) / 32) {
    case 2: launch(WarpPickKernel<2>); break;
    case 4: launch(WarpPickKernel<4>); break;
    case 7: launch(WarpPickKernel<7>); break;
    case 16: launch(WarpPickKernel<16>); break;
    default: ADD_FAILURE() << "no kernel for " << (E + 31) / 32 << " logits a lane";
  }
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<int> ints(2 * kMaxPicks + 1);
  std::vector<float> floats(2 * kMaxPicks);
  EXPECT_EQ(cudaMemcpy(ints.data(), d_ints, ints.size() * sizeof(int), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(floats.data(), d_floats, floats.size() * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  out.main.ids.assign(ints.begin(), ints.begin() + rounds);
  out.main.picked.assign(floats.begin(), floats.begin() + rounds);
  out.threshold.ids.assign(ints.begin() + kMaxPicks, ints.begin() + kMaxPicks + rounds);
  out.threshold.picked.assign(floats.begin() + kMaxPicks, floats.begin() + kMaxPicks + rounds);
  out.decided = ints[2 * kMaxPicks] == 1;
  cudaFree(d_logits);
  cudaFree(d_ints);
  cudaFree(d_floats);
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

// Checks one case, both forms; returns whether WarpThresholdPick decided it.
bool Check(const std::vector<float>& logits, int rounds, const std::string& what) {
  const Picks got = RunOnGpu(logits, rounds);
  std::vector<int> want_ids;
  std::vector<float> want_picked;
  CpuPicks(logits, rounds, &want_ids, &want_picked);
  for (const auto& [form, name] : {std::pair{&got.main, "WarpPickLogits"}, std::pair{&got.threshold, "threshold"}}) {
    EXPECT_EQ(form->ids, want_ids) << what << " (" << name << ")";
    for (int r = 0; r < rounds; ++r) {
      // Bit equality: +0 and -0 differ, and the picked value is the logit itself.
      uint32_t a = 0, b = 0;
      std::memcpy(&a, &form->picked[r], 4);
      std::memcpy(&b, &want_picked[r], 4);
      EXPECT_EQ(a, b) << what << " (" << name << ") pick " << r << ": " << form->picked[r] << " against "
                      << want_picked[r];
    }
  }
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
