// The column-split o product merging a one-token step's attention slices itself (attention.cuh
// AttnDeferredMerge, dense_colsplit.cuh LaunchColumnSplitMatVec's merge): LaunchAttention with a
// deferred merge launches no merge kernel and says what to merge; the product over that gives the
// same y as the merge kernel followed by the plain product (the same x bits: SplitMergeKernel's
// operations in the product's blocks; y within 1e-6 relative L2, since the blocks' atomic additions
// come in no fixed order), with heads of 256 (one a super-block of o's columns) and of 128 (two),
// at contexts on both sides of the short-walk bound (where the split kernel's slice 0 writes o and
// the product reads it), and replayed from one captured graph at every context. Also what the
// deferral does not take and what the product refuses.
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "common/weights/weight_types.h"
#include "gpu_service/backends/cuda/device_matrix.h"
#include "gpu_service/backends/cuda/kernels/attention.cuh"
#include "gpu_service/backends/cuda/kernels/dense_colsplit.cuh"
#include "gtest/gtest.h"
#include "tests/gpu/attention_decode_util.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/test_seed.h"

namespace tandem {
namespace {

using attn_testing::DecodeCase;
using attn_testing::MakeDecodeCase;
using attn_testing::ZeroedScratch;
using gpu_testing::Download;
using gpu_testing::RelL2;
using gpu_testing::Upload;

// 80B attention: 16 query heads of 256 over 2 kv heads; o: 4096 → 2048 as Q8_0x8.
const cuda::AttnShape kShape{16, 2, 256, 64, 1e-6f};

// Heads of 128: two a super-block of o's columns (the small preset's width).
const cuda::AttnShape kShape128{16, 2, 128, 64, 1e-6f};

struct MergeInOutFixture {
  explicit MergeInOutFixture(std::mt19937& rng, const cuda::AttnShape& d = kShape)
      : w(gpu_testing::RandomMatrix(rng, WeightType::kQ8_0, d.nh * d.hd, 2048, 0.05f)), g(gpu_testing::Regroup(w, 0)) {}
  gpu_testing::TestMatrix w;
  gpu_testing::Regrouped g;
};

// The split path with its merge launch and the default short-walk bound, whatever the process's
// switches; restored after each test.
class GpuAttnMergeInOutTest : public ::testing::Test {
 protected:
  void SetUp() override {
    TANDEM_SKIP_WITHOUT_GPU();
    cuda::SetOldAttnSplit(false);
    cuda::SetAttnMergeInBlock(false);
    cuda::SetAttnShortKeys(cuda::kAttnShortKeysDefault);
  }
  attn_testing::AttnSwitchGuard guard_;
};

TEST_F(GpuAttnMergeInOutTest, ProductMergesAsTheMergeKernelDoes) {
  std::mt19937 rng = ::tandem::testing::SeededRng();
  for (const cuda::AttnShape& d : {kShape, kShape128}) {
    const MergeInOutFixture f(rng, d);
    const cuda::DeviceMatrix& m = f.g.m;
    ASSERT_TRUE(cuda::ColumnSplitMatVecFits(m));
    const int out_rows = static_cast<int>(m.rows);
    for (const int ctx : {1, 32, 33, 135, 1000, 4097}) {
      const std::string what = "hd=" + std::to_string(d.hd) + " ctx=" + std::to_string(ctx);
      DecodeCase c = MakeDecodeCase(rng, d, {0}, {ctx}, {1});
      const cuda::AttentionPlan plan = cuda::PlanAttention(c.token_seq, d);
      ASSERT_GT(plan.num_splits, 1) << what;
      const auto items = Upload(plan.items);
      const auto scratch = ZeroedScratch(plan.scratch_bytes);
      const std::vector<float> y0 = gpu_testing::Random(rng, static_cast<size_t>(out_rows));
      // The merge kernel, then the plain product.
      auto o = gpu_testing::Poisoned<float>(static_cast<size_t>(d.nh * d.hd));
      auto y_want = Upload(y0);
      TANDEM_ASSERT_CUDA(cuda::LaunchAttention(c.d_q.get(), c.d_qg.get(), 1, d, plan, items.get(), c.d_seq.get(),
                                               c.d_pos.get(), c.cache(), o.get(), scratch.get(), nullptr));
      TANDEM_ASSERT_CUDA(cuda::LaunchColumnSplitMatVec(m, o.get(), y_want.get(), nullptr));
      TANDEM_ASSERT_CUDA(cudaDeviceSynchronize());
      const std::vector<float> want = Download(y_want);
      // The merge left to the product.
      auto o2 = gpu_testing::Poisoned<float>(static_cast<size_t>(d.nh * d.hd));
      auto y_got = Upload(y0);
      cuda::AttnDeferredMerge merge;
      merge.splits = -1;  // overwritten
      TANDEM_ASSERT_CUDA(cuda::LaunchAttention(c.d_q.get(), c.d_qg.get(), 1, d, plan, items.get(), c.d_seq.get(),
                                               c.d_pos.get(), c.cache(), o2.get(), scratch.get(), nullptr, 0, &merge));
      EXPECT_EQ(merge.splits, plan.num_splits) << what;
      EXPECT_EQ(merge.short_keys, cuda::kAttnShortKeysDefault) << what;
      TANDEM_ASSERT_CUDA(cuda::LaunchColumnSplitMatVec(m, o2.get(), y_got.get(), nullptr, &merge));
      TANDEM_ASSERT_CUDA(cudaDeviceSynchronize());
      const std::vector<float> got = Download(y_got);
      ASSERT_TRUE(attn_testing::AllFinite(got)) << what;
      const double err = RelL2(got, want);
      EXPECT_LE(err, 1e-6) << what;
      std::printf(
          "o product merging the slices, %s (%d slices): y rel. L2 "
          "%.2e from the merge kernel's\n",
          what.c_str(), plan.num_splits, err);
    }
  }
}

// One graph (attention with its merge deferred, then the merging product) captured at 4 keys and
// replayed at contexts across the bound and long ones: y as the merge kernel then the plain
// product.
TEST_F(GpuAttnMergeInOutTest, CapturedGraphReplaysAtEveryContext) {
  std::mt19937 rng = ::tandem::testing::SeededRng();
  const MergeInOutFixture f(rng);
  const cuda::DeviceMatrix& m = f.g.m;
  DecodeCase c = MakeDecodeCase(rng, kShape, {0}, {8192}, {1});
  const cuda::AttentionPlan plan = cuda::PlanAttention(c.token_seq, kShape);
  ASSERT_GT(plan.num_splits, 1);
  const auto items = Upload(plan.items);
  const auto scratch = ZeroedScratch(cuda::AttentionMaxScratchBytes(kShape));
  auto o = gpu_testing::Poisoned<float>(static_cast<size_t>(kShape.nh * kShape.hd));
  auto y = gpu_testing::Poisoned<float>(static_cast<size_t>(m.rows));
  cudaStream_t stream;
  TANDEM_ASSERT_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  auto set_position = [&](int32_t pos) {
    c.token_pos = {pos};
    TANDEM_ASSERT_CUDA(cudaMemcpy(c.d_pos.get(), &pos, sizeof(pos), cudaMemcpyHostToDevice));
  };
  auto deferred = [&]() -> cudaError_t {
    if (cudaError_t e = cudaMemsetAsync(y.get(), 0, y.count * sizeof(float), stream); e != cudaSuccess) return e;
    cuda::AttnDeferredMerge merge;
    if (cudaError_t e = cuda::LaunchAttention(c.d_q.get(), c.d_qg.get(), 1, kShape, plan, items.get(), c.d_seq.get(),
                                              c.d_pos.get(), c.cache(), o.get(), scratch.get(), stream, 0, &merge);
        e != cudaSuccess) {
      return e;
    }
    if (merge.splits != plan.num_splits) return cudaErrorUnknown;
    return cuda::LaunchColumnSplitMatVec(m, o.get(), y.get(), stream, &merge);
  };
  auto merged_first = [&]() -> std::vector<float> {
    EXPECT_EQ(cudaMemsetAsync(y.get(), 0, y.count * sizeof(float), stream), cudaSuccess);
    EXPECT_EQ(cuda::LaunchAttention(c.d_q.get(), c.d_qg.get(), 1, kShape, plan, items.get(), c.d_seq.get(),
                                    c.d_pos.get(), c.cache(), o.get(), scratch.get(), stream),
              cudaSuccess);
    EXPECT_EQ(cuda::LaunchColumnSplitMatVec(m, o.get(), y.get(), stream), cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    return Download(y);
  };
  set_position(3);
  TANDEM_ASSERT_CUDA(deferred());  // one-time attributes outside the capture
  TANDEM_ASSERT_CUDA(cudaStreamSynchronize(stream));
  cudaGraph_t graph;
  TANDEM_ASSERT_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  const cudaError_t launched = deferred();
  TANDEM_ASSERT_CUDA(cudaStreamEndCapture(stream, &graph));
  TANDEM_ASSERT_CUDA(launched);
  cudaGraphExec_t exec;
  TANDEM_ASSERT_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  for (const int32_t pos : {3, 31, 32, 100, 1000, 4096, 8191}) {
    set_position(pos);
    const std::vector<float> want = merged_first();
    TANDEM_ASSERT_CUDA(cudaGraphLaunch(exec, stream));
    TANDEM_ASSERT_CUDA(cudaStreamSynchronize(stream));
    const std::vector<float> got = Download(y);
    ASSERT_TRUE(attn_testing::AllFinite(got)) << "pos " << pos;
    EXPECT_LE(RelL2(got, want), 1e-6) << "pos " << pos;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// Nothing deferred where the launch merges itself or has nothing to merge: several tokens, the
// merge in the block; and a merge the product refuses (o's columns not the heads', a missing
// pointer, more slices than the split kernel has).
TEST_F(GpuAttnMergeInOutTest, DefersOnlyOneTokenSplitSteps) {
  std::mt19937 rng = ::tandem::testing::SeededRng();
  const MergeInOutFixture f(rng);
  {  // two new tokens of one sequence: the merge kernel runs, nothing deferred
    DecodeCase c = MakeDecodeCase(rng, kShape, {0}, {300}, {2});
    const cuda::AttentionPlan plan = cuda::PlanAttention(c.token_seq, kShape);
    const auto items = Upload(plan.items);
    const auto scratch = ZeroedScratch(plan.scratch_bytes);
    auto o = gpu_testing::Poisoned<float>(static_cast<size_t>(c.n * kShape.nh * kShape.hd));
    cuda::AttnDeferredMerge merge;
    merge.splits = 7;
    TANDEM_ASSERT_CUDA(cuda::LaunchAttention(c.d_q.get(), c.d_qg.get(), c.n, kShape, plan, items.get(), c.d_seq.get(),
                                             c.d_pos.get(), c.cache(), o.get(), scratch.get(), nullptr, 0, &merge));
    TANDEM_ASSERT_CUDA(cudaDeviceSynchronize());
    EXPECT_EQ(merge.splits, 0) << "two tokens";
    EXPECT_TRUE(attn_testing::AllFinite(Download(o))) << "two tokens: o merged by the launch";
  }
  {  // the merge in the last slice block
    cuda::SetAttnMergeInBlock(true);
    cuda::SetOldAttnDecode(false);
    DecodeCase c = MakeDecodeCase(rng, kShape, {0}, {300}, {1});
    const cuda::AttentionPlan plan = cuda::PlanAttention(c.token_seq, kShape);
    const auto items = Upload(plan.items);
    const auto scratch = ZeroedScratch(plan.scratch_bytes);
    auto o = gpu_testing::Poisoned<float>(static_cast<size_t>(kShape.nh * kShape.hd));
    cuda::AttnDeferredMerge merge;
    TANDEM_ASSERT_CUDA(cuda::LaunchAttention(c.d_q.get(), c.d_qg.get(), 1, kShape, plan, items.get(), c.d_seq.get(),
                                             c.d_pos.get(), c.cache(), o.get(), scratch.get(), nullptr, 0, &merge));
    TANDEM_ASSERT_CUDA(cudaDeviceSynchronize());
    EXPECT_EQ(merge.splits, 0) << "in-block merge";
    EXPECT_TRUE(attn_testing::AllFinite(Download(o))) << "in-block merge: o written";
    cuda::SetAttnMergeInBlock(false);
  }
  const cuda::DeviceMatrix& m = f.g.m;
  const auto x = Upload(std::vector<float>(static_cast<size_t>(m.cols), 0.0f));
  auto y = Upload(std::vector<float>(static_cast<size_t>(m.rows), 0.0f));
  const auto any = Upload(std::vector<float>(16, 0.0f));
  const auto ints = Upload(std::vector<int32_t>{0, 1, 0});
  cuda::AttnDeferredMerge ok{
      any.get(), 2 * kShape.nh * kShape.hd, kShape.nh, kShape.kvh, ints.get(), ints.get(), 32, 4, any.get(), any.get()};
  struct Bad {
    cuda::AttnDeferredMerge merge;
    const char* why;
  };
  std::vector<Bad> bad;
  bad.push_back({ok, "8 heads for 16 super-blocks"});
  bad.back().merge.nh = 8;
  bad.back().merge.kvh = 1;
  bad.push_back({ok, "no partials"});
  bad.back().merge.part_o = nullptr;
  bad.push_back({ok, "no positions"});
  bad.back().merge.token_pos = nullptr;
  bad.push_back({ok, "more slices than the split kernel makes"});
  bad.back().merge.splits = 1 << 20;
  for (const Bad& b : bad) {
    EXPECT_EQ(cuda::LaunchColumnSplitMatVec(m, x.get(), y.get(), nullptr, &b.merge), cudaErrorInvalidValue) << b.why;
  }
}

}  // namespace
}  // namespace tandem
