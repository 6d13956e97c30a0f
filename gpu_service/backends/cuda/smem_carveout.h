// The shared-memory carveout of the backend's kernels: how much of each SM's unified L1 / shared
// memory is configured as shared memory while a kernel's blocks run there.
//
// Why: the configuration is one per SM. Left to the driver, each kernel gets the smallest carveout
// its occupancy needs (the rest is L1), so consecutive kernels of a decode step differ (the norm's
// few KB, a matrix-vector product's ~9 KB a block, the fused GDN kernel's ~73 KB, the fused MoE
// kernel's four 55 KB blocks) and a block of the next kernel cannot start on an SM still running
// blocks of the last one under another configuration: programmatic dependent launch (pdl.cuh) then
// overlaps nothing where it matters most. With every kernel preferring the largest carveout, one
// configuration serves the whole chain.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_SMEM_CARVEOUT_H_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_SMEM_CARVEOUT_H_

#include <cuda_runtime.h>

namespace tandem::cuda {

// Process-wide switch, read from TANDEM_MAX_SMEM_CARVEOUT once (default off until measured; a
// launch policy, not state: kernels are correct either way). Set before the first launch: a
// kernel's preference is set at its first launch with the switch on and never reset.
bool MaxSmemCarveout();
void SetMaxSmemCarveout(bool on);

// With the switch on, sets `kernel`'s preferred carveout to the largest shared memory
// (cudaSharedmemCarveoutMaxShared) the first time it is asked for that kernel; later calls cost a
// lookup. Returns the cudaFuncSetAttribute error (cudaSuccess when off). Not a stream operation:
// allowed while a stream is being captured into a graph.
cudaError_t PreferMaxSmemCarveout(const void* kernel);

}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_SMEM_CARVEOUT_H_
