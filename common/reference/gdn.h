// Gated DeltaNet, Qwen3-Next's linear-attention mixer (docs/MODEL.md §4.4), on the split tensor
// form (the loader splits the older fused ssm_in).
#ifndef TANDEM_COMMON_REFERENCE_GDN_H_
#define TANDEM_COMMON_REFERENCE_GDN_H_

#include <cstdint>

#include "absl/status/status.h"
#include "common/reference/thread_pool.h"
#include "common/reference/weight_view.h"

namespace tandem {

struct GdnDims {
  int64_t h = 0;   // model width
  int64_t nk = 0;  // key heads (ssm.group_count)
  int64_t nv = 0;  // value heads (ssm.time_step_rank), a multiple of nk
  int64_t dk = 0;  // key head dim (ssm.state_size)
  int64_t dv = 0;  // value head dim (= dk in Qwen3-Next)
  int64_t kk = 0;  // conv kernel
  float eps = 1e-6f;  // RMS-norm ε of ssm_norm

  int64_t c_dim() const { return 2 * nk * dk + nv * dv; }
  int64_t conv_state_floats() const { return (kk - 1) * c_dim(); }
  int64_t ssm_state_floats() const { return nv * dk * dv; }
};

struct GdnWeights {
  MatrixView qkv;     // attn_qkv {h, c_dim}: rows q (nk·dk), k (nk·dk), v (nv·dv)
  MatrixView gate;    // attn_gate {h, nv·dv}: z
  MatrixView ba;      // ssm_ba {h, 2nv}: per key group, r b rows then r a rows
  VectorView conv1d;  // ssm_conv1d {kk, c_dim} f32: channel c's taps at [c·kk, c·kk + kk)
  VectorView a;       // ssm_a {nv} = −exp(A_log)
  VectorView dt_bias; // ssm_dt.bias {nv}
  VectorView norm;    // ssm_norm {dv}
  MatrixView out;     // ssm_out {nv·dv, h}
};

absl::Status CheckGdnWeights(const GdnWeights& w, const GdnDims& d);

// A sequence's GDN state in caller-owned memory (a page of the state pool): conv holds the last
// kk−1 pre-activation conv inputs (conv_state_floats(), oldest row first, each c_dim wide), ssm
// holds S[nv][dk][dv]. Both are zero at the start of a sequence.
struct GdnState {
  float* conv = nullptr;
  float* ssm = nullptr;
};

enum class GdnMode {
  kRecurrent,  // token by token: decode, and the definition
  kChunked,    // the chunked delta rule: prefill
};

struct GdnOptions {
  GdnMode mode = GdnMode::kRecurrent;
  int64_t chunk_size = 64;  // tokens per chunk in kChunked mode
};

// Runs n consecutive tokens x (n × h) of one sequence through the layer, writing y (n × h) and
// advancing `state` past them. Calling it on a split of the tokens gives the same result as one
// call (to rounding in kChunked mode).
void GdnForward(const GdnWeights& w, const GdnDims& d, GdnState state, const float* x, int64_t n,
                float* y, const GdnOptions& options, ThreadPool* pool);

}  // namespace tandem

#endif  // TANDEM_COMMON_REFERENCE_GDN_H_
