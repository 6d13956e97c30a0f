// Short decode contexts in one block (attention.cuh, AttnShortKeys / TANDEM_OLD_ATTN_SPLIT): a row
// item of at most AttnShortKeys() keys is walked whole by its first slice block, which writes o;
// the other slices and the merge exit at once. Against the split + merge path (bit-identical up to
// 32 keys and above the bound, in between within 1e-6 relative L2 per token up to 1024 keys and 2e-6
// above: ExpectMatchesSplit) and a host reference in double, for contexts 1 to 8192, batch 1 and 3
// over a scrambled row list and a sequence with several new tokens, with the merge launch and the
// in-block merge; and a graph captured at a short context replayed with contexts growing past the
// bound.
#include <algorithm>
#include <cmath>
#include <cstdio>
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

using attn_testing::AllFinite;
using attn_testing::DecodeCase;
using attn_testing::FirstDifference;
using attn_testing::AttendPlanned;
using attn_testing::MakeDecodeCase;
using attn_testing::ShapeName;
using attn_testing::ZeroedScratch;
using gpu_testing::DeviceArray;
using gpu_testing::Download;
using gpu_testing::Poisoned;
using gpu_testing::RelL2;
using gpu_testing::Upload;


// The merge mode of the split path: the merge launch (the default) or the last slice block
// (TANDEM_ATTN_MERGE_IN_BLOCK=1, which needs the one-launch prep: OldAttnDecode() false).
void SetMergeInBlock(bool on) {
  cuda::SetAttnMergeInBlock(on);
  cuda::SetOldAttnDecode(!on);
}

// o in double from the device's own inputs: softmax over positions <= token_pos of <q, K>/sqrt(hd),
// times V, times sigma(gate).
std::vector<float> HostReference(const DecodeCase& c) {
  const cuda::AttnShape& d = c.d;
  const std::vector<float> q = Download(c.d_q), qg = Download(c.d_qg), kp = Download(c.d_k), vp = Download(c.d_v);
  const std::vector<int32_t> table = Download(c.d_table);
  const int kvw = d.kv_width(), groups = d.nh / d.kvh;
  std::vector<float> o(static_cast<size_t>(c.n) * d.nh * d.hd);
  std::vector<double> p, acc(static_cast<size_t>(d.hd));
  for (int64_t t = 0; t < c.n; ++t) {
    const int32_t seq = c.token_seq[t], pos = c.token_pos[t];
    auto row_of = [&](int j) {
      const int64_t page = table[static_cast<int64_t>(seq) * c.max_pages + j / cuda::kKvPageSize];
      return (page * cuda::kKvPageSize + j % cuda::kKvPageSize) * kvw;
    };
    for (int h = 0; h < d.nh; ++h) {
      const float* qh = q.data() + (t * d.nh + h) * d.hd;
      const int64_t head_off = static_cast<int64_t>(h / groups) * d.hd;
      p.assign(static_cast<size_t>(pos) + 1, 0.0);
      double mx = -INFINITY;
      for (int j = 0; j <= pos; ++j) {
        const float* k = kp.data() + row_of(j) + head_off;
        double s = 0.0;
        for (int i = 0; i < d.hd; ++i) s += static_cast<double>(qh[i]) * k[i];
        p[j] = s / std::sqrt(static_cast<double>(d.hd));
        mx = std::max(mx, p[j]);
      }
      double sum = 0.0;
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int j = 0; j <= pos; ++j) {
        const double w = std::exp(p[j] - mx);
        sum += w;
        const float* v = vp.data() + row_of(j) + head_off;
        for (int i = 0; i < d.hd; ++i) acc[i] += w * v[i];
      }
      const float* gate = qg.data() + (t * d.nh + h) * 2 * d.hd + d.hd;
      for (int i = 0; i < d.hd; ++i) {
        o[(t * d.nh + h) * d.hd + i] =
            static_cast<float>(acc[i] / sum / (1.0 + std::exp(-static_cast<double>(gate[i]))));
      }
    }
  }
  return o;
}

// The context of each token's row item (its last token's position + 1), from the plan's row items.
std::vector<int64_t> ItemContexts(const cuda::AttentionPlan& plan, const std::vector<int32_t>& token_pos) {
  std::vector<int64_t> ctx(token_pos.size(), 0);
  for (int i = 0; i < plan.num_row_items; ++i) {
    const int32_t first = plan.items[2 * i], count = plan.items[2 * i + 1];
    for (int32_t t = first; t < first + count; ++t) ctx[t] = static_cast<int64_t>(token_pos[first + count - 1]) + 1;
  }
  return ctx;
}

