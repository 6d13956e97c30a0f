// The fused one-token MoE kernel with the next mixer's input product as its last phase
// (expert_decode_fused.cuh FusedNextProduct) against the kernel without it and the CPU: y as
// without it (within 1e-6 relative L2: the atomics' order is not fixed), the product's rows within
// 1e-4 relative L2 (every row within 1e-3 of its scale) of W · x in f64 with x = γ ⊙ ρ(H + y) formed
// on the CPU from the y the kernel wrote, the counters back at zero (two launches in a row on one
// stream), the floats past the product's rows untouched; and what it refuses.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/weights/weight_types.h"
#include "gpu_service/backends/cuda/device_matrix.h"
#include "gpu_service/backends/cuda/moe/expert_decode_fused.cuh"
#include "tests/gpu_moe/one_token_support.h"
#include "tests/gpu_moe/test_support.h"
#include "tests/test_seed.h"

namespace tandem::cuda {
namespace {

using one_token_testing::Logits;
using one_token_testing::OneTokenExperts;
using one_token_testing::OneTokenStep;
using one_token_testing::Shared;
using testing::Download;
using testing::Upload;

// rows × cols Q8_0 on the host and as Q8_0x8 rows on the device (the upload's regrouping).
struct NextRows {
  NextRows(std::mt19937& rng, int64_t cols_, int64_t rows_) : cols(cols_), rows(rows_) {
    q8 = testing::RandomMatrix(rng, WeightType::kQ8_0, cols, rows, 0.05f);
    std::vector<uint8_t> packed(static_cast<size_t>(Q8_0x8RowBytes(cols) * rows));
    RepackQ8_0x8(q8.data(), Q8_0x8RowBytes(cols), rows, cols, packed.data());
    device = Upload(packed);
  }
  // W · x in f64, rounded to f32.
  std::vector<float> Product(const std::vector<float>& x) const {
    std::vector<float> out(static_cast<size_t>(rows)), row(static_cast<size_t>(cols));
    for (int64_t r = 0; r < rows; ++r) {
      DequantizeRow(WeightType::kQ8_0, q8.data() + r * Q8_0x8RowBytes(cols), row.data(), cols);
      double s = 0.0;
      for (int64_t c = 0; c < cols; ++c) s += static_cast<double>(row[c]) * x[c];
      out[r] = static_cast<float>(s);
    }
    return out;
  }
  int64_t cols, rows;
  std::vector<uint8_t> q8;
  DeviceBuffer device;
};

// x = γ ⊙ ρ(H + y) in f64 (ρ = 1 / sqrt(mean square + eps)).
std::vector<float> HostNorm(const std::vector<float>& H, const std::vector<float>& y, const std::vector<float>& gamma,
                            float eps) {
  const size_t h = H.size();
  std::vector<double> v(h);
  double ss = 0.0;
  for (size_t j = 0; j < h; ++j) {
    v[j] = static_cast<double>(H[j]) + y[j];
    ss += v[j] * v[j];
  }
  const double rho = 1.0 / std::sqrt(ss / static_cast<double>(h) + eps);
  std::vector<float> x(h);
  for (size_t j = 0; j < h; ++j) x[j] = static_cast<float>(gamma[j] * v[j] * rho);
  return x;
}

struct Case {
  int64_t h, I, E;
  int K;
  int64_t rows;
  bool shared_inside;
  bool router = false;  // the router product inside the grid (FusedRouter: its blocks ahead)
};

// Two launches with the product (the second on the first's counters), one without: y, the rows.
void CheckNext(std::mt19937& rng, const Case& c) {
  const std::string what = absl::StrCat("h=", c.h, " I=", c.I, " E=", c.E, " K=", c.K, " rows=", c.rows,
                                        c.shared_inside ? " shared inside" : " shared given",
                                        c.router ? ", router in the grid" : "");
  const OneTokenExperts ex(rng, c.h, c.I, c.E, 12);
  ASSERT_TRUE(OneTokenFusedTakesNextProduct(static_cast<int>(c.h), static_cast<int>(c.E), static_cast<int>(c.rows),
                                            static_cast<int>(c.h), Q8_0x8RowBytes(c.h)))
      << what;
  const NextRows next(rng, c.h, c.rows);
  const std::vector<float> H = testing::RandomVector(rng, c.h, 1.0f);
  const std::vector<float> gamma = testing::RandomVector(rng, c.h, 1.0f);
  const DeviceBuffer dH = Upload(H), dgamma = Upload(gamma);
  const DeviceBuffer counters = Upload(std::vector<int32_t>{0, 0});
  const DeviceBuffer router_rows = Upload(testing::RandomVector(rng, c.E * c.h, 0.05f));
  const DeviceBuffer router_counters = Upload(std::vector<int32_t>{0, 0});
  const std::vector<float> logits = Logits(rng, c.E, false);
  const std::vector<float> x = testing::RandomVector(rng, c.h);
  const std::vector<float> shared = testing::RandomVector(rng, c.h, 0.1f);
  // Q8_0 shared expert inside (h a multiple of 512), or a given shared term.
  std::vector<uint8_t> sg, su, sd;
  DeviceBuffer dsg, dsu, dsd;
  FusedSharedExpert inside;
  if (c.shared_inside) {
    sg = testing::RandomMatrix(rng, WeightType::kQ8_0, c.h, 512, 0.05f);
    su = testing::RandomMatrix(rng, WeightType::kQ8_0, c.h, 512, 0.05f);
    sd = testing::RandomMatrix(rng, WeightType::kQ8_0, 512, c.h, 0.05f);
    dsg = Upload(sg);
    dsu = Upload(su);
    dsd = Upload(sd);
    inside = FusedSharedExpert{dsg.get(), dsu.get(), dsd.get(), 512};
  }
  auto launch = [&](OneTokenStep& step, const FusedNextProduct* np) {
    OneTokenMoeArgs a = step.Args(ex, c.K, c.shared_inside ? Shared::kGated : Shared::kUngated);
    a.int16_activations = true;
    a.logit_route = true;
    a.x_written_earlier = !c.router;
    if (c.shared_inside) a.shared = nullptr;
    EXPECT_EQ(cudaMemset(step.y.get(), 0, static_cast<size_t>(c.h) * sizeof(float)), cudaSuccess);
    FusedRouter rt{router_rows.as<float>(), static_cast<int>(c.E), step.logits.as<float>(), router_counters.as<int32_t>(), 16};
    return LaunchOneTokenMoeFused(a, c.shared_inside ? &inside : nullptr, nullptr, c.router ? &rt : nullptr, np);
  };
  // Without the product.
  OneTokenStep plain(ex, c.K, logits, x, shared, 0.3f);
  TANDEM_ASSERT_CUDA(launch(plain, nullptr));
  TANDEM_ASSERT_CUDA(cudaDeviceSynchronize());
  const std::vector<float> y_plain = Download<float>(plain.y.get(), static_cast<size_t>(c.h));
  // With it, twice in a row (the second launch finds the counters the first left).
  for (int round = 0; round < 2; ++round) {
    OneTokenStep step(ex, c.K, logits, x, shared, 0.3f);
    DeviceBuffer out = testing::PoisonedBuffer(static_cast<size_t>(c.rows + 8) * sizeof(float));
    FusedNextProduct np;
    np.w = next.device.get();
    np.row_bytes = Q8_0x8RowBytes(c.h);
    np.rows = static_cast<int>(c.rows);
    np.cols = static_cast<int>(c.h);
    np.out = out.as<float>();
    np.H = dH.as<float>();
    np.gamma = dgamma.as<float>();
    np.eps = 1e-6f;
    np.counters = counters.as<int32_t>();
    TANDEM_ASSERT_CUDA(launch(step, &np));
    TANDEM_ASSERT_CUDA(cudaDeviceSynchronize());
    const std::vector<float> y = Download<float>(step.y.get(), static_cast<size_t>(c.h));
    const std::vector<float> got = Download<float>(out.get(), static_cast<size_t>(c.rows + 8));
    ASSERT_TRUE(testing::AllFinite(y)) << what;
    EXPECT_LE(testing::RelativeL2(y, y_plain), 1e-6) << what << ": y with the product against without";
    EXPECT_EQ(Download<int32_t>(step.ints.get(), 1)[0], 0) << what;
    EXPECT_EQ(Download<int32_t>(counters.get(), 2), (std::vector<int32_t>{0, 0})) << what << ", round " << round;
    const std::vector<float> want = next.Product(HostNorm(H, y, gamma, 1e-6f));
    const std::vector<float> rows_got(got.begin(), got.begin() + c.rows);
    ASSERT_TRUE(testing::AllFinite(rows_got)) << what;
    const double err = testing::RelativeL2(rows_got, want);
    double scale = 0.0, worst = 0.0;
    for (float v : want) scale = std::max(scale, static_cast<double>(std::fabs(v)));
    for (int64_t r = 0; r < c.rows; ++r) worst = std::max(worst, std::fabs(static_cast<double>(rows_got[r]) - want[r]));
    EXPECT_LE(err, 1e-4) << what;
    EXPECT_LE(worst, 1e-3 * scale) << what;
    // The rows past the product's keep the poison (no block writes past rows).
    std::vector<uint8_t> tail(8 * sizeof(float));
    std::memcpy(tail.data(), got.data() + c.rows, tail.size());
    EXPECT_EQ(tail, std::vector<uint8_t>(tail.size(), 0xFF)) << what;
    std::printf("fused one-token MoE with the next product, %s, round %d: rows relative L2 %.3e, worst row %.3e of "
                "%.3e\n",
                what.c_str(), round, err, worst, scale);
  }
}

// The 80B shape (12352 rows: the GDN layer's stacked [z; qkv; ba]) and smaller ones, the shared
// expert inside or a given shared term, rows that do not divide evenly among the blocks, the router
// product inside the grid (its blocks take no rows).
TEST(OneTokenFusedNextTest, ProductMatchesTheCpuAndYIsUnchanged) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng = ::tandem::testing::SeededRng();
  for (const Case& c : {Case{2048, 512, 512, 10, 12352, true}, Case{1024, 512, 64, 4, 3000, true},
                        Case{256, 256, 128, 5, 777, false}, Case{512, 256, 100, 8, 40, false},
                        Case{1024, 512, 64, 8, 4000, true, true}, Case{2048, 512, 512, 10, 12352, true, true}}) {
    CheckNext(rng, c);
  }
}

TEST(OneTokenFusedNextTest, RefusesWhatItCannotRun) {
  TANDEM_SKIP_WITHOUT_GPU();
  const int64_t rb = Q8_0x8RowBytes(2048);
  EXPECT_TRUE(OneTokenFusedTakesNextProduct(2048, 512, 12352, 2048, rb));
  EXPECT_FALSE(OneTokenFusedTakesNextProduct(2048, 512, 12352, 1024, Q8_0x8RowBytes(1024)));  // cols != h
  EXPECT_TRUE(OneTokenFusedTakesNextProduct(2048, 512, 12352, 2048, rb + 64));   // padded rows
  EXPECT_FALSE(OneTokenFusedTakesNextProduct(2048, 512, 12352, 2048, rb - 16));  // shorter than a row
  EXPECT_FALSE(OneTokenFusedTakesNextProduct(2048, 512, 12352, 2048, rb + 8));   // not 16-byte aligned
  EXPECT_FALSE(OneTokenFusedTakesNextProduct(2048, 512, 0, 2048, rb));
  EXPECT_FALSE(OneTokenFusedTakesNextProduct(4096, 512, 100, 4096, Q8_0x8RowBytes(4096)));  // h past 2048
  std::mt19937 rng = ::tandem::testing::SeededRng();
  const OneTokenExperts ex(rng, 256, 256, 64, 4);
  OneTokenStep step(ex, 4, Logits(rng, 64, false), testing::RandomVector(rng, 256), testing::RandomVector(rng, 256),
                    0.0f);
  OneTokenMoeArgs a = step.Args(ex, 4, Shared::kNone);
  a.int16_activations = true;
  a.logit_route = true;
  const NextRows next(rng, 256, 16);
  const DeviceBuffer v = Upload(std::vector<float>(256, 1.0f));
  const DeviceBuffer counters = Upload(std::vector<int32_t>{0, 0});
  DeviceBuffer out = testing::PoisonedBuffer(16 * sizeof(float));
  FusedNextProduct np{next.device.get(), Q8_0x8RowBytes(256), 16, 256, out.as<float>(), v.as<float>(), v.as<float>(),
                      1e-6f, counters.as<int32_t>()};
  np.counters = nullptr;
  EXPECT_EQ(LaunchOneTokenMoeFused(a, nullptr, nullptr, nullptr, &np), cudaErrorInvalidValue);
  np.counters = counters.as<int32_t>();
  np.cols = 512;
  EXPECT_EQ(LaunchOneTokenMoeFused(a, nullptr, nullptr, nullptr, &np), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace tandem::cuda
