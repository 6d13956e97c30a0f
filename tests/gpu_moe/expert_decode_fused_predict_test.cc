// The fused one-token MoE kernel with a prediction of its picks (FusedPrediction,
// expert_decode_fused.cuh): whatever the guesses hold (right in order or in another order, half
// right, one id repeated, invalid ids, right ids only past the first K (L2 hints), fewer guesses
// than picks, 32 of them, random mixes), the launch gives the picks and weights of the launch
// without a prediction to the bit, the same error flag, and y within 1e-5 relative L2 (only the
// order of its atomic additions differs). The picks lie on experts of distinct weight sets and the
// wrong guesses on sets of no pick, so serving a pick with another expert's rows would show in y.
// The probed launch reports each routed block's guess and the expert it served (served_pick.h's
// rule); a prediction that is not 1 .. kFusedPredictMax ids, or comes with router blocks, is
// refused.
#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gpu_service/backends/cuda/device_buffer.h"
#include "gpu_service/backends/cuda/moe/expert_decode_fused.cuh"
#include "gpu_service/backends/cuda/moe/expert_decode_fused_probe.h"
#include "gpu_service/backends/cuda/moe/served_pick.h"
#include "tests/gpu_moe/expert_decode_fused_case.h"
#include "tests/gpu_moe/one_token_support.h"
#include "tests/gpu_moe/test_support.h"
#include "tests/test_seed.h"

