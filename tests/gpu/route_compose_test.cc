// The router's rows through the mixer's output product (kernels/route_compose.cuh) and the norm
// launch that forms the routing logits from them (norm_streams.cuh NormRoute):
//   - ComposeRouteRows writes M = Wr_γ · dequant(W_out) as two Q8_0 terms by columns or after
//     Q8_0x8 rows, each row within 4e-5 of its largest |value| of the f64 product; the first rows
//     untouched, the padding rows and their scales zero;
//   - the norm launch with NormRoute leaves H and x bit-identical to the plain launch (its block
//     rewrites H only after the route blocks have read it: their count is back to zero), and its
//     logits are w · x (x: that launch's normed row) within 2e-6 relative L2 when the parts are
//     the exact Σ_j w[r][j]·γ[j]·y[j]; it refuses the steps it cannot take;
//   - with a guess of the picks (NormRoute::pred) it leaves H, x and the logits bit-identical,
//     and its ids are the largest Σ_j w[r][j]·γ[j]·H'[j] of the f64 ranking, best first.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
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

// One norm-route step's inputs: H (one row), the earlier inject e, the pending y, γ, R = 513 router
// rows (512 experts and the shared gate's row), and the parts as the output product would leave
// them for y: Σ_j w[r][j]·γ[j]·y[j], scaled by 2 with 1/S = 0.5, split into hi and lo (lo ·
// kRouteLoScale the rest).
struct NormRouteInputs {
  static constexpr int64_t R = 513;
  NormRouteInputs(std::mt19937& rng, int64_t h_)
      : h(h_),
        padded(cuda::RoutePaddedRows(R)),
        H0(Random(rng, static_cast<size_t>(h))),
        e(Random(rng, static_cast<size_t>(h), 0.3f)),
        y(Random(rng, static_cast<size_t>(h), 0.3f)),
        gamma(Random(rng, static_cast<size_t>(h), 0.1f, 1.0f)),
        w(Random(rng, static_cast<size_t>(R * h), 0.02f)),
        parts(static_cast<size_t>(2 * padded), 0.0f),
        inv(static_cast<size_t>(padded), 0.0f) {
    for (int64_t r = 0; r < R; ++r) {
      double p = 0.0;
      for (int64_t j = 0; j < h; ++j) p += static_cast<double>(w[r * h + j]) * gamma[j] * y[j];
      const float hi = static_cast<float>(2.0 * p);
      parts[r] = hi;
      parts[padded + r] = static_cast<float>((2.0 * p - hi) / cuda::kRouteLoScale);
      inv[r] = 0.5f;
    }
    e_dev = Upload(e);
    y_dev = Upload(y);
    g_dev = Upload(gamma);
    w_dev = Upload(w);
    p_dev = Upload(parts);
    inv_dev = Upload(inv);
    earlier = cuda::EarlierInject{e_dev.get(), {}};
  }
  // The route of a launch writing `logits`, its read count in `h_reads`.
  cuda::NormRoute Route(float* logits, int* h_reads) const {
    cuda::NormRoute route;
    route.w = w_dev.get();
    route.rows = static_cast<int>(R);
    route.parts = p_dev.get();
    route.padded = padded;
    route.inv_scale = inv_dev.get();
    route.logits = logits;
    route.h_reads = h_reads;
    return route;
  }
  // The norm launch on H (N its output) with `route` (nullptr: the plain launch).
  cudaError_t Launch(float* H, float* N, const cuda::NormRoute* route, bool h_written_earlier = true) const {
    return cuda::LaunchInjectRmsNorm(H, 1, 1, h, nullptr, y_dev.get(), g_dev.get(), 1e-6f, N, nullptr, nullptr,
                                     nullptr, h_written_earlier, &earlier, route);
  }
  int64_t h, padded;
  std::vector<float> H0, e, y, gamma, w, parts, inv;
  gpu_testing::DeviceArray<float> e_dev, y_dev, g_dev, w_dev, p_dev, inv_dev;
  cuda::EarlierInject earlier;
};

