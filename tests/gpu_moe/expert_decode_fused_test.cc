// The one-kernel one-token MoE (expert_decode_fused.cuh) against the CPU reference: the fast
// mode's routing (top-K logits: the reference's picks, weights within 1e-6), y within 5e-4
// relative L2 of the f32 reference (int16 x per 256 and int16 act per 128-column slice, as the
// two-kernel int16 form's bound), the shared term, accumulation into y, a pick without a location,
// and the shapes it refuses.
#include "gpu_service/backends/cuda/moe/expert_decode_fused.cuh"

#include <cstdio>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/reference/moe.h"
#include "gpu_service/backends/cuda/device_buffer.h"
#include "gpu_service/backends/cuda/moe/expert_decode_fused_probe.h"
#include "tests/armed_probe_check.h"
#include "tests/gpu_moe/one_token_support.h"
#include "tests/gpu_moe/test_support.h"
#include "tests/test_seed.h"

namespace tandem::cuda {
namespace {

using one_token_testing::Logits;
using one_token_testing::OneTokenExperts;
using one_token_testing::OneTokenStep;
using one_token_testing::ReferenceY;
using one_token_testing::Shared;
using testing::Download;

constexpr double kTol = 5e-4;

// The fused kernel's arguments for a step: the fast mode's forms, y zeroed first (it accumulates).
OneTokenMoeArgs FusedArgs(OneTokenStep& step, const OneTokenExperts& ex, int K, Shared sh, bool x_early) {
  OneTokenMoeArgs a = step.Args(ex, K, sh);
  a.int16_activations = true;
  a.logit_route = true;
  a.x_written_earlier = x_early;
  EXPECT_EQ(cudaMemset(step.y.get(), 0, static_cast<size_t>(ex.h) * sizeof(float)), cudaSuccess);
  return a;
}

// A Q8_0 shared expert {h, inner} / {inner, h} on the device and its CPU output for one x.
struct SharedQ8 {
  SharedQ8(std::mt19937& rng, int64_t h, int64_t inner_) : inner(inner_) {
    gate = testing::RandomMatrix(rng, WeightType::kQ8_0, h, inner, 0.05f);
    up = testing::RandomMatrix(rng, WeightType::kQ8_0, h, inner, 0.05f);
    down = testing::RandomMatrix(rng, WeightType::kQ8_0, inner, h, 0.05f);
    dgate = testing::Upload(gate);
    dup = testing::Upload(up);
    ddown = testing::Upload(down);
    where = FusedSharedExpert{dgate.get(), dup.get(), ddown.get(), static_cast<int>(inner)};
  }
  std::vector<float> Reference(int64_t h, const std::vector<float>& x) const {
    std::vector<float> out(static_cast<size_t>(h));
    FfnForward(testing::HostMatrix(WeightType::kQ8_0, gate, h, inner), testing::HostMatrix(WeightType::kQ8_0, up, h, inner),
               testing::HostMatrix(WeightType::kQ8_0, down, inner, h), x.data(), 1, out.data(), nullptr);
    return out;
  }
  int64_t inner;
  std::vector<uint8_t> gate, up, down;
  DeviceBuffer dgate, dup, ddown;
  FusedSharedExpert where;
};

// One fused launch on random inputs against the reference: picks, weights, no error, y within kTol.
// inside (may be nullptr): the shared expert computed in the kernel (its output is then the
// reference's shared term), else a random shared term given to the kernel.
// by_slot: OneTokenMoeArgs::pick_warp_by_slot (another warp of each block routes and gathers, the
// rest quantize x: the same results).
void CheckFused(std::mt19937& rng, const OneTokenExperts& ex, int K, bool ties, Shared sh, bool x_early,
                const std::string& what, const SharedQ8* inside = nullptr, bool by_slot = false) {
  const std::vector<float> logits = Logits(rng, ex.E, ties);
  const std::vector<float> x = testing::RandomVector(rng, ex.h);
  const std::vector<float> shared =
      inside != nullptr ? inside->Reference(ex.h, x) : testing::RandomVector(rng, ex.h, 0.1f);
  const float gate_logit = testing::RandomVector(rng, 1)[0];
  OneTokenStep step(ex, K, logits, x, shared, gate_logit);
  OneTokenMoeArgs a = FusedArgs(step, ex, K, sh, x_early);
  if (inside != nullptr) a.shared = nullptr;  // computed in the kernel
  a.pick_warp_by_slot = by_slot;
  ASSERT_TRUE(OneTokenFusedFits(a.E, a.K, a.h, a.inner)) << what;
  TANDEM_ASSERT_CUDA(LaunchOneTokenMoeFused(a, inside != nullptr ? &inside->where : nullptr, nullptr));
  TANDEM_ASSERT_CUDA(cudaDeviceSynchronize());
  const std::vector<float> got = Download<float>(step.y.get(), static_cast<size_t>(ex.h));
  const std::vector<int32_t> picks = Download<int32_t>(step.picks.get(), static_cast<size_t>(K));
  const std::vector<float> weights = Download<float>(step.picks.as<int32_t>() + K, static_cast<size_t>(K));
  std::vector<int32_t> want_picks;
  std::vector<float> want_weights;
  const std::vector<float> want = ReferenceY(ex, K, logits, x, shared, gate_logit, sh, &want_picks, &want_weights);
  EXPECT_EQ(picks, want_picks) << what;
  for (int k = 0; k < K; ++k) EXPECT_NEAR(weights[k], want_weights[k], 1e-6) << what << " pick " << k;
  EXPECT_EQ(Download<int32_t>(step.ints.get(), 1)[0], 0) << what;
  ASSERT_TRUE(testing::AllFinite(got)) << what;
  const double err = testing::RelativeL2(got, want);
  EXPECT_LE(err, kTol) << what;
  std::printf("fused one-token MoE, %s: y relative L2 %.3e\n", what.c_str(), err);
}

// Several K, ties on a coarse grid, every shared form, x staged before or after the wait, the
// picks by warp 0 or by the warp of the block's place on the SM (OneTokenMoeArgs::pick_warp_by_slot).
TEST(OneTokenFusedTest, MatchesReference) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng = ::tandem::testing::SeededRng();
  const OneTokenExperts ex(rng, 256, 256, 128, 24);
  for (const int K : {1, 5, 16}) {
    for (const bool ties : {false, true}) {
      for (const Shared sh : {Shared::kNone, Shared::kUngated, Shared::kGated}) {
        for (const bool x_early : {false, true}) {
          for (const bool by_slot : {false, true}) {
            CheckFused(rng, ex, K, ties, sh, x_early,
                       absl::StrCat("h=256 I=256 E=128 K=", K, ties ? " ties" : "", " shared=", static_cast<int>(sh),
                                    x_early ? " x early" : "", by_slot ? " routing warp by slot" : ""),
                       nullptr, by_slot);
          }
        }
      }
    }
  }
}

// The shared expert computed inside the kernel (FusedSharedExpert: its own clusters of 64-column
// slices) gives the reference's y with σ(gate)·FFN_sh(x) (or ungated), at the 80B shape and
// smaller h and shared widths.
TEST(OneTokenFusedTest, SharedExpertInsideMatchesReference) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng = ::tandem::testing::SeededRng();
  struct Case {
    int64_t h, I, E;
    int K;
    int64_t shared_inner;
  };
  for (const Case& c : {Case{2048, 512, 512, 10, 512}, Case{512, 256, 64, 4, 64}, Case{1024, 512, 100, 8, 192}}) {
    ASSERT_TRUE(OneTokenFusedTakesShared(static_cast<int>(c.h), static_cast<int>(c.shared_inner)));
    const OneTokenExperts ex(rng, c.h, c.I, c.E, std::min<int64_t>(c.K, 12));
    const SharedQ8 sq(rng, c.h, c.shared_inner);
    for (const Shared sh : {Shared::kUngated, Shared::kGated}) {
      CheckFused(rng, ex, c.K, false, sh, true,
                 absl::StrCat("h=", c.h, " I=", c.I, " E=", c.E, " K=", c.K, " shared inner=", c.shared_inner,
                              sh == Shared::kGated ? " gated" : " ungated", ", shared expert inside"),
                 &sq);
    }
  }
}

