// Parity of the GPU GDN and attention mixers with the CPU reference (common/reference/gdn.h,
// attention.h): the whole mixer from x to y, the projections through the exact-mode GEMM or the
// matvec, and the state (GDN conv history and S, the paged KV cache) carried across calls.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <vector>

#include "common/reference/attention.h"
#include "common/reference/gdn.h"
#include "gpu_service/backends/cuda/kernels/attention.cuh"
#include "gpu_service/backends/cuda/kernels/dense_matvec.cuh"
#include "gpu_service/backends/cuda/kernels/gdn.cuh"
#include "gpu_service/backends/cuda/kernels/gemm_plan.h"
#include "gtest/gtest.h"
#include "tests/gpu/gdn_test_util.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/test_seed.h"

namespace tandem {
namespace {

using gpu_testing::Alloc;
using gpu_testing::DeviceArray;
using gpu_testing::Download;
using gpu_testing::F32TestMatrix;
using gpu_testing::Poisoned;
using gpu_testing::Random;
using gpu_testing::RelL2;
using gpu_testing::TestMatrix;
using gpu_testing::Upload;

// y = W·x for n rows: the matvec for n <= 8, the exact GEMM beyond.
void Project(cuda::DenseGemm& gemm, const TestMatrix& w, const float* x, int64_t n, float* y) {
  if (n <= cuda::kMatVecMaxRows) {
    ASSERT_EQ(cuda::LaunchDenseMatVec(w.gpu(), x, w.cols, static_cast<int>(n), y, w.rows, nullptr), cudaSuccess);
  } else {
    ASSERT_TRUE(gemm.Run(w.gpu(), x, n, y, nullptr).ok());
  }
}

std::unique_ptr<cuda::DenseGemm> ExactGemm(int64_t max_n, int64_t max_cols) {
  cuda::DenseGemmOptions options;
  options.mode = cuda::GemmMode::kExact;
  options.max_n = max_n;
  options.max_cols = max_cols;
  options.tile_bytes = 16 << 20;
  options.workspace_bytes = 4 << 20;
  auto g = cuda::DenseGemm::Create(options);
  EXPECT_TRUE(g.ok()) << g.status();
  return g.ok() ? *std::move(g) : nullptr;
}

class GpuGdnTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override { TANDEM_SKIP_WITHOUT_GPU(); }
};

// A prefill of 70 tokens then two decode steps of one token, from an empty state.
TEST_P(GpuGdnTest, PrefillThenDecodeMatchesRecurrentReference) {
  std::mt19937 rng = ::tandem::testing::SeededRng();
  GdnDims d;
  d.h = 256;
  d.nk = 2;
  d.nv = 4;
  d.dk = d.dv = GetParam();
  d.kk = 4;
  const int64_t c_dim = d.c_dim(), vdim = d.nv * d.dv;
  const std::vector<float> qkv = Random(rng, static_cast<size_t>(d.h * c_dim), 0.08f);
  const std::vector<float> gate = Random(rng, static_cast<size_t>(d.h * vdim), 0.08f);
  const std::vector<float> ba = Random(rng, static_cast<size_t>(d.h * 2 * d.nv), 0.1f);
  const std::vector<float> conv1d = Random(rng, static_cast<size_t>(d.kk * c_dim), 0.5f);
  const std::vector<float> a = gdn_testing::RandomSsmA(rng, d.nv);
  const std::vector<float> dt_bias = Random(rng, static_cast<size_t>(d.nv), 0.5f);
  const std::vector<float> norm = Random(rng, static_cast<size_t>(d.dv), 0.2f, 1.0f);
  const std::vector<float> out = Random(rng, static_cast<size_t>(vdim * d.h), 0.05f);
  const TestMatrix Wqkv = F32TestMatrix(qkv, d.h, c_dim), Wz = F32TestMatrix(gate, d.h, vdim),
                   Wba = F32TestMatrix(ba, d.h, 2 * d.nv), Wout = F32TestMatrix(out, vdim, d.h);
  GdnWeights w;
  w.qkv = Wqkv.view();
  w.gate = Wz.view();
  w.ba = Wba.view();
  w.conv1d = conv1d;
  w.a = a;
  w.dt_bias = dt_bias;
  w.norm = norm;
  w.out = Wout.view();
  ASSERT_TRUE(CheckGdnWeights(w, d).ok());
  std::vector<float> conv_state(static_cast<size_t>(d.conv_state_floats()), 0.0f);
  std::vector<float> ssm_state(static_cast<size_t>(d.ssm_state_floats()), 0.0f);

  const cuda::GdnShape s{static_cast<int>(d.nk), static_cast<int>(d.nv), static_cast<int>(d.dk),
                         static_cast<int>(d.dv), static_cast<int>(d.kk)};
  auto d_conv_state = Upload(conv_state);
  auto d_ssm = Upload(ssm_state);
  auto d_taps = Upload(conv1d);
  auto d_a = Upload(a);
  auto d_dt = Upload(dt_bias);
  auto d_norm = Upload(norm);
  auto gemm = ExactGemm(128, 1024);
  ASSERT_NE(gemm, nullptr);

  for (int64_t n : {70, 2, 1, 3, 1}) {  // 2 and 3: fewer tokens than the conv history (kk − 1)
    const std::vector<float> x = Random(rng, static_cast<size_t>(n * d.h));
    std::vector<float> y(static_cast<size_t>(n * d.h));
    GdnForward(w, d, GdnState{conv_state.data(), ssm_state.data()}, x.data(), n, y.data(), GdnOptions{}, nullptr);

    auto d_x = Upload(x);
    auto d_qkv = Poisoned<float>(static_cast<size_t>(n * c_dim));
    auto d_z = Poisoned<float>(static_cast<size_t>(n * vdim));
    auto d_ba = Poisoned<float>(static_cast<size_t>(n * 2 * d.nv));
    auto d_conv = Poisoned<float>(static_cast<size_t>(n * c_dim));
    auto d_g = Poisoned<float>(static_cast<size_t>(n * d.nv));
    auto d_beta = Poisoned<float>(static_cast<size_t>(n * d.nv));
    auto d_o = Poisoned<float>(static_cast<size_t>(n * vdim));
    auto d_y = Poisoned<float>(static_cast<size_t>(n * d.h));
    Project(*gemm, Wqkv, d_x.get(), n, d_qkv.get());
    Project(*gemm, Wz, d_x.get(), n, d_z.get());
    Project(*gemm, Wba, d_x.get(), n, d_ba.get());
    TANDEM_ASSERT_CUDA(cuda::LaunchGdnConv(d_qkv.get(), d_conv_state.get(), d_taps.get(), n, s, d_conv.get(), nullptr));
    TANDEM_ASSERT_CUDA(cuda::LaunchGdnPrepare(d_conv.get(), d_ba.get(), d_a.get(), d_dt.get(), n, s, d_g.get(),
                                              d_beta.get(), nullptr));
    TANDEM_ASSERT_CUDA(cuda::LaunchGdnRecurrent(d_conv.get(), d_g.get(), d_beta.get(), n, s, d_ssm.get(), d_o.get(),
                                                nullptr));
    TANDEM_ASSERT_CUDA(cuda::LaunchGdnGatedNorm(d_o.get(), d_z.get(), d_norm.get(), d.eps, n, s, d_o.get(), nullptr));
    Project(*gemm, Wout, d_o.get(), n, d_y.get());
    const std::string tag = "gdn_dk" + std::to_string(d.dk) + "_n" + std::to_string(n);
    EXPECT_LE(gpu_testing::LogError(tag + "_y", RelL2(Download(d_y), y)), 1e-5);
    EXPECT_LE(gpu_testing::LogError(tag + "_conv", RelL2(Download(d_conv_state), conv_state)), 1e-6);
    EXPECT_LE(gpu_testing::LogError(tag + "_ssm", RelL2(Download(d_ssm), ssm_state)), 1e-5);
  }
}

// The decode conv reading its qkv rows as parts of wider rows ([qkv | z | ba] per token: the
// stacked decode product's output, GpuLayer::mixer_in) gives the contiguous rows' bits, in its
// outputs and in the sequences' conv histories.
TEST_P(GpuGdnTest, ConvDecodeFromStridedRowsMatchesContiguous) {
  std::mt19937 rng = ::tandem::testing::SeededRng();
  const cuda::GdnShape d{2, 4, GetParam(), GetParam(), 4};
  const int64_t c_dim = d.c_dim(), n = 3, stride = c_dim + 4 * GetParam() + 8 + 4;
  const int64_t state_stride = 5 * c_dim;  // per sequence row: (kk − 1) · c_dim of history and more
  const std::vector<int32_t> seq_rows = {2, 0, 4};
  const std::vector<float> history = Random(rng, static_cast<size_t>(5 * state_stride));
  const std::vector<float> qkv = Random(rng, static_cast<size_t>(n * c_dim));
  std::vector<float> wide(static_cast<size_t>(n * stride), -7.0f);
  for (int64_t t = 0; t < n; ++t) std::copy_n(qkv.begin() + t * c_dim, c_dim, wide.begin() + t * stride);
  const auto d_rows = Upload(seq_rows);
  const auto d_qkv = Upload(qkv), d_wide = Upload(wide);
  const auto d_taps = Upload(Random(rng, static_cast<size_t>(c_dim * d.kk), 0.5f));
  auto hist0 = Upload(history), hist1 = Upload(history);
  auto out0 = Poisoned<float>(static_cast<size_t>(n * c_dim)), out1 = Poisoned<float>(static_cast<size_t>(n * c_dim));
  TANDEM_ASSERT_CUDA(cuda::LaunchGdnConvDecode(d_qkv.get(), hist0.get(), state_stride, d_rows.get(), d_taps.get(), n, d,
                                               out0.get(), nullptr));
  TANDEM_ASSERT_CUDA(cuda::LaunchGdnConvDecode(d_wide.get(), hist1.get(), state_stride, d_rows.get(), d_taps.get(), n,
                                               d, out1.get(), nullptr, stride));
  const std::vector<float> want = Download(out0);
  EXPECT_EQ(Download(out1), want);
  EXPECT_EQ(Download(hist1), Download(hist0));
  EXPECT_TRUE(std::all_of(want.begin(), want.end(), [](float x) { return std::isfinite(x); }));
  EXPECT_EQ(cuda::LaunchGdnConvDecode(d_wide.get(), hist1.get(), state_stride, d_rows.get(), d_taps.get(), n, d,
                                      out1.get(), nullptr, c_dim - 1),
            cudaErrorInvalidValue);
}

INSTANTIATE_TEST_SUITE_P(HeadDims, GpuGdnTest, ::testing::Values(64, 128));

class GpuAttentionTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override { TANDEM_SKIP_WITHOUT_GPU(); }
};

