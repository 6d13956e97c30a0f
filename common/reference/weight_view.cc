#include "common/reference/weight_view.h"

#include <cstring>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace tandem {

MatrixView F32Matrix(const float* data, int64_t cols, int64_t rows) {
  return MatrixView{WeightType::kF32, data, cols, rows, cols * static_cast<int64_t>(sizeof(float))};
}

ExpertMatrixView F32ExpertMatrix(const float* data, int64_t cols, int64_t rows, int64_t experts) {
  return ExpertMatrixView{WeightType::kF32, data, cols, rows, experts,
                          cols * static_cast<int64_t>(sizeof(float))};
}

void DequantizeMatrixRow(const MatrixView& m, int64_t r, float* out) {
  if (m.type == WeightType::kF32) {
    std::memcpy(out, m.row(r), static_cast<size_t>(m.cols) * sizeof(float));
  } else {
    DequantizeRow(m.type, m.row(r), out, m.cols);
  }
}

namespace {

absl::Status CheckRowBytes(std::string_view name, WeightType type, int64_t cols, int64_t row_bytes) {
  const absl::StatusOr<int64_t> expected = RowBytes(type, cols);
  if (!expected.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(std::string(name), ": ", expected.status().message()));
  }
  if (*expected != row_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(std::string(name), ": row_bytes is ", row_bytes,
                                                   ", expected ", *expected, " for ", cols,
                                                   " columns of type ",
                                                   std::string(GetWeightTypeInfo(type).name)));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckMatrix(std::string_view name, const MatrixView& m, int64_t cols, int64_t rows,
                         bool optional) {
  if (!m.present()) {
    if (optional) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(std::string(name), " is missing"));
  }
  if (m.cols != cols || m.rows != rows) {
    return absl::InvalidArgumentError(absl::StrCat(std::string(name), " has shape {", m.cols, ", ",
                                                   m.rows, "}, expected {", cols, ", ", rows, "}"));
  }
  return CheckRowBytes(name, m.type, m.cols, m.row_bytes);
}

absl::Status CheckExpertMatrix(std::string_view name, const ExpertMatrixView& m, int64_t cols,
                               int64_t rows, int64_t experts) {
  if (!m.present()) return absl::InvalidArgumentError(absl::StrCat(std::string(name), " is missing"));
  if (m.cols != cols || m.rows != rows || m.experts != experts) {
    return absl::InvalidArgumentError(absl::StrCat(std::string(name), " has shape {", m.cols, ", ",
                                                   m.rows, ", ", m.experts, "}, expected {", cols,
                                                   ", ", rows, ", ", experts, "}"));
  }
  return CheckRowBytes(name, m.type, m.cols, m.row_bytes);
}

absl::Status CheckVector(std::string_view name, VectorView v, int64_t size, bool optional) {
  if (v.empty()) {
    if (optional) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(std::string(name), " is missing"));
  }
  if (static_cast<int64_t>(v.size()) != size) {
    return absl::InvalidArgumentError(
        absl::StrCat(std::string(name), " has ", v.size(), " elements, expected ", size));
  }
  return absl::OkStatus();
}

}  // namespace tandem
