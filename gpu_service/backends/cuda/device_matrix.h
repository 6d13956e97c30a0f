// A weight matrix in device memory, as every CUDA kernel family (kernels/, moe/) and the backend
// pass it around. Plain header (no CUDA, no Abseil) so that .cu and .cc files alike include it.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_DEVICE_MATRIX_H_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_DEVICE_MATRIX_H_

#include <cstdint>

#include "gpu_service/backends/cuda/weight_type_ids.h"

namespace tandem::cuda {

// ggml order: `rows` rows (outputs) of `cols` elements (inputs), row r at data + r * row_bytes;
// type is the ggml type id (weight_type_ids.h). cols is a multiple of RowLengthMultiple(type);
// data is KernelRowAlignment(type)-aligned, and so is row_bytes for the dense kernels (the MoE
// kernels derive the row stride from cols and the type's block geometry). data == nullptr: an
// absent tensor.
struct DeviceMatrix {
  uint32_t type = kTypeF32;
  const void* data = nullptr;
  int64_t cols = 0;
  int64_t rows = 0;
  int64_t row_bytes = 0;
  bool present() const { return data != nullptr; }
};

}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_DEVICE_MATRIX_H_
