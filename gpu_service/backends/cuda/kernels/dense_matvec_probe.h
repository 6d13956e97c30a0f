// Phase stamps of the streaming decode matvec (matvec_stream.cuh's StreamMatVecKernel), for
// benchmarks that need to see where a batch-1 product's time goes: when its blocks became
// resident, how long the PDL wait held them, when the activations were staged, how long the first
// row group's stream took, on which SM. A separate instantiation of the same kernel (its kProbe
// template flag): the kernels LaunchDenseMatVec launches compile without any of it (same sm_90a
// SASS). Test and benchmark use only; the one-token MoE kernels have the same for theirs
// (moe/expert_decode_one_probe.h).
//
// A probed block's thread 0 takes the next slot at entry (an atomic ticket; blocks of one launch
// take consecutive slots whenever a launch's blocks all start before the next probed launch can, as
// in a PDL chain where a kernel in between waits on each product), keeps %globaltimer (ns) at each
// phase in shared memory, and at its exit writes them to stamps[slot · kStreamProbeWords + phase]
// (StreamProbePhase), then its SM id and block index (blockIdx.x + blockIdx.y · gridDim.x). Its
// exit reads the buffer's address from constant memory before those writes (a constant-cache hit
// but for an SM's first probed block after SetStreamMatVecProbe). Host-compiler safe.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_DENSE_MATVEC_PROBE_H_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_DENSE_MATVEC_PROBE_H_

#include <cuda_runtime.h>

#include "gpu_service/backends/cuda/device_matrix.h"

namespace tandem::cuda {

inline constexpr int kStreamProbeWords = 10;

// The stamped phases, in the order a block passes them.
enum StreamProbePhase : int {
  kStreamProbeEntry = 0,         // the block's first instruction
  kStreamProbeRingIssued = 1,    // its first group's first pieces issued (just before the PDL wait)
  kStreamProbeAfterWait = 2,     // after PdlWaitForPrevious (the producer of x completed)
  kStreamProbeStaged = 3,        // x staged in shared memory (after the barrier ending the staging)
  kStreamProbeFirstGroup = 4,    // its first row group's stream of pieces done (thread 0's lane)
  kStreamProbeLastGroup = 5,     // its last row group's stream done (= 4 for a block of one group)
  kStreamProbeLastWrite = 6,     // the last group reduced, before its y write
  kStreamProbeExit = 7,          // after the last write
  kStreamProbeSm = 8,            // word 8: the SM id
  kStreamProbeBlock = 9,         // word 9: blockIdx.x + blockIdx.y · gridDim.x
  kStreamProbeStamps = 8,        // words 0..7 are %globaltimer stamps
};

// Points the probed kernel at `stamps` (device, capacity · kStreamProbeWords u64, zeroed by the
// caller) and zeroes its slot counter, in stream order. Blocks past `capacity` record nothing;
// stamps == nullptr turns the stamps off (the probed kernel then still costs an atomic a block).
cudaError_t SetStreamMatVecProbe(unsigned long long* stamps, unsigned capacity, cudaStream_t stream);

// The grid and split LaunchDenseMatVec gives a one-activation-row product of w (Q8_0x8 or F32
// taken by the streaming kernel): blocks (grid.x), warps per row, and the row groups the blocks
// walk (a block walks ceil(groups / blocks) or one fewer). cudaErrorNotSupported where
// LaunchDenseMatVecProbed would refuse w.
struct StreamProbeGrid {
  int blocks = 0, wpr = 0, groups = 0;
};
cudaError_t StreamMatVecProbeGrid(const DeviceMatrix& w, StreamProbeGrid* grid);

// y = w · x for one activation row (x: w.cols f32, y: w.rows f32) through the probed streaming
// kernel, with the split and grid LaunchDenseMatVec (kAuto, n = 1) gives it: the same bits.
// Launched with PDL as the production launch (pdl.cuh). w of type Q8_0x8 or F32 that
// LaunchDenseMatVec streams at n = 1 (else cudaErrorNotSupported; TANDEM_MATVEC_GENERIC set counts
// as refused, since LaunchDenseMatVec would not stream then).
cudaError_t LaunchDenseMatVecProbed(const DeviceMatrix& w, const float* x, float* y, cudaStream_t stream);

// The stamped form of LaunchDenseMatVecNormIn (same checks, split, grid and bits): the decode step's
// own products, probed where they run (gpu_backend_bench --probe-step).
struct MatVecNormIn;
cudaError_t LaunchDenseMatVecNormInProbed(const DeviceMatrix& w, const MatVecNormIn& in, float* y, cudaStream_t stream);


// Benchmarks' producer of x, the kernel a probed product follows in a PDL chain: `blocks` blocks
// (one per SM when blocks = the SM count) each wait for the previous kernel (PdlWaitForPrevious),
// let the next one start (PdlAllowNext), hold their SM for spin_ns of %globaltimer, then copy their
// share of src[0, count) to x. span (or nullptr): block b writes its start (after its wait) and its
// end (after its copy) at span[2b], span[2b + 1].
cudaError_t LaunchStreamProbeProducer(const float* src, float* x, int count, int blocks, unsigned spin_ns,
                                      unsigned long long* span, cudaStream_t stream);

}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_DENSE_MATVEC_PROBE_H_
