#include "common/reference/gdn_rule.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace tandem {

void GatedDeltaRuleRecurrent(const float* q, const float* k, const float* v, const float* g,
                             const float* beta, int64_t n, int64_t dk, int64_t dv, float* state,
                             float* o) {
  std::vector<double> acc(static_cast<size_t>(dv));
  std::vector<float> delta(static_cast<size_t>(dv));
  for (int64_t t = 0; t < n; ++t) {
    const float* kt = k + t * dk;
    const float* qt = q + t * dk;
    const float* vt = v + t * dv;
    const float decay = std::exp(g[t]);
    // S ← S·exp(g); acc = Sᵀk.
    std::fill(acc.begin(), acc.end(), 0.0);
    for (int64_t i = 0; i < dk; ++i) {
      float* row = state + i * dv;
      const double ki = kt[i];
      for (int64_t j = 0; j < dv; ++j) {
        row[j] *= decay;
        acc[j] += ki * row[j];
      }
    }
    // δ = β(v − Sᵀk).
    for (int64_t j = 0; j < dv; ++j) delta[j] = beta[t] * static_cast<float>(vt[j] - acc[j]);
    // S ← S + k·δᵀ; acc = Sᵀq.
    std::fill(acc.begin(), acc.end(), 0.0);
    for (int64_t i = 0; i < dk; ++i) {
      float* row = state + i * dv;
      const float ki = kt[i];
      const double qi = qt[i];
      for (int64_t j = 0; j < dv; ++j) {
        row[j] += ki * delta[j];
        acc[j] += qi * row[j];
      }
    }
    float* ot = o + t * dv;
    for (int64_t j = 0; j < dv; ++j) ot[j] = static_cast<float>(acc[j]);
  }
}

namespace {

double DotMixed(const float* a, const float* b, int64_t n) {
  double s = 0.0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

// One chunk of c tokens; scratch vectors are sized by the caller for the largest chunk.
struct ChunkScratch {
  std::vector<double> G, T, U, W, D, S0;
};

void ChunkStep(const float* q, const float* k, const float* v, const float* g, const float* beta,
               int64_t c, int64_t dk, int64_t dv, float* state, float* o, ChunkScratch& s) {
  double* G = s.G.data();
  double* T = s.T.data();  // c × c, lower triangular with unit diagonal
  double* U = s.U.data();  // c × dv
  double* W = s.W.data();  // c × dk
  double* D = s.D.data();  // c × dv: Δ
  double* S0 = s.S0.data();
  for (int64_t i = 0; i < dk * dv; ++i) S0[i] = state[i];

  double running = 0.0;
  for (int64_t t = 0; t < c; ++t) G[t] = running += g[t];

  // UT transform: row t of T solves T[t] = e_t − Σ_{i<t} A[t][i]·T[i] (forward substitution).
  std::fill(T, T + c * c, 0.0);
  std::vector<double> a_row(static_cast<size_t>(c));
  for (int64_t t = 0; t < c; ++t) {
    for (int64_t i = 0; i < t; ++i) {
      a_row[i] = beta[t] * std::exp(G[t] - G[i]) * DotMixed(k + t * dk, k + i * dk, dk);
    }
    double* Tt = T + t * c;
    Tt[t] = 1.0;
    for (int64_t i = 0; i < t; ++i) {
      const double a = a_row[i];
      const double* Ti = T + i * c;
      for (int64_t j = 0; j <= i; ++j) Tt[j] -= a * Ti[j];
    }
  }
  // U = T·(β⊙V), W = T·(β·exp(G)⊙K).
  std::fill(U, U + c * dv, 0.0);
  std::fill(W, W + c * dk, 0.0);
  for (int64_t t = 0; t < c; ++t) {
    for (int64_t i = 0; i <= t; ++i) {
      const double tu = T[t * c + i] * beta[i];
      const double tw = tu * std::exp(G[i]);
      for (int64_t j = 0; j < dv; ++j) U[t * dv + j] += tu * v[i * dv + j];
      for (int64_t j = 0; j < dk; ++j) W[t * dk + j] += tw * k[i * dk + j];
    }
  }
  // Δ = U − W·S₀.
  for (int64_t t = 0; t < c; ++t) {
    double* Dt = D + t * dv;
    for (int64_t j = 0; j < dv; ++j) Dt[j] = U[t * dv + j];
    for (int64_t i = 0; i < dk; ++i) {
      const double w = W[t * dk + i];
      const double* row = S0 + i * dv;
      for (int64_t j = 0; j < dv; ++j) Dt[j] -= w * row[j];
    }
  }
  // o_t = exp(G_t)·S₀ᵀq_t + Σ_{i≤t} exp(G_t − G_i)⟨q_t, k_i⟩Δ_i.
  std::vector<double> acc(static_cast<size_t>(dv));
  for (int64_t t = 0; t < c; ++t) {
    std::fill(acc.begin(), acc.end(), 0.0);
    const float* qt = q + t * dk;
    for (int64_t i = 0; i < dk; ++i) {
      const double qi = qt[i];
      const double* row = S0 + i * dv;
      for (int64_t j = 0; j < dv; ++j) acc[j] += qi * row[j];
    }
    const double gt = std::exp(G[t]);
    for (int64_t j = 0; j < dv; ++j) acc[j] *= gt;
    for (int64_t i = 0; i <= t; ++i) {
      const double w = std::exp(G[t] - G[i]) * DotMixed(qt, k + i * dk, dk);
      const double* Di = D + i * dv;
      for (int64_t j = 0; j < dv; ++j) acc[j] += w * Di[j];
    }
    for (int64_t j = 0; j < dv; ++j) o[t * dv + j] = static_cast<float>(acc[j]);
  }
  // S = exp(G_last)·S₀ + Σ_i exp(G_last − G_i)·k_i·Δ_iᵀ.
  const double g_last = G[c - 1];
  const double decay_all = std::exp(g_last);
  for (int64_t i = 0; i < dk * dv; ++i) S0[i] *= decay_all;
  for (int64_t t = 0; t < c; ++t) {
    const double w = std::exp(g_last - G[t]);
    const float* kt = k + t * dk;
    const double* Dt = D + t * dv;
    for (int64_t i = 0; i < dk; ++i) {
      const double wk = w * kt[i];
      double* row = S0 + i * dv;
      for (int64_t j = 0; j < dv; ++j) row[j] += wk * Dt[j];
    }
  }
  for (int64_t i = 0; i < dk * dv; ++i) state[i] = static_cast<float>(S0[i]);
}

}  // namespace

void GatedDeltaRuleChunked(const float* q, const float* k, const float* v, const float* g,
                           const float* beta, int64_t n, int64_t dk, int64_t dv, int64_t chunk,
                           float* state, float* o) {
  chunk = std::max<int64_t>(1, std::min(chunk, n));
  ChunkScratch s;
  s.G.resize(static_cast<size_t>(chunk));
  s.T.resize(static_cast<size_t>(chunk * chunk));
  s.U.resize(static_cast<size_t>(chunk * dv));
  s.W.resize(static_cast<size_t>(chunk * dk));
  s.D.resize(static_cast<size_t>(chunk * dv));
  s.S0.resize(static_cast<size_t>(dk * dv));
  for (int64_t t0 = 0; t0 < n; t0 += chunk) {
    const int64_t c = std::min(chunk, n - t0);
    ChunkStep(q + t0 * dk, k + t0 * dk, v + t0 * dv, g + t0, beta + t0, c, dk, dv, state,
              o + t0 * dv, s);
  }
}

}  // namespace tandem
