// Quantization quality: RMS error of dequantize(quantize(x)) on 2^18 N(0, 1) values (seed
// 20261129, tests/weights/test_data.h) per type, against ggml's reference quantizers on the
// same data. The ggml figures are the measured ones of docs/PERF.md, section "Quantization
// quality" (llama.cpp de3ff815, measured 2026-11-29); Tandem's must be within 1.10 x of them.
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "common/weights/weight_types.h"
#include "gtest/gtest.h"
#include "tests/weights/test_data.h"

namespace tandem {
namespace {

constexpr uint64_t kSeed = 20261129;
constexpr int64_t kValues = int64_t{1} << 18;
constexpr double kAllowedRatio = 1.10;

struct GgmlFigure {
  WeightType type;
  double ggml_rms;  // docs/PERF.md, "Quantization quality", column "ggml RMS"
};

constexpr GgmlFigure kGgmlFigures[] = {
    {WeightType::kF16, 0.000207853},  {WeightType::kBF16, 0.001663449}, {WeightType::kQ8_0, 0.005358256},
    {WeightType::kQ6_K, 0.017748197}, {WeightType::kQ5_K, 0.036131259}, {WeightType::kQ4_K, 0.071406884},
    {WeightType::kQ4_0, 0.085993752}, {WeightType::kQ3_K, 0.150721693}, {WeightType::kQ2_K, 0.296347979},
};

TEST(QuantizationQuality, RmsErrorWithinTenPercentOfGgml) {
  const std::vector<float> x = testing::NormalData(kSeed, kValues);
  for (const GgmlFigure& figure : kGgmlFigures) {
    const WeightTypeInfo& info = GetWeightTypeInfo(figure.type);
    std::vector<uint8_t> q(*RowBytes(figure.type, kValues));
    QuantizeRow(figure.type, x.data(), q.data(), kValues);
    std::vector<float> y(kValues);
    DequantizeRow(figure.type, q.data(), y.data(), kValues);
    const double rms = testing::RmsError(x, y);
    std::printf("%-5s bits/weight %.4f  tandem rms %.9f  ggml rms %.9f  ratio %.4f\n", std::string(info.name).c_str(),
                8.0 * info.block_bytes / info.block_elems, rms, figure.ggml_rms, rms / figure.ggml_rms);
    EXPECT_LE(rms, kAllowedRatio * figure.ggml_rms) << info.name;
    EXPECT_GT(rms, 0.0) << info.name;  // a lossless result would mean the data never went through the format
  }
}

}  // namespace
}  // namespace tandem
