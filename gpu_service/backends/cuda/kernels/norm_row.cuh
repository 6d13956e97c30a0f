// The per-value steps of the inject and RMS norm (norm_streams.cuh), shared by the norm kernels
// and by the products that form their input row themselves (matvec_stream.cuh's norm-in form,
// dense_matvec.cuh LaunchDenseMatVecNormIn): one source for each expression, so that every kernel
// that forms x compiles it to the same operations and x has the same bits whichever formed it.
// Device-only header.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_NORM_ROW_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_NORM_ROW_CUH_

#include <cuda_runtime.h>

#include <cstdint>

namespace tandem::cuda::norm_row {

// PendingShared's gate σ(gate logit of token t): OneDownKernel's expression (expert_decode_one.cu),
// written the same way so that it compiles to the same operations and the same bits.
__device__ __forceinline__ float SharedGate(const float* sg, int64_t t) {
  float g = 1.0f;
  if (sg != nullptr) g = 1.0f / (1.0f + expf(-sg[t]));
  return g;
}

// y + g·shared for four values, as OneDownKernel's last step: fmaf(g, shared, y).
__device__ __forceinline__ float4 AddShared(float4 d, float g, float4 s) {
  return make_float4(fmaf(g, s.x, d.x), fmaf(g, s.y, d.y), fmaf(g, s.z, d.z), fmaf(g, s.w, d.w));
}

// H + a·d for four values (a = 1 without inject weights: the same bits as H + d).
__device__ __forceinline__ float4 InjectQuad(float4 v, float a, float4 d) {
  v.x += a * d.x;
  v.y += a * d.y;
  v.z += a * d.z;
  v.w += a * d.w;
  return v;
}

// ss + the squares of four values: x² rounded, y², z², w² fused into it in that order, then added
// to ss. Spelled with explicit roundings because the plain expression leaves the compiler a choice
// (which of x·x and y·y to round before fusing the other) that CUDA 13 made differently in different
// kernels (gdn_decode_parts.cuh's SumSquaresXFirst says where that was seen first; here the norm-in
// product's sums differed from the register norm kernel's in the last place at rows of 256 floats,
// H200, 2026-12-03).
__device__ __forceinline__ float AddSquares(float ss, float4 v) {
  return __fadd_rn(ss, fmaf(v.w, v.w, fmaf(v.z, v.z, fmaf(v.y, v.y, __fmul_rn(v.x, v.x)))));
}

// 1 / ρ for a row of h values whose squares sum to ss.
__device__ __forceinline__ float RmsScale(float ss, int64_t h, float eps) {
  return rsqrtf(ss / static_cast<float>(h) + eps);
}

// γ ⊙ (v · scale) for four values.
__device__ __forceinline__ float4 NormQuad(float4 g, float4 v, float scale) {
  return make_float4(g.x * (v.x * scale), g.y * (v.y * scale), g.z * (v.z * scale), g.w * (v.w * scale));
}

// The register norm kernel's split of a row of h4 float4 (norm_streams.cu InjectRmsNormRegKernel
// <kVec, kThreads>): thread i sums its vectors i, i + threads, ... (at most vec of them) in that
// order, then the block adds the threads' sums (BlockSum). A kernel with more threads per block
// forms the same sum when its threads past `threads` add 0 (exactly: BlockSum's butterflies then
// add +0.0 to each partial sum). {0, 0} where the register kernel does not take the row.
struct RegSplit {
  int vec = 0;
  int threads = 0;
};
__host__ __device__ constexpr RegSplit RegSplitFor(int64_t h4) {
  if (h4 <= 128) return {1, 128};
  if (h4 <= 256) return {2, 128};
  if (h4 < 512) return {4, 128};
  if (h4 <= 512) return {2, 256};
  if (h4 <= 1024) return {4, 256};
  return {0, 0};
}

}  // namespace tandem::cuda::norm_row

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_NORM_ROW_CUH_
