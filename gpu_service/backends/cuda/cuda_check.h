// Checking every CUDA runtime call and kernel launch, and turning failures into absl::Status.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_CUDA_CHECK_H_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_CUDA_CHECK_H_

#include <cuda_runtime.h>

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tandem::cuda {

// InternalError naming the call site and CUDA's error string; OkStatus for cudaSuccess.
inline absl::Status CudaStatus(cudaError_t err, const char* what, const char* file, int line) {
  if (err == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("CUDA error at ", file, ":", line, " (", what, "): ",
                                          cudaGetErrorName(err), ": ", cudaGetErrorString(err)));
}

}  // namespace tandem::cuda

// Evaluates a CUDA runtime call; on failure returns its Status from the enclosing function.
#define TANDEM_CUDA_RETURN_IF_ERROR(call)                                                    \
  do {                                                                                       \
    if (cudaError_t tandem_cuda_err_ = (call); tandem_cuda_err_ != cudaSuccess) {            \
      return ::tandem::cuda::CudaStatus(tandem_cuda_err_, #call, __FILE__, __LINE__);       \
    }                                                                                        \
  } while (0)

// After a kernel launch: the launch error (bad configuration, missing kernel image).
#define TANDEM_CUDA_RETURN_IF_LAUNCH_ERROR(what) TANDEM_CUDA_RETURN_IF_ERROR(cudaGetLastError())

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_CUDA_CHECK_H_
