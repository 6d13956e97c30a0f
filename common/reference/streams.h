// Hyper-connection streams (docs/MODEL.md §4.1): reading a block's input from the S residual
// streams and injecting the block's output back into them.
//
// Layouts: H is n tokens × S streams × h (token t's stream s at H + (t·S + s)·h); x is n × h; the
// inject weights a are n × S.
#ifndef TANDEM_COMMON_REFERENCE_STREAMS_H_
#define TANDEM_COMMON_REFERENCE_STREAMS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "common/reference/thread_pool.h"
#include "common/reference/weight_view.h"

namespace tandem {

// One `{side}_hc_*` set, or the plain norm (only `norm`, S = 1).
struct HcWeights {
  VectorView norm;    // {S·h}: γ (hc_norm, or attn_norm / post_attention_norm / output_norm)
  MatrixView down;    // {S·h, lr} hc_down; absent: the plain read
  MatrixView up;      // {lr, S·h} hc_up; present iff down is
  MatrixView inject;  // {S·h, S} hc_inject; optional (absent: a = 1)
};

// Validates shapes for S streams of width h (the plain form needs S = 1).
absl::Status CheckHcWeights(const HcWeights& w, int64_t S, int64_t h);

// Computes the block input x (n × h) and the inject weights a (n × S; may be nullptr when the
// caller does not inject, as for the output head). eps is the model's RMS-norm ε.
void StreamRead(const HcWeights& w, const float* H, int64_t n, int64_t S, int64_t h, float eps,
                float* x, float* a, ThreadPool* pool);

// H_s ← H_s + a_s · y for every token and stream (y is n × h, a is n × S).
void StreamInject(float* H, int64_t n, int64_t S, int64_t h, const float* a, const float* y);

}  // namespace tandem

#endif  // TANDEM_COMMON_REFERENCE_STREAMS_H_
