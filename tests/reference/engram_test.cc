#include "common/reference/engram.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"
#include "tests/reference/test_util.h"

namespace tandem {
namespace {

using testing::NaiveMatVec;
using testing::NaiveRmsNorm;
using testing::NaiveSigmoid;
using testing::NaiveSilu;
using testing::RandomVector;
using testing::RelativeL2;

// N = 3 (orders 2 and 3), K = 2 heads, m = (3, 5, 7), primes P_{2,0} = 7, P_{2,1} = 11,
// P_{3,0} = 13, P_{3,1} = 5, so the offsets are 0, 7, 18, 31. Token map: 1 -> 9, 3 -> 7, 2 -> 2.
// Tokens 1, 3, 2 give x' = 9, 7, 2 (and 0 before the start).
//   p = 0: order 2: 9·3 ^ 0·5 = 27; 27 mod 7 = 6 -> row 6; 27 mod 11 = 5 -> 7 + 5 = 12.
//          order 3: 27 ^ 0·7 = 27; 27 mod 13 = 1 -> 18 + 1 = 19; 27 mod 5 = 2 -> 31 + 2 = 33.
//   p = 1: order 2: 7·3 ^ 9·5 = 21 ^ 45 = 0b010101 ^ 0b101101 = 0b111000 = 56;
//          56 mod 7 = 0 -> 0; 56 mod 11 = 1 -> 8.
//          order 3: 56 ^ 0·7 = 56; 56 mod 13 = 4 -> 22; 56 mod 5 = 1 -> 32.
//   p = 2: order 2: 2·3 ^ 7·5 = 6 ^ 35 = 0b000110 ^ 0b100011 = 0b100101 = 37;
//          37 mod 7 = 2 -> 2; 37 mod 11 = 4 -> 11.
//          order 3: 37 ^ 9·7 = 37 ^ 63 = 0b100101 ^ 0b111111 = 0b011010 = 26;
//          26 mod 13 = 0 -> 18; 26 mod 5 = 1 -> 32.
TEST(EngramRowsTest, HandComputedGoldenRows) {
  EngramConfig c{.max_ngram = 3, .heads = 2, .head_dim = 4, .conv_kernel = 2, .dilation = 1,
                 .multipliers = {3, 5, 7}, .table_sizes = {7, 11, 13, 5}};
  ASSERT_TRUE(CheckEngramConfig(c).ok());
  EXPECT_EQ(c.total_rows(), 36);
  const std::vector<int32_t> token_map = {4, 9, 2, 7};
  const std::vector<int32_t> tokens = {1, 3, 2};
  std::vector<int64_t> rows(3 * 4);
  EngramRows(c, token_map, tokens, 0, 3, rows.data());
  EXPECT_EQ(rows, std::vector<int64_t>({6, 12, 19, 33, 0, 8, 22, 32, 2, 11, 18, 32}));
  // Positions are independent of how the sequence is split into calls.
  std::vector<int64_t> tail(2 * 4);
  EngramRows(c, token_map, tokens, 1, 2, tail.data());
  EXPECT_EQ(tail, std::vector<int64_t>(rows.begin() + 4, rows.end()));
}

// Wrapping u64 products: x' = 2³¹ − 1, m_0 = 2³³ + 1:
//   (2³¹ − 1)(2³³ + 1) = 2⁶⁴ + 2³¹ − 2³³ − 1 ≡ 2⁶⁴ − 3·2³¹ − 1 = 18446744067267100671 (mod 2⁶⁴).
// mod 7: 2³ ≡ 1, so 2⁶⁴ ≡ 2 and 2³¹ ≡ 2: 2 − 6 − 1 = −5 ≡ 2 -> row 2.
// mod 11: 2¹⁰ ≡ 1, so 2⁶⁴ ≡ 2⁴ ≡ 5 and 2³¹ ≡ 2: 5 − 6 − 1 = −2 ≡ 9 -> row 7 + 9 = 16.
TEST(EngramRowsTest, MultiplicationWrapsModulo2To64) {
  EngramConfig c{.max_ngram = 2, .heads = 2, .head_dim = 1, .conv_kernel = 1, .dilation = 1,
                 .multipliers = {(uint64_t{1} << 33) + 1, 3}, .table_sizes = {7, 11}};
  const uint64_t recent[2] = {(uint64_t{1} << 31) - 1, 0};
  EXPECT_EQ(recent[0] * c.multipliers[0], 18446744067267100671ull);
  int64_t rows[2];
  EngramPositionRows(c, recent, rows);
  EXPECT_EQ(rows[0], 2);
  EXPECT_EQ(rows[1], 16);
  // The same through the token path with the identity map (no engram_token_map tensor).
  const std::vector<int32_t> tokens = {2147483647};
  int64_t via_tokens[2];
  EngramRows(c, {}, tokens, 0, 1, via_tokens);
  EXPECT_EQ(via_tokens[0], 2);
  EXPECT_EQ(via_tokens[1], 16);
}

struct EngramFixture {
  EngramConfig c{.max_ngram = 3, .heads = 2, .head_dim = 3, .conv_kernel = 3, .dilation = 2,
                 .multipliers = {0x9E3779B97F4A7C15ull, 0xC2B2AE3D27D4EB4Full, 0x165667B19E3779F9ull},
                 .table_sizes = {11, 13, 17, 19}};
  int64_t S = 2, h = 8;
  std::vector<float> embd, key, value, kn, qn, cn, conv;
  EngramWeights w;

