// The indexer kernels against the reference: index queries and keys, block keys (from the
// reference attention cache), block scores (IndexerBlockScores) and selection (SelectTopBlocks).
#include "gpu_service/backends/cuda/moe/indexer.cuh"

#include <cmath>

#include "common/reference/attention.h"
#include "common/reference/matmul.h"
#include "common/reference/ops.h"
#include "gpu_service/backends/cuda/moe/router.h"
#include "tests/gpu_moe/test_support.h"
#include "tests/test_seed.h"

namespace tandem::cuda {
namespace {

using testing::Download;
using testing::PoisonedBuffer;
using testing::RandomMatrix;
using testing::Upload;

TEST(IndexerTest, KeysQueriesAndScoresMatchReference) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng = ::tandem::testing::SeededRng();
  AttnDims d;
  d.h = 64;
  d.nh = 2;
  d.kvh = 1;
  d.hd = 32;
  d.rot = 16;
  d.theta = 1e6;
  d.ih = 3;
  d.di = 32;
  d.cr = 4;
  d.keep = 3;
  const int64_t n = 42;  // ten complete blocks and a partial one
  const int64_t iqw = d.ih * d.di + d.di;
  AttnWeights w;
  const std::vector<uint8_t> q = RandomMatrix(rng, WeightType::kF32, d.h, d.nh * 2 * d.hd, 0.2f);
  const std::vector<uint8_t> k = RandomMatrix(rng, WeightType::kF32, d.h, d.kv_width(), 0.2f);
  const std::vector<uint8_t> v = RandomMatrix(rng, WeightType::kF32, d.h, d.kv_width(), 0.2f);
  const std::vector<uint8_t> o = RandomMatrix(rng, WeightType::kF32, d.nh * d.hd, d.h, 0.2f);
  const std::vector<uint8_t> qk = RandomMatrix(rng, WeightType::kF32, d.h, iqw, 0.2f);
  const std::vector<float> qn = testing::UniformVector(rng, d.hd, 0.5f, 1.5f), kn = qn;
  const std::vector<float> iqn = testing::UniformVector(rng, d.di, 0.5f, 1.5f);
  const std::vector<float> ikn = testing::UniformVector(rng, d.di, 0.5f, 1.5f);
  w.q = testing::HostMatrix(WeightType::kF32, q, d.h, d.nh * 2 * d.hd);
  w.k = testing::HostMatrix(WeightType::kF32, k, d.h, d.kv_width());
  w.v = testing::HostMatrix(WeightType::kF32, v, d.h, d.kv_width());
  w.output = testing::HostMatrix(WeightType::kF32, o, d.nh * d.hd, d.h);
  w.q_norm = qn;
  w.k_norm = kn;
  w.idx_qk = testing::HostMatrix(WeightType::kF32, qk, d.h, iqw);
  w.idx_q_norm = iqn;
  w.idx_k_norm = ikn;
  ASSERT_TRUE(CheckAttnWeights(w, d).ok());
  const std::vector<float> x = testing::RandomVector(rng, n * d.h);
  ContiguousAttentionCache cache(d, n);
  std::vector<float> y(static_cast<size_t>(n * d.h));
  AttentionForward(w, d, cache, 0, x.data(), n, y.data(), nullptr);

