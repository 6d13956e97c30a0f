// Mixture of experts with a gated shared expert (docs/MODEL.md §4.6).
//
// The routed experts run through a pluggable ExpertExecutor: MoeForward routes, hands the executor
// the (expert, token) pairs, and scatter-sums the returned rows with the routing weights. Each
// token's sum runs over its picks in routing order, so the result does not depend on how (or in
// what order, or where) the executor computed the rows.
#ifndef TANDEM_COMMON_REFERENCE_MOE_H_
#define TANDEM_COMMON_REFERENCE_MOE_H_

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "common/reference/thread_pool.h"
#include "common/reference/weight_view.h"

namespace tandem {

struct MoeDims {
  int64_t h = 0;  // model width
  int64_t E = 0;  // routed experts
  int64_t K = 0;  // experts used per token
};

struct MoeWeights {
  MatrixView router;          // ffn_gate_inp {h, E}
  ExpertMatrixView gate;      // ffn_gate_exps {h, I, E}
  ExpertMatrixView up;        // ffn_up_exps {h, I, E}
  ExpertMatrixView down;      // ffn_down_exps {I, h, E}
  MatrixView shared_gate_inp; // ffn_gate_inp_shexp as {h, 1} (a {h} tensor is the same bytes);
                              // absent: the shared expert is added ungated
  MatrixView shared_gate;     // ffn_gate_shexp {h, Ish}; absent: no shared expert
  MatrixView shared_up;       // ffn_up_shexp {h, Ish}
  MatrixView shared_down;     // ffn_down_shexp {Ish, h}
};

absl::Status CheckMoeWeights(const MoeWeights& w, const MoeDims& d);

// Routes n tokens from their router logits (n × E): π = softmax over all E (f32), the K largest π
// (ties: the lower expert id), weights renormalised to sum to 1. Writes n × K expert ids and
// weights, each token's picks in descending weight order.
void RouteTokens(const float* logits, int64_t n, int64_t E, int64_t K, int32_t* experts,
                 float* weights);

// out = down·(SiLU(gate·x) ⊙ up·x) for n rows of x (n × gate.cols → n × down.rows).
void FfnForward(const MatrixView& gate, const MatrixView& up, const MatrixView& down, const float* x,
                int64_t n, float* out, ThreadPool* pool);

// FFN_e for n rows of x (n × h) into out (n × h), from the routed expert tensors of `w`.
void ExpertFfn(const MoeWeights& w, int64_t e, const float* x, int64_t n, float* out, ThreadPool* pool);

// One routed-expert computation: FFN_expert(x[token]).
struct ExpertWork {
  int32_t expert;
  int64_t token;
};

class ExpertExecutor {
 public:
  virtual ~ExpertExecutor() = default;
  // For every i, writes the unweighted FFN_{work[i].expert}(x row work[i].token) to out + i·h
  // (x is the MoE input, one row of h per token). MoeForward lists the pairs grouped by expert,
  // experts ascending, tokens ascending within an expert; the executor may compute them in any
  // order and anywhere. An error aborts the MoE step.
  virtual absl::Status Run(std::span<const ExpertWork> work, const float* x, int64_t h,
                           float* out) = 0;
};

// Computes the rows here, one expert at a time (each expert's weights read once for all its rows).
class ReferenceExpertExecutor : public ExpertExecutor {
 public:
  ReferenceExpertExecutor(const MoeWeights& w, ThreadPool* pool) : w_(w), pool_(pool) {}
  absl::Status Run(std::span<const ExpertWork> work, const float* x, int64_t h, float* out) override;

 private:
  MoeWeights w_;
  ThreadPool* pool_;
};

// The routing MoeForward used, for callers that compare picks across implementations.
struct MoeRouting {
  std::vector<int32_t> experts;  // n × K
  std::vector<float> weights;    // n × K
};

// y (n × h) = Σ_k w_k·FFN_{e_k}(x) + σ(⟨shared_gate_inp, x⟩)·FFN_shared(x) for n rows x (n × h).
// `routing`, when non-null, receives the picks.
absl::Status MoeForward(const MoeWeights& w, const MoeDims& d, const float* x, int64_t n,
                        ExpertExecutor& executor, float* y, ThreadPool* pool,
                        MoeRouting* routing = nullptr);

}  // namespace tandem

#endif  // TANDEM_COMMON_REFERENCE_MOE_H_