// Two sequences in one step (prefill of 70 and 5 tokens), then a decode step of one token each,
// with a scrambled page table; against AttentionForward on contiguous caches.
TEST_P(GpuAttentionTest, PagedPrefillThenDecodeMatchesReference) {
  std::mt19937 rng = ::tandem::testing::SeededRng();
  AttnDims d;
  d.h = 256;
  d.nh = 8;
  d.kvh = 2;
  d.hd = GetParam();
  d.rot = d.hd / 4;
  d.theta = 1e7;
  const int64_t qw = d.nh * 2 * d.hd, kvw = d.kv_width();
  const std::vector<float> q = Random(rng, static_cast<size_t>(d.h * qw), 0.08f);
  const std::vector<float> k = Random(rng, static_cast<size_t>(d.h * kvw), 0.08f);
  const std::vector<float> v = Random(rng, static_cast<size_t>(d.h * kvw), 0.08f);
  const std::vector<float> out = Random(rng, static_cast<size_t>(d.nh * d.hd * d.h), 0.05f);
  const std::vector<float> q_norm = Random(rng, static_cast<size_t>(d.hd), 0.3f, 1.0f);
  const std::vector<float> k_norm = Random(rng, static_cast<size_t>(d.hd), 0.3f, 1.0f);
  const TestMatrix Wq = F32TestMatrix(q, d.h, qw), Wk = F32TestMatrix(k, d.h, kvw), Wv = F32TestMatrix(v, d.h, kvw),
                   Wo = F32TestMatrix(out, d.nh * d.hd, d.h);
  AttnWeights w;
  w.q = Wq.view();
  w.k = Wk.view();
  w.v = Wv.view();
  w.output = Wo.view();
  w.q_norm = q_norm;
  w.k_norm = k_norm;
  ASSERT_TRUE(CheckAttnWeights(w, d).ok());

  const cuda::AttnShape s{static_cast<int>(d.nh), static_cast<int>(d.kvh), static_cast<int>(d.hd),
                          static_cast<int>(d.rot), d.eps};
  const int max_pages = 4, num_pages = 8;
  // Sequence 0 uses physical pages 5, 2; sequence 1 uses 7.
  const std::vector<int32_t> page_table = {5, 2, -1, -1, 7, -1, -1, -1};
  auto d_pages = Upload(page_table);
  auto d_kc = Poisoned<float>(static_cast<size_t>(num_pages * cuda::kKvPageSize * kvw));
  auto d_vc = Poisoned<float>(static_cast<size_t>(num_pages * cuda::kKvPageSize * kvw));
  cuda::PagedKv cache{d_kc.get(), d_vc.get(), d_pages.get(), max_pages};
  auto d_inv = Upload(cuda::RopeInvFrequencies(d.theta, s.rot));
  auto d_qn = Upload(q_norm);
  auto d_kn = Upload(k_norm);
  auto gemm = ExactGemm(128, 2048);
  ASSERT_NE(gemm, nullptr);
  ContiguousAttentionCache ref0(d, 128), ref1(d, 128);

  struct Step {
    int64_t n0, n1, start0, start1;
  };
  for (const Step& st : {Step{70, 5, 0, 0}, Step{1, 1, 70, 5}}) {
    const int64_t n = st.n0 + st.n1;
    const std::vector<float> x = Random(rng, static_cast<size_t>(n * d.h));
    std::vector<float> y(static_cast<size_t>(n * d.h));
    AttentionForward(w, d, ref0, st.start0, x.data(), st.n0, y.data(), nullptr);
    AttentionForward(w, d, ref1, st.start1, x.data() + st.n0 * d.h, st.n1, y.data() + st.n0 * d.h, nullptr);

    std::vector<int32_t> token_seq, token_pos;
    for (int64_t t = 0; t < st.n0; ++t) token_seq.push_back(0), token_pos.push_back(static_cast<int32_t>(st.start0 + t));
    for (int64_t t = 0; t < st.n1; ++t) token_seq.push_back(1), token_pos.push_back(static_cast<int32_t>(st.start1 + t));
    const std::vector<int32_t> items = cuda::PlanAttentionItems(token_seq, static_cast<int>(d.nh / d.kvh));
    ASSERT_FALSE(items.empty());
    auto d_seq = Upload(token_seq);
    auto d_pos = Upload(token_pos);
    auto d_items = Upload(items);
    auto d_x = Upload(x);
    auto d_qg = Poisoned<float>(static_cast<size_t>(n * qw));
    auto d_k = Poisoned<float>(static_cast<size_t>(n * kvw));
    auto d_v = Poisoned<float>(static_cast<size_t>(n * kvw));
    auto d_q = Poisoned<float>(static_cast<size_t>(n * d.nh * d.hd));
    auto d_o = Poisoned<float>(static_cast<size_t>(n * d.nh * d.hd));
    auto d_y = Poisoned<float>(static_cast<size_t>(n * d.h));
    Project(*gemm, Wq, d_x.get(), n, d_qg.get());
    Project(*gemm, Wk, d_x.get(), n, d_k.get());
    Project(*gemm, Wv, d_x.get(), n, d_v.get());
    TANDEM_ASSERT_CUDA(cuda::LaunchQueryNormRope(d_qg.get(), n, s, d_qn.get(), d_inv.get(), d_pos.get(), d_q.get(), nullptr));
    TANDEM_ASSERT_CUDA(cuda::LaunchKvAppend(d_k.get(), d_v.get(), n, s, d_kn.get(), d_inv.get(), d_seq.get(), d_pos.get(),
                                            cache, nullptr));
    TANDEM_ASSERT_CUDA(cuda::LaunchAttention(d_q.get(), d_qg.get(), n, s, d_items.get(),
                                             static_cast<int>(items.size() / 2), d_seq.get(), d_pos.get(), cache,
                                             d_o.get(), nullptr));
    Project(*gemm, Wo, d_o.get(), n, d_y.get());
    EXPECT_LE(gpu_testing::LogError("attn_hd" + std::to_string(d.hd) + "_n" + std::to_string(n),
                                    RelL2(Download(d_y), y)),
              1e-5);
  }
  // The cached keys (after norm and RoPE) of sequence 0, position 66 (its second page, slot 2).
  const std::vector<float> kc = Download(d_kc);
  const std::vector<float> got(kc.begin() + (2 * 64 + 2) * kvw, kc.begin() + (2 * 64 + 3) * kvw);
  const std::vector<float> want(ref0.key(66), ref0.key(66) + kvw);
  EXPECT_LE(gpu_testing::LogError("attn_cached_key", RelL2(got, want)), 1e-6);
}

