// The one-token MoE kernels (expert_decode_one.cuh) against the CPU reference (routing, expert
// FFN, weighted sum with the gated shared expert) and against the planned path they replace at
// n = 1 (plan kernel with fused routing, gate/up and down over units, scatter-sum).
#include "gpu_service/backends/cuda/moe/expert_decode_one.cuh"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/reference/moe.h"
#include "gpu_service/backends/cuda/kernels/norm_streams.cuh"
#include "gpu_service/backends/cuda/moe/device_plan.cuh"
#include "gpu_service/backends/cuda/moe/expert_decode_one_probe.h"
#include "gpu_service/backends/cuda/moe/experts.h"
#include "gpu_service/backends/cuda/moe/moe_scatter.cuh"
#include "tests/gpu_moe/one_token_support.h"
#include "tests/gpu_moe/test_support.h"
#include "tests/test_seed.h"

namespace tandem::cuda {
namespace {

using testing::Download;
using testing::PoisonedBuffer;
using testing::RandomMatrix;
using testing::Upload;
using one_token_testing::Logits;
using one_token_testing::OneTokenExperts;
using one_token_testing::OneTokenStep;
using one_token_testing::ReferenceY;
using one_token_testing::Shared;

// The kernels' options (OneTokenMoeArgs): int16 activations, routing by the logits, x staged before
// the wait, per-pick completion counts (`counts`: K + 1 zeroed ints the caller owns).
struct Variant {
  bool int16 = false;
  bool logit_route = false;
  bool x_early = false;
  int* counts = nullptr;
  void Apply(OneTokenMoeArgs& a) const {
    a.int16_activations = int16;
    a.logit_route = logit_route;
    a.x_written_earlier = x_early;
    a.pick_counts = counts;
  }
};

// Runs the two kernels and checks picks, weights and y against the reference (y within relative
// L2 `tol`). v.int16: the kernels' int16-activation form (OneTokenMoeArgs::int16_activations);
// zero_x: x all zeros (every act row zero: the int16 form's zero-scale blocks).
void CheckAgainstReference(std::mt19937& rng, const OneTokenExperts& ex, int K, bool ties, Shared sh,
                           const std::string& what, Variant v = {}, double tol = 1e-5, bool zero_x = false) {
  const bool int16 = v.int16;
  const std::vector<float> logits = Logits(rng, ex.E, ties);
  std::vector<float> x = testing::RandomVector(rng, ex.h);
  if (zero_x) std::fill(x.begin(), x.end(), 0.0f);
  const std::vector<float> shared = testing::RandomVector(rng, ex.h, 0.1f);
  const float gate_logit = testing::RandomVector(rng, 1)[0];
  OneTokenStep step(ex, K, logits, x, shared, gate_logit);
  OneTokenMoeArgs a = step.Args(ex, K, sh);
  v.Apply(a);
  TANDEM_ASSERT_CUDA(LaunchOneTokenMoeGateUp(a, nullptr));
  TANDEM_ASSERT_CUDA(LaunchOneTokenMoeDown(a, nullptr));
  const std::vector<float> got = Download<float>(step.y.get(), static_cast<size_t>(ex.h));
  const std::vector<int32_t> picks = Download<int32_t>(step.picks.get(), static_cast<size_t>(K));
  const std::vector<float> weights = Download<float>(step.picks.as<int32_t>() + K, static_cast<size_t>(K));
  const std::vector<int32_t> err = Download<int32_t>(step.ints.get(), 1);
  std::vector<int32_t> want_picks;
  std::vector<float> want_weights;
  const std::vector<float> want = ReferenceY(ex, K, logits, x, shared, gate_logit, sh, &want_picks, &want_weights);
  EXPECT_EQ(picks, want_picks) << what;
  for (int k = 0; k < K; ++k) EXPECT_NEAR(weights[k], want_weights[k], 1e-6) << what << " pick " << k;
  EXPECT_EQ(err[0], 0) << what;
  ASSERT_TRUE(testing::AllFinite(got)) << "unwritten rows of y, " << what;
  const double err_l2 = testing::RelativeL2(got, want);
  EXPECT_LE(err_l2, tol) << what;
  if (int16) std::printf("int16 activations, %s: y relative L2 %.3e\n", what.c_str(), err_l2);
}

TEST(OneTokenMoeTest, MatchesReferenceForEveryKUpTo16) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng = ::tandem::testing::SeededRng();
  for (const int64_t E : {128, 512}) {
    const OneTokenExperts ex(rng, 256, 256, E, 24);
    for (int K = 1; K <= 16; ++K) {
      for (const bool ties : {false, true}) {
        for (const Shared sh : {Shared::kNone, Shared::kUngated, Shared::kGated}) {
          CheckAgainstReference(rng, ex, K, ties, sh,
                                absl::StrCat("E=", E, " K=", K, ties ? " ties" : "", " shared=", static_cast<int>(sh)));
        }
      }
    }
  }
}

// Row geometries of the tile kernels: the 80B shape (8 lanes a gate/up row, 2 a down row), rows
// that do not divide 32 lanes (3 super-blocks: 10 rows a step, 2 lanes idle), rows of one lane,
// E not a multiple of 32, and more picks than the down kernel has warps.
struct ShapeCase {
  int64_t h, I, E;
  int K;
};
constexpr ShapeCase kOtherShapes[] = {{2048, 512, 512, 10}, {768, 768, 100, 8}, {512, 1024, 1000, 24}, {1024, 512, 64, 32}};

// CheckAgainstReference over kOtherShapes, without and with a gated shared expert.
void CheckOtherShapes(std::mt19937& rng, Variant v, double tol) {
  for (const ShapeCase& c : kOtherShapes) {
    const OneTokenExperts ex(rng, c.h, c.I, c.E, std::min<int64_t>(c.K, 12));
    ASSERT_TRUE(OneTokenMoeFits(static_cast<int>(c.E), c.K, static_cast<int>(c.h), static_cast<int>(c.I)));
    for (const Shared sh : {Shared::kNone, Shared::kGated}) {
      CheckAgainstReference(rng, ex, c.K, false, sh,
                            absl::StrCat("h=", c.h, " I=", c.I, " E=", c.E, " K=", c.K, " shared=", static_cast<int>(sh)),
                            v, tol);
    }
  }
}

TEST(OneTokenMoeTest, MatchesReferenceOnOtherShapes) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng = ::tandem::testing::SeededRng();
  CheckOtherShapes(rng, Variant{}, 1e-5);
}

