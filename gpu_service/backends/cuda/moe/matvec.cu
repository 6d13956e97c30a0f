// Type dispatch and argument checks of the matrix-vector launchers (matvec.cuh). Expert units of
// the types ExpertDecodeRoutesType names go to the decode kernel of expert_decode.cuh.
#include "gpu_service/backends/cuda/moe/matvec.cuh"

#include "gpu_service/backends/cuda/moe/expert_decode.cuh"
#include "gpu_service/backends/cuda/moe/matvec_impl.cuh"
#include "gpu_service/backends/cuda/weight_type_ids.h"

namespace tandem::cuda {

// Defined (explicitly instantiated) in matvec_plain.cu and matvec_kquant_*.cu.
extern template cudaError_t LaunchMatVecTyped<kTypeF32>(const MatVecArgs&);
extern template cudaError_t LaunchMatVecTyped<kTypeF16>(const MatVecArgs&);
extern template cudaError_t LaunchMatVecTyped<kTypeBF16>(const MatVecArgs&);
extern template cudaError_t LaunchMatVecTyped<kTypeQ4_0>(const MatVecArgs&);
extern template cudaError_t LaunchMatVecTyped<kTypeQ8_0>(const MatVecArgs&);
extern template cudaError_t LaunchMatVecTyped<kTypeQ2_K>(const MatVecArgs&);
extern template cudaError_t LaunchMatVecTyped<kTypeQ3_K>(const MatVecArgs&);
extern template cudaError_t LaunchMatVecTyped<kTypeQ4_K>(const MatVecArgs&);
extern template cudaError_t LaunchMatVecTyped<kTypeQ5_K>(const MatVecArgs&);
extern template cudaError_t LaunchMatVecTyped<kTypeQ6_K>(const MatVecArgs&);

namespace {

constexpr size_t kMaxSharedBytes = 200 * 1024;

bool ShapeOk(uint32_t type, int cols, int rows_bucket) {
  return cols > 0 && cols % RowLengthMultiple(type) == 0 && MatVecSharedBytes(rows_bucket, cols) <= kMaxSharedBytes;
}

cudaError_t Dispatch(uint32_t type, const MatVecArgs& a) {
  return DispatchOnType(type, MoeWeightTypes{}, cudaErrorInvalidValue,
                        [&](auto t) { return LaunchMatVecTyped<decltype(t)::value>(a); });
}

bool Aligned(const void* p, uint32_t type) {
  const int align = KernelRowAlignment(type);
  return align > 0 && reinterpret_cast<uintptr_t>(p) % align == 0;
}

}  // namespace

cudaError_t LaunchDenseMatVec(uint32_t type, const void* w, int cols, int rows, const float* x, int n, float* y,
                              cudaStream_t stream) {
  if (n <= 0 || rows <= 0) return cudaSuccess;
  const int bucket = n <= 1 ? 1 : kMaxUnitRows;
  if (!ShapeOk(type, cols, bucket) || !Aligned(w, type)) return cudaErrorInvalidValue;
  MatVecArgs a{MatVecMode::kDense, w, nullptr, 0, n, cols, rows, x, y, stream, nullptr};
  return Dispatch(type, a);
}

cudaError_t LaunchExpertGateUp(uint32_t type, const ExpertUnit* units, int num_units, int max_rows, int h, int inner,
                               const float* x, float* act, cudaStream_t stream, const int* device_num_units) {
  if (GetExpertKernelChoice() != ExpertKernelChoice::kGeneric && ExpertDecodeRoutesType(type)) {
    return LaunchExpertDecodeGateUp(type, units, num_units, max_rows, h, inner, x, act, stream, device_num_units);
  }
  if (num_units <= 0) return cudaSuccess;
  if (max_rows < 1 || max_rows > kMaxUnitRows || !ShapeOk(type, h, max_rows <= 1 ? 1 : kMaxUnitRows) ||
      !MoeKernelsSupportType(type)) {
    return cudaErrorInvalidValue;
  }
  MatVecArgs a{MatVecMode::kGateUp, nullptr, units, num_units, max_rows, h, inner, x, act, stream, device_num_units};
  return Dispatch(type, a);
}

cudaError_t LaunchExpertDown(uint32_t type, const ExpertUnit* units, int num_units, int max_rows, int inner, int h,
                             const float* act, float* partial, cudaStream_t stream, const int* device_num_units) {
  if (GetExpertKernelChoice() != ExpertKernelChoice::kGeneric && ExpertDecodeRoutesType(type)) {
    return LaunchExpertDecodeDown(type, units, num_units, max_rows, inner, h, act, partial, stream, device_num_units);
  }
  if (num_units <= 0) return cudaSuccess;
  if (max_rows < 1 || max_rows > kMaxUnitRows || !ShapeOk(type, inner, max_rows <= 1 ? 1 : kMaxUnitRows) ||
      !MoeKernelsSupportType(type)) {
    return cudaErrorInvalidValue;
  }
  MatVecArgs a{MatVecMode::kDown, nullptr, units, num_units, max_rows, inner, h, act, partial, stream,
               device_num_units};
  return Dispatch(type, a);
}

}  // namespace tandem::cuda
