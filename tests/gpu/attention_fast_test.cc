// The planned attention paths (attention.cuh): the plan's items and counts, the exact split-KV
// kernel (decode and any few-token step, with and without context slices) against a double
// precision reference within 1e-5, the f16 tensor-core prefill within 1e-2, mixed steps, and a
// decode step captured as a CUDA graph replayed with new positions, pages and cache contents.
// The cache is filled directly (keys and values random), positions past each sequence's end and
// unused pages hold NaN, so any read of them shows in the output.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <cuda_fp16.h>

#include <cstring>

#include "gpu_service/backends/cuda/kernels/attention.cuh"
#include "gtest/gtest.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/test_seed.h"

namespace tandem {
namespace {

using gpu_testing::Alloc;
using gpu_testing::DeviceArray;
using gpu_testing::Download;
using gpu_testing::Poisoned;
using gpu_testing::Random;
using gpu_testing::RelL2;
using gpu_testing::Upload;

// One sequence in a step: `start` positions already cached, `n` new tokens.
struct SeqStep {
  int start = 0, n = 0;
};

// A step over a paged cache, on the host and on the device.
struct AttnCase {
  cuda::AttnShape d;
  std::vector<SeqStep> seqs;
  int max_pages = 0;
  int64_t n = 0;
  std::vector<std::vector<float>> k, v;  // per sequence: (start + n) × kv_width
  std::vector<float> q, qg;              // n × nh × hd, n × nh × 2hd
  std::vector<int32_t> token_seq, token_pos, page_table;
  std::vector<float> k_pool, v_pool;     // pages × 64 × kv_width, NaN where unused

  DeviceArray<float> d_k, d_v, d_q, d_qg;
  DeviceArray<int32_t> d_seq, d_pos, d_table;