// The fast mode's form: x and act quantized to int16 per 256 elements, the Q4_K products on dp2a.
// The routing is the same code (picks and weights as exact as above); y within 5e-4 relative L2
// of the f32 reference (an element's error is at most 1.5e-5 of its block's largest; the H200
// measured at most 2.4e-4 here on 2026-12-02; the kernel tolerance for quantized-activation paths
// is 2e-2), on several K, ties, every shared form, an all-zero x (zero-scale blocks give zero
// products) and kOtherShapes.
TEST(OneTokenMoeTest, Int16ActivationsMatchReference) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng = ::tandem::testing::SeededRng();
  {
    const OneTokenExperts ex(rng, 256, 256, 128, 24);
    for (const int K : {1, 5, 16}) {
      for (const bool ties : {false, true}) {
        for (const Shared sh : {Shared::kNone, Shared::kUngated, Shared::kGated}) {
          CheckAgainstReference(rng, ex, K, ties, sh,
                                absl::StrCat("E=128 K=", K, ties ? " ties" : "", " shared=", static_cast<int>(sh)),
                                Variant{.int16 = true}, 5e-4);
        }
      }
    }
    CheckAgainstReference(rng, ex, 4, false, Shared::kGated, "E=128 K=4 x = 0", Variant{.int16 = true}, 5e-4,
                          /*zero_x=*/true);
  }
  CheckOtherShapes(rng, Variant{.int16 = true}, 5e-4);
}

