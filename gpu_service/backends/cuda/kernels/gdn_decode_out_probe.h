// Stamps of the fused GDN kernel with the output product inside (gdn_decode_fused.cuh,
// LaunchGdnDecodeFusedOut), for benchmarks that need to see where a GDN layer's time goes inside a
// real decode step: when each block became resident and on which SM, when its polled rows were
// read, when its cluster's sums barrier passed, when its output product was added, when it left.
// Compiled into the launches only while ProbeDecodeStep() is set when they are enqueued
// (gpu_backend_bench --probe-step sets it before the decode graphs are captured); the
// backend's launches otherwise carry no stamp (GdnDecodeFusedArgs::out_probe false).
//
// A stamped block's thread 0 takes the next slot at entry (an atomic ticket: the blocks of one
// launch take consecutive slots, since a step's GDN kernels never overlap), keeps %globaltimer (ns)
// at each phase in registers and at its exit writes them to stamps[slot · kGdnOutProbeWords +
// word], then its SM id and its cluster and block (GdnOutProbeWord). Host-compiler safe.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_GDN_DECODE_OUT_PROBE_H_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_GDN_DECODE_OUT_PROBE_H_

#include <cuda_runtime.h>

namespace tandem::cuda {

inline constexpr int kGdnOutProbeWords = 11;

enum GdnOutProbeWord : int {
  kGdnOutProbeEntry = 0,        // the block's first instruction
  kGdnOutProbeStateRead = 1,    // thread 0's first state value (read before the wait) loaded
  kGdnOutProbeConvRead = 2,     // thread 0's conv input (a q channel of the stacked rows) read
  kGdnOutProbeRecurrence = 3,   // warp 0's recurrence outputs summed
  kGdnOutProbeZRead = 4,        // thread 0's z read (with polled rows: written by the product)
  kGdnOutProbeSums = 5,         // the cluster barrier that shares the heads' sums of squares passed
  kGdnOutProbeRowsLanded = 6,   // the block's output rows in shared memory (bulk copies only; thread 0
                                // waits for them here, only in the stamped launches)
  kGdnOutProbeAdded = 7,        // the output product added into out_y, the cluster's last wait passed
  kGdnOutProbeExit = 8,         // after the last wait (with polled rows: the product's grid)
  kGdnOutProbeStamps = 9,       // words 0..8 are %globaltimer stamps
  kGdnOutProbeSm = 9,           // word 9: the SM id
  kGdnOutProbeBlock = 10,       // word 10: (cluster index << 16) | (blockIdx.x + blockIdx.y · gridDim.x)
};

// Points the stamped launches at `stamps` (device, capacity · kGdnOutProbeWords u64, zeroed by the
// caller) and zeroes the slot counter, in stream order. Blocks past `capacity` record nothing;
// stamps == nullptr turns the stamps off (a stamped launch then still costs an atomic a block).
cudaError_t SetGdnOutProbe(unsigned long long* stamps, unsigned capacity, cudaStream_t stream);

}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_GDN_DECODE_OUT_PROBE_H_
