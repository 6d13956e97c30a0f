// Golden blocks: for every supported type, blocks assembled byte by byte from ggml's published
// layout (ggml-common.h), dequantized and compared exactly with values computed here from the
// layout's formula. The formulas below read the test's own byte arrays at the published offsets;
// they share no code with the dequantizers. Halves are given as bit patterns with their exact
// values, and every product is exact in f32, so the expected floats are exact.
#include <cstdint>
#include <cstring>
#include <vector>

#include "common/weights/block_layouts.h"
#include "common/weights/weight_types.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

struct Half {
  uint16_t bits;
  double value;
};
constexpr Half kThird = {0x3555, 0.333251953125};      // 2^-2 * (1 + 341/1024)
constexpr Half kMinusThird = {0xB555, -0.333251953125};
constexpr Half kPi = {0x4248, 3.140625};               // 2^1 * (1 + 584/1024)
constexpr Half kTenth = {0x2E66, 0.0999755859375};     // 2^-4 * (1 + 614/1024)
constexpr Half kOne = {0x3C00, 1.0};

void PutHalf(std::vector<uint8_t>& bytes, size_t offset, Half h) {
  bytes[offset] = static_cast<uint8_t>(h.bits & 0xFF);  // little-endian
  bytes[offset + 1] = static_cast<uint8_t>(h.bits >> 8);
}

// Fills bytes [offset, offset + count) with a fixed pattern that hits every nibble and bit value.
void PutPattern(std::vector<uint8_t>& bytes, size_t offset, size_t count, int salt) {
  for (size_t i = 0; i < count; ++i) bytes[offset + i] = static_cast<uint8_t>(i * 73 + salt * 151 + 5);
}

void ExpectDequantizesTo(WeightType type, const std::vector<uint8_t>& row, const std::vector<double>& expected) {
  ASSERT_EQ(static_cast<int64_t>(row.size()), *RowBytes(type, static_cast<int64_t>(expected.size())));
  std::vector<float> out(expected.size());
  DequantizeRow(type, row.data(), out.data(), static_cast<int64_t>(out.size()));
  for (size_t e = 0; e < expected.size(); ++e) {
    ASSERT_EQ(out[e], static_cast<float>(expected[e])) << "element " << e;
  }
}

TEST(GoldenBlocks, F32F16BF16) {
  // f32 1.5 = 0x3FC00000, -0.25 = 0xBE800000, little-endian.
  ExpectDequantizesTo(WeightType::kF32, {0x00, 0x00, 0xC0, 0x3F, 0x00, 0x00, 0x80, 0xBE}, {1.5, -0.25});
  // f16: 0x3555, 0xC000 = -2, 0x0001 = 2^-24 (subnormal), 0x7BFF = 65504.
  ExpectDequantizesTo(WeightType::kF16, {0x55, 0x35, 0x00, 0xC0, 0x01, 0x00, 0xFF, 0x7B},
                      {0.333251953125, -2.0, 0x1.0p-24, 65504.0});
  // bf16: 0x3FC0 = 1.5, 0xBF80 = -1, 0x4049 = 3.140625.
  ExpectDequantizesTo(WeightType::kBF16, {0xC0, 0x3F, 0x80, 0xBF, 0x49, 0x40}, {1.5, -1.0, 3.140625});
}

TEST(GoldenBlocks, Q8_0) {
  // Two blocks: d (f16) at offset 0, then 32 signed bytes.
  std::vector<uint8_t> row(2 * 34);
  std::vector<double> expected;
  const Half d[2] = {kMinusThird, kPi};
  for (int b = 0; b < 2; ++b) {
    PutHalf(row, 34 * b, d[b]);
    for (int j = 0; j < 32; ++j) {
      const int q = b == 0 ? j * 8 - 128 : 127 - j * 5;  // spans -128..120 and 127..-28
      row[34 * b + 2 + j] = static_cast<uint8_t>(static_cast<int8_t>(q));
      expected.push_back(d[b].value * q);
    }
  }
  ExpectDequantizesTo(WeightType::kQ8_0, row, expected);
}

