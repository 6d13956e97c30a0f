// Bit-exactness with ggml's reference quantizers: Tandem's quantized bytes of a fixed row equal
// ggml's, compared through FNV-1a fingerprints of the whole row. The fingerprints were measured
// by running ggml's quantize_row_*_ref (llama.cpp de3ff815, ggml-quants.c built without FMA
// contraction) on the same row; see docs/PERF.md, "Quantization quality".
#include <cstdint>
#include <string>
#include <vector>

#include "common/weights/weight_types.h"
#include "gtest/gtest.h"
#include "tests/weights/test_data.h"

namespace tandem {
namespace {

// 64 super-blocks of IrwinHallData(42), with edge cases in super-blocks 1-5.
std::vector<float> ParityRow() {
  std::vector<float> x = testing::IrwinHallData(42, 64 * 256);
  for (int i = 0; i < 256; ++i) x[256 * 1 + i] = 0.0f;    // all zero
  for (int i = 0; i < 256; ++i) x[256 * 2 + i] = -0.75f;  // constant
  x[256 * 3 + 100] = 40.0f;                               // one outlier
  for (int i = 0; i < 256; ++i) x[256 * 4 + i] *= 1e-3f;  // tiny: subnormal f16 scales
  for (int i = 0; i < 256; ++i) x[256 * 5 + i] = x[256 * 5 + i] < 0 ? -x[256 * 5 + i] : x[256 * 5 + i];  // all >= 0
  return x;
}

uint64_t Fnv1a64(const std::vector<uint8_t>& bytes) {
  uint64_t h = 1469598103934665603ull;
  for (uint8_t b : bytes) h = (h ^ b) * 1099511628211ull;
  return h;
}

TEST(GgmlParity, QuantizedBytesMatchGgmlReference) {
  const struct {
    WeightType type;
    uint64_t ggml_fingerprint;
  } kCases[] = {
      {WeightType::kQ4_0, 0x371df078581c51e8ull}, {WeightType::kQ8_0, 0xf5d1886958a43cc4ull},
      {WeightType::kQ2_K, 0x66b00d6cf1ccce39ull}, {WeightType::kQ3_K, 0xda88fcfe76453cf3ull},
      {WeightType::kQ4_K, 0x17d9f30dcedda235ull}, {WeightType::kQ5_K, 0x4dbf61d33dd62a31ull},
      {WeightType::kQ6_K, 0x5d9be7eaf2653de8ull}, {WeightType::kF16, 0x0887bf916e8308c7ull},
      {WeightType::kBF16, 0xefccbc58f81d4bf8ull},
  };
  const std::vector<float> x = ParityRow();
  const int64_t n = static_cast<int64_t>(x.size());
  for (const auto& c : kCases) {
    std::vector<uint8_t> bytes(*RowBytes(c.type, n));
    QuantizeRow(c.type, x.data(), bytes.data(), n);
    EXPECT_EQ(Fnv1a64(bytes), c.ggml_fingerprint) << GetWeightTypeInfo(c.type).name;
  }
}

}  // namespace
}  // namespace tandem
