#include "common/reference/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "common/reference/matmul.h"
#include "common/reference/ops.h"

namespace tandem {

absl::Status CheckAttnWeights(const AttnWeights& w, const AttnDims& d) {
  if (d.nh <= 0 || d.kvh <= 0 || d.nh % d.kvh != 0 || d.hd <= 0 || d.rot < 0 || d.rot % 2 != 0 ||
      d.rot > d.hd) {
    return absl::InvalidArgumentError(absl::StrCat("attention dims are inconsistent: nh=", d.nh,
                                                   " kvh=", d.kvh, " hd=", d.hd, " rot=", d.rot));
  }
  if (absl::Status s = CheckMatrix("attn_q", w.q, d.h, d.nh * 2 * d.hd); !s.ok()) return s;
  if (absl::Status s = CheckMatrix("attn_k", w.k, d.h, d.kv_width()); !s.ok()) return s;
  if (absl::Status s = CheckMatrix("attn_v", w.v, d.h, d.kv_width()); !s.ok()) return s;
  if (absl::Status s = CheckMatrix("attn_output", w.output, d.nh * d.hd, d.h); !s.ok()) return s;
  if (absl::Status s = CheckVector("attn_q_norm", w.q_norm, d.hd); !s.ok()) return s;
  if (absl::Status s = CheckVector("attn_k_norm", w.k_norm, d.hd); !s.ok()) return s;
  if (!d.has_indexer()) return absl::OkStatus();
  if (d.di <= 0 || d.cr <= 0 || d.keep < 0 || d.rot > d.di) {
    return absl::InvalidArgumentError(absl::StrCat("indexer dims are inconsistent: di=", d.di, " cr=",
                                                   d.cr, " keep=", d.keep, " rot=", d.rot));
  }
  if (absl::Status s = CheckMatrix("attn_idx_qk", w.idx_qk, d.h, d.ih * d.di + d.di); !s.ok()) return s;
  if (absl::Status s = CheckVector("attn_idx_q_norm", w.idx_q_norm, d.di); !s.ok()) return s;
  return CheckVector("attn_idx_k_norm", w.idx_k_norm, d.di);
}

ContiguousAttentionCache::ContiguousAttentionCache(const AttnDims& d, int64_t capacity)
    : capacity_(capacity),
      kv_width_(d.kv_width()),
      di_(d.di),
      keys_(static_cast<size_t>(capacity * kv_width_)),
      values_(keys_.size()),
      index_keys_(d.has_indexer() ? static_cast<size_t>(capacity * di_) : 0),
      block_keys_(d.has_indexer() ? static_cast<size_t>((capacity / std::max<int64_t>(1, d.cr) + 1) * di_)
                                  : 0) {}

void IndexerBlockScores(const AttnDims& d, AttentionCache& cache, const float* iq, int64_t nb,
                        float* scores) {
  const double inv_sqrt_di = 1.0 / std::sqrt(static_cast<double>(d.di));
  for (int64_t b = 0; b < nb; ++b) {
    const float* kb = cache.block_key(b);
    double s = 0.0;
    for (int64_t j = 0; j < d.ih; ++j) s += std::max(0.0f, Dot(iq + j * d.di, kb, d.di));
    scores[b] = static_cast<float>(s * inv_sqrt_di);
  }
}

std::vector<int64_t> SelectTopBlocks(std::span<const float> scores, int64_t keep) {
  const int64_t nb = static_cast<int64_t>(scores.size());
  std::vector<int64_t> blocks(static_cast<size_t>(nb));
  std::iota(blocks.begin(), blocks.end(), 0);
  if (nb <= keep) return blocks;
  // Highest score first; equal scores keep the lower block first.
  std::stable_sort(blocks.begin(), blocks.end(),
                   [&](int64_t a, int64_t b) { return scores[a] > scores[b]; });
  blocks.resize(static_cast<size_t>(std::max<int64_t>(0, keep)));
  std::sort(blocks.begin(), blocks.end());
  return blocks;
}

namespace {

// Writes position p's block key when p completes its block: RoPE_{b·cr}(idx_k_norm ⊙ ρ(mean ik)).
void MaybeWriteBlockKey(const AttnWeights& w, const AttnDims& d, AttentionCache& cache, int64_t p) {
  if ((p + 1) % d.cr != 0) return;
  const int64_t b = p / d.cr;
  std::vector<double> sum(static_cast<size_t>(d.di), 0.0);
  for (int64_t j = b * d.cr; j <= p; ++j) {
    const float* ik = cache.index_key(j);
    for (int64_t i = 0; i < d.di; ++i) sum[i] += ik[i];
  }
  float* kb = cache.block_key(b);
  for (int64_t i = 0; i < d.di; ++i) kb[i] = static_cast<float>(sum[i] / static_cast<double>(d.cr));
  RmsNorm(kb, d.di, d.eps, w.idx_k_norm.data(), kb);
  RopeNeox(kb, d.rot, d.theta, b * d.cr);
}

}  // namespace

float SelectMargin(std::span<const float> scores, int64_t keep) {
  std::vector<float> sorted(scores.begin(), scores.end());
  std::sort(sorted.begin(), sorted.end(), std::greater<float>());
  const float kept = sorted[static_cast<size_t>(keep - 1)], next = sorted[static_cast<size_t>(keep)];
  return (kept - next) / std::max(std::fabs(kept), 1e-30f);
}

void AttentionForward(const AttnWeights& w, const AttnDims& d, AttentionCache& cache,
                      int64_t start_pos, const float* x, int64_t n, float* y, ThreadPool* pool,
                      float* select_margin, int32_t* selected_blocks, int32_t* selected_counts) {
  if (n <= 0) return;
  const int64_t hd = d.hd;
  const int64_t kvw = d.kv_width();
  const int64_t qw = d.nh * 2 * hd;
  std::vector<float> qg(static_cast<size_t>(n * qw));
  std::vector<float> k(static_cast<size_t>(n * kvw)), v(k.size());
  MatMul(w.q, x, n, qg.data(), pool);
  MatMul(w.k, x, n, k.data(), pool);
  MatMul(w.v, x, n, v.data(), pool);

  // Queries: norm and RoPE in place (the gate halves stay raw).
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t hh = 0; hh < d.nh; ++hh) {
      float* q = qg.data() + t * qw + hh * 2 * hd;
      RmsNorm(q, hd, d.eps, w.q_norm.data(), q);
      RopeNeox(q, d.rot, d.theta, start_pos + t);
    }
  }
  // Keys and values into the cache.
  for (int64_t t = 0; t < n; ++t) {
    const int64_t p = start_pos + t;
    float* kc = cache.key(p);
    for (int64_t g = 0; g < d.kvh; ++g) {
      RmsNorm(k.data() + t * kvw + g * hd, hd, d.eps, w.k_norm.data(), kc + g * hd);
      RopeNeox(kc + g * hd, d.rot, d.theta, p);
    }
    std::memcpy(cache.value(p), v.data() + t * kvw, static_cast<size_t>(kvw) * sizeof(float));
  }

  // Indexer: index queries (normed, roped), raw index keys and block keys.
  const int64_t iqw = d.ih * d.di;
  std::vector<float> iqk;
  if (d.has_indexer()) {
    iqk.resize(static_cast<size_t>(n * (iqw + d.di)));
    MatMul(w.idx_qk, x, n, iqk.data(), pool);
    for (int64_t t = 0; t < n; ++t) {
      const int64_t p = start_pos + t;
      float* row = iqk.data() + t * (iqw + d.di);
      for (int64_t j = 0; j < d.ih; ++j) {
        RmsNorm(row + j * d.di, d.di, d.eps, w.idx_q_norm.data(), row + j * d.di);
        RopeNeox(row + j * d.di, d.rot, d.theta, p);
      }
      std::memcpy(cache.index_key(p), row + iqw, static_cast<size_t>(d.di) * sizeof(float));
      MaybeWriteBlockKey(w, d, cache, p);
    }
  }

  // The positions each token attends, ascending.
  std::vector<std::vector<int64_t>> attended(static_cast<size_t>(n));
  ParallelFor(pool, 0, n, 1, [&](int64_t t0, int64_t t1) {
    std::vector<float> scores;
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t p = start_pos + t;
      std::vector<int64_t>& pos = attended[t];
      if (!d.has_indexer() || p / d.cr <= d.keep) {
        pos.resize(static_cast<size_t>(p + 1));
        std::iota(pos.begin(), pos.end(), 0);
        if (select_margin != nullptr) select_margin[t] = std::numeric_limits<float>::infinity();
        if (selected_counts != nullptr) {
          // Every earlier block (none without an indexer: there are no blocks).
          const int64_t nb = d.has_indexer() ? p / d.cr : 0;
          for (int64_t b = 0; b < nb; ++b) selected_blocks[t * d.keep + b] = static_cast<int32_t>(b);
          selected_counts[t] = static_cast<int32_t>(nb);
        }
        continue;
      }
      const int64_t nb = p / d.cr;
      scores.resize(static_cast<size_t>(nb));
      IndexerBlockScores(d, cache, iqk.data() + t * (iqw + d.di), nb, scores.data());
      if (select_margin != nullptr) select_margin[t] = SelectMargin(scores, d.keep);
      const std::vector<int64_t> chosen = SelectTopBlocks(scores, d.keep);
      if (selected_counts != nullptr) {
        for (size_t i = 0; i < chosen.size(); ++i) {
          selected_blocks[t * d.keep + static_cast<int64_t>(i)] = static_cast<int32_t>(chosen[i]);
        }
        selected_counts[t] = static_cast<int32_t>(chosen.size());
      }
      for (int64_t b : chosen) {
        for (int64_t j = b * d.cr; j < (b + 1) * d.cr; ++j) pos.push_back(j);
      }
      for (int64_t j = nb * d.cr; j <= p; ++j) pos.push_back(j);
    }
  });

  // o_h = softmax(⟨q_h, k_j⟩/√hd)·V over the attended positions, gated by σ(g_h).
  const int64_t groups = d.nh / d.kvh;
  const float inv_sqrt_hd = 1.0f / std::sqrt(static_cast<float>(hd));
  std::vector<float> o(static_cast<size_t>(n * d.nh * hd));
  ParallelFor(pool, 0, n * d.nh, 1, [&](int64_t i0, int64_t i1) {
    std::vector<float> probs;
    std::vector<double> acc(static_cast<size_t>(hd));
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t t = i / d.nh;
      const int64_t hh = i % d.nh;
      const int64_t g = hh / groups;
      const float* q = qg.data() + t * qw + hh * 2 * hd;
      const float* gate = q + hd;
      const std::vector<int64_t>& pos = attended[t];
      probs.resize(pos.size());
      for (size_t j = 0; j < pos.size(); ++j) probs[j] = Dot(q, cache.key(pos[j]) + g * hd, hd) * inv_sqrt_hd;
      Softmax(probs.data(), static_cast<int64_t>(probs.size()));
      std::fill(acc.begin(), acc.end(), 0.0);
      for (size_t j = 0; j < pos.size(); ++j) {
        const float* vj = cache.value(pos[j]) + g * hd;
        const double pj = probs[j];
        for (int64_t e = 0; e < hd; ++e) acc[e] += pj * vj[e];
      }
      float* oh = o.data() + (t * d.nh + hh) * hd;
      for (int64_t e = 0; e < hd; ++e) oh[e] = static_cast<float>(acc[e]) * Sigmoid(gate[e]);
    }
  });
  MatMul(w.output, o.data(), n, y, pool);
}

}  // namespace tandem
