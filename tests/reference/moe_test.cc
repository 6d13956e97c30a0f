#include "common/reference/moe.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "gtest/gtest.h"
#include "tests/reference/test_util.h"

namespace tandem {
namespace {

using testing::NaiveMatVec;
using testing::NaiveSigmoid;
using testing::NaiveSilu;
using testing::RandomVector;
using testing::RelativeL2;

TEST(RouteTokensTest, TiesGoToLowerExpertAndWeightsRenormalise) {
  // Token 0: logits log 1..log 4 -> π ∝ 1, 2, 3, 4; K = 2 picks 3 then 2 with weights 4/7, 3/7.
  // Token 1: experts 1, 2 and 4 tie at the top -> 1 then 2, weights 1/2 each.
  const std::vector<float> logits = {0.0f, std::log(2.0f), std::log(3.0f), std::log(4.0f), -1.0f,
                                     1.0f, 3.0f, 3.0f, 2.0f, 3.0f};
  std::vector<int32_t> experts(4);
  std::vector<float> weights(4);
  RouteTokens(logits.data(), 2, 5, 2, experts.data(), weights.data());
  EXPECT_EQ(experts, std::vector<int32_t>({3, 2, 1, 2}));
  EXPECT_NEAR(weights[0], 4.0 / 7.0, 1e-6);
  EXPECT_NEAR(weights[1], 3.0 / 7.0, 1e-6);
  EXPECT_EQ(weights[2], weights[3]);
  EXPECT_NEAR(weights[2], 0.5, 1e-7);
}

struct MoeFixture {
  MoeDims d{.h = 16, .E = 8, .K = 3};
  int64_t I = 12, Ish = 10;
  std::vector<float> router, gate, up, down, sh_inp, sh_gate, sh_up, sh_down;
  MoeWeights w;

  explicit MoeFixture(std::mt19937& rng) {
    router = RandomVector(rng, d.h * d.E);
    gate = RandomVector(rng, d.h * I * d.E, 0.3f);
    up = RandomVector(rng, d.h * I * d.E, 0.3f);
    down = RandomVector(rng, I * d.h * d.E, 0.3f);
    sh_inp = RandomVector(rng, d.h, 0.3f);
    sh_gate = RandomVector(rng, d.h * Ish, 0.3f);
    sh_up = RandomVector(rng, d.h * Ish, 0.3f);
    sh_down = RandomVector(rng, Ish * d.h, 0.3f);
    w.router = F32Matrix(router.data(), d.h, d.E);
    w.gate = F32ExpertMatrix(gate.data(), d.h, I, d.E);
    w.up = F32ExpertMatrix(up.data(), d.h, I, d.E);
    w.down = F32ExpertMatrix(down.data(), I, d.h, d.E);
    w.shared_gate_inp = F32Matrix(sh_inp.data(), d.h, 1);
    w.shared_gate = F32Matrix(sh_gate.data(), d.h, Ish);
    w.shared_up = F32Matrix(sh_up.data(), d.h, Ish);
    w.shared_down = F32Matrix(sh_down.data(), Ish, d.h);
  }
};

// §4.6 for one token, written as a plain loop in f64.
std::vector<float> NaiveMoe(const MoeFixture& f, const float* x32) {
  const int64_t h = f.d.h, E = f.d.E, I = f.I;
  const std::vector<double> x(x32, x32 + h);
  std::vector<double> p = NaiveMatVec(f.router, h, E, x.data());
  const double mx = *std::max_element(p.begin(), p.end());
  double z = 0;
  for (double& v : p) z += (v = std::exp(v - mx));
  for (double& v : p) v /= z;
  std::vector<bool> taken(static_cast<size_t>(E), false);
  std::vector<int64_t> picks;
  for (int64_t k = 0; k < f.d.K; ++k) {
    int64_t best = -1;
    for (int64_t e = 0; e < E; ++e) {
      if (!taken[e] && (best < 0 || p[e] > p[best])) best = e;
    }
    taken[best] = true;
    picks.push_back(best);
  }
  double picked_sum = 0;
  for (int64_t e : picks) picked_sum += p[e];
  auto ffn = [&](const float* g, const float* u, const float* dn, int64_t inner) {
    std::vector<double> a(static_cast<size_t>(inner)), out(static_cast<size_t>(h), 0.0);
    for (int64_t i = 0; i < inner; ++i) {
      double gi = 0, ui = 0;
      for (int64_t c = 0; c < h; ++c) gi += g[i * h + c] * x[c], ui += u[i * h + c] * x[c];
      a[i] = NaiveSilu(gi) * ui;
    }
    for (int64_t r = 0; r < h; ++r) {
      for (int64_t i = 0; i < inner; ++i) out[r] += dn[r * inner + i] * a[i];
    }
    return out;
  };
  std::vector<double> y(static_cast<size_t>(h), 0.0);
  for (int64_t e : picks) {
    const std::vector<double> out =
        ffn(f.gate.data() + e * I * h, f.up.data() + e * I * h, f.down.data() + e * h * I, I);
    for (int64_t r = 0; r < h; ++r) y[r] += p[e] / picked_sum * out[r];
  }
  double gs = 0;
  for (int64_t c = 0; c < h; ++c) gs += f.sh_inp[c] * x[c];
  const std::vector<double> shared = ffn(f.sh_gate.data(), f.sh_up.data(), f.sh_down.data(), f.Ish);
  for (int64_t r = 0; r < h; ++r) y[r] += NaiveSigmoid(gs) * shared[r];
  return std::vector<float>(y.begin(), y.end());
}

TEST(MoeTest, EqualsNaivePerTokenLoop) {
  std::mt19937 rng(41);
  const MoeFixture f(rng);
  ASSERT_TRUE(CheckMoeWeights(f.w, f.d).ok());
  const int64_t n = 7;
  const std::vector<float> x = RandomVector(rng, n * f.d.h);
  std::vector<float> y(x.size());
  ThreadPool pool(2);
  ReferenceExpertExecutor executor(f.w, &pool);
  ASSERT_TRUE(MoeForward(f.w, f.d, x.data(), n, executor, y.data(), &pool).ok());
  for (int64_t t = 0; t < n; ++t) {
    const std::vector<float> row(y.begin() + t * f.d.h, y.begin() + (t + 1) * f.d.h);
    EXPECT_LE(RelativeL2(row, NaiveMoe(f, x.data() + t * f.d.h)), 1e-5) << "t=" << t;
  }
}

// Computes each pair on its own, in a shuffled order, and remembers the partial rows.
class ShufflingExecutor : public ExpertExecutor {
 public:
  ShufflingExecutor(const MoeWeights& w, uint32_t seed) : inner_(w, nullptr), rng_(seed) {}
  absl::Status Run(std::span<const ExpertWork> work, const float* x, int64_t h, float* out) override {
    std::vector<size_t> order(work.size());
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng_);
    for (size_t i : order) {
      if (absl::Status s = inner_.Run(work.subspan(i, 1), x, h, out + i * h); !s.ok()) return s;
    }
    work_.assign(work.begin(), work.end());
    partials_.assign(out, out + work.size() * h);
    return absl::OkStatus();
  }
  std::vector<ExpertWork> work_;
  std::vector<float> partials_;

