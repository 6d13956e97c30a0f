#include "common/reference/moe.h"

#include <algorithm>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "common/reference/matmul.h"
#include "common/reference/ops.h"

namespace tandem {

absl::Status CheckMoeWeights(const MoeWeights& w, const MoeDims& d) {
  if (d.E <= 0 || d.K <= 0 || d.K > d.E) {
    return absl::InvalidArgumentError(
        absl::StrCat("expert_used_count K=", d.K, " must be in [1, expert_count E=", d.E, "]"));
  }
  if (absl::Status s = CheckMatrix("ffn_gate_inp", w.router, d.h, d.E); !s.ok()) return s;
  const int64_t I = w.gate.rows;
  if (absl::Status s = CheckExpertMatrix("ffn_gate_exps", w.gate, d.h, I, d.E); !s.ok()) return s;
  if (absl::Status s = CheckExpertMatrix("ffn_up_exps", w.up, d.h, I, d.E); !s.ok()) return s;
  if (absl::Status s = CheckExpertMatrix("ffn_down_exps", w.down, I, d.h, d.E); !s.ok()) return s;
  if (!w.shared_gate.present()) {
    if (w.shared_up.present() || w.shared_down.present() || w.shared_gate_inp.present()) {
      return absl::InvalidArgumentError("shared expert tensors are present without ffn_gate_shexp");
    }
    return absl::OkStatus();
  }
  const int64_t Ish = w.shared_gate.rows;
  if (absl::Status s = CheckMatrix("ffn_gate_shexp", w.shared_gate, d.h, Ish); !s.ok()) return s;
  if (absl::Status s = CheckMatrix("ffn_up_shexp", w.shared_up, d.h, Ish); !s.ok()) return s;
  if (absl::Status s = CheckMatrix("ffn_down_shexp", w.shared_down, Ish, d.h); !s.ok()) return s;
  return CheckMatrix("ffn_gate_inp_shexp", w.shared_gate_inp, d.h, 1, /*optional=*/true);
}

void RouteTokens(const float* logits, int64_t n, int64_t E, int64_t K, int32_t* experts,
                 float* weights) {
  std::vector<float> probs(static_cast<size_t>(E));
  std::vector<int32_t> order(static_cast<size_t>(E));
  for (int64_t t = 0; t < n; ++t) {
    std::copy(logits + t * E, logits + (t + 1) * E, probs.begin());
    Softmax(probs.data(), E);
    std::iota(order.begin(), order.end(), 0);
    // Highest probability first; ties keep the lower id first.
    std::partial_sort(order.begin(), order.begin() + K, order.end(), [&](int32_t a, int32_t b) {
      return probs[a] > probs[b] || (probs[a] == probs[b] && a < b);
    });
    double sum = 0.0;
    for (int64_t k = 0; k < K; ++k) sum += probs[order[k]];
    for (int64_t k = 0; k < K; ++k) {
      experts[t * K + k] = order[k];
      weights[t * K + k] = static_cast<float>(probs[order[k]] / sum);
    }
  }
}

void FfnForward(const MatrixView& gate, const MatrixView& up, const MatrixView& down, const float* x,
                int64_t n, float* out, ThreadPool* pool) {
  const int64_t inner = gate.rows;
  std::vector<float> g(static_cast<size_t>(n * inner)), u(g.size());
  MatMul(gate, x, n, g.data(), pool);
  MatMul(up, x, n, u.data(), pool);
  for (size_t i = 0; i < g.size(); ++i) g[i] = Silu(g[i]) * u[i];
  MatMul(down, g.data(), n, out, pool);
}

void ExpertFfn(const MoeWeights& w, int64_t e, const float* x, int64_t n, float* out, ThreadPool* pool) {
  FfnForward(w.gate.expert(e), w.up.expert(e), w.down.expert(e), x, n, out, pool);
}

absl::Status ReferenceExpertExecutor::Run(std::span<const ExpertWork> work, const float* x, int64_t h,
                                          float* out) {
  std::vector<float> rows, results;
  size_t i = 0;
  while (i < work.size()) {
    // The run of pairs [i, j) with work[i]'s expert; ordered input keeps each expert to one run,
    // and any other order is still correct, only slower.
    size_t j = i;
    while (j < work.size() && work[j].expert == work[i].expert) ++j;
    const int32_t e = work[i].expert;
    if (e < 0 || e >= w_.gate.experts) {
      return absl::InvalidArgumentError(absl::StrCat("expert id ", e, " out of range [0, ", w_.gate.experts, ")"));
    }
    const int64_t m = static_cast<int64_t>(j - i);
    rows.resize(static_cast<size_t>(m * h));
    for (int64_t r = 0; r < m; ++r) std::copy(x + work[i + r].token * h, x + (work[i + r].token + 1) * h, rows.begin() + r * h);
    results.resize(rows.size());
    ExpertFfn(w_, e, rows.data(), m, results.data(), pool_);
    std::copy(results.begin(), results.end(), out + static_cast<int64_t>(i) * h);
    i = j;
  }
  return absl::OkStatus();
}

absl::Status MoeForward(const MoeWeights& w, const MoeDims& d, const float* x, int64_t n,
                        ExpertExecutor& executor, float* y, ThreadPool* pool, MoeRouting* routing) {
  const int64_t h = d.h;
  const int64_t K = d.K;
  // 1. Routing.
  std::vector<float> logits(static_cast<size_t>(n * d.E));
  MatMul(w.router, x, n, logits.data(), pool);
  MoeRouting local;
  MoeRouting& r = routing != nullptr ? *routing : local;
  r.experts.resize(static_cast<size_t>(n * K));
  r.weights.resize(static_cast<size_t>(n * K));
  RouteTokens(logits.data(), n, d.E, K, r.experts.data(), r.weights.data());

  // 2. The (expert, token) pairs grouped by expert; slot[t·K + k] is pair (t, k)'s output row.
  std::vector<int64_t> pair_order(static_cast<size_t>(n * K));
  std::iota(pair_order.begin(), pair_order.end(), 0);
  std::stable_sort(pair_order.begin(), pair_order.end(),
                   [&](int64_t a, int64_t b) { return r.experts[a] < r.experts[b]; });
  std::vector<ExpertWork> work(pair_order.size());
  std::vector<int64_t> slot(pair_order.size());
  for (size_t i = 0; i < pair_order.size(); ++i) {
    const int64_t pair = pair_order[i];
    work[i] = ExpertWork{r.experts[pair], pair / K};
    slot[pair] = static_cast<int64_t>(i);
  }
  std::vector<float> partials(work.size() * static_cast<size_t>(h));
  if (absl::Status s = executor.Run(work, x, h, partials.data()); !s.ok()) return s;

  // 3. Shared expert and its gate.
  std::vector<float> shared;
  std::vector<float> shared_gate(static_cast<size_t>(n), 1.0f);
  if (w.shared_gate.present()) {
    shared.resize(static_cast<size_t>(n * h));
    FfnForward(w.shared_gate, w.shared_up, w.shared_down, x, n, shared.data(), pool);
    if (w.shared_gate_inp.present()) {
      MatMul(w.shared_gate_inp, x, n, shared_gate.data(), pool);
      for (float& g : shared_gate) g = Sigmoid(g);
    }
  }
  // Scatter-sum in routing order per token (f64), so placement and executor order cannot matter.
  std::vector<double> acc(static_cast<size_t>(h));
  for (int64_t t = 0; t < n; ++t) {
    std::fill(acc.begin(), acc.end(), 0.0);
    for (int64_t k = 0; k < K; ++k) {
      const double wk = r.weights[t * K + k];
      const float* part = partials.data() + slot[t * K + k] * h;
      for (int64_t j = 0; j < h; ++j) acc[j] += wk * part[j];
    }
    if (!shared.empty()) {
      const double gs = shared_gate[t];
      for (int64_t j = 0; j < h; ++j) acc[j] += gs * shared[t * h + j];
    }
    for (int64_t j = 0; j < h; ++j) y[t * h + j] = static_cast<float>(acc[j]);
  }
  return absl::OkStatus();
}

}  // namespace tandem