TEST_P(GpuNormRouteTest, FormsTheLogitsOfTheNormedRow) {
  const int64_t h = GetParam(), R = NormRouteInputs::R;
  const std::string tag = "h " + std::to_string(h);
  std::mt19937 rng = ::tandem::testing::SeededRng();
  const NormRouteInputs in(rng, h);
  const std::vector<float>& w = in.w;
  auto H1 = Upload(in.H0), H2 = Upload(in.H0);
  auto N1 = gpu_testing::Poisoned<float>(static_cast<size_t>(h)), N2 = gpu_testing::Poisoned<float>(static_cast<size_t>(h));
  auto logits = gpu_testing::Poisoned<float>(static_cast<size_t>(R));
  TANDEM_ASSERT_CUDA(in.Launch(H1.get(), N1.get(), nullptr));
  auto h_reads = Upload(std::vector<int>{0});
  const cuda::NormRoute route = in.Route(logits.get(), h_reads.get());
  TANDEM_ASSERT_CUDA(in.Launch(H2.get(), N2.get(), &route));
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
  EXPECT_EQ(in.Launch(H2.get(), N2.get(), &route, /*h_written_earlier=*/false), cudaErrorInvalidValue)
      << tag << ": H written by the launch before";
  EXPECT_EQ(cuda::LaunchInjectRmsNorm(H2.get(), 1, 1, h, nullptr, nullptr, in.g_dev.get(), 1e-6f, N2.get(), nullptr,
                                      nullptr, nullptr, true, &in.earlier, &route),
            cudaErrorInvalidValue)
      << tag << ": no y";
  cuda::NormRoute no_logits = route;
  no_logits.logits = nullptr;
  EXPECT_EQ(in.Launch(H2.get(), N2.get(), &no_logits), cudaErrorInvalidValue)
      << tag << ": no logits";
}