// The router product inside the grid (FusedRouter: router blocks ahead of the clusters): the
// logits it writes within 1e-5 relative L2 of the CPU's W·x, the reference's picks and y on those
// logits (within the bound), E router rows alone or E + 1 with the shared gate's row last (the
// shared expert inside), twice in a PDL chain on one stream (the counters are zero after each);
// the default 96 blocks with the first row preloaded, 64 with the plain loop, 96 with the routing
// warp by slot, 8 (many rows a warp) preloaded, and the two forms' logits bit-identical. Block
// counts that are not whole clusters, or out of range, are refused.
TEST(OneTokenFusedTest, RouterInTheGridMatchesReference) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng = ::tandem::testing::SeededRng();
  struct Case {
    int64_t h, I, E;
    int K;
    bool gate_row;
  };
  cudaStream_t stream = nullptr;
  TANDEM_ASSERT_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  DeviceBuffer counters = testing::Upload(std::vector<int32_t>(2, 0));
  struct Form {
    int blocks;
    bool preload;
    bool by_slot = false;  // OneTokenMoeArgs::pick_warp_by_slot
  };
  for (const Case& c : {Case{2048, 512, 512, 10, true}, Case{512, 256, 64, 4, false}, Case{1024, 512, 100, 8, true}}) {
    const OneTokenExperts ex(rng, c.h, c.I, c.E, std::min<int64_t>(c.K, 12));
    const SharedQ8 sq(rng, c.h, 64);
    const int64_t rows = c.E + (c.gate_row ? 1 : 0);
    const std::vector<float> w = testing::RandomVector(rng, rows * c.h, 0.05f);
    const std::vector<float> x = testing::RandomVector(rng, c.h);
    std::vector<float> want_logits(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) {
      double s = 0.0;
      for (int64_t j = 0; j < c.h; ++j) s += static_cast<double>(w[r * c.h + j]) * x[j];
      want_logits[r] = static_cast<float>(s);
    }
    const DeviceBuffer dw = testing::Upload(w);
    const std::vector<float> shared = sq.Reference(c.h, x);
    std::vector<float> form_logits[2];
    for (const Form& f :
         {Form{kFusedRouterBlocks, true}, Form{64, false}, Form{kFusedRouterBlocks, true, true}, Form{8, true}}) {
      const std::string what = absl::StrCat("h=", c.h, " I=", c.I, " E=", c.E, " K=", c.K,
                                            c.gate_row ? " gate row" : "", " router blocks ", f.blocks,
                                            f.preload ? " preloaded" : " plain", f.by_slot ? " routing warp by slot" : "");
      OneTokenStep step(ex, c.K, std::vector<float>(static_cast<size_t>(rows), 0.0f), x, shared, 0.0f);
      const Shared sh = c.gate_row ? Shared::kGated : Shared::kUngated;
      OneTokenMoeArgs a = FusedArgs(step, ex, c.K, sh, false);
      a.shared = nullptr;  // computed in the kernel
      if (c.gate_row) a.shared_gate_logit = a.logits + c.E;
      a.pick_warp_by_slot = f.by_slot;
      FusedRouter router{dw.as<float>(), static_cast<int>(rows), step.logits.as<float>(), counters.as<int32_t>()};
      router.blocks = f.blocks;
      router.preload = f.preload;
      for (int rep = 0; rep < 2; ++rep) {
        TANDEM_ASSERT_CUDA(cudaMemsetAsync(step.y.get(), 0, static_cast<size_t>(c.h) * sizeof(float), stream));
        TANDEM_ASSERT_CUDA(LaunchOneTokenMoeFused(a, &sq.where, stream, &router));
        TANDEM_ASSERT_CUDA(cudaStreamSynchronize(stream));
        EXPECT_EQ(Download<int32_t>(counters.get(), 2), std::vector<int32_t>(2, 0)) << what << ": counters left";
      }
      const std::vector<float> logits = Download<float>(step.logits.get(), static_cast<size_t>(rows));
      EXPECT_LE(testing::RelativeL2(logits, want_logits), 1e-5) << what;
      if (f.blocks != 8 && !f.by_slot) form_logits[f.preload ? 0 : 1] = logits;
      const std::vector<float> router_logits(logits.begin(), logits.begin() + c.E);
      std::vector<int32_t> picks;
      std::vector<float> weights;
      const float gate_logit = c.gate_row ? logits[c.E] : 0.0f;
      const std::vector<float> want = ReferenceY(ex, c.K, router_logits, x, shared, gate_logit, sh, &picks, &weights);
      EXPECT_EQ(Download<int32_t>(step.picks.get(), static_cast<size_t>(c.K)), picks) << what;
      const std::vector<float> got = Download<float>(step.y.get(), static_cast<size_t>(c.h));
      ASSERT_TRUE(testing::AllFinite(got)) << what;
      const double err = testing::RelativeL2(got, want);
      EXPECT_LE(err, kTol) << what;
      std::printf("fused one-token MoE, router in the grid, %s: y relative L2 %.3e\n", what.c_str(), err);
      if (f.blocks == 8) {  // refused block counts, on this case's arguments
        for (const int bad : {0, 12, kFusedRouterMaxBlocks + 8}) {
          FusedRouter r = router;
          r.blocks = bad;
          EXPECT_EQ(LaunchOneTokenMoeFused(a, &sq.where, stream, &r), cudaErrorInvalidValue) << what << ", " << bad;
        }
      }
    }
    EXPECT_EQ(form_logits[0], form_logits[1]) << "the two router forms' logits differ at h=" << c.h;
  }
  TANDEM_ASSERT_CUDA(cudaStreamDestroy(stream));
}

