// FusedStamps: the fused one-token MoE kernel's phase stamps (expert_decode_fused_probe.h says what
// each word holds) and the armed buffer its probed launches without rows of their own stamp into.
// Compiled into the kernel's kProbe instantiations only (the others' FusedStamps<false> is empty).
// Device-only; included by expert_decode_fused_kernel.cuh alone (internal linkage, with the
// buffer's __device__ globals).
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_EXPERT_DECODE_FUSED_STAMPS_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_EXPERT_DECODE_FUSED_STAMPS_CUH_

#include "gpu_service/backends/cuda/armed_stamps.cuh"
#include "gpu_service/backends/cuda/global_timer.cuh"
#include "gpu_service/backends/cuda/moe/block_route.cuh"
#include "gpu_service/backends/cuda/moe/expert_decode_fused_probe.h"

namespace tandem::cuda {
namespace {

// LaunchOneTokenMoeFusedArmedProbe's buffer and slot counter (SetFusedMoeProbe).
__device__ ArmedStampRows g_fused_moe_probe;
__device__ unsigned g_fused_moe_probe_count;

// expert_decode_fused_probe.h's stamps: thread 0 of a block writes %globaltimer at each phase into
// its row (the launch's rows, one per block; or, with no rows given, the next row of the armed
// buffer). Compiled into the kProbe instantiation only.
template <bool kProbe>
struct FusedStamps {
  unsigned long long* row = nullptr;
  __device__ FusedStamps(unsigned long long* rows, int kind, int pick) {
    if constexpr (kProbe) {
      const unsigned long long entry = GlobalTimerNs();
      if (threadIdx.x == 0 && rows == nullptr) {
        row = TakeArmedRow(g_fused_moe_probe, &g_fused_moe_probe_count, kFusedProbeWords);
      } else if (threadIdx.x == 0) {
        row = rows + static_cast<unsigned long long>(blockIdx.x) * kFusedProbeWords;
      }
      if (row != nullptr) {
        const unsigned smid = SmId();
        row[kFusedProbeKind] = static_cast<unsigned long long>(kind);
        row[kFusedProbePick] = static_cast<unsigned long long>(static_cast<long long>(pick));
        row[kFusedProbeSm] = smid;
        row[kFusedProbeBlock] = blockIdx.x;
        row[kFusedProbeEntry] = entry;  // before the armed buffer's slot was taken
      }
    }
  }
  __device__ void Stamp(int phase) const {
    if constexpr (kProbe) {
      if (row != nullptr) row[phase] = GlobalTimerNs();
    }
  }
  // Stamp once `dep` is known (armed_stamps.cuh's KnownNow).
  __device__ void StampAfter(int phase, unsigned dep) const {
    if constexpr (kProbe) {
      if (row != nullptr && KnownNow(dep)) row[phase] = GlobalTimerNs();
    }
  }
  // kFusedProbeLogitsReloaded and kFusedProbeOtherLoaded (expert_decode_fused_probe.h): 16 lines a
  // warp of each, loaded as WarpPickLogits loads the logits. Call from every lane of warp 0.
  __device__ void Reloads(const float* logits, int E, const void* other) const {
    if constexpr (kProbe) {
      const int lane = threadIdx.x & 31;
      unsigned v = 0u;
      if (E >= 512) {
        float l[16];
        LoadLogits16<true>(logits + lane, l);
#pragma unroll
        for (int j = 0; j < 16; ++j) v ^= __float_as_uint(l[j]);
      }
      StampAfter(kFusedProbeLogitsReloaded, v);
      const unsigned* o = static_cast<const unsigned*>(other);
      unsigned u = 0u;
#pragma unroll
      for (int j = 0; j < 16; ++j) u ^= __ldcg(o + lane + 32 * j);
      StampAfter(kFusedProbeOtherLoaded, u);
    }
  }
};


}  // namespace
}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_EXPERT_DECODE_FUSED_STAMPS_CUH_