  // Reference index queries.
  std::vector<float> iqk(static_cast<size_t>(n * iqw));
  MatMul(w.idx_qk, x.data(), n, iqk.data(), nullptr);
  std::vector<float> ref_iq(static_cast<size_t>(n * d.ih * d.di));
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t j = 0; j < d.ih; ++j) {
      float* dst = ref_iq.data() + (t * d.ih + j) * d.di;
      RmsNorm(iqk.data() + t * iqw + j * d.di, d.di, d.eps, iqn.data(), dst);
      RopeNeox(dst, d.rot, d.theta, t);
    }
  }

  // GPU: projections, prepare (two calls: a prefill then a decode-sized one), block keys.
  DeviceBuffer dqk = Upload(qk), dx = Upload(x), diqn = Upload(iqn), dikn = Upload(ikn);
  DeviceBuffer diqk = PoisonedBuffer(iqk.size() * sizeof(float));
  ASSERT_TRUE(DenseMatVec("attn_idx_qk", DeviceMatrix{kTypeF32, dqk.get(), d.h, iqw}, dx.as<float>(), n, diqk.as<float>(), nullptr).ok());
  DeviceBuffer diq = PoisonedBuffer(ref_iq.size() * sizeof(float));
  DeviceBuffer dkeys = PoisonedBuffer(static_cast<size_t>(n * d.di) * sizeof(float));
  const int64_t split = 37;
  ASSERT_EQ(LaunchIndexerPrepare(diqk.as<float>(), diqn.as<float>(), split, d.ih, d.di, d.rot, d.theta, d.eps, 0,
                                 diq.as<float>(), dkeys.as<float>(), nullptr), cudaSuccess);
  ASSERT_EQ(LaunchIndexerPrepare(diqk.as<float>() + split * iqw, diqn.as<float>(), n - split, d.ih, d.di, d.rot, d.theta,
                                 d.eps, split, diq.as<float>() + split * d.ih * d.di, dkeys.as<float>(), nullptr),
            cudaSuccess);
  const int64_t blocks = n / d.cr;
  DeviceBuffer dbk = PoisonedBuffer(static_cast<size_t>(blocks * d.di) * sizeof(float));
  ASSERT_EQ(LaunchIndexerBlockKeys(dkeys.as<float>(), dikn.as<float>(), 0, 7, d.cr, d.di, d.rot, d.theta, d.eps,
                                   dbk.as<float>(), nullptr), cudaSuccess);
  ASSERT_EQ(LaunchIndexerBlockKeys(dkeys.as<float>(), dikn.as<float>(), 7, blocks - 7, d.cr, d.di, d.rot, d.theta, d.eps,
                                   dbk.as<float>(), nullptr), cudaSuccess);

  const std::vector<float> got_iq = Download<float>(diq.get(), ref_iq.size());
  EXPECT_LE(testing::RelativeL2(got_iq, ref_iq), 1e-5);
  std::vector<float> ref_keys, ref_bk;
  for (int64_t p = 0; p < n; ++p) ref_keys.insert(ref_keys.end(), cache.index_key(p), cache.index_key(p) + d.di);
  for (int64_t b = 0; b < blocks; ++b) ref_bk.insert(ref_bk.end(), cache.block_key(b), cache.block_key(b) + d.di);
  EXPECT_LE(testing::RelativeL2(Download<float>(dkeys.get(), ref_keys.size()), ref_keys), 1e-5);
  EXPECT_LE(testing::RelativeL2(Download<float>(dbk.get(), ref_bk.size()), ref_bk), 1e-5);

  // Scores of every position against its complete blocks.
  const int stride = static_cast<int>(blocks);
  DeviceBuffer dscores = PoisonedBuffer(static_cast<size_t>(n * stride) * sizeof(float));
  ASSERT_EQ(LaunchIndexerScores(diq.as<float>(), dbk.as<float>(), n, d.ih, d.di, 0, d.cr, dscores.as<float>(), stride,
                                nullptr), cudaSuccess);
  const std::vector<float> got_scores = Download<float>(dscores.get(), static_cast<size_t>(n * stride));
  std::vector<float> got, ref;
  for (int64_t t = 0; t < n; ++t) {
    const int64_t nb = t / d.cr;
    std::vector<float> s(static_cast<size_t>(nb));
    IndexerBlockScores(d, cache, ref_iq.data() + t * d.ih * d.di, nb, s.data());
    ref.insert(ref.end(), s.begin(), s.end());
    got.insert(got.end(), got_scores.begin() + t * stride, got_scores.begin() + t * stride + nb);
  }
  ASSERT_TRUE(testing::AllFinite(got));
  EXPECT_LE(testing::RelativeL2(got, ref), 1e-5);
}

// Selection on scores with many exact ties equals SelectTopBlocks, plus the own block.
TEST(IndexerTest, SelectionMatchesSelectTopBlocks) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng = ::tandem::testing::SeededRng();
  const int cr = 4;
  for (int keep : {0, 1, 5, 64}) {
    for (int64_t start : {int64_t{0}, int64_t{37}, int64_t{4000}}) {
      const int n = 9;
      const int stride = static_cast<int>((start + n - 1) / cr) + 1;
      std::uniform_int_distribution<int> level(0, 6);
      std::vector<float> scores(static_cast<size_t>(n * stride));
      for (float& s : scores) s = 0.25f * level(rng);  // exact ties everywhere
      DeviceBuffer ds = Upload(scores);
      DeviceBuffer blocks = PoisonedBuffer(static_cast<size_t>(n * (keep + 1)) * sizeof(int32_t));
      DeviceBuffer counts = PoisonedBuffer(static_cast<size_t>(n) * sizeof(int32_t));
      ASSERT_EQ(LaunchIndexerSelect(ds.as<float>(), stride, n, start, cr, keep, blocks.as<int32_t>(),
                                    counts.as<int32_t>(), nullptr), cudaSuccess);
      const std::vector<int32_t> got = Download<int32_t>(blocks.get(), static_cast<size_t>(n * (keep + 1)));
      const std::vector<int32_t> got_counts = Download<int32_t>(counts.get(), static_cast<size_t>(n));
      for (int t = 0; t < n; ++t) {
        const int64_t nb = (start + t) / cr;
        std::vector<int64_t> want = SelectTopBlocks({scores.data() + t * stride, static_cast<size_t>(nb)}, keep);
        want.push_back(nb);
        ASSERT_EQ(got_counts[t], static_cast<int32_t>(want.size())) << "keep=" << keep << " start=" << start << " t=" << t;
        for (size_t i = 0; i < want.size(); ++i) {
          EXPECT_EQ(got[t * (keep + 1) + i], want[i]) << "keep=" << keep << " start=" << start << " t=" << t << " i=" << i;
        }
      }
    }
  }
}

}  // namespace
}  // namespace tandem::cuda