// The probe tests' model: the 80B shape's experts (K weight sets) and its Q8_0 shared expert.
struct EightyBExperts {
  static constexpr int64_t kH = 2048, kI = 512, kE = 512;
  static constexpr int kK = 10;
  explicit EightyBExperts(std::mt19937& rng) : ex(rng, kH, kI, kE, kK), sq(rng, kH, 512) {}
  OneTokenExperts ex;
  SharedQ8 sq;
};

// The lean instantiations (SetMoeLean: 1, the fast decode defaults compiled in; 2, also the 80B's h
// and inner) compute what the general kernel (0) computes at the 80B shape in the decode stage's form
// (the shared expert and the router inside): the same logits and picks (the router rows' sums in the
// same order), y within 1e-5 relative L2 (its additions' order is not fixed). Each launch counted by
// its level: level 2 takes level 1's kernel where the shared expert's inner is not the 80B's, and
// the general kernel where an argument is not a default (the routing warp by slot).
TEST(OneTokenFusedTest, LeanFormsComputeWhatTheGeneralKernelComputes) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng = ::tandem::testing::SeededRng();
  const EightyBExperts m(rng);
  const SharedQ8 narrow(rng, m.kH, 256);  // a shared expert of another inner
  const int64_t h = m.kH, E = m.kE;
  const int K = m.kK;
  const std::vector<float> w = testing::RandomVector(rng, (E + 1) * h, 0.05f);
  const std::vector<float> x = testing::RandomVector(rng, h);
  const DeviceBuffer dw = testing::Upload(w);
  DeviceBuffer counters = testing::Upload(std::vector<int32_t>(2, 0));
  const std::vector<float> zeros(static_cast<size_t>(E + 1), 0.0f), shared(static_cast<size_t>(h), 0.0f);
  const int was = MoeLean();
  struct Run {
    int level;
    const SharedQ8* sq;
    bool by_slot;
    int counted;  // the level whose launch count moves (0: neither)
  };
  for (const SharedQ8* sq : {&m.sq, &narrow}) {
    const bool wide = sq == &m.sq;
    std::vector<float> y0, logits0;
    std::vector<int32_t> picks0;
    for (const Run& r : {Run{0, sq, false, 0}, Run{1, sq, false, 1}, Run{2, sq, false, wide ? 2 : 1},
                         Run{2, sq, true, 0}}) {
      const std::string what = absl::StrCat("level ", r.level, ", shared inner ", r.sq->inner,
                                            r.by_slot ? ", routing warp by slot" : "");
      OneTokenStep step(m.ex, K, zeros, x, shared, 0.0f);
      OneTokenMoeArgs a = FusedArgs(step, m.ex, K, Shared::kGated, false);
      a.shared = nullptr;
      a.shared_gate_logit = a.logits + E;
      a.pick_warp_by_slot = r.by_slot;
      const FusedRouter router{dw.as<float>(), static_cast<int>(E + 1), step.logits.as<float>(), counters.as<int32_t>()};
      const uint64_t before[3] = {0, MoeLeanLaunches(1), MoeLeanLaunches(2)};
      SetMoeLean(r.level);
      TANDEM_ASSERT_CUDA(LaunchOneTokenMoeFused(a, &r.sq->where, nullptr, &router));
      TANDEM_ASSERT_CUDA(cudaDeviceSynchronize());
      SetMoeLean(was);
      for (int level = 1; level <= 2; ++level) {
        EXPECT_EQ(MoeLeanLaunches(level), before[level] + (r.counted == level ? 1 : 0)) << what << ": level " << level;
      }
      const std::vector<float> y = Download<float>(step.y.get(), static_cast<size_t>(h));
      const std::vector<float> logits = Download<float>(step.logits.get(), static_cast<size_t>(E + 1));
      const std::vector<int32_t> picks = Download<int32_t>(step.picks.get(), static_cast<size_t>(2 * K));
      ASSERT_TRUE(testing::AllFinite(y)) << what;
      if (r.level == 0) {
        y0 = y, logits0 = logits, picks0 = picks;
        continue;
      }
      EXPECT_EQ(logits, logits0) << what;
      EXPECT_EQ(picks, picks0) << what;  // ids, then weights' bits
      const double err = testing::RelativeL2(y, y0);
      EXPECT_LE(err, 1e-5) << what;
      std::printf("fused one-token MoE, %s against the general kernel: y relative L2 %.3e\n", what.c_str(), err);
    }
  }
}

