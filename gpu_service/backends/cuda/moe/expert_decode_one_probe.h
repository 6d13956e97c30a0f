// Phase stamps of the one-token MoE kernels (expert_decode_one.cuh), for benchmarks that need to
// see where a layer's time goes inside the chain: which wait holds it, when each block became
// resident, on which SM. Separate instantiations of the same kernels (a template flag): the
// kernels the backend launches compile without any of it.
//
// A probed block's thread 0 takes the next slot of its kernel (an atomic ticket; blocks of one
// launch take consecutive slots, since a launch's blocks all start before the next launch of that
// kernel can: gate/up i + 1 follows down i, which starts only after every gate/up i block passed
// its PDL wait) and writes %globaltimer (ns) at each phase into
// stamps[(kernel · capacity + slot) · kOneTokenProbeWords + phase]:
//   gate/up (kernel 0): 0 entry, 1 after the PDL wait, 5 routing's max known (logits read), 6 its
//     exponentials done, 7 their sum and inverse done (warp 0), 2 routed, 3 its warp's weight
//     copies landed, 4 its act rows written (0 where the block left early: no rows, or a flagged
//     pick);
//   down (kernel 1): 0 entry, 8 / 9 / 10 as 5 / 6 / 7, 1 routed and its row copies issued (before
//     the wait), 2 after the PDL wait, 3 its copies landed, 11 / 12 / 13 warp 0's first pick's act
//     staged / its sub-block sums / its dot products done, 4 every pick summed (after the block
//     barrier), 5 y written;
//   word 14: the SM id, word 15: blockIdx.x + blockIdx.y · gridDim.x.
// Host-compiler safe.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_EXPERT_DECODE_ONE_PROBE_H_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_EXPERT_DECODE_ONE_PROBE_H_

#include <cuda_runtime.h>

#include "gpu_service/backends/cuda/moe/expert_decode_one.cuh"

namespace tandem::cuda {

inline constexpr int kOneTokenProbeWords = 16;

// Points the probed kernels at `stamps` (device, 2 · capacity · kOneTokenProbeWords u64, zeroed
// by the caller) and zeroes the two slot counters. Blocks past `capacity` record nothing.
// down_late: the probed down kernel routes and issues its row copies after its PDL wait instead of
// before (an A/B of what its early start costs the gate/up kernel beside it; same results).
cudaError_t SetOneTokenProbe(unsigned long long* stamps, unsigned capacity, cudaStream_t stream,
                             bool down_late = false);

// The probed kernels; the same arguments, results and launch geometry as LaunchOneTokenMoeGateUp
// / LaunchOneTokenMoeDown. cudaErrorNotSupported for E outside (256, 512] (one instantiation).
cudaError_t LaunchOneTokenMoeGateUpProbed(const OneTokenMoeArgs& args, cudaStream_t stream);
cudaError_t LaunchOneTokenMoeDownProbed(const OneTokenMoeArgs& args, cudaStream_t stream);

}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_EXPERT_DECODE_ONE_PROBE_H_
