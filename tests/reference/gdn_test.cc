#include "common/reference/gdn.h"

#include <cmath>
#include <vector>

#include "common/reference/gdn_rule.h"
#include "common/reference/ops.h"
#include "gtest/gtest.h"
#include "tests/reference/test_util.h"

namespace tandem {
namespace {

using testing::NaiveMatVec;
using testing::NaiveSigmoid;
using testing::NaiveSilu;
using testing::RandomVector;
using testing::RelativeL2;
using testing::UniformVector;

// Qwen3-Next's initialisation ranges: A ~ U(0, 16) (ssm_a = −A), dt ~ U(0.001, 0.1) stored as the
// inverse softplus dt_bias.
struct Gates {
  std::vector<float> ssm_a, dt_bias;
};
Gates RealisticGates(std::mt19937& rng, int64_t nv) {
  Gates g;
  g.ssm_a = UniformVector(rng, nv, -16.0f, -0.01f);
  for (float dt : UniformVector(rng, nv, 0.001f, 0.1f)) g.dt_bias.push_back(std::log(std::expm1(dt)));
  return g;
}

struct RuleInputs {
  std::vector<float> q, k, v, g, beta, state;
};
RuleInputs RandomRuleInputs(std::mt19937& rng, int64_t n, int64_t dk, int64_t dv) {
  RuleInputs in;
  in.q = RandomVector(rng, n * dk);
  in.k = RandomVector(rng, n * dk);
  for (int64_t t = 0; t < n; ++t) {
    L2Normalize(in.q.data() + t * dk, dk, 1e-6f);
    for (int64_t i = 0; i < dk; ++i) in.q[t * dk + i] /= std::sqrt(static_cast<float>(dk));
    L2Normalize(in.k.data() + t * dk, dk, 1e-6f);
  }
  in.v = RandomVector(rng, n * dv);
  const Gates gates = RealisticGates(rng, 1);
  for (float a : RandomVector(rng, n)) in.g.push_back(gates.ssm_a[0] * Softplus(a + gates.dt_bias[0]));
  for (float b : RandomVector(rng, n)) in.beta.push_back(Sigmoid(b));
  in.state = RandomVector(rng, dk * dv, 0.5f);
  return in;
}

TEST(GatedDeltaRuleTest, ChunkedEqualsRecurrent) {
  std::mt19937 rng(21);
  const int64_t dk = 64, dv = 48;
  for (int64_t n : {1, 7, 64, 65, 200}) {
    for (int64_t chunk : {16, 64, 100}) {
      const RuleInputs in = RandomRuleInputs(rng, n, dk, dv);
      std::vector<float> s_rec = in.state, s_chk = in.state;
      std::vector<float> o_rec(static_cast<size_t>(n * dv)), o_chk(o_rec.size());
      GatedDeltaRuleRecurrent(in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(), n, dk, dv,
                              s_rec.data(), o_rec.data());
      GatedDeltaRuleChunked(in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(), n, dk, dv,
                            chunk, s_chk.data(), o_chk.data());
      EXPECT_LE(RelativeL2(o_chk, o_rec), 1e-5) << "n=" << n << " chunk=" << chunk;
      EXPECT_LE(RelativeL2(s_chk, s_rec), 1e-5) << "n=" << n << " chunk=" << chunk;
    }
  }
}

TEST(GatedDeltaRuleTest, RecurrentMatchesTheDefinitionInF64) {
  std::mt19937 rng(22);
  const int64_t n = 9, dk = 8, dv = 5;
  const RuleInputs in = RandomRuleInputs(rng, n, dk, dv);
  std::vector<float> state = in.state, o(static_cast<size_t>(n * dv));
  GatedDeltaRuleRecurrent(in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(), n, dk, dv,
                          state.data(), o.data());
  std::vector<double> S(in.state.begin(), in.state.end());
  for (int64_t t = 0; t < n; ++t) {
    for (double& s : S) s *= std::exp(static_cast<double>(in.g[t]));
    for (int64_t j = 0; j < dv; ++j) {
      double sk = 0.0;
      for (int64_t i = 0; i < dk; ++i) sk += S[i * dv + j] * in.k[t * dk + i];
      const double delta = in.beta[t] * (in.v[t * dv + j] - sk);
      for (int64_t i = 0; i < dk; ++i) S[i * dv + j] += in.k[t * dk + i] * delta;
    }
    for (int64_t j = 0; j < dv; ++j) {
      double out = 0.0;
      for (int64_t i = 0; i < dk; ++i) out += S[i * dv + j] * in.q[t * dk + i];
      ASSERT_NEAR(o[t * dv + j], out, 1e-5 * (1 + std::fabs(out))) << t << " " << j;
    }
  }
}

// A tiny GDN layer with random f32 weights and realistic gates.
struct GdnFixture {
  GdnDims d{.h = 32, .nk = 2, .nv = 4, .dk = 16, .dv = 12, .kk = 4, .eps = 1e-6f};
  std::vector<float> qkv, gate, ba, conv1d, norm, out;
  Gates gates;
  GdnWeights w;