// The probed instantiation (expert_decode_fused_probe.h) computes what the kernel computes at the
// 80B shape in the decode stage's form (the shared expert and the router product inside): the same
// picks, weights and logits, y within 1e-5 relative L2 (its additions' order is not fixed); every
// block of the grid stamps a row with its kind, pick, a real SM and its index, its phases in order
// (router blocks: entry and exit only).
TEST(OneTokenFusedTest, ProbedKernelGivesTheSameResultsAndOrderedStamps) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng = ::tandem::testing::SeededRng();
  const EightyBExperts m(rng);
  const int64_t h = m.kH, I = m.kI, E = m.kE;
  const int K = m.kK;
  const OneTokenExperts& ex = m.ex;
  const SharedQ8& sq = m.sq;
  const std::vector<float> w = testing::RandomVector(rng, (E + 1) * h, 0.05f);
  const std::vector<float> x = testing::RandomVector(rng, h);
  const DeviceBuffer dw = testing::Upload(w);
  DeviceBuffer counters = testing::Upload(std::vector<int32_t>(2, 0));
  const std::vector<float> zeros(static_cast<size_t>(E + 1), 0.0f), shared(static_cast<size_t>(h), 0.0f);
  OneTokenStep plain(ex, K, zeros, x, shared, 0.0f), probed(ex, K, zeros, x, shared, 0.0f);
  std::vector<float> y[2], logits[2];
  std::vector<int32_t> picks[2];
  int grid = 0;
  DeviceBuffer stamps;
  for (int run = 0; run < 2; ++run) {
    OneTokenStep& step = run == 0 ? plain : probed;
    OneTokenMoeArgs a = FusedArgs(step, ex, K, Shared::kGated, false);
    a.shared = nullptr;
    a.shared_gate_logit = a.logits + E;
    const FusedRouter router{dw.as<float>(), static_cast<int>(E + 1), step.logits.as<float>(), counters.as<int32_t>()};
    TANDEM_ASSERT_CUDA(cudaMemset(step.y.get(), 0, static_cast<size_t>(h) * sizeof(float)));
    if (run == 0) {
      TANDEM_ASSERT_CUDA(LaunchOneTokenMoeFused(a, &sq.where, nullptr, &router));
    } else {
      grid = OneTokenFusedGridBlocks(a, &sq.where, &router);
      stamps = testing::Upload(std::vector<unsigned long long>(static_cast<size_t>(grid) * kFusedProbeWords, 0));
      EXPECT_EQ(LaunchOneTokenMoeFusedProbed(a, &sq.where, nullptr, &router, nullptr), cudaErrorInvalidValue);
      TANDEM_ASSERT_CUDA(LaunchOneTokenMoeFusedProbed(a, &sq.where, nullptr, &router, stamps.as<unsigned long long>()));
    }
    TANDEM_ASSERT_CUDA(cudaDeviceSynchronize());
    y[run] = Download<float>(step.y.get(), static_cast<size_t>(h));
    logits[run] = Download<float>(step.logits.get(), static_cast<size_t>(E + 1));
    picks[run] = Download<int32_t>(step.picks.get(), static_cast<size_t>(2 * K));  // ids, then weights' bits
  }
  EXPECT_EQ(logits[0], logits[1]);
  EXPECT_EQ(picks[0], picks[1]);
  EXPECT_LE(testing::RelativeL2(y[1], y[0]), 1e-5);
  ASSERT_EQ(grid, kFusedRouterBlocks + kFusedCluster * (K * I / kFusedSliceCols + 512 / kFusedSharedSliceCols));
  const std::vector<unsigned long long> rows =
      Download<unsigned long long>(stamps.get(), static_cast<size_t>(grid) * kFusedProbeWords);
  int sm_count = 0;
  TANDEM_ASSERT_CUDA(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, 0));
  const int per_pick = static_cast<int>(I) / kFusedSliceCols * kFusedCluster;
  for (int b = 0; b < grid; ++b) {
    const unsigned long long* r = rows.data() + static_cast<size_t>(b) * kFusedProbeWords;
    const int local = b - kFusedRouterBlocks;
    const int kind = local < 0 ? kFusedProbeRouterKind : local < K * per_pick ? kFusedProbeRoutedKind : kFusedProbeSharedKind;
    EXPECT_EQ(r[kFusedProbeKind], static_cast<unsigned long long>(kind)) << "block " << b;
    const long long pick = kind == kFusedProbeRoutedKind ? local / per_pick : -1;
    EXPECT_EQ(static_cast<long long>(r[kFusedProbePick]), pick) << "block " << b;
    EXPECT_EQ(r[kFusedProbeBlock], static_cast<unsigned long long>(b));
    EXPECT_LT(r[kFusedProbeSm], static_cast<unsigned long long>(sm_count)) << "block " << b;
    const std::vector<int> order = kind == kFusedProbeRouterKind
                                       ? std::vector<int>{kFusedProbeEntry, kFusedProbeExit}
                                       : std::vector<int>{kFusedProbeEntry,         kFusedProbeAfterWait,
                                                          kFusedProbeRouted,        kFusedProbeGateUpLanded,
                                                          kFusedProbeActWritten,    kFusedProbeActGathered,
                                                          kFusedProbeDownLanded,    kFusedProbeSummed,
                                                          kFusedProbeExit};
    for (size_t i = 0; i < order.size(); ++i) {
      EXPECT_NE(r[order[i]], 0u) << "block " << b << " phase " << order[i];
      if (i > 0) {
        EXPECT_LE(r[order[i - 1]], r[order[i]]) << "block " << b << " phase " << order[i];
      }
    }
    if (kind == kFusedProbeRouterKind) {
      for (int p = kFusedProbeAfterWait; p < kFusedProbeExit; ++p) EXPECT_EQ(r[p], 0u) << "router block " << b;
    }
    // The routing detail: routed blocks only, between the wait and "routed", in order.
    const std::vector<int> detail{kFusedProbeAfterWait,      kFusedProbeCountSeen,   kFusedProbeLogitsLoaded,
                                  kFusedProbeLogitsReloaded, kFusedProbeOtherLoaded, kFusedProbePicked,
                                  kFusedProbeRouted};
    for (size_t i = 1; i + 1 < detail.size(); ++i) {
      if (kind != kFusedProbeRoutedKind) {
        EXPECT_EQ(r[detail[i]], 0u) << "block " << b << " detail " << detail[i];
        continue;
      }
      EXPECT_NE(r[detail[i]], 0u) << "block " << b << " detail " << detail[i];
      EXPECT_LE(r[detail[i - 1]], r[detail[i]]) << "block " << b << " detail " << detail[i];
      EXPECT_LE(r[detail[i]], r[detail[i + 1]]) << "block " << b << " detail " << detail[i];
    }
  }
}

