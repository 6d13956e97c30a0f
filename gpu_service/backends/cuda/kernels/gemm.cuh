// Device half of the prefill GEMM (gemm_plan.h is the host half): dequantization of a range of
// weight rows into a dense f16 or f32 tile, and conversion of f32 activations to f16, so that
// cuBLAS can multiply them.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_GEMM_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_GEMM_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "gpu_service/backends/cuda/device_matrix.h"

namespace tandem::cuda {

// Rows [row_begin, row_begin + count) of w, dequantized into dst (count × w.cols, row-major) as
// f16 bit patterns (round to nearest even) when to_f16, else as f32. With dst_lo (to_f16 only),
// also the residuals f16(v − f16(v)) there: hi + lo keeps about 22 bits of every value.
cudaError_t LaunchDequantizeRows(const DeviceMatrix& w, int64_t row_begin, int64_t count,
                                 bool to_f16, void* dst, cudaStream_t stream, void* dst_lo = nullptr);

// dst[i] = f16(src[i]) for count values (round to nearest even); with dst_lo, also the residuals.
cudaError_t LaunchF32ToF16(const float* src, int64_t count, uint16_t* dst, cudaStream_t stream,
                           uint16_t* dst_lo = nullptr);
// LaunchF32ToF16 converts 8 values a thread with 16-byte loads and stores where count % 8 == 0 and
// src, dst and dst_lo are 16-byte aligned, else (and with TANDEM_OLD_F32_TO_F16=1, read once;
// SetOldF32ToF16 in tests) one value a thread: the same bits either way.
bool OldF32ToF16();
void SetOldF32ToF16(bool on);

// The persistent f16 copy of a whole weight matrix that DenseGemm::Prepare keeps: row r at
// dst + r · copies · w.cols holds f16(s·w_r) ("hi"); with copies >= 2 followed by the residuals
// f16(s·w_r − hi) ("lo"), with copies == 3 followed by hi once more. s = `scale` is a power of
// two chosen by the caller so that s·w stays well inside f16's range and the lo half clear of
// f16's subnormals; the products undo it through cuBLAS's alpha. cudaErrorInvalidValue for
// copies outside 1..3 or a matrix the dense kernels do not read.
cudaError_t LaunchDequantizeToF16Layout(const DeviceMatrix& w, int copies, float scale, uint16_t* dst,
                                        cudaStream_t stream);

// *max_bits = max(*max_bits, bits of max |w| over the whole matrix) (as float bits: non-negative
// floats order like their bit patterns; a NaN element yields a NaN maximum). Set *max_bits to 0
// first.
cudaError_t LaunchMaxAbs(const DeviceMatrix& w, unsigned int* max_bits, cudaStream_t stream);

// The split activation rows, DenseGemm's kFastSplit inputs (gemm_plan.h): a row of `cols` values
// as 3 · cols f16 values [lo | hi | hi], hi = f16(x) and lo = f16(x − hi); lo starts at
// kSplitLoThird · cols, the first hi at kSplitHiThird · cols. Against the [hi | lo | hi] weight rows
// above one product gives hi·lo + lo·hi + hi·hi; against [hi | lo] rows the first 2 · cols meet
// the two hi thirds, then hi meets lo. Why lo first: along K the small terms then come before
// hi·hi. With hi·hi first ([hi | hi | lo], until 2026-12-05) an H100's tensor-core accumulator,
// already holding hi·hi, dropped low bits of the small terms added after it: 1.1e-5 relative L2
// against f64 where three separate products gave 2.9e-6 (the same product on an H200 gave 2.9e-6
// in either order; docs/VALIDATION.md, forty-seventh and forty-eighth sessions).
inline constexpr int64_t kSplitLoThird = 0;
inline constexpr int64_t kSplitHiThird = 1;

// n activation rows of `cols` values (row stride cols) into split rows [lo | hi | hi] (above).
cudaError_t LaunchF32ToF16SplitRows(const float* src, int64_t n, int64_t cols, uint16_t* dst, cudaStream_t stream);

// The SiLU-gated product of a stacked gate/up GEMM written straight in the f16 layout of the next
// prepared product (DenseGemm::F16Input): row t of gu (row stride ld) holds gate in [0, ffn) and
// up in [ffn, 2 · ffn); a = SiLU(gate) · up goes to dst as split rows [lo | hi | hi] of 3 · ffn
// or [hi] rows of ffn. With gate_out, also gate_out[t] = gu[t · ld + gate_col] (a logit stacked
// after them, copied out contiguous). Saves the f32 activation buffer and its conversion pass.
cudaError_t LaunchSiluMulToF16Rows(const float* gu, int64_t n, int64_t ld, int64_t ffn, bool split, uint16_t* dst,
                                   int64_t gate_col, float* gate_out, cudaStream_t stream);

}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_GEMM_CUH_