// got (short path at `bound`) against want (split path), token by token: the same bits where the
// token's item has at most 32 keys or more than `bound` (the same sums in the same order), else
// within 1e-6 relative L2 over the token's nh·hd outputs up to 1024 keys and 2e-6 above (only with
// the bound forced up: each warp of the whole walk accumulates ctx / 8 keys in sequence against
// ctx / 528 per warp in the split path, so its rounding grows with sqrt(ctx); an f32 emulation of
// both paths' operations gave 1.8e-7 at 256 keys, 2.7e-7 at 1000, 6.8e-7 at 8192). Returns the
// tokens that were bit-equal.
int ExpectMatchesSplit(const std::vector<float>& got, const std::vector<float>& want, const std::vector<int64_t>& ctx,
                       int64_t bound, int row_floats, const std::string& what) {
  int equal = 0;
  for (size_t t = 0; t < ctx.size(); ++t) {
    const std::vector<float> g(got.begin() + t * row_floats, got.begin() + (t + 1) * row_floats);
    const std::vector<float> w(want.begin() + t * row_floats, want.begin() + (t + 1) * row_floats);
    const bool same_sums = ctx[t] <= 32 || ctx[t] > bound;
    if (attn_testing::SameBits(g, w)) ++equal;
    if (same_sums) {
      EXPECT_TRUE(attn_testing::SameBits(g, w))
          << what << " token " << t << " (ctx " << ctx[t] << "): differs at " << FirstDifference(g, w);
    } else {
      EXPECT_LE(RelL2(g, w), ctx[t] <= 1024 ? 1e-6 : 2e-6) << what << " token " << t << " (ctx " << ctx[t] << ")";
    }
  }
  return equal;
}

class GpuAttentionShortTest : public attn_testing::AttentionShapeTest {};

