#include "host_expert_worker/kernels/kernel_isa.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace tandem {

std::string_view KernelIsaName(KernelIsa isa) {
  switch (isa) {
    case KernelIsa::kScalar: return "scalar";
    case KernelIsa::kAvx2: return "avx2";
    case KernelIsa::kAvx512Vnni: return "avx512vnni";
  }
  return "unknown";
}

absl::StatusOr<KernelIsa> ParseKernelIsa(std::string_view name) {
  if (name == "auto") return BestKernelIsa();
  for (KernelIsa isa : {KernelIsa::kScalar, KernelIsa::kAvx2, KernelIsa::kAvx512Vnni}) {
    if (name == KernelIsaName(isa)) return isa;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown kernel ISA '", std::string(name), "' (expected auto, scalar, avx2 or avx512vnni)"));
}

bool KernelIsaSupported(KernelIsa isa) {
  switch (isa) {
    case KernelIsa::kScalar:
      return true;
    case KernelIsa::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
             __builtin_cpu_supports("f16c");
    case KernelIsa::kAvx512Vnni:
      return KernelIsaSupported(KernelIsa::kAvx2) && __builtin_cpu_supports("avx512f") &&
             __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
             __builtin_cpu_supports("avx512vnni");
  }
  return false;
}

KernelIsa BestKernelIsa() {
  if (KernelIsaSupported(KernelIsa::kAvx512Vnni)) return KernelIsa::kAvx512Vnni;
  if (KernelIsaSupported(KernelIsa::kAvx2)) return KernelIsa::kAvx2;
  return KernelIsa::kScalar;
}

}  // namespace tandem
