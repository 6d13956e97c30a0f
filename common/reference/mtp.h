// The MTP draft head's input mixing (docs/MODEL.md §4.7 step 2). The rest of the draft step is the
// layer loop's composition of StreamRead, AttentionForward, MoeForward and the output head.
#ifndef TANDEM_COMMON_REFERENCE_MTP_H_
#define TANDEM_COMMON_REFERENCE_MTP_H_

#include <cstdint>

#include "absl/status/status.h"
#include "common/reference/thread_pool.h"
#include "common/reference/weight_view.h"

namespace tandem {

struct MtpInputWeights {
  MatrixView eh_proj;  // nextn.eh_proj {2h, h}: input columns [0, h) the embedding, [h, 2h) hsrc
  VectorView enorm;    // nextn.enorm {h}
  VectorView hnorm;    // nextn.hnorm {S·h}
};

absl::Status CheckMtpInputWeights(const MtpInputWeights& w, int64_t S, int64_t h);

// H'_s = eh_proj·[enorm ⊙ ρ(embd) | hnorm_s ⊙ ρ(hsrc_s)] for n drafts: hsrc (n × S × h) is the main
// model's final H (S > 1) or output_norm ⊙ ρ(H) (S = 1; the caller applies output_norm), embd
// (n × h) the embeddings of the next tokens. Writes H' (n × S × h).
void MtpMixInputs(const MtpInputWeights& w, const float* hsrc, const float* embd, int64_t n, int64_t S,
                  int64_t h, float eps, float* h_out, ThreadPool* pool);

}  // namespace tandem

#endif  // TANDEM_COMMON_REFERENCE_MTP_H_