// The fast mode's routing by the top-K logits (OneTokenMoeArgs::logit_route, block_route.cuh's
// WarpPickLogits and PickWeights): the reference's picks (ties on a coarse grid included: equal
// logits give equal probabilities, the lowest id first in both), its weights within 1e-6 (the
// check's bound), y as close as with its routing; f32 and int16 products, every shared form,
// kOtherShapes.
TEST(OneTokenMoeTest, LogitRouteMatchesReference) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng = ::tandem::testing::SeededRng();
  for (const int64_t E : {128, 512}) {
    const OneTokenExperts ex(rng, 256, 256, E, 24);
    for (const int K : {1, 2, 7, 10, 16}) {
      for (const bool ties : {false, true}) {
        for (const Shared sh : {Shared::kNone, Shared::kGated}) {
          const std::string what = absl::StrCat("E=", E, " K=", K, ties ? " ties" : "", " shared=", static_cast<int>(sh));
          CheckAgainstReference(rng, ex, K, ties, sh, what, Variant{.logit_route = true});
          CheckAgainstReference(rng, ex, K, ties, sh, what + " int16", Variant{.int16 = true, .logit_route = true}, 5e-4);
        }
      }
    }
  }
  CheckOtherShapes(rng, Variant{.logit_route = true}, 1e-5);
  CheckOtherShapes(rng, Variant{.int16 = true, .logit_route = true}, 5e-4);
}

// x staged before the gate/up kernel's wait and the per-pick completion counts change no bit: y,
// the picks and the weights equal the plain launches' for every combination with int16 and logit
// routing, at the 80B shape and kOtherShapes, in a PDL chain on one stream (the down kernel's
// blocks start while gate/up runs) repeated so that each launch finds the counts zeroed by the
// last; the counts are zero after every pair.
TEST(OneTokenMoeTest, EarlyXAndPickCountsGiveTheSameBits) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng = ::tandem::testing::SeededRng();
  cudaStream_t stream = nullptr;
  TANDEM_ASSERT_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  DeviceBuffer counts = Upload(std::vector<int32_t>(kOneTokenMaxPicks + 1, 0));
  for (const ShapeCase& c : kOtherShapes) {
    const OneTokenExperts ex(rng, c.h, c.I, c.E, std::min<int64_t>(c.K, 12));
    const std::vector<float> logits = Logits(rng, ex.E, false);
    const std::vector<float> x = testing::RandomVector(rng, ex.h);
    const std::vector<float> shared = testing::RandomVector(rng, ex.h, 0.1f);
    for (const bool int16 : {false, true}) {
      for (const bool logit_route : {false, true}) {
        OneTokenStep plain(ex, c.K, logits, x, shared, 0.4f);
        OneTokenMoeArgs a = plain.Args(ex, c.K, Shared::kGated);
        Variant{.int16 = int16, .logit_route = logit_route}.Apply(a);
        TANDEM_ASSERT_CUDA(LaunchOneTokenMoeGateUp(a, stream));
        TANDEM_ASSERT_CUDA(LaunchOneTokenMoeDown(a, stream));
        TANDEM_ASSERT_CUDA(cudaStreamSynchronize(stream));
        const std::vector<float> want = Download<float>(plain.y.get(), static_cast<size_t>(ex.h));
        const std::vector<int32_t> want_picks = Download<int32_t>(plain.picks.get(), static_cast<size_t>(2 * c.K));
        for (const int form : {1, 2, 3}) {  // x early, counts, both
          const std::string what = absl::StrCat("h=", c.h, " I=", c.I, " E=", c.E, " K=", c.K, int16 ? " int16" : "",
                                                logit_route ? " logit route" : "", form & 1 ? " x early" : "",
                                                form & 2 ? " counts" : "");
          OneTokenStep step(ex, c.K, logits, x, shared, 0.4f);
          OneTokenMoeArgs b = step.Args(ex, c.K, Shared::kGated);
          Variant{.int16 = int16, .logit_route = logit_route, .x_early = (form & 1) != 0,
                  .counts = (form & 2) != 0 ? counts.as<int32_t>() : nullptr}
              .Apply(b);
          for (int rep = 0; rep < 3; ++rep) {
            TANDEM_ASSERT_CUDA(LaunchOneTokenMoeGateUp(b, stream));
            TANDEM_ASSERT_CUDA(LaunchOneTokenMoeDown(b, stream));
          }
          TANDEM_ASSERT_CUDA(cudaStreamSynchronize(stream));
          const std::vector<float> got = Download<float>(step.y.get(), static_cast<size_t>(ex.h));
          EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)), 0) << what << ": y bits";
          EXPECT_EQ(Download<int32_t>(step.picks.get(), static_cast<size_t>(2 * c.K)), want_picks) << what;
          EXPECT_EQ(Download<int32_t>(step.ints.get(), 1)[0], 0) << what;
          EXPECT_EQ(Download<int32_t>(counts.get(), kOneTokenMaxPicks + 1), std::vector<int32_t>(kOneTokenMaxPicks + 1, 0))
              << what << ": counts left";
        }
      }
    }
  }
  TANDEM_ASSERT_CUDA(cudaStreamDestroy(stream));
}

