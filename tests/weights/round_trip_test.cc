// dequantize(quantize(x)) on random rows: error bounds that follow from each format, exact
// behaviour on zero rows and float types, determinism; and DotRow against an f64 dot product.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "common/weights/half.h"
#include "common/weights/weight_types.h"
#include "gtest/gtest.h"
#include "tests/weights/test_data.h"

namespace tandem {
namespace {

using testing::NormalData;
using testing::RmsError;

constexpr WeightType kAllTypes[] = {WeightType::kF32,  WeightType::kF16,  WeightType::kBF16, WeightType::kQ8_0,
                                    WeightType::kQ4_0, WeightType::kQ2_K, WeightType::kQ3_K, WeightType::kQ4_K,
                                    WeightType::kQ5_K, WeightType::kQ6_K};

std::vector<float> RoundTrip(WeightType type, const std::vector<float>& x, std::vector<uint8_t>* bytes = nullptr) {
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<uint8_t> q(*RowBytes(type, n));
  QuantizeRow(type, x.data(), q.data(), n);
  std::vector<float> y(n);
  DequantizeRow(type, q.data(), y.data(), n);
  if (bytes != nullptr) *bytes = q;
  return y;
}

TEST(RoundTrip, FloatTypesRoundEachElement) {
  const std::vector<float> x = NormalData(7, 1024);
  EXPECT_EQ(RoundTrip(WeightType::kF32, x), x);
  const std::vector<float> h = RoundTrip(WeightType::kF16, x);
  const std::vector<float> b = RoundTrip(WeightType::kBF16, x);
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_EQ(h[i], Fp16ToFp32(Fp32ToFp16(x[i])));
    ASSERT_EQ(b[i], Bf16ToFp32(Fp32ToBf16(x[i])));
    // Half an ulp of the format at x's binade (f16 values here are all normal: |x| > 2^-14 or
    // the absolute subnormal step bounds it).
    ASSERT_LE(std::fabs(h[i] - x[i]), std::max(std::fabs(x[i]) * 0x1.0p-11f, 0x1.0p-25f));
    ASSERT_LE(std::fabs(b[i] - x[i]), std::fabs(x[i]) * 0x1.0p-8f);
  }
}

TEST(RoundTrip, Q8_0ErrorIsHalfAStep) {
  const std::vector<float> x = NormalData(11, 4096);
  const std::vector<float> y = RoundTrip(WeightType::kQ8_0, x);
  for (size_t start = 0; start < x.size(); start += 32) {
    float amax = 0;
    for (size_t i = start; i < start + 32; ++i) amax = std::max(amax, std::fabs(x[i]));
    // step d = amax / 127 (stored as f16: relative error <= 2^-11 moves a level by <= 127 * that).
    const float step = amax / 127;
    for (size_t i = start; i < start + 32; ++i) {
      ASSERT_LE(std::fabs(y[i] - x[i]), step * (0.5f + 127 * 0x1.0p-11f) * 1.0001f) << i;
    }
  }
}

TEST(RoundTrip, Q4_0ErrorIsAtMostOneStep) {
  const std::vector<float> x = NormalData(13, 4096);
  const std::vector<float> y = RoundTrip(WeightType::kQ4_0, x);
  for (size_t start = 0; start < x.size(); start += 32) {
    float amax = 0;
    for (size_t i = start; i < start + 32; ++i) amax = std::max(amax, std::fabs(x[i]));
    // step amax / 8; the side opposite the largest value is clamped at level 15, so up to one
    // step there, half a step elsewhere (plus f16 rounding of the step, 8 levels of 2^-11).
    const float step = amax / 8;
    for (size_t i = start; i < start + 32; ++i) {
      ASSERT_LE(std::fabs(y[i] - x[i]), step * (1.0f + 8 * 0x1.0p-11f) * 1.0001f) << i;
    }
  }
}

TEST(RoundTrip, KQuantErrorStaysWithinTheSuperBlockRange) {
  // Each K-quant must reproduce every element to within a fraction of its super-block's range
  // that halves with each extra bit. The bounds are about 1.5x the worst element seen over six
  // seeds of 8192 values (0.195, 0.100, 0.046, 0.023, 0.010), far below the error of a misplaced
  // bit or scale, which is of the order of the range itself.
  const struct {
    WeightType type;
    double max_fraction;  // of the super-block's (max - min)
  } kCases[] = {{WeightType::kQ2_K, 0.3}, {WeightType::kQ3_K, 0.15}, {WeightType::kQ4_K, 0.07},
                {WeightType::kQ5_K, 0.035}, {WeightType::kQ6_K, 0.015}};
  const std::vector<float> x = NormalData(17, 8192);
  for (const auto& c : kCases) {
    SCOPED_TRACE(GetWeightTypeInfo(c.type).name);
    const std::vector<float> y = RoundTrip(c.type, x);
    for (size_t start = 0; start < x.size(); start += 256) {
      float lo = x[start];
      float hi = x[start];
      for (size_t i = start; i < start + 256; ++i) {
        lo = std::min(lo, x[i]);
        hi = std::max(hi, x[i]);
      }
      for (size_t i = start; i < start + 256; ++i) {
        ASSERT_LE(std::fabs(y[i] - x[i]), c.max_fraction * (hi - lo)) << "element " << i;
      }
    }
  }
}

TEST(RoundTrip, PowerOfTwoScalingIsExact) {
  // Every step of the reference algorithms commutes with scaling by a power of two as long as
  // the f16 block scales stay normal, so the round trip must scale exactly: no hidden absolute
  // epsilons, no dependence on magnitude.
  const std::vector<float> x = NormalData(19, 4096);
  for (WeightType type : kAllTypes) {
    if (GetWeightTypeInfo(type).block_elems == 1) continue;  // plain floats: covered above
    SCOPED_TRACE(GetWeightTypeInfo(type).name);
    const std::vector<float> base = RoundTrip(type, x);
    for (float factor : {0.5f, 256.0f}) {
      std::vector<float> scaled(x);
      for (float& v : scaled) v *= factor;
      const std::vector<float> y = RoundTrip(type, scaled);
      for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(y[i], factor * base[i]) << "factor " << factor << " i " << i;
    }
  }
}

TEST(RoundTrip, ZeroRowsAndConstantRows) {
  for (WeightType type : kAllTypes) {
    SCOPED_TRACE(GetWeightTypeInfo(type).name);
    const std::vector<float> zeros(512, 0.0f);
    for (float v : RoundTrip(type, zeros)) ASSERT_EQ(v, 0.0f);
    // A constant row: every level the same; asymmetric types represent it through the min.
    const std::vector<float> constant(512, -0.75f);
    for (float v : RoundTrip(type, constant)) ASSERT_NEAR(v, -0.75f, 0.75 * 0.01);
  }
}

TEST(RoundTrip, QuantizationIsDeterministic) {
  const std::vector<float> x = NormalData(23, 2048);
  for (WeightType type : kAllTypes) {
    std::vector<uint8_t> first;
    std::vector<uint8_t> second;
    RoundTrip(type, x, &first);
    RoundTrip(type, x, &second);
    EXPECT_EQ(first, second) << GetWeightTypeInfo(type).name;
  }
}

TEST(DotRow, MatchesF64DotOfDequantizedRow) {
  const int64_t n = 1024 + 512;  // whole super-blocks, and a float row with a short last chunk
  const std::vector<float> w = NormalData(29, n);
  const std::vector<float> x = NormalData(31, n);
  for (WeightType type : kAllTypes) {
    SCOPED_TRACE(GetWeightTypeInfo(type).name);
    std::vector<uint8_t> q(*RowBytes(type, n));
    QuantizeRow(type, w.data(), q.data(), n);
    std::vector<float> dq(n);
    DequantizeRow(type, q.data(), dq.data(), n);
    double exact = 0;
    double magnitude = 0;  // sum of |products|: the scale f32 accumulation error is relative to
    for (int64_t i = 0; i < n; ++i) {
      exact += static_cast<double>(dq[i]) * x[i];
      magnitude += std::fabs(static_cast<double>(dq[i]) * x[i]);
    }
    const float dot = DotRow(type, q.data(), x.data(), n);
    EXPECT_LE(std::fabs(dot - exact), 1e-5 * magnitude) << "dot " << dot << " exact " << exact;
    // Not trivially zero, and the same order as the unquantized dot.
    EXPECT_GT(magnitude, 100.0);
  }
}

TEST(DotRow, ShortFloatRow) {
  const float w[3] = {1.5f, -2.0f, 0.25f};
  const float x[3] = {2.0f, 0.5f, 4.0f};
  EXPECT_EQ(DotRow(WeightType::kF32, w, x, 3), 3.0f);
}

}  // namespace
}  // namespace tandem
