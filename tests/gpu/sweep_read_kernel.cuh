// The read ceiling's kernel (HBM read rate, tests/gpu_backend/bench_ceilings.cu) and the cold-read
// benchmark's grid sweep (tests/gpu/cold_read_bench.cu) in one place, so that the sweep the cold reads
// are held against is the ceiling's own order of reads. Device code only (include from .cu files);
// internal linkage, as in matvec_core.cuh.
#ifndef TANDEM_TESTS_GPU_SWEEP_READ_KERNEL_CUH_
#define TANDEM_TESTS_GPU_SWEEP_READ_KERNEL_CUH_

#include <cuda_runtime.h>

#include <cstdint>

namespace tandem::bench {
namespace {

// The whole grid strides over `words` 16-byte words together; each thread XORs what it reads and
// writes one value only if the result is one the buffers' fills never give, so that the compiler
// cannot drop the loads and almost nothing is written.
__global__ void SweepReadKernel(const uint4* data, uint64_t words, uint32_t* sink) {
  uint32_t acc = 0;
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t i = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; i < words; i += stride) {
    const uint4 v = __ldcs(data + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9E3779B9u) sink[0] = acc;
}

}  // namespace
}  // namespace tandem::bench

#endif  // TANDEM_TESTS_GPU_SWEEP_READ_KERNEL_CUH_