  explicit EngramFixture(std::mt19937& rng) {
    const int64_t width = S * h, pin = c.pin();
    embd = RandomVector(rng, c.head_dim * c.total_rows());
    key = RandomVector(rng, pin * width, 0.3f);
    value = RandomVector(rng, pin * h, 0.3f);
    kn = RandomVector(rng, width, 0.2f, 1.0f);
    qn = RandomVector(rng, width, 0.2f, 1.0f);
    cn = RandomVector(rng, width, 0.2f, 1.0f);
    conv = RandomVector(rng, c.conv_kernel * width, 0.5f);
    w = EngramWeights{F32Matrix(embd.data(), c.head_dim, c.total_rows()), F32Matrix(key.data(), pin, width),
                      F32Matrix(value.data(), pin, h), kn, qn, cn, conv};
  }
};

// Steps 3-6 in f64 over a whole sequence from its start (zero conv history).
std::vector<float> NaiveEngram(const EngramFixture& f, const std::vector<int64_t>& rows, std::vector<float> H,
                               int64_t n, double eps) {
  const int64_t S = f.S, h = f.h, width = S * h, rpt = f.c.rows_per_token(), de = f.c.head_dim;
  std::vector<std::vector<double>> ubar(static_cast<size_t>(n));
  std::vector<double> u_all(static_cast<size_t>(n * width));
  for (int64_t t = 0; t < n; ++t) {
    std::vector<double> e;
    for (int64_t i = 0; i < rpt; ++i) {
      for (int64_t q = 0; q < de; ++q) e.push_back(f.embd[rows[t * rpt + i] * de + q]);
    }
    const std::vector<double> kv = NaiveMatVec(f.key, f.c.pin(), width, e.data());
    const std::vector<double> v = NaiveMatVec(f.value, f.c.pin(), h, e.data());
    ubar[t].resize(static_cast<size_t>(width));
    for (int64_t s = 0; s < S; ++s) {
      std::vector<float> kvs(kv.begin() + s * h, kv.begin() + (s + 1) * h);
      const std::vector<double> a = NaiveRmsNorm(kvs.data(), h, eps, f.kn.data() + s * h);
      const std::vector<double> b = NaiveRmsNorm(H.data() + (t * S + s) * h, h, eps, f.qn.data() + s * h);
      double g = 0;
      for (int64_t j = 0; j < h; ++j) g += a[j] * b[j];
      g /= std::sqrt(static_cast<double>(h));
      const double alpha = NaiveSigmoid((g < 0 ? -1.0 : 1.0) * std::sqrt(std::max(std::fabs(g), 1e-6)));
      std::vector<float> us(static_cast<size_t>(h));
      for (int64_t j = 0; j < h; ++j) us[j] = static_cast<float>(u_all[t * width + s * h + j] = alpha * v[j]);
      const std::vector<double> ub = NaiveRmsNorm(us.data(), h, eps, f.cn.data() + s * h);
      std::copy(ub.begin(), ub.end(), ubar[t].begin() + s * h);
    }
  }
  const int64_t ck = f.c.conv_kernel;
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t ch = 0; ch < width; ++ch) {
      double conv = 0;
      for (int64_t q = 0; q < ck; ++q) {
        const int64_t src = t - (ck - 1 - q) * f.c.dilation;
        if (src >= 0) conv += f.conv[ch * ck + q] * ubar[src][ch];
      }
      H[t * width + ch] += static_cast<float>(u_all[t * width + ch] + NaiveSilu(conv));
    }
  }
  return H;
}

TEST(EngramForwardTest, MatchesNaiveAndCarriesConvState) {
  std::mt19937 rng(51);
  const EngramFixture f(rng);
  ASSERT_TRUE(CheckEngramWeights(f.w, f.c, f.S, f.h).ok());
  const int64_t n = 12, width = f.S * f.h, rpt = f.c.rows_per_token();
  const float eps = 1e-6f;
  std::vector<int32_t> tokens;
  for (int64_t t = 0; t < n; ++t) tokens.push_back(static_cast<int32_t>(rng() % 50000));
  std::vector<int64_t> rows(static_cast<size_t>(n * rpt));
  EngramRows(f.c, {}, tokens, 0, n, rows.data());
  const std::vector<float> H0 = RandomVector(rng, n * width);

  std::vector<float> whole = H0;
  std::vector<float> state(static_cast<size_t>(f.c.conv_history() * width), 0.0f);
  ThreadPool pool(2);
  EngramForward(f.w, f.c, rows.data(), whole.data(), n, f.S, f.h, eps, state.data(), &pool);
  EXPECT_LE(RelativeL2(whole, NaiveEngram(f, rows, H0, n, eps)), 1e-5);

  // The same positions in three calls (1, 4, 7) through the carried conv state.
  std::vector<float> split = H0;
  std::vector<float> split_state(state.size(), 0.0f);
  int64_t done = 0;
  for (int64_t len : {1, 4, 7}) {
    EngramForward(f.w, f.c, rows.data() + done * rpt, split.data() + done * width, len, f.S, f.h, eps,
                  split_state.data(), nullptr);
    done += len;
  }
  EXPECT_EQ(split, whole);
  EXPECT_EQ(split_state, state);
}

}  // namespace
}  // namespace tandem
