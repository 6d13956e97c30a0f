// Non-owning views of weight tensors as the CPU reference reads them.
//
// A MatrixView is a ggml 2-D tensor {cols, rows} (ne0 = cols = the input dimension, ne1 = rows =
// the output dimension) whose rows are stored one after another, each row_bytes long in the
// tensor's block format. An ExpertMatrixView is a 3-D tensor {cols, rows, experts}: expert e is the
// contiguous slice starting at e * rows * row_bytes. Views never own memory: the mapped GGUF file
// (or the test) keeps the bytes alive for as long as the view is used.
#ifndef TANDEM_COMMON_REFERENCE_WEIGHT_VIEW_H_
#define TANDEM_COMMON_REFERENCE_WEIGHT_VIEW_H_

#include <cstdint>
#include <span>
#include <string_view>

#include "absl/status/status.h"
#include "common/weights/weight_types.h"

namespace tandem {

// An f32 vector tensor (norm weights, biases, small f32 matrices such as conv taps).
using VectorView = std::span<const float>;

struct MatrixView {
  WeightType type = WeightType::kF32;
  const void* data = nullptr;  // nullptr: the tensor is absent
  int64_t cols = 0;            // ne0: input dimension
  int64_t rows = 0;            // ne1: output dimension
  int64_t row_bytes = 0;       // RowBytes(type, cols)

  bool present() const { return data != nullptr; }
  const uint8_t* row(int64_t r) const { return static_cast<const uint8_t*>(data) + r * row_bytes; }
};

struct ExpertMatrixView {
  WeightType type = WeightType::kF32;
  const void* data = nullptr;
  int64_t cols = 0;
  int64_t rows = 0;
  int64_t experts = 0;
  int64_t row_bytes = 0;

  bool present() const { return data != nullptr; }
  // Expert e's {cols, rows} matrix; 0 <= e < experts.
  MatrixView expert(int64_t e) const {
    return MatrixView{type, static_cast<const uint8_t*>(data) + e * rows * row_bytes, cols, rows,
                      row_bytes};
  }
};

// Views of f32 data laid out as ggml stores it (row r at data + r * cols).
MatrixView F32Matrix(const float* data, int64_t cols, int64_t rows);
ExpertMatrixView F32ExpertMatrix(const float* data, int64_t cols, int64_t rows, int64_t experts);

// Writes row r of the matrix as cols f32 values (a token embedding lookup, an Engram table row).
void DequantizeMatrixRow(const MatrixView& m, int64_t r, float* out);

// Checks that a present view has the given shape and a row size consistent with its type; `name`
// names the tensor in the error. An absent view is an error unless `optional`.
absl::Status CheckMatrix(std::string_view name, const MatrixView& m, int64_t cols, int64_t rows,
                         bool optional = false);
absl::Status CheckExpertMatrix(std::string_view name, const ExpertMatrixView& m, int64_t cols,
                               int64_t rows, int64_t experts);
absl::Status CheckVector(std::string_view name, VectorView v, int64_t size, bool optional = false);

}  // namespace tandem

#endif  // TANDEM_COMMON_REFERENCE_WEIGHT_VIEW_H_
