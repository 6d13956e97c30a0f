#include "host_expert_worker/kernels/row_dot_kernels.h"

namespace tandem {

RowDotKernel FindRowDotKernel(KernelIsa isa, WeightType type) {
  switch (isa) {
    case KernelIsa::kScalar: return row_dot_internal::ScalarKernel(type);
    case KernelIsa::kAvx2: return row_dot_internal::Avx2Kernel(type);
    case KernelIsa::kAvx512Vnni: return row_dot_internal::Avx512VnniKernel(type);
  }
  return nullptr;
}

RowDotKernel FindBestRowDotKernel(KernelIsa isa, WeightType type, KernelIsa* used) {
  for (int i = static_cast<int>(isa); i >= 0; --i) {
    const KernelIsa candidate = static_cast<KernelIsa>(i);
    if (RowDotKernel k = FindRowDotKernel(candidate, type); k != nullptr) {
      if (used != nullptr) *used = candidate;
      return k;
    }
  }
  return nullptr;
}

}  // namespace tandem
