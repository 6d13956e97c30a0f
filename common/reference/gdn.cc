#include "common/reference/gdn.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/reference/gdn_rule.h"
#include "common/reference/matmul.h"
#include "common/reference/ops.h"

namespace tandem {

absl::Status CheckGdnWeights(const GdnWeights& w, const GdnDims& d) {
  if (d.nk <= 0 || d.nv <= 0 || d.nv % d.nk != 0 || d.dk <= 0 || d.dv <= 0 || d.kk < 1) {
    return absl::InvalidArgumentError(absl::StrCat("GDN dims are inconsistent: nk=", d.nk, " nv=", d.nv,
                                                   " dk=", d.dk, " dv=", d.dv, " kk=", d.kk));
  }
  if (absl::Status s = CheckMatrix("attn_qkv", w.qkv, d.h, d.c_dim()); !s.ok()) return s;
  if (absl::Status s = CheckMatrix("attn_gate", w.gate, d.h, d.nv * d.dv); !s.ok()) return s;
  if (absl::Status s = CheckMatrix("ssm_ba", w.ba, d.h, 2 * d.nv); !s.ok()) return s;
  if (absl::Status s = CheckVector("ssm_conv1d", w.conv1d, d.kk * d.c_dim()); !s.ok()) return s;
  if (absl::Status s = CheckVector("ssm_a", w.a, d.nv); !s.ok()) return s;
  if (absl::Status s = CheckVector("ssm_dt.bias", w.dt_bias, d.nv); !s.ok()) return s;
  if (absl::Status s = CheckVector("ssm_norm", w.norm, d.dv); !s.ok()) return s;
  return CheckMatrix("ssm_out", w.out, d.nv * d.dv, d.h);
}

void GdnForward(const GdnWeights& w, const GdnDims& d, GdnState state, const float* x, int64_t n,
                float* y, const GdnOptions& options, ThreadPool* pool) {
  if (n <= 0) return;
  const int64_t c_dim = d.c_dim();
  const int64_t kk = d.kk;
  const int64_t vdim = d.nv * d.dv;
  const int64_t r = d.nv / d.nk;

  // 1. Projections.
  std::vector<float> qkv(static_cast<size_t>(n * c_dim));
  std::vector<float> z(static_cast<size_t>(n * vdim));
  std::vector<float> ba(static_cast<size_t>(n * 2 * d.nv));
  MatMul(w.qkv, x, n, qkv.data(), pool);
  MatMul(w.gate, x, n, z.data(), pool);
  MatMul(w.ba, x, n, ba.data(), pool);

  // 2. Causal depthwise conv over [history (kk−1 rows) | the n new rows], then SiLU.
  std::vector<float> window(static_cast<size_t>((kk - 1 + n) * c_dim));
  std::memcpy(window.data(), state.conv, static_cast<size_t>((kk - 1) * c_dim) * sizeof(float));
  std::memcpy(window.data() + (kk - 1) * c_dim, qkv.data(), static_cast<size_t>(n * c_dim) * sizeof(float));
  std::vector<float> conv(static_cast<size_t>(n * c_dim));
  ParallelFor(pool, 0, c_dim, 256, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      const float* taps = w.conv1d.data() + c * kk;
      for (int64_t t = 0; t < n; ++t) {
        // Window row t + q holds the input at token t − (kk−1−q); tap kk−1 is the current token.
        double sum = 0.0;
        for (int64_t q = 0; q < kk; ++q) sum += static_cast<double>(taps[q]) * window[(t + q) * c_dim + c];
        conv[t * c_dim + c] = Silu(static_cast<float>(sum));
      }
    }
  });
  std::memcpy(state.conv, window.data() + n * c_dim, static_cast<size_t>((kk - 1) * c_dim) * sizeof(float));

  // 3-5. Per value head: gates, normalised q/k, the delta rule, then 6's gated norm.
  std::vector<float> o(static_cast<size_t>(n * vdim));
  const float q_scale = 1.0f / std::sqrt(static_cast<float>(d.dk));
  ParallelFor(pool, 0, d.nv, 1, [&](int64_t h0, int64_t h1) {
    std::vector<float> q(static_cast<size_t>(n * d.dk)), k(q.size());
    std::vector<float> v(static_cast<size_t>(n * d.dv)), oh(v.size());
    std::vector<float> g(static_cast<size_t>(n)), beta(g.size());
    for (int64_t vh = h0; vh < h1; ++vh) {
      const int64_t group = vh / r;
      const int64_t j = vh % r;
      for (int64_t t = 0; t < n; ++t) {
        const float* row = conv.data() + t * c_dim;
        float* qt = q.data() + t * d.dk;
        float* kt = k.data() + t * d.dk;
        std::memcpy(qt, row + group * d.dk, static_cast<size_t>(d.dk) * sizeof(float));
        std::memcpy(kt, row + d.nk * d.dk + group * d.dk, static_cast<size_t>(d.dk) * sizeof(float));
        std::memcpy(v.data() + t * d.dv, row + 2 * d.nk * d.dk + vh * d.dv,
                    static_cast<size_t>(d.dv) * sizeof(float));
        L2Normalize(qt, d.dk, 1e-6f);
        for (int64_t i = 0; i < d.dk; ++i) qt[i] *= q_scale;
        L2Normalize(kt, d.dk, 1e-6f);
        const float* bat = ba.data() + t * 2 * d.nv + group * 2 * r;
        beta[t] = Sigmoid(bat[j]);
        g[t] = w.a[vh] * Softplus(bat[r + j] + w.dt_bias[vh]);
      }
      float* S = state.ssm + vh * d.dk * d.dv;
      if (options.mode == GdnMode::kChunked) {
        GatedDeltaRuleChunked(q.data(), k.data(), v.data(), g.data(), beta.data(), n, d.dk, d.dv,
                              options.chunk_size, S, oh.data());
      } else {
        GatedDeltaRuleRecurrent(q.data(), k.data(), v.data(), g.data(), beta.data(), n, d.dk, d.dv, S,
                                oh.data());
      }
      // 6. o ← ssm_norm ⊙ ρ(o) ⊙ SiLU(z_head).
      for (int64_t t = 0; t < n; ++t) {
        float* dst = o.data() + t * vdim + vh * d.dv;
        RmsNorm(oh.data() + t * d.dv, d.dv, d.eps, w.norm.data(), dst);
        const float* zt = z.data() + t * vdim + vh * d.dv;
        for (int64_t i = 0; i < d.dv; ++i) dst[i] *= Silu(zt[i]);
      }
    }
  });
  MatMul(w.out, o.data(), n, y, pool);
}

}  // namespace tandem