// The armed probe (LaunchOneTokenMoeFusedArmedProbe with SetFusedMoeProbe's buffer), as the decode
// step's graphs launch it, at the 80B shape with the shared expert inside and the logits given:
// the same picks and y as the plain launch; every block takes one row (its block ids a permutation
// of the grid, its kind, pick and phases in order); a buffer shorter than the grid fills its rows
// and leaves the rest of the memory alone; disarmed, nothing is written.
TEST(OneTokenFusedTest, ArmedProbeStampsEveryBlockOnceAndChangesNothing) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng = ::tandem::testing::SeededRng();
  const EightyBExperts m(rng);
  constexpr int64_t h = EightyBExperts::kH, I = EightyBExperts::kI;
  constexpr int K = EightyBExperts::kK;
  const std::vector<float> logits = Logits(rng, EightyBExperts::kE, false);
  const std::vector<float> x = testing::RandomVector(rng, h);
  const std::vector<float> shared(static_cast<size_t>(h), 0.0f);
  OneTokenStep step(m.ex, K, logits, x, shared, 0.3f);
  OneTokenMoeArgs a = FusedArgs(step, m.ex, K, Shared::kGated, false);
  a.shared = nullptr;  // computed in the kernel
  const int grid = OneTokenFusedGridBlocks(a, &m.sq.where, nullptr);
  ASSERT_EQ(grid, kFusedCluster * (K * I / kFusedSliceCols + 512 / kFusedSharedSliceCols));
  const size_t words = static_cast<size_t>(grid) * kFusedProbeWords;
  DeviceBuffer stamps = testing::Upload(std::vector<unsigned long long>(words, 0));
  auto* d = stamps.as<unsigned long long>();
  // Runs: 0 plain; 1 armed with a row for every block; 2 armed with half of them; 3 disarmed.
  std::vector<float> y[4];
  std::vector<int32_t> picks[4];
  std::vector<unsigned long long> rows[4];
  for (int run = 0; run < 4; ++run) {
    TANDEM_ASSERT_CUDA(cudaMemset(step.y.get(), 0, static_cast<size_t>(h) * sizeof(float)));
    TANDEM_ASSERT_CUDA(cudaMemset(d, 0, words * sizeof(unsigned long long)));
    if (run == 0) {
      TANDEM_ASSERT_CUDA(LaunchOneTokenMoeFused(a, &m.sq.where, nullptr));
    } else {
      TANDEM_ASSERT_CUDA(SetFusedMoeProbe(run == 3 ? nullptr : d, run == 1 ? grid : grid / 2, nullptr));
      TANDEM_ASSERT_CUDA(LaunchOneTokenMoeFusedArmedProbe(a, &m.sq.where, nullptr, nullptr));
    }
    TANDEM_ASSERT_CUDA(cudaDeviceSynchronize());
    y[run] = Download<float>(step.y.get(), static_cast<size_t>(h));
    picks[run] = Download<int32_t>(step.picks.get(), static_cast<size_t>(K));
    rows[run] = Download<unsigned long long>(stamps.get(), words);
  }
  TANDEM_ASSERT_CUDA(SetFusedMoeProbe(nullptr, 0, nullptr));
  for (int run = 1; run < 4; ++run) {
    EXPECT_EQ(picks[run], picks[0]) << "run " << run;
    EXPECT_LE(testing::RelativeL2(y[run], y[0]), 1e-5) << "run " << run;
  }
  const int per_pick = static_cast<int>(I) / kFusedSliceCols * kFusedCluster;
  ::tandem::testing::ExpectEveryBlockOnce(
      rows[1], kFusedProbeWords, grid, [](const unsigned long long* r) { return r[kFusedProbeBlock]; },
      [&](int b, const unsigned long long* r) {
        const int kind = b < K * per_pick ? kFusedProbeRoutedKind : kFusedProbeSharedKind;
        EXPECT_EQ(r[kFusedProbeKind], static_cast<unsigned long long>(kind)) << "block " << b;
        EXPECT_EQ(static_cast<long long>(r[kFusedProbePick]), kind == kFusedProbeRoutedKind ? b / per_pick : -1)
            << "block " << b;
        const int order[] = {kFusedProbeEntry,        kFusedProbeAfterWait,     kFusedProbeRouted,
                             kFusedProbeGateUpLanded, kFusedProbeActWritten,    kFusedProbeActGathered,
                             kFusedProbeDownLanded,   kFusedProbeSummed,        kFusedProbeExit};
        for (size_t i = 0; i < sizeof(order) / sizeof(order[0]); ++i) {
          EXPECT_NE(r[order[i]], 0u) << "block " << b << " phase " << order[i];
          if (i > 0) {
            EXPECT_LE(r[order[i - 1]], r[order[i]]) << "block " << b << " phase " << order[i];
          }
        }
      });
  for (int slot = 0; slot < grid; ++slot) {
    const unsigned long long exit2 = rows[2][static_cast<size_t>(slot) * kFusedProbeWords + kFusedProbeExit];
    if (slot < grid / 2) {
      EXPECT_NE(exit2, 0u) << "half buffer, slot " << slot;
    } else {
      EXPECT_EQ(exit2, 0u) << "half buffer, slot " << slot;
    }
  }
  EXPECT_EQ(rows[3], std::vector<unsigned long long>(words, 0)) << "disarmed";
}