  explicit GdnFixture(std::mt19937& rng) {
    qkv = RandomVector(rng, d.h * d.c_dim(), 0.3f);
    gate = RandomVector(rng, d.h * d.nv * d.dv, 0.3f);
    ba = RandomVector(rng, d.h * 2 * d.nv, 0.3f);
    conv1d = RandomVector(rng, d.kk * d.c_dim(), 0.5f);
    norm = RandomVector(rng, d.dv, 0.2f, 1.0f);
    out = RandomVector(rng, d.nv * d.dv * d.h, 0.2f);
    gates = RealisticGates(rng, d.nv);
    w.qkv = F32Matrix(qkv.data(), d.h, d.c_dim());
    w.gate = F32Matrix(gate.data(), d.h, d.nv * d.dv);
    w.ba = F32Matrix(ba.data(), d.h, 2 * d.nv);
    w.conv1d = conv1d;
    w.a = gates.ssm_a;
    w.dt_bias = gates.dt_bias;
    w.norm = norm;
    w.out = F32Matrix(out.data(), d.nv * d.dv, d.h);
  }
};

struct OwnedState {
  std::vector<float> conv, ssm;
  GdnState view() { return GdnState{conv.data(), ssm.data()}; }
};
OwnedState RandomState(std::mt19937& rng, const GdnDims& d) {
  return OwnedState{RandomVector(rng, d.conv_state_floats()), RandomVector(rng, d.ssm_state_floats(), 0.3f)};
}

TEST(GdnForwardTest, WeightsValidate) {
  std::mt19937 rng(23);
  GdnFixture f(rng);
  EXPECT_TRUE(CheckGdnWeights(f.w, f.d).ok());
  f.w.a = f.w.a.subspan(1);
  const absl::Status s = CheckGdnWeights(f.w, f.d);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("ssm_a"), std::string::npos) << s.message();
}

// One token of §4.4 written plainly in f64 against the fixture's weights.
std::vector<double> NaiveGdnToken(const GdnFixture& f, std::vector<double>& conv_hist, std::vector<double>& S,
                                  const float* x) {
  const GdnDims& d = f.d;
  const int64_t c_dim = d.c_dim(), r = d.nv / d.nk;
  std::vector<double> xd(x, x + d.h);
  const std::vector<double> qkv = NaiveMatVec(f.qkv, d.h, c_dim, xd.data());
  const std::vector<double> z = NaiveMatVec(f.gate, d.h, d.nv * d.dv, xd.data());
  const std::vector<double> ba = NaiveMatVec(f.ba, d.h, 2 * d.nv, xd.data());
  std::vector<double> act(static_cast<size_t>(c_dim));
  for (int64_t c = 0; c < c_dim; ++c) {
    double sum = f.conv1d[c * d.kk + d.kk - 1] * qkv[c];  // tap kk−1: the current token
    for (int64_t q = 0; q + 1 < d.kk; ++q) sum += f.conv1d[c * d.kk + q] * conv_hist[q * c_dim + c];
    act[c] = NaiveSilu(sum);
  }
  conv_hist.erase(conv_hist.begin(), conv_hist.begin() + c_dim);
  conv_hist.insert(conv_hist.end(), qkv.begin(), qkv.end());
  std::vector<double> o(static_cast<size_t>(d.nv * d.dv));
  for (int64_t vh = 0; vh < d.nv; ++vh) {
    const int64_t g = vh / r;
    const double b = ba[g * 2 * r + vh % r], a = ba[g * 2 * r + r + vh % r];
    const double beta = NaiveSigmoid(b);
    const double glog = f.gates.ssm_a[vh] * std::log1p(std::exp(a + f.gates.dt_bias[vh]));
    std::vector<double> q(act.begin() + g * d.dk, act.begin() + (g + 1) * d.dk);
    std::vector<double> k(act.begin() + d.nk * d.dk + g * d.dk, act.begin() + d.nk * d.dk + (g + 1) * d.dk);
    const double* v = act.data() + 2 * d.nk * d.dk + vh * d.dv;
    double qq = 0, kk = 0;
    for (int64_t i = 0; i < d.dk; ++i) qq += q[i] * q[i], kk += k[i] * k[i];
    for (int64_t i = 0; i < d.dk; ++i) q[i] /= std::sqrt(qq + 1e-6) * std::sqrt(static_cast<double>(d.dk));
    for (int64_t i = 0; i < d.dk; ++i) k[i] /= std::sqrt(kk + 1e-6);
    double* Sh = S.data() + vh * d.dk * d.dv;
    for (int64_t i = 0; i < d.dk * d.dv; ++i) Sh[i] *= std::exp(glog);
    for (int64_t j = 0; j < d.dv; ++j) {
      double sk = 0;
      for (int64_t i = 0; i < d.dk; ++i) sk += Sh[i * d.dv + j] * k[i];
      const double delta = beta * (v[j] - sk);
      for (int64_t i = 0; i < d.dk; ++i) Sh[i * d.dv + j] += k[i] * delta;
    }
    double* oh = o.data() + vh * d.dv;
    double ss = 0;
    for (int64_t j = 0; j < d.dv; ++j) {
      oh[j] = 0;
      for (int64_t i = 0; i < d.dk; ++i) oh[j] += Sh[i * d.dv + j] * q[i];
      ss += oh[j] * oh[j];
    }
    const double inv = 1.0 / std::sqrt(ss / d.dv + d.eps);
    for (int64_t j = 0; j < d.dv; ++j) oh[j] = f.norm[j] * oh[j] * inv * NaiveSilu(z[vh * d.dv + j]);
  }
  return NaiveMatVec(f.out, d.nv * d.dv, d.h, o.data());
}

TEST(GdnForwardTest, RecurrentMatchesNaiveLayer) {
  std::mt19937 rng(24);
  GdnFixture f(rng);
  const int64_t n = 6;
  OwnedState st = RandomState(rng, f.d);
  std::vector<double> conv_hist(st.conv.begin(), st.conv.end()), S(st.ssm.begin(), st.ssm.end());
  const std::vector<float> x = RandomVector(rng, n * f.d.h);
  std::vector<float> y(x.size());
  GdnForward(f.w, f.d, st.view(), x.data(), n, y.data(), GdnOptions{}, nullptr);
  std::vector<float> ref;
  for (int64_t t = 0; t < n; ++t) {
    for (double v : NaiveGdnToken(f, conv_hist, S, x.data() + t * f.d.h)) ref.push_back(static_cast<float>(v));
  }
  EXPECT_LE(RelativeL2(y, ref), 1e-5);
  EXPECT_LE(RelativeL2(st.ssm, std::vector<float>(S.begin(), S.end())), 1e-5);
  // The conv history holds MatMul outputs (f32 sums per 256-element chunk; matmul.h's bound),
  // so it matches the f64 projection to rounding, not bit for bit.
  EXPECT_LE(RelativeL2(st.conv, std::vector<float>(conv_hist.begin(), conv_hist.end())), 1e-6);
}

TEST(GdnForwardTest, ChunkedWholeSequenceEqualsRecurrentTokenByToken) {
  std::mt19937 rng(25);
  GdnFixture f(rng);
  ThreadPool pool(2);
  for (int64_t n : {1, 7, 64, 65, 200}) {
    const OwnedState start = RandomState(rng, f.d);
    const std::vector<float> x = RandomVector(rng, n * f.d.h);
    OwnedState rec = start, chk = start;
    std::vector<float> y_rec(x.size()), y_chk(x.size());
    for (int64_t t = 0; t < n; ++t) {
      GdnForward(f.w, f.d, rec.view(), x.data() + t * f.d.h, 1, y_rec.data() + t * f.d.h, GdnOptions{}, nullptr);
    }
    for (int64_t chunk : {8, 64}) {
      chk = start;
      GdnForward(f.w, f.d, chk.view(), x.data(), n, y_chk.data(), GdnOptions{GdnMode::kChunked, chunk}, &pool);
      EXPECT_LE(RelativeL2(y_chk, y_rec), 1e-5) << "n=" << n << " chunk=" << chunk;
      EXPECT_LE(RelativeL2(chk.ssm, rec.ssm), 1e-5) << "n=" << n << " chunk=" << chunk;
      EXPECT_EQ(chk.conv, rec.conv) << "n=" << n;
    }
  }
}

TEST(GdnForwardTest, SplittingASequenceCarriesState) {
  std::mt19937 rng(26);
  GdnFixture f(rng);
  const int64_t n = 50, first = 23;
  const OwnedState start = RandomState(rng, f.d);
  const std::vector<float> x = RandomVector(rng, n * f.d.h);
  for (GdnMode mode : {GdnMode::kRecurrent, GdnMode::kChunked}) {
    const GdnOptions opt{mode, 16};
    OwnedState whole = start, split = start;
    std::vector<float> y_whole(x.size()), y_split(x.size());
    GdnForward(f.w, f.d, whole.view(), x.data(), n, y_whole.data(), opt, nullptr);
    GdnForward(f.w, f.d, split.view(), x.data(), first, y_split.data(), opt, nullptr);
    GdnForward(f.w, f.d, split.view(), x.data() + first * f.d.h, n - first, y_split.data() + first * f.d.h, opt,
               nullptr);
    if (mode == GdnMode::kRecurrent) {
      // Token by token the arithmetic is identical however the calls are split.
      EXPECT_EQ(y_split, y_whole);
      EXPECT_EQ(split.ssm, whole.ssm);
    } else {
      EXPECT_LE(RelativeL2(y_split, y_whole), 1e-5);
      EXPECT_LE(RelativeL2(split.ssm, whole.ssm), 1e-5);
    }
    EXPECT_EQ(split.conv, whole.conv);
  }
}

}  // namespace
}  // namespace tandem
