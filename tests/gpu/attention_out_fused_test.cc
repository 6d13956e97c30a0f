// The one-launch decode attention and output product (attention_out_fused.cuh) against the two
// launches it replaces: the split attention (LaunchAttention, exact f32) and then the column-split
// product of its output (LaunchColumnSplitMatVec), on q3n-80b's attention shape (16 query heads,
// 2 kv heads, hd 256) with an o of 2560 rows (o's 2048 and the routing terms' rows, as o_route).
// y starts from random values (the kernel adds). Within 1e-4 relative L2: the keys' sums are split
// differently (a block's eight warps against up to 66 slices), so x differs in the last bits and its
// int16 rounding may move a step. Contexts from one key (seven warps without keys) to
// kAttnOutFusedMaxKeys, in sequence rows 0 and 5 (the page table's row), with the three ways of
// bringing in o's rows (AttnOutFusedRowsMode), each before and after the PDL wait (o_route's 320
// rows a block come in five TMA boxes of 64). Also the q/k prep inside the launch, and the shapes and
// matrices it refuses.
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "common/weights/weight_types.h"
#include "gpu_service/backends/cuda/device_matrix.h"
#include "gpu_service/backends/cuda/kernels/attention.cuh"
#include "gpu_service/backends/cuda/kernels/attention_out_fused.cuh"
#include "gpu_service/backends/cuda/kernels/dense_colsplit.cuh"
#include "gtest/gtest.h"
#include "tests/gpu/attention_decode_util.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/test_seed.h"

