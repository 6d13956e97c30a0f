#include "tests/gpu/attention_case.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "gtest/gtest.h"

namespace tandem::attn_testing {

using gpu_testing::Alloc;
using gpu_testing::Download;
using gpu_testing::Poisoned;
using gpu_testing::Random;
using gpu_testing::Upload;

void AttnCase::Upload() {
  d_k = gpu_testing::Upload(k_pool);
  d_v = gpu_testing::Upload(v_pool);
  d_q = gpu_testing::Upload(q);
  d_qg = gpu_testing::Upload(qg);
  d_seq = gpu_testing::Upload(token_seq);
  d_pos = gpu_testing::Upload(token_pos);
  d_table = gpu_testing::Upload(page_table);
}

cuda::AttnShape Shape(int hd, int groups, int kvh) {
  return cuda::AttnShape{groups * kvh, kvh, hd, hd / 4, 1e-6f};
}

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

std::vector<float> RunPlanned(const AttnCase& c, const cuda::AttentionPlan& plan, void* f16_tiles) {
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

}  // namespace tandem::attn_testing
