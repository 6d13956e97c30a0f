// The split attention's stamped instantiation (kernels/attention_probe.h) computes what the kernel
// computes (o the same bits at 80B shapes, batch 1, contexts 544 and 4096: the merge in the last
// slice block as in decode steps), and every block stamps a row: its index, a real SM, its phases
// in order (slices past the context: no query or loop phases), exactly one merging block per kv
// head, and the slices' keys covering the context once. The armed form (rows taken from a buffer
// armed in stream order) likewise.
#include <cuda_runtime.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "gpu_service/backends/cuda/kernels/attention.cuh"
#include "gpu_service/backends/cuda/kernels/attention_probe.h"
#include "gtest/gtest.h"
#include "tests/armed_probe_check.h"
#include "tests/gpu/attention_decode_util.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/test_seed.h"

namespace tandem {
namespace {

using attn_testing::AttendPlanned;
using attn_testing::DecodeCase;
using attn_testing::MakeDecodeCase;
using attn_testing::ZeroedScratch;
using gpu_testing::Download;
using gpu_testing::Upload;

TEST(AttentionProbeTest, StampedKernelGivesTheSameOutputAndOrderedStamps) {
  TANDEM_SKIP_WITHOUT_GPU();
  int sms = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  std::mt19937 rng = ::tandem::testing::SeededRng();
  // The merge in the last slice block (no longer the default since 200b525), whose stamps the probe
  // also takes; the guard restores the switch.
  const attn_testing::AttnSwitchGuard guard;
  cuda::SetAttnMergeInBlock(true);
  const cuda::AttnShape d{16, 2, 256, 64, 1e-6f};
  for (const int ctx : {544, 4096}) {
    const std::string what = "ctx " + std::to_string(ctx);
    const DecodeCase c = MakeDecodeCase(rng, d, {0}, {ctx}, {1});
    const cuda::AttentionPlan plan = cuda::PlanAttention(c.token_seq, d, cuda::AttentionPrecision::kF32);
    ASSERT_GT(plan.num_splits, 1) << what;
    const auto items = Upload(plan.items);
    const auto scratch = ZeroedScratch(plan.scratch_bytes);
    const std::vector<float> want = AttendPlanned(c, plan, items, scratch);
    const int blocks = plan.num_row_items * d.kvh * plan.num_splits;
    auto rows = Upload(std::vector<unsigned long long>(static_cast<size_t>(blocks) * cuda::kAttnProbeWords, 0));
    cuda::SetSplitAttentionProbe(rows.get(), blocks);
    const std::vector<float> got = AttendPlanned(c, plan, items, scratch);
    cuda::SetSplitAttentionProbe(nullptr, 0);
    EXPECT_TRUE(gpu_testing::SameBits(got, want)) << what;
    const std::vector<unsigned long long> r = Download(rows);
    std::vector<int64_t> keys(static_cast<size_t>(d.kvh), 0);
    std::vector<int> merged(static_cast<size_t>(d.kvh), 0);
    for (int b = 0; b < blocks; ++b) {
      const unsigned long long* row = r.data() + static_cast<size_t>(b) * cuda::kAttnProbeWords;
      const int kvhead = (b / plan.num_row_items) % d.kvh;  // x: row item, y: kv head, z: slice
      EXPECT_EQ(row[cuda::kAttnProbeBlock], static_cast<unsigned long long>(b)) << what;
      EXPECT_LT(row[cuda::kAttnProbeSm], static_cast<unsigned long long>(sms)) << what << ", block " << b;
      keys[kvhead] += static_cast<int64_t>(row[cuda::kAttnProbeKeys]);
      merged[kvhead] += row[cuda::kAttnProbeMerged] != 0 ? 1 : 0;
      const bool has_keys = row[cuda::kAttnProbeKeys] > 0;
      std::vector<int> order = {cuda::kAttnProbeEntry, cuda::kAttnProbeAfterWait};
      if (has_keys) {
        order.insert(order.end(), {cuda::kAttnProbeQLoaded, cuda::kAttnProbeLoopDone, cuda::kAttnProbePartials});
      } else {
        EXPECT_EQ(row[cuda::kAttnProbeQLoaded], 0u) << what << ", block " << b;
      }
      order.push_back(cuda::kAttnProbeExit);
      for (size_t i = 0; i < order.size(); ++i) {
        EXPECT_NE(row[order[i]], 0u) << what << ", block " << b << ", phase " << order[i];
        if (i > 0) {
          EXPECT_LE(row[order[i - 1]], row[order[i]]) << what << ", block " << b << ", phase " << order[i];
        }
      }
    }
    for (int h = 0; h < d.kvh; ++h) {
      EXPECT_EQ(keys[h], ctx) << what << ", kv head " << h;
      EXPECT_EQ(merged[h], 1) << what << ", kv head " << h;
    }
  }
}

// The armed form (attention_probe.h: the step's launches captured before the buffer exists): with
// the step probed and a buffer armed, each block takes one row (every block index once, no row past
// the grid), the output is the same bits, and a disarmed buffer gets nothing more.
TEST(AttentionProbeTest, ArmedProbeStampsEveryBlockOnceAndChangesNothing) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng = ::tandem::testing::SeededRng();
  const attn_testing::AttnSwitchGuard guard;
  cuda::SetAttnMergeInBlock(true);
  const cuda::AttnShape d{16, 2, 256, 64, 1e-6f};
  const int ctx = 544;
  const DecodeCase c = MakeDecodeCase(rng, d, {0}, {ctx}, {1});
  const cuda::AttentionPlan plan = cuda::PlanAttention(c.token_seq, d, cuda::AttentionPrecision::kF32);
  ASSERT_GT(plan.num_splits, 1);
  const auto items = Upload(plan.items);
  const auto scratch = ZeroedScratch(plan.scratch_bytes);
  const std::vector<float> want = AttendPlanned(c, plan, items, scratch);
  const int blocks = plan.num_row_items * d.kvh * plan.num_splits;
  const size_t capacity = static_cast<size_t>(2 * blocks);  // room for a second launch's rows
  auto rows = Upload(std::vector<unsigned long long>(capacity * cuda::kAttnProbeWords, 0));
  std::vector<float> got, after;
  {
    const ::tandem::testing::ScopedProbeDecodeStep probed(true);
    ASSERT_EQ(cuda::SetArmedSplitAttentionProbe(rows.get(), static_cast<unsigned>(capacity), nullptr), cudaSuccess);
    got = AttendPlanned(c, plan, items, scratch);
    ASSERT_EQ(cuda::SetArmedSplitAttentionProbe(nullptr, 0, nullptr), cudaSuccess);
    after = AttendPlanned(c, plan, items, scratch);  // disarmed: no rows
  }
  EXPECT_TRUE(gpu_testing::SameBits(got, want));
  EXPECT_TRUE(gpu_testing::SameBits(after, want));
  int64_t keys = 0;
  ::tandem::testing::ExpectEveryBlockOnce(
      Download(rows), cuda::kAttnProbeWords, blocks,
      [](const unsigned long long* row) { return row[cuda::kAttnProbeBlock]; },
      [&keys](int b, const unsigned long long* row) {
        keys += static_cast<int64_t>(row[cuda::kAttnProbeKeys]);
        EXPECT_NE(row[cuda::kAttnProbeEntry], 0u) << "block " << b;
        EXPECT_LE(row[cuda::kAttnProbeEntry], row[cuda::kAttnProbeExit]) << "block " << b;
        if (row[cuda::kAttnProbeKeys] > 0) {
          EXPECT_LE(row[cuda::kAttnProbeAfterWait], row[cuda::kAttnProbeQLoaded]) << "block " << b;
          EXPECT_LE(row[cuda::kAttnProbeQLoaded], row[cuda::kAttnProbeLoopDone]) << "block " << b;
          EXPECT_LE(row[cuda::kAttnProbeLoopDone], row[cuda::kAttnProbePartials]) << "block " << b;
          EXPECT_LE(row[cuda::kAttnProbePartials], row[cuda::kAttnProbeExit]) << "block " << b;
        }
      });
  EXPECT_EQ(keys, static_cast<int64_t>(ctx) * d.kvh);  // the slices cover the context once a kv head
}

}  // namespace
}  // namespace tandem
