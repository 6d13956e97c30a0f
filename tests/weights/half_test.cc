// f16 / bf16 conversions: hand-picked edge cases (ties, subnormals, overflow, inf, NaN) and a
// sweep of f32 bit patterns against an independent rounding written with double arithmetic.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "common/weights/half.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

TEST(Fp16, ExactValuesAndRoundingTies) {
  EXPECT_EQ(Fp32ToFp16(1.0f), 0x3C00);
  EXPECT_EQ(Fp32ToFp16(-2.0f), 0xC000);
  EXPECT_EQ(Fp32ToFp16(0.0f), 0x0000);
  EXPECT_EQ(Fp32ToFp16(-0.0f), 0x8000);
  EXPECT_EQ(Fp32ToFp16(65504.0f), 0x7BFF);  // largest finite
  // f16 has 10 mantissa bits: 1 + 2^-11 is halfway between 1 and 1 + 2^-10; ties go to even.
  EXPECT_EQ(Fp32ToFp16(1.0f + 0x1.0p-11f), 0x3C00);
  EXPECT_EQ(Fp32ToFp16(1.0f + 3 * 0x1.0p-11f), 0x3C02);
  EXPECT_EQ(Fp32ToFp16(1.0f + 0x1.0p-11f + 0x1.0p-23f), 0x3C01);  // just above the tie
  EXPECT_EQ(Fp32ToFp16(-(1.0f + 3 * 0x1.0p-11f)), 0xBC02);
  // Rounding up out of the mantissa carries into the exponent: 2 - 2^-12 -> 2.
  EXPECT_EQ(Fp32ToFp16(2.0f - 0x1.0p-12f), 0x4000);
}

TEST(Fp16, OverflowInfAndNan) {
  EXPECT_EQ(Fp32ToFp16(65519.996f), 0x7BFF);           // below the 65520 tie
  EXPECT_EQ(Fp32ToFp16(65520.0f), 0x7C00);             // the tie rounds to even = inf
  EXPECT_EQ(Fp32ToFp16(-1e10f), 0xFC00);
  EXPECT_EQ(Fp32ToFp16(std::numeric_limits<float>::infinity()), 0x7C00);
  EXPECT_EQ(Fp32ToFp16(-std::numeric_limits<float>::infinity()), 0xFC00);
  EXPECT_EQ(Fp32ToFp16(FloatFromBits(0x7FC00000u)), 0x7E00);  // quiet NaN
  EXPECT_EQ(Fp32ToFp16(FloatFromBits(0x7F800001u)), 0x7E00);  // signaling NaN, payload dropped
  EXPECT_EQ(Fp32ToFp16(FloatFromBits(0xFFC12345u)), 0xFE00);  // sign kept
  EXPECT_TRUE(std::isinf(Fp16ToFp32(0x7C00)));
  EXPECT_EQ(FloatBits(Fp16ToFp32(0xFC00)), 0xFF800000u);
  EXPECT_EQ(FloatBits(Fp16ToFp32(0x7E00)), 0x7FC00000u);
  EXPECT_EQ(FloatBits(Fp16ToFp32(0x7C01)), 0x7FC02000u);  // signaling NaN comes back quiet
  EXPECT_EQ(FloatBits(Fp16ToFp32(0xFE01)), 0xFFC02000u);
}

TEST(Fp16, Subnormals) {
  EXPECT_EQ(Fp32ToFp16(0x1.0p-24f), 0x0001);          // smallest subnormal
  EXPECT_EQ(Fp32ToFp16(0x1.0p-25f), 0x0000);          // half of it: tie to even = 0
  EXPECT_EQ(Fp32ToFp16(0x1.0p-25f * 1.0000001f), 0x0001);  // just above the tie
  EXPECT_EQ(Fp32ToFp16(3 * 0x1.0p-25f), 0x0002);      // 1.5 units: tie to even = 2
  EXPECT_EQ(Fp32ToFp16(5 * 0x1.0p-25f), 0x0002);      // 2.5 units: tie to even = 2
  EXPECT_EQ(Fp32ToFp16(-0x1.0p-24f), 0x8001);
  EXPECT_EQ(Fp32ToFp16(0x1.0p-30f), 0x0000);
  EXPECT_EQ(Fp32ToFp16(FloatFromBits(1)), 0x0000);     // f32 subnormal
  EXPECT_EQ(Fp32ToFp16(0x1.0p-14f - 0x1.0p-24f), 0x03FF);  // largest subnormal
  // 1023.5 units rounds to even 1024 = the smallest normal.
  EXPECT_EQ(Fp32ToFp16(0x1.0p-14f - 0x1.0p-25f), 0x0400);
  EXPECT_EQ(Fp32ToFp16(0x1.0p-14f), 0x0400);
  EXPECT_EQ(Fp16ToFp32(0x0001), 0x1.0p-24f);
  EXPECT_EQ(Fp16ToFp32(0x03FF), 1023 * 0x1.0p-24f);
  EXPECT_EQ(Fp16ToFp32(0x8200), -512 * 0x1.0p-24f);
}