// Contexts 1, 31, 32, 33, 135, 1000, 4097 and 8192; batch 1, batch 3 over rows {6, 1, 3} (contexts
// ctx, ctx / 2, 65: items on both sides of the bound in one launch) and a sequence with several new
// tokens; the bound at its default and at 8192 (every context walked whole); the merge launch and
// the in-block merge for the split path.
TEST_P(GpuAttentionShortTest, WholeContextMatchesSplitPathAndReference) {
  attn_testing::AttnSwitchGuard guard;
  std::mt19937 rng = ::tandem::testing::SeededRng();
  const cuda::AttnShape d = shape();
  const int groups = d.nh / d.kvh, row_floats = d.nh * d.hd;
  struct Batch {
    std::vector<int32_t> rows;
    std::vector<int> ctx, fresh;
  };
  for (int ctx : {1, 31, 32, 33, 135, 1000, 4097, 8192}) {
    const int few = std::min(ctx, 8 / groups + 1);
    for (const Batch& b : {Batch{{0}, {ctx}, {1}}, Batch{{6, 1, 3}, {ctx, std::max(1, ctx / 2), 65}, {1, 1, 1}},
                           Batch{{2}, {ctx}, {few}}}) {
      DecodeCase c = MakeDecodeCase(rng, d, b.rows, b.ctx, b.fresh);
      const cuda::AttentionPlan plan = cuda::PlanAttention(c.token_seq, d);
      const std::string what = ShapeName(GetParam()) + " ctx=" + std::to_string(ctx) + " seqs=" +
                               std::to_string(b.rows.size()) + " n=" + std::to_string(c.n) + " splits=" +
                               std::to_string(plan.num_splits);
      ASSERT_GT(plan.num_row_items, 0) << what;
      EXPECT_GT(plan.num_splits, 1) << what;
      const auto items = Upload(plan.items);
      const auto scratch = ZeroedScratch(plan.scratch_bytes);
      const std::vector<int64_t> item_ctx = ItemContexts(plan, c.token_pos);
      const std::vector<float> ref = HostReference(c);
      for (int in_block = 0; in_block < 2; ++in_block) {
        SetMergeInBlock(in_block == 1);
        cuda::SetOldAttnSplit(true);
        const std::vector<float> want = AttendPlanned(c, plan, items, scratch);
        ASSERT_TRUE(AllFinite(want)) << what;
        for (int bound : {cuda::kAttnShortKeysDefault, 8192}) {
          cuda::SetOldAttnSplit(false);
          cuda::SetAttnShortKeys(bound);
          const std::string tag = what + " bound=" + std::to_string(bound) + (in_block ? " in-block" : " merge-launch");
          const std::vector<float> got = AttendPlanned(c, plan, items, scratch);
          ASSERT_TRUE(AllFinite(got)) << tag;
          const int equal = ExpectMatchesSplit(got, want, item_ctx, bound, row_floats, tag);
          const double err = RelL2(got, ref), err_split = RelL2(want, ref);
          EXPECT_LE(err, 1e-5) << tag;
          std::printf("%s: %d/%lld tokens bit-equal to the split path; rel L2 vs host %.2e (split path %.2e)\n",
                      tag.c_str(), equal, static_cast<long long>(c.n), err, err_split);
          if (in_block == 1) {  // the in-block merge's tickets are left at zero (short items take none)
            std::vector<uint8_t> head(cuda::kAttnTicketBytes, 0xFF);
            ASSERT_EQ(cudaMemcpy(head.data(), scratch.get(), head.size(), cudaMemcpyDeviceToHost), cudaSuccess);
            EXPECT_TRUE(std::all_of(head.begin(), head.end(), [](uint8_t x) { return x == 0; })) << tag;
          }
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, GpuAttentionShortTest, ::testing::ValuesIn(attn_testing::kDecodeShapes),
                         attn_testing::ShapeTestName);

// A decode step captured once as a graph at a short context (batch 1, and batch 3 over rows
// {6, 1, 3}), replayed with contexts growing past the bound (positions rewritten in device memory):
// each replay gives the bits of the same launch made eagerly, and matches the split path as above.
TEST(GpuAttentionShortGraphTest, ReplaysAcrossTheBound) {
  TANDEM_SKIP_WITHOUT_GPU();
  attn_testing::AttnSwitchGuard guard;
  std::mt19937 rng = ::tandem::testing::SeededRng();
  const cuda::AttnShape d{16, 2, 256, 64, 1e-6f};
  const int bound = cuda::kAttnShortKeysDefault, row_floats = d.nh * d.hd;
  for (const std::vector<int32_t>& rows : {std::vector<int32_t>{3}, std::vector<int32_t>{6, 1, 3}}) {
    // One cache big enough for the longest context; later steps rewrite only the positions.
    DecodeCase c = MakeDecodeCase(rng, d, rows, std::vector<int>(rows.size(), 8192), std::vector<int>(rows.size(), 1));
    const cuda::AttentionPlan plan = cuda::PlanAttention(c.token_seq, d);
    ASSERT_GT(plan.num_splits, 1);
    const auto items = Upload(plan.items);
    const auto scratch = ZeroedScratch(cuda::AttentionMaxScratchBytes(d));
    auto o = Poisoned<float>(static_cast<size_t>(c.n * row_floats));
    cudaStream_t stream;
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    auto set_positions = [&](int32_t pos) {  // sequence i at pos - 40·i (at least 0): items either side
      std::vector<int32_t> p(rows.size());
      for (size_t i = 0; i < rows.size(); ++i) p[i] = std::max<int32_t>(0, pos - 40 * static_cast<int32_t>(i));
      c.token_pos = p;
      ASSERT_EQ(cudaMemcpy(c.d_pos.get(), p.data(), p.size() * sizeof(int32_t), cudaMemcpyHostToDevice), cudaSuccess);
    };
    auto launch = [&] {
      return cuda::LaunchAttention(c.d_q.get(), c.d_qg.get(), c.n, d, plan, items.get(), c.d_seq.get(), c.d_pos.get(),
                                   c.cache(), o.get(), scratch.get(), stream);
    };
    auto result = [&] {
      EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      return Download(o);
    };
    cuda::SetOldAttnSplit(false);
    cuda::SetAttnShortKeys(bound);
    set_positions(4);
    ASSERT_EQ(launch(), cudaSuccess);  // the kernels' one-time attributes, outside the capture
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    cudaGraph_t graph;
    ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    const cudaError_t launched = launch();
    ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
    ASSERT_EQ(launched, cudaSuccess);
    cudaGraphExec_t exec;
    ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    for (int32_t pos : {4, 31, 32, 100, 255, 256, 257, 300, 1000, 4096, 8191}) {
      set_positions(pos);
      const std::string what = "seqs=" + std::to_string(rows.size()) + " pos=" + std::to_string(pos);
      cuda::SetOldAttnSplit(true);
      ASSERT_EQ(launch(), cudaSuccess);
      const std::vector<float> want = result();
      cuda::SetOldAttnSplit(false);
      ASSERT_EQ(launch(), cudaSuccess);
      const std::vector<float> eager = result();
      ASSERT_TRUE(AllFinite(want)) << what;
      ASSERT_EQ(cudaMemsetAsync(o.get(), 0xFF, o.count * sizeof(float), stream), cudaSuccess);
      ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
      const std::vector<float> got = result();
      EXPECT_TRUE(attn_testing::SameBits(got, eager)) << what << ": replay differs at " << FirstDifference(got, eager);
      const int equal = ExpectMatchesSplit(got, want, ItemContexts(plan, c.token_pos), bound, row_floats, what);
      std::printf("graph %s: %d/%zu tokens bit-equal to the split path\n", what.c_str(), equal, rows.size());
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(stream);
  }
}

}  // namespace
}  // namespace tandem