// The same step through the planned path (plan kernel with fused routing, the unit kernels with
// one-row units, scatter-sum) gives the same picks and weights bit for bit, and the same y (the
// same dot products and the same summation order).
TEST(OneTokenMoeTest, EqualsThePlannedPath) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng = ::tandem::testing::SeededRng();
  for (const int64_t E : {128, 512}) {
    const int64_t h = E == 512 ? 2048 : 512, I = 512;
    const OneTokenExperts ex(rng, h, I, E, 16);
    for (const int K : {1, 4, 10, 16}) {
      for (const bool ties : {false, true}) {
        const std::vector<float> logits = Logits(rng, E, ties);
        const std::vector<float> x = testing::RandomVector(rng, h);
        const std::vector<float> shared = testing::RandomVector(rng, h, 0.1f);
        const float gate_logit = testing::RandomVector(rng, 1)[0];
        OneTokenStep one(ex, K, logits, x, shared, gate_logit);
        const OneTokenMoeArgs a = one.Args(ex, K, Shared::kGated);
        TANDEM_ASSERT_CUDA(LaunchOneTokenMoeGateUp(a, nullptr));
        TANDEM_ASSERT_CUDA(LaunchOneTokenMoeDown(a, nullptr));

        OneTokenStep old(ex, K, logits, x, shared, gate_logit);
        DeviceBuffer units = PoisonedBuffer(static_cast<size_t>(K) * sizeof(ExpertUnit));
        DeviceBuffer slot = PoisonedBuffer(static_cast<size_t>(K) * sizeof(int32_t));
        DeviceBuffer partial = PoisonedBuffer(static_cast<size_t>(K * h) * sizeof(float));
        DeviceMoePlanArgs p;
        p.logits = old.logits.as<float>();
        p.experts_out = old.picks.as<int32_t>();
        p.weights_out = reinterpret_cast<float*>(old.picks.as<int32_t>() + K);
        p.experts = p.experts_out;
        p.n = 1;
        p.K = K;
        p.E = static_cast<int>(E);
        p.table = ex.table.as<ExpertLocation>();
        p.units = units.as<ExpertUnit>();
        p.num_units = old.ints.as<int>() + 2;
        p.slot = slot.as<int32_t>();
        p.error = old.ints.as<int>();
        TANDEM_ASSERT_CUDA(LaunchPlanMoeOnDevice(p, nullptr));
        absl::StatusOr<ExpertDecodeRunner> runner = ExpertDecodeRunner::Create(K);
        ASSERT_TRUE(runner.ok()) << runner.status();
        const absl::Status s = runner->RunPlanned(units.as<ExpertUnit>(), K, p.num_units, 1,
                                                  {WeightType::kQ4_K, WeightType::kQ4_K, h, I}, old.x.as<float>(),
                                                  old.act.as<float>(), partial.as<float>(), nullptr);
        ASSERT_TRUE(s.ok()) << s;
        TANDEM_ASSERT_CUDA(LaunchMoeScatterSum(partial.as<float>(), slot.as<int32_t>(), p.weights_out, 1, K,
                                               static_cast<int>(h), old.shared.as<float>(), old.gate.as<float>(),
                                               old.y.as<float>(), nullptr));
        const std::string what = absl::StrCat("E=", E, " K=", K, ties ? " ties" : "");
        const std::vector<int32_t> got_picks = Download<int32_t>(one.picks.get(), static_cast<size_t>(2 * K));
        const std::vector<int32_t> old_picks = Download<int32_t>(old.picks.get(), static_cast<size_t>(2 * K));
        EXPECT_EQ(got_picks, old_picks) << what << " (picks, then the weights' bits)";
        const std::vector<float> got = Download<float>(one.y.get(), static_cast<size_t>(h));
        const std::vector<float> want = Download<float>(old.y.get(), static_cast<size_t>(h));
        ASSERT_TRUE(testing::AllFinite(got)) << what;
        const double err = testing::RelativeL2(got, want);
        const bool same = std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) == 0;
        printf("[one-token vs planned] %s: y relative L2 %.3e%s\n", what.c_str(), err, same ? " (bit-identical)" : "");
        EXPECT_LE(err, 1e-6) << what;
      }
    }
  }
}