namespace tandem {
namespace {

using attn_testing::AllFinite;
using attn_testing::AttendPlanned;
using attn_testing::DecodeCase;
using attn_testing::FirstDifference;
using attn_testing::MakeDecodeCase;
using attn_testing::ZeroedScratch;
using gpu_testing::Download;
using gpu_testing::Random;
using gpu_testing::RelL2;
using gpu_testing::Upload;

const cuda::AttnShape k80b{16, 2, 256, 64, 1e-6f};

TEST(GpuAttentionOutFusedTest, MatchesSplitAttentionThenColumnProduct) {
  TANDEM_SKIP_WITHOUT_GPU();
  attn_testing::AttnSwitchGuard guard;
  std::mt19937 rng = ::tandem::testing::SeededRng();
  const gpu_testing::TestMatrix w = gpu_testing::RandomMatrix(rng, WeightType::kQ8_0, 4096, 2560, 0.05f);
  const gpu_testing::Regrouped g = gpu_testing::Regroup(w);
  ASSERT_TRUE(cuda::AttentionOutFusedFits(k80b, g.m));
  ASSERT_TRUE(cuda::ColumnSplitMatVecFits(g.m));
  const int was_rows = cuda::AttnOutFusedRowsMode();
  const bool was_late = cuda::AttnOutFusedLateRows();
  struct Variant {
    int mode;  // o's rows by cp.async pieces (0), a bulk copy a row (1), the TMA's boxes (2)
    bool late;
  };
  for (const Variant v : {Variant{0, false}, Variant{0, true}, Variant{1, false}, Variant{1, true}, Variant{2, false},
                          Variant{2, true}}) {
    cuda::SetAttnOutFusedRowsMode(v.mode);
    cuda::SetAttnOutFusedLateRows(v.late);
    const int row = v.mode == 1 ? 5 : 0;
    for (int ctx : {1, 2, 7, 8, 9, 33, 65, 135, 300, static_cast<int>(cuda::kAttnOutFusedMaxKeys)}) {
      const std::string tag = "rows mode " + std::to_string(v.mode) + (v.late ? " late" : " early") + " row " +
                              std::to_string(row) + " ctx " + std::to_string(ctx);
      DecodeCase c = MakeDecodeCase(rng, k80b, {row}, {ctx}, {1});
      const cuda::AttentionPlan plan = cuda::PlanAttention(c.token_seq, k80b);
      const auto items = Upload(plan.items);
      const auto scratch = ZeroedScratch(plan.scratch_bytes);
      const std::vector<float> attn = AttendPlanned(c, plan, items, scratch);
      ASSERT_TRUE(AllFinite(attn)) << tag;
      const std::vector<float> y0 = Random(rng, 2560);
      auto want = Upload(y0);
      const auto attn_dev = Upload(attn);
      TANDEM_ASSERT_CUDA(cuda::LaunchColumnSplitMatVec(g.m, attn_dev.get(), want.get(), nullptr));
      auto got = Upload(y0);
      TANDEM_ASSERT_CUDA(cuda::LaunchAttentionOutFused(c.d_q.get(), c.d_qg.get(), 0, k80b, c.d_seq.get(),
                                                       c.d_pos.get(), c.cache(), g.m, got.get(), nullptr));
      TANDEM_ASSERT_CUDA(cudaDeviceSynchronize());
      const std::vector<float> fused = Download(got), split = Download(want);
      ASSERT_TRUE(AllFinite(fused)) << tag;
      // Against the host's product of the split path's attention output, in double, too.
      const std::vector<float> host = gpu_testing::HostProduct(w, attn, y0);
      EXPECT_LE(gpu_testing::LogError("fused attention + o vs split then column product, " + tag, RelL2(fused, split)),
                1e-4)
          << tag;
      EXPECT_LE(RelL2(fused, host), 1e-4) << tag;
    }
  }
  cuda::SetAttnOutFusedRowsMode(was_rows);
  cuda::SetAttnOutFusedLateRows(was_late);
}

// The q/k prep inside the launch (AttnOutFusedPrep) against LaunchQkvNormRopeAppend then the fused
// launch: the cache (the token's key and value appended by one block of each kv head) bit-identical,
// y within 1e-6 relative L2 (the same x: only the order of the blocks' atomic additions differs), at
// contexts from one key to past a pass of 64.
TEST(GpuAttentionOutFusedTest, PrepInsideMatchesThePrepLaunch) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng = ::tandem::testing::SeededRng();
  const gpu_testing::TestMatrix w = gpu_testing::RandomMatrix(rng, WeightType::kQ8_0, 4096, 2560, 0.05f);
  const gpu_testing::Regrouped g = gpu_testing::Regroup(w);
  const int kvw = k80b.kvh * k80b.hd;
  const auto q_norm = Upload(Random(rng, static_cast<size_t>(k80b.hd)));
  const auto k_norm = Upload(Random(rng, static_cast<size_t>(k80b.hd)));
  const auto inv_freq = Upload(cuda::RopeInvFrequencies(1e7, k80b.rot));
  for (int ctx : {1, 5, 33, 135, 400}) {
    const std::string tag = "ctx " + std::to_string(ctx);
    DecodeCase c = MakeDecodeCase(rng, k80b, {2}, {ctx}, {1});
    const std::vector<float> k0 = Download(c.d_k), v0 = Download(c.d_v);
    const auto k_raw = Upload(Random(rng, static_cast<size_t>(kvw)));
    const auto v_raw = Upload(Random(rng, static_cast<size_t>(kvw)));
    const std::vector<float> y0 = Random(rng, 2560);
    // The prep launch, then the fused launch reading its q.
    auto q_out = Upload(std::vector<float>(static_cast<size_t>(k80b.nh * k80b.hd), 0.0f));
    auto y_launch = Upload(y0);
    const cuda::QkvRows rows{c.d_qg.get(), 0, k_raw.get(), 0, v_raw.get(), 0};
    TANDEM_ASSERT_CUDA(cuda::LaunchQkvNormRopeAppend(rows, 1, k80b, q_norm.get(), k_norm.get(), inv_freq.get(),
                                                     c.d_seq.get(), c.d_pos.get(), q_out.get(), c.cache(), nullptr));
    TANDEM_ASSERT_CUDA(cuda::LaunchAttentionOutFused(q_out.get(), c.d_qg.get(), 0, k80b, c.d_seq.get(), c.d_pos.get(),
                                                     c.cache(), g.m, y_launch.get(), nullptr));
    TANDEM_ASSERT_CUDA(cudaDeviceSynchronize());
    const std::vector<float> k_launch = Download(c.d_k), v_launch = Download(c.d_v);
    // The cache as it was, then the prep inside.
    TANDEM_ASSERT_CUDA(cudaMemcpy(c.d_k.get(), k0.data(), k0.size() * sizeof(float), cudaMemcpyHostToDevice));
    TANDEM_ASSERT_CUDA(cudaMemcpy(c.d_v.get(), v0.data(), v0.size() * sizeof(float), cudaMemcpyHostToDevice));
    auto y_inside = Upload(y0);
    const cuda::AttnOutFusedPrep prep{k_raw.get(), v_raw.get(), q_norm.get(), k_norm.get(), inv_freq.get()};
    TANDEM_ASSERT_CUDA(cuda::LaunchAttentionOutFused(nullptr, c.d_qg.get(), 0, k80b, c.d_seq.get(), c.d_pos.get(),
                                                     c.cache(), g.m, y_inside.get(), nullptr, &prep));
    TANDEM_ASSERT_CUDA(cudaDeviceSynchronize());
    EXPECT_EQ(FirstDifference(Download(c.d_k), k_launch), -1) << tag << ": the appended keys";
    EXPECT_EQ(FirstDifference(Download(c.d_v), v_launch), -1) << tag << ": the appended values";
    EXPECT_NE(FirstDifference(k_launch, k0), -1) << tag << ": the prep launch appended nothing";
    const std::vector<float> inside = Download(y_inside), launched = Download(y_launch);
    ASSERT_TRUE(AllFinite(inside)) << tag;
    EXPECT_LE(gpu_testing::LogError("fused with the prep inside vs the prep launch, " + tag, RelL2(inside, launched)),
              1e-6)
        << tag;
  }
}

TEST(GpuAttentionOutFusedTest, RefusesWhatItCannotRun) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng = ::tandem::testing::SeededRng();
  const gpu_testing::Regrouped g = gpu_testing::Regroup(gpu_testing::RandomMatrix(rng, WeightType::kQ8_0, 4096, 2560, 0.05f));
  const gpu_testing::Regrouped odd = gpu_testing::Regroup(gpu_testing::RandomMatrix(rng, WeightType::kQ8_0, 4096, 2046, 0.05f));
  const gpu_testing::Regrouped narrow = gpu_testing::Regroup(gpu_testing::RandomMatrix(rng, WeightType::kQ8_0, 2048, 2560, 0.05f));
  EXPECT_TRUE(cuda::AttentionOutFusedFits(k80b, g.m));
  EXPECT_FALSE(cuda::AttentionOutFusedFits(cuda::AttnShape{32, 2, 128, 32, 1e-6f}, g.m));  // hd 128
  EXPECT_FALSE(cuda::AttentionOutFusedFits(k80b, odd.m));     // no part count of at most 768 rows
  EXPECT_FALSE(cuda::AttentionOutFusedFits(k80b, narrow.m));  // columns not nh · 256
  DecodeCase c = MakeDecodeCase(rng, k80b, {0}, {4}, {1});
  auto y = Upload(std::vector<float>(2560, 0.0f));
  EXPECT_EQ(cuda::LaunchAttentionOutFused(c.d_q.get(), c.d_qg.get(), 0, k80b, c.d_seq.get(), c.d_pos.get(), c.cache(),
                                          odd.m, y.get(), nullptr),
            cudaErrorNotSupported);
  EXPECT_EQ(cuda::LaunchAttentionOutFused(nullptr, c.d_qg.get(), 0, k80b, c.d_seq.get(), c.d_pos.get(), c.cache(), g.m,
                                          y.get(), nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(cuda::LaunchAttentionOutFused(c.d_q.get(), c.d_qg.get(), 100, k80b, c.d_seq.get(), c.d_pos.get(), c.cache(),
                                          g.m, y.get(), nullptr),
            cudaErrorInvalidValue);  // qg_stride below nh · 2hd
}

}  // namespace
}  // namespace tandem
