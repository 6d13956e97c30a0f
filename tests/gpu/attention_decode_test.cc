// The attention layer's decode launches (attention.cuh, TANDEM_OLD_ATTN_DECODE): the one-launch
// q/k norm + RoPE + cache append against QueryNormRope + KvAppend (bit-identical q and cache, packed
// and stacked [q | k | v] rows), the split attention whose last slice block merges the slices
// against SplitAttention + SplitMerge (bit-identical o, 80B and small shapes, contexts 1 to 4097,
// batch 1 and 3 over a scrambled row list), and a captured graph replayed with growing contexts
// (the ticket counters are back at zero after every launch).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gpu_service/backends/cuda/kernels/attention.cuh"
#include "gtest/gtest.h"
#include "tests/gpu/attention_decode_util.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/test_seed.h"

namespace tandem {
namespace {

using gpu_testing::Alloc;
using gpu_testing::DeviceArray;
using gpu_testing::Download;
using gpu_testing::Poisoned;
using gpu_testing::Random;
using gpu_testing::Upload;
using attn_testing::AllFinite;
using attn_testing::DecodeCase;
using attn_testing::FirstDifference;
using attn_testing::MakeDecodeCase;
using attn_testing::SameBits;
using attn_testing::ShapeName;
using attn_testing::ZeroedScratch;

// Restores the process-wide switches when a test ends (tests flip OldAttnDecode to run both paths;
// the new path here includes the in-block merge, which is off by default).
// The split path at every context (TANDEM_OLD_ATTN_SPLIT): the short-context walk, which would
// take contexts up to AttnShortKeys() past both merges, is tested in attention_short_test.cc.
struct OldDecodeGuard : attn_testing::AttnSwitchGuard {
  OldDecodeGuard() {
    cuda::SetAttnMergeInBlock(true);
    cuda::SetOldAttnSplit(true);
  }
};

// The split tickets at the head of the scratch: zero between launches.
bool TicketsZero(const DeviceArray<uint8_t>& scratch) {
  std::vector<uint8_t> head(cuda::kAttnTicketBytes, 0xFF);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(head.data(), scratch.get(), head.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  return std::all_of(head.begin(), head.end(), [](uint8_t b) { return b == 0; });
}

class GpuAttentionDecodeTest : public attn_testing::AttentionShapeTest {};

// ---- q/k norm + RoPE + cache append in one launch ----

// Per token: n tokens over sequences `rows` (page-table rows), positions as given. Runs the two old
// kernels and the one new launch, from packed arrays and from stacked rows [qg | k | v | pad].
TEST_P(GpuAttentionDecodeTest, OnePrepMatchesQueryNormRopeAndKvAppendBits) {
  std::mt19937 rng = ::tandem::testing::SeededRng();
  const cuda::AttnShape d = shape();
  const int64_t qgw = static_cast<int64_t>(d.nh) * 2 * d.hd, kvw = d.kv_width();
  const int max_pages = 4, num_rows = 8, num_pages = max_pages * num_rows;
  std::vector<int32_t> physical(num_pages);
  std::iota(physical.begin(), physical.end(), 0);
  std::shuffle(physical.begin(), physical.end(), rng);
  const auto d_table = Upload(physical);  // row r, logical page i -> physical[r * max_pages + i]
  const auto d_inv = Upload(cuda::RopeInvFrequencies(1e7, d.rot));
  const auto d_qn = Upload(Random(rng, static_cast<size_t>(d.hd), 0.3f, 1.0f));
  const auto d_kn = Upload(Random(rng, static_cast<size_t>(d.hd), 0.3f, 1.0f));
  struct Step {
    std::vector<int32_t> seq, pos;
  };
  std::vector<Step> steps = {{{5}, {0}}, {{6, 1, 3}, {200, 63, 64}}};
  Step mixed;  // a prefill chunk of 70 tokens (row 2) and two decodes
  for (int t = 0; t < 70; ++t) mixed.seq.push_back(2), mixed.pos.push_back(100 + t);
  mixed.seq.push_back(7), mixed.pos.push_back(255);
  mixed.seq.push_back(0), mixed.pos.push_back(1);
  steps.push_back(mixed);
  for (const Step& st : steps) {
    const int64_t n = static_cast<int64_t>(st.seq.size());
    const std::vector<float> qg = Random(rng, static_cast<size_t>(n * qgw));
    const std::vector<float> k = Random(rng, static_cast<size_t>(n * kvw));
    const std::vector<float> v = Random(rng, static_cast<size_t>(n * kvw));
    const int64_t stride = qgw + 2 * kvw + 5;
    std::vector<float> stacked(static_cast<size_t>(n * stride), -3.0f);
    for (int64_t t = 0; t < n; ++t) {
      std::copy_n(qg.begin() + t * qgw, qgw, stacked.begin() + t * stride);
      std::copy_n(k.begin() + t * kvw, kvw, stacked.begin() + t * stride + qgw);
      std::copy_n(v.begin() + t * kvw, kvw, stacked.begin() + t * stride + qgw + kvw);
    }
    const auto d_qg = Upload(qg), d_k = Upload(k), d_v = Upload(v), d_stacked = Upload(stacked);
    const auto d_seq = Upload(st.seq), d_pos = Upload(st.pos);
    const size_t cache_floats = static_cast<size_t>(num_pages) * cuda::kKvPageSize * kvw;
    const std::vector<float> zeros(cache_floats, 0.0f);
    auto kc0 = Upload(zeros), vc0 = Upload(zeros);
    auto q0 = Poisoned<float>(static_cast<size_t>(n * d.nh * d.hd));
    TANDEM_ASSERT_CUDA(cuda::LaunchQueryNormRope(d_qg.get(), n, d, d_qn.get(), d_inv.get(), d_pos.get(), q0.get(),
                                                 nullptr));
    TANDEM_ASSERT_CUDA(cuda::LaunchKvAppend(d_k.get(), d_v.get(), n, d, d_kn.get(), d_inv.get(), d_seq.get(),
                                            d_pos.get(), cuda::PagedKv{kc0.get(), vc0.get(), d_table.get(), max_pages},
                                            nullptr));
    const std::vector<float> want_q = Download(q0), want_k = Download(kc0), want_v = Download(vc0);
    ASSERT_TRUE(AllFinite(want_q));
    EXPECT_NE(std::find(want_v.begin(), want_v.end(), v[0]), want_v.end());  // something was appended
    const cuda::QkvRows packed{d_qg.get(), 0, d_k.get(), 0, d_v.get(), 0};
    const cuda::QkvRows rows{d_stacked.get(), stride, d_stacked.get() + qgw, stride, d_stacked.get() + qgw + kvw,
                             stride};
    for (const cuda::QkvRows& in : {packed, rows}) {
      const std::string what = ShapeName(GetParam()) + " n=" + std::to_string(n) + (in.qg_stride ? " stacked" : " packed");
      auto kc1 = Upload(zeros), vc1 = Upload(zeros);
      auto q1 = Poisoned<float>(static_cast<size_t>(n * d.nh * d.hd));
      TANDEM_ASSERT_CUDA(cuda::LaunchQkvNormRopeAppend(in, n, d, d_qn.get(), d_kn.get(), d_inv.get(), d_seq.get(),
                                                       d_pos.get(), q1.get(),
                                                       cuda::PagedKv{kc1.get(), vc1.get(), d_table.get(), max_pages},
                                                       nullptr));
      const std::vector<float> got_q = Download(q1), got_k = Download(kc1), got_v = Download(vc1);
      EXPECT_TRUE(SameBits(got_q, want_q)) << what << ": q differs at " << FirstDifference(got_q, want_q);
      EXPECT_TRUE(SameBits(got_k, want_k)) << what << ": k cache differs at " << FirstDifference(got_k, want_k);
      EXPECT_TRUE(SameBits(got_v, want_v)) << what << ": v cache differs at " << FirstDifference(got_v, want_v);
    }
  }
  // Strides below the packed widths are refused.
  auto q1 = Alloc<float>(static_cast<size_t>(d.nh * d.hd));
  const auto d_seq = Upload(std::vector<int32_t>{0}), d_pos = Upload(std::vector<int32_t>{0});
  const cuda::QkvRows bad{q1.get(), qgw - 1, q1.get(), 0, q1.get(), 0};
  EXPECT_EQ(cuda::LaunchQkvNormRopeAppend(bad, 1, d, d_qn.get(), d_kn.get(), d_inv.get(), d_seq.get(), d_pos.get(),
                                          q1.get(), cuda::PagedKv{q1.get(), q1.get(), d_table.get(), max_pages},
                                          nullptr),
            cudaErrorInvalidValue);
}

// ---- Split attention with the merge in its last block ----

std::vector<float> RunAttention(const DecodeCase& c, const cuda::AttentionPlan& plan, const DeviceArray<int32_t>& items,
                                const DeviceArray<uint8_t>& scratch, bool old) {
  cuda::SetOldAttnDecode(old);
  return attn_testing::AttendPlanned(c, plan, items, scratch);
}

// Contexts 1, 63, 64, 65, 1000 and 4097 keys; batch 1, batch 3 over rows {6, 1, 3}, and a sequence
// with several new tokens (an item of more than one token where groups < 8).
TEST_P(GpuAttentionDecodeTest, MergedSlicesMatchSplitMergeBits) {
  OldDecodeGuard guard;
  std::mt19937 rng = ::tandem::testing::SeededRng();
  const cuda::AttnShape d = shape();
  const int groups = d.nh / d.kvh;
  struct Batch {
    std::vector<int32_t> rows;
    std::vector<int> ctx, fresh;
  };
  for (int ctx : {1, 63, 64, 65, 1000, 4097}) {
    const int few = std::min(ctx, 8 / groups + 1);
    for (const Batch& b : {Batch{{0}, {ctx}, {1}}, Batch{{6, 1, 3}, {ctx, std::max(1, ctx / 2), 65}, {1, 1, 1}},
                           Batch{{2}, {ctx}, {few}}}) {
      DecodeCase c = MakeDecodeCase(rng, d, b.rows, b.ctx, b.fresh);
      const cuda::AttentionPlan plan = cuda::PlanAttention(c.token_seq, d);
      ASSERT_GT(plan.num_row_items, 0);
      const std::string what = ShapeName(GetParam()) + " ctx=" + std::to_string(ctx) + " seqs=" +
                               std::to_string(b.rows.size()) + " n=" + std::to_string(c.n) + " splits=" +
                               std::to_string(plan.num_splits);
      EXPECT_GT(plan.num_splits, 1) << what;
      const auto items = Upload(plan.items);
      const auto scratch = ZeroedScratch(plan.scratch_bytes);
      const std::vector<float> want = RunAttention(c, plan, items, scratch, /*old=*/true);
      ASSERT_TRUE(AllFinite(want)) << what;
      for (int rep = 0; rep < 2; ++rep) {  // twice: the second launch starts from the reset tickets
        const std::vector<float> got = RunAttention(c, plan, items, scratch, /*old=*/false);
        EXPECT_TRUE(SameBits(got, want)) << what << " rep " << rep << ": o differs at " << FirstDifference(got, want);
        EXPECT_TRUE(TicketsZero(scratch)) << what << " rep " << rep;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, GpuAttentionDecodeTest, ::testing::ValuesIn(attn_testing::kDecodeShapes),
                         attn_testing::ShapeTestName);

// A batch-1 decode captured once as a graph (merge in the last block) and replayed three times
// with growing contexts (the positions and cache rewritten in device memory): each replay gives
// the bits of SplitAttention + SplitMerge run eagerly, and leaves the tickets at zero.
TEST(GpuAttentionDecodeGraphTest, ReplaysWithGrowingContextResetTheTickets) {
  TANDEM_SKIP_WITHOUT_GPU();
  OldDecodeGuard guard;
  std::mt19937 rng = ::tandem::testing::SeededRng();
  const cuda::AttnShape d{16, 2, 256, 64, 1e-6f};
  // One cache big enough for the longest context; shorter steps rewrite only the position.
  DecodeCase c = MakeDecodeCase(rng, d, {3}, {4097}, {1});
  const cuda::AttentionPlan plan = cuda::PlanAttention(c.token_seq, d);
  ASSERT_GT(plan.num_splits, 1);
  const auto items = Upload(plan.items);
  const auto scratch = ZeroedScratch(cuda::AttentionMaxScratchBytes(d));
  auto o = Poisoned<float>(static_cast<size_t>(c.n * d.nh * d.hd));
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  auto launch = [&] {
    return cuda::LaunchAttention(c.d_q.get(), c.d_qg.get(), c.n, d, plan, items.get(), c.d_seq.get(), c.d_pos.get(),
                                 c.cache(), o.get(), scratch.get(), stream);
  };
  cuda::SetOldAttnDecode(false);
  ASSERT_EQ(launch(), cudaSuccess);  // the kernels' one-time attributes, outside the capture
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  cudaGraph_t graph;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  const cudaError_t launched = launch();
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  ASSERT_EQ(launched, cudaSuccess);
  cudaGraphExec_t exec;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int32_t pos : {99, 1000, 4096}) {
    const std::vector<int32_t> p = {pos};
    ASSERT_EQ(cudaMemcpy(c.d_pos.get(), p.data(), sizeof(int32_t), cudaMemcpyHostToDevice), cudaSuccess);
    cuda::SetOldAttnDecode(true);
    ASSERT_EQ(launch(), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    const std::vector<float> want = Download(o);
    ASSERT_TRUE(AllFinite(want)) << "pos " << pos;
    ASSERT_EQ(cudaMemset(o.get(), 0xFF, o.count * sizeof(float)), cudaSuccess);
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    const std::vector<float> got = Download(o);
    EXPECT_TRUE(SameBits(got, want)) << "pos " << pos << ": o differs at " << FirstDifference(got, want);
    EXPECT_TRUE(TicketsZero(scratch)) << "pos " << pos;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace tandem