// The 80B shape (8 lanes a gate/up row, 256 down rows a block, two slices a down super-block),
// h of 2 and 4 super-blocks, E not a multiple of 32, more picks than 16, inner of 4 super-blocks.
TEST(OneTokenFusedTest, MatchesReferenceOnOtherShapes) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng = ::tandem::testing::SeededRng();
  struct Case {
    int64_t h, I, E;
    int K;
  };
  for (const Case& c : {Case{2048, 512, 512, 10}, Case{512, 1024, 1000, 24}, Case{1024, 512, 64, 32},
                        Case{1024, 256, 100, 8}}) {
    const OneTokenExperts ex(rng, c.h, c.I, c.E, std::min<int64_t>(c.K, 12));
    for (const Shared sh : {Shared::kNone, Shared::kGated}) {
      CheckFused(rng, ex, c.K, false, sh, true,
                 absl::StrCat("h=", c.h, " I=", c.I, " E=", c.E, " K=", c.K, " shared=", static_cast<int>(sh)));
    }
  }
}

// y is added to, not written: two launches on one y give twice the sum (within the bound), in a
// PDL chain on one stream.
TEST(OneTokenFusedTest, AddsIntoY) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng = ::tandem::testing::SeededRng();
  const OneTokenExperts ex(rng, 2048, 512, 512, 10);
  const int K = 10;
  const std::vector<float> logits = Logits(rng, ex.E, false);
  const std::vector<float> x = testing::RandomVector(rng, ex.h);
  const std::vector<float> shared = testing::RandomVector(rng, ex.h, 0.1f);
  OneTokenStep step(ex, K, logits, x, shared, 0.3f);
  const OneTokenMoeArgs a = FusedArgs(step, ex, K, Shared::kGated, true);
  cudaStream_t stream = nullptr;
  TANDEM_ASSERT_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  TANDEM_ASSERT_CUDA(LaunchOneTokenMoeFused(a, nullptr, stream));
  TANDEM_ASSERT_CUDA(LaunchOneTokenMoeFused(a, nullptr, stream));
  TANDEM_ASSERT_CUDA(cudaStreamSynchronize(stream));
  TANDEM_ASSERT_CUDA(cudaStreamDestroy(stream));
  std::vector<int32_t> picks;
  std::vector<float> weights;
  std::vector<float> want = ReferenceY(ex, K, logits, x, shared, 0.3f, Shared::kGated, &picks, &weights);
  for (float& v : want) v *= 2.0f;
  const std::vector<float> got = Download<float>(step.y.get(), static_cast<size_t>(ex.h));
  ASSERT_TRUE(testing::AllFinite(got));
  EXPECT_LE(testing::RelativeL2(got, want), kTol);
}

