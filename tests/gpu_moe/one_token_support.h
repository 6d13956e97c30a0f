// Helpers of the one-token MoE kernel tests (expert_decode_one_test.cc, expert_decode_fused_test.cc):
// a layer's Q4_K experts with their CPU reference, one step's device buffers, router logits, and
// the reference y of one token.
#ifndef TANDEM_TESTS_GPU_MOE_ONE_TOKEN_SUPPORT_H_
#define TANDEM_TESTS_GPU_MOE_ONE_TOKEN_SUPPORT_H_

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "common/reference/moe.h"
#include "gpu_service/backends/cuda/moe/expert_decode_one.cuh"
#include "gpu_service/backends/cuda/moe/expert_unit.h"
#include "tests/gpu_moe/test_support.h"

namespace tandem::cuda::one_token_testing {

using testing::PoisonedBuffer;
using testing::RandomMatrix;
using testing::Upload;

// E experts of Q4_K gate/up {h, I} and down {I, h}. Expert e uses matrix set e % sets (the table
// holds locations, so experts may share bytes; the reference uses the same mapping). Experts in
// `missing` get no location (a null table entry).
struct OneTokenExperts {
  OneTokenExperts(std::mt19937& rng, int64_t h_, int64_t I_, int64_t E_, int64_t sets, std::vector<int> missing = {})
      : h(h_), I(I_), E(E_) {
    for (int64_t s = 0; s < sets; ++s) {
      gate.push_back(RandomMatrix(rng, WeightType::kQ4_K, h, I, 0.05f));
      up.push_back(RandomMatrix(rng, WeightType::kQ4_K, h, I, 0.05f));
      down.push_back(RandomMatrix(rng, WeightType::kQ4_K, I, h, 0.05f));
      dgate.push_back(Upload(gate.back()));
      dup.push_back(Upload(up.back()));
      ddown.push_back(Upload(down.back()));
    }
    std::vector<ExpertLocation> t(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) {
      const size_t s = static_cast<size_t>(e % sets);
      t[e] = {dgate[s].get(), dup[s].get(), ddown[s].get()};
    }
    for (int e : missing) t[e] = {};
    table = Upload(t);
  }
  // FFN_e(x) (h wide) into out.
  void Reference(int64_t e, const float* x, float* out) const {
    const size_t s = static_cast<size_t>(e % static_cast<int64_t>(gate.size()));
    FfnForward(testing::HostMatrix(WeightType::kQ4_K, gate[s], h, I), testing::HostMatrix(WeightType::kQ4_K, up[s], h, I),
               testing::HostMatrix(WeightType::kQ4_K, down[s], I, h), x, 1, out, nullptr);
  }
  int64_t h, I, E;
  std::vector<std::vector<uint8_t>> gate, up, down;
  std::vector<DeviceBuffer> dgate, dup, ddown;
  DeviceBuffer table;
};

enum class Shared { kNone, kUngated, kGated };

// The device buffers of one one-token step.
struct OneTokenStep {
  OneTokenStep(const OneTokenExperts& ex, int K, const std::vector<float>& logits_, const std::vector<float>& x_,
               const std::vector<float>& shared_, float gate_logit)
      : logits(Upload(logits_)),
        x(Upload(x_)),
        shared(Upload(shared_)),
        gate(Upload(std::vector<float>{gate_logit})),
        act(PoisonedBuffer(static_cast<size_t>(K * ex.I) * sizeof(float))),
        picks(PoisonedBuffer(static_cast<size_t>(K) * (sizeof(int32_t) + sizeof(float)))),
        ints(Upload(std::vector<int32_t>(4, 0))),
        y(PoisonedBuffer(static_cast<size_t>(ex.h) * sizeof(float))) {}
  OneTokenMoeArgs Args(const OneTokenExperts& ex, int K, Shared sh) {
    OneTokenMoeArgs a;
    a.logits = logits.as<float>();
    a.E = static_cast<int>(ex.E);
    a.K = K;
    a.table = ex.table.as<ExpertLocation>();
    a.h = static_cast<int>(ex.h);
    a.inner = static_cast<int>(ex.I);
    a.x = x.as<float>();
    a.act = act.as<float>();
    a.experts_out = picks.as<int32_t>();
    a.weights_out = reinterpret_cast<float*>(picks.as<int32_t>() + K);
    a.error = ints.as<int>();
    a.shared = sh == Shared::kNone ? nullptr : shared.as<float>();
    a.shared_gate_logit = sh == Shared::kGated ? gate.as<float>() : nullptr;
    a.y = y.as<float>();
    return a;
  }
  DeviceBuffer logits, x, shared, gate, act, picks, ints, y;
};

// logits for E experts: normal, or with many exact ties (values on a coarse grid).
inline std::vector<float> Logits(std::mt19937& rng, int64_t E, bool ties) {
  std::vector<float> v = testing::RandomVector(rng, E, 1.0f);
  if (ties) {
    for (float& f : v) f = std::round(f * 2.0f) / 2.0f;
  }
  return v;
}

// y of the reference for one token: routing (RouteTokens), Σ_k w_k·FFN_{e_k}(x) in pick order,
// then the shared term (σ(gate logit)·shared, or shared ungated).
inline std::vector<float> ReferenceY(const OneTokenExperts& ex, int K, const std::vector<float>& logits,
                              const std::vector<float>& x, const std::vector<float>& shared, float gate_logit, Shared sh,
                              std::vector<int32_t>* picks, std::vector<float>* weights) {
  picks->assign(static_cast<size_t>(K), 0);
  weights->assign(static_cast<size_t>(K), 0.0f);
  RouteTokens(logits.data(), 1, ex.E, K, picks->data(), weights->data());
  std::vector<float> y(static_cast<size_t>(ex.h), 0.0f), row(static_cast<size_t>(ex.h));
  for (int k = 0; k < K; ++k) {
    ex.Reference((*picks)[k], x.data(), row.data());
    for (int64_t j = 0; j < ex.h; ++j) y[j] += (*weights)[k] * row[j];
  }
  if (sh != Shared::kNone) {
    const float g = sh == Shared::kGated ? 1.0f / (1.0f + std::exp(-gate_logit)) : 1.0f;
    for (int64_t j = 0; j < ex.h; ++j) y[j] += g * shared[j];
  }
  return y;
}

// A step whose first pick has no location: E = 64 experts of h = I = 256, K = 4, expert 5 missing
// and given the largest logit. CheckStep runs the launches in `launch` on a fresh step (no shared
// term) and checks what every one-token path must do: the picks published with expert 5 first, the
// error flag set, and y the other picks' weighted sum (within relative L2 `tol`).
struct MissingFirstPick {
  static constexpr int64_t kE = 64, kH = 256, kI = 256;
  static constexpr int kK = 4;
  explicit MissingFirstPick(std::mt19937& rng)
      : ex(rng, kH, kI, kE, 8, {5}), logits(testing::RandomVector(rng, kE, 0.1f)), x(testing::RandomVector(rng, kH)) {
    logits[5] = 3.0f;
  }
  template <typename Launch>
  void CheckStep(Launch&& launch, double tol, const std::string& what) const {
    OneTokenStep step(ex, kK, logits, x, std::vector<float>(static_cast<size_t>(kH), 0.0f), 0.0f);
    launch(step);
    const std::vector<int32_t> picks = testing::Download<int32_t>(step.picks.get(), static_cast<size_t>(kK));
    const std::vector<float> weights = testing::Download<float>(step.picks.as<int32_t>() + kK, static_cast<size_t>(kK));
    EXPECT_EQ(picks[0], 5) << what;
    EXPECT_EQ(testing::Download<int32_t>(step.ints.get(), 1)[0], 1) << what;
    const std::vector<float> got = testing::Download<float>(step.y.get(), static_cast<size_t>(kH));
    std::vector<float> want(static_cast<size_t>(kH), 0.0f), row(static_cast<size_t>(kH));
    for (int k = 1; k < kK; ++k) {
      ex.Reference(picks[k], x.data(), row.data());
      for (int64_t j = 0; j < kH; ++j) want[j] += weights[k] * row[j];
    }
    ASSERT_TRUE(testing::AllFinite(got)) << what;
    EXPECT_LE(testing::RelativeL2(got, want), tol) << what;
  }
  OneTokenExperts ex;
  std::vector<float> logits, x;
};

}  // namespace tandem::cuda::one_token_testing

#endif  // TANDEM_TESTS_GPU_MOE_ONE_TOKEN_SUPPORT_H_
