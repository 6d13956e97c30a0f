#include "gpu_service/backends/cuda/smem_carveout.h"

#include <atomic>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "gpu_service/backends/cuda/env_switch.h"

namespace tandem::cuda {
namespace {

std::atomic<bool>& CarveoutSwitch() {
  static std::atomic<bool> on{EnvSwitch("TANDEM_MAX_SMEM_CARVEOUT")};
  return on;
}

// The kernels whose preference is set (one entry per kernel function).
struct SetKernels {
  absl::Mutex mu;
  absl::flat_hash_set<const void*> done ABSL_GUARDED_BY(mu);
};
SetKernels& Kernels() {
  static SetKernels* kernels = new SetKernels;  // never destroyed: launches may come from exit paths
  return *kernels;
}

}  // namespace

bool MaxSmemCarveout() { return CarveoutSwitch().load(std::memory_order_relaxed); }
void SetMaxSmemCarveout(bool on) { CarveoutSwitch().store(on, std::memory_order_relaxed); }

cudaError_t PreferMaxSmemCarveout(const void* kernel) {
  if (!MaxSmemCarveout()) return cudaSuccess;
  SetKernels& k = Kernels();
  absl::MutexLock lock(&k.mu);
  if (k.done.contains(kernel)) return cudaSuccess;
  const cudaError_t err =
      cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared);
  if (err == cudaSuccess) k.done.insert(kernel);
  return err;
}

}  // namespace tandem::cuda
