// The attention layer's prefill glue (glue13, 2026-12-02; NOT yet run on a GPU when written):
//   - LaunchQueryNormRope's warp-per-head kernel (TANDEM_OLD_QUERY_ROPE=1 gives the block kernel)
//     against the block kernel bit for bit (hd 32..256, rot 0 / 16 / 64 / hd / other multiples of
//     64, n 1..300, packed rows and rows wider than nh·2hd), and against the CPU reference
//     (RmsNorm + RopeNeox per head) within the attention tests' tolerance;
//   - LaunchF32ToF16's 8-values-a-thread kernel (TANDEM_OLD_F32_TO_F16=1 gives the scalar one)
//     against the scalar kernel bit for bit, with and without dst_lo, and the fallback for a count
//     not a multiple of 8 and for misaligned pointers.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/reference/ops.h"
#include "common/weights/half.h"
#include "gpu_service/backends/cuda/kernels/attention.cuh"
#include "gpu_service/backends/cuda/kernels/gemm.cuh"
#include "gtest/gtest.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/test_seed.h"

namespace tandem {
namespace {

using gpu_testing::Download;
using gpu_testing::FirstDifference;
using gpu_testing::Poisoned;
using gpu_testing::Random;
using gpu_testing::RelL2;
using gpu_testing::SameBits;
using gpu_testing::Upload;

// Restores the two switches when a test ends.
struct GlueSwitchGuard {
  bool query = cuda::OldQueryRope(), f16 = cuda::OldF32ToF16();
  ~GlueSwitchGuard() {
    cuda::SetOldQueryRope(query);
    cuda::SetOldF32ToF16(f16);
  }
};

class GpuGlueKernelsTest : public ::testing::Test {
 protected:
  void SetUp() override { TANDEM_SKIP_WITHOUT_GPU(); }
};

// Every shape through both kernels (the warp kernel where it takes the shape; rot 16 and hd 96 are
// the block kernel's alone, so both runs must agree there trivially) and the CPU reference.
TEST_F(GpuGlueKernelsTest, QueryNormRopeWarpKernelMatchesBlockKernelBits) {
  GlueSwitchGuard guard;
  std::mt19937 rng = ::tandem::testing::SeededRng();
  struct Shape {
    int nh, hd, rot;
  };
  const std::vector<Shape> shapes = {{16, 256, 64},  {3, 256, 256}, {5, 256, 128}, {2, 256, 192}, {4, 256, 0},
                                     {8, 128, 64},   {3, 128, 128}, {7, 128, 16},  {2, 128, 0},   {8, 64, 64},
                                     {5, 64, 16},    {1, 64, 0},    {4, 32, 0},    {3, 96, 64},   {16, 256, 16}};
  const std::vector<int64_t> ns = {1, 3, 8, 77, 300};
  int warp_shapes = 0;
  for (const Shape& sh : shapes) {
    const cuda::AttnShape d{sh.nh, 1, sh.hd, sh.rot, 1e-6f};
    const bool warp = sh.rot % 64 == 0 && (sh.hd == 32 || sh.hd == 64 || sh.hd == 128 || sh.hd == 256);
    warp_shapes += warp;
    const int64_t qgw = static_cast<int64_t>(sh.nh) * 2 * sh.hd;
    const double theta = 1e7;
    const std::vector<double> inv = cuda::RopeInvFrequencies(theta, sh.rot);
    const auto d_inv = Upload(inv.empty() ? std::vector<double>{0.0} : inv);
    const std::vector<float> gamma = Random(rng, static_cast<size_t>(sh.hd), 0.3f, 1.0f);
    const auto d_qn = Upload(gamma);
    for (int64_t n : ns) {
      for (int64_t stride : {int64_t{0}, qgw + 2 * sh.hd + 5}) {
        const int64_t rs = stride == 0 ? qgw : stride;
        // Magnitudes vary by head and token (sums of squares over many binades).
        std::vector<float> rows = Random(rng, static_cast<size_t>(n * rs));
        for (int64_t t = 0; t < n; ++t) {
          for (int h = 0; h < sh.nh; ++h) {
            const float scale = std::ldexp(1.0f, static_cast<int>((t * 7 + h * 3) % 17) - 8);
            for (int i = 0; i < 2 * sh.hd; ++i) rows[t * rs + h * 2 * sh.hd + i] *= scale;
          }
        }
        std::vector<int32_t> pos(static_cast<size_t>(n));
        for (int64_t t = 0; t < n; ++t) pos[t] = static_cast<int32_t>((t * 977 + 13) % 300000);  // far positions too
        const auto d_rows = Upload(rows);
        const auto d_pos = Upload(pos);
        std::vector<float> out[2];
        for (int old = 0; old < 2; ++old) {
          cuda::SetOldQueryRope(old == 1);
          auto d_q = Poisoned<float>(static_cast<size_t>(n * sh.nh * sh.hd));
          TANDEM_ASSERT_CUDA(cuda::LaunchQueryNormRope(d_rows.get(), n, d, d_qn.get(), d_inv.get(), d_pos.get(),
                                                       d_q.get(), nullptr, stride));
          out[old] = Download(d_q);
        }
        const std::string what = "nh " + std::to_string(sh.nh) + " hd " + std::to_string(sh.hd) + " rot " +
                                 std::to_string(sh.rot) + " n " + std::to_string(n) + " stride " +
                                 std::to_string(stride) + (warp ? " (warp kernel)" : " (block kernel only)");
        EXPECT_TRUE(SameBits(out[0], out[1])) << what << ": differs at " << FirstDifference(out[0], out[1]);
        // The CPU reference: RmsNorm then RopeNeox per head (common/reference/attention.cc).
        std::vector<float> want(static_cast<size_t>(n * sh.nh * sh.hd));
        for (int64_t t = 0; t < n; ++t) {
          for (int h = 0; h < sh.nh; ++h) {
            float* y = want.data() + (t * sh.nh + h) * sh.hd;
            RmsNorm(rows.data() + t * rs + h * 2 * sh.hd, sh.hd, d.eps, gamma.data(), y);
            RopeNeox(y, sh.rot, theta, pos[t]);
          }
        }
        EXPECT_LE(RelL2(out[0], want), 1e-6) << what;
      }
    }
  }
  EXPECT_EQ(warp_shapes, 11);
}

// The one-launch decode prep (LaunchQkvNormRopeAppend: the block kernel's per-head code) gives
// the warp kernel's q bits: prefill (warp kernel) and decode (one launch) agree.
TEST_F(GpuGlueKernelsTest, QueryNormRopeWarpKernelMatchesOnePrepQueries) {
  GlueSwitchGuard guard;
  cuda::SetOldQueryRope(false);
  std::mt19937 rng = ::tandem::testing::SeededRng();
  const cuda::AttnShape d{16, 2, 256, 64, 1e-6f};
  const int64_t n = 37, qgw = static_cast<int64_t>(d.nh) * 2 * d.hd, kvw = d.kv_width();
  const auto d_qg = Upload(Random(rng, static_cast<size_t>(n * qgw)));
  const auto d_k = Upload(Random(rng, static_cast<size_t>(n * kvw)));
  const auto d_v = Upload(Random(rng, static_cast<size_t>(n * kvw)));
  const auto d_inv = Upload(cuda::RopeInvFrequencies(1e7, d.rot));
  const auto d_qn = Upload(Random(rng, static_cast<size_t>(d.hd), 0.3f, 1.0f));
  const auto d_kn = Upload(Random(rng, static_cast<size_t>(d.hd), 0.3f, 1.0f));
  std::vector<int32_t> seq(static_cast<size_t>(n), 0), pos(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) pos[t] = static_cast<int32_t>(100 + t);
  const auto d_seq = Upload(seq), d_pos = Upload(pos), d_table = Upload(std::vector<int32_t>{3, 0, 1, 2});
  const size_t cache_floats = static_cast<size_t>(4) * cuda::kKvPageSize * kvw;
  auto kc = Upload(std::vector<float>(cache_floats, 0.0f)), vc = Upload(std::vector<float>(cache_floats, 0.0f));
  auto q0 = Poisoned<float>(static_cast<size_t>(n * d.nh * d.hd)), q1 = Poisoned<float>(q0.count);
  TANDEM_ASSERT_CUDA(
      cuda::LaunchQueryNormRope(d_qg.get(), n, d, d_qn.get(), d_inv.get(), d_pos.get(), q0.get(), nullptr));
  const cuda::QkvRows rows{d_qg.get(), 0, d_k.get(), 0, d_v.get(), 0};
  TANDEM_ASSERT_CUDA(cuda::LaunchQkvNormRopeAppend(rows, n, d, d_qn.get(), d_kn.get(), d_inv.get(), d_seq.get(),
                                                   d_pos.get(), q1.get(),
                                                   cuda::PagedKv{kc.get(), vc.get(), d_table.get(), 4}, nullptr));
  const std::vector<float> a = Download(q0), b = Download(q1);
  EXPECT_TRUE(SameBits(a, b)) << "differs at " << FirstDifference(a, b);
}

// dst (and dst_lo) from the vector kernel and the scalar one: aligned counts take the vector
// kernel, the others (count % 8 != 0, src or dst or dst_lo off 16-byte alignment) the scalar one.
TEST_F(GpuGlueKernelsTest, F32ToF16VectorKernelMatchesScalarBits) {
  GlueSwitchGuard guard;
  std::mt19937 rng = ::tandem::testing::SeededRng();
  const int64_t max_count = 8192 * 8 + 64;
  std::vector<float> src = Random(rng, static_cast<size_t>(max_count), 3.0f);
  // Every range f16 meets: subnormal halves, overflow to infinity, ties, exact values, zeros, NaN.
  for (int64_t i = 0; i < max_count; i += 5) src[i] = std::ldexp(src[i], static_cast<int>(i % 41) - 28);
  src[1] = 65520.0f;   // rounds to infinity
  src[2] = -70000.0f;  // overflows
  src[3] = std::ldexp(1.0f, -25);  // half of the smallest subnormal: a tie to 0
  src[4] = -0.0f;
  src[6] = 1.0f + std::ldexp(1.0f, -11);  // a tie between two f16 values
  src[7] = std::nanf("");
  const auto d_src = Upload(src);
  struct Case {
    int64_t count, src_off, dst_off, lo_off;  // offsets in elements
    bool lo;
  };
  const std::vector<Case> cases = {
      {8, 0, 0, 0, false},         {8, 0, 0, 0, true},           {8192 * 8, 0, 0, 0, false},
      {8192 * 8, 0, 0, 0, true},   {8 * 300, 8, 16, 24, true},   {8 * 123, 0, 8, 0, true},
      {1, 0, 0, 0, true},          {7, 0, 0, 0, true},           {8 * 77 + 3, 0, 0, 0, true},
      {8 * 77 + 5, 0, 0, 0, false}, {8 * 64, 1, 0, 0, true},     {8 * 64, 4, 0, 0, false},
      {8 * 64, 0, 2, 0, true},     {8 * 64, 0, 0, 4, true},      {8 * 64, 3, 5, 7, true}};
  for (const Case& c : cases) {
    const bool vector = c.count % 8 == 0 && c.src_off % 4 == 0 && c.dst_off % 8 == 0 && (!c.lo || c.lo_off % 8 == 0);
    std::vector<uint16_t> hi[2], lo[2];
    for (int old = 0; old < 2; ++old) {
      cuda::SetOldF32ToF16(old == 1);
      auto d_hi = Poisoned<uint16_t>(static_cast<size_t>(c.count + c.dst_off + 8));
      auto d_lo = Poisoned<uint16_t>(static_cast<size_t>(c.count + c.lo_off + 8));
      TANDEM_ASSERT_CUDA(cuda::LaunchF32ToF16(d_src.get() + c.src_off, c.count, d_hi.get() + c.dst_off, nullptr,
                                              c.lo ? d_lo.get() + c.lo_off : nullptr));
      hi[old] = Download(d_hi);
      lo[old] = Download(d_lo);
    }
    const std::string what = "count " + std::to_string(c.count) + " offsets " + std::to_string(c.src_off) + "/" +
                             std::to_string(c.dst_off) + "/" + std::to_string(c.lo_off) + (c.lo ? " with lo" : "") +
                             (vector ? " (vector kernel)" : " (scalar kernel only)");
    EXPECT_TRUE(SameBits(hi[0], hi[1])) << what << ": hi differs at " << FirstDifference(hi[0], hi[1]);
    EXPECT_TRUE(SameBits(lo[0], lo[1])) << what << ": lo differs at " << FirstDifference(lo[0], lo[1]);
    // Written exactly [dst_off, dst_off + count) (the poison 0xFFFF stays around it), each value the
    // nearest f16 (within half an f16 ulp: 2^-11 relative, 2^-25 absolute among the subnormals),
    // and with dst_lo, hi + lo within 2^-21 relative of the value (the CPU's view of a split).
    for (int64_t i = 0; i < static_cast<int64_t>(hi[0].size()); ++i) {
      if (i < c.dst_off || i >= c.dst_off + c.count) {
        ASSERT_EQ(hi[0][i], 0xFFFF) << what << ": wrote hi outside at " << i;
        continue;
      }
      const float x = src[c.src_off + i - c.dst_off];
      const float h = Fp16ToFp32(hi[0][i]);
      if (std::isnan(x)) {
        EXPECT_TRUE(std::isnan(h)) << what << " at " << i;
      } else if (std::fabs(x) >= 65520.0f) {
        EXPECT_EQ(h, std::copysign(INFINITY, x)) << what << " at " << i;
      } else {
        ASSERT_LE(std::fabs(h - x), std::max(std::ldexp(std::fabs(x), -11), std::ldexp(1.0f, -25)))
            << what << ": hi at " << i << " of " << x;
        if (c.lo) {
          const int64_t j = i - c.dst_off + c.lo_off;
          ASSERT_LE(std::fabs(static_cast<double>(h) + Fp16ToFp32(lo[0][j]) - x),
                    std::max(std::ldexp(std::fabs(static_cast<double>(x)), -21), std::ldexp(1.0, -25)))
              << what << ": hi + lo at " << i << " of " << x;
        }
      }
    }
    if (!c.lo) {
      EXPECT_TRUE(std::all_of(lo[0].begin(), lo[0].end(), [](uint16_t b) { return b == 0xFFFF; })) << what;
    }
  }
}

}  // namespace
}  // namespace tandem
