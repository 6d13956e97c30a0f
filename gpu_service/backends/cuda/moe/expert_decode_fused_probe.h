// Phase stamps of the fused one-token MoE kernel (expert_decode_fused.cuh), for benchmarks that
// need to see where a layer's time goes inside its one grid: when each block became resident and
// on which SM, how long its routing, copies, cluster barrier and sums took. A separate
// instantiation of the same kernel (a template flag): the kernel the backend launches compiles
// without any of it.
//
// Thread 0 of each block writes %globaltimer (ns) into row b = blockIdx.x of `stamps` (the grid's
// rows, OneTokenFusedGridBlocks of kFusedProbeWords u64 each, zeroed by the caller; a phase a block
// never reaches stays 0):
//   routed and shared-expert blocks: entry, after the PDL wait, routed (the block barrier after
//   routing: the router count seen, the picks known), warp 0's gate/up copies landed, act written
//   (the block barrier after the gate/up products), the slice's act values gathered (the cluster's
//   pushes landed; until 2026-12-05 the cluster barrier passed), the down copies
//   landed, every addition issued (an extra block barrier), exit (after the last cluster wait);
//   router blocks: entry and exit only;
//   and the block's kind, pick (-1: none), SM id and index.
// Host-compiler safe.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_EXPERT_DECODE_FUSED_PROBE_H_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_EXPERT_DECODE_FUSED_PROBE_H_

#include <cuda_runtime.h>

#include "gpu_service/backends/cuda/moe/expert_decode_fused.cuh"

namespace tandem::cuda {

inline constexpr int kFusedProbeWords = 18;
// The words of a row: the phases, in the order a block passes them, then the block's facts.
enum FusedProbeWord : int {
  kFusedProbeEntry, kFusedProbeAfterWait, kFusedProbeRouted, kFusedProbeGateUpLanded, kFusedProbeActWritten,
  kFusedProbeActGathered, kFusedProbeDownLanded, kFusedProbeSummed, kFusedProbeExit,
  kFusedProbePhases,  // the count of the above
  // A routed block's routing in detail, between the wait and "routed" (warp 0 routes; 0 elsewhere):
  // the router blocks' count seen (right after the wait without router blocks), the logits loaded,
  // the picks taken.
  kFusedProbeCountSeen = kFusedProbePhases, kFusedProbeLogitsLoaded, kFusedProbePicked,
  kFusedProbeKind = 12,  // FusedProbeKind
  kFusedProbePick,       // the routed block's pick k (as a signed value), else -1
  kFusedProbeSm,
  kFusedProbeBlock,
  // Routed blocks, right after "logits loaded" (so the picks start later by these loads): the same
  // lines loaded again, then as many lines of the expert table (read by every block before its
  // wait): whether the first loads waited on the lines (just written by other SMs) or on a busy
  // memory system.
  kFusedProbeLogitsReloaded,
  kFusedProbeOtherLoaded,
};
enum FusedProbeKind : int { kFusedProbeRoutedKind, kFusedProbeSharedKind, kFusedProbeRouterKind };

// The grid LaunchOneTokenMoeFused launches for these arguments (blocks).
int OneTokenFusedGridBlocks(const OneTokenMoeArgs& args, const FusedSharedExpert* shared_expert,
                            const FusedRouter* router);

// Whether the probed forms below take E (their one instantiation: 256 < E <= 512).
inline bool OneTokenFusedProbeTakes(int E) { return E > 256 && E <= 512; }

// LaunchOneTokenMoeFused's probed form: the same arguments, results and grid, stamps into `stamps`
// (above). cudaErrorNotSupported for E outside (256, 512] (one instantiation), cudaErrorInvalidValue
// where LaunchOneTokenMoeFused refuses or for a null `stamps`.
cudaError_t LaunchOneTokenMoeFusedProbed(const OneTokenMoeArgs& args, const FusedSharedExpert* shared_expert,
                                         cudaStream_t stream, const FusedRouter* router, unsigned long long* stamps);

// The same probed form for launches captured before their stamps' buffer exists (the decode
// step's graphs, gpu_backend_bench --probe-step): each block takes the next row of the buffer
// SetFusedMoeProbe armed (a slot counter in device memory, so the blocks of one launch take
// consecutive rows when launches do not overlap) and stamps nothing while none is armed or the
// buffer is full. The same refusals as LaunchOneTokenMoeFusedProbed but for `stamps`.
cudaError_t LaunchOneTokenMoeFusedArmedProbe(const OneTokenMoeArgs& args, const FusedSharedExpert* shared_expert,
                                             cudaStream_t stream, const FusedRouter* router);
// Arms (stamps not null: `capacity` rows of kFusedProbeWords, zeroed by the caller; the slot
// counter reset) or disarms (nullptr) the armed probe's buffer, in stream order.
cudaError_t SetFusedMoeProbe(unsigned long long* stamps, unsigned capacity, cudaStream_t stream);

}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_MOE_EXPERT_DECODE_FUSED_PROBE_H_
