// Phase stamps of the split attention's blocks (SplitAttentionKernel, attention_split.cuh), for
// benchmarks that need to see where a decode attention's time goes inside its grid (the kernel
// lasted 12.8 us alone on the H200 at ~544 keys while its SMs were busy 5% of that, docs/PERF.md,
// twenty-third session). While rows are set (SetSplitAttentionProbe), LaunchAttention launches a
// separate, stamped instantiation of the kernel: thread 0 of block b (b = x + gridDim.x·(y +
// gridDim.y·z): row item, kv head, slice) writes %globaltimer (ns) at each phase it reaches into row
// b of `rows` (kAttnProbeWords u64 each, zeroed by the caller; blocks past `capacity` write
// nothing), then its facts. Not thread-safe against launches on other threads; benchmarks only.
// Host-compiler safe.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_ATTENTION_PROBE_H_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_ATTENTION_PROBE_H_

#include <cuda_runtime.h>

namespace tandem::cuda {

inline constexpr int kAttnProbeWords = 12;
enum AttnProbeWord : int {
  kAttnProbeEntry,      // the block starts
  kAttnProbeAfterWait,  // its PDL wait returned
  kAttnProbeQLoaded,    // the query rows are in registers and the early stages' new keys filled
                        // (slices with keys)
  kAttnProbeLoopDone,   // every key's copy landed and was used, the block barrier passed
  kAttnProbePartials,   // thread 0's part of the slice's partials (or o) written
  kAttnProbeExit,       // the block leaves (after the merge, in the block that merges)
  kAttnProbePhases,     // the count of the above
  kAttnProbeMerged = 8,  // 1: this block merged the slices (the last ticket)
  kAttnProbeKeys,        // the slice's keys (end − begin; 0 past the context)
  kAttnProbeSm,
  kAttnProbeBlock,
};

// rows != nullptr: the stamped kernel from the next launch on, `capacity` rows; nullptr: the
// production kernel again.
void SetSplitAttentionProbe(unsigned long long* rows, int capacity);

// The same stamps inside a decode step whose launches were captured before their buffer existed
// (gpu_backend_bench --probe-step): while ProbeDecodeStep() (step_probe.h) is
// on and no rows are set above, LaunchAttention launches the stamped kernel without rows, and
// thread 0 of each block takes the next row of the buffer armed here (a slot counter in device
// memory, so the blocks of one launch take consecutive rows when launches do not overlap), writes
// kAttnProbeBlock and stamps as above (its entry once it holds the row: one atomic's round trip
// after the block started); nothing while none is armed or the buffer is full. Arms (stamps not
// null: `capacity` rows of kAttnProbeWords, zeroed by the caller; the counter reset) or disarms
// (nullptr), in stream order.
cudaError_t SetArmedSplitAttentionProbe(unsigned long long* stamps, unsigned capacity, cudaStream_t stream);

}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_ATTENTION_PROBE_H_