  void Upload() {
    d_k = gpu_testing::Upload(k_pool);
    d_v = gpu_testing::Upload(v_pool);
    d_q = gpu_testing::Upload(q);
    d_qg = gpu_testing::Upload(qg);
    d_seq = gpu_testing::Upload(token_seq);
    d_pos = gpu_testing::Upload(token_pos);
    d_table = gpu_testing::Upload(page_table);
  }
  cuda::PagedKv cache() const { return cuda::PagedKv{d_k.get(), d_v.get(), d_table.get(), max_pages}; }
};

cuda::AttnShape Shape(int hd, int groups, int kvh) { return cuda::AttnShape{groups * kvh, kvh, hd, hd / 4, 1e-6f}; }

// Sequences get scrambled physical pages; max_pages (per sequence) fixes every buffer's size.
AttnCase MakeCase(std::mt19937& rng, const cuda::AttnShape& d, const std::vector<SeqStep>& seqs, int max_pages) {
  AttnCase c;
  c.d = d;
  c.seqs = seqs;
  c.max_pages = max_pages;
  const int kvw = d.kv_width(), nseq = static_cast<int>(seqs.size());
  const int num_pages = nseq * max_pages;
  std::vector<int32_t> physical(static_cast<size_t>(num_pages));
  std::iota(physical.begin(), physical.end(), 0);
  std::shuffle(physical.begin(), physical.end(), rng);
  c.page_table.assign(static_cast<size_t>(num_pages), -1);
  c.k_pool.assign(static_cast<size_t>(num_pages) * cuda::kKvPageSize * kvw, NAN);
  c.v_pool = c.k_pool;
  int next = 0;
  for (int s = 0; s < nseq; ++s) {
    const int len = seqs[s].start + seqs[s].n;
    EXPECT_LE((len + cuda::kKvPageSize - 1) / cuda::kKvPageSize, max_pages);
    c.k.push_back(Random(rng, static_cast<size_t>(len) * kvw));
    c.v.push_back(Random(rng, static_cast<size_t>(len) * kvw));
    for (int p = 0; p < (len + cuda::kKvPageSize - 1) / cuda::kKvPageSize; ++p) {
      c.page_table[s * max_pages + p] = physical[next++];
    }
    for (int pos = 0; pos < len; ++pos) {
      const int64_t dst =
          (static_cast<int64_t>(c.page_table[s * max_pages + pos / cuda::kKvPageSize]) * cuda::kKvPageSize +
           pos % cuda::kKvPageSize) * kvw;
      std::copy_n(c.k[s].begin() + static_cast<int64_t>(pos) * kvw, kvw, c.k_pool.begin() + dst);
      std::copy_n(c.v[s].begin() + static_cast<int64_t>(pos) * kvw, kvw, c.v_pool.begin() + dst);
    }
    for (int t = 0; t < seqs[s].n; ++t) {
      c.token_seq.push_back(s);
      c.token_pos.push_back(seqs[s].start + t);
    }
  }
  c.n = static_cast<int64_t>(c.token_seq.size());
  c.q = Random(rng, static_cast<size_t>(c.n * d.nh * d.hd));
  c.qg = Random(rng, static_cast<size_t>(c.n * d.nh * 2 * d.hd));
  return c;
}

// Double-precision gated attention over the host copies.
std::vector<float> Reference(const AttnCase& c) {
  const cuda::AttnShape& d = c.d;
  const int kvw = d.kv_width(), groups = d.nh / d.kvh;
  std::vector<float> o(static_cast<size_t>(c.n * d.nh * d.hd));
  std::vector<double> p, acc(static_cast<size_t>(d.hd));
  for (int64_t t = 0; t < c.n; ++t) {
    const std::vector<float>& k = c.k[c.token_seq[t]];
    const std::vector<float>& v = c.v[c.token_seq[t]];
    const int len = c.token_pos[t] + 1;
    for (int h = 0; h < d.nh; ++h) {
      const float* q = c.q.data() + (t * d.nh + h) * d.hd;
      const int64_t koff = static_cast<int64_t>(h / groups) * d.hd;
      p.assign(static_cast<size_t>(len), 0.0);
      double mx = -INFINITY;
      for (int j = 0; j < len; ++j) {
        double s = 0.0;
        for (int i = 0; i < d.hd; ++i) s += static_cast<double>(q[i]) * k[j * kvw + koff + i];
        p[j] = s / std::sqrt(static_cast<double>(d.hd));
        mx = std::max(mx, p[j]);
      }
      double sum = 0.0;
      for (int j = 0; j < len; ++j) sum += (p[j] = std::exp(p[j] - mx));
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int j = 0; j < len; ++j) {
        for (int i = 0; i < d.hd; ++i) acc[i] += p[j] * v[j * kvw + koff + i];
      }
      const float* gate = c.qg.data() + (t * d.nh + h) * 2 * d.hd + d.hd;
      for (int i = 0; i < d.hd; ++i) {
        const double sigmoid = 1.0 / (1.0 + std::exp(-static_cast<double>(gate[i])));
        o[(t * d.nh + h) * d.hd + i] = static_cast<float>(acc[i] / sum * sigmoid);
      }
    }
  }
  return o;
}

// f16_tiles: PagedKv::f16_tiles for the run (the AttnKv16 path when it is on), null for none.
std::vector<float> RunPlanned(const AttnCase& c, const cuda::AttentionPlan& plan, void* f16_tiles = nullptr) {
  EXPECT_LE(plan.scratch_bytes, cuda::AttentionMaxScratchBytes(c.d));
  auto d_items = Upload(plan.items);
  auto scratch = Alloc<uint8_t>(plan.scratch_bytes);  // zeroed once: its head holds the split tickets
  EXPECT_EQ(cudaMemset(scratch.get(), 0, std::max<size_t>(plan.scratch_bytes, 1)), cudaSuccess);
  auto d_o = Poisoned<float>(static_cast<size_t>(c.n * c.d.nh * c.d.hd));
  cuda::PagedKv cache = c.cache();
  cache.f16_tiles = f16_tiles;
  EXPECT_EQ(cuda::LaunchAttention(c.d_q.get(), c.d_qg.get(), c.n, c.d, plan, d_items.get(), c.d_seq.get(),
                                  c.d_pos.get(), cache, d_o.get(), scratch.get(), nullptr),
            cudaSuccess);
  return Download(d_o);
}

std::vector<float> RunLegacy(const AttnCase& c) {
  const std::vector<int32_t> items = cuda::PlanAttentionItems(c.token_seq, c.d.nh / c.d.kvh);
  auto d_items = Upload(items);
  auto d_o = Poisoned<float>(static_cast<size_t>(c.n * c.d.nh * c.d.hd));
  EXPECT_EQ(cuda::LaunchAttention(c.d_q.get(), c.d_qg.get(), c.n, c.d, d_items.get(),
                                  static_cast<int>(items.size() / 2), c.d_seq.get(), c.d_pos.get(), c.cache(),
                                  d_o.get(), nullptr),
            cudaSuccess);
  return Download(d_o);
}

std::string Tag(const cuda::AttnShape& d) {
  return "hd" + std::to_string(d.hd) + "_g" + std::to_string(d.nh / d.kvh) + "_kvh" + std::to_string(d.kvh);
}

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

// The wgmma kernel (AttnTcWgmma, attention_tc_wgmma.cu; hd 256, GQA 8, causal) on the prefill
// cases above: the mixed step (prefill chunk after cached positions, a decode, a fresh prefill), a
// fresh 512-token prompt (32 items), a 300-token chunk after 700 cached positions, and two prompts
// in one step, each with the plan's key-tile slices (partials + merge) and whole. Against the
// reference within the tensor-core tolerance, and against the mma.sync kernel on the same plan:
// both round Q, K, V and P to f16 alike and differ only in the f32 summation order (and the rare
// P element that this flips), so they agree far closer than either does with the reference.
TEST(GpuAttentionWgmmaTest, MatchesPipelinedKernelAndReference) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng = ::tandem::testing::SeededRng();
  const cuda::AttnShape d = Shape(256, 8, 2);
  const auto tc = cuda::AttentionPrecision::kF16TensorCores;
  struct Restore {
    bool was = cuda::AttnTcWgmma();
    ~Restore() { cuda::SetAttnTcWgmma(was); }
  } restore;
  const std::vector<std::vector<SeqStep>> cases = {
      {{130, 200}, {500, 1}, {0, 70}}, {{0, 512}}, {{700, 300}}, {{0, 200}, {64, 130}}};
  for (const std::vector<SeqStep>& seqs : cases) {
    AttnCase c = MakeCase(rng, d, seqs, 17);
    c.Upload();
    const std::vector<float> want = Reference(c);
    std::string tag = "hd256_g8";
    for (const SeqStep& s : seqs) {
      tag.append("_").append(std::to_string(s.start)).append("+").append(std::to_string(s.n));
    }
    for (int max_splits : {cuda::kAttnMaxTcSplits, 1}) {
      const cuda::AttentionPlan plan = cuda::PlanAttention(c.token_seq, d, tc, max_splits);
      ASSERT_GT(plan.num_tile_items, 0);
      std::string name = tag;
      name.append(plan.tc_splits > 1 ? "_sliced" : "_whole");
      if (plan.tc_splits > 1) name.append(std::to_string(plan.tc_splits));
      cuda::SetAttnTcWgmma(false);
      const std::vector<float> mma = RunPlanned(c, plan);
      cuda::SetAttnTcWgmma(true);
      const std::vector<float> wg = RunPlanned(c, plan);
      const double err_mma = RelL2(mma, want);
      const double err_wg = gpu_testing::LogError("attn_wgmma_" + name, RelL2(wg, want));
      EXPECT_LE(err_wg, 1e-2) << name;
      EXPECT_LE(err_wg, 1.2 * err_mma + 1e-4) << name << ": mma.sync kernel " << err_mma;
      EXPECT_LE(gpu_testing::LogError("attn_wgmma_vs_mma_" + name, RelL2(wg, mma)), 1e-3) << name;
    }
  }
}

