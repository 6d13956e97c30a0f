// Phase stamps of the column-split one-row product (dense_colsplit.cu's ColumnSplitKernel: a decode
// step's attention output product o, with the split attention's merge inside), for benchmarks that
// need to see where an attention layer's time goes after the split attention: o's critical-path
// share was ~10.5 us an attention layer for 8.9 MB of weights (docs/PERF.md, thirty-fourth
// session's timeline), and its phases inside a step had not been seen.
//
// While ProbeDecodeStep() (step_probe.h) is on, LaunchColumnSplitMatVec launches a
// stamped instantiation of the same kernel (its kProbe template flag: the production kernels
// compile without any of it), whose block's thread 0 takes the next row of the buffer armed by
// SetArmedColumnSplitProbe (a slot counter in device memory: the blocks of one launch take
// consecutive rows when launches do not overlap) and writes %globaltimer (ns) at each phase it
// reaches, then its facts; nothing while none is armed or the buffer is full. Test and benchmark
// use only. Host-compiler safe.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_DENSE_COLSPLIT_PROBE_H_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_DENSE_COLSPLIT_PROBE_H_

#include <cuda_runtime.h>

namespace tandem::cuda {

inline constexpr int kColSplitProbeWords = 10;
enum ColSplitProbeWord : int {
  kColSplitProbeEntry,       // the block holds its row (one atomic's round trip after it started)
  kColSplitProbeIssued,      // its weight rows' copies issued (just before the PDL wait)
  kColSplitProbeAfterWait,   // its PDL wait returned
  kColSplitProbeXFormed,     // thread 0's x value known (read, or merged from the attention slices)
  kColSplitProbeRowsLanded,  // every thread's weight copies landed, x quantized (a block barrier)
  kColSplitProbeExit,        // every thread's additions into y issued (a block barrier), leaving
  kColSplitProbePhases,      // the count of the above
  kColSplitProbeMerged = 7,  // 1: this block merged attention slices into x
  kColSplitProbeSm,
  kColSplitProbeBlock,       // blockIdx.x + gridDim.x · blockIdx.y
};

// Arms (stamps not null: `capacity` rows of kColSplitProbeWords u64, zeroed by the caller; the
// slot counter reset) or disarms (nullptr) the stamped kernel's buffer, in stream order.
cudaError_t SetArmedColumnSplitProbe(unsigned long long* stamps, unsigned capacity, cudaStream_t stream);

}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_DENSE_COLSPLIT_PROBE_H_
