// Decode attention in one launch (attention_decode.cuh) against the launches it replaces
// (QueryNormRope + KvAppend + LaunchAttention, from the same stacked [q | k | v] rows): the same
// cache rows and the same o, bit for bit, for the 80B and small head shapes, contexts 1 to 2100
// (the short-context walk and the split path, with the split forced at every context too), batch 1
// and 3 over a scrambled row list, and items of several new tokens (drafts); the ticket counters
// back at zero after every launch; and the plans it refuses. Also the split attention's keys copied
// before its PDL wait (TANDEM_OLD_ATTN_EARLY_KV) against after it: the same bits.
#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "gpu_service/backends/cuda/kernels/attention.cuh"
#include "gpu_service/backends/cuda/kernels/attention_decode.cuh"
#include "gtest/gtest.h"
#include "tests/gpu/attention_decode_util.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/test_seed.h"

namespace tandem {
namespace {

using attn_testing::DecodeCase;
using attn_testing::FirstDifference;
using attn_testing::MakeDecodeCase;
using attn_testing::SameBits;
using attn_testing::ShapeName;
using attn_testing::ZeroedScratch;
using gpu_testing::DeviceArray;
using gpu_testing::Download;
using gpu_testing::Poisoned;
using gpu_testing::Random;
using gpu_testing::Upload;

class GpuAttentionFusedTest : public attn_testing::AttentionShapeTest {};

// The norms' weights and RoPE frequencies of one layer.
struct NormWeights {
  DeviceArray<float> q_norm, k_norm;
  DeviceArray<double> inv_freq;
};

NormWeights MakeNorms(std::mt19937& rng, const cuda::AttnShape& d) {
  return NormWeights{Upload(Random(rng, static_cast<size_t>(d.hd), 0.3f, 1.0f)),
                     Upload(Random(rng, static_cast<size_t>(d.hd), 0.3f, 1.0f)),
                     Upload(cuda::RopeInvFrequencies(1e7, d.rot))};
}

// Runs the three old launches and the fused one on copies of c's cache from the same random
// stacked rows [qg | k | v | pad]; expects bit-identical o and cache pools, and zero tickets.
void ExpectFusedMatches(const DecodeCase& c, const NormWeights& w, std::mt19937& rng, const std::string& what) {
  const cuda::AttnShape& d = c.d;
  const int64_t n = c.n, qgw = static_cast<int64_t>(d.nh) * 2 * d.hd, kvw = d.kv_width();
  const int64_t stride = qgw + 2 * kvw + 3;
  const auto d_rows = Upload(Random(rng, static_cast<size_t>(n * stride)));
  const float* rows = d_rows.get();
  const cuda::AttentionPlan plan = cuda::PlanAttention(c.token_seq, d);
  ASSERT_TRUE(cuda::DecodeAttentionFits(plan, d)) << what;
  const auto d_items = Upload(plan.items);
  const DeviceArray<uint8_t> scratch = ZeroedScratch(cuda::AttentionMaxScratchBytes(d));
  const std::vector<float> k_pool = Download(c.d_k), v_pool = Download(c.d_v);

  auto k0 = Upload(k_pool), v0 = Upload(v_pool);
  const cuda::PagedKv cache0{k0.get(), v0.get(), c.d_table.get(), c.max_pages};
  auto q = Poisoned<float>(static_cast<size_t>(n * d.nh * d.hd));
  auto o0 = Poisoned<float>(static_cast<size_t>(n * d.nh * d.hd));
  TANDEM_ASSERT_CUDA(cuda::LaunchQueryNormRope(rows, n, d, w.q_norm.get(), w.inv_freq.get(), c.d_pos.get(), q.get(),
                                               nullptr, stride));
  TANDEM_ASSERT_CUDA(cuda::LaunchKvAppend(rows + qgw, rows + qgw + kvw, n, d, w.k_norm.get(), w.inv_freq.get(),
                                          c.d_seq.get(), c.d_pos.get(), cache0, nullptr, stride));
  TANDEM_ASSERT_CUDA(cuda::LaunchAttention(q.get(), rows, n, d, plan, d_items.get(), c.d_seq.get(), c.d_pos.get(),
                                           cache0, o0.get(), scratch.get(), nullptr, stride));

  auto k1 = Upload(k_pool), v1 = Upload(v_pool);
  const cuda::PagedKv cache1{k1.get(), v1.get(), c.d_table.get(), c.max_pages};
  auto o1 = Poisoned<float>(static_cast<size_t>(n * d.nh * d.hd));
  const cuda::QkvRows qkv{rows, stride, rows + qgw, stride, rows + qgw + kvw, stride};
  TANDEM_ASSERT_CUDA(cuda::LaunchDecodeAttention(qkv, n, d, w.q_norm.get(), w.k_norm.get(), w.inv_freq.get(), plan,
                                                 d_items.get(), c.d_seq.get(), c.d_pos.get(), cache1, o1.get(),
                                                 scratch.get(), nullptr));
  TANDEM_ASSERT_CUDA(cudaDeviceSynchronize());
  const std::vector<float> want_o = Download(o0), got_o = Download(o1);
  const std::vector<float> want_k = Download(k0), got_k = Download(k1), want_v = Download(v0), got_v = Download(v1);
  ASSERT_TRUE(attn_testing::AllFinite(want_o)) << what;
  EXPECT_FALSE(SameBits(want_k, k_pool)) << what << ": the old launches appended nothing";
  EXPECT_TRUE(SameBits(got_o, want_o)) << what << ": o differs at " << FirstDifference(got_o, want_o);
  EXPECT_TRUE(SameBits(got_k, want_k)) << what << ": k cache differs at " << FirstDifference(got_k, want_k);
  EXPECT_TRUE(SameBits(got_v, want_v)) << what << ": v cache differs at " << FirstDifference(got_v, want_v);
  std::vector<uint8_t> tickets(cuda::kAttnTicketBytes, 0xFF);
  TANDEM_ASSERT_CUDA(cudaMemcpy(tickets.data(), scratch.get(), tickets.size(), cudaMemcpyDeviceToHost));
  EXPECT_TRUE(std::all_of(tickets.begin(), tickets.end(), [](uint8_t b) { return b == 0; })) << what;
}

// Batch 1 at contexts across the short-walk bound and the slice sizes, batch 3 with different
// contexts, and drafts (8 / groups new tokens of one sequence in one item); each with the default
// split choice and with the split forced at every context (TANDEM_OLD_ATTN_SPLIT).
TEST_P(GpuAttentionFusedTest, MatchesTheLaunchesItReplacesBits) {
  std::mt19937 rng = ::tandem::testing::SeededRng();
  const cuda::AttnShape d = shape();
  const NormWeights w = MakeNorms(rng, d);
  const int draft = 8 / (d.nh / d.kvh);
  attn_testing::AttnSwitchGuard guard;
  for (bool split_always : {false, true}) {
    cuda::SetOldAttnSplit(split_always);
    const std::string mode = ShapeName(GetParam()) + (split_always ? " split always" : " default split");
    for (int ctx : {1, 2, 31, 33, 100, 256, 257, 600, 2100}) {
      const DecodeCase c = MakeDecodeCase(rng, d, {3}, {ctx}, {1});
      ExpectFusedMatches(c, w, rng, mode + " batch 1 ctx " + std::to_string(ctx));
    }
    const DecodeCase batch3 = MakeDecodeCase(rng, d, {5, 0, 2}, {700, 1, 130}, {1, 1, 1});
    ExpectFusedMatches(batch3, w, rng, mode + " batch 3");
    const DecodeCase drafts = MakeDecodeCase(rng, d, {1, 4}, {300, std::max(draft, 40)}, {draft, draft});
    ExpectFusedMatches(drafts, w, rng, mode + " drafts of " + std::to_string(draft));
    const DecodeCase short_draft = MakeDecodeCase(rng, d, {2}, {draft}, {draft});  // every key is new
    ExpectFusedMatches(short_draft, w, rng, mode + " a draft from position 0");
  }
}

// The split attention with the cached keys copied into its ring before the PDL wait (the default
// for one-item-a-sequence plans) against every key copied after it (TANDEM_OLD_ATTN_EARLY_KV):
// the same values in the same slots, the same bits, for the contexts and batches above, with the
// merge launch and the in-block merge.
TEST_P(GpuAttentionFusedTest, EarlyKeysGiveTheSameBits) {
  std::mt19937 rng = ::tandem::testing::SeededRng();
  const cuda::AttnShape d = shape();
  const int draft = 8 / (d.nh / d.kvh);
  attn_testing::AttnSwitchGuard guard;
  std::vector<DecodeCase> cases;
  for (int ctx : {1, 33, 257, 600, 2100}) cases.push_back(MakeDecodeCase(rng, d, {3}, {ctx}, {1}));
  cases.push_back(MakeDecodeCase(rng, d, {5, 0, 2}, {700, 1, 130}, {1, 1, 1}));
  cases.push_back(MakeDecodeCase(rng, d, {1, 4}, {300, std::max(draft, 40)}, {draft, draft}));
  for (bool split_always : {false, true}) {
    for (bool in_block : {false, true}) {
      cuda::SetOldAttnSplit(split_always);
      cuda::SetAttnMergeInBlock(in_block);
      cuda::SetOldAttnDecode(!in_block);  // the in-block merge needs the one-launch prep's flag
      for (const DecodeCase& c : cases) {
        const cuda::AttentionPlan plan = cuda::PlanAttention(c.token_seq, d);
        ASSERT_TRUE(plan.one_item_per_sequence);
        const auto d_items = Upload(plan.items);
        const DeviceArray<uint8_t> scratch = ZeroedScratch(cuda::AttentionMaxScratchBytes(d));
        std::vector<float> out[2];
        for (int early = 0; early < 2; ++early) {
          cuda::SetOldAttnEarlyKv(early == 0);
          auto o = Poisoned<float>(static_cast<size_t>(c.n * d.nh * d.hd));
          TANDEM_ASSERT_CUDA(cuda::LaunchAttention(c.d_q.get(), c.d_qg.get(), c.n, d, plan, d_items.get(),
                                                   c.d_seq.get(), c.d_pos.get(), c.cache(), o.get(), scratch.get(),
                                                   nullptr));
          out[early] = Download(o);
        }
        const std::string what = ShapeName(GetParam()) + " n=" + std::to_string(c.n) + " pos " +
                                 std::to_string(c.token_pos.back()) + (split_always ? " split always" : "") +
                                 (in_block ? " in-block merge" : "");
        ASSERT_TRUE(attn_testing::AllFinite(out[0])) << what;
        EXPECT_TRUE(SameBits(out[1], out[0])) << what << ": differs at " << FirstDifference(out[1], out[0]);
      }
    }
  }
}

// Plans it refuses: a sequence whose tokens fill two row items, and tensor-core tile items.
TEST_P(GpuAttentionFusedTest, RefusesPlansWithSeveralItemsASequence) {
  const cuda::AttnShape d = shape();
  const int per_item = 8 / (d.nh / d.kvh);
  std::vector<int32_t> seq(static_cast<size_t>(per_item) + 1, 0);
  const cuda::AttentionPlan two_items = cuda::PlanAttention(seq, d);
  EXPECT_EQ(two_items.num_row_items, 2);
  EXPECT_FALSE(cuda::DecodeAttentionFits(two_items, d));
  const cuda::AttentionPlan tiles =
      cuda::PlanAttention(std::vector<int32_t>(cuda::kAttnTensorCoreMinTokens, 0), d,
                          cuda::AttentionPrecision::kF16TensorCores);
  EXPECT_FALSE(cuda::DecodeAttentionFits(tiles, d));
  EXPECT_TRUE(cuda::DecodeAttentionFits(cuda::PlanAttention({0, 1, 2}, d), d));
  auto buf = gpu_testing::Alloc<float>(static_cast<size_t>(per_item + 1) * d.nh * 2 * d.hd);
  const auto d_seq = Upload(seq), d_pos = Upload(std::vector<int32_t>(seq.size(), 0));
  const auto d_items = Upload(two_items.items);
  const cuda::QkvRows rows{buf.get(), 0, buf.get(), 0, buf.get(), 0};
  const cuda::PagedKv cache{buf.get(), buf.get(), d_seq.get(), 1};
  EXPECT_EQ(cuda::LaunchDecodeAttention(rows, static_cast<int64_t>(seq.size()), d, buf.get(), buf.get(), nullptr,
                                        two_items, d_items.get(), d_seq.get(), d_pos.get(), cache, buf.get(), nullptr,
                                        nullptr),
            cudaErrorInvalidValue);
}

INSTANTIATE_TEST_SUITE_P(Shapes, GpuAttentionFusedTest, ::testing::ValuesIn(attn_testing::kDecodeShapes),
                         attn_testing::ShapeTestName);

}  // namespace
}  // namespace tandem
