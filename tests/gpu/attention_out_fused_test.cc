// The one-launch decode attention and output product (attention_out_fused.cuh) against the two
// launches it replaces: the split attention (LaunchAttention, exact f32) and then the column-split
// product of its output (LaunchColumnSplitMatVec), on q3n-80b's attention shape (16 query heads,
// 2 kv heads, hd 256) with an o of 2560 rows (o's 2048 and the routing terms' rows, as o_route).
// y starts from random values (the kernel adds). Within 1e-4 relative L2: the keys' sums are split
// differently (eight slices of a head in one cluster against up to 66 slices), so x differs in the
// last bits and its int16 rounding may move a step. Contexts from one key (seven empty slices) to
// kAttnOutFusedMaxKeys, in sequence rows 0 and 5 (the page table's row), in both forms (clusters of
// four and of eight: AttnOutFusedForm). Also the shapes and
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
  const int was_form = cuda::AttnOutFusedForm();
  for (int form : {4, 8}) {
    cuda::SetAttnOutFusedForm(form);
    for (int row : {0, 5}) {
      for (int ctx : {1, 2, 7, 8, 9, 33, 135, 300, static_cast<int>(cuda::kAttnOutFusedMaxKeys)}) {
        const std::string tag =
            "form " + std::to_string(form) + " row " + std::to_string(row) + " ctx " + std::to_string(ctx);
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
  }
  cuda::SetAttnOutFusedForm(was_form);
}

TEST(GpuAttentionOutFusedTest, RefusesWhatItCannotRun) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng = ::tandem::testing::SeededRng();
  const gpu_testing::Regrouped g = gpu_testing::Regroup(gpu_testing::RandomMatrix(rng, WeightType::kQ8_0, 4096, 2560, 0.05f));
  const gpu_testing::Regrouped odd = gpu_testing::Regroup(gpu_testing::RandomMatrix(rng, WeightType::kQ8_0, 4096, 2046, 0.05f));
  const gpu_testing::Regrouped narrow = gpu_testing::Regroup(gpu_testing::RandomMatrix(rng, WeightType::kQ8_0, 2048, 2560, 0.05f));
  EXPECT_TRUE(cuda::AttentionOutFusedFits(k80b, g.m));
  EXPECT_FALSE(cuda::AttentionOutFusedFits(cuda::AttnShape{32, 2, 128, 32, 1e-6f}, g.m));  // hd 128
  EXPECT_FALSE(cuda::AttentionOutFusedFits(k80b, odd.m));     // rows not a multiple of 4
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
