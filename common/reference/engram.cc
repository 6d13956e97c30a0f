#include "common/reference/engram.h"

#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/reference/matmul.h"
#include "common/reference/ops.h"

namespace tandem {

int64_t EngramConfig::total_rows() const {
  int64_t total = 0;
  for (uint32_t p : table_sizes) total += p;
  return total;
}

absl::Status CheckEngramConfig(const EngramConfig& c) {
  if (c.max_ngram < 2 || c.heads < 1 || c.head_dim < 1 || c.conv_kernel < 1 || c.dilation < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "engram config is inconsistent: max_ngram=", c.max_ngram, " heads=", c.heads, " head_dim=",
        c.head_dim, " conv_kernel=", c.conv_kernel, " conv_dilation=", c.dilation));
  }
  if (static_cast<int64_t>(c.multipliers.size()) != c.max_ngram) {
    return absl::InvalidArgumentError(absl::StrCat("engram multipliers: ", c.multipliers.size(),
                                                   " values, expected max_ngram = ", c.max_ngram));
  }
  if (static_cast<int64_t>(c.table_sizes.size()) != c.rows_per_token()) {
    return absl::InvalidArgumentError(absl::StrCat("engram table_sizes: ", c.table_sizes.size(),
                                                   " values, expected ", c.rows_per_token()));
  }
  for (size_t i = 0; i < c.table_sizes.size(); ++i) {
    if (c.table_sizes[i] == 0) {
      return absl::InvalidArgumentError(absl::StrCat("engram table_sizes[", i, "] is 0"));
    }
  }
  return absl::OkStatus();
}

uint64_t CompressTokenId(std::span<const int32_t> token_map, int32_t token) {
  const int32_t id = token_map.empty() ? token : token_map[static_cast<size_t>(token)];
  return static_cast<uint64_t>(static_cast<uint32_t>(id));
}

void EngramPositionRows(const EngramConfig& c, const uint64_t* recent, int64_t* rows) {
  int64_t offset = 0;
  int64_t out = 0;
  for (int64_t n = 2; n <= c.max_ngram; ++n) {
    uint64_t mix = 0;
    for (int64_t i = 0; i < n; ++i) mix ^= recent[i] * c.multipliers[static_cast<size_t>(i)];
    for (int64_t k = 0; k < c.heads; ++k, ++out) {
      const uint64_t prime = c.table_sizes[static_cast<size_t>(out)];
      rows[out] = offset + static_cast<int64_t>(mix % prime);
      offset += static_cast<int64_t>(prime);
    }
  }
}

void EngramRows(const EngramConfig& c, std::span<const int32_t> token_map,
                std::span<const int32_t> tokens, int64_t start, int64_t n, int64_t* rows) {
  std::vector<uint64_t> recent(static_cast<size_t>(c.max_ngram));
  for (int64_t t = 0; t < n; ++t) {
    const int64_t p = start + t;
    for (int64_t i = 0; i < c.max_ngram; ++i) {
      recent[static_cast<size_t>(i)] =
          p - i >= 0 ? CompressTokenId(token_map, tokens[static_cast<size_t>(p - i)]) : 0;
    }
    EngramPositionRows(c, recent.data(), rows + t * c.rows_per_token());
  }
}

absl::Status CheckEngramWeights(const EngramWeights& w, const EngramConfig& c, int64_t S, int64_t h) {
  if (absl::Status s = CheckEngramConfig(c); !s.ok()) return s;
  const int64_t width = S * h;
  if (absl::Status s = CheckMatrix("engram_embd", w.embd, c.head_dim, c.total_rows()); !s.ok()) return s;
  if (absl::Status s = CheckMatrix("engram_key", w.key, c.pin(), width); !s.ok()) return s;
  if (absl::Status s = CheckMatrix("engram_value", w.value, c.pin(), h); !s.ok()) return s;
  if (absl::Status s = CheckVector("engram_key_norm", w.key_norm, width); !s.ok()) return s;
  if (absl::Status s = CheckVector("engram_query_norm", w.query_norm, width); !s.ok()) return s;
  if (absl::Status s = CheckVector("engram_conv_norm", w.conv_norm, width); !s.ok()) return s;
  return CheckVector("engram_conv", w.conv, c.conv_kernel * width);
}

void EngramForward(const EngramWeights& w, const EngramConfig& c, const int64_t* rows, float* H,
                   int64_t n, int64_t S, int64_t h, float eps, float* conv_state, ThreadPool* pool) {
  if (n <= 0) return;
  const int64_t width = S * h;
  const int64_t rpt = c.rows_per_token();
  const int64_t de = c.head_dim;
  const int64_t pin = c.pin();
  // e = concat of the table rows.
  std::vector<float> e(static_cast<size_t>(n * pin));
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t i = 0; i < rpt; ++i) DequantizeMatrixRow(w.embd, rows[t * rpt + i], e.data() + t * pin + i * de);
  }
  // 3. kv = key·e, v = value·e.
  std::vector<float> kv(static_cast<size_t>(n * width)), v(static_cast<size_t>(n * h));
  MatMul(w.key, e.data(), n, kv.data(), pool);
  MatMul(w.value, e.data(), n, v.data(), pool);

  // 4-5a. Gates, u_s = α_s·v, and ū_s = γc_s ⊙ ρ(u_s) appended after the conv history.
  const int64_t hist = c.conv_history();
  std::vector<float> u(static_cast<size_t>(n * width));
  std::vector<float> window(static_cast<size_t>((hist + n) * width));
  std::memcpy(window.data(), conv_state, static_cast<size_t>(hist * width) * sizeof(float));
  std::vector<float> a(static_cast<size_t>(h)), b(static_cast<size_t>(h));
  const double inv_sqrt_h = 1.0 / std::sqrt(static_cast<double>(h));
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t s = 0; s < S; ++s) {
      const int64_t off = t * width + s * h;
      RmsNorm(kv.data() + off, h, eps, w.key_norm.data() + s * h, a.data());
      RmsNorm(H + off, h, eps, w.query_norm.data() + s * h, b.data());
      const double g = Dot(a.data(), b.data(), h) * inv_sqrt_h;
      const double signed_root = std::copysign(std::sqrt(std::max(std::fabs(g), 1e-6)), g);
      const float alpha = Sigmoid(static_cast<float>(signed_root));
      float* us = u.data() + off;
      for (int64_t j = 0; j < h; ++j) us[j] = alpha * v[t * h + j];
      RmsNorm(us, h, eps, w.conv_norm.data() + s * h, window.data() + (hist + t) * width + s * h);
    }
  }
  // 5b-6. Dilated causal depthwise conv of ū, then H_s ← H_s + u_s + SiLU(conv_s).
  const int64_t ck = c.conv_kernel;
  ParallelFor(pool, 0, width, 256, [&](int64_t c0, int64_t c1) {
    for (int64_t ch = c0; ch < c1; ++ch) {
      const float* taps = w.conv.data() + ch * ck;
      for (int64_t t = 0; t < n; ++t) {
        double sum = 0.0;
        for (int64_t q = 0; q < ck; ++q) {
          const int64_t row = hist + t - (ck - 1 - q) * c.dilation;
          sum += static_cast<double>(taps[q]) * window[row * width + ch];
        }
        const int64_t off = t * width + ch;
        H[off] += u[off] + Silu(static_cast<float>(sum));
      }
    }
  });
  std::memcpy(conv_state, window.data() + n * width, static_cast<size_t>(hist * width) * sizeof(float));
}

}  // namespace tandem
