// The planned attention paths (attention.cuh): the plan's items and counts, the exact split-KV
// kernel (decode and any few-token step, with and without context slices) against a double
// precision reference within 1e-5, the f16 tensor-core prefill within 1e-2, mixed steps, and a
// decode step captured as a CUDA graph replayed with new positions, pages and cache contents.
// The steps are attention_case.h's (random cache, NaN wherever no read may go); the wgmma and
// f16-tile prefill kernels are in attention_wgmma_test.cc.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "gpu_service/backends/cuda/kernels/attention.cuh"
#include "gtest/gtest.h"
#include "tests/gpu/attention_case.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/test_seed.h"

namespace tandem {
namespace {

using gpu_testing::Alloc;
using gpu_testing::Download;
using gpu_testing::Poisoned;
using gpu_testing::RelL2;
using gpu_testing::Upload;

using attn_testing::AttnCase;
using attn_testing::MakeCase;
using attn_testing::Reference;
using attn_testing::RunLegacy;
using attn_testing::RunPlanned;
using attn_testing::SeqStep;
using attn_testing::Shape;
using attn_testing::Tag;

// ---- The plan (host only) ----

TEST(AttentionPlanTest, ItemsCoverEveryTokenOnceWithinOneSequence) {
  const cuda::AttnShape d = Shape(256, 8, 2);
  // Sequence 0: 1 token; 1: 200 (prefill); 2: 3; 3: 64 (exactly the tensor-core threshold).
  std::vector<int32_t> token_seq;
  for (auto [seq, count] : std::vector<std::pair<int, int>>{{0, 1}, {1, 200}, {2, 3}, {3, 64}}) {
    token_seq.insert(token_seq.end(), count, seq);
  }
  for (auto precision : {cuda::AttentionPrecision::kF32, cuda::AttentionPrecision::kF16TensorCores}) {
    const cuda::AttentionPlan plan = cuda::PlanAttention(token_seq, d, precision);
    ASSERT_EQ(plan.items.size(), 2u * (plan.num_row_items + plan.num_tile_items));
    std::vector<int> seen(token_seq.size(), 0);
    for (int i = 0; i < plan.num_row_items + plan.num_tile_items; ++i) {
      const int32_t first = plan.items[2 * i], count = plan.items[2 * i + 1];
      ASSERT_GE(count, 1);
      EXPECT_LE(count, i < plan.num_row_items ? 8 / 8 : 128 / 8) << "item " << i;
      for (int32_t t = first; t < first + count; ++t) {
        ++seen[t];
        EXPECT_EQ(token_seq[t], token_seq[first]) << "item " << i << " spans sequences";
      }
    }
    for (size_t t = 0; t < seen.size(); ++t) EXPECT_EQ(seen[t], 1) << "token " << t;
    if (precision == cuda::AttentionPrecision::kF32) {
      EXPECT_EQ(plan.num_tile_items, 0);
      EXPECT_EQ(plan.items, cuda::PlanAttentionItems(token_seq, 8));
    } else {
      EXPECT_EQ(plan.num_row_items, 1 + 3);             // the short sequences
      EXPECT_EQ(plan.num_tile_items, (200 + 15) / 16 + 64 / 16);  // 16 tokens × 8 heads per tile
    }
  }
}

// Tile items fewer than half a wave are sliced (a 512-token prompt of Qwen3-Next: 32 items x 2 kv
// heads -> 2 slices each, 128 blocks); 1024 and 2048 tokens are not; max_tc_splits 1 turns it off; the scratch
// stays within AttentionMaxScratchBytes for every prompt length and batch mix.
TEST(AttentionPlanTest, TileSlicesFollowTheBatchShape) {
  const cuda::AttnShape d = Shape(256, 8, 2);
  const auto tc = cuda::AttentionPrecision::kF16TensorCores;
  const cuda::AttentionPlan p512 = cuda::PlanAttention(std::vector<int32_t>(512, 0), d, tc);
  EXPECT_EQ(p512.num_tile_items, 32);
  EXPECT_EQ(p512.tc_splits, 2);
  EXPECT_EQ(p512.scratch_bytes,
            cuda::kAttnTicketBytes + static_cast<size_t>(32 * 2 * 2) * 128 * (256 + 2) * sizeof(float));
  EXPECT_EQ(cuda::PlanAttention(std::vector<int32_t>(1024, 0), d, tc).tc_splits, 1);
  const cuda::AttentionPlan p2048 = cuda::PlanAttention(std::vector<int32_t>(2048, 0), d, tc);
  EXPECT_EQ(p2048.tc_splits, 1);
  EXPECT_EQ(p2048.scratch_bytes, 0u);
  const cuda::AttentionPlan off = cuda::PlanAttention(std::vector<int32_t>(512, 0), d, tc, 1);
  EXPECT_EQ(off.tc_splits, 1);
  EXPECT_EQ(off.scratch_bytes, 0u);
  EXPECT_EQ(off.items, p512.items);  // slicing changes the launch, never the items
  for (const cuda::AttnShape& s : {d, Shape(64, 1, 1), Shape(128, 4, 4), Shape(64, 2, 2)}) {
    for (int n = 64; n <= 4096; n += 61) {
      std::vector<int32_t> seqs(static_cast<size_t>(n), 0);
      seqs.push_back(1);  // and a decode beside it: row and tile partials share the scratch
      const cuda::AttentionPlan p = cuda::PlanAttention(seqs, s, tc);
      EXPECT_GE(p.tc_splits, 1);
      EXPECT_LE(p.tc_splits, cuda::kAttnMaxTcSplits);
      EXPECT_LE(p.scratch_bytes, cuda::AttentionMaxScratchBytes(s)) << n;
    }
  }
}

TEST(AttentionPlanTest, CountsDependOnlyOnTheBatchShape) {
  const cuda::AttnShape d = Shape(256, 8, 2);
  const cuda::AttentionPlan one = cuda::PlanAttention({5}, d);
  EXPECT_EQ(one.num_row_items, 1);
  EXPECT_GT(one.num_splits, 1);  // a single decode spreads its context over many blocks
  EXPECT_EQ(one.scratch_bytes,
            cuda::kAttnTicketBytes + static_cast<size_t>(one.num_splits) * 2 * 8 * (256 + 2) * sizeof(float));
  const cuda::AttentionPlan again = cuda::PlanAttention({9}, d);
  EXPECT_EQ(again.num_splits, one.num_splits);
  EXPECT_EQ(again.scratch_bytes, one.scratch_bytes);
  // Many sequences: enough blocks without splitting, no scratch.
  std::vector<int32_t> many(300);
  std::iota(many.begin(), many.end(), 0);
  const cuda::AttentionPlan big = cuda::PlanAttention(many, d);
  EXPECT_EQ(big.num_splits, 1);
  EXPECT_EQ(big.scratch_bytes, 0u);
  for (int b = 1; b <= 300; ++b) {
    std::vector<int32_t> seqs(static_cast<size_t>(b));
    std::iota(seqs.begin(), seqs.end(), 0);
    for (const cuda::AttnShape& s : {d, Shape(64, 1, 1), Shape(128, 4, 4)}) {
      EXPECT_LE(cuda::PlanAttention(seqs, s).scratch_bytes, cuda::AttentionMaxScratchBytes(s)) << b;
    }
  }
  EXPECT_TRUE(cuda::PlanAttention({0}, cuda::AttnShape{12, 2, 256, 64, 1e-6f}).items.empty());  // groups 6
  EXPECT_TRUE(cuda::PlanAttention({0}, Shape(96, 8, 2)).items.empty());                         // hd 96
}

// ---- The kernels (GPU) ----

struct KernelParam {
  int hd, groups, kvh;
};

class GpuAttentionFastTest : public ::testing::TestWithParam<KernelParam> {
 protected:
  void SetUp() override { TANDEM_SKIP_WITHOUT_GPU(); }
  cuda::AttnShape shape() const { return Shape(GetParam().hd, GetParam().groups, GetParam().kvh); }
};

// Decode-like steps: contexts of 1, 777 and 4100 positions (one token each), and a sequence with
// 8 / groups + 1 new tokens (two row items). Exact on the split path, the legacy path, and the
// fast plan (which keeps short sequences on the exact path).
TEST_P(GpuAttentionFastTest, SplitDecodeMatchesReference) {
  std::mt19937 rng(1234 + GetParam().hd + GetParam().groups);
  const cuda::AttnShape d = shape();
  const int extra = 8 / (d.nh / d.kvh) + 1;
  AttnCase c = MakeCase(rng, d, {{0, 1}, {776, 1}, {4099, 1}, {300, extra}}, 66);
  c.Upload();
  const std::vector<float> want = Reference(c);
  const cuda::AttentionPlan plan = cuda::PlanAttention(c.token_seq, d);
  EXPECT_GT(plan.num_splits, 1);
  EXPECT_LE(gpu_testing::LogError("attn_split_" + Tag(d), RelL2(RunPlanned(c, plan), want)), 1e-5);
  EXPECT_LE(gpu_testing::LogError("attn_legacy_" + Tag(d), RelL2(RunLegacy(c), want)), 1e-5);
  const cuda::AttentionPlan fast = cuda::PlanAttention(c.token_seq, d, cuda::AttentionPrecision::kF16TensorCores);
  EXPECT_EQ(fast.num_tile_items, 0);
  EXPECT_LE(gpu_testing::LogError("attn_fast_decode_" + Tag(d), RelL2(RunPlanned(c, fast), want)), 1e-5);
}

// A mixed step: a chunked prefill (200 tokens after 130 cached), a decode at position 500, and a
// prefill of 70 tokens from position 0. The fast plan puts both prefills on the tensor cores.
TEST_P(GpuAttentionFastTest, TensorCorePrefillMatchesReference) {
  std::mt19937 rng(99 + GetParam().hd + GetParam().groups);
  const cuda::AttnShape d = shape();
  AttnCase c = MakeCase(rng, d, {{130, 200}, {500, 1}, {0, 70}}, 9);
  c.Upload();
  const std::vector<float> want = Reference(c);
  const cuda::AttentionPlan exact = cuda::PlanAttention(c.token_seq, d);
  EXPECT_LE(gpu_testing::LogError("attn_prefill_f32_" + Tag(d), RelL2(RunPlanned(c, exact), want)), 1e-5);
  const cuda::AttentionPlan fast = cuda::PlanAttention(c.token_seq, d, cuda::AttentionPrecision::kF16TensorCores);
  EXPECT_EQ(fast.num_row_items, 1);
  EXPECT_GT(fast.num_tile_items, 0);
  EXPECT_GT(fast.tc_splits, 1);  // few tile items: their key tiles are cut into slices
  const std::vector<float> got = RunPlanned(c, fast);
  EXPECT_LE(gpu_testing::LogError("attn_prefill_f16tc_" + Tag(d), RelL2(got, want)), 1e-2);
  const cuda::AttentionPlan whole =
      cuda::PlanAttention(c.token_seq, d, cuda::AttentionPrecision::kF16TensorCores, /*max_tc_splits=*/1);
  EXPECT_EQ(whole.tc_splits, 1);
  EXPECT_LE(gpu_testing::LogError("attn_prefill_f16tc_whole_" + Tag(d), RelL2(RunPlanned(c, whole), want)), 1e-2);
  // The decode token (row 200) stays exact in fast mode.
  const size_t row = static_cast<size_t>(d.nh * d.hd);
  const std::vector<float> got_decode(got.begin() + 200 * row, got.begin() + 201 * row);
  const std::vector<float> want_decode(want.begin() + 200 * row, want.begin() + 201 * row);
  EXPECT_LE(RelL2(got_decode, want_decode), 1e-5);
}

// Prompts whose tile items are cut into key-tile slices (a fresh 512-token prompt, the 80B model's
// short-prefill case, and a 300-token chunk after 700 cached positions): the sliced plan, the whole
// plan and the reference agree; items that fit one slice are written by the same code either way.
TEST_P(GpuAttentionFastTest, SlicedTileItemsMatchWholeItems) {
  std::mt19937 rng(4242 + GetParam().hd + GetParam().groups);
  const cuda::AttnShape d = shape();
  for (const std::vector<SeqStep>& seqs : {std::vector<SeqStep>{{0, 512}}, std::vector<SeqStep>{{700, 300}}}) {
    AttnCase c = MakeCase(rng, d, seqs, 17);
    c.Upload();
    const std::vector<float> want = Reference(c);
    const cuda::AttentionPlan sliced = cuda::PlanAttention(c.token_seq, d, cuda::AttentionPrecision::kF16TensorCores);
    const cuda::AttentionPlan whole =
        cuda::PlanAttention(c.token_seq, d, cuda::AttentionPrecision::kF16TensorCores, /*max_tc_splits=*/1);
    EXPECT_EQ(whole.tc_splits, 1);
    EXPECT_EQ(whole.scratch_bytes, 0u);
    const std::string tag = Tag(d) + "_" + std::to_string(seqs[0].start) + "_" + std::to_string(seqs[0].n);
    const std::vector<float> got_sliced = RunPlanned(c, sliced);
    const std::vector<float> got_whole = RunPlanned(c, whole);
    EXPECT_LE(gpu_testing::LogError("attn_tc_sliced_" + tag, RelL2(got_sliced, want)), 1e-2);
    EXPECT_LE(gpu_testing::LogError("attn_tc_whole_" + tag, RelL2(got_whole, want)), 1e-2);
    EXPECT_LE(gpu_testing::LogError("attn_tc_sliced_vs_whole_" + tag, RelL2(got_sliced, got_whole)), 1e-2);
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, GpuAttentionFastTest,
                         ::testing::Values(KernelParam{256, 8, 2},  // Qwen3-Next
                                           KernelParam{128, 4, 2}, KernelParam{64, 2, 2}, KernelParam{64, 1, 4}),
                         [](const ::testing::TestParamInfo<KernelParam>& info) {
                           return "hd" + std::to_string(info.param.hd) + "_g" + std::to_string(info.param.groups) +
                                  "_kvh" + std::to_string(info.param.kvh);
                         });

// A batch-of-3 decode step captured once as a graph; replayed after overwriting positions, page
// table, items and cache contents in device memory with a different step of the same shape.
TEST(GpuAttentionGraphTest, ReplayReadsEveryStepValueFromDeviceMemory) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(7);
  const cuda::AttnShape d = Shape(256, 8, 2);
  AttnCase a = MakeCase(rng, d, {{100, 1}, {2000, 1}, {0, 1}}, 80);
  AttnCase b = MakeCase(rng, d, {{5000, 1}, {7, 1}, {64, 1}}, 80);
  a.Upload();
  const cuda::AttentionPlan plan_a = cuda::PlanAttention(a.token_seq, d);
  const cuda::AttentionPlan plan_b = cuda::PlanAttention(b.token_seq, d);
  ASSERT_EQ(plan_a.num_splits, plan_b.num_splits);
  ASSERT_EQ(plan_a.num_row_items, plan_b.num_row_items);
  auto d_items = Upload(plan_a.items);
  auto scratch = Alloc<uint8_t>(cuda::AttentionMaxScratchBytes(d));
  ASSERT_EQ(cudaMemset(scratch.get(), 0, cuda::AttentionMaxScratchBytes(d)), cudaSuccess);  // the split tickets
  auto d_o = Poisoned<float>(static_cast<size_t>(a.n * d.nh * d.hd));
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  // Instantiate the kernels' one-time attributes outside the capture.
  ASSERT_EQ(cuda::LaunchAttention(a.d_q.get(), a.d_qg.get(), a.n, d, plan_a, d_items.get(), a.d_seq.get(),
                                  a.d_pos.get(), a.cache(), d_o.get(), scratch.get(), stream),
            cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  cudaGraph_t graph;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  const cudaError_t launched = cuda::LaunchAttention(a.d_q.get(), a.d_qg.get(), a.n, d, plan_a, d_items.get(),
                                                     a.d_seq.get(), a.d_pos.get(), a.cache(), d_o.get(),
                                                     scratch.get(), stream);
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  ASSERT_EQ(launched, cudaSuccess);
  cudaGraphExec_t exec;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);

  ASSERT_EQ(cudaMemset(d_o.get(), 0xFF, d_o.count * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_LE(gpu_testing::LogError("attn_graph_step_a", RelL2(Download(d_o), Reference(a))), 1e-5);

  auto copy = [](auto& dst, const auto& src) {
    ASSERT_EQ(dst.count, src.size());
    ASSERT_EQ(cudaMemcpy(dst.get(), src.data(), src.size() * sizeof(src[0]), cudaMemcpyHostToDevice), cudaSuccess);
  };
  copy(a.d_k, b.k_pool);
  copy(a.d_v, b.v_pool);
  copy(a.d_q, b.q);
  copy(a.d_qg, b.qg);
  copy(a.d_seq, b.token_seq);
  copy(a.d_pos, b.token_pos);
  copy(a.d_table, b.page_table);
  copy(d_items, plan_b.items);
  ASSERT_EQ(cudaMemset(d_o.get(), 0xFF, d_o.count * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_LE(gpu_testing::LogError("attn_graph_step_b", RelL2(Download(d_o), Reference(b))), 1e-5);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace tandem