namespace tandem::cuda {
namespace {

using fused_testing::EightyBExperts;
using fused_testing::FusedArgs;
using fused_testing::SharedQ8;
using one_token_testing::Logits;
using one_token_testing::OneTokenExperts;
using one_token_testing::OneTokenStep;
using one_token_testing::ReferenceY;
using one_token_testing::Shared;
using testing::Download;

constexpr double kRefTol = 5e-4;  // the launch without a prediction against the CPU reference
constexpr double kSameY = 1e-5;   // with a prediction against without: the additions' order only

// Router logits whose K largest lie on experts of K distinct weight sets (expert e uses the set
// e % sets, OneTokenExperts), the others clamped well below them. sets >= K.
std::vector<float> DistinctSetLogits(std::mt19937& rng, int64_t E, int K, int64_t sets) {
  std::vector<float> v = Logits(rng, E, false);
  for (float& f : v) f = std::clamp(f, -4.0f, 4.0f);
  std::vector<int64_t> order(static_cast<size_t>(sets));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  std::uniform_real_distribution<float> top(5.0f, 8.0f);
  for (int k = 0; k < K; ++k) {
    const int64_t s = order[k];
    const int64_t experts = (E - 1 - s) / sets + 1;  // of set s
    v[static_cast<size_t>(s + sets * static_cast<int64_t>(rng() % experts))] = top(rng);
  }
  return v;
}

// One prediction: its ids (count = ids.size()).
struct Form {
  std::string name;
  std::vector<int> ids;
};

// The prediction forms for one step's picks. wrong: valid ids, not picks, of weight sets no pick
// uses (their rows differ from every pick's).
std::vector<Form> Forms(std::mt19937& rng, const std::vector<int>& picks, const std::vector<int>& wrong, int E) {
  const int K = static_cast<int>(picks.size());
  auto any_wrong = [&] { return wrong[rng() % wrong.size()]; };
  std::vector<Form> forms;
  forms.push_back({"all right in order", picks});
  forms.push_back({"all right reversed", std::vector<int>(picks.rbegin(), picks.rend())});
  {
    std::vector<int> ids(static_cast<size_t>(K));
    for (int k = 0; k < K; ++k) ids[k] = k % 2 == 0 ? picks[K - 1 - k] : any_wrong();
    forms.push_back({"half right", ids});
  }
  forms.push_back({"one right id repeated", std::vector<int>(static_cast<size_t>(K), picks[K / 2])});
  {
    std::vector<int> ids(static_cast<size_t>(K));
    for (int k = 0; k < K; ++k) ids[k] = any_wrong();
    forms.push_back({"none right", ids});
  }
  {
    const int invalid[] = {-1, E, INT_MAX, INT_MIN};
    std::vector<int> ids(static_cast<size_t>(K));
    for (int k = 0; k < K; ++k) ids[k] = invalid[k % 4];
    forms.push_back({"all invalid", ids});
  }
  if (K < kFusedPredictMax) {  // the picks only past the first K: L2 hints, no copies
    const int count = std::min(2 * K, kFusedPredictMax);
    std::vector<int> ids(static_cast<size_t>(count));
    std::vector<int> shuffled = picks;
    std::shuffle(shuffled.begin(), shuffled.end(), rng);
    for (int i = 0; i < count; ++i) ids[i] = i < K ? any_wrong() : shuffled[i - K];
    forms.push_back({"right ids past K only", ids});
  }
  if (K > 1) {  // fewer guesses than picks: the groups past them have none
    const int count = K / 2;
    std::vector<int> ids(static_cast<size_t>(count));
    for (int i = 0; i < count; ++i) ids[i] = picks[K - 1 - i];
    forms.push_back({"count below K", ids});
  }
  {
    std::vector<int> ids(static_cast<size_t>(kFusedPredictMax));
    for (int i = 0; i < kFusedPredictMax; ++i) {
      ids[i] = i < K ? picks[(i + 1) % K] : (i % 2 == 0 ? picks[rng() % K] : any_wrong());
    }
    forms.push_back({"32 ids", ids});
  }
  for (int m = 0; m < 3; ++m) {
    const int count = 1 + static_cast<int>(rng() % kFusedPredictMax);
    std::vector<int> ids(static_cast<size_t>(count));
    for (int i = 0; i < count; ++i) {
      const unsigned kind = rng() % 4;
      ids[i] = kind == 0   ? picks[rng() % K]
               : kind == 1 ? any_wrong()
               : kind == 2 ? static_cast<int>(rng() % E)
                           : (rng() % 2 == 0 ? -1 : E);
    }
    forms.push_back({absl::StrCat("random mix ", m, " of ", count), ids});
  }
  return forms;
}

// The valid ids that are no pick and whose weight set no pick uses.
std::vector<int> WrongIds(const std::vector<int>& picks, int64_t E, int64_t sets) {
  std::vector<bool> used(static_cast<size_t>(sets), false);
  for (int p : picks) used[static_cast<size_t>(p % sets)] = true;
  std::vector<int> wrong;
  for (int64_t e = 0; e < E; ++e) {
    if (!used[static_cast<size_t>(e % sets)]) wrong.push_back(static_cast<int>(e));
  }
  return wrong;
}

// What one launch left: y, the picks' ids then the weights' bits, the error flag.
struct Outputs {
  std::vector<float> y;
  std::vector<int32_t> picks;
  int error = 0;
};

Outputs Read(const OneTokenStep& step, int64_t h, int K) {
  Outputs o;
  o.y = Download<float>(step.y.get(), static_cast<size_t>(h));
  o.picks = Download<int32_t>(step.picks.get(), static_cast<size_t>(2 * K));
  o.error = Download<int32_t>(step.ints.get(), 1)[0];
  return o;
}

// Fresh outputs before a launch: y zero (it accumulates), the picks poisoned, the flag clear.
void ResetOutputs(OneTokenStep& step, int64_t h, int K) {
  EXPECT_EQ(cudaMemset(step.y.get(), 0, static_cast<size_t>(h) * sizeof(float)), cudaSuccess);
  EXPECT_EQ(cudaMemset(step.picks.get(), 0xFF, static_cast<size_t>(2 * K) * sizeof(int32_t)), cudaSuccess);
  EXPECT_EQ(cudaMemset(step.ints.get(), 0, sizeof(int32_t)), cudaSuccess);
}

// The picks' experts of a launch's outputs.
std::vector<int> PickIds(const Outputs& o, int K) { return std::vector<int>(o.picks.begin(), o.picks.begin() + K); }

// Every prediction form on several shapes (the 80B one with the shared expert inside; E <= 128,
// E < 512 with 16 logits a lane, K = 32 and K = 1), x staged before or after the wait, the routing
// warp 0 or by slot: the picks and weights to the bit, the flag, and y within kSameY of the launch
// without a prediction on the same inputs; each with and without the guesses' down rows asked into
// L2 (FusedPrediction::down_l2), with K pick groups and with three more (FusedPrediction::groups).
TEST(OneTokenFusedPredictTest, EveryPredictionGivesTheResultsWithoutOne) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng = ::tandem::testing::SeededRng();
  struct Case {
    int64_t h, I, E;
    int K;
    int64_t sets;
    bool shared_inside;
  };
  for (const Case& c : {Case{2048, 512, 512, 10, 20, true}, Case{1024, 256, 100, 8, 16, false},
                        Case{512, 256, 64, 32, 64, false}, Case{256, 256, 300, 1, 4, false}}) {
    ASSERT_TRUE(OneTokenFusedFits(static_cast<int>(c.E), c.K, static_cast<int>(c.h), static_cast<int>(c.I)));
    const OneTokenExperts ex(rng, c.h, c.I, c.E, c.sets);
    std::unique_ptr<SharedQ8> sq;
    if (c.shared_inside) sq = std::make_unique<SharedQ8>(rng, c.h, 512);
    struct Config {
      bool x_early, by_slot;
      Shared sh;
    };
    for (const Config& cfg : {Config{false, false, Shared::kGated}, Config{true, true, Shared::kNone}}) {
      const std::string shape = absl::StrCat("h=", c.h, " I=", c.I, " E=", c.E, " K=", c.K, cfg.x_early ? " x early" : "",
                                             cfg.by_slot ? " routing warp by slot" : "",
                                             cfg.sh == Shared::kNone ? "" : sq ? " shared expert inside" : " shared term");
      const std::vector<float> logits = DistinctSetLogits(rng, c.E, c.K, c.sets);
      const std::vector<float> x = testing::RandomVector(rng, c.h);
      const bool inside = sq != nullptr && cfg.sh != Shared::kNone;
      const std::vector<float> shared = inside ? sq->Reference(c.h, x) : testing::RandomVector(rng, c.h, 0.1f);
      const float gate_logit = testing::RandomVector(rng, 1)[0];
      OneTokenStep step(ex, c.K, logits, x, shared, gate_logit);
      OneTokenMoeArgs a = FusedArgs(step, ex, c.K, cfg.sh, cfg.x_early);
      if (inside) a.shared = nullptr;  // computed in the kernel
      a.pick_warp_by_slot = cfg.by_slot;
      const FusedSharedExpert* where = inside ? &sq->where : nullptr;
      // Without a prediction: the reference's picks and y.
      ResetOutputs(step, c.h, c.K);
      TANDEM_ASSERT_CUDA(LaunchOneTokenMoeFused(a, where, nullptr));
      TANDEM_ASSERT_CUDA(cudaDeviceSynchronize());
      const Outputs base = Read(step, c.h, c.K);
      std::vector<int32_t> want_picks;
      std::vector<float> want_weights;
      const std::vector<float> want = ReferenceY(ex, c.K, logits, x, shared, gate_logit, cfg.sh, &want_picks, &want_weights);
      const std::vector<int> picks = PickIds(base, c.K);
      ASSERT_EQ(std::vector<int32_t>(picks.begin(), picks.end()), want_picks) << shape;
      ASSERT_EQ(base.error, 0) << shape;
      ASSERT_TRUE(testing::AllFinite(base.y)) << shape;
      ASSERT_LE(testing::RelativeL2(base.y, want), kRefTol) << shape;
      std::vector<bool> set_used(static_cast<size_t>(c.sets), false);
      for (int p : picks) {
        ASSERT_FALSE(set_used[static_cast<size_t>(p % c.sets)]) << shape << ": two picks share a weight set";
        set_used[static_cast<size_t>(p % c.sets)] = true;
      }
      const std::vector<int> wrong = WrongIds(picks, c.E, c.sets);
      ASSERT_FALSE(wrong.empty()) << shape;
      // K pick groups, and (but at K = 32) three more than picks.
      std::vector<int> group_counts = {0};
      if (c.K < kOneTokenMaxPicks) group_counts.push_back(std::min(c.K + 3, kOneTokenMaxPicks));
      for (const Form& f : Forms(rng, picks, wrong, static_cast<int>(c.E))) {
        const DeviceBuffer ids = testing::Upload(f.ids);
        for (int v = 0; v < 2 * static_cast<int>(group_counts.size()); ++v) {
          const bool down_l2 = v % 2 == 1;  // the guesses' down rows into L2 or not
          const int groups = group_counts[v / 2];
          const std::string what = absl::StrCat(shape, ", ", f.name, " (", f.ids.size(), " ids)",
                                                down_l2 ? ", down rows into L2" : "",
                                                groups != 0 ? absl::StrCat(", ", groups, " pick groups") : "");
          const FusedPrediction pd{ids.as<int>(), static_cast<int>(f.ids.size()), down_l2, groups};
          ResetOutputs(step, c.h, c.K);
          TANDEM_ASSERT_CUDA(LaunchOneTokenMoeFused(a, where, nullptr, nullptr, &pd));
          TANDEM_ASSERT_CUDA(cudaDeviceSynchronize());
          const Outputs got = Read(step, c.h, c.K);
          EXPECT_EQ(got.picks, base.picks) << what << ": picks or weights' bits";
          EXPECT_EQ(got.error, base.error) << what;
          ASSERT_TRUE(testing::AllFinite(got.y)) << what;
          const double err = testing::RelativeL2(got.y, base.y);
          EXPECT_LE(err, kSameY) << what;
          std::printf("fused one-token MoE with a prediction, %s: y relative L2 to without %.3e\n", what.c_str(), err);
        }
      }
    }
  }
}

// The probed launch with a prediction at the 80B shape (the shared expert inside): every routed
// block's kFusedProbeSpeculated word holds its group's guess (none where the id is invalid or
// past the count), the expert it served (the pick served_pick.h's rule gives its group) and
// whether the two are one; the shared blocks' word is 0, as every block's is without a prediction.
// With three pick groups more than picks, the grid grows by theirs and the groups left without a
// pick serve none. The results are the plain launch's.
TEST(OneTokenFusedPredictTest, ProbeReportsTheGuessAndThePickServed) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng = ::tandem::testing::SeededRng();
  constexpr int64_t kSets = 16;
  const EightyBExperts m(rng, kSets);
  constexpr int64_t h = EightyBExperts::kH, I = EightyBExperts::kI, E = EightyBExperts::kE;
  constexpr int K = EightyBExperts::kK;
  ASSERT_TRUE(OneTokenFusedProbeTakes(static_cast<int>(E)));
  const std::vector<float> logits = DistinctSetLogits(rng, E, K, kSets);
  const std::vector<float> x = testing::RandomVector(rng, h);
  OneTokenStep step(m.ex, K, logits, x, std::vector<float>(static_cast<size_t>(h), 0.0f), 0.3f);
  OneTokenMoeArgs a = FusedArgs(step, m.ex, K, Shared::kGated, false);
  a.shared = nullptr;  // computed in the kernel
  const int grid = OneTokenFusedGridBlocks(a, &m.sq.where, nullptr);
  const int per_pick = static_cast<int>(I) / kFusedSliceCols * kFusedCluster;
  ASSERT_EQ(grid, kFusedCluster * (K * I / kFusedSliceCols + 512 / kFusedSharedSliceCols));
  constexpr int kMoreGroups = K + 3;  // three pick groups more than picks (FusedPrediction::groups)
  const size_t max_words = static_cast<size_t>(grid + (kMoreGroups - K) * per_pick) * kFusedProbeWords;
  DeviceBuffer stamps = testing::Upload(std::vector<unsigned long long>(max_words, 0));
  auto* d = stamps.as<unsigned long long>();
  ResetOutputs(step, h, K);
  TANDEM_ASSERT_CUDA(LaunchOneTokenMoeFused(a, &m.sq.where, nullptr));
  TANDEM_ASSERT_CUDA(cudaDeviceSynchronize());
  const Outputs base = Read(step, h, K);
  ASSERT_EQ(base.error, 0);
  const std::vector<int> picks = PickIds(base, K);
  // Without a prediction: no block writes the word.
  ResetOutputs(step, h, K);
  TANDEM_ASSERT_CUDA(LaunchOneTokenMoeFusedProbed(a, &m.sq.where, nullptr, nullptr, d));
  TANDEM_ASSERT_CUDA(cudaDeviceSynchronize());
  {
    const std::vector<unsigned long long> rows =
        Download<unsigned long long>(d, static_cast<size_t>(grid) * kFusedProbeWords);
    for (int b = 0; b < grid; ++b) {
      EXPECT_EQ(rows[static_cast<size_t>(b) * kFusedProbeWords + kFusedProbeSpeculated], 0u) << "no prediction, block " << b;
    }
  }
  for (const Form& f : Forms(rng, picks, WrongIds(picks, E, kSets), static_cast<int>(E))) {
    const DeviceBuffer ids = testing::Upload(f.ids);
    for (const int groups : {0, kMoreGroups}) {
      const int G = groups != 0 ? groups : K;
      const std::string what = absl::StrCat(f.name, " (", f.ids.size(), " ids, ", G, " pick groups)");
      const FusedPrediction pd{ids.as<int>(), static_cast<int>(f.ids.size()), false, groups};
      const int pd_grid = OneTokenFusedGridBlocks(a, &m.sq.where, nullptr, &pd);
      ASSERT_EQ(pd_grid, grid + (G - K) * per_pick) << what;
      const size_t words = static_cast<size_t>(pd_grid) * kFusedProbeWords;
      ResetOutputs(step, h, K);
      TANDEM_ASSERT_CUDA(cudaMemset(d, 0, words * sizeof(unsigned long long)));
      TANDEM_ASSERT_CUDA(LaunchOneTokenMoeFusedProbed(a, &m.sq.where, nullptr, nullptr, d, &pd));
      TANDEM_ASSERT_CUDA(cudaDeviceSynchronize());
      const Outputs got = Read(step, h, K);
      EXPECT_EQ(got.picks, base.picks) << what;
      EXPECT_EQ(got.error, base.error) << what;
      EXPECT_LE(testing::RelativeL2(got.y, base.y), kSameY) << what;
      // Group g's guess as the kernel takes it (served_pick.h: an id outside [0, E) is none).
      std::vector<int> guesses(static_cast<size_t>(G), -1);
      for (int g = 0; g < G && g < static_cast<int>(f.ids.size()); ++g) {
        if (f.ids[g] >= 0 && f.ids[g] < E) guesses[g] = f.ids[g];
      }
      const std::vector<unsigned long long> rows = Download<unsigned long long>(d, words);
      int hits = 0, idle = 0;
      for (int b = 0; b < pd_grid; ++b) {
        const unsigned long long* r = rows.data() + static_cast<size_t>(b) * kFusedProbeWords;
        if (b >= G * per_pick) {
          EXPECT_EQ(r[kFusedProbeKind], static_cast<unsigned long long>(kFusedProbeSharedKind)) << what << ", block " << b;
          EXPECT_EQ(r[kFusedProbeSpeculated], 0u) << what << ", shared block " << b;
          continue;
        }
        const int k = b / per_pick;
        ASSERT_EQ(static_cast<long long>(r[kFusedProbePick]), k) << what << ", block " << b;
        const FusedProbeSpeculation s = DecodeFusedProbeSpeculation(r[kFusedProbeSpeculated]);
        EXPECT_TRUE(s.written) << what << ", block " << b << " (group " << k << ")";
        const int j = ServedPickOfGroups(guesses.data(), G, picks.data(), K, static_cast<int>(E), k);
        const int served = j >= 0 ? picks[j] : -1;
        EXPECT_EQ(s.guess, guesses[k]) << what << ", block " << b << " (group " << k << ")";
        EXPECT_EQ(s.served, served) << what << ", block " << b << " (group " << k << ")";
        EXPECT_EQ(s.hit, s.guess >= 0 && s.guess == s.served) << what << ", block " << b << " (group " << k << ")";
        hits += s.hit ? 1 : 0;
        idle += served < 0 ? 1 : 0;
        if (groups == 0 && f.name == "all right reversed") {
          EXPECT_TRUE(s.hit) << what << ", block " << b;
          EXPECT_EQ(s.served, picks[K - 1 - k]) << what << ", block " << b;
        }
        if (f.name == "all invalid" || f.name == "none right") {
          EXPECT_EQ(s.served, k < K ? picks[k] : -1) << what << ", block " << b << ": no match, its own pick";
        }
      }
      EXPECT_EQ(idle, (G - K) * per_pick) << what << ": the groups past the picks";
      std::printf("fused one-token MoE probed with a prediction, %s: %d of %d routed blocks hit\n", what.c_str(), hits,
                  G * per_pick);
    }
  }
}

