// Whether the current device runs this build's sm_90a machine code (host code only): the kernels
// with wgmma instructions exist only there; on other parts the driver JITs the compute_90 PTX, in
// which those instructions trap, so their callers fall back to the mma.sync kernels.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_SM90A_DEVICE_H_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_SM90A_DEVICE_H_

#include <cuda_runtime.h>

namespace tandem::cuda {

// True on a compute capability 9.0 device. False without a device, and then no CUDA error is left
// behind for a later launch check to find.
inline bool CurrentDeviceRunsSm90a() {
  int device = 0, major = 0, minor = 0;
  const bool queried = cudaGetDevice(&device) == cudaSuccess &&
                       cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
                       cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) == cudaSuccess;
  if (!queried) (void)cudaGetLastError();
  return queried && major == 9 && minor == 0;
}

}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_SM90A_DEVICE_H_
