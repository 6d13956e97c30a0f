// Keeps weight_type_ids.h (the CUDA kernels' ggml type ids) in step with common/weights/weight_types.h.
#include "common/weights/weight_types.h"
#include "gpu_service/backends/cuda/weight_type_ids.h"

namespace tandem::cuda {

static_assert(kTypeF32 == static_cast<uint32_t>(WeightType::kF32));
static_assert(kTypeF16 == static_cast<uint32_t>(WeightType::kF16));
static_assert(kTypeBF16 == static_cast<uint32_t>(WeightType::kBF16));
static_assert(kTypeQ4_0 == static_cast<uint32_t>(WeightType::kQ4_0));
static_assert(kTypeQ8_0 == static_cast<uint32_t>(WeightType::kQ8_0));
static_assert(kTypeQ2_K == static_cast<uint32_t>(WeightType::kQ2_K));
static_assert(kTypeQ3_K == static_cast<uint32_t>(WeightType::kQ3_K));
static_assert(kTypeQ4_K == static_cast<uint32_t>(WeightType::kQ4_K));
static_assert(kTypeQ5_K == static_cast<uint32_t>(WeightType::kQ5_K));
static_assert(kTypeQ6_K == static_cast<uint32_t>(WeightType::kQ6_K));

// DispatchOnType reaches the case of the type asked for, and only types of its list.
constexpr int Dispatched(uint32_t type, auto types) {
  return DispatchOnType(type, types, -1, [](auto t) { return static_cast<int>(decltype(t)::value); });
}
static_assert(Dispatched(kTypeQ4_K, MoeWeightTypes{}) == static_cast<int>(kTypeQ4_K));
static_assert(Dispatched(kTypeQ2_K, MoeWeightTypes{}) == static_cast<int>(kTypeQ2_K));
static_assert(Dispatched(kTypeQ8_0x8, MoeWeightTypes{}) == -1);
static_assert(Dispatched(kTypeQ8_0x8, DenseWeightTypes{}) == static_cast<int>(kTypeQ8_0x8));
static_assert(Dispatched(kTypeQ8_0x8, DenseGgmlWeightTypes{}) == -1);
static_assert(Dispatched(kTypeQ2_K, DenseWeightTypes{}) == -1);
static_assert(Dispatched(kTypeBF16, DenseGgmlWeightTypes{}) == static_cast<int>(kTypeBF16));
static_assert(Dispatched(7, MoeWeightTypes{}) == -1);
static_assert(MoeKernelsSupportType(kTypeQ4_0) && !MoeKernelsSupportType(kTypeQ8_0x8));
static_assert(DenseKernelsSupportType(kTypeQ8_0x8) && !DenseKernelsSupportType(kTypeQ3_K));

}  // namespace tandem::cuda
