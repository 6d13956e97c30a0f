// The vector per-token GDN kernels (gdn_tokens.cu: LaunchGdnConv, LaunchGdnConvPrepare,
// LaunchGdnPrepare, LaunchGdnGatedNorm) against the general scalar kernels (the *General
// launchers), which GpuGdnTest ties to the CPU reference: shapes with whole and partial 128-channel
// warps, heads of 16 to 128 channels, conv kernels of 1 to 8 taps, token splits shorter than the
// conv history, and decode-sized prepares. The conv results and the history are the same bits;
// the norms may differ in the rounding of their sums.
#include <algorithm>
#include <string>
#include <tuple>
#include <vector>

#include "common/weights/half.h"
#include "gpu_service/backends/cuda/kernels/gdn.cuh"
#include "gpu_service/backends/cuda/kernels/gemm.cuh"
#include "gtest/gtest.h"
#include "tests/gpu/gdn_test_util.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/test_seed.h"

namespace tandem {
namespace {

using gpu_testing::Download;
using gpu_testing::Poisoned;
using gpu_testing::Random;
using gpu_testing::RelL2;
using gpu_testing::Upload;

class GpuGdnVecTest : public ::testing::TestWithParam<cuda::GdnShape> {
 protected:
  void SetUp() override { TANDEM_SKIP_WITHOUT_GPU(); }
};

std::string Tag(const cuda::GdnShape& d) {
  return "nk" + std::to_string(d.nk) + "_nv" + std::to_string(d.nv) + "_dk" + std::to_string(d.dk) + "_dv" +
         std::to_string(d.dv) + "_kk" + std::to_string(d.kk);
}

// A sequence's tokens in several calls (history carried), through the general conv + prepare, the
// fused vector kernel, and the unfused vector conv + prepare.
TEST_P(GpuGdnVecTest, ConvAndPrepareMatchGeneralKernels) {
  const cuda::GdnShape d = GetParam();
  std::mt19937 rng = ::tandem::testing::SeededRng();
  const std::vector<int64_t> splits = {70, 2, 1, 3, 1, 17};
  int64_t total = 0;
  for (int64_t n : splits) total += n;
  const int64_t c_dim = d.c_dim();
  const auto qkv = Upload(Random(rng, static_cast<size_t>(total * c_dim)));
  const auto taps = Upload(Random(rng, static_cast<size_t>(c_dim * d.kk), 0.5f));
  const auto ba = Upload(Random(rng, static_cast<size_t>(total * 2 * d.nv), 2.0f));
  const auto ssm_a = Upload(gdn_testing::RandomSsmA(rng, d.nv));
  const auto dt_bias = Upload(Random(rng, static_cast<size_t>(d.nv), 0.5f));
  const std::vector<float> history0 = Random(rng, static_cast<size_t>((d.kk - 1) * c_dim));
  struct Path {
    gpu_testing::DeviceArray<float> history, conv, g, beta;
  };
  auto make = [&] {
    return Path{Upload(history0), Poisoned<float>(static_cast<size_t>(total * c_dim)),
                Poisoned<float>(static_cast<size_t>(total * d.nv)), Poisoned<float>(static_cast<size_t>(total * d.nv))};
  };
  Path general = make(), fused = make(), unfused = make();
  // The plain conv output of the general and vector kernels, before the norms (same bits).
  auto conv_general = Poisoned<float>(static_cast<size_t>(total * c_dim));
  auto conv_vec = Poisoned<float>(static_cast<size_t>(total * c_dim));
  auto hist_general = Upload(history0), hist_vec = Upload(history0);
  int64_t off = 0;
  for (int64_t n : splits) {
    const float* x = qkv.get() + off * c_dim;
    const float* b = ba.get() + off * 2 * d.nv;
    TANDEM_ASSERT_CUDA(cuda::LaunchGdnConvGeneral(x, general.history.get(), taps.get(), n, d,
                                                  general.conv.get() + off * c_dim, nullptr));
    TANDEM_ASSERT_CUDA(cuda::LaunchGdnPrepareGeneral(general.conv.get() + off * c_dim, b, ssm_a.get(), dt_bias.get(),
                                                     n, d, general.g.get() + off * d.nv,
                                                     general.beta.get() + off * d.nv, nullptr));
    TANDEM_ASSERT_CUDA(cuda::LaunchGdnConvPrepare(x, fused.history.get(), taps.get(), b, ssm_a.get(), dt_bias.get(), n,
                                                  d, fused.conv.get() + off * c_dim, fused.g.get() + off * d.nv,
                                                  fused.beta.get() + off * d.nv, nullptr));
    TANDEM_ASSERT_CUDA(cuda::LaunchGdnConv(x, unfused.history.get(), taps.get(), n, d,
                                           unfused.conv.get() + off * c_dim, nullptr));
    TANDEM_ASSERT_CUDA(cuda::LaunchGdnPrepare(unfused.conv.get() + off * c_dim, b, ssm_a.get(), dt_bias.get(), n, d,
                                              unfused.g.get() + off * d.nv, unfused.beta.get() + off * d.nv, nullptr));
    TANDEM_ASSERT_CUDA(cuda::LaunchGdnConvGeneral(x, hist_general.get(), taps.get(), n, d,
                                                  conv_general.get() + off * c_dim, nullptr));
    TANDEM_ASSERT_CUDA(cuda::LaunchGdnConv(x, hist_vec.get(), taps.get(), n, d, conv_vec.get() + off * c_dim, nullptr));
    off += n;
    const std::vector<float> history = Download(general.history);
    EXPECT_EQ(Download(fused.history), history) << "after " << off << " tokens";
    EXPECT_EQ(Download(unfused.history), history) << "after " << off << " tokens";
  }
  const std::string tag = "gdn_vec_" + Tag(d);
  EXPECT_LE(gpu_testing::LogError(tag + "_conv", RelL2(Download(conv_vec), Download(conv_general))), 1e-7);
  const std::vector<float> conv = Download(general.conv);
  EXPECT_LE(gpu_testing::LogError(tag + "_fused_conv", RelL2(Download(fused.conv), conv)), 1e-6);
  EXPECT_LE(gpu_testing::LogError(tag + "_unfused_conv", RelL2(Download(unfused.conv), conv)), 1e-6);
  const std::vector<float> g = Download(general.g), beta = Download(general.beta);
  EXPECT_LE(RelL2(Download(fused.g), g), 1e-7);
  EXPECT_LE(RelL2(Download(fused.beta), beta), 1e-7);
  EXPECT_LE(RelL2(Download(unfused.g), g), 1e-7);
  EXPECT_LE(RelL2(Download(unfused.beta), beta), 1e-7);
}

// Decode-sized prepares (one token per sequence, n = batch) and prefill-sized ones, in place.
TEST_P(GpuGdnVecTest, PrepareMatchesGeneralKernel) {
  const cuda::GdnShape d = GetParam();
  std::mt19937 rng = ::tandem::testing::SeededRng();
  for (int64_t n : {1, 5, 64, 133}) {
    const std::vector<float> conv = Random(rng, static_cast<size_t>(n * d.c_dim()));
    const auto ba = Upload(Random(rng, static_cast<size_t>(n * 2 * d.nv), 2.0f));
    const auto ssm_a = Upload(Random(rng, static_cast<size_t>(d.nv), 0.5f, -1.0f));
    const auto dt_bias = Upload(Random(rng, static_cast<size_t>(d.nv), 0.5f));
    auto conv_general = Upload(conv), conv_vec = Upload(conv);
    auto g_general = Poisoned<float>(static_cast<size_t>(n * d.nv)), g_vec = Poisoned<float>(static_cast<size_t>(n * d.nv));
    auto b_general = Poisoned<float>(static_cast<size_t>(n * d.nv)), b_vec = Poisoned<float>(static_cast<size_t>(n * d.nv));
    TANDEM_ASSERT_CUDA(cuda::LaunchGdnPrepareGeneral(conv_general.get(), ba.get(), ssm_a.get(), dt_bias.get(), n, d,
                                                     g_general.get(), b_general.get(), nullptr));
    TANDEM_ASSERT_CUDA(cuda::LaunchGdnPrepare(conv_vec.get(), ba.get(), ssm_a.get(), dt_bias.get(), n, d, g_vec.get(),
                                              b_vec.get(), nullptr));
    const std::string tag = "gdn_vec_prepare_" + Tag(d) + "_n" + std::to_string(n);
    EXPECT_LE(gpu_testing::LogError(tag, RelL2(Download(conv_vec), Download(conv_general))), 1e-6);
    EXPECT_LE(RelL2(Download(g_vec), Download(g_general)), 1e-7);
    EXPECT_LE(RelL2(Download(b_vec), Download(b_general)), 1e-7);
  }
}

// out = norm ⊙ ρ(o) ⊙ SiLU(z) in place (out aliases o, as the backend calls it).
TEST_P(GpuGdnVecTest, GatedNormMatchesGeneralKernel) {
  const cuda::GdnShape d = GetParam();
  std::mt19937 rng = ::tandem::testing::SeededRng();
  for (int64_t n : {1, 3, 70}) {
    const size_t count = static_cast<size_t>(n * d.nv * d.dv);
    const std::vector<float> o = Random(rng, count);
    const auto z = Upload(Random(rng, count));
    const auto norm = Upload(Random(rng, static_cast<size_t>(d.dv), 0.2f, 1.0f));
    auto o_vec = Upload(o);
    const auto o_general = Upload(o);
    auto out_general = Poisoned<float>(count);
    TANDEM_ASSERT_CUDA(cuda::LaunchGdnGatedNormGeneral(o_general.get(), z.get(), norm.get(), 1e-6f, n, d,
                                                       out_general.get(), nullptr));
    TANDEM_ASSERT_CUDA(cuda::LaunchGdnGatedNorm(o_vec.get(), z.get(), norm.get(), 1e-6f, n, d, o_vec.get(), nullptr));
    const std::string tag = "gdn_vec_gated_norm_" + Tag(d) + "_n" + std::to_string(n);
    EXPECT_LE(gpu_testing::LogError(tag, RelL2(Download(o_vec), Download(out_general))), 1e-6);
  }
}

// The gated norm written as the output product's f16 rows (LaunchGdnGatedNormToF16): [f16(v)]
// or split rows [lo | hi | hi] per token; hi + lo within 1e-6 of the f32 kernel's rows (relative L2), hi
// alone within f16's rounding; also through the general path (o at a 4-byte offset).
TEST_P(GpuGdnVecTest, GatedNormToF16RowsMatchesF32Rows) {
  const cuda::GdnShape d = GetParam();
  std::mt19937 rng = ::tandem::testing::SeededRng();
  const int64_t vw = static_cast<int64_t>(d.nv) * d.dv;
  for (int64_t n : {3, 70}) {
    const size_t count = static_cast<size_t>(n * vw);
    const std::vector<float> o = Random(rng, count);
    const auto z = Upload(Random(rng, count));
    const auto norm = Upload(Random(rng, static_cast<size_t>(d.dv), 0.2f, 1.0f));
    auto o_f32 = Upload(o);
    TANDEM_ASSERT_CUDA(cuda::LaunchGdnGatedNorm(o_f32.get(), z.get(), norm.get(), 1e-6f, n, d, o_f32.get(), nullptr));
    const std::vector<float> want = Download(o_f32);
    for (bool split : {true, false}) {
      for (bool general : {false, true}) {
        std::vector<float> shifted(count + 1);
        std::copy(o.begin(), o.end(), shifted.begin() + (general ? 1 : 0));
        auto o_dev = Upload(shifted);
        const int64_t width = (split ? 3 : 1) * vw;
        auto out16 = Poisoned<uint16_t>(static_cast<size_t>(n * width));
        TANDEM_ASSERT_CUDA(cuda::LaunchGdnGatedNormToF16(o_dev.get() + (general ? 1 : 0), z.get(), norm.get(), 1e-6f,
                                                         n, d, split, out16.get(), nullptr));
        const std::vector<uint16_t> h = Download(out16);
        std::vector<float> got(count);
        for (int64_t t = 0; t < n; ++t) {
          for (int64_t c = 0; c < vw; ++c) {
            const uint16_t* row = h.data() + t * width;
            float v = Fp16ToFp32(row[c]);
            if (split) {  // [lo | hi | hi]
              ASSERT_EQ(row[cuda::kSplitHiThird * vw + c], row[(cuda::kSplitHiThird + 1) * vw + c]);
              v = Fp16ToFp32(row[cuda::kSplitHiThird * vw + c]) + Fp16ToFp32(row[cuda::kSplitLoThird * vw + c]);
            }
            got[t * vw + c] = v;
          }
        }
        const std::string tag = std::string("gdn_gated_norm_f16_") + (split ? "split_" : "hi_") +
                                (general ? "general_" : "vec_") + Tag(d) + "_n" + std::to_string(n);
        EXPECT_LE(gpu_testing::LogError(tag, RelL2(got, want)), split ? 1e-6 : 1e-3) << tag;
      }
    }
  }
}

// The products' rows as parts of wider rows (one stacked product's [qkv | z | ba | pad] per token,
// DenseGemm::RunStack): the strided kernels give the bits of the contiguous ones. A row stride
// that is a multiple of 4 keeps the vector kernels; an odd one sends them to the general kernels,
// whose results are compared with the general kernels over contiguous rows (the same bits again).
TEST_P(GpuGdnVecTest, StridedRowsGiveTheContiguousResults) {
  const cuda::GdnShape d = GetParam();
  std::mt19937 rng = ::tandem::testing::SeededRng();
  const std::vector<int64_t> splits = {70, 2, 1, 17};
  int64_t total = 0;
  for (int64_t n : splits) total += n;
  const int64_t c_dim = d.c_dim(), vw = static_cast<int64_t>(d.nv) * d.dv, bw = 2 * static_cast<int64_t>(d.nv);
  const std::vector<float> qkv = Random(rng, static_cast<size_t>(total * c_dim));
  const std::vector<float> z = Random(rng, static_cast<size_t>(total * vw));
  const std::vector<float> ba = Random(rng, static_cast<size_t>(total * bw), 2.0f);
  const std::vector<float> o = Random(rng, static_cast<size_t>(total * vw));
  const auto [taps, ssm_a, dt_bias, norm] = gdn_testing::RandomGdnParams(rng, d);
  const std::vector<float> history0 = Random(rng, static_cast<size_t>((d.kk - 1) * c_dim));
  const auto qkv_dev = Upload(qkv), z_dev = Upload(z), ba_dev = Upload(ba);
  for (const int64_t pad : {int64_t{4}, int64_t{1}}) {
    // [qkv | z | ba] rounded up to whole 16-byte vectors, then 4 floats more (vector kernels) or 1
    // (general kernels: every other row misaligned).
    const int64_t stride = (c_dim + vw + bw + 3) / 4 * 4 + pad;
    const bool vec = stride % 4 == 0 && c_dim % 4 == 0 && vw % 4 == 0;
    std::vector<float> rows(static_cast<size_t>(total * stride), -7.0f);
    for (int64_t t = 0; t < total; ++t) {
      std::copy_n(qkv.begin() + t * c_dim, c_dim, rows.begin() + t * stride);
      std::copy_n(z.begin() + t * vw, vw, rows.begin() + t * stride + c_dim);
      std::copy_n(ba.begin() + t * bw, bw, rows.begin() + t * stride + c_dim + vw);
    }
    const auto rows_dev = Upload(rows);
    const float* qkv_rows = rows_dev.get();
    const float *z_rows = qkv_rows + c_dim, *ba_rows = z_rows + vw;
    const std::string tag = Tag(d) + (vec ? " (vector kernels)" : " (general kernels)");
    // Conv + prepare over the token splits (history carried).
    struct Path {
      gpu_testing::DeviceArray<float> history, conv, g, beta;
    };
    auto make = [&] {
      return Path{Upload(history0), Poisoned<float>(static_cast<size_t>(total * c_dim)),
                  Poisoned<float>(static_cast<size_t>(total * d.nv)), Poisoned<float>(static_cast<size_t>(total * d.nv))};
    };
    Path want = make(), got = make(), want_general = make(), got_general = make();
    int64_t off = 0;
    for (int64_t n : splits) {
      const float* x = qkv_dev.get() + off * c_dim;
      const float* b = ba_dev.get() + off * bw;
      const float* xs = qkv_rows + off * stride;
      const float* bs = ba_rows + off * stride;
      if (vec) {
        TANDEM_ASSERT_CUDA(cuda::LaunchGdnConvPrepare(x, want.history.get(), taps.get(), b, ssm_a.get(), dt_bias.get(),
                                                      n, d, want.conv.get() + off * c_dim, want.g.get() + off * d.nv,
                                                      want.beta.get() + off * d.nv, nullptr));
      } else {  // what the fused launcher falls back to: the general conv, then the prepare
        TANDEM_ASSERT_CUDA(cuda::LaunchGdnConvGeneral(x, want.history.get(), taps.get(), n, d,
                                                      want.conv.get() + off * c_dim, nullptr));
        TANDEM_ASSERT_CUDA(cuda::LaunchGdnPrepare(want.conv.get() + off * c_dim, b, ssm_a.get(), dt_bias.get(), n, d,
                                                  want.g.get() + off * d.nv, want.beta.get() + off * d.nv, nullptr));
      }
      TANDEM_ASSERT_CUDA(cuda::LaunchGdnConvPrepare(xs, got.history.get(), taps.get(), bs, ssm_a.get(), dt_bias.get(), n,
                                                    d, got.conv.get() + off * c_dim, got.g.get() + off * d.nv,
                                                    got.beta.get() + off * d.nv, nullptr, stride, stride));
      // The general launchers themselves, contiguous and strided.
      TANDEM_ASSERT_CUDA(cuda::LaunchGdnConvGeneral(x, want_general.history.get(), taps.get(), n, d,
                                                    want_general.conv.get() + off * c_dim, nullptr));
      TANDEM_ASSERT_CUDA(cuda::LaunchGdnPrepareGeneral(want_general.conv.get() + off * c_dim, b, ssm_a.get(),
                                                       dt_bias.get(), n, d, want_general.g.get() + off * d.nv,
                                                       want_general.beta.get() + off * d.nv, nullptr));
      TANDEM_ASSERT_CUDA(cuda::LaunchGdnConvGeneral(xs, got_general.history.get(), taps.get(), n, d,
                                                    got_general.conv.get() + off * c_dim, nullptr, stride));
      TANDEM_ASSERT_CUDA(cuda::LaunchGdnPrepareGeneral(got_general.conv.get() + off * c_dim, bs, ssm_a.get(),
                                                       dt_bias.get(), n, d, got_general.g.get() + off * d.nv,
                                                       got_general.beta.get() + off * d.nv, nullptr, stride));
      off += n;
    }
    for (const auto& [w, g, what] : {std::tuple{&want, &got, "fused"}, std::tuple{&want_general, &got_general, "general"}}) {
      EXPECT_EQ(Download(g->history), Download(w->history)) << tag << " " << what;
      EXPECT_EQ(Download(g->conv), Download(w->conv)) << tag << " " << what;
      EXPECT_EQ(Download(g->g), Download(w->g)) << tag << " " << what;
      EXPECT_EQ(Download(g->beta), Download(w->beta)) << tag << " " << what;
    }
    // The gated norm (f32 rows, in place and general) and its f16 rows.
    auto o_want = Upload(o), o_got = Upload(o), o_want_general = Upload(o), o_got_general = Upload(o);
    if (vec) {
      TANDEM_ASSERT_CUDA(cuda::LaunchGdnGatedNorm(o_want.get(), z_dev.get(), norm.get(), 1e-6f, total, d, o_want.get(),
                                                  nullptr));
    } else {
      TANDEM_ASSERT_CUDA(cuda::LaunchGdnGatedNormGeneral(o_want.get(), z_dev.get(), norm.get(), 1e-6f, total, d,
                                                         o_want.get(), nullptr));
    }
    TANDEM_ASSERT_CUDA(cuda::LaunchGdnGatedNorm(o_got.get(), z_rows, norm.get(), 1e-6f, total, d, o_got.get(), nullptr,
                                                stride));
    TANDEM_ASSERT_CUDA(cuda::LaunchGdnGatedNormGeneral(o_want_general.get(), z_dev.get(), norm.get(), 1e-6f, total, d,
                                                       o_want_general.get(), nullptr));
    TANDEM_ASSERT_CUDA(cuda::LaunchGdnGatedNormGeneral(o_got_general.get(), z_rows, norm.get(), 1e-6f, total, d,
                                                       o_got_general.get(), nullptr, stride));
    EXPECT_EQ(Download(o_got), Download(o_want)) << tag << " gated norm";
    EXPECT_EQ(Download(o_got_general), Download(o_want_general)) << tag << " general gated norm";
    for (bool split : {true, false}) {
      auto o1 = Upload(o), o2 = Upload(o);
      const size_t width = static_cast<size_t>((split ? 3 : 1) * vw);
      auto want16 = Poisoned<uint16_t>(static_cast<size_t>(total) * width);
      auto got16 = Poisoned<uint16_t>(static_cast<size_t>(total) * width);
      TANDEM_ASSERT_CUDA(cuda::LaunchGdnGatedNormToF16(o1.get(), z_dev.get(), norm.get(), 1e-6f, total, d, split,
                                                       want16.get(), nullptr));
      TANDEM_ASSERT_CUDA(cuda::LaunchGdnGatedNormToF16(o2.get(), z_rows, norm.get(), 1e-6f, total, d, split, got16.get(),
                                                       nullptr, stride));
      // The odd stride takes the general path, the contiguous rows the vector one: their norms may
      // round differently, so only the aligned case is compared bit for bit.
      if (vec) {
        EXPECT_EQ(Download(got16), Download(want16)) << tag << " gated norm f16 rows, split " << split;
      }
    }
  }
  // A stride narrower than the rows is refused.
  EXPECT_EQ(cuda::LaunchGdnConvPrepare(qkv_dev.get(), nullptr, taps.get(), ba_dev.get(), ssm_a.get(), dt_bias.get(), 1,
                                       d, nullptr, nullptr, nullptr, nullptr, c_dim - 1, 0),
            cudaErrorInvalidValue);
  EXPECT_EQ(cuda::LaunchGdnGatedNorm(nullptr, z_dev.get(), norm.get(), 1e-6f, 1, d, nullptr, nullptr, vw - 1),
            cudaErrorInvalidValue);
}

INSTANTIATE_TEST_SUITE_P(Shapes, GpuGdnVecTest,
                         ::testing::Values(cuda::GdnShape{16, 32, 128, 128, 4},  // Qwen3-Next-80B
                                           cuda::GdnShape{2, 4, 64, 64, 4}, cuda::GdnShape{2, 4, 128, 128, 8},
                                           // 160 channels: one whole warp holding q, k and v lanes, then
                                           // a partial one; heads of 8 lanes
                                           cuda::GdnShape{1, 3, 32, 32, 3}, cuda::GdnShape{2, 2, 16, 64, 2},
                                           cuda::GdnShape{2, 4, 64, 32, 1}),
                         [](const ::testing::TestParamInfo<cuda::GdnShape>& info) { return Tag(info.param); });

}  // namespace
}  // namespace tandem