TEST(GoldenBlocks, Q4_0) {
  // d at 0; qs at 2..17: element e < 16 is the low nibble of qs[e], e >= 16 the high nibble of
  // qs[e - 16]; x = d * (q - 8).
  std::vector<uint8_t> row(2 * 18);
  const Half d[2] = {kThird, kMinusThird};
  for (int b = 0; b < 2; ++b) {
    PutHalf(row, 18 * b, d[b]);
    for (int j = 0; j < 16; ++j) row[18 * b + 2 + j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  }
  std::vector<double> expected;
  for (int b = 0; b < 2; ++b) {
    for (int e = 0; e < 16; ++e) expected.push_back(d[b].value * (e - 8));
    for (int e = 16; e < 32; ++e) expected.push_back(d[b].value * ((15 - (e - 16)) - 8));
  }
  EXPECT_EQ(expected[0], -2.666015625);  // -8 * d, a hand check of the formula
  ExpectDequantizesTo(WeightType::kQ4_0, row, expected);
}

TEST(GoldenBlocks, Q2_K) {
  // scales at 0..15 (low nibble scale, high nibble min), qs at 16..79, d at 80, dmin at 82.
  // Sub-block j gets scale j and min 15 - j.
  const uint8_t scales[16] = {0xF0, 0xE1, 0xD2, 0xC3, 0xB4, 0xA5, 0x96, 0x87,
                              0x78, 0x69, 0x5A, 0x4B, 0x3C, 0x2D, 0x1E, 0x0F};
  const Half d[2] = {kThird, kPi};
  const Half dmin[2] = {kTenth, kOne};
  std::vector<uint8_t> row(2 * 84);
  std::vector<double> expected;
  for (int b = 0; b < 2; ++b) {
    const size_t base = 84 * b;
    std::memcpy(&row[base], scales, 16);
    PutPattern(row, base + 16, 64, b);
    PutHalf(row, base + 80, d[b]);
    PutHalf(row, base + 82, dmin[b]);
    for (int e = 0; e < 256; ++e) {
      const int sub = e / 16;
      const int scale = sub;
      const int min = 15 - sub;
      // 2-bit q: byte 32 * (e / 128) + e % 32 of qs, bits 2 * ((e % 128) / 32).
      const int q = (row[base + 16 + 32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3;
      expected.push_back(d[b].value * scale * q - dmin[b].value * min);
    }
  }
  ExpectDequantizesTo(WeightType::kQ2_K, row, expected);
}

// Q3_K's sixteen signed 6-bit scales, and their 12 bytes packed by hand: biased b = s + 32;
// byte j < 8 = (b[j] & 15) | (b[j + 8] & 15) << 4; byte 8 + k = sum over i of (b[k + 4i] >> 4) << 2i.
// b = {0,15,31,32,33,37,47,48, 63,1,39,24,52,12,35,29}.
constexpr int kQ3Scales[16] = {-32, -17, -1, 0, 1, 5, 15, 16, 31, -31, 7, -8, 20, -20, 3, -3};
constexpr uint8_t kQ3PackedScales[12] = {0xF0, 0x1F, 0x7F, 0x80, 0x41, 0xC5, 0x3F, 0xD0, 0xF8, 0x08, 0xA9, 0x5E};

TEST(GoldenBlocks, Q3KScalePacking) {
  for (int j = 0; j < 16; ++j) EXPECT_EQ(UnpackQ3KScale(j, kQ3PackedScales), kQ3Scales[j]) << j;
  uint8_t biased[16];
  for (int j = 0; j < 16; ++j) biased[j] = static_cast<uint8_t>(kQ3Scales[j] + 32);
  uint8_t packed[12];
  PackQ3KScales(biased, packed);
  for (int j = 0; j < 12; ++j) EXPECT_EQ(packed[j], kQ3PackedScales[j]) << j;
}

TEST(GoldenBlocks, Q3_K) {
  // hmask at 0..31, qs at 32..95, scales at 96..107, d at 108; x = d * s * (q - 4) where q's
  // low two bits are as Q2_K's and its high bit is bit e / 32 of hmask[e % 32].
  const Half d[2] = {kThird, kMinusThird};
  std::vector<uint8_t> row(2 * 110);
  std::vector<double> expected;
  for (int b = 0; b < 2; ++b) {
    const size_t base = 110 * b;
    PutPattern(row, base, 32, 7 + b);
    PutPattern(row, base + 32, 64, b);
    std::memcpy(&row[base + 96], kQ3PackedScales, 12);
    PutHalf(row, base + 108, d[b]);
    for (int e = 0; e < 256; ++e) {
      const int low = (row[base + 32 + 32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3;
      const int high = (row[base + e % 32] >> (e / 32)) & 1;
      expected.push_back(d[b].value * kQ3Scales[e / 16] * (low + 4 * high - 4));
    }
  }
  ExpectDequantizesTo(WeightType::kQ3_K, row, expected);
}

// Q4_K / Q5_K: eight 6-bit scales and mins, and their 12 bytes packed by hand:
//   bytes 0-3:  scale[j] | (scale[j + 4] >> 4) << 6   -> 10|3<<6, 20|3<<6, 30|0<<6, 40|2<<6
//   bytes 4-7:  min[j]   | (min[j + 4] >> 4) << 6     -> 1|1<<6, 2|2<<6, 3|0<<6, 63|3<<6
//   bytes 8-11: (scale[j + 4] & 15) | (min[j + 4] & 15) << 4 -> 2|1<<4, 12|13<<4, 7|0<<4, 1|14<<4
constexpr uint8_t kKScales[8] = {10, 20, 30, 40, 50, 60, 7, 33};
constexpr uint8_t kKMins[8] = {1, 2, 3, 63, 17, 45, 0, 62};
constexpr uint8_t kKPacked[12] = {0xCA, 0xD4, 0x1E, 0xA8, 0x41, 0x82, 0x03, 0xFF, 0x12, 0xDC, 0x07, 0xE1};

TEST(GoldenBlocks, KScaleMinPacking) {
  for (int j = 0; j < 8; ++j) {
    uint8_t scale = 0;
    uint8_t min = 0;
    UnpackKScaleMin(j, kKPacked, &scale, &min);
    EXPECT_EQ(scale, kKScales[j]) << j;
    EXPECT_EQ(min, kKMins[j]) << j;
  }
  uint8_t packed[12];
  PackKScalesMins(kKScales, kKMins, packed);
  for (int j = 0; j < 12; ++j) EXPECT_EQ(packed[j], kKPacked[j]) << j;
}

TEST(GoldenBlocks, Q4_K) {
  // d at 0, dmin at 2, scales at 4..15, qs at 16..143; element e's nibble is in byte
  // 32 * (e / 64) + e % 32 (low nibble for e % 64 < 32); x = d * scale * q - dmin * min.
  const Half d[2] = {kThird, kPi};
  const Half dmin[2] = {kTenth, kOne};
  std::vector<uint8_t> row(2 * 144);
  std::vector<double> expected;
  for (int b = 0; b < 2; ++b) {
    const size_t base = 144 * b;
    PutHalf(row, base, d[b]);
    PutHalf(row, base + 2, dmin[b]);
    std::memcpy(&row[base + 4], kKPacked, 12);
    PutPattern(row, base + 16, 128, b);
    for (int e = 0; e < 256; ++e) {
      const uint8_t byte = row[base + 16 + 32 * (e / 64) + e % 32];
      const int q = (e % 64) < 32 ? (byte & 0xF) : (byte >> 4);
      expected.push_back(d[b].value * kKScales[e / 32] * q - dmin[b].value * kKMins[e / 32]);
    }
  }
  ExpectDequantizesTo(WeightType::kQ4_K, row, expected);
}

TEST(GoldenBlocks, Q5_K) {
  // d at 0, dmin at 2, scales at 4..15, qh at 16..47, qs at 48..175; the low four bits as Q4_K,
  // the fifth is bit e / 32 of qh[e % 32].
  const Half d[2] = {kThird, kPi};
  const Half dmin[2] = {kTenth, kOne};
  std::vector<uint8_t> row(2 * 176);
  std::vector<double> expected;
  for (int b = 0; b < 2; ++b) {
    const size_t base = 176 * b;
    PutHalf(row, base, d[b]);
    PutHalf(row, base + 2, dmin[b]);
    std::memcpy(&row[base + 4], kKPacked, 12);
    PutPattern(row, base + 16, 32, 3 + b);
    PutPattern(row, base + 48, 128, b);
    for (int e = 0; e < 256; ++e) {
      const uint8_t byte = row[base + 48 + 32 * (e / 64) + e % 32];
      const int low = (e % 64) < 32 ? (byte & 0xF) : (byte >> 4);
      const int high = (row[base + 16 + e % 32] >> (e / 32)) & 1;
      expected.push_back(d[b].value * kKScales[e / 32] * (low + 16 * high) - dmin[b].value * kKMins[e / 32]);
    }
  }
  ExpectDequantizesTo(WeightType::kQ5_K, row, expected);
}

TEST(GoldenBlocks, Q6_K) {
  // ql at 0..127, qh at 128..191, int8 scales at 192..207, d at 208. With h = e / 128,
  // g = (e % 128) / 32, l = e % 32: low four bits in ql[64h + 32(g & 1) + l] (low nibble for
  // g < 2), top two bits at bit 2g of qh[32h + l]; x = d * scale[e / 16] * (q - 32).
  const int8_t scales[16] = {-128, -100, -64, -1, 0, 1, 2, 7, 31, 63, 64, 100, 127, -7, -31, 45};
  const Half d[2] = {kThird, kMinusThird};
  std::vector<uint8_t> row(2 * 210);
  std::vector<double> expected;
  for (int b = 0; b < 2; ++b) {
    const size_t base = 210 * b;
    PutPattern(row, base, 128, b);
    PutPattern(row, base + 128, 64, 5 + b);
    for (int j = 0; j < 16; ++j) row[base + 192 + j] = static_cast<uint8_t>(scales[j]);
    PutHalf(row, base + 208, d[b]);
    for (int e = 0; e < 256; ++e) {
      const int h = e / 128;
      const int g = (e % 128) / 32;
      const int l = e % 32;
      const uint8_t low_byte = row[base + 64 * h + 32 * (g & 1) + l];
      const int low = g < 2 ? (low_byte & 0xF) : (low_byte >> 4);
      const int high = (row[base + 128 + 32 * h + l] >> (2 * g)) & 3;
      expected.push_back(d[b].value * scales[e / 16] * ((low | (high << 4)) - 32));
    }
  }
  ExpectDequantizesTo(WeightType::kQ6_K, row, expected);
}

}  // namespace
}  // namespace tandem
