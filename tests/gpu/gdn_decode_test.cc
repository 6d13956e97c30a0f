// The fused GDN decode kernel (kernels/gdn_decode.cuh) against the four kernels it replaces
// (conv, prepare, recurrent, gated norm of kernels/gdn.cuh), on fresh random inputs: the same
// outputs, conv histories and states for the step's sequences, and every other sequence row left
// as it was.
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "gpu_service/backends/cuda/kernels/gdn.cuh"
#include "gpu_service/backends/cuda/kernels/gdn_decode.cuh"
#include "gtest/gtest.h"
#include "tests/gpu/gpu_test_util.h"

namespace tandem::cuda {
namespace {

using gpu_testing::Download;
using gpu_testing::Poisoned;
using gpu_testing::Random;
using gpu_testing::RelL2;
using gpu_testing::Upload;

struct Case {
  int nk, nv, dk, kk;
  std::vector<int32_t> rows;  // the step's sequence rows (distinct), in a pool of kPoolRows
};

constexpr int kPoolRows = 6;

class GdnDecodeFusedTest : public ::testing::TestWithParam<Case> {};

TEST_P(GdnDecodeFusedTest, EqualsTheFourKernels) {
  TANDEM_SKIP_WITHOUT_GPU();
  const Case& p = GetParam();
  const GdnShape d{p.nk, p.nv, p.dk, p.dk, p.kk};
  ASSERT_TRUE(GdnDecodeFusedSupports(d));
  const int64_t n = static_cast<int64_t>(p.rows.size()), c_dim = d.c_dim(), vw = int64_t{d.nv} * d.dv;
  const int64_t hist = int64_t{d.kk - 1} * c_dim, st = int64_t{d.nv} * d.dk * d.dv;
  const int64_t stride = hist + st;  // one sequence row: conv history, then the state
  std::mt19937 rng(1234 + d.nk * 7 + static_cast<int>(n));
  const std::vector<float> qkv = Random(rng, static_cast<size_t>(n * c_dim));
  const std::vector<float> z = Random(rng, static_cast<size_t>(n * vw));
  const std::vector<float> ba = Random(rng, static_cast<size_t>(n * 2 * d.nv));
  const std::vector<float> taps = Random(rng, static_cast<size_t>(c_dim * d.kk), 0.5f);
  std::vector<float> ssm_a = Random(rng, static_cast<size_t>(d.nv));
  for (float& x : ssm_a) x = -std::fabs(x) - 0.1f;  // A = −exp(a) < 0: a decaying state
  const std::vector<float> dt_bias = Random(rng, static_cast<size_t>(d.nv));
  const std::vector<float> norm = Random(rng, static_cast<size_t>(d.dv), 0.2f, 1.0f);
  const std::vector<float> pool = Random(rng, static_cast<size_t>(kPoolRows * stride), 0.3f);

  auto d_qkv = Upload(qkv);
  auto d_z = Upload(z);
  auto d_ba = Upload(ba);
  auto d_taps = Upload(taps);
  auto d_a = Upload(ssm_a);
  auto d_dt = Upload(dt_bias);
  auto d_norm = Upload(norm);
  auto d_rows = Upload(p.rows);

  // The four kernels.
  auto pool_four = Upload(pool);
  auto conv = Poisoned<float>(static_cast<size_t>(n * c_dim));
  auto g = Poisoned<float>(static_cast<size_t>(n * d.nv));
  auto beta = Poisoned<float>(static_cast<size_t>(n * d.nv));
  auto o = Poisoned<float>(static_cast<size_t>(n * vw));
  auto out_four = Poisoned<float>(static_cast<size_t>(n * vw));
  ASSERT_EQ(LaunchGdnConvDecode(d_qkv.get(), pool_four.get(), stride, d_rows.get(), d_taps.get(), n, d, conv.get(),
                                nullptr),
            cudaSuccess);
  ASSERT_EQ(LaunchGdnPrepare(conv.get(), d_ba.get(), d_a.get(), d_dt.get(), n, d, g.get(), beta.get(), nullptr),
            cudaSuccess);
  ASSERT_EQ(LaunchGdnRecurrentDecode(conv.get(), g.get(), beta.get(), n, d, pool_four.get() + hist, stride,
                                     d_rows.get(), o.get(), nullptr),
            cudaSuccess);
  ASSERT_EQ(LaunchGdnGatedNorm(o.get(), d_z.get(), d_norm.get(), 1e-6f, n, d, out_four.get(), nullptr), cudaSuccess);

  // The fused kernel.
  auto pool_fused = Upload(pool);
  auto out_fused = Poisoned<float>(static_cast<size_t>(n * vw));
  GdnDecodeArgs a;
  a.shape = d;
  a.n = n;
  a.rows = d_rows.get();
  a.row_stride = stride;
  a.qkv = d_qkv.get();
  a.z = d_z.get();
  a.ba = d_ba.get();
  a.taps = d_taps.get();
  a.ssm_a = d_a.get();
  a.dt_bias = d_dt.get();
  a.norm = d_norm.get();
  a.eps = 1e-6f;
  a.history = pool_fused.get();
  a.state = pool_fused.get() + hist;
  a.out = out_fused.get();
  ASSERT_EQ(LaunchGdnDecodeFused(a, nullptr), cudaSuccess);

  const std::vector<float> want = Download(out_four), got = Download(out_fused);
  const double out_err = RelL2(got, want);
  EXPECT_LE(out_err, 1e-5) << "outputs";
  const std::vector<float> pool_want = Download(pool_four), pool_got = Download(pool_fused);
  for (int r = 0; r < kPoolRows; ++r) {
    SCOPED_TRACE(::testing::Message() << "row " << r);
    const std::vector<float> hw(pool_want.begin() + r * stride, pool_want.begin() + r * stride + hist);
    const std::vector<float> hg(pool_got.begin() + r * stride, pool_got.begin() + r * stride + hist);
    EXPECT_EQ(hg, hw) << "conv history";
    const std::vector<float> sw(pool_want.begin() + r * stride + hist, pool_want.begin() + (r + 1) * stride);
    const std::vector<float> sg(pool_got.begin() + r * stride + hist, pool_got.begin() + (r + 1) * stride);
    EXPECT_LE(RelL2(sg, sw), 1e-6) << "state";
    bool in_step = false;
    for (int32_t x : p.rows) in_step |= x == r;
    if (!in_step) {  // untouched
      const std::vector<float> before(pool.begin() + r * stride, pool.begin() + (r + 1) * stride);
      const std::vector<float> after(pool_got.begin() + r * stride, pool_got.begin() + (r + 1) * stride);
      EXPECT_EQ(after, before);
    }
  }
  printf("fused gdn decode nk %d nv %d dk %d n %lld: outputs rel L2 %.2e\n", d.nk, d.nv, d.dk,
         static_cast<long long>(n), out_err);
}

INSTANTIATE_TEST_SUITE_P(Shapes, GdnDecodeFusedTest,
                         ::testing::Values(Case{16, 32, 128, 4, {3}},          // Qwen3-Next-80B, batch 1
                                           Case{16, 32, 128, 4, {2, 0, 5}},    // three sequences
                                           Case{8, 16, 128, 4, {4, 1}},        // small
                                           Case{2, 4, 64, 4, {0, 5, 3, 1}},    // tiny
                                           Case{2, 2, 64, 2, {1}}));           // r = 1, kernel 2

TEST(GdnDecodeFusedArgsTest, RefusesWhatItCannotRun) {
  TANDEM_SKIP_WITHOUT_GPU();
  EXPECT_FALSE(GdnDecodeFusedSupports(GdnShape{16, 32, 256, 256, 4}));  // dk 256
  EXPECT_FALSE(GdnDecodeFusedSupports(GdnShape{4, 32, 128, 128, 4}));   // 8 x 128 threads
  EXPECT_FALSE(GdnDecodeFusedSupports(GdnShape{3, 4, 64, 64, 4}));      // nv not a multiple of nk
  GdnDecodeArgs a;
  a.shape = GdnShape{16, 32, 128, 128, 4};
  a.n = 1;  // null pointers
  EXPECT_EQ(LaunchGdnDecodeFused(a, nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace tandem::cuda
