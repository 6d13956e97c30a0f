// ggml type ids as plain constants, for the CUDA kernel families (dense kernels/ and MoE moe/),
// whose translation units cannot include common/weights/weight_types.h (nvcc keeps Abseil out).
// weight_type_ids_check.cc asserts that they equal tandem::WeightType's values.
//
// Which family reads which type: the MoE kernels read every type below (MoeKernelsSupportType);
// the dense kernels (matvec, embedding gather, dequantize-to-GEMM) read a subset
// (DenseKernelsSupportType). Both dequantize through dequant.cuh.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_WEIGHT_TYPE_IDS_H_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_WEIGHT_TYPE_IDS_H_

#include <cstdint>
#include <type_traits>

namespace tandem::cuda {

inline constexpr uint32_t kTypeF32 = 0;
inline constexpr uint32_t kTypeF16 = 1;
inline constexpr uint32_t kTypeQ4_0 = 2;
inline constexpr uint32_t kTypeQ8_0 = 8;
inline constexpr uint32_t kTypeQ2_K = 10;
inline constexpr uint32_t kTypeQ3_K = 11;
inline constexpr uint32_t kTypeQ4_K = 12;
inline constexpr uint32_t kTypeQ5_K = 13;
inline constexpr uint32_t kTypeQ6_K = 14;
inline constexpr uint32_t kTypeBF16 = 30;
// Not a ggml type: Q8_0 regrouped on upload into 272-byte super-blocks of eight blocks (the
// layout is described in device_matrix.h). Only the dense kernels read it; the MoE kernels, the
// embedding gather and every other switch on the type refuse it (an unknown type).
inline constexpr uint32_t kTypeQ8_0x8 = 1008;

// A set of type ids: which formats a kernel family reads, and the cases DispatchOnType tries.
template <uint32_t... kTypes>
struct WeightTypes {
  static constexpr bool Contains(uint32_t type) { return ((type == kTypes) || ...); }
};

// The formats the MoE kernels read: every ggml type above.
using MoeWeightTypes = WeightTypes<kTypeF32, kTypeF16, kTypeBF16, kTypeQ4_0, kTypeQ8_0, kTypeQ2_K, kTypeQ3_K, kTypeQ4_K,
                                   kTypeQ5_K, kTypeQ6_K>;
// The ggml formats the dense kernels (matvec / dequantize / gather of kernels/) read.
using DenseGgmlWeightTypes = WeightTypes<kTypeF32, kTypeF16, kTypeBF16, kTypeQ8_0, kTypeQ4_K, kTypeQ5_K, kTypeQ6_K>;
// Those and Q8_0x8: what the dense products (matvec, DequantizeRows, DenseGemm) read.
using DenseWeightTypes = WeightTypes<kTypeF32, kTypeF16, kTypeBF16, kTypeQ8_0, kTypeQ4_K, kTypeQ5_K, kTypeQ6_K,
                                     kTypeQ8_0x8>;

// True for the formats the MoE kernels can read (all of the ggml types above).
inline constexpr bool MoeKernelsSupportType(uint32_t type) { return MoeWeightTypes::Contains(type); }

// True for the formats the dense kernels (matvec / dequantize / gather of kernels/) read.
inline constexpr bool DenseKernelsSupportType(uint32_t type) { return DenseWeightTypes::Contains(type); }

// The one place that turns a runtime type id into a kernel's template argument: returns
// f(std::integral_constant<uint32_t, T>{}) for the T of `types` equal to `type`, or `otherwise`
// when none is (callers pass cudaErrorInvalidValue, or a marker for "another path").
template <class R, uint32_t... kTypes, class F>
constexpr R DispatchOnType(uint32_t type, WeightTypes<kTypes...>, R otherwise, F&& f) {
  R result = otherwise;
  (void)((type == kTypes ? (result = f(std::integral_constant<uint32_t, kTypes>{}), true) : false) || ...);
  return result;
}

// True for the K-quants (256-element super-blocks).
inline constexpr bool IsKQuant(uint32_t type) {
  return type == kTypeQ2_K || type == kTypeQ3_K || type == kTypeQ4_K || type == kTypeQ5_K ||
         type == kTypeQ6_K;
}

// The multiple that a row's length must be for the kernels: 256 for the K-quants and Q8_0x8 (one
// super-block), 32 (one dequantized chunk, dequant.cuh) for every other type.
inline constexpr int64_t RowLengthMultiple(uint32_t type) {
  return IsKQuant(type) || type == kTypeQ8_0x8 ? 256 : 32;
}

// Byte alignment the kernels need for the start of every row of this type (dequant.cuh's loads);
// 0 for a type no kernel reads.
inline constexpr int KernelRowAlignment(uint32_t type) {
  switch (type) {
    case kTypeF32: case kTypeF16: case kTypeBF16: case kTypeQ4_K: case kTypeQ5_K: case kTypeQ8_0x8: return 16;
    case kTypeQ2_K: return 4;
    case kTypeQ3_K: case kTypeQ6_K: case kTypeQ4_0: case kTypeQ8_0: return 2;
    default: return 0;
  }
}

}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_WEIGHT_TYPE_IDS_H_