// A pick of an expert without a location sets the error flag and adds nothing; the other picks
// still do, and the picks are published.
TEST(OneTokenFusedTest, PickWithoutALocationIsFlaggedAndSkipped) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng = ::tandem::testing::SeededRng();
  const one_token_testing::MissingFirstPick c(rng);
  c.CheckStep(
      [&](OneTokenStep& step) {
        const OneTokenMoeArgs a = FusedArgs(step, c.ex, c.kK, Shared::kNone, false);
        TANDEM_ASSERT_CUDA(LaunchOneTokenMoeFused(a, nullptr, nullptr));
        TANDEM_ASSERT_CUDA(cudaDeviceSynchronize());
      },
      kTol, "fused");
}

// The flag written into page-locked host memory through its mapped address (as the MoE stage
// passes it, MoeStage::Impl::error_word): set by the bad pick, readable on the host after the
// launch with no copy.
TEST(OneTokenFusedTest, PickWithoutALocationFlagsAMappedHostWord) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng = ::tandem::testing::SeededRng();
  const one_token_testing::MissingFirstPick c(rng);
  absl::StatusOr<PinnedBuffer> word = PinnedBuffer::Allocate(sizeof(int));
  ASSERT_TRUE(word.ok()) << word.status();
  for (bool missing : {false, true}) {
    *word->as<int>() = 0;
    void* mapped = nullptr;
    TANDEM_ASSERT_CUDA(cudaHostGetDevicePointer(&mapped, word->get(), 0));
    std::vector<float> logits = c.logits;
    if (!missing) logits[5] = -3.0f;  // expert 5 (no location) is not picked
    OneTokenStep step(c.ex, c.kK, logits, c.x, std::vector<float>(static_cast<size_t>(c.kH), 0.0f), 0.0f);
    OneTokenMoeArgs a = FusedArgs(step, c.ex, c.kK, Shared::kNone, false);
    a.error = static_cast<int*>(mapped);
    TANDEM_ASSERT_CUDA(LaunchOneTokenMoeFused(a, nullptr, nullptr));
    TANDEM_ASSERT_CUDA(cudaDeviceSynchronize());
    EXPECT_EQ(*static_cast<volatile int*>(word->as<int>()), missing ? 1 : 0) << (missing ? "missing" : "all placed");
  }
}

