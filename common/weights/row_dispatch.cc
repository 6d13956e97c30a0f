// DequantizeRow / QuantizeRow / DotRow (weight_types.h): picks the per-type kernel.
#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "common/weights/row_kernels.h"
#include "common/weights/weight_types.h"

namespace tandem {
namespace {

using DequantizeFn = void (*)(const uint8_t*, float*, int64_t);
using QuantizeFn = void (*)(const float*, uint8_t*, int64_t);

struct RowKernels {
  DequantizeFn dequantize;
  QuantizeFn quantize;
};

// A WeightType value outside the enumerators can only come from a bad cast; the row functions
// have no error channel (callers validate with RowBytes / ParseWeightType first), so stop loudly.
[[noreturn]] void DieUnsupported(WeightType type, const char* what) {
  std::fprintf(stderr, "tandem: %s called with unsupported weight type id %u\n", what,
               static_cast<unsigned>(type));
  std::abort();
}

RowKernels KernelsFor(WeightType type, const char* what) {
  switch (type) {
    case WeightType::kF32: return {kernels::DequantizeF32, kernels::QuantizeF32};
    case WeightType::kF16: return {kernels::DequantizeF16, kernels::QuantizeF16};
    case WeightType::kBF16: return {kernels::DequantizeBF16, kernels::QuantizeBF16};
    case WeightType::kQ4_0: return {kernels::DequantizeQ4_0, kernels::QuantizeQ4_0};
    case WeightType::kQ8_0: return {kernels::DequantizeQ8_0, kernels::QuantizeQ8_0};
    case WeightType::kQ2_K: return {kernels::DequantizeQ2_K, kernels::QuantizeQ2_K};
    case WeightType::kQ3_K: return {kernels::DequantizeQ3_K, kernels::QuantizeQ3_K};
    case WeightType::kQ4_K: return {kernels::DequantizeQ4_K, kernels::QuantizeQ4_K};
    case WeightType::kQ5_K: return {kernels::DequantizeQ5_K, kernels::QuantizeQ5_K};
    case WeightType::kQ6_K: return {kernels::DequantizeQ6_K, kernels::QuantizeQ6_K};
  }
  DieUnsupported(type, what);
}

// Float types have one element per block; DotRow walks them in chunks of this many so that the
// f32 accumulation is per chunk, as for the 256-element K-quant super-blocks.
constexpr int64_t kFloatDotChunk = 256;

}  // namespace

void DequantizeRow(WeightType type, const void* src, float* dst, int64_t n) {
  KernelsFor(type, "DequantizeRow").dequantize(static_cast<const uint8_t*>(src), dst, n);
}

void QuantizeRow(WeightType type, const float* src, void* dst, int64_t n) {
  KernelsFor(type, "QuantizeRow").quantize(src, static_cast<uint8_t*>(dst), n);
}

float DotRow(WeightType type, const void* row, const float* x, int64_t n) {
  const RowKernels kernels = KernelsFor(type, "DotRow");
  const WeightTypeInfo& info = GetWeightTypeInfo(type);
  const int64_t chunk_elems = info.block_elems == 1 ? kFloatDotChunk : info.block_elems;
  const int64_t chunk_bytes = chunk_elems / info.block_elems * info.block_bytes;
  const auto* bytes = static_cast<const uint8_t*>(row);
  float values[kFloatDotChunk];  // the largest block has 256 elements
  float total = 0.0f;
  for (int64_t start = 0; start < n; start += chunk_elems) {
    const int64_t count = std::min(chunk_elems, n - start);  // only a float row's tail is short
    kernels.dequantize(bytes + start / chunk_elems * chunk_bytes, values, count);
    float partial = 0.0f;
    for (int64_t i = 0; i < count; ++i) partial += values[i] * x[start + i];
    total += partial;
  }
  return total;
}

}  // namespace tandem
