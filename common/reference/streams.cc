#include "common/reference/streams.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "common/reference/matmul.h"
#include "common/reference/ops.h"

namespace tandem {

absl::Status CheckHcWeights(const HcWeights& w, int64_t S, int64_t h) {
  const int64_t width = S * h;
  if (absl::Status s = CheckVector("hc norm", w.norm, width); !s.ok()) return s;
  if (!w.down.present()) {
    if (S != 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("hc_down is missing but the model has ", S, " streams"));
    }
    if (w.up.present() || w.inject.present()) {
      return absl::InvalidArgumentError("hc_up / hc_inject are present without hc_down");
    }
    return absl::OkStatus();
  }
  const int64_t lr = w.down.rows;
  if (absl::Status s = CheckMatrix("hc_down", w.down, width, lr); !s.ok()) return s;
  if (absl::Status s = CheckMatrix("hc_up", w.up, lr, width); !s.ok()) return s;
  return CheckMatrix("hc_inject", w.inject, width, S, /*optional=*/true);
}

void StreamRead(const HcWeights& w, const float* H, int64_t n, int64_t S, int64_t h, float eps,
                float* x, float* a, ThreadPool* pool) {
  const int64_t width = S * h;
  if (!w.down.present()) {  // plain: x = γ ⊙ ρ(H_1), a = 1
    for (int64_t t = 0; t < n; ++t) RmsNorm(H + t * h, h, eps, w.norm.data(), x + t * h);
    if (a != nullptr) {
      for (int64_t t = 0; t < n; ++t) a[t] = 1.0f;
    }
    return;
  }
  // N_s = γ_s ⊙ ρ(H_s), stream by stream.
  std::vector<float> normed(static_cast<size_t>(n * width));
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t s = 0; s < S; ++s) {
      const int64_t off = t * width + s * h;
      RmsNorm(H + off, h, eps, w.norm.data() + s * h, normed.data() + off);
    }
  }
  // z = D·vec(N); m = U·SiLU(z).
  const int64_t lr = w.down.rows;
  std::vector<float> z(static_cast<size_t>(n * lr));
  MatMul(w.down, normed.data(), n, z.data(), pool);
  for (float& v : z) v = Silu(v);
  std::vector<float> m(static_cast<size_t>(n * width));
  MatMul(w.up, z.data(), n, m.data(), pool);
  // x_j = (2/S)·Σ_s σ(m_{s,j})·N_{s,j}.
  const float scale = 2.0f / static_cast<float>(S);
  for (int64_t t = 0; t < n; ++t) {
    float* xt = x + t * h;
    for (int64_t j = 0; j < h; ++j) {
      double sum = 0.0;
      for (int64_t s = 0; s < S; ++s) {
        const int64_t off = t * width + s * h + j;
        sum += static_cast<double>(Sigmoid(m[off])) * normed[off];
      }
      xt[j] = scale * static_cast<float>(sum);
    }
  }
  if (a == nullptr) return;
  if (!w.inject.present()) {
    for (int64_t i = 0; i < n * S; ++i) a[i] = 1.0f;
    return;
  }
  // a_s = 2σ(c_s), c = J·vec(N).
  MatMul(w.inject, normed.data(), n, a, pool);
  for (int64_t i = 0; i < n * S; ++i) a[i] = 2.0f * Sigmoid(a[i]);
}

void StreamInject(float* H, int64_t n, int64_t S, int64_t h, const float* a, const float* y) {
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t s = 0; s < S; ++s) {
      const float as = a[t * S + s];
      float* Hs = H + (t * S + s) * h;
      const float* yt = y + t * h;
      for (int64_t j = 0; j < h; ++j) Hs[j] += as * yt[j];
    }
  }
}

}  // namespace tandem
