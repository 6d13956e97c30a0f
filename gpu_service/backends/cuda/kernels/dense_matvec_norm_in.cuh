// The streaming kernel's arguments of a norm-in product (dense_matvec.cuh LaunchDenseMatVecNormIn),
// shared by its production launch (dense_matvec.cu) and its stamped one (dense_matvec_probe.cu,
// whose probe state lives in that file's copy of matvec_stream.cuh). Only .cu files include this
// header.
#ifndef TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_DENSE_MATVEC_NORM_IN_CUH_
#define TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_DENSE_MATVEC_NORM_IN_CUH_

#include "gpu_service/backends/cuda/device_matrix.h"
#include "gpu_service/backends/cuda/kernels/dense_matvec.cuh"
#include "gpu_service/backends/cuda/matvec_stream.cuh"

namespace tandem::cuda {

// The launches' checks (LaunchDenseMatVecNormIn's contract): DenseMatVecNormInTakes(w), H, gamma and
// y present, a shared term only with y_in.
bool NormInLaunchOk(const DeviceMatrix& w, const MatVecNormIn& in, const float* y);

// The arguments of y = W·x with x formed from `in` (NormInLaunchOk holds).
fastmv::StreamArgs NormInStreamArgs(const DeviceMatrix& w, const MatVecNormIn& in, float* y);

}  // namespace tandem::cuda

#endif  // TANDEM_GPU_SERVICE_BACKENDS_CUDA_KERNELS_DENSE_MATVEC_NORM_IN_CUH_