TEST(OneTokenFusedTest, RefusesWhatItCannotRun) {
  EXPECT_TRUE(OneTokenFusedFits(512, 10, 2048, 512));
  EXPECT_FALSE(OneTokenFusedFits(512, 10, 768, 512));    // 3 super-blocks a gate/up row
  EXPECT_FALSE(OneTokenFusedFits(512, 10, 4096, 512));   // 16: a warp step is 2 rows, not 4
  EXPECT_FALSE(OneTokenFusedFits(512, 10, 2048, 384));   // inner not whole super-blocks
  EXPECT_FALSE(OneTokenFusedFits(2048, 10, 2048, 512));  // E above kOneTokenMaxExperts
  EXPECT_FALSE(OneTokenFusedFits(512, 33, 2048, 512));   // K above kOneTokenMaxPicks
  EXPECT_FALSE(OneTokenFusedFits(8, 10, 2048, 512));     // K above E
  std::mt19937 rng = ::tandem::testing::SeededRng();
  if (!testing::HaveGpu()) return;
  const OneTokenExperts ex(rng, 256, 256, 64, 4);
  OneTokenStep step(ex, 4, Logits(rng, 64, false), testing::RandomVector(rng, 256),
                    std::vector<float>(256, 0.0f), 0.0f);
  OneTokenMoeArgs a = FusedArgs(step, ex, 4, Shared::kNone, false);
  a.int16_activations = false;  // the f32 products are the two-kernel form's
  EXPECT_EQ(LaunchOneTokenMoeFused(a, nullptr, nullptr), cudaErrorInvalidValue);
  a.int16_activations = true;
  a.logit_route = false;  // the f64 softmax routing too
  EXPECT_EQ(LaunchOneTokenMoeFused(a, nullptr, nullptr), cudaErrorInvalidValue);
  a.logit_route = true;
  const FusedSharedExpert narrow{step.x.get(), step.x.get(), step.x.get(), 32};  // 32 columns: under one slice
  EXPECT_FALSE(OneTokenFusedTakesShared(256, 64));   // h = 256: 16 columns a lane, under one Q8_0 block
  EXPECT_FALSE(OneTokenFusedTakesShared(2048, 96));  // not whole slices of 64
  EXPECT_EQ(LaunchOneTokenMoeFused(a, &narrow, nullptr), cudaErrorInvalidValue);
  a.y = nullptr;
  EXPECT_EQ(LaunchOneTokenMoeFused(a, nullptr, nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace tandem::cuda