INSTANTIATE_TEST_SUITE_P(HeadDims, GpuAttentionTest, ::testing::Values(64, 128, 256));

// Keys and values read as parts of wider rows ([k | v | pad] per token, one stacked product's
// output: DenseGemm::RunStack) fill the cache with the bits of the contiguous k and v.
TEST_P(GpuAttentionTest, KvAppendFromStridedRowsMatchesContiguous) {
  std::mt19937 rng = ::tandem::testing::SeededRng();
  const cuda::AttnShape s{8, 2, GetParam(), GetParam() / 4, 1e-6f};
  const int64_t kvw = s.kv_width(), n = 75, stride = 2 * kvw + 3;
  const std::vector<float> k = Random(rng, static_cast<size_t>(n * kvw));
  const std::vector<float> v = Random(rng, static_cast<size_t>(n * kvw));
  std::vector<float> rows(static_cast<size_t>(n * stride), -7.0f);
  for (int64_t t = 0; t < n; ++t) {
    std::copy_n(k.begin() + t * kvw, kvw, rows.begin() + t * stride);
    std::copy_n(v.begin() + t * kvw, kvw, rows.begin() + t * stride + kvw);
  }
  std::vector<int32_t> token_seq, token_pos;
  for (int64_t t = 0; t < n; ++t) {
    token_seq.push_back(t < 70 ? 0 : 1);
    token_pos.push_back(static_cast<int32_t>(t < 70 ? t : t - 70 + 3));
  }
  const std::vector<int32_t> page_table = {5, 2, -1, -1, 7, -1, -1, -1};
  const auto d_pages = Upload(page_table), d_seq = Upload(token_seq), d_pos = Upload(token_pos);
  const auto d_inv = Upload(cuda::RopeInvFrequencies(1e7, s.rot));
  const auto d_kn = Upload(Random(rng, static_cast<size_t>(s.hd), 0.3f, 1.0f));
  const auto d_k = Upload(k), d_v = Upload(v), d_rows = Upload(rows);
  const size_t cache_floats = static_cast<size_t>(8 * cuda::kKvPageSize * kvw);
  // Poisoned caches are NaN-filled: compare only the slots written (both fill the same ones).
  auto kc0 = Upload(std::vector<float>(cache_floats, 0.0f)), vc0 = Upload(std::vector<float>(cache_floats, 0.0f));
  auto kc1 = Upload(std::vector<float>(cache_floats, 0.0f)), vc1 = Upload(std::vector<float>(cache_floats, 0.0f));
  TANDEM_ASSERT_CUDA(cuda::LaunchKvAppend(d_k.get(), d_v.get(), n, s, d_kn.get(), d_inv.get(), d_seq.get(), d_pos.get(),
                                          cuda::PagedKv{kc0.get(), vc0.get(), d_pages.get(), 4}, nullptr));
  TANDEM_ASSERT_CUDA(cuda::LaunchKvAppend(d_rows.get(), d_rows.get() + kvw, n, s, d_kn.get(), d_inv.get(), d_seq.get(),
                                          d_pos.get(), cuda::PagedKv{kc1.get(), vc1.get(), d_pages.get(), 4}, nullptr,
                                          stride));
  const std::vector<float> want_k = Download(kc0), want_v = Download(vc0);
  EXPECT_EQ(Download(kc1), want_k);
  EXPECT_EQ(Download(vc1), want_v);
  // v's values landed unchanged somewhere (the test would pass on two empty caches otherwise).
  EXPECT_NE(std::find(want_v.begin(), want_v.end(), v[0]), want_v.end());
  EXPECT_EQ(cuda::LaunchKvAppend(d_k.get(), d_v.get(), n, s, d_kn.get(), d_inv.get(), d_seq.get(), d_pos.get(),
                                 cuda::PagedKv{kc1.get(), vc1.get(), d_pages.get(), 4}, nullptr, kvw - 1),
            cudaErrorInvalidValue);
}