// A pick of an expert without a location sets the error flag, computes nothing and is left out of
// the sum (the other picks still are); the picks are still published. The same with routing by the
// logits and with per-pick counts (the pick's gate/up blocks still count: the down kernel does not
// wait forever), and the counts are left zero.
TEST(OneTokenMoeTest, PickWithoutALocationIsFlaggedAndSkipped) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng = ::tandem::testing::SeededRng();
  const one_token_testing::MissingFirstPick c(rng);
  const int K = c.kK;
  DeviceBuffer counts = Upload(std::vector<int32_t>(K + 1, 0));
  for (const bool variants : {false, true}) {
    c.CheckStep(
        [&](OneTokenStep& step) {
          OneTokenMoeArgs a = step.Args(c.ex, K, Shared::kNone);
          if (variants) Variant{.logit_route = true, .x_early = true, .counts = counts.as<int32_t>()}.Apply(a);
          TANDEM_ASSERT_CUDA(LaunchOneTokenMoeGateUp(a, nullptr));
          TANDEM_ASSERT_CUDA(LaunchOneTokenMoeDown(a, nullptr));
        },
        1e-5, variants ? "logit routing, x early, counts" : "plain");
  }
  EXPECT_EQ(Download<int32_t>(counts.get(), K + 1), std::vector<int32_t>(K + 1, 0));
}

