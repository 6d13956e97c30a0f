// Plain definitions shared by the CUDA kernel launchers (no Abseil: nvcc compiles this).
//
// Weight types are ggml's numeric type ids (common/weights/weight_types.h's WeightType values),
// passed as uint32_t so that .cu files need not include the Abseil-using weight_types.h.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_KERNEL_TYPES_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_KERNEL_TYPES_CUH_

#include <cstdint>

namespace tandem::cuda {

inline constexpr uint32_t kTypeF32 = 0;
inline constexpr uint32_t kTypeF16 = 1;
inline constexpr uint32_t kTypeQ8_0 = 8;
inline constexpr uint32_t kTypeQ4_K = 12;
inline constexpr uint32_t kTypeQ5_K = 13;
inline constexpr uint32_t kTypeQ6_K = 14;
inline constexpr uint32_t kTypeBF16 = 30;

// True for the weight types the GPU matvec / dequantize / gather kernels read.
inline constexpr bool IsGpuWeightType(uint32_t type) {
  return type == kTypeF32 || type == kTypeF16 || type == kTypeBF16 || type == kTypeQ8_0 ||
         type == kTypeQ4_K || type == kTypeQ5_K || type == kTypeQ6_K;
}

// Elements per block of a GPU weight type (the multiple that a row's length must be).
inline constexpr int64_t GpuBlockElems(uint32_t type) {
  return (type == kTypeQ4_K || type == kTypeQ5_K || type == kTypeQ6_K) ? 256 : 32;
}

// A weight matrix in device memory, ggml order: `rows` rows (outputs) of `cols` elements (inputs),
// row r at data + r * row_bytes. cols is a multiple of 32 (256 for K-quants); row_bytes is a
// multiple of 16 for the 16-byte-load types (F32, F16, BF16, Q4_K, Q5_K) and data 16-byte aligned.
struct DeviceMatrix {
  uint32_t type = kTypeF32;
  const void* data = nullptr;
  int64_t cols = 0;
  int64_t rows = 0;
  int64_t row_bytes = 0;
};

}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_KERNEL_TYPES_CUH_
