#include "common/reference/attention.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "common/reference/matmul.h"
#include "common/reference/ops.h"
#include "gtest/gtest.h"
#include "tests/reference/test_util.h"
#include "tests/test_seed.h"

namespace tandem {
namespace {

using testing::NaiveMatVec;
using testing::NaiveRmsNorm;
using testing::NaiveSigmoid;
using testing::RandomVector;
using testing::RelativeL2;

TEST(RopeTest, PartialNeoxRotationGoldenValues) {
  // hd = 8, rot = 4, θ = 100, position 3: pairs (0, 2) turn by 3·100⁰ = 3 rad and (1, 3) by
  // 3·100^(−2/4) = 0.3 rad; dims 4..7 stay. With x = 1..8:
  //   x0' = 1·cos 3 − 3·sin 3 = −1.4133525,   x2' = 1·sin 3 + 3·cos 3 = −2.8288575,
  //   x1' = 2·cos 0.3 − 4·sin 0.3 = 0.7285922, x3' = 2·sin 0.3 + 4·cos 0.3 = 4.4123864.
  float x[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  RopeNeox(x, 4, 100.0, 3);
  const float expected[8] = {-1.4133525f, 0.7285922f, -2.8288575f, 4.4123864f, 5, 6, 7, 8};
  for (int i = 0; i < 8; ++i) EXPECT_NEAR(x[i], expected[i], 2e-7f * (1 + std::fabs(expected[i]))) << i;
  float y[4] = {1, 2, 3, 4};
  RopeNeox(y, 4, 100.0, 0);  // position 0 is the identity
  EXPECT_EQ(y[0], 1.0f);
  EXPECT_EQ(y[3], 4.0f);
}

TEST(IndexerTest, SelectTopBlocksTiesGoToLowerBlock) {
  const std::vector<float> scores = {1.0f, 3.0f, 3.0f, 2.0f, 3.0f};
  EXPECT_EQ(SelectTopBlocks(scores, 1), std::vector<int64_t>({1}));
  EXPECT_EQ(SelectTopBlocks(scores, 2), std::vector<int64_t>({1, 2}));
  EXPECT_EQ(SelectTopBlocks(scores, 4), std::vector<int64_t>({1, 2, 3, 4}));
  EXPECT_EQ(SelectTopBlocks(scores, 5), std::vector<int64_t>({0, 1, 2, 3, 4}));
  EXPECT_EQ(SelectTopBlocks(scores, 9), std::vector<int64_t>({0, 1, 2, 3, 4}));
  const std::vector<float> zeros = {0.0f, 0.0f, 0.0f, 0.0f};  // all ReLU'd away
  EXPECT_EQ(SelectTopBlocks(zeros, 2), std::vector<int64_t>({0, 1}));
}

// The selection margin: the relative gap between the keep-th and the next highest score, 0 at a
// tie (then a rounding difference decides the selection).
TEST(IndexerTest, SelectMarginIsTheRelativeGapAtTheKeepBoundary) {
  const std::vector<float> scores = {1.0f, 4.0f, 3.0f, 2.0f, 3.0f};
  EXPECT_FLOAT_EQ(SelectMargin(scores, 1), 0.25f);  // 4 kept, 3 next
  EXPECT_FLOAT_EQ(SelectMargin(scores, 2), 0.0f);   // 3 kept, 3 next: a tie
  EXPECT_FLOAT_EQ(SelectMargin(scores, 3), 1.0f / 3.0f);
  EXPECT_FLOAT_EQ(SelectMargin(scores, 4), 0.5f);
}

// Random attention weights; the indexer part is optional.
struct AttnFixture {
  AttnDims d;
  std::vector<float> wq, wk, wv, wo, qn, kn, widx, iqn, ikn;
  AttnWeights w;

  AttnFixture(std::mt19937& rng, AttnDims dims) : d(dims) {
    wq = RandomVector(rng, d.h * d.nh * 2 * d.hd, 0.4f);
    wk = RandomVector(rng, d.h * d.kv_width(), 0.4f);
    wv = RandomVector(rng, d.h * d.kv_width(), 0.4f);
    wo = RandomVector(rng, d.nh * d.hd * d.h, 0.3f);
    qn = RandomVector(rng, d.hd, 0.2f, 1.0f);
    kn = RandomVector(rng, d.hd, 0.2f, 1.0f);
    w.q = F32Matrix(wq.data(), d.h, d.nh * 2 * d.hd);
    w.k = F32Matrix(wk.data(), d.h, d.kv_width());
    w.v = F32Matrix(wv.data(), d.h, d.kv_width());
    w.output = F32Matrix(wo.data(), d.nh * d.hd, d.h);
    w.q_norm = qn;
    w.k_norm = kn;
    if (d.has_indexer()) {
      widx = RandomVector(rng, d.h * (d.ih * d.di + d.di), 0.4f);
      iqn = RandomVector(rng, d.di, 0.2f, 1.0f);
      ikn = RandomVector(rng, d.di, 0.2f, 1.0f);
      SetIndexer();
    }
  }
  void SetIndexer() {
    w.idx_qk = F32Matrix(widx.data(), d.h, d.ih * d.di + d.di);
    w.idx_q_norm = iqn;
    w.idx_k_norm = ikn;
  }
  AttnWeights DenseWeights() const {
    AttnWeights dense = w;
    dense.idx_qk = MatrixView{};
    dense.idx_q_norm = {};
    dense.idx_k_norm = {};
    return dense;
  }
  AttnDims DenseDims() const {
    AttnDims dense = d;
    dense.ih = 0;
    return dense;
  }
};

void NaiveRope(std::vector<double>& x, int64_t off, int64_t rot, double theta, int64_t pos) {
  for (int64_t i = 0; i < rot / 2; ++i) {
    const double angle = pos / std::pow(theta, 2.0 * i / rot);
    const double a = x[off + i], b = x[off + i + rot / 2];
    x[off + i] = a * std::cos(angle) - b * std::sin(angle);
    x[off + i + rot / 2] = a * std::sin(angle) + b * std::cos(angle);
  }
}

// §4.5 steps 1, 2, 5, 6 in f64 for the query at position p attending exactly `positions`.
std::vector<float> NaiveAttention(const AttnFixture& f, const std::vector<float>& x, int64_t p,
                                  const std::vector<int64_t>& positions) {
  const AttnDims& d = f.d;
  auto input = [&](int64_t j) { return std::vector<double>(x.begin() + j * d.h, x.begin() + (j + 1) * d.h); };
  auto key = [&](int64_t j) {
    const std::vector<double> xj = input(j);
    std::vector<double> k = NaiveMatVec(f.wk, d.h, d.kv_width(), xj.data());
    for (int64_t g = 0; g < d.kvh; ++g) {
      std::vector<float> raw(k.begin() + g * d.hd, k.begin() + (g + 1) * d.hd);
      const std::vector<double> n = NaiveRmsNorm(raw.data(), d.hd, d.eps, f.kn.data());
      std::copy(n.begin(), n.end(), k.begin() + g * d.hd);
      NaiveRope(k, g * d.hd, d.rot, d.theta, j);
    }
    return k;
  };
  const std::vector<double> xp = input(p);
  const std::vector<double> qg = NaiveMatVec(f.wq, d.h, d.nh * 2 * d.hd, xp.data());
  std::vector<double> o(static_cast<size_t>(d.nh * d.hd));
  for (int64_t hh = 0; hh < d.nh; ++hh) {
    std::vector<float> raw(qg.begin() + hh * 2 * d.hd, qg.begin() + hh * 2 * d.hd + d.hd);
    std::vector<double> q = NaiveRmsNorm(raw.data(), d.hd, d.eps, f.qn.data());
    NaiveRope(q, 0, d.rot, d.theta, p);
    const int64_t g = hh / (d.nh / d.kvh);
    std::vector<double> logits;
    for (int64_t j : positions) {
      const std::vector<double> k = key(j);
      double s = 0;
      for (int64_t e = 0; e < d.hd; ++e) s += q[e] * k[g * d.hd + e];
      logits.push_back(s / std::sqrt(static_cast<double>(d.hd)));
    }
    const double mx = *std::max_element(logits.begin(), logits.end());
    double z = 0;
    for (double& l : logits) z += (l = std::exp(l - mx));
    for (size_t jj = 0; jj < positions.size(); ++jj) {
      const std::vector<double> xj = input(positions[jj]);
      const std::vector<double> v = NaiveMatVec(f.wv, d.h, d.kv_width(), xj.data());
      for (int64_t e = 0; e < d.hd; ++e) o[hh * d.hd + e] += logits[jj] / z * v[g * d.hd + e];
    }
    for (int64_t e = 0; e < d.hd; ++e) o[hh * d.hd + e] *= NaiveSigmoid(qg[hh * 2 * d.hd + d.hd + e]);
  }
  const std::vector<double> y = NaiveMatVec(f.wo, d.nh * d.hd, d.h, o.data());
  return std::vector<float>(y.begin(), y.end());
}

std::vector<float> Row(const std::vector<float>& y, int64_t t, int64_t h) {
  return std::vector<float>(y.begin() + t * h, y.begin() + (t + 1) * h);
}

std::vector<int64_t> Range(int64_t begin, int64_t end) {
  std::vector<int64_t> r;
  for (int64_t j = begin; j < end; ++j) r.push_back(j);
  return r;
}

TEST(AttentionTest, DenseCausalAttentionMatchesNaiveSoftmax) {
  std::mt19937 rng(31);
  const AttnFixture f(rng, AttnDims{.h = 24, .nh = 4, .kvh = 2, .hd = 16, .rot = 8, .theta = 1e4, .eps = 1e-6f});
  ASSERT_TRUE(CheckAttnWeights(f.w, f.d).ok());
  const int64_t n = 9;
  const std::vector<float> x = RandomVector(rng, n * f.d.h);
  ContiguousAttentionCache cache(f.d, n);
  std::vector<float> y(x.size());
  ThreadPool pool(3);
  AttentionForward(f.w, f.d, cache, 0, x.data(), n, y.data(), &pool);
  for (int64_t p = 0; p < n; ++p) {
    EXPECT_LE(RelativeL2(Row(y, p, f.d.h), NaiveAttention(f, x, p, Range(0, p + 1))), 1e-5) << "p=" << p;
  }
}

TEST(AttentionTest, PrefillEqualsSinglePositionCalls) {
  std::mt19937 rng(32);
  const AttnFixture f(rng, AttnDims{.h = 16, .nh = 2, .kvh = 1, .hd = 8, .rot = 4, .theta = 1e6, .eps = 1e-6f,
                                    .ih = 2, .di = 8, .cr = 3, .keep = 2});
  ASSERT_TRUE(CheckAttnWeights(f.w, f.d).ok());
  const int64_t n = 20;  // past (keep + 1)·cr = 9, so the sparse path runs too
  const std::vector<float> x = RandomVector(rng, n * f.d.h);
  ContiguousAttentionCache whole(f.d, n), single(f.d, n);
  std::vector<float> y_whole(x.size()), y_single(x.size());
  AttentionForward(f.w, f.d, whole, 0, x.data(), n, y_whole.data(), nullptr);
  for (int64_t p = 0; p < n; ++p) {
    AttentionForward(f.w, f.d, single, p, x.data() + p * f.d.h, 1, y_single.data() + p * f.d.h, nullptr);
  }
  EXPECT_EQ(y_whole, y_single);
  // The margins: +inf while every block is attended (p / cr <= keep), then the gap of that
  // position's block scores; the same whether asked for or not (y unchanged).
  // The block selections likewise leave y alone, and one prefill selects what the single calls do.
  ContiguousAttentionCache again(f.d, n), single_sel(f.d, n);
  std::vector<float> y_again(x.size()), margins(n, -1.0f);
  std::vector<int32_t> blocks(n * f.d.keep, -1), counts(n, -1);
  std::vector<int32_t> single_blocks(blocks.size(), -1), single_counts(n, -1);
  AttentionForward(f.w, f.d, again, 0, x.data(), n, y_again.data(), nullptr, margins.data(), blocks.data(),
                   counts.data());
  EXPECT_EQ(y_again, y_whole);
  for (int64_t p = 0; p < n; ++p) {
    AttentionForward(f.w, f.d, single_sel, p, x.data() + p * f.d.h, 1, y_single.data() + p * f.d.h, nullptr, nullptr,
                     single_blocks.data() + p * f.d.keep, single_counts.data() + p);
  }
  EXPECT_EQ(y_single, y_whole);
  EXPECT_EQ(single_counts, counts);
  EXPECT_EQ(single_blocks, blocks);
  for (int64_t p = 0; p < n; ++p) EXPECT_EQ(counts[p], std::min<int64_t>(p / f.d.cr, f.d.keep)) << p;
  for (int64_t p = 0; p < n; ++p) {
    if (p / f.d.cr <= f.d.keep) {
      EXPECT_TRUE(std::isinf(margins[p]) && margins[p] > 0) << p;
    } else {
      EXPECT_TRUE(std::isfinite(margins[p]) && margins[p] >= 0.0f) << p;
    }
  }
  for (int64_t b = 0; b < n / f.d.cr; ++b) {
    EXPECT_EQ(std::vector<float>(whole.block_key(b), whole.block_key(b) + f.d.di),
              std::vector<float>(single.block_key(b), single.block_key(b) + f.d.di));
  }
}

TEST(IndexerTest, SparseEqualsDenseUpToKeepPlusOneBlocks) {
  std::mt19937 rng(33);
  const AttnFixture f(rng, AttnDims{.h = 16, .nh = 2, .kvh = 2, .hd = 8, .rot = 4, .theta = 1e4, .eps = 1e-6f,
                                    .ih = 2, .di = 4, .cr = 4, .keep = 2});
  const int64_t last_dense = (f.d.keep + 1) * f.d.cr - 1;  // 11
  const int64_t n = last_dense + 1 + 2 * f.d.cr;
  const std::vector<float> x = RandomVector(rng, n * f.d.h);
  ContiguousAttentionCache sparse_cache(f.d, n), dense_cache(f.d, n);
  std::vector<float> y_sparse(x.size()), y_dense(x.size());
  AttentionForward(f.w, f.d, sparse_cache, 0, x.data(), n, y_sparse.data(), nullptr);
  AttentionForward(f.DenseWeights(), f.DenseDims(), dense_cache, 0, x.data(), n, y_dense.data(), nullptr);
  for (int64_t p = 0; p <= last_dense; ++p) EXPECT_EQ(Row(y_sparse, p, f.d.h), Row(y_dense, p, f.d.h)) << p;
  // Past the bound the query drops a block, so the outputs must differ.
  for (int64_t p = last_dense + 1; p < n; ++p) EXPECT_NE(Row(y_sparse, p, f.d.h), Row(y_dense, p, f.d.h)) << p;
}

TEST(IndexerTest, BlockKeyIsRopedNormOfMeanRawKey) {
  std::mt19937 rng(34);
  const AttnFixture f(rng, AttnDims{.h = 16, .nh = 2, .kvh = 2, .hd = 8, .rot = 4, .theta = 1e4, .eps = 1e-6f,
                                    .ih = 1, .di = 6, .cr = 3, .keep = 1});
  const int64_t n = 10;  // blocks 0..2 complete, block 3 not
  const std::vector<float> x = RandomVector(rng, n * f.d.h);
  ContiguousAttentionCache cache(f.d, n);
  std::vector<float> y(x.size());
  AttentionForward(f.w, f.d, cache, 0, x.data(), n, y.data(), nullptr);
  const int64_t di = f.d.di, width = f.d.ih * di + di;
  for (int64_t b = 0; b < 3; ++b) {
    std::vector<float> mean(static_cast<size_t>(di), 0.0f);
    for (int64_t j = b * f.d.cr; j < (b + 1) * f.d.cr; ++j) {
      const std::vector<double> xj(x.begin() + j * f.d.h, x.begin() + (j + 1) * f.d.h);
      const std::vector<double> all = NaiveMatVec(f.widx, f.d.h, width, xj.data());
      for (int64_t i = 0; i < di; ++i) {
        EXPECT_NEAR(cache.index_key(j)[i], all[f.d.ih * di + i], 1e-5);  // raw index key kept
        mean[i] += static_cast<float>(all[f.d.ih * di + i] / f.d.cr);
      }
    }
    std::vector<double> kb = NaiveRmsNorm(mean.data(), di, f.d.eps, f.ikn.data());
    NaiveRope(kb, 0, f.d.rot, f.d.theta, b * f.d.cr);
    for (int64_t i = 0; i < di; ++i) EXPECT_NEAR(cache.block_key(b)[i], kb[i], 1e-5) << b << " " << i;
  }
}

// Hand-built selection: rot = 0 (no position dependence), x[0] = 1 feeds every index query as
// (1, 0, 0, 0), and x[1], x[2] = (cos φ_b, sin φ_b) of the position's block feed the raw index key
// as (cos φ_b, sin φ_b, 0, 0). After the norms (γ = 1) iq = (2, 0, 0, 0) and K_b ≈ 2(cos φ_b,
// sin φ_b, 0, 0), so s_b = Σ_j ReLU(4 cos φ_b)/√4 = 4 cos φ_b for two index heads: the ranking is
// the ranking of cos φ_b, and blocks with the same φ tie exactly.
TEST(IndexerTest, HandBuiltSelectionAttendsExactlyTheChosenBlocks) {
  std::mt19937 rng(35);
  AttnFixture f(rng, AttnDims{.h = 8, .nh = 2, .kvh = 1, .hd = 8, .rot = 0, .theta = 1e4, .eps = 1e-6f,
                              .ih = 2, .di = 4, .cr = 4, .keep = 2});
  const int64_t h = f.d.h, di = f.d.di, width = f.d.ih * di + di;
  f.widx.assign(static_cast<size_t>(h * width), 0.0f);
  f.widx[0 * h + 0] = 1.0f;       // iq_1[0] = x[0]
  f.widx[di * h + 0] = 1.0f;      // iq_2[0] = x[0]
  f.widx[(2 * di) * h + 1] = 1.0f;      // ik[0] = x[1]
  f.widx[(2 * di + 1) * h + 2] = 1.0f;  // ik[1] = x[2]
  f.iqn.assign(static_cast<size_t>(di), 1.0f);
  f.ikn.assign(static_cast<size_t>(di), 1.0f);
  f.SetIndexer();
  ASSERT_TRUE(CheckAttnWeights(f.w, f.d).ok());
  // cos φ_b per block: block 4 is negative (score 0), blocks 1 and 5 tie.
  const std::vector<float> cosines = {0.2f, 0.7f, 0.5f, 0.9f, -0.5f, 0.7f, 0.1f};
  const int64_t n = 26;  // blocks 0..5 complete, block 6 holds positions 24, 25
  std::vector<float> x = RandomVector(rng, n * h);
  for (int64_t j = 0; j < n; ++j) {
    const float c = cosines[j / f.d.cr];
    x[j * h + 0] = 1.0f;
    x[j * h + 1] = c;
    x[j * h + 2] = std::sqrt(1.0f - c * c);
  }
  ContiguousAttentionCache cache(f.d, n);
  std::vector<float> y(x.size());
  std::vector<int32_t> blocks(n * f.d.keep, -1), counts(n, -1);
  AttentionForward(f.w, f.d, cache, 0, x.data(), n, y.data(), nullptr, nullptr, blocks.data(), counts.data());

  // Scores of the six complete blocks as seen from position 25.
  std::vector<float> iq(static_cast<size_t>(2 * di), 0.0f);
  iq[0] = iq[di] = 2.0f;
  std::vector<float> scores(6);
  IndexerBlockScores(f.d, cache, iq.data(), 6, scores.data());
  for (int64_t b = 0; b < 6; ++b) EXPECT_NEAR(scores[b], std::max(0.0f, 4 * cosines[b]), 1e-4) << b;
  EXPECT_EQ(scores[1], scores[5]);

  // Blocks chosen besides the own block, by hand from the cosines, per number of earlier blocks.
  // nb = 3: {0.2, 0.7, 0.5} -> {1, 2}; nb = 4, 5: 0.9 then 0.7 -> {1, 3}; nb = 6: 0.9, then 0.7 at
  // blocks 1 and 5 tie -> the lower, 1.
  const std::vector<std::vector<int64_t>> chosen = {{}, {}, {}, {1, 2}, {1, 3}, {1, 3}, {1, 3}};
  for (int64_t p = 0; p < n; ++p) {
    const int64_t nb = p / f.d.cr;
    std::vector<int64_t> positions;
    if (nb <= f.d.keep) {
      positions = Range(0, p + 1);
    } else {
      for (int64_t b : chosen[nb]) {
        for (int64_t j : Range(b * f.d.cr, (b + 1) * f.d.cr)) positions.push_back(j);
      }
      for (int64_t j : Range(nb * f.d.cr, p + 1)) positions.push_back(j);
    }
    EXPECT_LE(RelativeL2(Row(y, p, h), NaiveAttention(f, x, p, positions)), 1e-5) << "p=" << p;
    // The reported selection: every earlier block while nb <= keep, else the hand-chosen blocks
    // (the exact tie of blocks 1 and 5 at nb = 6 reported as the lower one, as attended).
    const std::vector<int32_t> got(blocks.begin() + p * f.d.keep, blocks.begin() + p * f.d.keep + counts[p]);
    std::vector<int32_t> want;
    if (nb <= f.d.keep) {
      for (int64_t b = 0; b < nb; ++b) want.push_back(static_cast<int32_t>(b));
    } else {
      for (int64_t b : chosen[nb]) want.push_back(static_cast<int32_t>(b));
    }
    EXPECT_EQ(got, want) << "p=" << p;
  }
}

// The selection AttentionForward reports is SelectTopBlocks (keep highest scores, ties to the lower
// block, ascending) of the block scores IndexerBlockScores gives for each position's index queries,
// recomputed here with the same f32 operations (the same bits), for random weights and inputs; and
// asking for it leaves y alone.
TEST(IndexerTest, ReportedSelectionIsTheTopKeepOfTheBlockScores) {
  std::mt19937 rng = testing::SeededRng();
  const AttnFixture f(rng, AttnDims{.h = 16, .nh = 2, .kvh = 1, .hd = 8, .rot = 4, .theta = 1e4, .eps = 1e-6f,
                                    .ih = 3, .di = 8, .cr = 2, .keep = 3});
  ASSERT_TRUE(CheckAttnWeights(f.w, f.d).ok());
  const AttnDims& d = f.d;
  const int64_t n = 41;  // 20 complete blocks: most positions choose 3 of many
  const std::vector<float> x = RandomVector(rng, n * d.h);
  ContiguousAttentionCache cache(d, n), plain_cache(d, n);
  std::vector<float> y(x.size()), y_plain(x.size());
  std::vector<int32_t> blocks(n * d.keep, -1), counts(n, -1);
  AttentionForward(f.w, d, cache, 0, x.data(), n, y.data(), nullptr, nullptr, blocks.data(), counts.data());
  AttentionForward(f.w, d, plain_cache, 0, x.data(), n, y_plain.data(), nullptr);
  EXPECT_EQ(y, y_plain);

  const int64_t width = d.ih * d.di + d.di;
  std::vector<float> iqk(static_cast<size_t>(n * width));
  MatMul(f.w.idx_qk, x.data(), n, iqk.data(), nullptr);
  int64_t sparse = 0;
  for (int64_t p = 0; p < n; ++p) {
    const int64_t nb = p / d.cr;
    float* iq = iqk.data() + p * width;
    for (int64_t j = 0; j < d.ih; ++j) {
      RmsNorm(iq + j * d.di, d.di, d.eps, f.iqn.data(), iq + j * d.di);
      RopeNeox(iq + j * d.di, d.rot, d.theta, p);
    }
    std::vector<float> scores(static_cast<size_t>(nb));
    IndexerBlockScores(d, cache, iq, nb, scores.data());
    const std::vector<int64_t> top = SelectTopBlocks(scores, d.keep);  // every block while nb <= keep
    const std::vector<int32_t> want(top.begin(), top.end());
    ASSERT_EQ(counts[p], static_cast<int32_t>(want.size())) << "p=" << p;
    const std::vector<int32_t> got(blocks.begin() + p * d.keep, blocks.begin() + p * d.keep + counts[p]);
    EXPECT_EQ(got, want) << "p=" << p;
    sparse += nb > d.keep;
  }
  EXPECT_GT(sparse, n / 2);
}

}  // namespace
}  // namespace tandem
