// Device half of the fp8-corrected split product (DenseGemmOptions::split_f8, gemm_plan.h):
//   y = x_hi · w_hiᵀ (f16, K = cols) + [x_lo8 | x_hi8] · [w_hi8 | w_lo8]ᵀ (fp8 e4m3, K = 2 · cols)
// with x_hi = f16(x), x_lo = f16(x − x_hi) (likewise for w), x_hi8 = e4m3(s_x · x_hi),
// x_lo8 = e4m3(2^11 · s_x · x_lo), w_hi8 = e4m3(s_w · w_hi), w_lo8 = e4m3(2^11 · s_w · w_lo): both
// halves of the fp8 product carry the scale 2^11 · s_x · s_w, which cuBLASLt's A and B scale
// pointers undo. s is the largest power of two that keeps s · max |hi| <= 448 (e4m3's largest
// value); |lo| <= 2^-11 · |hi|'s binade, so 2^11 · s · |lo| stays in range too.
//
// The activations: the [lo | hi | hi] split rows of gemm.cuh (row stride 3 · cols f16 values; the
// f16 product reads the hi third at kSplitHiThird · cols) and beside them "F8 rows" of 2 · cols
// e4m3 values [x_lo8 | x_hi8] (row stride 2 · cols bytes) in a buffer of their own, so that the split rows stay
// intact for the products that keep the three f16 products (DenseGemmOptions::split_f8_min_weights).
// The fused writers of split rows (LaunchInjectRmsNormF16, LaunchSiluMulToF16Rows,
// LaunchGdnGatedNormToF16) need no variant: LaunchSplitRowsToF8 derives the F8 rows from theirs.
//
// s_x comes from the tensor's max |x_hi| measured on the device (no host sync: the products run
// inside CUDA graphs): LaunchF8Amax* then the conversion, which also stores 1 / (2^11 · s_x) in
// *b_scale for the product and leaves *amax_bits and its block counter *done at 0 again (both 0
// before the first call: the caller zeroes them once), so that no memset launch is needed.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_GEMM_F8_CONVERT_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_GEMM_F8_CONVERT_CUH_

#include <cuda_runtime.h>

#include <cstdint>

namespace tandem::cuda {

// *amax_bits = max(*amax_bits, bits of max |hi|) over the hi third of n split rows ([lo | hi | hi],
// row stride 3 · cols f16 values). Non-negative floats order like their bits; *amax_bits is 0
// before (see above). A NaN value gives +inf (then s_x = 1).
cudaError_t LaunchF8AmaxSplitRows(const uint16_t* rows, int64_t n, int64_t cols, unsigned int* amax_bits,
                                  cudaStream_t stream);
// The F8 rows (dst8, row stride 2 · cols) of the same n split rows (read only: the first and the
// last thirds); *b_scale = 1 / (2^11 · s_x) with s_x from *amax_bits, which it resets with *done.
// cols a multiple of 8, rows and dst8 16-byte aligned.
cudaError_t LaunchSplitRowsToF8(const uint16_t* rows, int64_t n, int64_t cols, unsigned int* amax_bits,
                                unsigned int* done, uint8_t* dst8, float* b_scale, cudaStream_t stream);

// Weights: rows × [hi | lo] f16 rows (gemm.cuh's copies == 2 layout, already scaled by the
// prepared copy's power of two) into hi_dst (rows × cols f16) and f8_dst (rows × 2 · cols e4m3:
// [e4m3(s_w · hi) | e4m3(2^11 · s_w · lo)]). s_w a power of two with s_w · max |hi| <= 448.
cudaError_t LaunchSplitWeightsToF8(const uint16_t* src, int64_t rows, int64_t cols, float s_w, uint16_t* hi_dst,
                                   uint8_t* f8_dst, cudaStream_t stream);

}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_GEMM_F8_CONVERT_CUH_
