// Gated DeltaNet decode in one kernel: for n sequences with one new token each, the causal conv
// (with its ring history), the q/k L2 norms, the gates, the delta-rule update of the state and the
// gated output norm, which kernels/gdn.cuh runs as four launches (LaunchGdnConvDecode,
// LaunchGdnPrepare, LaunchGdnRecurrentDecode, LaunchGdnGatedNorm). At batch 1 those four kernels
// are each bound by their launch and a memory round trip (~17 us per layer together); one launch
// keeps q, k and the gates in shared memory between the stages.
//
// Geometry: one block per (key-head group, token), r·dv threads (r = nv / nk value heads per
// group): the block computes its group's q and k once (and alone writes their conv history, so no
// other block reads a history it is rewriting), each thread then owns one state column of one
// value head, as LaunchGdnRecurrentDecode's threads do.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_GDN_DECODE_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_GDN_DECODE_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "gpu_service/backends/cuda/kernels/gdn.cuh"

namespace tandem::cuda {

struct GdnDecodeArgs {
  GdnShape shape;
  int64_t n = 0;                  // tokens, one per sequence
  const int32_t* rows = nullptr;  // device, n distinct sequence rows
  int64_t row_stride = 0;         // floats between two sequence rows of history and state
  const float* qkv = nullptr;     // n × c_dim, the input projection (before the conv)
  const float* z = nullptr;       // n × nv·dv, the output gate's projection
  const float* ba = nullptr;      // n × 2nv, [b, a] per key-head group as LaunchGdnPrepare reads it
  const float* taps = nullptr;    // c_dim × kk conv weights
  const float* ssm_a = nullptr;   // nv
  const float* dt_bias = nullptr; // nv
  const float* norm = nullptr;    // dv, the gated norm's weights
  float eps = 1e-6f;
  float* history = nullptr;       // (kk−1) × c_dim per row, updated
  float* state = nullptr;         // nv × dk × dv per row, updated
  float* out = nullptr;           // n × nv·dv
};

// True when the fused kernel handles the shape: dk 64 or 128, dv a multiple of 32, nv a multiple
// of nk, (nv / nk)·dv <= 256 threads (each keeps a state column in registers), dk <= (nv / nk)·dv, kk in [1, kGdnMaxConvKernel].
bool GdnDecodeFusedSupports(const GdnShape& d);

// The four decode launches' results in one launch (the same operations per element; the norms'
// sums in another order, so results agree to rounding). cudaErrorInvalidValue for a shape
// GdnDecodeFusedSupports refuses, n outside [1, 65535] or a null pointer. Launched with
// programmatic dependent launch (pdl.cuh).
cudaError_t LaunchGdnDecodeFused(const GdnDecodeArgs& args, cudaStream_t stream);

}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_GDN_DECODE_CUH_