// The f16-tile path (AttnKv16, attention_kv16.cu) against the wgmma kernel that converts in the
// block: every output float's bits equal, on the wgmma test's cases (sliced and whole) and on
// prompts whose contexts end inside a tile (1000 fresh tokens, 100 after 37 cached, GQA 8:1) and
// of exactly one tile (64 tokens), and within the tensor-core tolerance of the reference. The tile buffer starts as NaN; after a
// run every converted tile must hold the f16 (round to nearest) of the cache's keys and values in
// the slabs' swizzled layouts, zeros past the sequence's last position.
TEST(GpuAttentionWgmmaTest, Kv16TilesBitIdenticalToWgmmaKernel) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng = ::tandem::testing::SeededRng();
  const cuda::AttnShape d = Shape(256, 8, 2);
  const auto tc = cuda::AttentionPrecision::kF16TensorCores;
  struct Restore {
    bool wgmma = cuda::AttnTcWgmma(), kv16 = cuda::AttnKv16();
    ~Restore() {
      cuda::SetAttnTcWgmma(wgmma);
      cuda::SetAttnKv16(kv16);
    }
  } restore;
  cuda::SetAttnTcWgmma(true);
  const std::vector<std::vector<SeqStep>> cases = {{{130, 200}, {500, 1}, {0, 70}}, {{0, 512}}, {{700, 300}},
                                                   {{0, 200}, {64, 130}}, {{0, 1000}}, {{37, 100}},
                                                   {{0, 64}}};
  const int max_pages = 17;
  for (const std::vector<SeqStep>& seqs : cases) {
    AttnCase c = MakeCase(rng, d, seqs, max_pages);
    c.Upload();
    const std::vector<float> want = Reference(c);
    const int pages = static_cast<int>(seqs.size()) * max_pages;
    const size_t tile_bytes = cuda::AttnKv16ScratchBytes(d, pages);
    ASSERT_EQ(tile_bytes, static_cast<size_t>(pages) * d.kvh * 2 * 64 * 256 * sizeof(uint16_t));
    auto tiles = Poisoned<uint8_t>(tile_bytes);
    std::string tag = "hd256_g8";
    for (const SeqStep& s : seqs) tag.append("_").append(std::to_string(s.start)).append("+").append(std::to_string(s.n));
    for (int max_splits : {cuda::kAttnMaxTcSplits, 1}) {
      const cuda::AttentionPlan plan = cuda::PlanAttention(c.token_seq, d, tc, max_splits);
      ASSERT_GT(plan.num_tile_items, 0);
      const std::string name = tag + (plan.tc_splits > 1 ? "_sliced" + std::to_string(plan.tc_splits) : "_whole");
      cuda::SetAttnKv16(false);
      const std::vector<float> wg = RunPlanned(c, plan, tiles.get());
      cuda::SetAttnKv16(true);
      const std::vector<float> kv16 = RunPlanned(c, plan, tiles.get());
      ASSERT_EQ(kv16.size(), wg.size());
      size_t differ = 0;
      for (size_t i = 0; i < wg.size(); ++i) differ += std::memcmp(&wg[i], &kv16[i], sizeof(float)) != 0;
      EXPECT_EQ(differ, 0u) << name << ": output floats whose bits differ from the wgmma kernel's";
      EXPECT_LE(gpu_testing::LogError("attn_kv16_" + name, RelL2(kv16, want)), 1e-2) << name;
    }
    // The tiles of every sequence with tile items (>= 64 new tokens), keys 0 .. its last position.
    const std::vector<uint8_t> got = Download(tiles);
    const int kvw = d.kv_width();
    auto f16 = [](float x) {
      const __half h = __float2half_rn(x);
      uint16_t bits;
      std::memcpy(&bits, &h, sizeof(bits));
      return bits;
    };
    auto swizzled = [](int row, int chunk) { return row * 128 + ((chunk ^ (row & 7)) << 4); };
    size_t bad = 0, checked = 0;
    for (size_t s = 0; s < seqs.size(); ++s) {
      if (seqs[s].n < cuda::kAttnTensorCoreMinTokens) continue;
      const int last = seqs[s].start + seqs[s].n - 1;
      for (int kt = 0; kt <= last / 64; ++kt) {
        const int page = c.page_table[s * max_pages + kt];
        for (int h = 0; h < d.kvh; ++h) {
          const uint8_t* k_img = got.data() + (static_cast<size_t>(page) * d.kvh + h) * 2 * 32768;
          const uint8_t* v_img = k_img + 32768;
          for (int j = 0; j < 64; ++j) {
            const int pos = kt * 64 + j;
            for (int dim = 0; dim < 256; ++dim) {
              const size_t at = static_cast<size_t>(pos) * kvw + h * 256 + dim;
              const uint16_t want_k = pos <= last ? f16(c.k[s][at]) : 0, want_v = pos <= last ? f16(c.v[s][at]) : 0;
              uint16_t k_bits, v_bits;
              std::memcpy(&k_bits, k_img + (dim / 64) * 8192 + swizzled(j, dim % 64 / 8) + 2 * (dim % 8), 2);
              std::memcpy(&v_bits, v_img + swizzled(dim, j / 8) + 2 * (j % 8), 2);
              bad += (k_bits != want_k) + (v_bits != want_v);
              checked += 2;
            }
          }
        }
      }
    }
    EXPECT_GT(checked, 0u) << tag;
    EXPECT_EQ(bad, 0u) << tag << ": f16 tile values unlike the cache's (of " << checked << ")";
  }
}