// A prediction of 0 or more than kFusedPredictMax ids, without ids, with fewer pick groups than
// picks or more than kOneTokenMaxPicks, or with router blocks is refused (plain and probed
// launches) and launches nothing; a valid one runs.
TEST(OneTokenFusedPredictTest, RefusesWhatItCannotTake) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng = ::tandem::testing::SeededRng();
  constexpr int64_t h = 256, I = 256, E = 300;  // E the probed form takes (OneTokenFusedProbeTakes)
  constexpr int K = 4;
  ASSERT_TRUE(OneTokenFusedFits(static_cast<int>(E), K, static_cast<int>(h), static_cast<int>(I)));
  ASSERT_TRUE(OneTokenFusedProbeTakes(static_cast<int>(E)));
  const OneTokenExperts ex(rng, h, I, E, 4);
  OneTokenStep step(ex, K, Logits(rng, E, false), testing::RandomVector(rng, h), std::vector<float>(h, 0.0f), 0.0f);
  OneTokenMoeArgs a = FusedArgs(step, ex, K, Shared::kNone, false);
  const DeviceBuffer ids = testing::Upload(std::vector<int>(kFusedPredictMax + 1, 1));
  const DeviceBuffer w = testing::Upload(testing::RandomVector(rng, E * h, 0.05f));
  const DeviceBuffer counters = testing::Upload(std::vector<int32_t>(2, 0));
  const FusedRouter router{w.as<float>(), static_cast<int>(E), step.logits.as<float>(), counters.as<int32_t>()};
  DeviceBuffer stamps = testing::Upload(std::vector<unsigned long long>(4096 * kFusedProbeWords, 0));
  for (const FusedPrediction& bad : {FusedPrediction{ids.as<int>(), 0}, FusedPrediction{ids.as<int>(), -1},
                                     FusedPrediction{ids.as<int>(), kFusedPredictMax + 1},
                                     FusedPrediction{nullptr, K},
                                     FusedPrediction{ids.as<int>(), K, false, K - 1},
                                     FusedPrediction{ids.as<int>(), K, false, kOneTokenMaxPicks + 1}}) {
    const std::string what =
        absl::StrCat("count ", bad.count, bad.ids == nullptr ? ", no ids" : "", ", groups ", bad.groups);
    EXPECT_EQ(LaunchOneTokenMoeFused(a, nullptr, nullptr, nullptr, &bad), cudaErrorInvalidValue) << what;
    EXPECT_EQ(LaunchOneTokenMoeFusedProbed(a, nullptr, nullptr, nullptr, stamps.as<unsigned long long>(), &bad),
              cudaErrorInvalidValue)
        << what << ", probed";
  }
  const FusedPrediction good{ids.as<int>(), K};
  EXPECT_EQ(LaunchOneTokenMoeFused(a, nullptr, nullptr, &router, &good), cudaErrorInvalidValue) << "with a router";
  EXPECT_EQ(LaunchOneTokenMoeFusedProbed(a, nullptr, nullptr, &router, stamps.as<unsigned long long>(), &good),
            cudaErrorInvalidValue)
      << "with a router, probed";
  TANDEM_ASSERT_CUDA(cudaDeviceSynchronize());
  EXPECT_EQ(Download<float>(step.y.get(), static_cast<size_t>(h)), std::vector<float>(h, 0.0f))
      << "a refused launch wrote y";
  TANDEM_ASSERT_CUDA(LaunchOneTokenMoeFused(a, nullptr, nullptr, nullptr, &good));
  TANDEM_ASSERT_CUDA(cudaDeviceSynchronize());
  EXPECT_EQ(Download<int32_t>(step.ints.get(), 1)[0], 0);
}

}  // namespace
}  // namespace tandem::cuda