TEST(Fp16, EveryHalfRoundTrips) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = Fp16ToFp32(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_EQ(Fp32ToFp16(f), (h & 0x8000) | 0x7E00) << h;
    } else {
      ASSERT_EQ(Fp32ToFp16(f), h) << h;
    }
  }
}

// Independent reference: the nearest f16 value by double arithmetic (ties to even through
// nearbyint in the default rounding mode), or +-inf when it rounds past 65504.
double NearestHalfValue(float f) {
  const double a = std::fabs(static_cast<double>(f));
  int exponent;
  std::frexp(a, &exponent);                         // a = m * 2^exponent, m in [0.5, 1)
  const int quantum_exp = std::max(exponent - 11, -24);  // 11 significant bits, 2^-24 floor
  double r = std::nearbyint(std::ldexp(a, -quantum_exp));
  r = std::ldexp(r, quantum_exp);
  if (r > 65504.0) r = std::numeric_limits<double>::infinity();
  return std::copysign(r, static_cast<double>(f));
}

double NearestBf16Value(float f) {
  const double a = std::fabs(static_cast<double>(f));
  int exponent;
  std::frexp(a, &exponent);
  const int quantum_exp = std::max(exponent - 8, -133);  // 8 significant bits, 2^-133 floor
  double r = std::ldexp(std::nearbyint(std::ldexp(a, -quantum_exp)), quantum_exp);
  if (r > static_cast<double>(Bf16ToFp32(0x7F7F))) r = std::numeric_limits<double>::infinity();
  return std::copysign(r, static_cast<double>(f));
}

TEST(HalfConversions, SweepAgainstDoubleReference) {
  // Every 4099th f32 bit pattern plus its neighbours near ties (low 13 / 16 bits at the midpoint).
  for (uint64_t w = 0; w <= 0xFFFFFFFFull; w += 4099) {
    for (uint32_t bits : {static_cast<uint32_t>(w), (static_cast<uint32_t>(w) & ~0x1FFFu) | 0x1000u,
                          (static_cast<uint32_t>(w) & ~0xFFFFu) | 0x8000u}) {
      const float f = FloatFromBits(bits);
      if (std::isnan(f)) continue;
      ASSERT_EQ(static_cast<double>(Fp16ToFp32(Fp32ToFp16(f))), NearestHalfValue(f)) << std::hex << bits;
      ASSERT_EQ(std::signbit(Fp16ToFp32(Fp32ToFp16(f))), std::signbit(f)) << std::hex << bits;
      ASSERT_EQ(static_cast<double>(Bf16ToFp32(Fp32ToBf16(f))), NearestBf16Value(f)) << std::hex << bits;
      ASSERT_EQ(std::signbit(Bf16ToFp32(Fp32ToBf16(f))), std::signbit(f)) << std::hex << bits;
    }
  }
}

TEST(Bf16, TiesSubnormalsInfNan) {
  EXPECT_EQ(Fp32ToBf16(1.5f), 0x3FC0);
  EXPECT_EQ(Bf16ToFp32(0xBF80), -1.0f);
  EXPECT_EQ(Fp32ToBf16(FloatFromBits(0x3F808000u)), 0x3F80);  // tie, even below
  EXPECT_EQ(Fp32ToBf16(FloatFromBits(0x3F818000u)), 0x3F82);  // tie, even above
  EXPECT_EQ(Fp32ToBf16(FloatFromBits(0x3F808001u)), 0x3F81);
  EXPECT_EQ(Fp32ToBf16(FloatFromBits(0x00008000u)), 0x0000);  // f32 subnormal tie
  EXPECT_EQ(Fp32ToBf16(FloatFromBits(0x00018000u)), 0x0002);
  EXPECT_EQ(Fp32ToBf16(FloatFromBits(0x80010000u)), 0x8001);  // bf16 subnormal kept
  EXPECT_EQ(Fp32ToBf16(FloatFromBits(0x7F7FFFFFu)), 0x7F80);  // largest f32 rounds to inf
  EXPECT_EQ(Fp32ToBf16(std::numeric_limits<float>::infinity()), 0x7F80);
  EXPECT_EQ(Fp32ToBf16(-std::numeric_limits<float>::infinity()), 0xFF80);
  EXPECT_EQ(Fp32ToBf16(FloatFromBits(0x7F800001u)), 0x7FC0);  // signaling NaN made quiet
  EXPECT_EQ(Fp32ToBf16(FloatFromBits(0xFFA12345u)), 0xFFE1);  // top bits kept, quiet bit set
  EXPECT_EQ(FloatBits(Bf16ToFp32(0x7FC1)), 0x7FC10000u);
}

}  // namespace
}  // namespace tandem
