// The instruction-set families the expert kernels are compiled for, and runtime detection.
//
// Every kernel exists as portable scalar code; the AVX2 and AVX-512 VNNI families are compiled
// into the same binary with per-function target attributes (one file per family) and chosen at
// run time, so one build runs on any x86-64 machine. No AMX path: see docs/PERF.md.
#ifndef TANDEM_HOST_EXPERT_WORKER_KERNELS_KERNEL_ISA_H_
#define TANDEM_HOST_EXPERT_WORKER_KERNELS_KERNEL_ISA_H_

#include <string_view>

#include "absl/status/statusor.h"

namespace tandem {

enum class KernelIsa {
  kScalar = 0,      // portable C++
  kAvx2 = 1,        // AVX2 + FMA (Haswell and later, Zen 1 and later)
  kAvx512Vnni = 2,  // AVX-512 F/BW/VL + VNNI (Ice Lake, Sapphire Rapids, Zen 4)
};

// "scalar", "avx2", "avx512vnni".
std::string_view KernelIsaName(KernelIsa isa);
// Parses KernelIsaName's spelling, or "auto" (the best this CPU runs).
absl::StatusOr<KernelIsa> ParseKernelIsa(std::string_view name);

// True when this CPU can run the family (__builtin_cpu_supports of every feature it uses).
bool KernelIsaSupported(KernelIsa isa);
// The widest family this CPU runs.
KernelIsa BestKernelIsa();

}  // namespace tandem

#endif  // TANDEM_HOST_EXPERT_WORKER_KERNELS_KERNEL_ISA_H_