// The overlapped f16-tile kernel (AttnKv16Mode() == 2: S(t + 1) issued before the softmax of
// tile t, attention_kv16.cu) against the f16-tile kernel (mode 1) and the wgmma kernel that
// converts in the block (mode 0): every output float's bits equal, sliced and whole, on the
// Kv16 test's cases plus prompts whose blocks attend 2 and 3 tiles (128, 192 tokens at GQA 1:1,
// for the two-tile unrolled loop's even and odd ends) and a GQA 2:1 shape; and within the
// tensor-core tolerance of the reference.
TEST(GpuAttentionWgmmaTest, Kv16OverlapBitIdenticalToKv16AndWgmmaKernels) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng = ::tandem::testing::SeededRng();
  const auto tc = cuda::AttentionPrecision::kF16TensorCores;
  struct Restore {
    bool wgmma = cuda::AttnTcWgmma();
    int kv16 = cuda::AttnKv16Mode();
    ~Restore() {
      cuda::SetAttnTcWgmma(wgmma);
      cuda::SetAttnKv16Mode(kv16);
    }
  } restore;
  cuda::SetAttnTcWgmma(true);
  struct Case {
    cuda::AttnShape d;
    std::vector<SeqStep> seqs;
  };
  const std::vector<Case> cases = {
      {Shape(256, 8, 2), {{130, 200}, {500, 1}, {0, 70}}}, {Shape(256, 8, 2), {{0, 512}}},
      {Shape(256, 8, 2), {{700, 300}}},  {Shape(256, 8, 2), {{0, 200}, {64, 130}}},
      {Shape(256, 8, 2), {{0, 1000}}},   {Shape(256, 8, 2), {{37, 100}}},
      {Shape(256, 8, 2), {{0, 64}}},     {Shape(256, 1, 2), {{0, 128}}},
      {Shape(256, 1, 2), {{0, 192}}},    {Shape(256, 1, 2), {{0, 1000}, {3, 250}}},
      {Shape(256, 2, 2), {{0, 700}, {100, 333}}}};
  const int max_pages = 17;
  for (const Case& k : cases) {
    const cuda::AttnShape& d = k.d;
    AttnCase c = MakeCase(rng, d, k.seqs, max_pages);
    c.Upload();
    const std::vector<float> want = Reference(c);
    const int pages = static_cast<int>(k.seqs.size()) * max_pages;
    auto tiles = Poisoned<uint8_t>(cuda::AttnKv16ScratchBytes(d, pages));
    std::string tag = Tag(d);
    for (const SeqStep& s : k.seqs) {
      tag.append("_").append(std::to_string(s.start)).append("+").append(std::to_string(s.n));
    }
    for (int max_splits : {cuda::kAttnMaxTcSplits, 1}) {
      const cuda::AttentionPlan plan = cuda::PlanAttention(c.token_seq, d, tc, max_splits);
      ASSERT_GT(plan.num_tile_items, 0) << tag;
      const std::string name = tag + (plan.tc_splits > 1 ? "_sliced" + std::to_string(plan.tc_splits) : "_whole");
      cuda::SetAttnKv16Mode(0);
      const std::vector<float> wg = RunPlanned(c, plan, tiles.get());
      cuda::SetAttnKv16Mode(1);
      const std::vector<float> kv16 = RunPlanned(c, plan, tiles.get());
      cuda::SetAttnKv16Mode(2);
      const std::vector<float> ovl = RunPlanned(c, plan, tiles.get());
      ASSERT_EQ(ovl.size(), wg.size());
      ASSERT_EQ(ovl.size(), kv16.size());
      size_t differ_kv16 = 0, differ_wg = 0;
      for (size_t i = 0; i < ovl.size(); ++i) {
        differ_kv16 += std::memcmp(&ovl[i], &kv16[i], sizeof(float)) != 0;
        differ_wg += std::memcmp(&ovl[i], &wg[i], sizeof(float)) != 0;
      }
      EXPECT_EQ(differ_kv16, 0u) << name << ": output floats whose bits differ from the f16-tile kernel's";
      EXPECT_EQ(differ_wg, 0u) << name << ": output floats whose bits differ from the wgmma kernel's";
      EXPECT_LE(gpu_testing::LogError("attn_kv16ovl_" + name, RelL2(ovl, want)), 1e-2) << name;
    }
  }
}

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
