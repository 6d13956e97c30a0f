#include "common/reference/mtp.h"

#include <vector>

#include "common/reference/matmul.h"
#include "common/reference/ops.h"

namespace tandem {

absl::Status CheckMtpInputWeights(const MtpInputWeights& w, int64_t S, int64_t h) {
  if (absl::Status s = CheckMatrix("nextn.eh_proj", w.eh_proj, 2 * h, h); !s.ok()) return s;
  if (absl::Status s = CheckVector("nextn.enorm", w.enorm, h); !s.ok()) return s;
  return CheckVector("nextn.hnorm", w.hnorm, S * h);
}

void MtpMixInputs(const MtpInputWeights& w, const float* hsrc, const float* embd, int64_t n, int64_t S,
                  int64_t h, float eps, float* h_out, ThreadPool* pool) {
  // One 2h-wide input row per (draft, stream): the projection is linear in its two column halves,
  // so a single matmul over the concatenation is exactly the sum of the two products.
  std::vector<float> in(static_cast<size_t>(n * S * 2 * h));
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t s = 0; s < S; ++s) {
      float* row = in.data() + (t * S + s) * 2 * h;
      RmsNorm(embd + t * h, h, eps, w.enorm.data(), row);
      RmsNorm(hsrc + (t * S + s) * h, h, eps, w.hnorm.data() + s * h, row + h);
    }
  }
  MatMul(w.eh_proj, in.data(), n * S, h_out, pool);
}

}  // namespace tandem
