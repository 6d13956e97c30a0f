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

}  // namespace tandem::cuda
