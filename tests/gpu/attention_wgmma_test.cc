// The wgmma attention kernel (AttnTcWgmma, attention_tc_wgmma.cu) and the f16-tile path beside it
// (AttnKv16, attention_kv16.cu, and its overlapped form) on the planned tests' steps
// (attention_case.h): against the double-precision reference within the tensor-core tolerance,
// and against the mma.sync kernel and each other (attention_fast_test.cc has the plan, the exact
// split-KV path and the mma.sync prefill).
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gpu_service/backends/cuda/kernels/attention.cuh"
#include "gtest/gtest.h"
#include "tests/gpu/attention_case.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/test_seed.h"

namespace tandem {
namespace {

using gpu_testing::Download;
using gpu_testing::Poisoned;
using gpu_testing::RelL2;
using gpu_testing::Upload;

using attn_testing::AttnCase;
using attn_testing::MakeCase;
using attn_testing::Reference;
using attn_testing::RunPlanned;
using attn_testing::SeqStep;
using attn_testing::Shape;
using attn_testing::Tag;

// The wgmma kernel (hd 256, GQA 8, causal) on prefill cases: the mixed step (prefill chunk after
// cached positions, a decode, a fresh prefill), a fresh 512-token prompt (32 items), a 300-token
// chunk after 700 cached positions, and two prompts in one step, each with the plan's key-tile slices (partials + merge) and whole. Against the
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

}  // namespace
}  // namespace tandem
