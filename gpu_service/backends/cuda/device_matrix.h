// A weight matrix in device memory, as every CUDA kernel family (kernels/, moe/) and the backend
// pass it around. Plain header (no CUDA, no Abseil) so that .cu and .cc files alike include it.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_DEVICE_MATRIX_H_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_DEVICE_MATRIX_H_

#include <cstdint>
#include <cstring>

#include "gpu_service/backends/cuda/weight_type_ids.h"

namespace tandem::cuda {

// ggml order: `rows` rows (outputs) of `cols` elements (inputs), row r at data + r * row_bytes;
// type is the ggml type id (weight_type_ids.h). cols is a multiple of RowLengthMultiple(type);
// data is KernelRowAlignment(type)-aligned, and so is row_bytes for the dense kernels (the MoE
// kernels derive the row stride from cols and the type's block geometry). data == nullptr: an
// absent tensor.
//
// The type is also the layout tag: kTypeQ8_0x8 is Q8_0 regrouped on upload (RepackQ8_0x8 below),
// so that the decode matvec reads 16-byte aligned quants (ggml's 34-byte Q8_0 blocks only allow
// 2-byte loads, which bound the decode matvec by load issue, not by HBM). A kernel that does not
// know the type refuses it (cudaErrorInvalidValue) instead of reading it as ggml blocks.
struct DeviceMatrix {
  uint32_t type = kTypeF32;
  const void* data = nullptr;
  int64_t cols = 0;
  int64_t rows = 0;
  int64_t row_bytes = 0;
  bool present() const { return data != nullptr; }
};

// Q8_0x8: each row is cols / 256 super-blocks of 272 bytes, super-block j holding the eight
// Q8_0 blocks 8j..8j+7 as [their eight f16 scales (16 bytes)][their 8 x 32 int8 quants in column
// order (256 bytes)]. Same bytes per row as Q8_0 (272 = 8 x 34), values identical; every row of
// a 16-byte aligned matrix is 16-byte aligned. cols must be a multiple of 256.
inline constexpr int64_t kQ8_0x8SuperBytes = 272;
inline constexpr int64_t Q8_0x8RowBytes(int64_t cols) { return cols / 256 * kQ8_0x8SuperBytes; }

// Whether m is a Q8_0x8 matrix whose rows are 16-byte aligned (data and row stride) and at least
// their natural length: what kernels that copy its rows in 16-byte pieces need.
inline bool Q8_0x8RowsAligned(const DeviceMatrix& m) {
  return m.type == kTypeQ8_0x8 && m.data != nullptr && m.cols > 0 && m.cols % 256 == 0 &&
         reinterpret_cast<uintptr_t>(m.data) % 16 == 0 && m.row_bytes % 16 == 0 && m.row_bytes >= Q8_0x8RowBytes(m.cols);
}

// Q8_0x8 by columns: the super-blocks of a Q8_0x8 matrix of rows × cols stored column super-block
// by column super-block, super-block j of row r at (j·rows + r)·272 (no row padding). What a
// column-split product (one super-block of columns over many rows a block: kernels/q8x8_columns.cuh)
// reads as one contiguous run instead of 272 bytes out of every row (CopyQ8_0x8ByColumns,
// kernels/dense_colsplit.cuh, makes it on the device).
inline constexpr int64_t Q8_0x8ByColumnsBytes(int64_t rows, int64_t cols) {
  return rows * (cols / 256) * kQ8_0x8SuperBytes;
}

// Rewrites `rows` Q8_0 rows (src row r at src + r * src_row_bytes) as Q8_0x8 rows of
// Q8_0x8RowBytes(cols) bytes at dst + r * Q8_0x8RowBytes(cols) (host memory, no overlap).
inline void RepackQ8_0x8(const uint8_t* src, int64_t src_row_bytes, int64_t rows, int64_t cols, uint8_t* dst) {
  const int64_t supers = cols / 256, dst_row_bytes = Q8_0x8RowBytes(cols);
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* in = src + r * src_row_bytes;
    uint8_t* out = dst + r * dst_row_bytes;
    for (int64_t j = 0; j < supers; ++j) {
      uint8_t* sb = out + j * kQ8_0x8SuperBytes;
      for (int b = 0; b < 8; ++b) {
        const uint8_t* blk = in + (8 * j + b) * 34;
        std::memcpy(sb + 2 * b, blk, 2);
        std::memcpy(sb + 16 + 32 * b, blk + 2, 32);
      }
    }
  }
}

}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_DEVICE_MATRIX_H_
