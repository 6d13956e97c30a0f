// The router's rows through the mixer's output product (kernels/route_compose.cuh) and the norm
// launch that forms the routing logits from them (norm_streams.cuh NormRoute):
//   - ComposeRouteRows writes M = Wr_γ · dequant(W_out) as two Q8_0 terms by columns or after
//     Q8_0x8 rows, each row within 4e-5 of its largest |value| of the f64 product; the first rows
//     untouched, the padding rows and their scales zero;
//   - the norm launch with NormRoute leaves H and x bit-identical to the plain launch (its block
//     rewrites H only after the route blocks have read it: their count is back to zero), and its
//     logits are w · x (x: that launch's normed row) within 2e-6 relative L2 when the parts are
//     the exact Σ_j w[r][j]·γ[j]·y[j]; it refuses the steps it cannot take.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <cuda_fp16.h>

#include "common/weights/weight_types.h"
#include "gpu_service/backends/cuda/device_matrix.h"
#include "gpu_service/backends/cuda/kernels/norm_streams.cuh"
#include "gpu_service/backends/cuda/kernels/route_compose.cuh"
#include "gtest/gtest.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/test_seed.h"

namespace tandem {
namespace {

using gpu_testing::Download;
using gpu_testing::Random;
using gpu_testing::Upload;

struct ComposeShape {
  int64_t R, h, cols;
  bool by_columns;  // the terms into a copy by columns (GDN's ssm_out) or after Q8_0x8 rows (attention's o)
};

class GpuRouteComposeTest : public ::testing::TestWithParam<ComposeShape> {
 protected:
  void SetUp() override { TANDEM_SKIP_WITHOUT_GPU(); }
};

// A Q8_0 value of the destination layout `to` (its data a host copy): row r, column c.
double TargetValue(const std::vector<uint8_t>& copy, const cuda::RouteRowsTarget& to, int64_t r, int64_t c) {
  const uint8_t* sb = &copy[static_cast<size_t>(r * to.row_bytes + (c / 256) * to.group_bytes)];
  const int64_t b = (c % 256) / 32;
  __half d;
  std::memcpy(&d, sb + 2 * b, sizeof(d));
  return static_cast<double>(__half2float(d)) * static_cast<int8_t>(sb[16 + 32 * b + c % 32]);
}

TEST_P(GpuRouteComposeTest, WritesTheProductAsTwoTerms) {
  const auto [R, h, cols, by_columns] = GetParam();
  const std::string tag = std::to_string(R) + " rows through " + std::to_string(h) + "x" + std::to_string(cols) +
                          (by_columns ? " by columns" : " as rows");
  std::mt19937 rng = ::tandem::testing::SeededRng();
  const std::vector<float> wr = Random(rng, static_cast<size_t>(R * h), 0.02f);
  const gpu_testing::TestMatrix out = gpu_testing::RandomMatrix(rng, WeightType::kQ8_0, cols, h, 0.05f);
  const gpu_testing::Regrouped g = gpu_testing::Regroup(out);
  const int64_t padded = cuda::RoutePaddedRows(R), total = h + 2 * padded;
  const size_t bytes = static_cast<size_t>(cuda::Q8_0x8ByColumnsBytes(total, cols));
  auto copy = Upload(std::vector<uint8_t>(bytes, 0xAB));
  auto inv = gpu_testing::Poisoned<float>(static_cast<size_t>(padded));
  auto scratch = gpu_testing::Alloc<float>(static_cast<size_t>(R * cols));
  const auto wr_dev = Upload(wr);
  const cuda::RouteRowsTarget to =
      by_columns ? cuda::RouteRowsTarget{copy.get(), cuda::kQ8_0x8SuperBytes, total * cuda::kQ8_0x8SuperBytes, h}
                 : cuda::RouteRowsTarget{copy.get(), cuda::Q8_0x8RowBytes(cols), cuda::kQ8_0x8SuperBytes, h};
  TANDEM_ASSERT_CUDA(cuda::ComposeRouteRows(wr_dev.get(), R, g.m, to, inv.get(), scratch.get(), nullptr));
  const std::vector<uint8_t> got = Download(copy);
  const std::vector<float> inv_scale = Download(inv);
  // W_out dequantized on the host, then M in f64.
  std::vector<float> w_out(static_cast<size_t>(h * cols));
  for (int64_t j = 0; j < h; ++j) DequantizeRow(WeightType::kQ8_0, out.bytes.data() + j * out.row_bytes, &w_out[j * cols], cols);
  double worst = 0.0, num = 0.0, den = 0.0;
  for (int64_t r = 0; r < R; ++r) {
    std::vector<double> m(static_cast<size_t>(cols), 0.0);
    for (int64_t j = 0; j < h; ++j) {
      const double a = wr[static_cast<size_t>(r * h + j)];
      const float* row = &w_out[static_cast<size_t>(j * cols)];
      for (int64_t c = 0; c < cols; ++c) m[c] += a * row[c];
    }
    double amax = 0.0;
    for (double v : m) amax = std::max(amax, std::fabs(v));
    for (int64_t c = 0; c < cols; ++c) {
      const double approx = (TargetValue(got, to, h + r, c) +
                             TargetValue(got, to, h + padded + r, c) * cuda::kRouteLoScale) * inv_scale[r];
      worst = std::max(worst, std::fabs(approx - m[c]) / amax);
      num += (approx - m[c]) * (approx - m[c]);
      den += m[c] * m[c];
    }
  }
  gpu_testing::LogError("route compose " + tag, std::sqrt(num / den));
  std::printf("[ parity   ] route compose %s: worst |error| / row max %.3e\n", tag.c_str(), worst);
  EXPECT_LE(worst, 4e-5) << tag;
  // The copy's own rows are left as they were; the padding rows are zeros with scale 0.
  for (int64_t s = 0; s < cols / 256; ++s) {
    auto super = [&](int64_t r) { return &got[static_cast<size_t>(r * to.row_bytes + s * to.group_bytes)]; };
    for (int64_t r = 0; r < h; ++r) {
      const uint8_t* sb = super(r);
      for (int64_t i = 0; i < cuda::kQ8_0x8SuperBytes; ++i) ASSERT_EQ(sb[i], 0xAB) << tag << ": row " << r << " touched";
    }
    for (const int64_t first : {h + R, h + padded + R}) {
      for (int64_t r = first; r < first + padded - R; ++r) {
        const uint8_t* sb = super(r);
        for (int64_t i = 0; i < cuda::kQ8_0x8SuperBytes; ++i) ASSERT_EQ(sb[i], 0) << tag << ": padding row " << r;
      }
    }
  }
  for (int64_t r = R; r < padded; ++r) EXPECT_EQ(inv_scale[r], 0.0f) << tag << ": padding row " << r;
  for (int64_t r = 0; r < R; ++r) EXPECT_GT(inv_scale[r], 0.0f) << tag << ": row " << r;
}

INSTANTIATE_TEST_SUITE_P(Shapes, GpuRouteComposeTest,
                         ::testing::Values(ComposeShape{37, 512, 1024, true},  // padding rows, several tiles
                                           ComposeShape{65, 256, 256, true},   // one super-block of columns
                                           ComposeShape{129, 1024, 512, true},
                                           ComposeShape{37, 512, 1024, false},
                                           ComposeShape{65, 256, 256, false}),
                         [](const ::testing::TestParamInfo<ComposeShape>& info) {
                           return std::to_string(info.param.R) + "_" + std::to_string(info.param.h) + "x" +
                                  std::to_string(info.param.cols) + (info.param.by_columns ? "_by_columns" : "_rows");
                         });

TEST(GpuRouteComposeRefusalTest, RefusesBadArguments) {
  TANDEM_SKIP_WITHOUT_GPU();
  alignas(16) static uint8_t bytes[16] = {};
  const cuda::DeviceMatrix ggml{static_cast<uint32_t>(WeightType::kQ8_0), bytes, 256, 8, 34 * 8};
  float f = 0.0f;
  const cuda::RouteRowsTarget to{bytes, cuda::kQ8_0x8SuperBytes, 24 * cuda::kQ8_0x8SuperBytes, 8};
  EXPECT_EQ(cuda::ComposeRouteRows(&f, 3, ggml, to, &f, &f, nullptr), cudaErrorInvalidValue) << "ggml layout";
  const cuda::DeviceMatrix m{cuda::kTypeQ8_0x8, bytes, 256, 8, cuda::Q8_0x8RowBytes(256)};
  EXPECT_EQ(cuda::ComposeRouteRows(nullptr, 3, m, to, &f, &f, nullptr), cudaErrorInvalidValue) << "no rows";
  EXPECT_EQ(cuda::ComposeRouteRows(&f, 0, m, to, &f, &f, nullptr), cudaErrorInvalidValue) << "R = 0";
  cuda::RouteRowsTarget nowhere = to;
  nowhere.data = nullptr;
  EXPECT_EQ(cuda::ComposeRouteRows(&f, 3, m, nowhere, &f, &f, nullptr), cudaErrorInvalidValue) << "no target";
  cuda::RouteRowsTarget overlapping = to;
  overlapping.row_bytes = 16;
  EXPECT_EQ(cuda::ComposeRouteRows(&f, 3, m, overlapping, &f, &f, nullptr), cudaErrorInvalidValue) << "rows overlap";
}

class GpuNormRouteTest : public ::testing::TestWithParam<int64_t> {
 protected:
  void SetUp() override { TANDEM_SKIP_WITHOUT_GPU(); }
};

TEST_P(GpuNormRouteTest, FormsTheLogitsOfTheNormedRow) {
  const int64_t h = GetParam(), R = 513, padded = cuda::RoutePaddedRows(R);
  const std::string tag = "h " + std::to_string(h);
  std::mt19937 rng = ::tandem::testing::SeededRng();
  const std::vector<float> H0 = Random(rng, static_cast<size_t>(h)), e = Random(rng, static_cast<size_t>(h), 0.3f),
                           y = Random(rng, static_cast<size_t>(h), 0.3f),
                           gamma = Random(rng, static_cast<size_t>(h), 0.1f, 1.0f),
                           w = Random(rng, static_cast<size_t>(R * h), 0.02f);
  // The parts as the output product would leave them for y: Σ_j w[r][j]·γ[j]·y[j], scaled by 2 with
  // 1/S = 0.5, split into hi and lo (lo · kRouteLoScale the rest).
  std::vector<float> parts(static_cast<size_t>(2 * padded), 0.0f), inv(static_cast<size_t>(padded), 0.0f);
  for (int64_t r = 0; r < R; ++r) {
    double p = 0.0;
    for (int64_t j = 0; j < h; ++j) p += static_cast<double>(w[r * h + j]) * gamma[j] * y[j];
    const float hi = static_cast<float>(2.0 * p);
    parts[r] = hi;
    parts[padded + r] = static_cast<float>((2.0 * p - hi) / cuda::kRouteLoScale);
    inv[r] = 0.5f;
  }
  const auto e_dev = Upload(e), y_dev = Upload(y), g_dev = Upload(gamma), w_dev = Upload(w), p_dev = Upload(parts),
             inv_dev = Upload(inv);
  auto H1 = Upload(H0), H2 = Upload(H0);
  auto N1 = gpu_testing::Poisoned<float>(static_cast<size_t>(h)), N2 = gpu_testing::Poisoned<float>(static_cast<size_t>(h));
  auto logits = gpu_testing::Poisoned<float>(static_cast<size_t>(R));
  const cuda::EarlierInject earlier{e_dev.get(), {}};
  TANDEM_ASSERT_CUDA(cuda::LaunchInjectRmsNorm(H1.get(), 1, 1, h, nullptr, y_dev.get(), g_dev.get(), 1e-6f, N1.get(),
                                               nullptr, nullptr, nullptr, true, &earlier));
  cuda::NormRoute route;
  route.w = w_dev.get();
  route.rows = static_cast<int>(R);
  route.parts = p_dev.get();
  route.padded = padded;
  route.inv_scale = inv_dev.get();
  route.logits = logits.get();
  auto h_reads = Upload(std::vector<int>{0});
  route.h_reads = h_reads.get();
  TANDEM_ASSERT_CUDA(cuda::LaunchInjectRmsNorm(H2.get(), 1, 1, h, nullptr, y_dev.get(), g_dev.get(), 1e-6f, N2.get(),
                                               nullptr, nullptr, nullptr, true, &earlier, &route));
  const std::vector<float> x = Download(N1);
  EXPECT_EQ(Download(h_reads)[0], 0) << tag << ": the route blocks' count not taken back";
  EXPECT_TRUE(gpu_testing::SameBits(Download(H1), Download(H2))) << tag << ": H";
  EXPECT_TRUE(gpu_testing::SameBits(x, Download(N2))) << tag << ": x";
  std::vector<float> want(static_cast<size_t>(R));
  for (int64_t r = 0; r < R; ++r) {
    double s = 0.0;
    for (int64_t j = 0; j < h; ++j) s += static_cast<double>(w[r * h + j]) * x[j];
    want[r] = static_cast<float>(s);
  }
  EXPECT_LE(gpu_testing::LogError("norm route logits " + tag, gpu_testing::RelL2(Download(logits), want)), 2e-6) << tag;
  // Steps the route blocks cannot take.
  EXPECT_EQ(cuda::LaunchInjectRmsNorm(H2.get(), 1, 1, h, nullptr, y_dev.get(), g_dev.get(), 1e-6f, N2.get(), nullptr,
                                      nullptr, nullptr, /*h_written_earlier=*/false, &earlier, &route),
            cudaErrorInvalidValue)
      << tag << ": H written by the launch before";
  EXPECT_EQ(cuda::LaunchInjectRmsNorm(H2.get(), 1, 1, h, nullptr, nullptr, g_dev.get(), 1e-6f, N2.get(), nullptr,
                                      nullptr, nullptr, true, &earlier, &route),
            cudaErrorInvalidValue)
      << tag << ": no y";
  cuda::NormRoute no_logits = route;
  no_logits.logits = nullptr;
  EXPECT_EQ(cuda::LaunchInjectRmsNorm(H2.get(), 1, 1, h, nullptr, y_dev.get(), g_dev.get(), 1e-6f, N2.get(), nullptr,
                                      nullptr, nullptr, true, &earlier, &no_logits),
            cudaErrorInvalidValue)
      << tag << ": no logits";
}

// 2048: the 80B shapes' rows (256 threads, 2 vectors each); 1024 and 512: the small presets'.
INSTANTIATE_TEST_SUITE_P(Widths, GpuNormRouteTest, ::testing::Values(2048, 1024, 512),
                         [](const ::testing::TestParamInfo<int64_t>& info) {
                           // Appended rather than "h" + to_string: GCC 12 warns (-Wrestrict) inside
                           // libstdc++'s insert for that form (GCC bug 105329, a false positive).
                           std::string name = "h";
                           name += std::to_string(info.param);
                           return name;
                         });

}  // namespace
}  // namespace tandem