 private:
  ReferenceExpertExecutor inner_;
  std::mt19937 rng_;
};

TEST(MoeTest, OrderOfExpertPartialsDoesNotMatter) {
  std::mt19937 rng(42);
  const MoeFixture f(rng);
  const int64_t n = 9, h = f.d.h, K = f.d.K;
  const std::vector<float> x = RandomVector(rng, n * h);
  std::vector<float> y_ref(x.size()), y_shuf(x.size());
  ReferenceExpertExecutor reference(f.w, nullptr);
  MoeRouting routing;
  ASSERT_TRUE(MoeForward(f.w, f.d, x.data(), n, reference, y_ref.data(), nullptr, &routing).ok());
  ShufflingExecutor shuffling(f.w, 7);
  ASSERT_TRUE(MoeForward(f.w, f.d, x.data(), n, shuffling, y_shuf.data(), nullptr).ok());
  // Where and in which order the executor computes rows cannot change a bit.
  EXPECT_EQ(y_shuf, y_ref);

  // Summing the same partials in permuted orders, in f32, stays within rounding.
  std::vector<float> shared(x.size());
  FfnForward(f.w.shared_gate, f.w.shared_up, f.w.shared_down, x.data(), n, shared.data(), nullptr);
  std::mt19937 perm_rng(43);
  for (int trial = 0; trial < 5; ++trial) {
    std::vector<float> y(x.size(), 0.0f);
    for (int64_t t = 0; t < n; ++t) {
      std::vector<std::pair<float, const float*>> terms;  // (weight, row)
      for (size_t i = 0; i < shuffling.work_.size(); ++i) {
        if (shuffling.work_[i].token != t) continue;
        const int32_t e = shuffling.work_[i].expert;
        const int64_t k = std::find(routing.experts.begin() + t * K, routing.experts.begin() + (t + 1) * K, e) -
                          (routing.experts.begin() + t * K);
        ASSERT_LT(k, K);
        terms.emplace_back(routing.weights[t * K + k], shuffling.partials_.data() + i * h);
      }
      ASSERT_EQ(static_cast<int64_t>(terms.size()), K);
      double gs = 0;
      for (int64_t c = 0; c < h; ++c) gs += f.sh_inp[c] * x[t * h + c];
      terms.emplace_back(static_cast<float>(NaiveSigmoid(gs)), shared.data() + t * h);
      std::shuffle(terms.begin(), terms.end(), perm_rng);
      for (const auto& [wk, row] : terms) {
        for (int64_t j = 0; j < h; ++j) y[t * h + j] += wk * row[j];
      }
    }
    EXPECT_LE(RelativeL2(y, y_ref), 1e-6) << "trial " << trial;
  }
}

class FailingExecutor : public ExpertExecutor {
 public:
  absl::Status Run(std::span<const ExpertWork>, const float*, int64_t, float*) override {
    return absl::UnavailableError("worker gone");
  }
};

TEST(MoeTest, ExecutorErrorsPropagate) {
  std::mt19937 rng(44);
  const MoeFixture f(rng);
  const std::vector<float> x = RandomVector(rng, f.d.h);
  std::vector<float> y(x.size());
  FailingExecutor failing;
  EXPECT_EQ(MoeForward(f.w, f.d, x.data(), 1, failing, y.data(), nullptr).code(), absl::StatusCode::kUnavailable);
}

TEST(MoeTest, WeightsValidate) {
  std::mt19937 rng(45);
  MoeFixture f(rng);
  MoeDims bad = f.d;
  bad.K = f.d.E + 1;
  EXPECT_FALSE(CheckMoeWeights(f.w, bad).ok());
  f.w.down.rows = f.d.h + 1;
  const absl::Status s = CheckMoeWeights(f.w, f.d);
  EXPECT_NE(s.message().find("ffn_down_exps"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace tandem