// The shared term moved out of the down kernel into y's consumer (MoeStage::Run's `deferred`,
// TANDEM_OLD_DOWN_JOIN=0): the down kernel without the shared term, then the next stream norm
// given {shared, gate logit} (norm_streams.cuh's PendingShared), leaves the same H and normed rows
// bit for bit as the down kernel with the shared term followed by the plain inject-and-norm; and
// y without the term plus the term is the kernel's y with it (the same fmaf). Gated and ungated,
// the 80B shape and a small one, with the inject weights a = 1 (one stream) and random (Engram's
// LaunchStreamInject too).
TEST(OneTokenMoeTest, SharedTermInTheNextNormIsBitIdentical) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng = ::tandem::testing::SeededRng();
  struct Case {
    int64_t h, I, E;
    int K;
  };
  for (const Case c : {Case{2048, 512, 512, 10}, Case{512, 256, 128, 4}}) {
    const OneTokenExperts ex(rng, c.h, c.I, c.E, std::min<int64_t>(c.K, 12));
    for (const Shared sh : {Shared::kGated, Shared::kUngated}) {
      for (const bool with_a : {false, true}) {
        const std::vector<float> logits = Logits(rng, c.E, false);
        const std::vector<float> x = testing::RandomVector(rng, c.h);
        const std::vector<float> shared = testing::RandomVector(rng, c.h, 0.1f);
        const float gate_logit = testing::RandomVector(rng, 1)[0];
        const std::vector<float> H = testing::RandomVector(rng, c.h, 2.0f);
        const std::vector<float> gamma = testing::RandomVector(rng, c.h, 0.2f);
        const DeviceBuffer d_gamma = Upload(gamma);
        const DeviceBuffer d_a = Upload(std::vector<float>{0.75f + 0.5f * testing::RandomVector(rng, 1, 0.1f)[0]});
        const float* ap = with_a ? d_a.as<float>() : nullptr;
        const std::string what = absl::StrCat("h=", c.h, " E=", c.E, " K=", c.K, " shared=", static_cast<int>(sh),
                                              with_a ? " a" : "");
        // Before: the term in the down kernel, the plain inject-and-norm.
        OneTokenStep old_step(ex, c.K, logits, x, shared, gate_logit);
        const OneTokenMoeArgs old_args = old_step.Args(ex, c.K, sh);
        TANDEM_ASSERT_CUDA(LaunchOneTokenMoeGateUp(old_args, nullptr));
        TANDEM_ASSERT_CUDA(LaunchOneTokenMoeDown(old_args, nullptr));
        DeviceBuffer H_old = Upload(H), H_old_inject = Upload(H);
        DeviceBuffer N_old = PoisonedBuffer(static_cast<size_t>(c.h) * sizeof(float));
        TANDEM_ASSERT_CUDA(LaunchInjectRmsNorm(H_old.as<float>(), 1, 1, c.h, ap, old_step.y.as<float>(),
                                               d_gamma.as<float>(), 1e-6f, N_old.as<float>(), nullptr));
        TANDEM_ASSERT_CUDA(LaunchStreamInject(H_old_inject.as<float>(), 1, 1, c.h, ap, old_step.y.as<float>(), nullptr));
        // After: no term in the down kernel, the norm adds it.
        OneTokenStep new_step(ex, c.K, logits, x, shared, gate_logit);
        const OneTokenMoeArgs new_args = new_step.Args(ex, c.K, Shared::kNone);
        TANDEM_ASSERT_CUDA(LaunchOneTokenMoeGateUp(new_args, nullptr));
        TANDEM_ASSERT_CUDA(LaunchOneTokenMoeDown(new_args, nullptr));
        PendingShared pending;
        pending.shared = new_step.shared.as<float>();
        pending.gate_logit = sh == Shared::kGated ? new_step.gate.as<float>() : nullptr;
        DeviceBuffer H_new = Upload(H), H_new_inject = Upload(H);
        DeviceBuffer N_new = PoisonedBuffer(static_cast<size_t>(c.h) * sizeof(float));
        TANDEM_ASSERT_CUDA(LaunchInjectRmsNorm(H_new.as<float>(), 1, 1, c.h, ap, new_step.y.as<float>(),
                                               d_gamma.as<float>(), 1e-6f, N_new.as<float>(), nullptr, nullptr,
                                               &pending));
        TANDEM_ASSERT_CUDA(
            LaunchStreamInject(H_new_inject.as<float>(), 1, 1, c.h, ap, new_step.y.as<float>(), nullptr, &pending));
        const size_t hn = static_cast<size_t>(c.h);
        const std::vector<float> n_old = Download<float>(N_old.get(), hn), n_new = Download<float>(N_new.get(), hn);
        const std::vector<float> h_old = Download<float>(H_old.get(), hn), h_new = Download<float>(H_new.get(), hn);
        ASSERT_TRUE(testing::AllFinite(n_new)) << what;
        const bool same = n_old == n_new && h_old == h_new;
        printf("[shared term in the norm] %s: %s\n", what.c_str(), same ? "bit-identical" : "DIFFERENT");
        EXPECT_EQ(n_new, n_old) << what << " (normed rows)";
        EXPECT_EQ(h_new, h_old) << what << " (H)";
        EXPECT_EQ(Download<float>(H_new_inject.get(), hn), Download<float>(H_old_inject.get(), hn))
            << what << " (LaunchStreamInject)";
        // The routed part alone is the same kernel's: its picks and weights are unchanged.
        EXPECT_EQ(Download<int32_t>(new_step.picks.get(), static_cast<size_t>(2 * c.K)),
                  Download<int32_t>(old_step.picks.get(), static_cast<size_t>(2 * c.K)))
            << what;
      }
    }
  }
}

