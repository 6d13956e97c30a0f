// The norm-in form of the streaming decode kernel (matvec_stream.cuh, StreamMatVecKernel's kNormIn):
// its input and the device steps that form the block input x in shared memory instead of reading it
// (dense_matvec.cuh LaunchDenseMatVecNormIn says why and who adds the inject to H). Only .cu files
// include this header (through matvec_stream.cuh).
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_MATVEC_STREAM_NORM_IN_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_MATVEC_STREAM_NORM_IN_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "gpu_service/backends/cuda/cp_async.cuh"
#include "gpu_service/backends/cuda/kernels/block_reduce.cuh"
#include "gpu_service/backends/cuda/kernels/norm_row.cuh"

namespace tandem::cuda::fastmv {

// The norm-in form's input (one activation row, kNormIn): instead of reading x, each block forms
// x = γ ⊙ ρ(H + y + g·shared) itself, as the register norm kernel with the split norm_row::RegSplitFor
// gives (the same operations: the same bits), without writing H or x (dense_matvec.cuh
// LaunchDenseMatVecNormIn says who adds the inject to H).
struct StreamNormIn {
  const float* H = nullptr;           // the residual row, cols floats
  const float* y = nullptr;           // the pending inject, or nullptr
  const float* shared = nullptr;      // its shared term (PendingShared), or nullptr
  const float* gate_logit = nullptr;  // the shared term's gate logit, or nullptr (ungated)
  const float* gamma = nullptr;       // the norm's weights, cols floats
  float eps = 0.0f;
  int vec = 0, threads = 0;  // norm_row::RegSplitFor(cols / 4)
  bool h_early = false;      // H's writer is two or more launches back: copied before the PDL wait
};

namespace {  // internal linkage, as in matvec_core.cuh

// The norm-in form's copies into its shared memory (area: H, γ, y, shared, cols floats each), each
// float4 by the thread that will read it (the norm's split: no barrier before the reads).
__device__ __forceinline__ void NormInCopy(float4* dst, const float* src, const StreamNormIn& n, int h4) {
  if (static_cast<int>(threadIdx.x) >= n.threads) return;
  for (int k = 0; k < n.vec; ++k) {
    const int i = static_cast<int>(threadIdx.x) + k * n.threads;
    if (i >= h4) break;
    CpAsync16(static_cast<uint32_t>(__cvta_generic_to_shared(dst + i)), src + 4 * static_cast<int64_t>(i));
  }
}

// Before the PDL wait: γ, and H when its writer is two or more launches back (pdl.cuh).
__device__ __forceinline__ void NormInEarlyCopies(const StreamNormIn& n, int cols, float4* area) {
  const int h4 = cols / 4;
  NormInCopy(area + h4, n.gamma, n, h4);
  if (n.h_early) NormInCopy(area, n.H, n, h4);
  CpAsyncCommit();
}

// After the wait: the rest of the copies, then x = γ ⊙ ρ(H + y_eff) into the swizzled activation
// row xs4, with InjectRmsNormRegKernel's operations in its order (norm_row.cuh). The caller's
// barrier follows.
template <class F>
__device__ __forceinline__ void NormInStage(const StreamNormIn& n, int cols, float4* area, float4* xs4) {
  __shared__ float scratch[32];
  const int h4 = cols / 4;
  float4 *hs = area, *gs = area + h4, *ys = area + 2 * h4, *ss4 = area + 3 * h4;
  if (!n.h_early) NormInCopy(hs, n.H, n, h4);
  if (n.y != nullptr) NormInCopy(ys, n.y, n, h4);
  const bool with_shared = n.y != nullptr && n.shared != nullptr;
  if (with_shared) NormInCopy(ss4, n.shared, n, h4);
  CpAsyncCommit();
  const float g = with_shared ? norm_row::SharedGate(n.gate_logit, 0) : 1.0f;
  CpAsyncWait<0>();
  const bool mine = static_cast<int>(threadIdx.x) < n.threads;
  float ss = 0.0f;
  if (mine) {
    for (int k = 0; k < n.vec; ++k) {
      const int i = static_cast<int>(threadIdx.x) + k * n.threads;
      if (i >= h4) break;
      float4 v = hs[i];
      if (n.y != nullptr) {
        float4 d = ys[i];
        if (with_shared) d = norm_row::AddShared(d, g, ss4[i]);
        v = norm_row::InjectQuad(v, 1.0f, d);
        hs[i] = v;
      }
      ss = norm_row::AddSquares(ss, v);
    }
  }
  ss = BlockSum(ss, scratch);
  const float scale = norm_row::RmsScale(ss, cols, n.eps);
  if (mine) {
    for (int k = 0; k < n.vec; ++k) {
      const int i = static_cast<int>(threadIdx.x) + k * n.threads;
      if (i >= h4) break;
      xs4[F::Swz(i)] = norm_row::NormQuad(gs[i], hs[i], scale);
    }
  }
}

}  // namespace

}  // namespace tandem::cuda::fastmv

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_MATVEC_STREAM_NORM_IN_CUH_
