// The ggml block formats Tandem reads and writes, bit-exact with ggml so that real GGUF files load.
//
// One place knows the layouts: this header names every ggml type id (so that a GGUF file holding a
// type Tandem cannot compute with still opens and can be inspected), and for the types Tandem
// supports it offers dequantize / quantize / dot over one row. Block layouts follow ggml's
// published ggml-common.h; the code is Tandem's own.
#ifndef TANDEM_COMMON_WEIGHTS_WEIGHT_TYPES_H_
#define TANDEM_COMMON_WEIGHTS_WEIGHT_TYPES_H_

#include <cstdint>
#include <string_view>

#include "absl/status/statusor.h"

namespace tandem {

// ggml's type ids (enum ggml_type); the numeric values are part of the GGUF format.
enum class WeightType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ8_0 = 8,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kBF16 = 30,
};

struct WeightTypeInfo {
  uint32_t id;             // ggml type id
  std::string_view name;   // ggml's name: "f32", "q4_K", ...
  int64_t block_elems;     // elements per block (1 for plain float types)
  int64_t block_bytes;     // bytes per block
  bool supported;          // Tandem can dequantize / quantize / dot this type
};

// Every ggml type id known to ggml (supported or not); nullptr for an id ggml does not define.
const WeightTypeInfo* FindWeightTypeInfo(uint32_t ggml_type_id);
const WeightTypeInfo& GetWeightTypeInfo(WeightType type);

// Parses ggml's name ("q4_K", "Q4_K", "bf16", ...), case-insensitively; only supported types.
absl::StatusOr<WeightType> ParseWeightType(std::string_view name);

// Bytes of a row of n elements; n must be a multiple of the block size (InvalidArgument if not).
absl::StatusOr<int64_t> RowBytes(WeightType type, int64_t n);

// Row operations. n is a multiple of the type's block size (callers check with RowBytes first);
// src/dst hold exactly RowBytes(type, n) bytes.
void DequantizeRow(WeightType type, const void* src, float* dst, int64_t n);
// Reference-quality quantization (ggml's reference algorithms: used by the model generator and
// converter, never on a hot path).
void QuantizeRow(WeightType type, const float* src, void* dst, int64_t n);
// Reference dot product of one stored row with f32 activations, accumulated in f32 per block.
float DotRow(WeightType type, const void* row, const float* x, int64_t n);

}  // namespace tandem

#endif  // TANDEM_COMMON_WEIGHTS_WEIGHT_TYPES_H_