// The norm-route launch's guess of the picks (NormRoute::pred): with pred.count = M it leaves H,
// x and the logits bit-identical to the launch without, its scores a_r = Σ_j w[r][j]·γ[j]·H'[j]
// (r < pred.experts; H' = H + the earlier inject, before y) within 1e-5 relative L2 of the f64
// sums, and its ids the M largest of them, best first: each slot's reference score within 1e-5 of
// the largest |a_r| of the slot's rank in the f64 ranking (ties that close may swap), distinct,
// and pred.experts in the slots past the experts; the block count back to zero, and a second
// launch on the same row gives the same ids. M = 10 and 32 of the 512 experts (the shared gate's
// row last, not ranked), of fewer rows, and more ids than rows; out-of-range guesses are refused.
TEST_P(GpuNormRouteTest, GuessesThePicksFromTheResidual) {
  const int64_t h = GetParam(), R = NormRouteInputs::R;
  std::mt19937 rng = ::tandem::testing::SeededRng();
  const NormRouteInputs in(rng, h);
  std::vector<double> a(static_cast<size_t>(R), 0.0);
  for (int64_t r = 0; r < R; ++r) {
    for (int64_t j = 0; j < h; ++j) {
      const float hp = in.H0[j] + in.e[j];  // H', as the route blocks form it
      a[r] += static_cast<double>(in.w[r * h + j]) * in.gamma[j] * hp;
    }
  }
  auto h_reads = Upload(std::vector<int>{0}), pred_blocks = Upload(std::vector<int>{0});
  struct Guess {
    int count, experts;
  };
  for (const Guess g : {Guess{10, 512}, Guess{32, 512}, Guess{10, 300}, Guess{32, 20}}) {
    const std::string tag = "h " + std::to_string(h) + ", " + std::to_string(g.count) + " ids of " +
                            std::to_string(g.experts) + " experts";
    auto H1 = Upload(in.H0), H2 = Upload(in.H0);
    auto N1 = gpu_testing::Poisoned<float>(static_cast<size_t>(h)), N2 = gpu_testing::Poisoned<float>(static_cast<size_t>(h));
    auto logits1 = gpu_testing::Poisoned<float>(static_cast<size_t>(R)), logits2 = gpu_testing::Poisoned<float>(static_cast<size_t>(R));
    auto scores = gpu_testing::Poisoned<float>(static_cast<size_t>(g.experts));
    auto ids = gpu_testing::Poisoned<int>(static_cast<size_t>(g.count));
    const cuda::NormRoute plain = in.Route(logits1.get(), h_reads.get());
    cuda::NormRoute route = in.Route(logits2.get(), h_reads.get());
    route.pred.count = g.count;
    route.pred.experts = g.experts;
    route.pred.scores = scores.get();
    route.pred.ids = ids.get();
    route.pred.blocks = pred_blocks.get();
    TANDEM_ASSERT_CUDA(in.Launch(H1.get(), N1.get(), &plain));
    TANDEM_ASSERT_CUDA(in.Launch(H2.get(), N2.get(), &route));
    EXPECT_TRUE(gpu_testing::SameBits(Download(H1), Download(H2))) << tag << ": H";
    EXPECT_TRUE(gpu_testing::SameBits(Download(N1), Download(N2))) << tag << ": x";
    EXPECT_TRUE(gpu_testing::SameBits(Download(logits1), Download(logits2))) << tag << ": logits";
    EXPECT_EQ(Download(h_reads)[0], 0) << tag << ": the route blocks' read count not taken back";
    EXPECT_EQ(Download(pred_blocks)[0], 0) << tag << ": the guess's block count not reset";
    const std::vector<double> want(a.begin(), a.begin() + g.experts);
    std::vector<float> want_f(want.begin(), want.end());
    EXPECT_LE(gpu_testing::LogError("norm route guess scores " + tag, gpu_testing::RelL2(Download(scores), want_f)), 1e-5)
        << tag;
    std::vector<double> ranked = want;
    std::sort(ranked.begin(), ranked.end(), std::greater<double>());
    double amax = 0.0;
    for (double v : want) amax = std::max(amax, std::fabs(v));
    const double tol = 1e-5 * amax;
    const std::vector<int> got = Download(ids);
    std::vector<bool> seen(static_cast<size_t>(g.experts), false);
    for (int i = 0; i < g.count; ++i) {
      if (i >= g.experts) {
        EXPECT_EQ(got[i], g.experts) << tag << ": slot " << i << " past the experts";
        continue;
      }
      ASSERT_GE(got[i], 0) << tag << ": slot " << i;
      ASSERT_LT(got[i], g.experts) << tag << ": slot " << i;
      EXPECT_FALSE(seen[got[i]]) << tag << ": id " << got[i] << " twice";
      seen[got[i]] = true;
      EXPECT_NEAR(want[got[i]], ranked[i], tol) << tag << ": slot " << i << " holds id " << got[i];
    }
    // The same row again: the same guess (the count started from zero).
    TANDEM_ASSERT_CUDA(cudaMemcpy(H2.get(), in.H0.data(), static_cast<size_t>(h) * sizeof(float), cudaMemcpyHostToDevice));
    TANDEM_ASSERT_CUDA(cudaMemset(ids.get(), 0xFF, static_cast<size_t>(g.count) * sizeof(int)));
    TANDEM_ASSERT_CUDA(in.Launch(H2.get(), N2.get(), &route));
    EXPECT_EQ(Download(ids), got) << tag << ": second launch";
    EXPECT_EQ(Download(pred_blocks)[0], 0) << tag << ": second launch";
    if (g.count != 10 || g.experts != 512) continue;
    // Guesses the route blocks cannot make.
    auto refused = [&](cuda::NormRoute bad, const char* what) {
      EXPECT_EQ(in.Launch(H2.get(), N2.get(), &bad), cudaErrorInvalidValue) << tag << ": " << what;
    };
    cuda::NormRoute bad = route;
    bad.pred.count = cuda::kNormPredictMaxIds + 1;
    refused(bad, "33 ids");
    bad = route;
    bad.pred.count = -1;
    refused(bad, "a negative count");
    bad = route;
    bad.pred.experts = 0;
    refused(bad, "no experts");
    bad = route;
    bad.pred.experts = static_cast<int>(R) + 1;
    refused(bad, "more experts than rows");
    bad = route;
    bad.pred.experts = cuda::kNormPredictMaxExperts + 1;
    refused(bad, "more experts than kNormPredictMaxExperts");
    bad = route;
    bad.pred.scores = nullptr;
    refused(bad, "no scores");
    bad = route;
    bad.pred.ids = nullptr;
    refused(bad, "no ids");
    bad = route;
    bad.pred.blocks = nullptr;
    refused(bad, "no block count");
  }
}

// 2048: the 80B shapes' rows (256 threads, 2 vectors each); 1024 and 512: the small presets'.
INSTANTIATE_TEST_SUITE_P(Widths, GpuNormRouteTest, ::testing::Values(2048, 1024, 512),
                         [](const ::testing::TestParamInfo<int64_t>& info) { return "h" + std::to_string(info.param); });

}  // namespace
}  // namespace tandem