TEST(OneTokenMoeTest, RefusesShapesItCannotRun) {
  EXPECT_TRUE(OneTokenMoeFits(512, 10, 2048, 512));
  EXPECT_FALSE(OneTokenMoeFits(2048, 10, 2048, 512));  // E above kOneTokenMaxExperts
  EXPECT_FALSE(OneTokenMoeFits(512, 33, 2048, 512));   // K above kOneTokenMaxPicks
  EXPECT_FALSE(OneTokenMoeFits(8, 10, 2048, 512));     // K above E
  EXPECT_FALSE(OneTokenMoeFits(512, 10, 2000, 512));   // h not a multiple of 256
  EXPECT_FALSE(OneTokenMoeFits(512, 10, 2048, 16384)); // inner above 32 super-blocks
  OneTokenMoeArgs a;  // null pointers
  a.E = 512;
  a.K = 10;
  a.h = 2048;
  a.inner = 512;
  EXPECT_EQ(LaunchOneTokenMoeGateUp(a, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(LaunchOneTokenMoeDown(a, nullptr), cudaErrorInvalidValue);
}

// The probed instantiations (expert_decode_one_probe.h) compute what the kernels compute: the same
// y bits, picks and weights at the 80B shape; every block of both launches takes a slot and stamps
// its phases in order, on a real SM, with its block index; past the capacity nothing is written.
TEST(OneTokenMoeTest, ProbedKernelsGiveTheSameBitsAndOrderedStamps) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng = ::tandem::testing::SeededRng();
  const OneTokenExperts ex(rng, 2048, 512, 512, 4);
  const int K = 10;
  const std::vector<float> logits = Logits(rng, ex.E, false);
  const std::vector<float> x = testing::RandomVector(rng, ex.h);
  const std::vector<float> shared = testing::RandomVector(rng, ex.h, 0.1f);
  OneTokenStep plain(ex, K, logits, x, shared, 0.3f), probed(ex, K, logits, x, shared, 0.3f);
  const OneTokenMoeArgs a = plain.Args(ex, K, Shared::kGated), b = probed.Args(ex, K, Shared::kGated);
  TANDEM_ASSERT_CUDA(LaunchOneTokenMoeGateUp(a, nullptr));
  TANDEM_ASSERT_CUDA(LaunchOneTokenMoeDown(a, nullptr));
  const int gate_blocks = 512 / 16 * K, down_blocks = 2048 / 16;
  const unsigned capacity = static_cast<unsigned>(gate_blocks);
  const size_t words = 2 * static_cast<size_t>(capacity) * kOneTokenProbeWords;
  DeviceBuffer stamps = Upload(std::vector<unsigned long long>(words, 0));
  TANDEM_ASSERT_CUDA(SetOneTokenProbe(stamps.as<unsigned long long>(), capacity, nullptr));
  TANDEM_ASSERT_CUDA(LaunchOneTokenMoeGateUpProbed(b, nullptr));
  TANDEM_ASSERT_CUDA(LaunchOneTokenMoeDownProbed(b, nullptr));
  TANDEM_ASSERT_CUDA(cudaDeviceSynchronize());
  TANDEM_ASSERT_CUDA(SetOneTokenProbe(nullptr, 0, nullptr));
  const std::vector<float> want = Download<float>(plain.y.get(), static_cast<size_t>(ex.h));
  const std::vector<float> got = Download<float>(probed.y.get(), static_cast<size_t>(ex.h));
  EXPECT_EQ(std::memcmp(want.data(), got.data(), want.size() * sizeof(float)), 0) << "y bits";
  EXPECT_EQ(Download<int32_t>(plain.picks.get(), 2 * K), Download<int32_t>(probed.picks.get(), 2 * K));
  const std::vector<unsigned long long> h = Download<unsigned long long>(stamps.get(), words);
  int sm_count = 0;
  TANDEM_ASSERT_CUDA(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, 0));
  for (int kernel = 0; kernel < 2; ++kernel) {
    const int blocks = kernel == 0 ? gate_blocks : down_blocks;
    // expert_decode_one_probe.h's phases in the order a block passes them.
    const std::vector<int> order = kernel == 0 ? std::vector<int>{0, 1, 5, 6, 7, 2, 3, 4}
                                               : std::vector<int>{0, 8, 9, 10, 1, 2, 3, 11, 12, 13, 4, 5};
    std::vector<bool> seen(static_cast<size_t>(blocks), false);
    for (unsigned slot = 0; slot < capacity; ++slot) {
      const unsigned long long* r = h.data() + (static_cast<size_t>(kernel) * capacity + slot) * kOneTokenProbeWords;
      if (static_cast<int>(slot) >= blocks) {
        for (int w = 0; w < kOneTokenProbeWords; ++w) EXPECT_EQ(r[w], 0u) << "kernel " << kernel << " slot " << slot;
        continue;
      }
      const unsigned long long block = r[kOneTokenProbeWords - 1], sm = r[kOneTokenProbeWords - 2];
      ASSERT_LT(block, static_cast<unsigned long long>(blocks));
      EXPECT_FALSE(seen[block]) << "block " << block << " twice";
      seen[block] = true;
      EXPECT_LT(sm, static_cast<unsigned long long>(sm_count));
      for (size_t i = 1; i < order.size(); ++i) {
        EXPECT_NE(r[order[i]], 0u) << "kernel " << kernel << " phase " << order[i];  // no block leaves early here
        EXPECT_GE(r[order[i]], r[order[i - 1]]) << "kernel " << kernel << " phase " << order[i];
      }
    }
  }
}

}  // namespace
}  // namespace tandem::cuda