// Queries and gates read as a part of wider rows ([q·gate | k | v | pad] per token: the stacked
// decode product's output, GpuLayer::mixer_in) give the bits of the contiguous qg, through the
// query norm and the split attention with its merge; tile items refuse a wider stride.
TEST_P(GpuAttentionTest, QueriesFromStridedRowsMatchContiguous) {
  std::mt19937 rng = ::tandem::testing::SeededRng();
  const cuda::AttnShape s{8, 2, GetParam(), GetParam() / 4, 1e-6f};
  const int64_t kvw = s.kv_width(), qw = static_cast<int64_t>(s.nh) * 2 * s.hd, stride = qw + 2 * kvw + 4;
  // The cache: 300 positions of sequence 0 (pages 5, 2, 0, 3, 6) and 9 of sequence 1 (page 7).
  const std::vector<int32_t> page_table = {5, 2, 0, 3, 6, 7, -1, -1, -1, -1};
  const int max_pages = 5;
  const int64_t n0 = 300, n1 = 9, nc = n0 + n1;
  std::vector<int32_t> fill_seq, fill_pos;
  for (int64_t t = 0; t < nc; ++t) {
    fill_seq.push_back(t < n0 ? 0 : 1);
    fill_pos.push_back(static_cast<int32_t>(t < n0 ? t : t - n0));
  }
  const auto d_pages = Upload(page_table), d_fseq = Upload(fill_seq), d_fpos = Upload(fill_pos);
  const auto d_inv = Upload(cuda::RopeInvFrequencies(1e7, s.rot));
  const auto d_kn = Upload(Random(rng, static_cast<size_t>(s.hd), 0.3f, 1.0f));
  const auto d_qn = Upload(Random(rng, static_cast<size_t>(s.hd), 0.3f, 1.0f));
  const auto d_k = Upload(Random(rng, static_cast<size_t>(nc * kvw)));
  const auto d_v = Upload(Random(rng, static_cast<size_t>(nc * kvw)));
  const size_t cache_floats = static_cast<size_t>(8 * cuda::kKvPageSize * kvw);
  auto kc = Upload(std::vector<float>(cache_floats, 0.0f)), vc = Upload(std::vector<float>(cache_floats, 0.0f));
  const cuda::PagedKv cache{kc.get(), vc.get(), d_pages.get(), max_pages};
  TANDEM_ASSERT_CUDA(cuda::LaunchKvAppend(d_k.get(), d_v.get(), nc, s, d_kn.get(), d_inv.get(), d_fseq.get(),
                                          d_fpos.get(), cache, nullptr));
  // A decode-sized step over the filled cache: 3 tokens of sequence 0 (positions 297..299) and one of
  // sequence 1 (position 8), queries as contiguous rows and as parts of wider rows.
  const std::vector<int32_t> token_seq = {0, 0, 0, 1}, token_pos = {297, 298, 299, 8};
  const int64_t n = 4;
  const std::vector<float> qg = Random(rng, static_cast<size_t>(n * qw));
  std::vector<float> rows(static_cast<size_t>(n * stride), -7.0f);
  for (int64_t t = 0; t < n; ++t) std::copy_n(qg.begin() + t * qw, qw, rows.begin() + t * stride);
  const auto d_seq = Upload(token_seq), d_pos = Upload(token_pos);
  const auto d_qg = Upload(qg), d_rows = Upload(rows);
  const bool was_old = cuda::OldAttnDecode();
  const bool was_in_block = cuda::AttnMergeInBlock();
  cuda::SetAttnMergeInBlock(true);
  // The slices merged by their last block (AttnMergeInBlock) and by the merge launch
  // (TANDEM_OLD_ATTN_DECODE=1): both read the gates at qg_stride.
  for (bool old_merge : {false, true}) {
    for (int max_splits : {1, 0}) {  // 1: one slice per item (no merge); 0: the plan's split (merge)
      cuda::SetOldAttnDecode(old_merge);
      cuda::AttentionPlan plan = cuda::PlanAttention(token_seq, s);
      if (max_splits == 1) {
        plan.num_splits = 1;
        plan.scratch_bytes = 0;
      }
      ASSERT_GT(plan.num_row_items, 0);
      ASSERT_EQ(plan.num_tile_items, 0);
      const auto d_items = Upload(plan.items);
      const size_t scratch_bytes = std::max<size_t>(1, cuda::AttentionMaxScratchBytes(s));
      auto scratch = Alloc<uint8_t>(scratch_bytes);
      ASSERT_EQ(cudaMemset(scratch.get(), 0, scratch_bytes), cudaSuccess);  // the merge tickets start at 0
      std::vector<float> out[2];
      for (int strided = 0; strided < 2; ++strided) {
        const float* src = strided ? d_rows.get() : d_qg.get();
        const int64_t qg_stride = strided ? stride : 0;
        auto d_q = Poisoned<float>(static_cast<size_t>(n * s.nh * s.hd));
        auto d_o = Poisoned<float>(static_cast<size_t>(n * s.nh * s.hd));
        TANDEM_ASSERT_CUDA(cuda::LaunchQueryNormRope(src, n, s, d_qn.get(), d_inv.get(), d_pos.get(), d_q.get(),
                                                     nullptr, qg_stride));
        TANDEM_ASSERT_CUDA(cuda::LaunchAttention(d_q.get(), src, n, s, plan, d_items.get(), d_seq.get(), d_pos.get(),
                                                 cache, d_o.get(), scratch.get(), nullptr, qg_stride));
        out[strided] = Download(d_o);
      }
      printf("hd %d, %d splits, %s: strided queries %s\n", s.hd, plan.num_splits,
             old_merge ? "merge launch" : "in-block merge", out[0] == out[1] ? "bit-identical" : "DIFFERENT");
      EXPECT_EQ(out[0], out[1]) << "splits " << plan.num_splits << (old_merge ? ", merge launch" : ", in-block merge");
      EXPECT_TRUE(std::all_of(out[0].begin(), out[0].end(), [](float x) { return std::isfinite(x); }));
    }
  }
  cuda::SetOldAttnDecode(was_old);
  cuda::SetAttnMergeInBlock(was_in_block);
  // Too narrow a stride, and tile items (tensor-core attention) with a wider one, are refused.
  auto d_q = Poisoned<float>(static_cast<size_t>(n * s.nh * s.hd));
  EXPECT_EQ(cuda::LaunchQueryNormRope(d_rows.get(), n, s, d_qn.get(), d_inv.get(), d_pos.get(), d_q.get(), nullptr,
                                      qw - 4),
            cudaErrorInvalidValue);
  std::vector<int32_t> long_seq(80, 0), long_pos(80);
  std::iota(long_pos.begin(), long_pos.end(), 0);
  const cuda::AttentionPlan tc = cuda::PlanAttention(long_seq, s, cuda::AttentionPrecision::kF16TensorCores);
  ASSERT_GT(tc.num_tile_items, 0);
  const auto d_tc_items = Upload(tc.items);
  auto tc_scratch = Alloc<uint8_t>(std::max<size_t>(1, cuda::AttentionMaxScratchBytes(s)));
  EXPECT_EQ(cuda::LaunchAttention(d_q.get(), d_rows.get(), 80, s, tc, d_tc_items.get(), d_seq.get(), d_pos.get(), cache,
                                  d_q.get(), tc_scratch.get(), nullptr, stride),
            cudaErrorInvalidValue);
}

}  // namespace
}  // namespace tandem
